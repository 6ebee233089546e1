"""What a plan leaves open, chosen for its placement: codec, schedule, micro-batches per step.

A `WorkloadConfig` may leave three settings to the planner: the pipeline codec
(`codec = "auto"`, chosen among `codec_candidates`), the schedule (`schedule = "auto"`, among
the registered schedules) and the micro-batches per step (`microbatches_per_step = 0`, among
the divisors of the micro-batches a replica runs per iteration). Each stage's DP collective is
always chosen, among `dp_collectives` (`frugal.planner.iteration.stage_collective`). An
explicit value pins its setting.

`build_plan` searches a placement under one reference choice (`reference_workload`), then
prices every candidate on that placement (`choose`) and records the cheapest that fits device
memory; when that differs from the reference it searches again under it and keeps the faster
plan. Under the iteration model a plan's time never falls as a message grows, so a codec whose
forward and backward messages are both at least another candidate's is never priced
(`codec_candidates`): a tie goes to the first listed.

References:
    Fine-tuning Language Models over Slow Networks using Activation Compression with
    Guarantees, NeurIPS 2022, arXiv 2206.01299 (AQ-SGD's first visits and warm-up, section 3).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from frugal._typing import I64
from frugal.parallel.codec import CodecSpec
from frugal.parallel.schedule import SCHEDULES
from frugal.planner.iteration import AUTO, WorkloadConfig, iteration_cost
from frugal.planner.topology import Topology

__all__ = [
    "REFERENCE_MICROBATCHES_PER_STEP",
    "PricedWorkload",
    "choose",
    "codec_candidates",
    "is_open",
    "microbatch_candidates",
    "price",
    "reference_workload",
    "schedule_candidates",
]

REFERENCE_MICROBATCHES_PER_STEP = 64
"""M of the search when the planner chooses it: the largest divisor at most this (the DT-FM
runs' 64 micro-batches per step, planner.md section 6)."""
_REFERENCE_SCHEDULE = "1f1b"
"""Schedule of the search when the planner chooses it: 1F1B keeps the fewest activations in
flight, so the search's memory filter refuses no placement another schedule could run."""


@dataclass(frozen=True, slots=True)
class PricedWorkload:
    """A workload with every choice made, and what it costs on one placement."""

    workload: WorkloadConfig
    """The workload with its codec, schedule and micro-batches per step resolved."""
    total_s: float
    """Predicted seconds per iteration."""
    pipeline_s: float
    """The slowest pipeline's seconds per iteration."""
    dp_exposed_s: float
    """Gradient exchange not hidden behind the backward pass, seconds."""
    collective: tuple[str, ...]
    """Per stage, the cheapest allowed DP collective."""
    microbatches: tuple[int, ...]
    """Micro-batches per accumulation step of each pipeline."""


def is_open(workload: WorkloadConfig) -> bool:
    """Whether the workload leaves its codec, schedule or micro-batch count to the planner."""
    return AUTO in (workload.codec, workload.schedule) or workload.microbatches_per_step == 0


def microbatch_candidates(workload: WorkloadConfig, num_replicas: int) -> tuple[int, ...]:
    """The micro-batches per step to try, largest first: the pinned one, or every divisor.

    Raises:
        ValueError: If the global batch does not split into whole micro-batches per replica.
    """
    if workload.microbatches_per_step:
        return (workload.microbatches_per_step,)
    per_replica, rest = divmod(workload.global_batch_size, num_replicas * workload.microbatch_size)
    if rest or not per_replica:
        raise ValueError(
            f"global_batch_size={workload.global_batch_size} does not split into whole "
            f"micro-batches of {workload.microbatch_size} over {num_replicas} replicas; use a "
            f"multiple of {num_replicas * workload.microbatch_size}"
        )
    return tuple(m for m in range(per_replica, 0, -1) if per_replica % m == 0)


def schedule_candidates(workload: WorkloadConfig) -> tuple[str, ...]:
    """The pinned schedule, or every registered one (registration order: gpipe, 1f1b, ...)."""
    return tuple(SCHEDULES) if workload.schedule == AUTO else (workload.schedule,)


def codec_candidates(workload: WorkloadConfig) -> tuple[str, ...]:
    """The codecs worth pricing (canonical labels).

    The pinned one, or the candidates none of the others beats in both directions (equal
    sizes: the first listed).
    """
    if workload.codec != AUTO:
        return (CodecSpec.parse(workload.codec).label,)
    labels = tuple(dict.fromkeys(CodecSpec.parse(c).label for c in workload.codec_candidates))
    sizes = [
        (w.activation_bytes, w.gradient_bytes)
        for w in (replace(workload, codec=label) for label in labels)
    ]

    def beaten(k: int) -> bool:
        fwd, bwd = sizes[k]
        return any(
            (f <= fwd and b <= bwd) and ((f, b) != (fwd, bwd) or other < k)
            for other, (f, b) in enumerate(sizes)
            if other != k
        )

    return tuple(label for k, label in enumerate(labels) if not beaten(k))


def reference_workload(workload: WorkloadConfig, num_replicas: int) -> WorkloadConfig:
    """The choice a placement is searched under.

    Pinned settings as given; an open codec is the candidate with the fewest bytes per
    micro-batch (forward + backward), an open schedule 1F1B (if registered), an open M the
    largest divisor <= 64.

    Raises:
        ValueError: As `microbatch_candidates`.
    """
    codecs = codec_candidates(workload)
    codec = min(codecs, key=lambda c: _bytes_per_microbatch(replace(workload, codec=c)))
    schedules = schedule_candidates(workload)
    schedule = _REFERENCE_SCHEDULE if _REFERENCE_SCHEDULE in schedules else schedules[0]
    counts = microbatch_candidates(workload, num_replicas)
    fitting = [m for m in counts if m <= REFERENCE_MICROBATCHES_PER_STEP]
    return replace(
        workload,
        codec=codec,
        schedule=schedule,
        microbatches_per_step=fitting[0] if fitting else counts[-1],
    )


def _bytes_per_microbatch(workload: WorkloadConfig) -> float:
    return workload.activation_bytes + workload.gradient_bytes


def price(
    topology: Topology,
    mesh_JI: I64,
    layers_per_stage: tuple[int, ...],
    workload: WorkloadConfig,
    *,
    balance_microbatches: bool = False,
) -> PricedWorkload:
    """Seconds per iteration of a placement under a resolved workload.

    GPipe by the closed form (`iteration_cost`); any other schedule by the event simulator
    (`frugal.planner.sim.simulate_iteration`), on the micro-batch counts of the closed form.

    Raises:
        ValueError: If the workload leaves a choice open, or as `iteration_cost`.

    Shapes:
        mesh_JI: (J replicas, I stages).
    """
    if is_open(workload):
        raise ValueError("price needs a resolved workload (no auto codec/schedule, M >= 1)")
    num_replicas = mesh_JI.shape[0]
    it = iteration_cost(topology, mesh_JI, layers_per_stage, workload,
                        balance_microbatches=balance_microbatches)  # fmt: skip
    priced = PricedWorkload(
        workload=workload,
        total_s=it.total_s,
        pipeline_s=it.pipeline_s,
        dp_exposed_s=it.dp_exposed_s,
        collective=it.collective if num_replicas > 1 else (),
        microbatches=it.microbatches,
    )
    if workload.schedule == "gpipe":
        return priced
    from frugal.planner.sim import simulate_iteration  # the closed form is GPipe's

    counts = np.array(it.microbatches, dtype=np.int64)
    sim = simulate_iteration(topology, mesh_JI, layers_per_stage, workload,
                             microbatches_J=counts, schedule=workload.schedule)  # fmt: skip
    return replace(
        priced,
        total_s=sim.total_s,
        pipeline_s=max(sim.pipeline_s),
        dp_exposed_s=sim.dp_exposed_s,
        collective=sim.collective if num_replicas > 1 else (),
    )


def choose(
    topology: Topology,
    mesh_JI: I64,
    layers_per_stage: tuple[int, ...],
    workload: WorkloadConfig,
    *,
    balance_microbatches: bool = False,
) -> PricedWorkload:
    """The cheapest candidate choice on this placement that fits device memory.

    Candidates: `codec_candidates` x `schedule_candidates` x `microbatch_candidates`; a tie
    goes to the first (codecs as listed, schedules as registered, larger M first). A fully
    pinned workload has one candidate: this is then `check_memory` and `price`.

    Raises:
        InfeasiblePlanError: If no candidate fits device memory (the first one's message).
        ValueError: As `price`.

    Shapes:
        mesh_JI: (J replicas, I stages).
    """
    from frugal.planner.plan import InfeasiblePlanError, check_memory

    mesh = tuple(tuple(int(r) for r in row) for row in mesh_JI)
    best: PricedWorkload | None = None
    refused: list[InfeasiblePlanError] = []
    counts = microbatch_candidates(workload, mesh_JI.shape[0])
    for codec in codec_candidates(workload):
        for schedule in schedule_candidates(workload):
            for m in counts:
                candidate = replace(workload, codec=codec, schedule=schedule,
                                    microbatches_per_step=m)  # fmt: skip
                try:
                    check_memory(topology, mesh, layers_per_stage, candidate)
                except InfeasiblePlanError as exc:
                    refused.append(exc)
                    continue
                priced = price(topology, mesh_JI, layers_per_stage, candidate,
                               balance_microbatches=balance_microbatches)  # fmt: skip
                if best is None or priced.total_s < best.total_s:
                    best = priced
    if best is None:
        first = refused[0]
        if len(refused) == 1:
            raise first
        raise InfeasiblePlanError(
            f"none of the {len(refused)} codec x schedule x micro-batch choices fits; the "
            f"first: {first}",
            constraint=first.constraint,
        )
    return best
