"""The paper cost model: exact solvers against brute force, a hand-computed case, errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from frugal.planner.cost import (
    bottleneck_matching,
    dp_costs,
    hop_seconds,
    open_path,
    paper_cost,
    paper_lower_bound,
)
from frugal.planner.topology import Device, Topology


def _topology(delay: np.ndarray, bandwidth: np.ndarray, sites: list[str] | None = None) -> Topology:
    n = len(delay)
    sites = sites or ["s"] * n
    devices = tuple(Device(name=f"d{i}", host=f"h{i}", site=sites[i]) for i in range(n))
    return Topology(
        devices=devices, delay_ms=delay.astype(float), bandwidth_gbps=bandwidth.astype(float)
    )


@pytest.mark.parametrize("seed", range(5))
def test_bottleneck_matching_equals_brute_force(seed: int) -> None:
    cost = np.random.default_rng(seed).integers(1, 20, size=(5, 5)).astype(float)
    value, perm = bottleneck_matching(cost)
    brute = min(max(cost[r, p[r]] for r in range(5)) for p in itertools.permutations(range(5)))
    assert value == brute
    assert sorted(perm.tolist()) == list(range(5))
    assert max(cost[r, perm[r]] for r in range(5)) == brute


@pytest.mark.parametrize("seed", range(5))
def test_open_path_equals_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    w = rng.random((6, 6))
    w = w + w.T
    total, order = open_path(w)
    brute = min(sum(w[p[i], p[i + 1]] for i in range(5)) for p in itertools.permutations(range(6)))
    assert total == pytest.approx(brute)
    assert sorted(order.tolist()) == list(range(6))
    assert sum(w[order[i], order[i + 1]] for i in range(5)) == pytest.approx(total)


@pytest.mark.parametrize("g", [2, 5, 8])
def test_path_enumeration_equals_held_karp(g: int) -> None:
    from frugal.planner.cost import _held_karp

    rng = np.random.default_rng(g)
    w = rng.random((g, g))
    w = w + w.T
    total, order = open_path(w)
    assert total == pytest.approx(_held_karp(w)[0])
    assert sum(w[order[i], order[i + 1]] for i in range(g - 1)) == pytest.approx(total)


def test_paper_cost_by_hand() -> None:
    # 4 devices, 2 stages x 2 replicas. Sites: {0, 1} fast (1 ms, 8 Gbps), {2, 3} likewise,
    # across sites 10 ms, 1 Gbps. c_pp = 1 GB, c_dp = 0.5 GB.
    fast, slow = (1.0, 8.0), (10.0, 1.0)
    n = 4
    delay, bandwidth = np.zeros((n, n)), np.ones((n, n))
    for a in range(n):
        for b in range(n):
            if a != b:
                delay[a, b], bandwidth[a, b] = fast if a // 2 == b // 2 else slow
    top = _topology(delay, bandwidth, ["x", "x", "y", "y"])
    # Groups {0, 2} and {1, 3}: DP pairs cross sites; pipelines 0-1 and 2-3 stay inside.
    # DP(C) = 2 (0.010 + 8 * 0.5 / (2 * 1)) = 4.02 s for each member -> DP_cost = 4.02.
    # hop inside = 0.001 + 8 * 1 / 8 = 1.001; across = 0.010 + 8 = 8.01. BM = 1.001.
    # cost = 4.02 + 2 * 1.001 = 6.022.
    cost = paper_cost(top, np.array([[0, 2], [1, 3]]), c_pp_gb=1.0, c_dp_gb=0.5)
    assert cost.dp_s == pytest.approx(4.02)
    assert cost.pp_s == pytest.approx(1.001)
    assert cost.total_s == pytest.approx(6.022)
    assert sorted(map(sorted, cost.mesh)) == [[0, 1], [2, 3]]  # each pipeline inside a site
    # The other way round: DP inside sites 2 (0.001 + 8*0.5/(2*8)) = 0.502; PP hops cross: 8.01.
    other = paper_cost(top, np.array([[0, 1], [2, 3]]), c_pp_gb=1.0, c_dp_gb=0.5)
    assert other.total_s == pytest.approx(0.502 + 2 * 8.01)
    # Lower bound: every device's cheapest peer term is 0.502 (inside its site) and the
    # smallest hop is 1.001, so bound = 0.502 + 2 * 1.001 = 2.504 <= both costs.
    bound = paper_lower_bound(top, 2, 2, c_pp_gb=1.0, c_dp_gb=0.5)
    assert bound == pytest.approx(2.504)
    assert bound <= cost.total_s <= other.total_s


def test_dp_costs_take_the_slowest_member() -> None:
    delay = np.zeros((3, 3))
    bandwidth = np.array([[1, 1, 4], [1, 1, 4], [4, 4, 1]], dtype=float)
    top = _topology(delay, bandwidth)
    # K = 3, c_dp = 3 GB: pair term = 2 * 8 * 3 / (3 * beta) = 16 / beta.
    # member 0: 16/1 + 16/4 = 20; member 1: 20; member 2: 4 + 4 = 8 -> 20.
    assert dp_costs(top, np.array([[0, 1, 2]]), c_dp_gb=3.0).tolist() == pytest.approx([20.0])


def test_hop_seconds_units() -> None:
    top = _topology(np.array([[0, 50], [50, 0]]), np.array([[1, 2], [2, 1]]))
    # 50 ms + 8 * 0.5 GB / 2 Gbps = 0.05 + 2.0
    assert hop_seconds(top, c_pp_gb=0.5)[0, 1] == pytest.approx(2.05)


def test_bad_partitions_and_asymmetric_links_are_refused() -> None:
    top = _topology(np.zeros((4, 4)), np.ones((4, 4)))
    with pytest.raises(ValueError, match=r"every device id 0\.\.3 exactly once"):
        paper_cost(top, np.array([[0, 1], [1, 2]]))
    bw = np.ones((4, 4))
    bw[0, 1] = 2.0
    with pytest.raises(ValueError, match="symmetric links"):
        paper_cost(_topology(np.zeros((4, 4)), bw), np.array([[0, 1], [2, 3]]))


@pytest.mark.parametrize(
    ("delay", "bandwidth", "fragment"),
    [
        (np.zeros((2, 2)), np.array([[1, 0], [1, 1]]), "bandwidth d0 -> d1 = 0.0 Gbps must be > 0"),
        (np.array([[0, -1], [1, 0]]), np.ones((2, 2)), "delay d0 -> d1 = -1.0 ms"),
        (np.zeros((2, 2)), np.array([[1, np.nan], [1, 1]]), "NaN"),
        (np.zeros((3, 3)), np.ones((2, 2)), r"bandwidth_gbps has shape \(2, 2\)"),
    ],
)
def test_bad_topologies(delay: np.ndarray, bandwidth: np.ndarray, fragment: str) -> None:
    n = len(delay)
    with pytest.raises(ValueError, match=fragment):
        _topology(delay, bandwidth, ["s"] * n)


@pytest.mark.parametrize("k", [6, 20])
def test_perfect_matching_test_agrees_with_scipy_matching(k: int) -> None:
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import maximum_bipartite_matching

    from frugal.planner.cost import _has_perfect_matching

    rng = np.random.default_rng(k)
    seen = set()
    for density in (0.1, 0.2, 0.3, 0.5, 0.8):
        allowed = rng.random((k, k)) < density
        matched = maximum_bipartite_matching(csr_matrix(allowed), perm_type="column")
        expected = bool((matched >= 0).all())
        assert _has_perfect_matching(allowed) == expected
        seen.add(expected)
    assert seen == {True, False}  # both outcomes exercised
