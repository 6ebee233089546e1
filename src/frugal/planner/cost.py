"""The DT-FM paper's communication cost of a placement, with exact inner solvers.

A placement splits the N devices into D_pp groups of D_dp devices: group g runs one pipeline
stage for every data shard (its data-parallel group). The paper's cost (section 3.2):

- hop(d, d') = alpha/1000 + 8 c_pp / beta: one activation message, seconds (alpha in ms,
  beta in Gbit/s, c_pp in GB).
- DP(C) = max_{d in C} sum_{d' in C, d' != d} 2 (alpha/1000 + 8 c_dp / (D_dp beta)); DP_cost is
  the largest DP(C) over the groups.
- BM(C_a, C_b) = bottleneck perfect matching between two groups: the smallest possible largest
  hop when each device of C_a sends to one device of C_b.
- PP_cost = cheapest open Hamiltonian path through the groups with edge weight BM.
- cost = DP_cost + 2 PP_cost (forward and backward).

Shape legend: N devices, G groups (D_pp), K devices per group (D_dp).

References:
    Decentralized Training of Foundation Models in Heterogeneous Environments, NeurIPS 2022,
    arXiv 2206.01288 (section 3.2, the communication cost model; appendix constants).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.optimize import linear_sum_assignment
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_bipartite_matching

from frugal._typing import F64, I64
from frugal.planner.topology import Topology

__all__ = [
    "PAPER_C_DP_GB",
    "PAPER_C_PP_GB",
    "PaperCost",
    "bottleneck_matching",
    "dp_costs",
    "hop_seconds",
    "open_path",
    "paper_cost",
    "paper_lower_bound",
]


PAPER_C_DP_GB = 0.65
"""Gradient bytes per device per iteration in GB: 1.3e9 params x 4 B x 3/24 layers (paper)."""
PAPER_C_PP_GB = 0.47125
"""Activation bytes per stage boundary in GB: 2024 x 2048 x 2 B x (1.25e5/2048) / 2^30, as in
the DT-FM code ("2024" is a typo for 2048, which would give 0.4768; kept for reproduction)."""
_HELD_KARP_MAX = 16


def hop_seconds(topology: Topology, c_pp_gb: float = PAPER_C_PP_GB) -> F64:
    """Seconds to send one activation message between every pair of devices.

    Shapes:
        returns (N, N); the diagonal is 0.
    """
    with np.errstate(divide="ignore"):
        hop = topology.delay_ms / 1000.0 + 8.0 * c_pp_gb / topology.bandwidth_gbps
    np.fill_diagonal(hop, 0.0)
    result: F64 = hop
    return result


def dp_costs(topology: Topology, groups_GK: I64, c_dp_gb: float = PAPER_C_DP_GB) -> F64:
    """Paper DP cost of every group: the slowest member's sequential exchange with its peers.

    Shapes:
        groups_GK: (G, K) device ids; returns (G,) seconds.
    """
    k = groups_GK.shape[1]
    with np.errstate(divide="ignore"):
        pair = 2.0 * (topology.delay_ms / 1000.0 + 8.0 * c_dp_gb / (k * topology.bandwidth_gbps))
    sub_GKK = pair[groups_GK[:, :, None], groups_GK[:, None, :]]
    idx = np.arange(k)
    sub_GKK[:, idx, idx] = 0.0
    result: F64 = sub_GKK.sum(axis=2).max(axis=1)
    return result


def _has_perfect_matching(allowed_KK: npt.NDArray[np.bool_]) -> bool:
    """Whether the bipartite graph of allowed edges has a perfect matching.

    Small graphs (K <= 16): a min-sum assignment on 0/1 costs (zero iff a perfect matching of
    allowed edges exists; scipy's C solver, no sparse-matrix overhead); larger ones: maximum
    bipartite matching on a sparse matrix.
    """
    if allowed_KK.shape[0] <= 16:
        penalty = (~allowed_KK).astype(np.float64)
        rows, cols = linear_sum_assignment(penalty)
        return not penalty[rows, cols].any()
    matched = maximum_bipartite_matching(csr_matrix(allowed_KK), perm_type="column")
    return bool((matched >= 0).all())


def bottleneck_matching(cost_KK: F64) -> tuple[float, I64]:
    """Exact bottleneck perfect matching: minimise the largest matched cost.

    Bisects over the distinct costs; feasibility by maximum bipartite matching on the edges
    at or below the threshold. Among bottleneck-optimal matchings the one with the least total
    cost is returned (a min-sum assignment on the allowed edges).

    Returns:
        (bottleneck value, perm) with perm[a] = the column matched to row a.

    Shapes:
        cost_KK: (K, K); perm: (K,).
    """
    k = cost_KK.shape[0]
    values = np.unique(cost_KK)
    # Every row and column needs one edge, so the bottleneck is at least the largest row or
    # column minimum: start the bisection there.
    floor = max(float(cost_KK.min(axis=1).max()), float(cost_KK.min(axis=0).max()))
    lo, hi = int(np.searchsorted(values, floor)), len(values) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if _has_perfect_matching(cost_KK <= values[mid]):
            hi = mid
        else:
            lo = mid + 1
    threshold = values[lo]
    penalised = np.where(cost_KK <= threshold, cost_KK, cost_KK.max() * k + 1.0)
    rows, cols = linear_sum_assignment(penalised)
    perm = np.empty(k, dtype=np.int64)
    perm[rows] = cols
    return float(threshold), perm


_ENUMERATE_MAX = 8
_PATHS: dict[int, I64] = {}


def _all_paths(g: int) -> I64:
    """Every open path through g nodes once per direction pair (first node < last), (P, g)."""
    if g not in _PATHS:
        perms = np.array(list(itertools.permutations(range(g))), dtype=np.int64)
        _PATHS[g] = np.ascontiguousarray(perms[perms[:, 0] < perms[:, -1]])
    return _PATHS[g]


def open_path(weight_GG: F64) -> tuple[float, I64]:
    """Cheapest open Hamiltonian path (any start, any end) through G nodes, exactly.

    Up to 8 nodes: one gather over all G!/2 paths (vectorised, about 1 ms at G = 8); up to 16:
    Held-Karp dynamic programming over subsets. Ties go to the first path in lexicographic
    order (enumeration) or the DP's order, deterministically.

    Returns:
        (total weight, order of the nodes along the path).

    Raises:
        ValueError: If G > 16 (exact search would take too long).

    Shapes:
        weight_GG: (G, G), symmetric; order: (G,).
    """
    g = weight_GG.shape[0]
    if g == 1:
        return 0.0, np.zeros(1, dtype=np.int64)
    if g > _HELD_KARP_MAX:
        raise ValueError(f"open_path is exact up to {_HELD_KARP_MAX} groups, got {g}")
    if g <= _ENUMERATE_MAX:
        paths = _all_paths(g)
        totals = weight_GG[paths[:, :-1], paths[:, 1:]].sum(axis=1)
        best_path = int(np.argmin(totals))
        return float(totals[best_path]), paths[best_path].copy()
    return _held_karp(weight_GG)


def _held_karp(weight_GG: F64) -> tuple[float, I64]:
    """Held-Karp DP for the cheapest open path (G >= 2), O(2^G G^2)."""
    g = weight_GG.shape[0]
    full = 1 << g
    best = np.full((full, g), np.inf)
    parent = np.full((full, g), -1, dtype=np.int64)
    for j in range(g):
        best[1 << j, j] = 0.0
    for mask in range(1, full):
        row = best[mask]
        if not np.isfinite(row).any():
            continue
        for j in np.flatnonzero(np.isfinite(row)).tolist():
            outside = [x for x in range(g) if not (mask >> x) & 1]
            if not outside:
                continue
            nxt = np.array(outside)
            candidate = row[j] + weight_GG[j, nxt]
            masks = mask | (1 << nxt)
            better = candidate < best[masks, nxt]
            best[masks[better], nxt[better]] = candidate[better]
            parent[masks[better], nxt[better]] = j
    end = int(np.argmin(best[full - 1]))
    total = float(best[full - 1, end])
    order = [end]
    mask = full - 1
    while parent[mask, order[-1]] >= 0:
        previous = int(parent[mask, order[-1]])
        mask &= ~(1 << order[-1])
        order.append(previous)
    return total, np.array(order[::-1], dtype=np.int64)


@dataclass(frozen=True, slots=True)
class PaperCost:
    """A placement's paper cost and the pipeline wiring it implies."""

    total_s: float
    """DP_cost + 2 PP_cost, seconds."""
    dp_s: float
    """Largest group DP cost."""
    pp_s: float
    """Open-path cost through the groups (one direction)."""
    stage_order: tuple[int, ...]
    """Group ids along the path: stage i is group stage_order[i]."""
    mesh: tuple[tuple[int, ...], ...]
    """`mesh[j][i]` = device of pipeline j at stage i (matchings chained along the path)."""


def paper_cost(
    topology: Topology,
    groups_GK: I64,
    *,
    c_pp_gb: float = PAPER_C_PP_GB,
    c_dp_gb: float = PAPER_C_DP_GB,
    hop_NN: F64 | None = None,
) -> PaperCost:
    """Score a partition with the paper's cost, solving matching and path exactly.

    Args:
        topology: Devices and links; must be symmetric.
        groups_GK: Device ids, one row per group, each device exactly once.
        c_pp_gb: Activation gigabytes per stage boundary.
        c_dp_gb: Gradient gigabytes per device.
        hop_NN: Precomputed `hop_seconds` (saves time inside a search).

    Returns:
        The cost and the implied stage order and mesh.

    Raises:
        ValueError: If groups do not cover every device once, or links are asymmetric.

    Shapes:
        groups_GK: (G, K) with G K = N.
    """
    n = topology.num_devices
    flat = np.sort(groups_GK.ravel())
    if groups_GK.ndim != 2 or not np.array_equal(flat, np.arange(n)):
        raise ValueError(
            f"groups of shape {groups_GK.shape} must hold every device id 0..{n - 1} exactly once"
        )
    if not topology.is_symmetric():
        raise ValueError(
            "the paper's cost assumes symmetric links; symmetrize the topology (e.g. take the "
            "max of both directions) or use the iteration objective"
        )
    hop = hop_NN if hop_NN is not None else hop_seconds(topology, c_pp_gb)
    g = groups_GK.shape[0]
    dp = float(dp_costs(topology, groups_GK, c_dp_gb).max())
    weight = np.zeros((g, g))
    perms: dict[tuple[int, int], I64] = {}
    for a, b in itertools.combinations(range(g), 2):
        value, perm = bottleneck_matching(hop[groups_GK[a][:, None], groups_GK[b][None, :]])
        weight[a, b] = weight[b, a] = value
        perms[(a, b)] = perm
    pp, order = open_path(weight)
    # Chain the matchings along the path: pipeline j starts at the j-th device of the first group.
    k = groups_GK.shape[1]
    mesh = np.empty((k, g), dtype=np.int64)
    position = np.arange(k)  # index inside the current group of each pipeline's device
    mesh[:, 0] = groups_GK[order[0]][position]
    for step in range(1, g):
        a, b = int(order[step - 1]), int(order[step])
        if (a, b) in perms:
            position = perms[(a, b)][position]
        else:  # the matching was solved as (b, a): invert it
            inverse = np.empty(k, dtype=np.int64)
            inverse[perms[(b, a)]] = np.arange(k)
            position = inverse[position]
        mesh[:, step] = groups_GK[b][position]
    return PaperCost(
        total_s=dp + 2.0 * pp,
        dp_s=dp,
        pp_s=pp,
        stage_order=tuple(int(x) for x in order),
        mesh=tuple(tuple(int(x) for x in row) for row in mesh),
    )


def paper_lower_bound(
    topology: Topology,
    num_stages: int,
    num_replicas: int,
    *,
    c_pp_gb: float = PAPER_C_PP_GB,
    c_dp_gb: float = PAPER_C_DP_GB,
) -> float:
    """A lower bound on the paper cost of any partition (planner.md, section 4).

    DP_cost >= max over devices d of the sum of d's K-1 cheapest pair terms (d is in some
    group); PP_cost >= (G-1) x the smallest hop between two devices.
    """
    k = num_replicas
    with np.errstate(divide="ignore"):
        pair = 2.0 * (topology.delay_ms / 1000.0 + 8.0 * c_dp_gb / (k * topology.bandwidth_gbps))
    np.fill_diagonal(pair, np.inf)
    dp = float(np.sort(pair, axis=1)[:, : k - 1].sum(axis=1).max()) if k > 1 else 0.0
    hop = hop_seconds(topology, c_pp_gb)
    np.fill_diagonal(hop, np.inf)
    pp = (num_stages - 1) * float(hop.min()) if num_stages > 1 else 0.0
    return dp + 2.0 * pp
