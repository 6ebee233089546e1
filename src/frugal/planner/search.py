"""Searching placements under the paper's cost: structured seeds, then exact-scored swaps.

Our search starts from structured seeds (pipelines inside sites with data-parallel groups
across them, the reverse, and Megatron's default order) and improves the best with swaps of
two devices between groups. A swap touches two groups, so it re-solves only their DP terms and
the 2(G-1) bottleneck matchings that involve them before the exact open path; a candidate costs
about a quarter of a full evaluation. Baselines: Megatron's default grouping, random
partitions (best of a budget).

Shape legend: N devices, G groups (D_pp stages), K devices per group (D_dp replicas).

References:
    Decentralized Training of Foundation Models in Heterogeneous Environments, NeurIPS 2022,
    arXiv 2206.01288 (section 3.3: the search; ours replaces its genetic algorithm).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from frugal.planner.cost import (
    PAPER_C_DP_GB,
    PAPER_C_PP_GB,
    PaperCost,
    bottleneck_matching,
    dp_costs,
    hop_seconds,
    open_path,
    paper_cost,
)
from frugal.planner.iteration import (
    IterationCost,
    WorkloadConfig,
    iteration_cost,
    stage_memory_gib,
)
from frugal.planner.topology import Topology

__all__ = [
    "MeshSearchResult",
    "SearchResult",
    "check_grid",
    "dtfm_ga",
    "iteration_search",
    "megatron_default_groups",
    "random_search",
    "site_transversal_groups",
    "swap_search",
]

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
_PAPER_SEED_MAX_STAGES = 9  # the paper-cost seed solves an open path over the stages exactly


def check_grid(topology: Topology, num_stages: int, num_replicas: int) -> None:
    """Check that num_stages x num_replicas devices are exactly the topology's.

    Raises:
        ValueError: Naming both numbers and the world size.
    """
    n = topology.num_devices
    if num_stages < 1 or num_replicas < 1 or num_stages * num_replicas != n:
        raise ValueError(
            f"num_stages*num_replicas = {num_stages}*{num_replicas} = {num_stages * num_replicas} "
            f"but world_size = {n}; choose factors of {n}"
        )


def megatron_default_groups(num_stages: int, num_replicas: int) -> I64:
    """Megatron's default: mesh[j][i] = i*D_dp + j, so stage i's DP group is ids i*D_dp..+D_dp-1.

    Shapes:
        returns (G, K).
    """
    groups: I64 = np.arange(num_stages * num_replicas, dtype=np.int64).reshape(
        num_stages, num_replicas
    )
    return groups


def site_transversal_groups(topology: Topology, num_stages: int, num_replicas: int) -> I64:
    """Pipelines on consecutive devices in site order, each stage's DP group across them.

    With one site per pipeline this keeps every activation hop inside a site and sends only
    gradients across sites (the best-known layout for the paper's cost in cases 3-5).

    Shapes:
        returns (G, K).
    """
    sites = sorted({d.site for d in topology.devices})
    site_order = sites
    if 2 < len(sites) <= 16:
        # Sites whose size is not a multiple of the pipeline length make pipelines cross
        # sites: concatenate the sites along the cheapest open path of site-to-site hops.
        first = {s: next(i for i, d in enumerate(topology.devices) if d.site == s) for s in sites}
        hop = hop_seconds(topology)
        weight = np.array([[max(hop[first[a], first[b]], hop[first[b], first[a]]) if a != b else 0.0
                            for b in sites] for a in sites])  # fmt: skip
        _, path = open_path(weight)
        site_order = [sites[int(i)] for i in path]
    rank = {s: k for k, s in enumerate(site_order)}
    order = sorted(range(topology.num_devices), key=lambda d: (rank[topology.devices[d].site], d))
    mesh = np.array(order, dtype=np.int64).reshape(num_replicas, num_stages)
    groups: I64 = np.ascontiguousarray(mesh.T)
    return groups


@dataclass(frozen=True, slots=True)
class SearchResult:
    """The best partition found and how the search went."""

    groups: I64
    """(G, K) device ids per stage group."""
    cost: PaperCost
    """Its paper cost, stage order and mesh."""
    candidates: int
    """Partitions scored."""
    search_s: float
    """Wall-clock seconds."""
    history: tuple[tuple[int, float], ...]
    """(candidates scored, best cost so far) after each improvement: the convergence curve."""


class _State:
    """A partition with cached DP terms and pairwise bottleneck weights for fast swaps."""

    def __init__(self, topology: Topology, groups: I64, hop: F64, c_dp_gb: float) -> None:
        self.topology = topology
        self.hop = hop
        self.c_dp_gb = c_dp_gb
        self.groups = groups.copy()
        g = groups.shape[0]
        self.dp = dp_costs(topology, self.groups, c_dp_gb)
        self.weight = np.zeros((g, g))
        for a in range(g):
            for b in range(a + 1, g):
                self.weight[a, b] = self.weight[b, a] = self._bm(a, b)
        self.pp = open_path(self.weight)[0]

    def _bm(self, a: int, b: int, groups: I64 | None = None) -> float:
        gr = self.groups if groups is None else groups
        return bottleneck_matching(self.hop[gr[a][:, None], gr[b][None, :]])[0]

    @property
    def total(self) -> float:
        return float(self.dp.max() + 2.0 * self.pp)

    def try_swap(self, a: int, x: int, b: int, y: int) -> tuple[float, I64, F64, F64, float]:
        """Cost after swapping groups[a][x] with groups[b][y] (state unchanged)."""
        groups = self.groups.copy()
        groups[a, x], groups[b, y] = groups[b, y], groups[a, x]
        dp = self.dp.copy()
        dp[[a, b]] = dp_costs(self.topology, groups[[a, b]], self.c_dp_gb)
        weight = self.weight.copy()
        for c in range(groups.shape[0]):
            for changed in (a, b):
                if c != changed and not (changed == b and c == a):
                    weight[changed, c] = weight[c, changed] = self._bm(changed, c, groups)
        weight[a, b] = weight[b, a] = self._bm(a, b, groups)
        pp = open_path(weight)[0]
        return float(dp.max() + 2.0 * pp), groups, dp, weight, pp

    def accept(self, groups: I64, dp: F64, weight: F64, pp: float) -> None:
        self.groups, self.dp, self.weight, self.pp = groups, dp, weight, pp


def swap_search(
    topology: Topology,
    num_stages: int,
    num_replicas: int,
    *,
    budget: int = 2000,
    seed: int = 0,
    c_pp_gb: float = PAPER_C_PP_GB,
    c_dp_gb: float = PAPER_C_DP_GB,
    time_limit_s: float = 30.0,
) -> SearchResult:
    """Our search: best structured seed, then first-improvement swaps, scored exactly.

    Swaps are drawn at random (seeded) between two groups; a swap is kept when it lowers the
    cost. Deterministic for a given seed and budget (the time limit only cuts it short).

    Args:
        topology: Devices and links (symmetric).
        num_stages: D_pp.
        num_replicas: D_dp.
        budget: Candidates to score at most (seeds included).
        seed: Seed of the swap draws.
        c_pp_gb: Activation gigabytes per stage boundary.
        c_dp_gb: Gradient gigabytes per device.
        time_limit_s: Stop after this many seconds even if budget remains.

    Returns:
        The best partition with its cost and convergence history.

    Raises:
        ValueError: If num_stages x num_replicas != number of devices, or links are asymmetric.
    """
    check_grid(topology, num_stages, num_replicas)
    start = time.perf_counter()
    hop = hop_seconds(topology, c_pp_gb)
    rng = np.random.default_rng(seed)
    seeds = [
        site_transversal_groups(topology, num_stages, num_replicas),
        np.ascontiguousarray(site_transversal_groups(topology, num_replicas, num_stages).T)
        if num_stages == num_replicas
        else megatron_default_groups(num_stages, num_replicas),
        megatron_default_groups(num_stages, num_replicas),
        rng.permutation(topology.num_devices).reshape(num_stages, num_replicas),
    ]
    candidates = 0
    best_state: _State | None = None
    history: list[tuple[int, float]] = []
    for groups in seeds:
        state = _State(topology, np.asarray(groups, dtype=np.int64), hop, c_dp_gb)
        candidates += 1
        if best_state is None or state.total < best_state.total:
            best_state = state
            history.append((candidates, state.total))
    assert best_state is not None
    state = best_state
    g, k = state.groups.shape
    while candidates < budget and g > 1 and time.perf_counter() - start < time_limit_s:
        a, b = rng.choice(g, size=2, replace=False)
        x, y = rng.integers(0, k, size=2)
        total, groups, dp, weight, pp = state.try_swap(int(a), int(x), int(b), int(y))
        candidates += 1
        if total < state.total - 1e-12:
            state.accept(groups, dp, weight, pp)
            history.append((candidates, total))
    cost = paper_cost(topology, state.groups, c_pp_gb=c_pp_gb, c_dp_gb=c_dp_gb, hop_NN=hop)
    return SearchResult(
        groups=state.groups,
        cost=cost,
        candidates=candidates,
        search_s=time.perf_counter() - start,
        history=tuple(history),
    )


def random_search(
    topology: Topology,
    num_stages: int,
    num_replicas: int,
    *,
    budget: int = 5000,
    seed: int = 0,
    c_pp_gb: float = PAPER_C_PP_GB,
    c_dp_gb: float = PAPER_C_DP_GB,
    time_limit_s: float = float("inf"),
) -> SearchResult:
    """Baseline: the best of `budget` uniformly random partitions (the paper's random baseline).

    Stops early after `time_limit_s` seconds.

    Raises:
        ValueError: If num_stages x num_replicas != number of devices.
    """
    check_grid(topology, num_stages, num_replicas)
    start = time.perf_counter()
    hop = hop_seconds(topology, c_pp_gb)
    rng = np.random.default_rng(seed)
    best: PaperCost | None = None
    best_groups = None
    history: list[tuple[int, float]] = []
    for candidate in range(1, budget + 1):
        groups = rng.permutation(topology.num_devices).reshape(num_stages, num_replicas)
        cost = paper_cost(topology, groups, c_pp_gb=c_pp_gb, c_dp_gb=c_dp_gb, hop_NN=hop)
        if best is None or cost.total_s < best.total_s:
            best, best_groups = cost, groups
            history.append((candidate, cost.total_s))
        if time.perf_counter() - start > time_limit_s:
            budget = candidate
            break
    assert best is not None
    assert best_groups is not None
    return SearchResult(
        groups=best_groups,
        cost=best,
        candidates=budget,
        search_s=time.perf_counter() - start,
        history=tuple(history),
    )


@dataclass(frozen=True, slots=True)
class MeshSearchResult:
    """The best mesh found under the iteration objective."""

    mesh: I64
    """(J, I) device of pipeline j at stage i."""
    cost: IterationCost
    candidates: int
    search_s: float
    history: tuple[tuple[int, float], ...]


def iteration_search(
    topology: Topology,
    num_stages: int,
    num_replicas: int,
    layers_per_stage: tuple[int, ...],
    workload: WorkloadConfig,
    *,
    budget: int = 2000,
    seed: int = 0,
    time_limit_s: float = 30.0,
    balance_microbatches: bool = True,
) -> MeshSearchResult:
    """Our search under the iteration objective: structured seeds, then exact-scored swaps.

    Seeds: pipelines inside sites with DP across them (site transversal), Megatron's default,
    the paper-cost optimum's mesh, and a random mesh; the best is improved by swapping two
    devices of the mesh (first improvement, seeded draws). Deterministic for a seed and budget.
    Micro-batches are shared in proportion to pipeline speed unless `balance_microbatches` is
    False.

    Raises:
        ValueError: If num_stages x num_replicas != number of devices.
    """
    check_grid(topology, num_stages, num_replicas)
    start = time.perf_counter()
    balance = balance_microbatches
    rng = np.random.default_rng(seed)
    seeds: list[I64] = [
        np.ascontiguousarray(site_transversal_groups(topology, num_stages, num_replicas).T),
        np.ascontiguousarray(megatron_default_groups(num_stages, num_replicas).T),
        rng.permutation(topology.num_devices).reshape(num_replicas, num_stages),
    ]
    if topology.is_symmetric() and num_stages <= _PAPER_SEED_MAX_STAGES:
        paper = swap_search(topology, num_stages, num_replicas, budget=1, seed=seed)
        seeds.append(np.array(paper.cost.mesh, dtype=np.int64))
    candidates = 0
    best_mesh, best = seeds[0], None
    history: list[tuple[int, float]] = []
    need = np.array([stage_memory_gib(workload, layer, i, num_stages)
                     for i, layer in enumerate(layers_per_stage)])  # fmt: skip
    memory = np.array([d.memory_gib for d in topology.devices])

    def fits(mesh: I64) -> bool:
        return bool((memory[mesh] >= need[None, :]).all())

    for mesh in seeds:
        cost = iteration_cost(
            topology, mesh, layers_per_stage, workload, balance_microbatches=balance
        )
        candidates += 1
        if fits(mesh) and (best is None or cost.total_s < best.total_s):
            best_mesh, best = mesh, cost
            history.append((candidates, cost.total_s))
    if best is None:  # no seed fits: place the largest stages on the largest devices
        by_memory = np.argsort(-memory, kind="stable")
        stage_rank = np.argsort(-need, kind="stable")
        mesh = np.empty((num_replicas, num_stages), dtype=np.int64)
        for position, stage in enumerate(stage_rank):
            mesh[:, stage] = by_memory[position * num_replicas : (position + 1) * num_replicas]
        best_mesh = mesh
        best = iteration_cost(
            topology, mesh, layers_per_stage, workload, balance_microbatches=balance
        )
        history.append((candidates, best.total_s))
    n = topology.num_devices
    while candidates < budget and n > 1 and time.perf_counter() - start < time_limit_s:
        a, b = rng.choice(n, size=2, replace=False)
        mesh = best_mesh.copy()
        flat = mesh.reshape(-1)
        flat[a], flat[b] = flat[b], flat[a]
        cost = iteration_cost(
            topology, mesh, layers_per_stage, workload, balance_microbatches=balance
        )
        candidates += 1
        if cost.total_s < best.total_s - 1e-12 and fits(mesh):
            best_mesh, best = mesh, cost
            history.append((candidates, cost.total_s))
    return MeshSearchResult(
        mesh=best_mesh,
        cost=best,
        candidates=candidates,
        search_s=time.perf_counter() - start,
        history=tuple(history),
    )


def _align_labels(reference: I64, other: I64) -> I64:
    """Reorder `other`'s groups to overlap `reference`'s most (LSA on group overlaps)."""
    from scipy.optimize import linear_sum_assignment

    g = reference.shape[0]
    owner_ref = np.empty(reference.size, dtype=np.int64)
    owner_ref[reference.ravel()] = np.repeat(np.arange(g), reference.shape[1])
    overlap = np.zeros((g, g))
    for b in range(g):
        np.add.at(overlap[:, b], owner_ref[other[b]], 1.0)
    _, cols = linear_sum_assignment(-overlap)
    aligned: I64 = other[cols]
    return aligned


def _crossover(p1: I64, p2: I64, rng: np.random.Generator, points: int = 5) -> I64:
    """The paper's "5-point" crossover with labels aligned first (a fix of the released code).

    `points` random devices take the group they have in parent 1 inside (aligned) parent 2;
    groups that overflow give their surplus to the first under-full groups.
    """
    g, k = p1.shape
    child = _align_labels(p1, p2)
    owner = np.empty(p1.size, dtype=np.int64)
    owner[child.ravel()] = np.repeat(np.arange(g), k)
    owner_p1 = np.empty(p1.size, dtype=np.int64)
    owner_p1[p1.ravel()] = np.repeat(np.arange(g), k)
    for device in rng.choice(p1.size, size=min(points, p1.size), replace=False):
        owner[device] = owner_p1[device]
    members = [list(np.flatnonzero(owner == a)) for a in range(g)]
    surplus = [d for a in range(g) for d in members[a][k:]]
    members = [m[:k] for m in members]
    for a in range(g):
        while len(members[a]) < k:
            members[a].append(surplus.pop(0))
    return np.array(members, dtype=np.int64)


def _kl_pass(groups: I64, hop: F64) -> I64:
    """One Kernighan-Lin pass on pipeline hops (DP ignored, as the paper's gain), vectorised.

    A swap of v (group A) with u (group B) gains the drop of both devices' mean hop to their
    group-mates: (S[v,A] - S[v,B] + hop[v,u] + S[u,B] - S[u,A] + hop[u,v]) / (k - 1), with
    S[x,g] the summed hop from x to g's members. (The paper's gain, mean hop to the target
    minus the cheapest hop at home, ignores that the partner leaves the target; with it a
    swap of the two closest devices looks best and changes nothing.) Up to G times the
    unlocked pair with the largest gain is swapped (a 2-cycle of the paper's cyclic moves,
    which keeps group sizes) and both are locked; the best positive prefix is kept.
    """
    g, k = groups.shape
    if g < 2 or k < 2:
        return groups
    n = groups.size
    current = groups.copy()
    locked = np.zeros(n, dtype=bool)
    swaps: list[tuple[int, int]] = []
    gains: list[float] = []
    for _ in range(g):
        owner = np.empty(n, dtype=np.int64)
        owner[current.ravel()] = np.repeat(np.arange(g), k)
        member = np.zeros((n, g))
        member[np.arange(n), owner] = 1.0
        summed = hop @ member  # (N, G)
        home = summed[np.arange(n), owner]  # S[v, own group]
        # pair[v, u] = S[v,A] - S[v,B] + S[u,B] - S[u,A] + hop[v,u] + hop[u,v]
        to_other = summed[:, owner]  # [v, u] -> S[v, owner(u)]
        pair = (home[:, None] - to_other) + (home[None, :] - to_other.T) + hop + hop.T
        allowed = (owner[:, None] != owner[None, :]) & ~locked[:, None] & ~locked[None, :]
        if not allowed.any():
            break
        pair = np.where(allowed, pair / (k - 1), -np.inf)
        best_v, best_u = np.unravel_index(int(np.argmax(pair)), pair.shape)
        gains.append(float(pair[best_v, best_u]))
        swaps.append((int(best_v), int(best_u)))
        _swap_devices(current, int(best_v), int(best_u))
        locked[[best_v, best_u]] = True
    prefix = np.cumsum(gains)
    keep = int(np.argmax(prefix)) + 1 if len(prefix) and prefix.max() > 0 else 0
    result = groups.copy()
    for v, u in swaps[:keep]:
        _swap_devices(result, v, u)
    return result


def _swap_devices(groups: I64, v: int, u: int) -> None:
    """Exchange devices v and u between their groups, in place."""
    where_v, where_u = groups == v, groups == u
    groups[where_v], groups[where_u] = u, v


def dtfm_ga(
    topology: Topology,
    num_stages: int,
    num_replicas: int,
    *,
    budget: int = 5000,
    population: int = 100,
    seed: int = 0,
    c_pp_gb: float = PAPER_C_PP_GB,
    c_dp_gb: float = PAPER_C_DP_GB,
    kl_pass: bool = True,
) -> SearchResult:
    """The DT-FM paper's genetic algorithm (baseline), with its released defects fixed.

    `population` random partitions, then offspring from two uniformly chosen parents by the
    "5-point" crossover, each refined by one Kernighan-Lin pass (`kl_pass`, see `_kl_pass`),
    until `budget` candidates are scored; an offspring replaces the worst member when it is
    better. Fixed: real seeding, a correct replacement comparison, label-aligned crossover,
    vectorised gains (the released O(N^2) Python gains take about 0.3 s per offspring).
    The KL pass uses pair swaps, the 2-cycles of the paper's cyclic moves.

    Raises:
        ValueError: If num_stages x num_replicas != number of devices.
    """
    check_grid(topology, num_stages, num_replicas)
    start = time.perf_counter()
    hop = hop_seconds(topology, c_pp_gb)
    rng = np.random.default_rng(seed)

    def score(groups: I64) -> float:
        return paper_cost(topology, groups, c_pp_gb=c_pp_gb, c_dp_gb=c_dp_gb, hop_NN=hop).total_s

    size = min(population, budget)
    pool = [
        rng.permutation(topology.num_devices).reshape(num_stages, num_replicas) for _ in range(size)
    ]
    costs = [score(p) for p in pool]
    candidates = size
    best = int(np.argmin(costs))
    history = [(int(np.argmin(costs)) + 1, float(costs[best]))]
    while candidates < budget:
        i, j = rng.choice(len(pool), size=2, replace=False)
        child = _crossover(pool[i], pool[j], rng)
        if kl_pass:
            child = _kl_pass(child, hop)
        cost = score(child)
        candidates += 1
        worst = int(np.argmax(costs))
        if cost < costs[worst]:
            pool[worst], costs[worst] = child, cost
        if cost < costs[best] or best == worst:
            best = int(np.argmin(costs))
            if costs[best] < history[-1][1]:
                history.append((candidates, float(costs[best])))
    groups = pool[best]
    return SearchResult(
        groups=groups,
        cost=paper_cost(topology, groups, c_pp_gb=c_pp_gb, c_dp_gb=c_dp_gb, hop_NN=hop),
        candidates=candidates,
        search_s=time.perf_counter() - start,
        history=tuple(history),
    )
