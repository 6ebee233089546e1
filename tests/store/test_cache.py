"""The row cache's slot bookkeeping: evicted and failed slots come back clean and free."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from frugal.store.backends.memory import MemoryBackend
from frugal.store.cache import FREE, NEVER, RowCache


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
