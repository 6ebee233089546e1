"""`build_plan`, the planner's one entry point: search a placement and return a `Plan`.

The `Plan` itself (placement, layers, codec, schedule, micro-batches, DP collectives) lives in
`frugal.parallel.plan`, where the pipeline reads it without importing the planner; it is
re-exported here.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Literal

from frugal import FrugalError
from frugal._typing import I64
from frugal.config import ConfigError, check_types
from frugal.parallel.codec import CodecSpec
from frugal.parallel.partition import partition_layers, split_layers
from frugal.parallel.plan import PLAN_FORMAT_VERSION, Plan
from frugal.planner.iteration import AUTO, DEFAULT_CODEC_CANDIDATES, WorkloadConfig
from frugal.planner.topology import Topology

__all__ = [
    "PLAN_FORMAT_VERSION",
    "InfeasiblePlanError",
    "Plan",
    "PlannerConfig",
    "PlannerError",
    "build_plan",
    "check_memory",
    "price_mesh",
]


class PlannerError(FrugalError):
    """The planner cannot place the job on the cluster."""


class InfeasiblePlanError(PlannerError):
    """No placement fits: `constraint` names the rule ("memory", "connectivity")."""

    def __init__(self, message: str, *, constraint: str) -> None:
        super().__init__(message)
        self.constraint = constraint


@dataclass(frozen=True, kw_only=True, slots=True)
class PlannerConfig:
    """What to plan and how hard to search."""

    num_stages: int = 0
    """D_pp, pipeline stages, >= 1; 0 = choose (with num_replicas = 0: try every factor pair)."""
    num_replicas: int = 0
    """D_dp, data-parallel replicas; num_stages x num_replicas must equal the device count;
    0 = derive from num_stages (or choose)."""
    objective: Literal["iteration", "paper"] = "iteration"
    """Cost model: seconds per iteration (compute, pipeline, overlapped DP; analytic), or the
    DT-FM paper's communication cost."""
    method: str = "ours"
    """Search method, a name in `frugal.planner.methods.METHODS` (or one added by
    `register_method`). Built in: ours (structured seeds, then a memetic search: aligned
    crossover + swaps), swap (the seeds' swap local search alone, the memetic search's
    component), megatron_default (Megatron's order), megatron_random (Megatron's order on a
    seeded random rank permutation), random (the best of `budget` random placements), dtfm
    (the DT-FM scheduler as released: genetic algorithm + cyclic Kernighan-Lin, minimising
    the objective; symmetric links), or dtfm_ga (its variant with pair-swap Kernighan-Lin and
    label-aligned crossover: it searches under the paper's cost whatever the objective, which
    then prices its plan; symmetric links)."""
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    """The training job the iteration objective prices."""
    budget: int = 2000
    """Candidate placements scored at most, >= 1."""
    time_limit_s: float = 30.0
    """Wall-clock limit of the search, > 0; a search it stops is not reproducible (the plan's
    `stop_reason` says "time_limit")."""
    seed: int = 0
    """Seed of every random choice; same inputs and seed give the same plan bytes."""

    def __post_init__(self) -> None:
        check_types(self)
        from frugal.planner.methods import METHODS

        METHODS.check(self.method)
        if self.num_stages < 0 or self.num_replicas < 0:
            raise ValueError(
                f"num_stages={self.num_stages}, num_replicas={self.num_replicas} must be >= 1, "
                "or 0 to let the planner choose"
            )
        layers = self.workload.num_layers
        if layers < self.num_stages:
            raise ValueError(
                f"num_stages={self.num_stages} but workload.num_layers={layers}; each stage "
                f"needs a layer, so set num_stages <= {layers}"
            )
        if self.seed < 0:
            raise ValueError(f"seed={self.seed} must be >= 0")
        if self.budget < 1:
            raise ValueError(f"budget={self.budget} must be >= 1 (candidates scored)")
        if not self.time_limit_s > 0:
            raise ValueError(f"time_limit_s={self.time_limit_s} must be > 0 seconds")


def check_memory(
    topology: Topology, mesh: tuple[tuple[int, ...], ...], layers: tuple[int, ...],
    workload: WorkloadConfig,
) -> None:  # fmt: skip
    """Check every device can hold its stage.

    The need is `stage_memory_gib`: weights, gradients and the activations the workload's
    schedule keeps in flight on that stage.

    Raises:
        InfeasiblePlanError: constraint "memory", naming the stage, device, need and have.
    """
    from frugal.planner.iteration import stage_memory_gib

    for row in mesh:
        for stage, rank in enumerate(row):
            need = stage_memory_gib(workload, layers[stage], stage, len(row))
            device = topology.devices[rank]
            if need > device.memory_gib:
                raise InfeasiblePlanError(
                    f"stage {stage} ({layers[stage]} layers, {workload.schedule}) needs "
                    f"{need:.2f} GiB but device {device.name} has {device.memory_gib:.2f} GiB; "
                    "use more stages, fewer micro-batches per step, the 1f1b schedule, or "
                    "larger devices",
                    constraint="memory",
                )


def _grids(topology: Topology, config: PlannerConfig) -> list[tuple[int, int]]:
    """The (D_pp, D_dp) pairs to plan: the configured one, or every feasible factor pair."""
    n = topology.num_devices
    if config.num_stages and config.num_replicas:
        return [(config.num_stages, config.num_replicas)]
    for name, value in (("num_stages", config.num_stages), ("num_replicas", config.num_replicas)):
        if value and n % value:
            raise ConfigError(
                f"{name}={value} does not divide world_size={n}; choose a divisor of {n} (or 0 "
                "to let the planner choose)"
            )
    if config.num_stages:
        return [(config.num_stages, n // config.num_stages)]
    if config.num_replicas:
        return [(n // config.num_replicas, config.num_replicas)]
    w = config.workload
    step = w.microbatch_size * (w.microbatches_per_step or 1)  # 0: the planner chooses M
    return [
        (d_pp, n // d_pp)
        for d_pp in range(1, min(n, w.num_layers) + 1)
        if n % d_pp == 0 and w.global_batch_size % ((n // d_pp) * step) == 0
    ]


def _compute_lower_bound(topology: Topology, config: PlannerConfig) -> float:
    """Compute-only bound on seconds per iteration for any placement on this grid.

    Every pipeline pushes all A x M micro-batches through its slowest stage; a stage has at
    least L / D_pp layers' worth of work on average, and no device is faster than the fastest:
    T >= A M (L / D_pp) tau_ref / max speed.
    """
    w = config.workload
    per_replica = w.global_batch_size // config.num_replicas
    microbatches = per_replica // w.microbatch_size  # A x M
    fastest = max(d.speed for d in topology.devices)
    return microbatches * (w.num_layers / config.num_stages) * w.tau_ref_s / fastest


def _balance_layers(
    topology: Topology, mesh: tuple[tuple[int, ...], ...], num_layers: int
) -> tuple[int, ...]:
    """Layers per stage minimising the slowest stage, when device speeds differ.

    Stage i costs l_i c_i with c_i = 1 / (slowest speed among its replicas)
    (`frugal.parallel.partition_layers`).
    """
    num_stages = len(mesh[0])
    c = [max(1.0 / topology.devices[row[i]].speed for row in mesh) for i in range(num_stages)]
    return partition_layers(num_layers, num_stages, seconds_per_layer=c)


def build_plan(topology: Topology, config: PlannerConfig) -> Plan:
    """Search a placement for `topology` and return it as a `Plan`.

    With num_stages = num_replicas = 0 every factor pair (D_pp <= num_layers, batch split into
    whole steps) is planned with an equal share of the budget and the fastest plan is kept.
    With devices of different speeds (iteration objective), layers per stage are balanced to
    the slowest device of each stage.

    Args:
        topology: Devices and links.
        config: Grid, objective, search method and budget.

    Returns:
        The plan (deterministic for the same inputs and seed).

    Raises:
        ConfigError: If the grid does not match the device count or links are asymmetric.
        InfeasiblePlanError: If a stage does not fit its device's memory.
    """
    from frugal.planner.choice import choose, is_open, reference_workload
    from frugal.planner.methods import METHODS
    from frugal.planner.search import check_grid

    grids = _grids(topology, config)
    if len(grids) != 1:
        if not grids:
            w = config.workload
            raise ConfigError(
                f"no (num_stages, num_replicas) factor pair of {topology.num_devices} devices "
                f"splits global_batch_size={w.global_batch_size} into whole steps of "
                f"microbatches_per_step={w.microbatches_per_step or 1} x microbatch_size="
                f"{w.microbatch_size}; change those or set num_stages and num_replicas"
            )
        from dataclasses import replace

        plans: list[Plan] = []
        failures: list[str] = []
        share = max(1, config.budget // len(grids))
        time_share = config.time_limit_s / len(grids)
        for d_pp, d_dp in grids:
            grid = replace(config, num_stages=d_pp, num_replicas=d_dp, budget=share,
                           time_limit_s=time_share)  # fmt: skip
            try:
                plans.append(build_plan(topology, grid))
            except (InfeasiblePlanError, ValueError) as exc:
                failures.append(f"{d_pp}x{d_dp}: {exc}")
        if not plans:
            raise InfeasiblePlanError("no grid fits: " + "; ".join(failures), constraint="memory")
        kept = min(plans, key=lambda p: p.predicted_cost_s)
        # Any grid's search cut by the clock can change which grid wins: say so.
        timed_out = any(p.stop_reason == "time_limit" for p in plans)
        return replace(
            kept,
            num_candidates=sum(p.num_candidates for p in plans),
            stop_reason="time_limit" if timed_out else kept.stop_reason,
        )
    config_grid = grids[0]
    check_grid(topology, *config_grid)
    if (config.num_stages, config.num_replicas) != config_grid:
        from dataclasses import replace

        config = replace(config, num_stages=config_grid[0], num_replicas=config_grid[1])
    d_pp, d_dp = config.num_stages, config.num_replicas
    method = METHODS.get(config.method)
    workload = config.workload
    if workload.codec != AUTO and workload.codec_candidates != DEFAULT_CODEC_CANDIDATES:
        warnings.warn(
            f"workload.codec_candidates={list(workload.codec_candidates)} is ignored: "
            f'workload.codec = "{workload.codec}" pins the codec; set it to "auto" to choose',
            stacklevel=2,
        )
    reference = reference_workload(workload, d_dp)
    searched = _search(topology, config, reference)
    num_candidates, stop = searched.num_candidates, searched.stop_reason
    balance = method.balance_microbatches
    if config.objective == "iteration" and is_open(workload):
        chosen = choose(topology, searched.mesh, searched.layers, workload,
                        balance_microbatches=balance)  # fmt: skip
        if chosen.workload != reference:
            # The choice changes the trade-off the placement was searched for: search again
            # under it and keep the faster plan.
            again = _search(topology, config, chosen.workload)
            rechosen = choose(topology, again.mesh, again.layers, workload,
                              balance_microbatches=balance)  # fmt: skip
            num_candidates += again.num_candidates
            stop = "time_limit" if "time_limit" in (stop, again.stop_reason) else stop
            if rechosen.total_s < chosen.total_s:
                searched = again
    return price_mesh(
        topology,
        config,
        searched.mesh_rows,
        searched.layers,
        stage_order=searched.stage_order,
        balance_microbatches=balance,
        num_candidates=num_candidates,
        stop_reason=stop,
    )


def price_mesh(
    topology: Topology,
    config: PlannerConfig,
    mesh: tuple[tuple[int, ...], ...],
    layers: tuple[int, ...],
    *,
    stage_order: tuple[int, ...] | None = None,
    balance_microbatches: bool = True,
    num_candidates: int = 0,
    stop_reason: str = "",
) -> Plan:
    """The `Plan` of a given placement, priced (and its open choices made) under `config`.

    `build_plan` calls it on the mesh its search found; re-planning (`frugal.planner.replan`)
    calls it on warm-started meshes. Under the iteration objective the workload's open codec,
    schedule and micro-batch count are chosen for this mesh (`frugal.planner.choice.choose`).

    Args:
        topology: Devices and links; `mesh` indexes its devices.
        config: Objective, workload, method name and seed recorded in the plan.
        mesh: `mesh[j][i]` = device of pipeline j at stage i, (num_replicas, num_stages).
        layers: Layers of each stage (sum = workload.num_layers).
        stage_order: Group id along the pipeline path per stage (identity if None).
        balance_microbatches: Share micro-batches in proportion to pipeline speed.
        num_candidates: Placements the search scored (recorded).
        stop_reason: Why the search stopped (recorded).

    Raises:
        InfeasiblePlanError: If a stage does not fit its device's memory.
        ValueError: If the mesh, layers and batch disagree.
    """
    import numpy as np

    from frugal.planner.choice import choose, reference_workload
    from frugal.planner.cost import paper_cost, paper_lower_bound

    d_dp, d_pp = len(mesh), len(mesh[0])
    if (config.num_stages, config.num_replicas) != (d_pp, d_dp):
        from dataclasses import replace

        config = replace(config, num_stages=d_pp, num_replicas=d_dp)
    mesh_array = np.asarray(mesh, dtype=np.int64)
    breakdown: tuple[tuple[str, float], ...]
    if config.objective == "paper":
        # the paper's cost prices no codec, schedule or micro-batch
        resolved = reference_workload(config.workload, d_dp)
        check_memory(topology, mesh, layers, resolved)
        scored = paper_cost(topology, np.ascontiguousarray(mesh_array.T))
        predicted = scored.total_s
        breakdown = (("dp_s", scored.dp_s), ("pp_s", scored.pp_s))
        bound = paper_lower_bound(topology, d_pp, d_dp)
        microbatches: tuple[int, ...] = (resolved.microbatches_per_step,) * d_dp
        collectives: tuple[str, ...] = ()
    else:
        chosen = choose(topology, mesh_array, layers, config.workload,
                        balance_microbatches=balance_microbatches)  # fmt: skip
        resolved = chosen.workload
        microbatches, collectives = chosen.microbatches, chosen.collective
        predicted = chosen.total_s
        breakdown = (("pipeline_s", chosen.pipeline_s), ("dp_exposed_s", chosen.dp_exposed_s))
        bound = _compute_lower_bound(topology, config)
    return Plan(
        world_size=topology.num_devices,
        num_stages=config.num_stages,
        num_replicas=config.num_replicas,
        num_layers_per_stage=layers,
        num_microbatches_per_replica=microbatches,
        mesh=mesh,
        stage_order=stage_order if stage_order is not None else tuple(range(d_pp)),
        devices=tuple((d.name, d.host, d.site) for d in topology.devices),
        objective=config.objective,
        method=config.method,
        predicted_cost_s=predicted,
        breakdown=breakdown,
        lower_bound_s=bound,
        # 0 / 0 (one device under the paper cost: nothing to communicate) is optimal
        gap=predicted / bound - 1.0 if bound > 0 else (0.0 if predicted <= 0 else float("inf")),
        seed=config.seed,
        cluster=topology.name,
        cluster_sha256=topology.sha256(),
        codec=CodecSpec.parse(resolved.codec).label,
        schedule=resolved.schedule,
        microbatch_size=resolved.microbatch_size,
        dp_collective=collectives,
        num_candidates=num_candidates,
        stop_reason=stop_reason,
        global_batch_size=config.workload.global_batch_size,
    )


@dataclass(frozen=True, slots=True)
class _Searched:
    """One placement search's result, with its layers balanced to the device speeds."""

    mesh: I64
    mesh_rows: tuple[tuple[int, ...], ...]
    stage_order: tuple[int, ...]
    layers: tuple[int, ...]
    num_candidates: int
    stop_reason: str


def _search(topology: Topology, config: PlannerConfig, workload: WorkloadConfig) -> _Searched:
    """Search a placement on the config's grid under a resolved `workload`."""
    import numpy as np

    from frugal.planner.methods import METHODS, SearchRequest

    d_pp, d_dp = config.num_stages, config.num_replicas
    layers = split_layers(workload.num_layers, d_pp)
    outcome = METHODS.get(config.method).search(
        SearchRequest(
            topology=topology,
            num_stages=d_pp,
            num_replicas=d_dp,
            layers_per_stage=layers,
            objective=config.objective,
            workload=workload,
            budget=config.budget,
            seed=config.seed,
            time_limit_s=config.time_limit_s,
        )
    )
    mesh = np.asarray(outcome.mesh, dtype=np.int64)
    if mesh.shape != (d_dp, d_pp):
        raise PlannerError(
            f"method {config.method!r} returned a mesh of shape {mesh.shape}; expected "
            f"(num_replicas, num_stages) = ({d_dp}, {d_pp})"
        )
    mesh_rows = tuple(tuple(int(r) for r in row) for row in mesh)
    if config.objective == "iteration" and len({d.speed for d in topology.devices}) > 1:
        layers = _balance_layers(topology, mesh_rows, workload.num_layers)
    return _Searched(
        mesh=mesh,
        mesh_rows=mesh_rows,
        stage_order=outcome.stage_order if outcome.stage_order is not None else tuple(range(d_pp)),
        layers=layers,
        num_candidates=outcome.num_candidates,
        stop_reason=outcome.stop_reason,
    )
