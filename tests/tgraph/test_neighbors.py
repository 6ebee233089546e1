"""The vectorised neighbour finder against a brute-force scan."""

from __future__ import annotations

import numpy as np
import pytest

from frugal.tgraph.neighbors import NeighborFinder


def _events(seed: int = 0, num_events: int = 400, num_nodes: int = 30) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    src = rng.integers(0, num_nodes, num_events)
    dst = rng.integers(0, num_nodes, num_events)
    t = np.sort(rng.integers(0, 100, num_events))  # many equal timestamps
    return src, dst, t


def test_most_recent_k_matches_brute_force() -> None:
    src, dst, t = _events()
    finder = NeighborFinder(src, dst, t, 30)
    rng = np.random.default_rng(1)
    node = rng.integers(0, 30, 200)
    query_t = rng.integers(0, 110, 200)
    batch_start = rng.integers(0, 400, 200)
    cutoff = finder.cutoff_before(query_t, batch_start)
    nb = finder.sample(node, cutoff, 5)
    for i in range(len(node)):
        # Brute force: events touching node i, strictly before t and before the batch start.
        ok = [
            e
            for e in range(len(src))
            if (src[e] == node[i] or dst[e] == node[i]) and t[e] < query_t[i] and e < batch_start[i]
        ]
        expected = ok[-5:]
        got = nb.eid[i][nb.mask[i]].tolist()
        assert got == expected
        others = [dst[e] if src[e] == node[i] else src[e] for e in expected]
        assert nb.nbr[i][nb.mask[i]].tolist() == others
        assert (nb.t[i][nb.mask[i]] < query_t[i]).all()


def test_self_loop_is_listed_once() -> None:
    finder = NeighborFinder(np.array([0, 0]), np.array([0, 1]), np.array([5, 6]), 2)
    nb = finder.sample(np.array([0, 1]), np.array([2, 2]), 3)
    assert nb.eid[0][nb.mask[0]].tolist() == [0, 1]
    assert nb.eid[1][nb.mask[1]].tolist() == [1]


def test_subset_finder_uses_global_event_ids() -> None:
    src, dst, t = _events(2)
    keep = np.arange(0, 400, 3)
    finder = NeighborFinder(src[keep], dst[keep], t[keep], 30, eid=keep)
    nb = finder.sample(np.arange(30), finder.cutoff_before(np.full(30, 1000), np.full(30, 200)), 4)
    assert set(nb.eid[nb.mask].tolist()) <= set(keep[keep < 200].tolist())


def test_uniform_sampling_stays_in_the_past() -> None:
    src, dst, t = _events(3)
    finder = NeighborFinder(src, dst, t, 30)
    node = np.arange(30)
    cutoff = finder.cutoff_before(np.full(30, 50), None)
    nb = finder.sample(node, cutoff, 8, strategy="uniform", rng=np.random.default_rng(0))
    eid = nb.eid[nb.mask]
    assert (t[eid] < 50).all()
    rows = np.nonzero(nb.mask)[0]
    assert ((src[eid] == node[rows]) | (dst[eid] == node[rows])).all()


def test_bad_input_is_rejected() -> None:
    with pytest.raises(ValueError, match="non-decreasing"):
        NeighborFinder(np.array([0, 1]), np.array([1, 0]), np.array([2, 1]), 2)
    with pytest.raises(ValueError, match="outside"):
        NeighborFinder(np.array([0, 5]), np.array([1, 0]), np.array([1, 2]), 2)
    finder = NeighborFinder(np.array([0]), np.array([1]), np.array([1]), 2)
    with pytest.raises(ValueError, match="strategy"):
        finder.sample(np.array([0]), np.array([1]), 2, strategy="bfs")
