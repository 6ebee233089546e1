"""Bounded staleness with a reader thread running ahead of the trainer (store.md 2.2)."""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from pathlib import Path
from typing import Literal

import numpy as np
import pytest

from frugal.store import EmbeddingStore, OptimizerConfig, RowSpec, apply_optimizer, init_rows
from frugal.store.backends.memory import MemoryBackend
from frugal.store.cache import NEVER, RowCache

SPEC = RowSpec(embedding_dim=4, optimizer=OptimizerConfig(kind="sgd", lr=0.1))
NUM_ROWS = 50
STEPS = 60


def _batch(step: int) -> np.ndarray:
    # Row 0 in every batch: a hot row that the bound must hold back.
    rng = np.random.default_rng(step)
    return np.concatenate([[0], rng.integers(1, NUM_ROWS, 8)])


def _run(tmp_path: Path, bound: int | None) -> tuple[dict[str, object], str]:
    config = EmbeddingStore.Config(staleness_bound=bound, timeout_s=20)
    store = EmbeddingStore.create(
        tmp_path / f"s{bound}", num_rows=NUM_ROWS, spec=SPEC, config=config
    )
    ahead: queue.Queue[tuple[int, np.ndarray, np.ndarray]] = queue.Queue(maxsize=32)
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            for step in range(STEPS):
                ids = _batch(step)
                ahead.put((step, ids, store.get(ids, step=step)))
        except BaseException as exc:
            errors.append(exc)
            ahead.put((-1, np.empty(0), np.empty(0)))

    thread = threading.Thread(target=reader)
    thread.start()
    # Let the reader run as far ahead as the bound allows before the first update, so the
    # histogram's maximum is the bound itself, not an accident of thread scheduling.
    wanted = min(STEPS, 6 if bound is None else bound + 1)
    deadline = time.monotonic() + 20
    while ahead.qsize() < wanted and time.monotonic() < deadline and not errors:
        time.sleep(0.005)
    for _ in range(STEPS):
        step, ids, rows = ahead.get(timeout=30)
        if step < 0:
            break
        store.apply_gradients(ids, (rows - 1.0).astype(np.float32), step=step)  # pull toward 1
    thread.join(timeout=30)
    assert not errors, errors
    stats = store.stats()
    sha = store.table_sha256()
    store.close()
    return stats, sha


def _sequential_sha() -> str:
    table = init_rows(np.arange(NUM_ROWS, dtype=np.int64), SPEC, seed=0)
    for step in range(STEPS):
        ids = _batch(step)
        unique, inverse = np.unique(ids, return_inverse=True)
        grads = (table[ids, :4] - 1.0).astype(np.float32)
        summed = np.zeros((len(unique), 4), dtype=np.float32)
        np.add.at(summed, inverse, grads)
        rows = table[unique]
        apply_optimizer(rows, summed, SPEC)
        table[unique] = rows
    return hashlib.sha256(table.tobytes()).hexdigest()


@pytest.mark.parametrize("bound", [0, 1, 4])
def test_measured_staleness_never_exceeds_the_bound(tmp_path: Path, bound: int) -> None:
    stats, sha = _run(tmp_path, bound)
    hist = stats["staleness_hist"]
    assert isinstance(hist, list)
    assert stats["staleness_max"] <= bound
    assert sum(hist) == STEPS * 0 + sum(len(np.unique(_batch(s))) for s in range(STEPS))
    if bound == 0:
        assert sha == _sequential_sha()  # every read saw every earlier update
    else:
        assert stats["staleness_max"] == bound  # the reader ran ahead as far as allowed


def test_unbounded_reader_runs_far_ahead_and_is_still_counted(tmp_path: Path) -> None:
    stats, _ = _run(tmp_path, None)
    assert stats["staleness_max"] > 4  # nothing held the reader back


def _slots(cache: RowCache, ids: np.ndarray) -> np.ndarray:
    """Slots of `ids` in the cache's id -> slot map (-1 = not cached)."""
    return cache.index.lookup(ids.astype(np.int64))


@pytest.mark.parametrize("slot_index", ["dense", "hash"])
def test_one_victim_scan_frees_a_batch_of_slots_in_lru_order(
    tmp_path: Path, slot_index: Literal["dense", "hash"]
) -> None:
    width = 2
    backend = MemoryBackend(tmp_path, 1000, width, None)
    cache = RowCache(
        backend,
        num_rows=1000,
        width=width,
        capacity=64,
        initializer=lambda ids: np.repeat(ids[:, None], width, axis=1).astype(np.float32),
        staleness_bound=None,
        eviction="lru",
        max_pending_rows=1000,
        slot_index=slot_index,
    )
    try:
        assert cache.evict_batch == 2  # capacity // 32
        for step in range(64):  # fill: row `step` last used at `step`
            cache.update(np.array([step]), step, lambda rows: None)
        assert cache.free_count == 0
        # One miss: one scan evicts the 2 least recently used rows (0 and 1) and uses one
        # slot; the other stays free, so the next miss needs no scan and evicts nothing.
        rows = cache.get(np.array([100]), 64, count_read=False)
        assert rows.tolist() == [[100.0, 100.0]]
        assert cache.stats.evictions == 2 and cache.free_count == 1
        assert (_slots(cache, np.array([0, 1])) == -1).all() and (
            _slots(cache, np.arange(2, 64)) >= 0
        ).all()
        cache.get(np.array([101]), 65, count_read=False)
        assert cache.stats.evictions == 2 and cache.free_count == 0
        # Evicted dirty rows were written back and read back unchanged.
        cache.flush()
        assert cache.get(np.array([0, 1]), 66, count_read=False).tolist() == [[0, 0], [1, 1]]
    finally:
        cache.close()
        backend.close()


@pytest.mark.parametrize("slot_index", ["dense", "hash"])
def test_the_surplus_of_a_victim_scan_spares_hinted_rows(
    tmp_path: Path, slot_index: Literal["dense", "hash"]
) -> None:
    backend, cache = _hinted_cache(tmp_path, capacity=64, slot_index=slot_index)
    try:
        for step in range(64):
            cache.update(np.array([step]), step, lambda rows: None)
        cache.prefetch(np.arange(63), 100)  # resident: only hints, rows 0..62 needed at 100
        # One miss needs one slot; the batch of 2 would take hinted row 0 as surplus, so the
        # scan evicts the one unhinted row (63) only.
        cache.get(np.array([500]), 64, count_read=False)
        assert cache.stats.evictions == 1 and cache.free_count == 0
        assert (
            _slots(cache, np.array([63]))[0] == -1 and (_slots(cache, np.arange(0, 63)) >= 0).all()
        )
        # The next miss evicts the only unhinted row, 500; the hinted rows stay.
        cache.get(np.array([501]), 65, count_read=False)
        assert cache.stats.evictions == 2 and _slots(cache, np.array([500]))[0] == -1
        assert (_slots(cache, np.arange(0, 63)) >= 0).all()
    finally:
        cache.close()
        backend.close()


def _hinted_cache(
    tmp_path: Path, capacity: int, slot_index: Literal["dense", "hash"] = "dense"
) -> tuple[MemoryBackend, RowCache]:
    """A lookahead RowCache of `capacity` one-float rows over a memory backend of 1000 rows."""
    backend = MemoryBackend(tmp_path, 1000, 1, None)
    cache = RowCache(
        backend, num_rows=1000, width=1, capacity=capacity,
        initializer=lambda ids: ids[:, None].astype(np.float32),
        staleness_bound=None, eviction="lookahead", max_pending_rows=1000,
        slot_index=slot_index,
    )  # fmt: skip
    return backend, cache


@pytest.mark.parametrize("slot_index", ["dense", "hash"])
def test_prefetch_leaves_room_for_one_batch(
    tmp_path: Path, slot_index: Literal["dense", "hash"]
) -> None:
    backend, cache = _hinted_cache(tmp_path, capacity=100, slot_index=slot_index)
    try:
        first = np.arange(30)
        cache.get(first, 0)  # a batch of 30 rows: the largest get
        cache.update(first, 0, lambda rows: None)
        for k in range(1, 5):  # a window of 4 batches of 30 new rows each
            cache.prefetch(np.arange(100 * k, 100 * k + 30), k)
        cache.flush()
        # Room for 70 hinted rows: batches 1 and 2 whole, 10 rows of batch 3, none of 4.
        assert cache.stats.prefetched == 70
        assert int(np.count_nonzero(cache.next_use != NEVER)) == 70
        assert (_slots(cache, np.arange(100, 130)) >= 0).all() and (
            _slots(cache, np.arange(400, 430)) < 0
        ).all()
        # The values are unchanged either way (a prefetch only moves residency).
        assert cache.get(np.array([300, 429]), 5)[:, 0].tolist() == [300.0, 429.0]
    finally:
        cache.close()
        backend.close()


@pytest.mark.parametrize("slot_index", ["dense", "hash"])
def test_prefetch_of_the_next_step_only_needs_to_fit(
    tmp_path: Path, slot_index: Literal["dense", "hash"]
) -> None:
    backend, cache = _hinted_cache(tmp_path, capacity=50, slot_index=slot_index)
    try:
        first = np.arange(30)
        cache.get(first, 0)
        cache.update(first, 0, lambda rows: None)
        cache.prefetch(np.arange(100, 130), 1)  # the next step: all 30 fit (50 slots)
        cache.prefetch(np.arange(200, 230), 2)  # beyond: 50 - 30 hinted - 30 margin < 0
        cache.flush()
        assert cache.stats.prefetched == 30
        assert (_slots(cache, np.arange(100, 130)) >= 0).all() and (
            _slots(cache, np.arange(200, 230)) < 0
        ).all()
    finally:
        cache.close()
        backend.close()


class _GatedBackend(MemoryBackend):
    """A memory backend whose reads of row 100 wait for `gate` (a slow prefetch)."""

    gate: threading.Event

    def read_rows(self, ids: np.ndarray, out: np.ndarray) -> np.ndarray:
        if 100 in ids:
            assert self.gate.wait(20), "the test never opened the gate"
        return super().read_rows(ids, out)


@pytest.mark.parametrize("slot_index", ["dense", "hash"])
def test_a_write_waiting_for_room_is_not_overwritten_by_a_prefetch(
    tmp_path: Path, slot_index: Literal["dense", "hash"]
) -> None:
    """A write that waited for room must wait for a prefetch that began meanwhile.

    Otherwise the prefetch's load lands after the write and the written row is lost.
    """
    backend = _GatedBackend(tmp_path, 1000, 1, None)
    backend.gate = threading.Event()
    cache = RowCache(
        backend, num_rows=1000, width=1, capacity=4,
        initializer=lambda ids: ids[:, None].astype(np.float32),
        staleness_bound=None, eviction="lookahead", max_pending_rows=1000,
        slot_index=slot_index, timeout_s=20,
    )  # fmt: skip
    try:
        cache.get(np.array([0, 1, 2]), 0)  # three open reads: one free slot, nothing evictable
        written = np.array([[-1.0], [-2.0]], dtype=np.float32)
        writer = threading.Thread(target=cache.write, args=(np.array([100, 101]), written, 1))
        writer.start()
        deadline = time.monotonic() + 10
        while not cache.cond._waiters and time.monotonic() < deadline:  # type: ignore[attr-defined]
            time.sleep(0.01)  # until the writer waits for room (needs 2 slots, 1 is free)
        cache.prefetch(np.array([100]), 5)  # takes the free slot; its read waits at the gate
        assert cache.stats.prefetched == 1
        cache.update(np.array([0, 1, 2]), 0, lambda rows: None)  # closes the reads: room
        time.sleep(0.2)  # the writer wakes (and, before the fix, wrote into the loading slot)
        backend.gate.set()
        writer.join(20)
        assert not writer.is_alive()
        cache.reader.shutdown(wait=True)  # the prefetch's load has landed
        rows = cache.get(np.array([100, 101]), 2, count_read=False)
        assert rows[:, 0].tolist() == [-1.0, -2.0]  # the write, not the prefetched old row
    finally:
        backend.gate.set()
        cache.close()
        backend.close()
