"""Offline LRU and Belady caches: hand-computed traces and their ordering on a Zipf trace."""

from __future__ import annotations

import numpy as np
import pytest

from frugal.store.reference import belady_hit_ratio, lru_hit_ratio, next_use


def _batches(*lists: list[int]) -> list[np.ndarray]:
    return [np.array(x, dtype=np.int64) for x in lists]


def test_next_use_points_at_the_following_batch_of_each_id() -> None:
    never = np.iinfo(np.int64).max
    got = next_use(_batches([0, 1], [2], [1, 0], [1]))
    assert [g.tolist() for g in got] == [[2, 2], [never], [3, never], [never]]


def test_cyclic_trace_by_hand() -> None:
    # Capacity 2, accesses 0 1 2 0 1: LRU always evicts the row needed next (0 hits);
    # Belady evicts 2 (never used again) and hits 0 and 1 (2 of 5).
    trace = _batches([0], [1], [2], [0], [1])
    assert lru_hit_ratio(trace, 3, 2) == 0.0
    assert belady_hit_ratio(trace, 3, 2) == pytest.approx(0.4)
    with pytest.raises(ValueError, match="capacity=0"):
        lru_hit_ratio(trace, 3, 0)


def test_lru_never_beats_belady_and_both_agree_without_evictions() -> None:
    rng = np.random.default_rng(0)
    ranks = np.minimum(rng.zipf(1.2, size=(200, 64)), 5000) - 1
    trace = [np.unique(row) for row in ranks]
    distinct = len(np.unique(np.concatenate(trace)))
    looked_up = sum(len(b) for b in trace)
    for capacity in (50, 200, 800):
        assert lru_hit_ratio(trace, 5000, capacity) <= belady_hit_ratio(trace, 5000, capacity)
    everything = (looked_up - distinct) / looked_up  # only first uses miss
    assert lru_hit_ratio(trace, 5000, distinct) == pytest.approx(everything)
    assert belady_hit_ratio(trace, 5000, distinct) == pytest.approx(everything)
