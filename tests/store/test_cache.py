"""The row cache's slot bookkeeping: evicted and failed slots come back clean and free."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from frugal.store.backends.memory import MemoryBackend
from frugal.store.cache import FREE, NEVER, VALID, RowCache, _CacheFullError


class _FailingBackend(MemoryBackend):
    """A memory backend whose reads fail while `fail` is set."""

    fail = True

    def read_rows(self, ids: np.ndarray, out: np.ndarray) -> np.ndarray:
        if self.fail:
            raise OSError(5, "injected read failure")
        return super().read_rows(ids, out)


def _cache(backend: MemoryBackend, capacity: int) -> RowCache:
    return RowCache(
        backend, num_rows=100, width=1, capacity=capacity,
        initializer=lambda ids: ids[:, None].astype(np.float32),
        staleness_bound=None, eviction="lru", max_pending_rows=100,
    )  # fmt: skip


def test_a_failed_load_gives_its_slots_back(tmp_path: Path) -> None:
    backend = _FailingBackend(tmp_path, 100, 1, None)
    cache = _cache(backend, capacity=8)
    try:
        with pytest.raises(OSError, match="injected read failure"):
            cache.get(np.array([3, 4]), 0)
        assert cache.free_count == 8  # both slots taken for the load are free again
        assert cache.index.lookup(np.array([3, 4], dtype=np.int64)).tolist() == [-1, -1]
        assert (cache.slot_state == FREE).all() and (cache.slot_ids == -1).all()
        assert (cache.next_use == NEVER).all() and not cache.dirty.any()
        backend.fail = False
        rows = cache.get(np.array([3, 4]), 0, count_read=False)
        assert rows[:, 0].tolist() == [3.0, 4.0]  # never written: the initializer's rows
    finally:
        cache.close()
        backend.close()


def test_evicted_slots_are_unmapped_and_their_dirty_rows_written_back(tmp_path: Path) -> None:
    backend = MemoryBackend(tmp_path, 100, 1, None)
    cache = _cache(backend, capacity=2)
    try:
        cache.write(np.array([1]), np.array([[10.0]], dtype=np.float32), 0)
        cache.write(np.array([2]), np.array([[20.0]], dtype=np.float32), 1)
        assert cache.free_count == 0
        rows = cache.get(np.array([5]), 2, count_read=False)  # evicts the LRU row, 1
        assert rows[:, 0].tolist() == [5.0]
        assert (cache.stats.evictions, cache.stats.writebacks) == (1, 1)
        assert (cache.index.lookup(np.array([1, 2, 5], dtype=np.int64)) >= 0).tolist() == [
            False,
            True,
            True,
        ]
        cache.flush()
        out = np.zeros((1, 1), dtype=np.float32)
        assert backend.read_rows(np.array([1]), out).tolist() == [True]
        assert out[0, 0] == 10.0  # the dirty row reached the backend before its slot was reused
    finally:
        cache.close()
        backend.close()


def test_evictions_never_queue_more_write_backs_than_the_io_share(tmp_path: Path) -> None:
    # A stream of puts evicts dirty rows faster than one writer thread drains them; the
    # queued write-backs live outside the slab, so they must stay within the I/O share of
    # the budget (they once grew to 36 MB for a 2.5 MB share: a bench run broke its budget).
    from frugal.store import EmbeddingStore, OptimizerConfig, RowSpec

    spec = RowSpec(embedding_dim=128, optimizer=OptimizerConfig(kind="none"))
    num_rows = 60_000
    config = EmbeddingStore.Config(memory_budget_bytes=num_rows * spec.row_bytes // 10)
    with EmbeddingStore.create(tmp_path / "s", num_rows=num_rows, spec=spec, config=config) as st:
        rows = np.ones((2000, 128), dtype=np.float32)
        most = 0
        for start in range(0, num_rows, 2000):
            st.put(np.arange(start, start + 2000), rows)
            most = max(most, st.cache.pending_rows)
        assert most <= st.cache.max_pending_rows
        st.flush()
        assert st.cache.pending_rows == 0
        assert np.array_equal(st.peek(np.array([0, 59_999]), cols="emb"), rows[:2])


# --- eviction queues against the full scan they replace -----------------------------------

_MAX = np.iinfo(np.int64).max


def _scan_victim_keys(
    cache: RowCache, need: int, protect: np.ndarray | None, later_than: int | None
) -> tuple[np.ndarray, np.ndarray] | None:
    """(The victims' sorted keys, every slot's key) of a scan of every slot (None: refused).

    The policy as it was before the queues: one key per slot (lru: last access; lookahead:
    unhinted rows by last access, then hinted rows by next use, the latest first), unevictable
    slots at the maximum, and the `evict_batch` surplus from unhinted rows only.
    """
    next_use, last_access = cache.next_use, cache.last_access
    if cache.eviction == "lru":
        keys = last_access.copy()
    else:
        keys = np.where(next_use == NEVER, last_access - (1 << 61), (1 << 40) - next_use)
    blocked = (cache.slot_state != VALID) | (cache.readers > 0) | (cache.pinned != 0)
    keys[blocked] = _MAX
    if protect is not None:
        keys[protect] = _MAX
    if later_than is not None:
        keys[(next_use != NEVER) & (next_use <= later_than)] = _MAX
    evictable = int(np.count_nonzero(keys != _MAX))
    if evictable < need and later_than is None:
        return None
    spare = evictable if cache.eviction == "lru" else int(np.count_nonzero(keys < 0))
    evict = min(max(need, min(cache.evict_batch, spare)), evictable)
    return np.sort(keys)[:evict], keys


def _check_queues(cache: RowCache) -> None:
    """Every occupied unpinned slot is queued under its current key; counters are exact."""
    assert cache.hinted_count == int(np.count_nonzero(cache.next_use != NEVER))
    queues = {"cold": cache._cold, "hot": cache._hot}
    held: dict[str, dict[int, set[int]]] = {}
    for name, queue in queues.items():
        buckets = queue._buckets
        assert sorted(queue._sign * k for k in queue._heap) == sorted(buckets)
        assert queue.size == sum(len(c) for chunks in buckets.values() for c in chunks)
        held[name] = {k: set(np.concatenate(chunks).tolist()) for k, chunks in buckets.items()}
    assert cache._cold.size + cache._hot.size <= cache._queue_limit
    occupied = np.flatnonzero((cache.slot_state != FREE) & (cache.pinned == 0))
    for slot in occupied.tolist():
        hinted = cache.eviction == "lookahead" and cache.next_use[slot] != NEVER
        name, key = ("hot", cache.next_use[slot]) if hinted else ("cold", cache.last_access[slot])
        assert slot in held[name].get(int(key), set()), (slot, name, int(key))


def _check_victims(cache: RowCache, rng: np.random.Generator, step: int) -> tuple[int, int]:
    """Ask the queues for victims as an allocation would; compare with the scan; put back."""
    need = int(rng.integers(1, cache.capacity // 2))
    occupied = np.flatnonzero(cache.slot_state != FREE)
    protect = rng.choice(occupied, min(len(occupied), int(rng.integers(0, 8))), replace=False)
    later_than = int(step + rng.integers(0, 4)) if rng.random() < 0.5 else None
    with cache.cond:
        expected = _scan_victim_keys(cache, need, protect, later_than)
        if expected is None:
            with pytest.raises(_CacheFullError):
                cache._victims(need, protect=protect, later_than=later_than)
            _check_queues(cache)  # nothing was taken
            return 0, 1
        victims = cache._victims(need, protect=protect, later_than=later_than)
        want, keys = expected
        assert len(np.unique(victims)) == len(victims)
        assert np.array_equal(np.sort(keys[victims]), want), (victims, want)
        cache._enqueue(victims)  # not evicted: back in the queues
        _check_queues(cache)
    return 1, 0


@pytest.mark.parametrize("eviction", ["lookahead", "lru"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_eviction_queues_pick_what_a_full_scan_picks(
    tmp_path: Path, eviction: str, seed: int
) -> None:
    # Random gets (open reads kept across a call now and then), updates, writes, prefetches
    # with a window, pins and releases: after each, the queues hold every evictable row
    # under its key, and the victims they give have the keys a scan of every slot picks.
    rng = np.random.default_rng(seed)
    num_rows, capacity = 400, 96
    backend = MemoryBackend(tmp_path, num_rows, 1, None)
    cache = RowCache(
        backend, num_rows=num_rows, width=1, capacity=capacity,
        initializer=lambda ids: ids[:, None].astype(np.float32),
        staleness_bound=None, eviction=eviction,  # type: ignore[arg-type]
        max_pending_rows=1000,
    )  # fmt: skip
    model = np.arange(num_rows, dtype=np.float32)  # what every row must read
    hot = rng.permutation(num_rows)[:60]  # a skewed id stream: most ids from a hot set

    def batch() -> np.ndarray:
        size = int(rng.integers(1, 12))
        pool = hot if rng.random() < 0.7 else np.arange(num_rows)
        return np.unique(rng.choice(pool, size))

    def add_one(rows: np.ndarray) -> None:
        rows += 1.0

    checked = refused = 0
    open_ids: np.ndarray | None = None
    try:
        for step in range(300):
            op = rng.random()
            ids = batch()
            if open_ids is not None and rng.random() < 0.6:  # close the reads left open
                if rng.random() < 0.5:
                    cache.update(open_ids, step, add_one)
                    model[open_ids] += 1.0
                else:
                    assert cache.release(open_ids) == len(open_ids)
                open_ids = None
            if op < 0.3:
                for ahead in range(1, 4):  # a window of hints, as the loader gives them
                    cache.prefetch(batch(), step + ahead)
                cache.prefetch(ids, step + 1)
            elif op < 0.55 and open_ids is None:
                rows = cache.get(ids, step)
                assert np.array_equal(rows[:, 0], model[ids])
                if rng.random() < 0.5:
                    open_ids = ids
                else:
                    cache.update(ids, step, add_one)
                    model[ids] += 1.0
            elif op < 0.7:
                values = rng.standard_normal(len(ids)).astype(np.float32)
                cache.write(ids, values[:, None], step)
                model[ids] = values
                if open_ids is not None:  # the write closed those of its rows
                    open_ids = np.setdiff1d(open_ids, ids) if len(open_ids) else None
                    if open_ids is not None and len(open_ids) == 0:
                        open_ids = None
            elif op < 0.8:
                rows = cache.get(ids, step, count_read=False)
                assert np.array_equal(rows[:, 0], model[ids])
            elif op < 0.85 and cache.pinned_count + len(ids) <= capacity // 4:
                cache.pin(ids, step)
            elif op < 0.9:
                cache.unpin(ids if rng.random() < 0.8 else None)
            with cache.cond:
                _check_queues(cache)
            done, full = _check_victims(cache, rng, step)
            checked, refused = checked + done, refused + full
        if open_ids is not None:
            cache.release(open_ids)
        # The queues were exercised, refusals (too few evictable rows) included.
        assert checked > 200 and refused > 0 and cache.stats.evictions > 100
        everything = np.arange(num_rows)
        for first in range(0, num_rows, 50):  # values never depend on the eviction order
            part = everything[first : first + 50]
            assert np.array_equal(cache.get(part, 400, count_read=False)[:, 0], model[part])
    finally:
        cache.close()
        backend.close()


def test_eviction_queues_stay_bounded_when_nothing_is_evicted(tmp_path: Path) -> None:
    # The same rows read step after step leave a stale entry each time; with no eviction to
    # drop them, the queues are rebuilt before they pass two entries a slot.
    backend = MemoryBackend(tmp_path, 100, 1, None)
    cache = RowCache(
        backend, num_rows=100, width=1, capacity=64,
        initializer=lambda ids: ids[:, None].astype(np.float32),
        staleness_bound=None, eviction="lookahead", max_pending_rows=100,
    )  # fmt: skip
    try:
        ids = np.arange(40)
        most = 0
        for step in range(200):
            cache.prefetch(ids, step + 1)
            cache.get(ids, step + 1, count_read=False)
            most = max(most, cache._cold.size + cache._hot.size)
            with cache.cond:
                _check_queues(cache)
        assert 40 <= most <= cache._queue_limit == 2 * 64 + 64
        assert cache.stats.evictions == 0 and cache.hinted_count == 0
    finally:
        cache.close()
        backend.close()


def test_unpinned_rows_are_evicted_again_in_lru_order(tmp_path: Path) -> None:
    backend = MemoryBackend(tmp_path, 100, 1, None)
    cache = _cache(backend, capacity=8)  # lru, one victim at a time
    try:
        for step in range(8):
            cache.get(np.array([step]), step, count_read=False)
        cache.pin(np.array([0, 1]), 8)  # now the least recently used rows, at 8
        cache.get(np.arange(2, 8), 9, count_read=False)
        cache.get(np.array([20]), 10, count_read=False)  # passes over the pinned rows
        assert cache.stats.evictions == 1 and cache.pinned_count == 2
        with cache.cond:
            _check_queues(cache)
        cache.unpin()  # queued again, under their last access
        with cache.cond:
            _check_queues(cache)
        cache.get(np.array([21]), 11, count_read=False)
        resident = cache.index.lookup(np.array([0, 1], dtype=np.int64)) >= 0
        assert sorted(resident.tolist()) == [False, True]  # one of them went, not a row at 9
    finally:
        cache.close()
        backend.close()
