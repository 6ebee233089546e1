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
from typing import Literal

import numpy as np

from frugal import ConfigError
from frugal._typing import F64, I64
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
    window_limited,
)
from frugal.planner.topology import Topology

__all__ = [
    "MeshSearchResult",
    "SearchResult",
    "aligned_crossover",
    "check_grid",
    "dtfm_ga",
    "iteration_search",
    "megatron_default_groups",
    "memetic_search",
    "message_seconds",
    "random_search",
    "site_transversal_groups",
    "stop_reason",
    "structured_seeds",
    "swap_search",
]

StopReason = Literal["budget", "time_limit", "converged"]
"""Why a search stopped: its candidate budget was spent, its time limit passed, or it ended
on its own first (nothing left to try)."""


def stop_reason(candidates: int, budget: int, start: float, time_limit_s: float) -> StopReason:
    """Why a search that began at `start` (a `time.perf_counter()` reading) stopped now.

    The budget wins when both are spent (the plan is then reproducible).
    """
    if candidates >= budget:
        return "budget"
    if time.perf_counter() - start >= time_limit_s:
        return "time_limit"
    return "converged"


_PAPER_SEED_MAX_STAGES = 9  # the paper-cost seed solves an open path over the stages exactly


def check_grid(topology: Topology, num_stages: int, num_replicas: int) -> None:
    """Check that num_stages x num_replicas devices are exactly the topology's.

    Raises:
        ConfigError: (a `ValueError`) Naming both numbers and the world size.
    """
    n = topology.num_devices
    if num_stages < 1 or num_replicas < 1 or num_stages * num_replicas != n:
        raise ConfigError(
            f"num_stages*num_replicas = {num_stages}*{num_replicas} = {num_stages * num_replicas} "
            f"but world_size = {n}; choose factors of {n}"
        )


def megatron_default_groups(num_stages: int, num_replicas: int) -> I64:
    """Megatron's default: `mesh[j][i] = i*D_dp + j`, so stage i's DP group is ids i*D_dp..+D_dp-1.

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
    stop: StopReason = "budget"
    """Why the search stopped (`stop_reason`)."""


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

    @property
    def secondary(self) -> float:
        """A tie-breaker for plateaus of the max terms.

        Every DP term and every group pair's bottleneck, summed: it falls when a group that
        is not the critical one improves.
        """
        return float(self.dp.sum() + self.weight.sum() / 2.0)

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

    def try_random_swap(self, rng: np.random.Generator) -> tuple[float, I64, F64, F64, float]:
        """`try_swap` of a swap drawn by `_draw_swap` (state unchanged)."""
        return self.try_swap(*_draw_swap(rng, *self.groups.shape))

    def accept(self, groups: I64, dp: F64, weight: F64, pp: float) -> None:
        self.groups, self.dp, self.weight, self.pp = groups, dp, weight, pp


def _draw_swap(rng: np.random.Generator, g: int, k: int) -> tuple[int, int, int, int]:
    """A random swap (a, x, b, y): member x of group a with member y of group b, a != b.

    Two distinct groups are drawn first, then the two members (the order every search's
    seeded results depend on). Needs g >= 2.
    """
    a, b = rng.choice(g, size=2, replace=False)
    x, y = rng.integers(0, k, size=2)
    return int(a), int(x), int(b), int(y)


def structured_seeds(topology: Topology, num_stages: int, num_replicas: int) -> list[I64]:
    """The structured starting partitions of the paper-cost searches, best-known first.

    Site transversal (pipelines inside sites, DP across them), its transpose when the grid is
    square (else Megatron's default again), and Megatron's default grouping.

    Shapes:
        each (G, K).
    """
    return [
        site_transversal_groups(topology, num_stages, num_replicas),
        np.ascontiguousarray(site_transversal_groups(topology, num_replicas, num_stages).T)
        if num_stages == num_replicas
        else megatron_default_groups(num_stages, num_replicas),
        megatron_default_groups(num_stages, num_replicas),
    ]


def _paper_search_setup(
    topology: Topology, num_stages: int, num_replicas: int, c_pp_gb: float, seed: int
) -> tuple[float, F64, np.random.Generator]:
    """Check the grid; the start time, the (N, N) hop costs and the seeded random source."""
    check_grid(topology, num_stages, num_replicas)
    start = time.perf_counter()
    hop = hop_seconds(topology, c_pp_gb)
    return start, hop, np.random.default_rng(seed)


def _paper_result(
    topology: Topology,
    groups: I64,
    pricing: tuple[float, float, F64],
    start: float,
    candidates: int,
    history: list[tuple[int, float]],
    limits: tuple[int, float],
) -> SearchResult:
    """A paper-cost search's result: `groups` priced by `paper_cost` at (c_pp_gb, c_dp_gb, hop).

    `limits` = (budget, time_limit_s) the search ran under, which say why it stopped.
    """
    c_pp_gb, c_dp_gb, hop = pricing
    cost = paper_cost(topology, groups, c_pp_gb=c_pp_gb, c_dp_gb=c_dp_gb, hop_NN=hop)
    return _search_result(groups, cost, start, candidates, history, limits)


def _search_result(
    groups: I64,
    cost: PaperCost,
    start: float,
    candidates: int,
    history: list[tuple[int, float]],
    limits: tuple[int, float],
) -> SearchResult:
    """A search's result, timed from `start` (a `time.perf_counter()` reading) to now."""
    return SearchResult(
        groups=groups,
        cost=cost,
        candidates=candidates,
        search_s=time.perf_counter() - start,
        history=tuple(history),
        stop=stop_reason(candidates, limits[0], start, limits[1]),
    )


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
    start, hop, rng = _paper_search_setup(topology, num_stages, num_replicas, c_pp_gb, seed)
    seeds = [
        *structured_seeds(topology, num_stages, num_replicas),
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
    g = state.groups.shape[0]
    while candidates < budget and g > 1 and time.perf_counter() - start < time_limit_s:
        total, groups, dp, weight, pp = state.try_random_swap(rng)
        candidates += 1
        if total < state.total - 1e-12:
            state.accept(groups, dp, weight, pp)
            history.append((candidates, total))
    return _paper_result(
        topology, state.groups, (c_pp_gb, c_dp_gb, hop), start, candidates, history,
        (budget, time_limit_s),
    )  # fmt: skip


def _owner(groups: I64) -> I64:
    """owner[d] = the group (row) holding device d."""
    g, k = groups.shape
    owner = np.empty(groups.size, dtype=np.int64)
    owner[groups.ravel()] = np.repeat(np.arange(g), k)
    return owner


def aligned_crossover(p1: I64, p2: I64, rng: np.random.Generator, hop: F64) -> I64:
    """Label-aligned crossover of two partitions: inherit whole groups, then repair greedily.

    Parent 2's groups are relabelled to overlap parent 1's most (a linear sum assignment on
    the G x G overlap counts), so group a of both parents means the same thing. Child group a
    comes from parent 1 or aligned parent 2 (a fair coin per group); groups, visited in random
    order, keep their inherited devices that are still free. Each device left over joins, in
    random order, the under-full group it reaches cheapest (mean hop to its members).

    Args:
        p1: First parent, (G, K) device ids.
        p2: Second parent, same shape.
        rng: Random source (the only one: same state, same child).
        hop: (N, N) pairwise cost used by the repair.

    Returns:
        The child, (G, K); every device exactly once.
    """
    g, k = p1.shape
    coin = rng.random(size=(g, 1)) < 0.5
    source: I64 = np.where(coin, p1, _align_labels(p1, p2))
    taken = np.zeros(p1.size, dtype=bool)
    members: list[list[int]] = [[] for _ in range(g)]
    for a in rng.permutation(g).tolist():
        free = source[a][~taken[source[a]]]
        members[a] = free.tolist()
        taken[free] = True
    for device in rng.permutation(np.flatnonzero(~taken)).tolist():
        open_groups = [a for a in range(g) if len(members[a]) < k]
        cost = [float(hop[device, members[a]].mean()) if members[a] else np.inf
                for a in open_groups]  # fmt: skip
        choice = open_groups[int(np.argmin(cost))] if np.isfinite(min(cost)) else open_groups[0]
        members[choice].append(device)
    child: I64 = np.array(members, dtype=np.int64)
    return child


_MUTATION_RATE = 0.2
"""Share of crossover children that also get random swaps (besides those equal to a member)."""


def _perturb(groups: I64, rng: np.random.Generator, swaps: int) -> None:
    """Swap `swaps` random device pairs between distinct groups, in place."""
    g, k = groups.shape
    if g < 2:
        return
    for _ in range(swaps):
        a, x, b, y = _draw_swap(rng, g, k)
        groups[a, x], groups[b, y] = groups[b, y], groups[a, x]


def _partition_key(groups: I64) -> bytes:
    """The same bytes for partitions that differ only in group order or member order."""
    rows = np.sort(groups, axis=1)
    return rows[np.lexsort(rows.T[::-1])].tobytes()


def _tournament(costs: list[float], rng: np.random.Generator) -> int:
    a, b = rng.choice(len(costs), size=2, replace=False)
    return int(a) if costs[int(a)] <= costs[int(b)] else int(b)


def _pick_parents(costs: list[float], rng: np.random.Generator) -> tuple[int, int]:
    """Two distinct members by binary tournaments (lower cost wins); needs >= 2 members."""
    i = _tournament(costs, rng)
    j = _tournament(costs, rng)
    if i == j:
        j = (i + 1 + int(rng.integers(0, len(costs) - 1))) % len(costs)
    return i, j


def memetic_search(
    topology: Topology,
    num_stages: int,
    num_replicas: int,
    *,
    budget: int = 2000,
    seed: int = 0,
    population: int = 16,
    local_steps: int = 0,
    c_pp_gb: float = PAPER_C_PP_GB,
    c_dp_gb: float = PAPER_C_DP_GB,
    time_limit_s: float = 30.0,
) -> SearchResult:
    """Our search under the paper's cost: structured seeds, then a memetic algorithm.

    The population starts from the structured seeds of `swap_search` (site transversal, its
    transpose, Megatron's default) and seeded random partitions. The best seed is improved
    first by `local_steps` swaps; then, until the budget is spent, two parents chosen by binary
    tournaments give a child by `aligned_crossover`, the child is improved by `local_steps`
    first-improvement swaps (`swap_search`'s move, re-scored incrementally: 2 DP terms,
    2 (G-1) - 1 bottleneck matchings and one exact open path), and it replaces the worst
    member when better and not already present. A child equal to a member, and a fifth of the
    others, first get K/2 random swaps (mutation). Every partition scored, crossover child or
    swap, counts as one candidate, so budgets compare with `swap_search` and `dtfm_ga`.
    Deterministic for a seed and budget (the time limit only cuts it short).

    Args:
        topology: Devices and links (symmetric).
        num_stages: D_pp.
        num_replicas: D_dp.
        budget: Candidates to score at most (seeds included).
        seed: Seed of every random choice.
        population: Members kept, >= 2.
        local_steps: Swaps per local search; 0 = max(10, min(200, budget // 25)).
        c_pp_gb: Activation gigabytes per stage boundary.
        c_dp_gb: Gradient gigabytes per device.
        time_limit_s: Stop after this many seconds even if budget remains.

    Returns:
        The best partition with its cost and convergence history.

    Raises:
        ValueError: If num_stages x num_replicas != number of devices, population < 2, or
            links are asymmetric.

    References:
        Decentralized Training of Foundation Models in Heterogeneous Environments, NeurIPS
        2022, arXiv 2206.01288 (section 3.3: the cost it minimises; its GA is `dtfm_ga`).
        Moscato, On Evolution, Search, Optimization, Genetic Algorithms and Martial Arts
        (Caltech C3P report 826, 1989): memetic algorithms (crossover + local search).
    """
    if population < 2:
        raise ValueError(f"population={population} must be >= 2")
    start, hop, rng = _paper_search_setup(topology, num_stages, num_replicas, c_pp_gb, seed)
    steps = local_steps or max(10, min(200, budget // 25))
    stall = 4 * num_stages * num_replicas  # rejected swaps in a row that end a local search
    n = topology.num_devices
    g, k = num_stages, num_replicas
    starts = structured_seeds(topology, g, k)
    candidates = 0
    history: list[tuple[int, float]] = []
    best_total = np.inf

    def scored(total: float) -> None:
        nonlocal best_total
        if total < best_total - 1e-12:
            best_total = total
            history.append((candidates, total))

    def out_of_time() -> bool:
        return candidates >= budget or time.perf_counter() - start >= time_limit_s

    pool: list[_State] = []
    keys: set[bytes] = set()

    def improve(state: _State, max_steps: int) -> None:
        """First-improvement swaps until `max_steps` or `stall` in a row are rejected."""
        nonlocal candidates
        rejected = 0
        for _ in range(max_steps):
            if g < 2 or rejected >= stall or out_of_time():
                return
            total, groups, dp, weight, pp = state.try_random_swap(rng)
            candidates += 1
            # Lexicographic acceptance: lower cost, or equal cost and a lower tie-breaker
            # (walks the plateaus of the max terms, where strict improvement stalls).
            if total < state.total - 1e-12 or (
                total <= state.total + 1e-12
                and float(dp.sum() + weight.sum() / 2.0) < state.secondary - 1e-12
            ):
                state.accept(groups, dp, weight, pp)
                scored(total)
                rejected = 0
            else:
                rejected += 1

    # Population: the structured seeds, one random partition, and the seeds perturbed by K
    # random swaps each (diverse but good parents; random partitions alone give poor children).
    while len(pool) < population and not (pool and out_of_time()):
        if len(pool) < len(starts):
            groups = np.asarray(starts[len(pool)], dtype=np.int64)
        elif len(pool) == len(starts):
            groups = rng.permutation(n).reshape(g, k)
        else:
            groups = np.array(starts[len(pool) % len(starts)], dtype=np.int64)
            _perturb(groups, rng, k)
        key = _partition_key(groups)
        if key in keys:  # a duplicate seed (e.g. the transpose equals the default)
            groups = rng.permutation(n).reshape(g, k)
            key = _partition_key(groups)
        state = _State(topology, np.asarray(groups, dtype=np.int64), hop, c_dp_gb)
        candidates += 1
        scored(state.total)
        pool.append(state)
        keys.add(key)
    # Intensify first: the best seed's local search runs until it stalls, so the memetic
    # phase starts from the local optimum `swap_search` would reach.
    elite = min(range(len(pool)), key=lambda i: pool[i].total)
    keys.discard(_partition_key(pool[elite].groups))
    improve(pool[elite], budget)
    keys.add(_partition_key(pool[elite].groups))
    while len(pool) >= 2 and not out_of_time():
        costs = [member.total for member in pool]
        i, j = _pick_parents(costs, rng)
        child_groups = aligned_crossover(pool[i].groups, pool[j].groups, rng, hop)
        if _partition_key(child_groups) in keys or rng.random() < _MUTATION_RATE:
            _perturb(child_groups, rng, max(1, k // 2))  # a copy of a member teaches nothing
        child = _State(topology, child_groups, hop, c_dp_gb)
        candidates += 1
        scored(child.total)
        improve(child, steps)
        if child.total <= best_total + 1e-12:  # a new best: intensify it as the seed was
            improve(child, budget)
        key = _partition_key(child.groups)
        worst = int(np.argmax(costs))
        if child.total < costs[worst] and key not in keys:
            keys.discard(_partition_key(pool[worst].groups))
            pool[worst] = child
            keys.add(key)
    best = min(pool, key=lambda member: member.total)
    return _paper_result(topology, best.groups, (c_pp_gb, c_dp_gb, hop), start, candidates,
                         history, (budget, time_limit_s))  # fmt: skip


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
    start, hop, rng = _paper_search_setup(topology, num_stages, num_replicas, c_pp_gb, seed)
    best: PaperCost | None = None
    best_groups = None
    history: list[tuple[int, float]] = []
    candidates = 0
    for candidate in range(1, budget + 1):
        groups = rng.permutation(topology.num_devices).reshape(num_stages, num_replicas)
        cost = paper_cost(topology, groups, c_pp_gb=c_pp_gb, c_dp_gb=c_dp_gb, hop_NN=hop)
        candidates = candidate
        if best is None or cost.total_s < best.total_s:
            best, best_groups = cost, groups
            history.append((candidate, cost.total_s))
        if time.perf_counter() - start >= time_limit_s:
            break
    assert best is not None
    assert best_groups is not None
    return _search_result(best_groups, best, start, candidates, history, (budget, time_limit_s))


@dataclass(frozen=True, slots=True)
class MeshSearchResult:
    """The best mesh found under the iteration objective."""

    mesh: I64
    """(J, I) device of pipeline j at stage i."""
    cost: IterationCost
    candidates: int
    search_s: float
    history: tuple[tuple[int, float], ...]
    stop: StopReason = "budget"
    """Why the search stopped (`stop_reason`)."""


def _wire(groups_GK: I64, hop_NN: F64) -> I64:
    """Pipelines through stage groups in order: chained bottleneck matchings (exact per pair).

    Stage 0's devices start the pipelines in group order; each next stage is matched to the
    previous one by `bottleneck_matching` on `hop_NN`.

    Shapes:
        groups_GK: (G stages, K replicas); returns the mesh (K, G).
    """
    g, k = groups_GK.shape
    mesh = np.empty((k, g), dtype=np.int64)
    mesh[:, 0] = groups_GK[0]
    for i in range(1, g):
        _, perm = bottleneck_matching(hop_NN[mesh[:, i - 1][:, None], groups_GK[i][None, :]])
        mesh[:, i] = groups_GK[i][perm]
    return mesh


def message_seconds(topology: Topology, workload: WorkloadConfig) -> F64:
    """Seconds of one activation message between every pair, the larger of both directions.

    A message costs delay + bytes / bandwidth (the workload codec's wire bytes; cross-host
    bandwidths limited by the workload's TCP window).

    Shapes:
        returns (N, N); the diagonal is 0.
    """
    topology = window_limited(topology, workload.tcp_window_bytes)
    bits = workload.activation_bytes * 8.0
    with np.errstate(divide="ignore"):
        one_way = topology.delay_ms / 1000.0 + bits / (topology.bandwidth_gbps * 1e9)
    both: F64 = np.maximum(one_way, one_way.T)
    np.fill_diagonal(both, 0.0)
    return both


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
    population: int = 8,
) -> MeshSearchResult:
    """Our search under the iteration objective: structured seeds, then a memetic search.

    Seeds: pipelines inside sites with DP across them (site transversal), Megatron's default,
    the paper-cost seed's mesh, and a random mesh. The best seed is improved by swapping two
    devices of the mesh (first improvement, seeded draws) until `4 N` swaps in a row fail;
    then, while budget remains, two parents chosen by binary tournaments give a child: their
    stage groups are crossed by `aligned_crossover` (labels = stages), the pipelines are wired
    by chained exact bottleneck matchings on message seconds (`_wire`), and the child is
    improved by swaps and replaces the worst member when better. Stage groups' collectives are
    memoised by member set, so a swap re-prices at most two collectives (incremental
    re-scoring). With `population` = 1 it is the plain swap search (the whole budget on the
    best seed's swaps; the baseline the memetic search is compared with). Micro-batches are
    shared in proportion to pipeline speed unless `balance_microbatches` is False. Meshes that
    do not fit device memory (`stage_memory_gib`) are never kept. Deterministic for a seed and
    budget (the time limit only cuts it short).

    Raises:
        ValueError: If num_stages x num_replicas != number of devices or population < 1.
    """
    check_grid(topology, num_stages, num_replicas)
    if population < 1:
        raise ValueError(f"population={population} must be >= 1")
    start = time.perf_counter()
    balance = balance_microbatches
    rng = np.random.default_rng(seed)
    cache: dict[tuple[bytes, float], tuple[str, float]] = {}
    seeds: list[I64] = [
        np.ascontiguousarray(site_transversal_groups(topology, num_stages, num_replicas).T),
        np.ascontiguousarray(megatron_default_groups(num_stages, num_replicas).T),
        rng.permutation(topology.num_devices).reshape(num_replicas, num_stages),
    ]
    if topology.is_symmetric() and num_stages <= _PAPER_SEED_MAX_STAGES:
        paper = swap_search(topology, num_stages, num_replicas, budget=1, seed=seed)
        seeds.append(np.array(paper.cost.mesh, dtype=np.int64))
    candidates = 0
    history: list[tuple[int, float]] = []
    need = np.array([stage_memory_gib(workload, layer, i, num_stages)
                     for i, layer in enumerate(layers_per_stage)])  # fmt: skip
    memory = np.array([d.memory_gib for d in topology.devices])
    n = topology.num_devices
    best_s = np.inf

    def fits(mesh: I64) -> bool:
        return bool((memory[mesh] >= need[None, :]).all())

    def score(mesh: I64) -> IterationCost:
        nonlocal candidates, best_s
        cost = iteration_cost(topology, mesh, layers_per_stage, workload,
                              balance_microbatches=balance, collective_cache=cache)  # fmt: skip
        candidates += 1
        if cost.total_s < best_s - 1e-12 and fits(mesh):
            best_s = cost.total_s
            history.append((candidates, cost.total_s))
        return cost

    def out_of_time() -> bool:
        return candidates >= budget or time.perf_counter() - start >= time_limit_s

    pool: list[tuple[I64, IterationCost]] = []
    for mesh in seeds:
        cost = score(mesh)
        if fits(mesh):
            pool.append((mesh, cost))
    if not pool:  # no seed fits: place the largest stages on the largest devices
        by_memory = np.argsort(-memory, kind="stable")
        stage_rank = np.argsort(-need, kind="stable")
        mesh = np.empty((num_replicas, num_stages), dtype=np.int64)
        for position, stage in enumerate(stage_rank):
            mesh[:, stage] = by_memory[position * num_replicas : (position + 1) * num_replicas]
        cost = score(mesh)
        if not history:
            history.append((candidates, cost.total_s))
        pool.append((mesh, cost))
    pool.sort(key=lambda member: member[1].total_s)
    pool = pool[: max(population, 1)]
    stall = 4 * n if population > 1 else budget

    def improve(mesh: I64, cost: IterationCost, max_steps: int) -> tuple[I64, IterationCost]:
        rejected = 0
        for _ in range(max_steps):
            if n < 2 or rejected >= stall or out_of_time():
                break
            a, b = rng.choice(n, size=2, replace=False)
            trial = mesh.copy()
            flat = trial.reshape(-1)
            flat[a], flat[b] = flat[b], flat[a]
            trial_cost = score(trial)
            better = trial_cost.total_s < cost.total_s - 1e-12 or (
                population > 1  # lexicographic: equal cost, lower tie-breaker (plateaus)
                and trial_cost.total_s <= cost.total_s + 1e-12
                and trial_cost.tiebreak_s < cost.tiebreak_s - 1e-12
            )
            if better and fits(trial):
                mesh, cost, rejected = trial, trial_cost, 0
            else:
                rejected += 1
        return mesh, cost

    pool[0] = improve(pool[0][0], pool[0][1], budget)
    if population > 1 and n >= 2:  # one device: nothing to swap, the seed is the plan
        hop = message_seconds(topology, workload)
        steps = max(10, min(200, budget // 25))
        bases = len(pool)
        while len(pool) < population and not out_of_time():  # perturbed copies of the seeds
            trial = pool[len(pool) % bases][0].copy().reshape(-1)
            for _ in range(num_replicas):
                a, b = rng.choice(n, size=2, replace=False)
                trial[a], trial[b] = trial[b], trial[a]
            trial_mesh = trial.reshape(num_replicas, num_stages)
            cost = score(trial_mesh)
            if fits(trial_mesh):
                pool.append((trial_mesh, cost))
        while len(pool) >= 2 and not out_of_time():
            costs = [member[1].total_s for member in pool]
            i, j = _pick_parents(costs, rng)
            groups = aligned_crossover(np.ascontiguousarray(pool[i][0].T),
                                       np.ascontiguousarray(pool[j][0].T), rng, hop)  # fmt: skip
            if rng.random() < _MUTATION_RATE:
                _perturb(groups, rng, max(1, num_replicas // 2))
            child = _wire(groups, hop)
            if any(np.array_equal(child, member[0]) for member in pool):
                _perturb(groups, rng, max(1, num_replicas // 2))  # a copy teaches nothing
                child = _wire(groups, hop)
            child_cost = score(child)
            if not fits(child):
                continue
            child, child_cost = improve(child, child_cost, steps)
            if child_cost.total_s <= best_s + 1e-12:  # a new best: intensify it
                child, child_cost = improve(child, child_cost, budget)
            worst = int(np.argmax(costs))
            duplicate = any(np.array_equal(child, member[0]) for member in pool)
            if child_cost.total_s < costs[worst] and not duplicate:
                pool[worst] = (child, child_cost)
    best_mesh, best = min(pool, key=lambda member: member[1].total_s)
    return MeshSearchResult(
        mesh=best_mesh,
        cost=best,
        candidates=candidates,
        search_s=time.perf_counter() - start,
        history=tuple(history),
        stop=stop_reason(candidates, budget, start, time_limit_s),
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
    time_limit_s: float = float("inf"),
) -> SearchResult:
    """A variant of the DT-FM paper's genetic algorithm (baseline; the release is `dtfm`).

    `population` random partitions, then offspring from two uniformly chosen parents by the
    "5-point" crossover, each refined by one Kernighan-Lin pass (`kl_pass`, see `_kl_pass`),
    until `budget` candidates are scored or `time_limit_s` passes; an offspring replaces the
    worst member when it is better. It departs from the release
    (`frugal.planner.dtfm.dtfm_scheduler`, planner method `dtfm`): label-aligned crossover,
    worst-member replacement, and a KL pass of pair swaps (2-cycles) with its own gain
    instead of the release's cyclic moves and gain; on the paper's scenarios it ends above
    the release's cost (benchmarks/planner/RESULTS.md).

    Raises:
        ValueError: If num_stages x num_replicas != number of devices.
    """
    start, hop, rng = _paper_search_setup(topology, num_stages, num_replicas, c_pp_gb, seed)

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
    while candidates < budget and time.perf_counter() - start < time_limit_s:
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
    return _paper_result(topology, pool[best], (c_pp_gb, c_dp_gb, hop), start, candidates,
                         history, (budget, time_limit_s))  # fmt: skip
