"""Planner search methods by name: a registry instead of an if-chain in `build_plan`.

A search method takes a `SearchRequest` (the cluster, the grid, the cost model, the budget)
and returns the placement it found (`SearchOutcome`). `build_plan` looks the configured
`PlannerConfig.method` up in `METHODS`, then balances layers, checks memory and prices the
placement the same way for every method, so methods are compared on equal terms. A user
adds one with `register_method` (see docs/extend/planner-method.md).

References:
    Decentralized Training of Foundation Models in Heterogeneous Environments (Yuan et al.,
    NeurIPS 2022, arXiv 2206.01288): the `dtfm` scheduler (as released), its `dtfm_ga`
    variant and the paper cost.
    Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM
    (Narayanan et al., SC 2021, arXiv 2104.04473): Megatron's default rank order.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from frugal._typing import I64
from frugal.planner.iteration import WorkloadConfig, iteration_cost
from frugal.planner.topology import Topology
from frugal.registry import Registry

__all__ = [
    "METHODS",
    "SearchMethod",
    "SearchOutcome",
    "SearchRequest",
    "method_names",
    "register_method",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchRequest:
    """What a search method is asked to place.

    Attributes:
        topology: Devices and links.
        num_stages: D_pp (I).
        num_replicas: D_dp (J); num_stages x num_replicas = topology.num_devices.
        layers_per_stage: The even split of the workload's layers (sum = num_layers).
        objective: The cost model the plan will be priced with, "iteration" or "paper".
        workload: The training job the iteration objective prices.
        budget: Candidate placements to score at most, >= 1.
        seed: Seed of every random choice.
        time_limit_s: Wall-clock limit of the search, > 0.
    """

    topology: Topology
    num_stages: int
    num_replicas: int
    layers_per_stage: tuple[int, ...]
    objective: str
    workload: WorkloadConfig
    budget: int
    seed: int
    time_limit_s: float


@dataclass(frozen=True, slots=True)
class SearchOutcome:
    """A placement: `mesh[j][i]` = device of stage i of pipeline j, shape (J, I)."""

    mesh: I64
    stage_order: tuple[int, ...] | None = None
    """Group id along the pipeline path per stage (paper-cost searches); None = 0..I-1."""
    num_candidates: int = 0
    """Placements the search scored; 0 = none or not reported."""
    stop_reason: str = ""
    """Why the search stopped: "budget", "time_limit", "converged" (it ended on its own
    first), "none" (no search: a fixed placement), or "" (not reported)."""


@dataclass(frozen=True, slots=True)
class SearchMethod:
    """One registered search method.

    Attributes:
        search: Finds a placement for a request.
        balance_microbatches: Whether the iteration objective prices its plan with
            micro-batches shared in proportion to pipeline speed (the method's placements
            are built for it).
        description: One line for the docs and `--help`.
    """

    search: Callable[[SearchRequest], SearchOutcome]
    balance_microbatches: bool = False
    description: str = ""


METHODS: Registry[SearchMethod] = Registry("planner search method", field="method")
"""Every search `PlannerConfig.method` may name."""


def register_method(
    name: str,
    search: Callable[[SearchRequest], SearchOutcome],
    *,
    balance_microbatches: bool = False,
    description: str = "",
    replace: bool = False,
) -> None:
    """Make `name` a valid `PlannerConfig.method` (and `--set method=NAME`).

    Raises:
        ValueError: If `name` is taken and `replace` is False.
    """
    METHODS.register(name, SearchMethod(search, balance_microbatches, description), replace=replace)


def method_names() -> tuple[str, ...]:
    """The registered methods' names, built-in ones first."""
    return METHODS.names()


def _paper_search(request: SearchRequest, search: Callable[..., object]) -> SearchOutcome:
    """Run a paper-cost search (`frugal.planner.search`) and keep its mesh and path order."""
    r = request
    result = search(
        r.topology, r.num_stages, r.num_replicas,
        budget=r.budget, seed=r.seed, time_limit_s=r.time_limit_s,
    )  # fmt: skip
    cost = result.cost  # type: ignore[attr-defined]
    return SearchOutcome(
        np.array(cost.mesh, dtype=np.int64), tuple(cost.stage_order),
        num_candidates=result.candidates,  # type: ignore[attr-defined]
        stop_reason=result.stop,  # type: ignore[attr-defined]
    )  # fmt: skip


def _megatron(request: SearchRequest, *, shuffle: bool) -> SearchOutcome:
    from frugal.planner.search import megatron_default_groups

    n = request.topology.num_devices
    ranks = np.arange(n, dtype=np.int64)
    if shuffle:  # rank 0 stays, the rest are shuffled
        ranks[1:] = np.random.default_rng(request.seed).permutation(np.arange(1, n))
    groups = megatron_default_groups(request.num_stages, request.num_replicas)
    return SearchOutcome(ranks[np.ascontiguousarray(groups.T)], stop_reason="none")


def _dtfm_ga(request: SearchRequest) -> SearchOutcome:
    from frugal.planner.search import dtfm_ga

    r = request
    # Budget only, as in every earlier release: its bench rows score exactly `budget` candidates.
    result = dtfm_ga(r.topology, r.num_stages, r.num_replicas, budget=r.budget, seed=r.seed)
    return SearchOutcome(
        np.array(result.cost.mesh, dtype=np.int64), result.cost.stage_order,
        num_candidates=result.candidates, stop_reason=result.stop,
    )  # fmt: skip


def _dtfm(request: SearchRequest) -> SearchOutcome:
    """The DT-FM scheduler as released; under the iteration objective it minimises that."""
    from frugal.planner.cost import PaperCost
    from frugal.planner.dtfm import dtfm_scheduler

    r = request
    cache: dict[tuple[bytes, float], tuple[str, float]] = {}  # collectives by member set

    def iteration_s(cost: PaperCost) -> float:  # priced as `build_plan` will price the plan
        mesh = np.array(cost.mesh, dtype=np.int64)
        return iteration_cost(
            r.topology, mesh, r.layers_per_stage, r.workload, balance_microbatches=True,
            collective_cache=cache,
        ).total_s  # fmt: skip

    result = dtfm_scheduler(
        r.topology, r.num_stages, r.num_replicas, budget=r.budget, seed=r.seed,
        time_limit_s=r.time_limit_s, fitness=iteration_s if r.objective == "iteration" else None,
    )  # fmt: skip
    return SearchOutcome(
        np.array(result.cost.mesh, dtype=np.int64), result.cost.stage_order,
        num_candidates=result.candidates, stop_reason=result.stop,
    )  # fmt: skip


def _memetic(request: SearchRequest, *, population: int) -> SearchOutcome:
    from frugal.planner.search import iteration_search, memetic_search, swap_search

    r = request
    if r.objective == "paper":
        return _paper_search(r, memetic_search if population > 1 else swap_search)
    found = iteration_search(
        r.topology, r.num_stages, r.num_replicas, r.layers_per_stage, r.workload,
        budget=r.budget, seed=r.seed, time_limit_s=r.time_limit_s, population=population,
    )  # fmt: skip
    return SearchOutcome(found.mesh, num_candidates=found.candidates, stop_reason=found.stop)


def _random(request: SearchRequest) -> SearchOutcome:
    from frugal.planner.search import random_search, stop_reason

    r = request
    if r.objective == "paper":
        return _paper_search(r, random_search)
    n = r.topology.num_devices
    rng = np.random.default_rng(r.seed)
    start = time.perf_counter()
    mesh, best_s = rng.permutation(n).reshape(r.num_replicas, r.num_stages), float("inf")
    scored = 0
    for _ in range(r.budget):
        candidate = rng.permutation(n).reshape(r.num_replicas, r.num_stages)
        cost_s = iteration_cost(r.topology, candidate, r.layers_per_stage, r.workload).total_s
        scored += 1
        if cost_s < best_s:
            mesh, best_s = candidate, cost_s
        if time.perf_counter() - start >= r.time_limit_s:
            break
    stop = stop_reason(scored, r.budget, start, r.time_limit_s)
    return SearchOutcome(mesh, num_candidates=scored, stop_reason=stop)


register_method(
    "ours",
    lambda r: _memetic(r, population=8),
    balance_microbatches=True,
    description="structured seeds, then a memetic search (aligned crossover + swaps)",
)
register_method(
    "swap",
    lambda r: _memetic(r, population=1),
    balance_microbatches=True,
    description="the seeds' swap local search alone (the memetic search's component)",
)
register_method(
    "megatron_default",
    lambda r: _megatron(r, shuffle=False),
    description="Megatron's default order: stage i's DP group is ranks i*D_dp..+D_dp-1",
)
register_method(
    "megatron_random",
    lambda r: _megatron(r, shuffle=True),
    description="Megatron's order on a seeded random rank permutation",
)
register_method("random", _random, description="the best of `budget` random placements")
register_method(
    "dtfm_ga",
    _dtfm_ga,
    description="the DT-FM paper's genetic algorithm with pair-swap Kernighan-Lin and fixed "
    "crossover (searches under the paper cost)",
)
register_method(
    "dtfm",
    _dtfm,
    balance_microbatches=True,
    description="the DT-FM scheduler as released: genetic algorithm + cyclic Kernighan-Lin "
    "(minimises the plan's objective)",
)
