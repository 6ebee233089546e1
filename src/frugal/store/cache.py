"""The row cache between training and a backend: slab, eviction, prefetch, write-back, staleness.

One lock (a condition variable) guards all cache metadata; disk I/O runs outside it. Slots
hold rows in a float32 slab `[C, W]`; per slot: id, state (free, valid, loading), dirty bit,
open-read counter r, last access step and next use step.

- Eviction `lookahead` (default, store.md 2.4): rows with no hint go first, least recently used
  first; then hinted rows, farthest next use first (Belady within the hinted window). Rows
  with open reads or still loading are never evicted. `lru` ignores hints (ablation).
  Victims come from two queues of slots bucketed by step (`_StepQueue`: unhinted rows by
  last access, hinted rows by next use), so choosing k victims costs about O(k), not a scan
  of every slot.
- `prefetch(ids, step)` loads missing rows in the background, evicting only rows needed later
  than `step` (or not at all), and never blocks the caller. Rows hinted for steps after the
  next never fill more than the capacity minus the largest get, so a window longer than the
  cache holds does not evict its own prefetches.
- Dirty victims go to one background writer (FIFO, so two write-backs of a row land in order);
  reads of a row whose write-back is still queued are served from the write buffer.
- Bounded staleness (store.md 2.2): a get of row i is served iff r(i) <= bound, then r(i) += 1;
  a put/update of the row closes the read (r -= 1). It waits on the condition variable, never
  spins, and raises `StalenessTimeoutError` after `timeout_s`, or after `timeout_s / 4` when
  only the waiting thread's own reads block it and no read is closed meanwhile (a thread
  that reads a row twice without updating it would otherwise wait for itself).

References:
    MLKV: Efficiently Scaling up Large Embedding Model Training with Disk-based Key-Value
    Storage, ICDE 2025, arXiv 2504.01506 (lookahead prefetching, staleness counters; here with
    window-Belady eviction and fixed slots instead of FASTER's FIFO hybrid log).

Shape legend: N ids in a call, C cache slots, W row width.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt

from frugal._typing import F32, I32, I64, Bool
from frugal.store.backends.base import StoreBackend
from frugal.store.errors import (
    CacheTooSmallError,
    StalenessTimeoutError,
    StoreCorruptionError,
    StoreError,
)
from frugal.store.slot_index import DenseSlotIndex, HashSlotIndex, SlotIndex

__all__ = ["CacheStats", "RowCache", "slot_overhead_bytes"]

FREE, VALID, LOADING = 0, 1, 2
NEVER = np.int64(1 << 62)  # next_use of a row with no hint
Initializer = Callable[[I64], F32]


# One record per cache slot, so the fields a get or an update touches for a row share one
# or two cache lines: a batch costs one random DRAM access per row for all of its metadata,
# not one per field (field-per-array took ~8 such passes per get at 10^6 slots).
_SLOT_RECORD = np.dtype(
    [
        ("id", np.int64),  # row id in the slot, -1 = none
        ("last_access", np.int64),  # step of the last get or update (LRU order)
        ("next_use", np.int64),  # nearest hinted step (NEVER = none)
        ("next_use2", np.int64),  # second-nearest hinted step
        ("reader_thread", np.int64),  # last thread to open a read
        ("readers", np.int32),  # open reads
        ("state", np.int8),  # FREE, VALID or LOADING
        ("dirty", np.bool_),  # changed since written to the backend
        ("pinned", np.int8),  # kept resident until unpinned (`pin`)
        ("pad", np.int8),
    ]
)


_QUEUED_PER_SLOT = 2
"""Eviction-queue entries (int32) allowed per slot before the queues are rebuilt."""


def slot_overhead_bytes() -> int:
    """Memory per cache slot besides its row.

    The slot record (48), the free-stack entry (4) and the eviction queues' entries (8: at
    most two int32 entries a slot, stale ones included, see `RowCache._enqueue`).
    """
    return _SLOT_RECORD.itemsize + 4 + 4 * _QUEUED_PER_SLOT


_NEARLY_FULL_BYTES = 1 << 20
"""Less free space than this (a few pages of any engine) counts as a full disk."""


@dataclass
class CacheStats:
    """Counters of one cache; all byte counts are row bytes moved to or from the backend."""

    gets: int = 0
    hits: int = 0
    """Unique ids of gets that were resident (or being prefetched) when asked."""
    misses: int = 0
    """Unique ids of gets read synchronously (a data stall)."""
    prefetched: int = 0
    evictions: int = 0
    writebacks: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    stall_s: float = 0.0
    """Seconds gets spent waiting: for synchronous reads, prefetches in flight, staleness."""
    staleness_hist: list[int] = field(default_factory=list)
    """staleness_hist[r] = number of row reads served with r open reads before them."""


class _CacheFullError(Exception):
    """Not enough evictable slots right now (rows are pinned by open reads or loading)."""


@dataclass
class _Pending:
    ids: I64
    rows: F32
    done: bool = False


_Check = Callable[[int, I32], tuple[Bool, Bool]]
"""`check(key, slots)` -> (ready, keep) masks over `slots`, the entries of bucket `key`."""


class _StepQueue:
    """Cache slots in buckets keyed by a step, taken bucket by bucket in key order.

    Deletion is lazy: when a slot's key changes, the slot is added under its new key and its
    old entry stays where it is, to be dropped when its bucket is opened (the caller's
    `check` tells stale entries from current ones). So nothing ever searches the queue for a
    slot, and:

    - `add` of n slots costs O(n) when they share a key (a batch's rows: one get, one step),
      O(n log n) otherwise;
    - `take` costs O(b log b) for the b entries of the buckets it opens (those it takes,
      those that stay because they cannot go now, and stale ones, dropped for good), plus
      O(log B) per bucket for B buckets. Each stale entry is dropped once, so over the
      queue's life it costs O(1); only entries that stay are looked at again.

    Stale entries accumulate in buckets that are never opened (rows read again and again);
    `size` counts them, and the owner rebuilds the queue when it grows too large.

    Buckets are a dict key -> chunks (int32 slot arrays, one per `add`) with a heap of the
    keys beside it. Ties (slots of one bucket) come out in slot order.
    """

    def __init__(self, *, largest_first: bool) -> None:
        self._sign = -1 if largest_first else 1
        self._buckets: dict[int, list[I32]] = {}
        self._heap: list[int] = []  # sign * key of each bucket, and only those
        self.size = 0
        """Entries held, stale ones included."""

    def clear(self) -> None:
        self._buckets.clear()
        self._heap.clear()
        self.size = 0

    def add(self, slots: npt.NDArray[np.int64], keys: I64) -> None:
        """Queue `slots` under `keys` (one key per slot)."""
        if len(slots) == 0:
            return
        first = int(keys[0])
        if (keys == first).all():
            self._put(first, slots.astype(np.int32))
            return
        order = np.argsort(keys)
        keys, sorted_slots = keys[order], slots[order].astype(np.int32)
        cuts = (np.flatnonzero(keys[1:] != keys[:-1]) + 1).tolist()
        for start, end in zip([0, *cuts], [*cuts, len(keys)], strict=True):
            self._put(int(keys[start]), sorted_slots[start:end])

    def _put(self, key: int, slots: I32) -> None:
        chunks = self._buckets.get(key)
        if chunks is None:
            self._buckets[key] = [slots]
            heapq.heappush(self._heap, self._sign * key)
        else:
            chunks.append(slots)
        self.size += len(slots)

    def take(self, want: int, check: _Check, *, above: int | None = None) -> I64:
        """Remove and return up to `want` slots that `check` finds ready, in key order.

        Buckets are opened in key order (smallest first, or largest first) until `want`
        slots are taken or, with `above` (largest-first queues), the next key is not above
        it. An opened bucket's
        entries are deduplicated and checked: `ready` ones may be taken, `keep` ones are
        current but cannot go now (they stay queued), the rest are stale and dropped.
        """
        taken: list[I32] = []
        back: list[tuple[int, I32]] = []
        got = 0
        while got < want and self._heap:
            key = self._sign * self._heap[0]
            if above is not None and key <= above:
                break
            heapq.heappop(self._heap)
            chunks = self._buckets.pop(key)
            self.size -= sum(len(chunk) for chunk in chunks)
            # Sorted and deduplicated: a slot queued twice under one key (its key moved away
            # and back, or it was requeued while still queued) comes out once, and ties come
            # out in slot order however they were queued (a call queues its rows in id order,
            # which should not decide which of them go first).
            slots = np.unique(np.concatenate(chunks))
            ready, keep = check(key, slots)
            ready_slots = slots[ready]
            n = min(want - got, len(ready_slots))
            taken.append(ready_slots[:n])
            got += n
            rest = np.concatenate([ready_slots[n:], slots[keep]])
            if len(rest):
                back.append((key, rest))
        for key, rest in back:  # after the loop, or it would open them again
            self._put(key, rest)
        return np.concatenate(taken).astype(np.int64) if taken else np.empty(0, np.int64)


class RowCache:
    """A bounded cache of rows in front of a backend; see the module docstring."""

    def __init__(
        self,
        backend: StoreBackend,
        *,
        num_rows: int,
        width: int,
        capacity: int,
        initializer: Initializer,
        staleness_bound: int | None,
        eviction: Literal["lookahead", "lru"] = "lookahead",
        timeout_s: float = 60.0,
        max_pending_rows: int = 65536,
        slot_index: Literal["dense", "hash"] = "dense",
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity={capacity} must be >= 1 slot")
        self.backend = backend
        self.num_rows = num_rows
        self.width = width
        self.capacity = capacity
        self.initializer = initializer
        self.staleness_bound = staleness_bound
        self.eviction = eviction
        self.timeout_s = timeout_s
        self.max_pending_rows = max_pending_rows
        self.slab = np.zeros((capacity, width), dtype=np.float32)
        self.meta = np.zeros(capacity, dtype=_SLOT_RECORD)
        # Field views (strided, no copies): the rest of the class works on them as arrays.
        self.slot_ids = self.meta["id"]
        self.slot_ids[:] = -1
        self.slot_state = self.meta["state"]
        self.dirty = self.meta["dirty"]
        self.readers = self.meta["readers"]
        self.pinned = self.meta["pinned"]
        self.pinned_count = 0
        self.reader_thread = self.meta["reader_thread"]
        self.closes = 0  # puts/updates so far: progress that may unblock a waiting get
        # thread -> (ids, whole rows, closes, slots) of its last counted get (see `update`).
        self._last_read: dict[int, tuple[I64, F32, int, npt.NDArray[np.int64]]] = {}
        self.last_access = self.meta["last_access"]
        self.next_use = self.meta["next_use"]
        self.next_use[:] = NEVER
        self.next_use2 = self.meta["next_use2"]
        self.next_use2[:] = NEVER
        self.hinted_count = 0  # slots with a hint (next_use != NEVER), kept as hints change
        # id -> slot: a dense array over the table's rows, or a hash table over the slots
        # (frugal.store.slot_index; the store picks the one that leaves more cache).
        self.index: SlotIndex = (
            HashSlotIndex(capacity, self.slot_ids)
            if slot_index == "hash"
            else DenseSlotIndex(num_rows)
        )
        # Stack of free slot numbers: free_slots[:free_count], the top at free_count - 1.
        self.free_slots = np.arange(capacity - 1, -1, -1, dtype=np.int32)
        self.free_count = capacity
        # Eviction order: occupied slots queued by step, lazily (see `_StepQueue`). In
        # lookahead mode unhinted rows by last access (oldest first) and hinted rows by
        # next use (latest first); in lru mode every row by last access.
        self._cold = _StepQueue(largest_first=False)
        self._hot = _StepQueue(largest_first=True)
        self._queue_limit = _QUEUED_PER_SLOT * capacity + 64
        # Misses short of free slots evict a batch of unhinted rows (about 3% of the cache,
        # bounded by the write-back buffer) and keep the surplus free: write-backs go out in
        # larger sorted runs, and the next misses take free slots without opening the queues.
        self.evict_batch = max(1, min(capacity // 32, max_pending_rows // 4))
        self.pending: list[_Pending] = []
        self.pending_rows = 0
        self.stats = CacheStats()
        self.largest_get = 0  # unique rows of the largest counted get so far
        self.last_get_step = -1  # step of the latest counted get
        self._staleness_counts = np.zeros(64, dtype=np.int64)
        self.cond = threading.Condition()
        self.writer = ThreadPoolExecutor(1, thread_name_prefix="frugal-writeback")
        self.reader = ThreadPoolExecutor(2, thread_name_prefix="frugal-prefetch")
        self.error: BaseException | None = None
        self.closed = False

    # --- helpers (lock held) -------------------------------------------------------------------

    def _check(self) -> None:
        if self.closed:
            raise StoreError("the store is closed")
        if self.error is not None:
            error, self.error = self.error, None
            if isinstance(error, StoreCorruptionError):  # e.g. a corrupt row a prefetch read
                raise StoreCorruptionError(f"a background read failed: {error}") from error
            raise StoreError(
                f"a background read or write-back failed: {error}{self._full_disk()}. Rows "
                "since the last checkpoint may be lost; the checkpoint itself is intact (fix "
                "the cause, e.g. free disk space, then reopen the store)"
            ) from error

    def _full_disk(self) -> str:
        """`; the disk holding D is full (F free)` when the backend's disk is (nearly) full.

        Some engines report a full disk in their own words (LMDB: an I/O error on a short
        write); the free space says what happened.
        """
        directory = getattr(self.backend, "directory", None)
        if directory is None:
            return ""
        from frugal.disk import free_bytes, human_bytes

        free = free_bytes(Path(directory))
        if free >= _NEARLY_FULL_BYTES:
            return ""
        return f"; the disk holding {directory} is full ({human_bytes(free)} free)"

    def _wait(self, deadline: float, what: str) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise StalenessTimeoutError(
                f"waited {self.timeout_s:.0f} s for {what}; another thread holds reads that are "
                "never closed (a get without its put?), or timeout_s is too small"
            )
        self.cond.wait(min(remaining, 1.0))

    def _wait_for_room(self, deadline: float, wanted: int) -> None:
        """Wait until open reads close and free slots (lock held), or raise if none can."""
        open_slots = np.flatnonzero(self.readers)
        loading = bool((self.slot_state == LOADING).any())
        if len(open_slots) == 0 and not loading:
            pinned = (
                f", {self.pinned_count} of them pinned, so {self.capacity - self.pinned_count} "
                "are left for it (unpin rows, or pin fewer: pin_feature_fraction in train_gnn)"
                if self.pinned_count
                else ""
            )
            raise CacheTooSmallError(
                f"a call needs {wanted} rows but the cache holds {self.capacity}{pinned}; "
                "raise memory_budget_bytes or lower the batch size",
                wanted_rows=wanted,
                capacity_rows=self.capacity,
            )
        if not loading and (self.reader_thread[open_slots] == threading.get_ident()).all():
            raise StoreError(
                f"the cache of {self.capacity} rows is full of rows this thread read and did "
                "not update; close reads with put/apply_gradients, raise memory_budget_bytes, "
                "or lower the batch size or staleness bound"
            )
        self._wait(deadline, "open reads to free cache slots")

    def _push_free(self, slots: npt.NDArray[np.int64]) -> None:
        self.free_slots[self.free_count : self.free_count + len(slots)] = slots
        self.free_count += len(slots)

    def _pop_free(self, count: int) -> npt.NDArray[np.int64]:
        self.free_count -= count
        return self.free_slots[self.free_count : self.free_count + count].astype(np.int64)

    def _allocate(
        self, count: int, *, protect: npt.NDArray[np.int64] | None, later_than: int | None
    ) -> npt.NDArray[np.int64]:
        """Take `count` slots (fewer if `later_than` limits eviction); evict as needed.

        When the free slots run short, the eviction queues give up to `evict_batch` victims
        (at least the shortfall), in eviction order; the surplus stays free for the next
        calls. The surplus is taken from rows without a hint only: a row the lookahead says
        is needed is evicted only to serve a call that has no other room.
        """
        need = count - self.free_count
        if need > 0:
            victims = self._victims(need, protect=protect, later_than=later_than)
            if len(victims):
                self._evict(victims)
                self._push_free(victims)
        return self._pop_free(min(count, self.free_count))

    def _victims(
        self, need: int, *, protect: npt.NDArray[np.int64] | None, later_than: int | None
    ) -> npt.NDArray[np.int64]:
        """Choose at least `need` slots to evict, up to `evict_batch` if unhinted rows allow.

        Lookahead: unhinted rows first, least recently accessed first, up to
        max(need, evict_batch); then, only for the rest of `need`, hinted rows, the one
        needed latest first. `lru`: rows by last access alone. Never rows that are loading,
        have open reads, are pinned or are in `protect` (the rows of the call being served);
        with `later_than` (a prefetch), no row hinted for a step up to `later_than`, and
        fewer than `need` may come back.

        The result is what a scan of every slot for the smallest keys in that order picks
        (up to ties, which come out in slot order), at the cost of `_StepQueue.take` over
        the buckets opened: about the victims plus the entries passed over, not O(C). Only a
        refusal opens every bucket (O(C), as the scan was), and it is followed by a wait.

        Raises:
            _CacheFullError: Without `later_than`, if fewer than `need` rows can be evicted
                now (nothing is taken).
        """
        guard = np.sort(protect) if protect is not None and len(protect) else None
        lru = self.eviction == "lru"

        def stuck(record: npt.NDArray[np.void], slots: I32) -> Bool:
            """Current entries that cannot be evicted now."""
            out: Bool = (record["state"] != VALID) | (record["readers"] > 0)
            if guard is not None:
                pos = np.minimum(np.searchsorted(guard, slots), len(guard) - 1)
                out |= guard[pos] == slots
            if lru and later_than is not None:  # NEVER is above any step
                out |= record["next_use"] <= later_than
            return out

        def cold(key: int, slots: I32) -> tuple[Bool, Bool]:
            record = self.meta[slots]
            # Free slots' entries are stale; pinned ones are dropped too (`unpin` requeues).
            current = (record["state"] != FREE) & (record["pinned"] == 0)
            current &= record["last_access"] == key
            if not lru:
                current &= record["next_use"] == NEVER
            blocked = stuck(record, slots)
            return current & ~blocked, current & blocked

        def hot(key: int, slots: I32) -> tuple[Bool, Bool]:
            record = self.meta[slots]
            current = (record["state"] != FREE) & (record["pinned"] == 0)
            current &= record["next_use"] == key
            blocked = stuck(record, slots)
            return current & ~blocked, current & blocked

        victims = self._cold.take(max(need, self.evict_batch), cold)
        if len(victims) < need and not lru:  # unhinted rows ran out: the latest-needed next
            more = self._hot.take(need - len(victims), hot, above=later_than)
            victims = np.concatenate([victims, more])
        if len(victims) < need and later_than is None:
            self._enqueue(victims)  # back where they were: nothing is taken
            raise _CacheFullError(need)
        return victims

    def _order_state(self, slots: npt.NDArray[np.int64]) -> tuple[I64, I64]:
        """What the eviction order of `slots` depends on, for `_requeue` after a change."""
        return self.last_access[slots], self.next_use[slots]

    def _requeue(self, slots: npt.NDArray[np.int64], before: tuple[I64, I64]) -> None:
        """Queue those `slots` whose eviction key changed since `before` (`_order_state`)."""
        last_access, next_use = before
        changed = self.last_access[slots] != last_access
        if self.eviction != "lru":  # the key is next use if hinted, else last access
            now = self.next_use[slots]
            changed = (now != next_use) | ((now == NEVER) & changed)
        self._enqueue(slots[changed])

    def _enqueue(self, slots: npt.NDArray[np.int64]) -> None:
        """Queue unique occupied `slots` for eviction under their current keys.

        Every occupied unpinned slot has an entry under its current key (earlier entries go
        stale), so callers queue a slot whenever its key changes or it becomes occupied or
        unpinned. O(N) for one key, O(N log N) for several; when the queues hold more than
        `_QUEUED_PER_SLOT` entries a slot (stale entries of rows read again and again),
        `_rebuild_queues` runs: O(C log C) once per at least C entries queued.
        """
        self._queue(slots)
        if self._cold.size + self._hot.size > self._queue_limit:
            self._rebuild_queues()

    def _queue(self, slots: npt.NDArray[np.int64]) -> None:
        """Add `slots` to the queue of their class under their current keys."""
        if len(slots) == 0:
            return
        if self.eviction == "lru":
            self._cold.add(slots, self.last_access[slots])
            return
        next_use = self.next_use[slots]
        hinted = next_use != NEVER
        cold = slots[~hinted]
        self._cold.add(cold, self.last_access[cold])
        self._hot.add(slots[hinted], next_use[hinted])

    def _rebuild_queues(self) -> None:
        """Queue every occupied unpinned slot afresh, dropping all stale entries: O(C log C)."""
        self._cold.clear()
        self._hot.clear()
        self._queue(np.flatnonzero((self.slot_state != FREE) & (self.pinned == 0)))

    def _evict(self, victims: npt.NDArray[np.int64]) -> None:
        ids = self.slot_ids[victims]
        dirty = self.dirty[victims]
        if dirty.any():
            order = np.argsort(ids[dirty])
            pending = _Pending(ids=ids[dirty][order], rows=self.slab[victims[dirty]][order])
            self.pending.append(pending)
            self.pending_rows += len(pending.ids)
            self.stats.writebacks += len(pending.ids)
            self.writer.submit(self._write_back, pending)
        self._clear_slots(ids, victims)
        self.stats.evictions += len(victims)
        # Back-pressure: queued write-backs live outside the slab, and evictions can outrun
        # the writer (a stream of puts), so wait until they fit the I/O buffer's share.
        deadline = time.monotonic() + self.timeout_s
        while self.pending_rows > self.max_pending_rows:
            self._wait(deadline, "write-backs to finish")

    def _clear_slots(self, ids: I64, slots: npt.NDArray[np.int64]) -> None:
        """Unmap `ids` from their `slots` and reset the slots to FREE (clean, no hints).

        The slots are not yet on the free list; the caller pushes them when it is done.
        """
        self.index.remove(ids, slots)
        self.hinted_count -= int(np.count_nonzero(self.next_use[slots] != NEVER))
        self.pinned_count -= int(np.count_nonzero(self.pinned[slots]))
        self.pinned[slots] = 0
        self.slot_ids[slots] = -1
        self.slot_state[slots] = FREE
        self.dirty[slots] = False
        self.next_use[slots] = NEVER
        self.next_use2[slots] = NEVER

    def _from_pending(self, ids: I64, out: F32) -> npt.NDArray[np.bool_]:
        """Copy rows of ids whose write-back is still queued; newest buffer wins."""
        found = np.zeros(len(ids), dtype=bool)
        for pending in reversed(self.pending):
            if pending.done:
                continue
            pos = np.searchsorted(pending.ids, ids)
            pos[pos >= len(pending.ids)] = 0
            hit = (pending.ids[pos] == ids) & ~found
            if hit.any():
                out[hit] = pending.rows[pos[hit]]
                found |= hit
        return found

    # --- background jobs ---------------------------------------------------------------------

    def _write_back(self, pending: _Pending) -> None:
        try:
            self.backend.write_rows(pending.ids, pending.rows)
        except BaseException as exc:  # surfaces on the next call
            with self.cond:
                self.error = exc
        with self.cond:
            pending.done = True
            self.pending = [p for p in self.pending if not p.done]
            self.pending_rows -= len(pending.ids)
            self.stats.bytes_written += pending.rows.nbytes
            self.cond.notify_all()

    def _load(self, ids: I64, slots: npt.NDArray[np.int64], *, background: bool = True) -> None:
        """Fill loading slots: from queued write-backs, the backend, or the initializer.

        A failure frees the slots; in the background it is kept for the next call, in the
        foreground it is raised at once.
        """
        rows = np.empty((len(ids), self.width), dtype=np.float32)
        try:
            with self.cond:
                from_pending = self._from_pending(ids, rows)
            rest = ~from_pending
            if rest.any():
                sub = np.empty((int(rest.sum()), self.width), dtype=np.float32)
                present = self.backend.read_rows(ids[rest], sub)
                if not present.all():
                    sub[~present] = self.initializer(ids[rest][~present])
                rows[rest] = sub
                read_bytes = int(present.sum()) * self.width * 4
            else:
                read_bytes = 0
        except BaseException as exc:
            with self.cond:  # give the slots back so nobody waits forever
                if background:
                    self.error = exc
                self._clear_slots(ids, slots)
                self._push_free(slots)
                self.cond.notify_all()
            if background:
                return
            raise
        with self.cond:
            self.slab[slots] = rows
            self.slot_state[slots] = VALID
            self.stats.bytes_read += read_bytes
            self.cond.notify_all()

    # --- public operations -------------------------------------------------------------------

    def get(
        self,
        ids: I64,
        step: int,
        *,
        count_read: bool = True,
        columns: int | None = None,
        count_stats: bool | None = None,
    ) -> F32:
        """Return copies of the rows of sorted unique `ids`, loading misses synchronously.

        Args:
            ids: Sorted unique ids.
            step: Training step, for recency and hints.
            count_read: Open a read (staleness counter); False for internal updates.
            columns: Copy only each row's first `columns` values (None: the whole row), e.g.
                the embedding without its optimizer state.
            count_stats: Count the lookup in hits/misses (default: as `count_read`); a
                read-only get counts them without opening a read.

        Returns:
            Rows, float32.

        Raises:
            StalenessTimeoutError: If rows stay beyond the staleness bound for `timeout_s`.
            StoreError: If the cache is too small or a background job failed.

        Shapes:
            ids: (N,) -> (N, W), or (N, columns).
        """
        start = time.perf_counter()
        deadline = time.monotonic() + self.timeout_s
        waited = False
        count_stats = count_read if count_stats is None else count_stats
        with self.cond:
            self._check()
            if len(ids) > self.capacity:
                raise CacheTooSmallError(
                    f"a batch touches {len(ids)} unique rows but the cache holds "
                    f"{self.capacity}; raise memory_budget_bytes about "
                    f"{len(ids) / self.capacity:.2g}x, or read fewer rows per call",
                    wanted_rows=len(ids),
                    capacity_rows=self.capacity,
                )
            first_pass = True
            closes_before: int | None = None
            own_since = 0.0
            while True:
                slots = self.index.lookup(ids)
                missing = slots < 0
                if first_pass and count_stats:  # updates re-read their rows: not counted
                    self.largest_get = max(self.largest_get, len(ids))
                    self.last_get_step = max(self.last_get_step, step)
                    self.stats.gets += 1
                    self.stats.misses += int(missing.sum())
                    self.stats.hits += len(ids) - int(missing.sum())
                if first_pass:
                    first_pass = False
                if missing.any():
                    try:
                        new = self._allocate(
                            int(missing.sum()), protect=slots[~missing], later_than=None
                        )
                    except _CacheFullError:
                        self._wait_for_room(deadline, len(ids))
                        waited = True
                        continue
                    miss_ids = ids[missing]
                    self.slot_ids[new] = miss_ids
                    self.index.insert(miss_ids, new)
                    self.slot_state[new] = LOADING
                    self.last_access[new] = step
                    self._enqueue(new)
                    self.cond.release()
                    try:
                        self._load(miss_ids, new, background=False)
                    finally:
                        self.cond.acquire()
                    waited = True
                    self._check()
                    continue
                if (self.slot_state[slots] == LOADING).any():
                    waited = True
                    self._wait(deadline, "rows being prefetched")
                    self._check()
                    continue
                r = self.readers[slots]
                if (
                    count_read
                    and self.staleness_bound is not None
                    and (r > self.staleness_bound).any()
                ):
                    over = r > self.staleness_bound
                    own = (self.reader_thread[slots[over]] == threading.get_ident()).all()
                    if own and closes_before is None:
                        closes_before, own_since = self.closes, time.monotonic()
                    elif not own or self.closes != closes_before:
                        closes_before = None
                    if (
                        closes_before is not None
                        and time.monotonic() - own_since > self.timeout_s / 4
                    ):
                        # Only this thread's reads block it and nobody closed any read for a
                        # quarter of the timeout: it is waiting for itself.
                        k = int(np.flatnonzero(over)[0])
                        raise StalenessTimeoutError(
                            f"row {int(ids[k])} already has {int(r[k])} open read(s) from this "
                            f"thread (staleness_bound={self.staleness_bound}); close them with "
                            "put/apply_gradients before reading it again, or use peek() to read "
                            "without opening a read"
                        )
                    waited = True
                    self._wait(
                        deadline, f"rows to come within staleness bound {self.staleness_bound}"
                    )
                    continue
                break
            if count_read:
                counts = np.bincount(np.minimum(r, 63), minlength=64)
                self._staleness_counts += counts
                self.readers[slots] += 1
                self.reader_thread[slots] = threading.get_ident()
                # One random gather of whole rows, kept for this thread's update of the same
                # rows (the training loop's get -> apply_gradients), which then skips its own.
                full = self.slab[slots]
                # A copy of ids: a caller may refill its id buffer before the update.
                self._last_read[threading.get_ident()] = (ids.copy(), full, self.closes, slots)
                rows = full.copy() if columns is None else full[:, :columns].copy()
            else:  # fancy indexing copies already: one gather, of the wanted columns only
                rows = self.slab[slots] if columns is None else self.slab[slots, :columns]
            before = self._order_state(slots)
            self.last_access[slots] = step
            self._consume_hints(slots, step)
            self._requeue(slots, before)
            if waited:
                self.stats.stall_s += time.perf_counter() - start
        return rows

    def pin(self, ids: I64, step: int) -> int:
        """Load rows of sorted unique `ids` and keep them resident until `unpin`.

        A static cache beside the dynamic one, as GNN systems keep their hottest nodes'
        features (PaGraph, SoCC 2020; GNNLab, EuroSys 2022): pinned rows are never evicted,
        so they cost no I/O however the lookahead ranks them. At most half the slots may be
        pinned, so batches keep room. Returns the number of rows pinned in all.

        Raises:
            ValueError: If the pinned rows would exceed half the cache (the message names
                how many more fit).
            StoreError: If the cache is closed or a background job failed.
        """
        limit = self.capacity // 2
        with self.cond:
            self._check()
            slots = self.index.lookup(ids)
            resident = slots >= 0
            already = np.zeros(len(ids), dtype=bool)
            already[resident] = self.pinned[slots[resident]] != 0
            new = int(np.count_nonzero(~already))
            if self.pinned_count + new > limit:
                raise ValueError(
                    f"pinning {new} more row(s) would pin {self.pinned_count + new} of the "
                    f"cache's {self.capacity} slots; at most half ({limit}) may be pinned, so "
                    f"pin at most {max(0, limit - self.pinned_count)} more (or raise "
                    "memory_budget_bytes)"
                )
        todo = ids[~already]
        chunk = max(1, self.capacity // 4)
        for first in range(0, len(todo), chunk):
            part = todo[first : first + chunk]
            while True:  # resident, then pinned under the lock (another thread may evict)
                self.get(part, step, count_read=False, count_stats=False)
                with self.cond:
                    slots = self.index.lookup(part)
                    if (slots < 0).any() or (self.slot_state[slots] != VALID).any():
                        continue
                    fresh = self.pinned[slots] == 0
                    self.pinned[slots] = 1
                    self.pinned_count += int(np.count_nonzero(fresh))
                    break
        return self.pinned_count

    def unpin(self, ids: I64 | None = None) -> int:
        """Let rows of `ids` (None: all) be evicted again; returns the rows still pinned."""
        with self.cond:
            if ids is None:
                slots = np.flatnonzero(self.pinned)
            else:
                slots = self.index.lookup(ids)
                slots = slots[slots >= 0]
                slots = slots[self.pinned[slots] != 0]
            self.pinned_count -= len(slots)
            self.pinned[slots] = 0
            self._enqueue(slots)  # their queue entries were dropped while they were pinned
            self.cond.notify_all()
            return self.pinned_count

    def _consume_hints(self, slots: npt.NDArray[np.int64], step: int) -> None:
        """After serving `step`, move each served row's next use to its next hinted step.

        Each slot keeps its two nearest hinted steps, so this is O(N) with no set lookups;
        with a window W > 2 a row's third-nearest hint is forgotten (its next use then comes
        back when that batch is hinted, or it is treated as unhinted).
        """
        used = self.next_use[slots] <= step
        chosen = slots[used]
        following = self.next_use2[chosen]
        self.hinted_count -= int(np.count_nonzero(following == NEVER))
        self.next_use[chosen] = following
        self.next_use2[chosen] = NEVER

    def _hint(self, slots: npt.NDArray[np.int64], step: int) -> None:
        """Record that resident unique `slots` are needed at `step` (keeps the two nearest)."""
        first, second = self.next_use[slots], self.next_use2[slots]
        earlier = step < first
        self.hinted_count += int(np.count_nonzero(first == NEVER))
        self.next_use2[slots] = np.where(
            earlier, first, np.minimum(second, np.where(step > first, step, second))
        )
        self.next_use[slots] = np.minimum(first, step)
        self._enqueue(slots[earlier])  # their next use moved: a new eviction key

    def write(self, ids: I64, rows: F32, step: int) -> None:
        """Overwrite rows of sorted unique ids (resident or not) and close their open reads."""
        deadline = time.monotonic() + self.timeout_s
        with self.cond:
            self._check()
            self._last_read.pop(threading.get_ident(), None)  # its reads close here, not in update
            new = np.empty(0, dtype=np.int64)
            while True:
                slots = self.index.lookup(ids)
                resident = slots >= 0
                if (self.slot_state[slots[resident]] == LOADING).any():
                    # A prefetch is filling some of the rows: wait, else its load would
                    # overwrite them after this write.
                    self._wait(deadline, "rows being prefetched")
                    self._check()
                    continue
                missing = ~resident
                if not missing.any():
                    break
                try:
                    new = self._allocate(
                        int(missing.sum()), protect=slots[resident], later_than=None
                    )
                except _CacheFullError:
                    # The lock is released while waiting, and a prefetch may then start
                    # loading some of these rows: look them up (and wait for loads) again.
                    self._wait_for_room(deadline, len(ids))
                    self._check()
                    continue
                self.slot_ids[new] = ids[missing]
                self.index.insert(ids[missing], new)
                slots[missing] = new
                self.last_access[new] = step
                break
            self._install(slots, rows)
            self._enqueue(new)  # valid now (resident rows keep their keys: no access counted)

    def update(self, ids: I64, step: int, fn: Callable[[F32], None]) -> None:
        """Apply `fn` in place to the rows of sorted unique ids and close their open reads.

        Fast path (the training loop's case: the rows were just read and are pinned): one
        pass under the lock. Otherwise the rows are loaded first. If `fn` raises, nothing is
        written.
        """
        with self.cond:
            self._check()
            last = self._last_read.pop(threading.get_ident(), None)
            if last is not None and last[2] == self.closes and np.array_equal(last[0], ids):
                # Nothing was written since this thread read these rows (no read closed: the
                # counter is unchanged), and open reads keep them resident in the same slots,
                # so its copy equals the slab's rows and no index lookup is needed.
                rows, slots = last[1], last[3]
                fn(rows)
                self._install(slots, rows)
                self._access(slots, step)
                return
            slots = self.index.lookup(ids)
            if (slots >= 0).all() and (self.slot_state[slots] == VALID).all():
                rows = self.slab[slots]
                fn(rows)
                self._install(slots, rows)
                self._access(slots, step)
                return
        rows = self.get(ids, step, count_read=False)
        fn(rows)
        self.write(ids, rows, step)

    def release(self, ids: I64) -> int:
        """Close the open reads of sorted unique `ids` without changing a row; return how many.

        For a training step that failed between its get and its update: the rows stay as
        they were (clean or dirty), and readers waiting on the staleness bound go on.
        """
        with self.cond:
            self._check()
            self._last_read.pop(threading.get_ident(), None)
            slots = self.index.lookup(ids)
            slots = slots[slots >= 0]
            slots = slots[self.readers[slots] > 0]
            if len(slots):
                self.closes += 1
                self.readers[slots] -= 1
                self.cond.notify_all()
            return len(slots)

    def open_reads(self, ids: I64) -> I64:
        """Those of sorted unique `ids` that are resident with an open read (a get not closed)."""
        with self.cond:
            slots = self.index.lookup(ids)
            resident = slots >= 0
            held = np.zeros(len(ids), dtype=bool)
            held[resident] = self.readers[slots[resident]] > 0
            return ids[held]

    def _access(self, slots: npt.NDArray[np.int64], step: int) -> None:
        """Set the last access of unique `slots` to `step` and requeue those it moves."""
        before = self._order_state(slots)
        self.last_access[slots] = step
        self._requeue(slots, before)

    def _install(self, slots: npt.NDArray[np.int64], rows: F32) -> None:
        self.closes += 1
        self.slab[slots] = rows
        self.slot_state[slots] = VALID
        self.dirty[slots] = True
        self.readers[slots] = np.maximum(self.readers[slots] - 1, 0)
        self.cond.notify_all()

    def prefetch(self, ids: I64, step: int) -> None:
        """Hint that sorted unique `ids` are needed at `step`; load misses in the background."""
        with self.cond:
            self._check()
            slots = self.index.lookup(ids)
            resident = slots >= 0
            self._hint(slots[resident], step)
            missing_ids = ids[~resident]
            if len(missing_ids) == 0 or self.pending_rows > self.max_pending_rows:
                return  # nothing to load, or the writer is behind: defer to the get
            # Leave room for one batch that was not prefetched: rows hinted for any step but
            # the next may fill the cache only up to capacity minus the largest get. Beyond
            # that a get's misses would evict rows prefetched for later steps, which are then
            # read again (a small cache with a long window read more and ran slower than with
            # a short one). The next step's rows only need to fit.
            margin = 0 if step <= self.last_get_step + 1 else self.largest_get
            room = self.capacity - self.hinted_count - margin
            if room <= 0:
                return
            missing_ids = missing_ids[:room]
            new = self._allocate(len(missing_ids), protect=None, later_than=step)
            if len(new) == 0:
                return
            load_ids = missing_ids[: len(new)]
            self.slot_ids[new] = load_ids
            self.index.insert(load_ids, new)
            self.slot_state[new] = LOADING
            self.next_use[new] = step
            self.next_use2[new] = NEVER
            self.hinted_count += len(new)  # free slots had no hint
            self.last_access[new] = step
            self._enqueue(new)
            self.stats.prefetched += len(load_ids)
        future: Future[None] = self.reader.submit(self._load, load_ids, new)
        del future

    def flush(self) -> None:
        """Write every dirty row to the backend and wait for all write-backs and prefetches."""
        deadline = time.monotonic() + self.timeout_s
        with self.cond:
            self._check()
            while (self.slot_state == LOADING).any():
                self._wait(deadline, "prefetches to finish")
            dirty = np.flatnonzero(self.dirty & (self.slot_state == VALID))
            # In pieces of the I/O buffer's size, so a flush never copies the whole slab.
            piece = max(1, self.max_pending_rows)
            for first in range(0, len(dirty), piece):
                part = dirty[first : first + piece]
                ids = self.slot_ids[part]
                order = np.argsort(ids)
                pending = _Pending(ids=ids[order], rows=self.slab[part[order]])
                self.pending.append(pending)
                self.pending_rows += len(ids)
                self.dirty[part] = False
                self.writer.submit(self._write_back, pending)
                while self.pending_rows > self.max_pending_rows:
                    self._wait(deadline, "write-backs to finish")
            while self.pending:
                self._wait(deadline, "write-backs to finish")
            self._check()

    def wait_quiescent(self) -> None:
        """Block until no row has an open read (before a checkpoint)."""
        deadline = time.monotonic() + self.timeout_s
        with self.cond:
            while self.readers.any():
                open_slots = np.flatnonzero(self.readers)
                if (self.reader_thread[open_slots] == threading.get_ident()).all():
                    raise StoreError(
                        f"{len(open_slots)} rows (e.g. id {int(self.slot_ids[open_slots[0]])}) "
                        "have open reads from this thread; close them with put/apply_gradients "
                        "before a checkpoint, or close(checkpoint=False) to drop them"
                    )
                self._wait(deadline, "open reads to close before the checkpoint")

    def staleness_histogram(self) -> list[int]:
        """Counts of reads served with r = 0, 1, ... open reads (trailing zeros cut)."""
        counts = self._staleness_counts.tolist()
        while len(counts) > 1 and counts[-1] == 0:
            counts.pop()
        return [int(c) for c in counts]

    def close(self) -> None:
        """Stop the background threads (queued writes complete first)."""
        self.reader.shutdown(wait=True)
        self.writer.shutdown(wait=True)
        self.closed = True
