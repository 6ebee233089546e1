"""The DT-FM scheduler as released: a genetic algorithm with cyclic Kernighan-Lin refinement.

A partition assigns each of N devices a group label (a stage's data-parallel group), G groups
of K devices. The released scheduler (`scheduler/heuristic_evolutionary_solver/scheduler.py`,
function `GCMA`, in DS3Lab/DT-FM) keeps `population` random partitions, then, per offspring:
draws two parents uniformly, crosses them with a "5-point" crossover (five random devices take
their parent-1 label inside parent 2; over-full groups give their lowest-id devices to the
first under-full groups), refines the child by one pass of cyclic partitioning (Kernighan-Lin
with cyclic moves among the G groups, `cyclic_kl_pass`), scores it exactly (the paper's cost:
the worst data-parallel group + 2 x the cheapest open path over the groups, edge weight the
bottleneck matching between two groups) and replaces the worse parent when it is at least as
good. There is no mutation. This module is our implementation of that algorithm (not a copy),
with numpy-vectorised gains and a seeded `numpy.random.Generator`.

Departures from the released code, each named by an argument:

- Seeding: the release assigns `random.seed = i` instead of calling it, so it is unseeded;
  here one seeded Generator draws everything (always).
- `use_released_defects=True` keeps two defects of the release: the replacement test
  `offspring > max(parent1, offspring > parent2)` compares with parent 1 only, and the
  Kernighan-Lin pass's choice of how many cycles to keep never considers the last cycle
  (with a single cycle the pass changes nothing). False (default) compares with the better
  parent and considers every prefix of cycles.
- `fitness`: the release minimises the paper's cost; a caller may score each partition's
  plan by another model (frugal's iteration model) with the same search.

Shape legend: N devices, G groups (D_pp stages), K devices per group (D_dp replicas).

References:
    Decentralized Training of Foundation Models in Heterogeneous Environments, NeurIPS 2022,
    arXiv 2206.01288 (section 3.3 and appendix: the cost, the genetic algorithm and the
    cyclic local search); released code DS3Lab/DT-FM, scheduler/heuristic_evolutionary_solver.
    Kim and Moon, A hybrid genetic search for multi-way graph partitioning based on direct
    partitioning, GECCO 2001: the cyclic partitioning local search the release adapts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from frugal._typing import F64, I64, Bool
from frugal.planner.cost import PAPER_C_DP_GB, PAPER_C_PP_GB, PaperCost, paper_cost
from frugal.planner.search import SearchResult, _paper_search_setup, stop_reason
from frugal.planner.topology import Topology

__all__ = ["KLMove", "cyclic_kl_pass", "dtfm_crossover", "dtfm_scheduler"]

_CROSSOVER_POINTS = 5
"""Devices that take their parent-1 label (the release's "5-point" crossover)."""


def _groups(labels_N: I64, num_groups: int) -> I64:
    """Labels to groups: row a lists group a's devices in increasing id (as the release)."""
    order = np.argsort(labels_N, kind="stable")
    groups: I64 = order.reshape(num_groups, -1).astype(np.int64)
    return groups


def _labels(groups_GK: I64) -> I64:
    """Groups to labels: labels[d] = the row holding device d."""
    g, k = groups_GK.shape
    labels = np.empty(groups_GK.size, dtype=np.int64)
    labels[groups_GK.ravel()] = np.repeat(np.arange(g), k)
    return labels


def dtfm_crossover(
    labels1_N: I64, labels2_N: I64, num_groups: int, rng: np.random.Generator
) -> I64:
    """The release's "5-point" crossover of two labelings (labels not aligned, as released).

    Five random devices take their parent-1 label in a copy of parent 2; then, scanning
    devices in id order, a device whose group holds more than K takes the first group (lowest
    label) that holds fewer.

    Args:
        labels1_N: Parent 1's group of each device.
        labels2_N: Parent 2's.
        num_groups: G; every group holds N / G devices in both parents.
        rng: The random source.

    Returns:
        The child's labels; every group again holds N / G devices.
    """
    n = labels1_N.size
    k = n // num_groups
    child = labels2_N.copy()
    points = rng.permutation(n)[:_CROSSOVER_POINTS]
    child[points] = labels1_N[points]
    sizes = np.bincount(child, minlength=num_groups)
    for device in range(n):
        if sizes[child[device]] > k:
            target = int(np.flatnonzero(sizes < k)[0])
            sizes[target] += 1
            sizes[child[device]] -= 1
            child[device] = target
    return child


@dataclass(frozen=True, slots=True)
class _Gains:
    """The release's gains for one state: per group its chosen device and best move."""

    device: I64
    """(G,) the unlocked device each group would move (-1: none)."""
    target: I64
    """(G,) the group that device gains most by joining (-1: none)."""
    best: F64
    """(G,) that gain (-inf: none), the release's G_i."""
    to: F64
    """(G, G) gain of moving group a's device to group b (-inf on the diagonal), G_ij."""


def _gains(labels_N: I64, locked_N: Bool, hop_NN: F64, num_groups: int) -> _Gains:
    """The release's default gain (`calculate_gain_default`), vectorised.

    For an unlocked device v at home in group A: home[v] = its cheapest hop to another member
    of A, and to[v, B] = its mean hop to B's members (all of them, locked or not). Each group
    offers its unlocked device with the smallest home (the least attached; the first on ties);
    moving it to B gains to[v, B] - home[v], and the group's best move is the largest (first B
    on ties).
    """
    n, g = labels_N.size, num_groups
    onehot = np.zeros((n, g))
    onehot[np.arange(n), labels_N] = 1.0
    sizes = onehot.sum(axis=0)
    summed = hop_NN @ onehot
    mean_to = np.divide(summed, sizes, out=np.zeros_like(summed), where=sizes > 0)
    same = labels_N[:, None] == labels_N[None, :]
    np.fill_diagonal(same, False)
    home = np.where(same, hop_NN, np.inf).min(axis=1)
    eligible = ~locked_N & np.isfinite(home)
    device = np.full(g, -1, dtype=np.int64)
    target = np.full(g, -1, dtype=np.int64)
    best = np.full(g, -np.inf)
    to = np.full((g, g), -np.inf)
    for a in range(g):
        members = np.flatnonzero(eligible & (labels_N == a))
        if members.size == 0:
            continue
        v = int(members[np.argmin(home[members])])
        row = mean_to[v] - home[v]
        row[a] = -np.inf
        device[a], to[a] = v, row
        if g > 1:
            target[a] = int(np.argmax(row))
            best[a] = float(row[target[a]])
    return _Gains(device=device, target=target, best=best, to=to)


@dataclass(frozen=True, slots=True)
class KLMove:
    """One cycle kept by `cyclic_kl_pass`: device moves in order, and the cycle's gain."""

    moves: tuple[tuple[int, int, int], ...]
    """(device, from group, to group) per move; the last move returns to the first group."""
    gain: float
    """The summed heuristic gain of the cycle (the release's epsilon prefix + tau)."""


def cyclic_kl_pass(
    labels_N: I64,
    hop_NN: F64,
    num_groups: int,
    *,
    use_released_defects: bool = False,
) -> tuple[I64, tuple[KLMove, ...]]:
    """One pass of cyclic partitioning (Kernighan-Lin with cyclic moves), as released.

    Up to G cycles. A cycle starts at the group S0 whose best move gains most, moves that
    group's chosen device to its best target S1, locks the device (and marks S1), recomputes
    the gains, moves S1's chosen device on, and so on until a move lands in S0 again (at most
    N moves; a group with no unlocked device sends the previous mover back to S0). The cycle
    is then cut at the prefix l >= 1 that maximises sum(gain of moves 0..l-1) + gain of moving
    device l to S0 directly: moves after l are undone and device l goes to S0, so every group
    keeps its size; with no positive prefix the cycle changes nothing. Cycles stop when every
    group was a target. The pass keeps the prefix of cycles with the largest positive summed
    gain. Locked devices stay locked for the whole pass.

    Args:
        labels_N: Group of each device (N / G per group).
        hop_NN: Pipeline hop seconds between devices (the gain's cost; DP is ignored, as in
            the release's default gain).
        num_groups: G.
        use_released_defects: Keep the release's choice of cycles, which never considers the
            last cycle.

    Returns:
        The refined labels and the cycles kept.
    """
    g, n = num_groups, labels_N.size
    if g < 2:
        return labels_N.copy(), ()
    locked = np.zeros(n, dtype=bool)
    targeted = np.zeros(g, dtype=bool)
    states = [labels_N.copy()]
    cycle_gains = [0.0]
    cycles: list[KLMove] = []
    for _ in range(g):
        current = states[-1].copy()
        gains = _gains(current, locked, hop_NN, g)
        start = int(np.argmax(gains.best))
        if not np.isfinite(gains.best[start]):
            break  # no unlocked device anywhere (the release would index an empty list)
        moves: list[tuple[int, int, int]] = []
        epsilon: list[float] = []
        tau: list[float] = []
        here = start
        for _ in range(n):
            v, to = int(gains.device[here]), int(gains.target[here])
            if v < 0:  # nothing left to move here: the previous mover closes the cycle
                v, to = moves[-1][0], start
            current[v] = to
            locked[v] = True
            targeted[to] = True
            moves.append((v, here, to))
            epsilon.append(float(gains.best[here]))
            tau.append(float(gains.to[here, start]))
            here = to
            if here == start:
                break
            gains = _gains(current, locked, hop_NN, g)
        best_sum, cut = 0.0, 0
        for i in range(1, len(epsilon)):
            value = float(np.sum(epsilon[:i])) + tau[i]
            if value > best_sum:
                best_sum, cut = value, i
        for i in range(len(epsilon) - 1, cut, -1):
            current[moves[i][0]] = moves[i][1]
        current[moves[cut][0]] = start
        states.append(current)
        cycle_gains.append(best_sum)
        if cut > 0:
            kept = (*moves[:cut], (moves[cut][0], moves[cut][1], start))
            cycles.append(KLMove(moves=kept, gain=best_sum))
        else:
            cycles.append(KLMove(moves=(), gain=0.0))
        if targeted.all():
            break
    # The prefix of cycles with the largest positive summed gain; the release's loop
    # (range(1, len)) never reaches the prefix of all cycles.
    last = len(cycle_gains) - 1 if use_released_defects else len(cycle_gains)
    best_total, keep = 0.0, 0
    for i in range(1, last + 1):
        total = float(np.sum(cycle_gains[:i]))
        if total > best_total:
            best_total, keep = total, i - 1
    return states[keep], tuple(c for c in cycles[:keep] if c.moves)


def dtfm_scheduler(
    topology: Topology,
    num_stages: int,
    num_replicas: int,
    *,
    budget: int = 5000,
    population: int = 100,
    seed: int = 0,
    c_pp_gb: float = PAPER_C_PP_GB,
    c_dp_gb: float = PAPER_C_DP_GB,
    time_limit_s: float = float("inf"),
    use_released_defects: bool = False,
    fitness: Callable[[PaperCost], float] | None = None,
) -> SearchResult:
    """The DT-FM scheduler: its genetic algorithm with one cyclic Kernighan-Lin pass per child.

    `population` random partitions (each a scored candidate), then offspring until `budget`
    candidates are scored or `time_limit_s` passes: two parents drawn uniformly (possibly the
    same), `dtfm_crossover`, `cyclic_kl_pass`, an exact score. The child replaces the worse
    parent unless it is worse than both (with `use_released_defects`: worse than parent 1);
    the best partition ever scored is returned.

    Args:
        topology: Devices and links (a `frugal.planner.Topology`; symmetric links).
        num_stages: D_pp (G).
        num_replicas: D_dp (K).
        budget: Candidates to score at most (the release: 100 + 4,900), >= 1.
        population: Random partitions the search starts from (the release: 100), >= 1.
        seed: Seed of every random choice.
        c_pp_gb: Activation gigabytes per stage boundary (the hops of cost and gain).
        c_dp_gb: Gradient gigabytes per device.
        time_limit_s: Stop after this many seconds even if budget remains.
        use_released_defects: Keep the release's replacement test and cycle choice (see the
            module docstring).
        fitness: The value minimised, from a partition's paper cost (which carries its
            mesh); None = the paper's cost in seconds, as released.

    Returns:
        The best partition; `history` and `cost` follow `fitness` and the paper cost.

    Raises:
        ValueError: If num_stages x num_replicas != number of devices, budget or population
            < 1, or links are asymmetric.

    References:
        Decentralized Training of Foundation Models in Heterogeneous Environments, NeurIPS
        2022, arXiv 2206.01288 (section 3.3); DS3Lab/DT-FM `GCMA`.
    """
    if budget < 1 or population < 1:
        raise ValueError(f"budget={budget} and population={population} must be >= 1")
    start, hop, rng = _paper_search_setup(topology, num_stages, num_replicas, c_pp_gb, seed)
    g, n = num_stages, topology.num_devices
    value: Callable[[PaperCost], float] = fitness or (lambda cost: cost.total_s)

    def score(labels: I64) -> tuple[float, PaperCost]:
        cost = paper_cost(
            topology, _groups(labels, g), c_pp_gb=c_pp_gb, c_dp_gb=c_dp_gb, hop_NN=hop
        )
        return value(cost), cost

    def out_of_time() -> bool:
        return candidates >= budget or time.perf_counter() - start >= time_limit_s

    pool: list[I64] = []
    costs: list[float] = []
    best: tuple[float, I64] | None = None
    history: list[tuple[int, float]] = []
    candidates = 0

    def record(labels: I64, total: float) -> None:
        nonlocal best
        if best is None or total < best[0]:
            best = (total, labels)
            history.append((candidates, total))

    while len(pool) < population and not (pool and out_of_time()):
        labels = _labels(rng.permutation(n).reshape(g, num_replicas))
        total, _ = score(labels)
        candidates += 1
        pool.append(labels)
        costs.append(total)
        record(labels, total)
    while not out_of_time():
        i, j = (int(x) for x in rng.integers(0, len(pool), size=2))
        child = dtfm_crossover(pool[i], pool[j], g, rng)
        child, _ = cyclic_kl_pass(child, hop, g, use_released_defects=use_released_defects)
        total, _ = score(child)
        candidates += 1
        record(child, total)
        worse_than = costs[i] if use_released_defects else max(costs[i], costs[j])
        if total <= worse_than:
            replaced = i if costs[i] > costs[j] else j
            pool[replaced], costs[replaced] = child, total
    assert best is not None
    _, final = score(best[1])
    return SearchResult(
        groups=_groups(best[1], g),
        cost=final,
        candidates=candidates,
        search_s=time.perf_counter() - start,
        history=tuple(history),
        stop=stop_reason(candidates, budget, start, time_limit_s),
    )
