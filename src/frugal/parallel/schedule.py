"""Pipeline schedules as per-stage action lists, one implementation for all their users.

The runtime (`frugal.pipeline`) executes them; the one discrete-event simulator
(`frugal.planner.sim`: `simulate_pipelines` for plans, `simulate_step` for the pipeline bench's
measured runs) replays them.

An action is ("F", j) or ("B", j): forward or backward of micro-batch j on that stage. The
communication follows from it: F(j) on stage s > 0 receives j's activation from s - 1 and, on
s < p - 1, sends its output to s + 1; B(j) on s < p - 1 receives the gradient from s + 1 and, on
s > 0, sends the input gradient to s - 1. Both built-in schedules flush at the end of the step,
so the bubble is (p - 1) / (m + p - 1) of the step.

Schedules are registry entries (`SCHEDULES`, `register_schedule`): a schedule is a function
`(num_stages, stage, num_microbatches) -> list[Action]`; everything else (memory in flight,
simulation, execution) follows from the action lists.

References:
    GPipe: Efficient Training of Giant Neural Networks using Pipeline Parallelism, NeurIPS
    2019, arXiv 1811.06965 (all forwards, then all backwards).
    Memory-Efficient Pipeline-Parallel DNN Training, ICML 2021, arXiv 2006.09503
    (PipeDream-Flush, "1F1B": p - s - 1 warm-up forwards, then alternate, then drain).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from frugal.registry import Registry

__all__ = [
    "SCHEDULES",
    "Action",
    "ScheduleFn",
    "ScheduleName",
    "build_schedule",
    "peak_in_flight",
    "register_schedule",
]

ScheduleName = Literal["gpipe", "1f1b"]
"""The built-in schedules (others may be registered)."""
Action = tuple[Literal["F", "B"], int]
ScheduleFn = Callable[[int, int, int], list[Action]]
"""(num_stages, stage, num_microbatches) -> the stage's actions of one step."""

SCHEDULES: Registry[ScheduleFn] = Registry("pipeline schedule", field="schedule")
"""Every schedule a plan, the runtime and the simulators may name."""


def register_schedule(name: str, schedule: ScheduleFn, *, replace: bool = False) -> None:
    """Make `name` a valid `schedule` everywhere (runtime, simulators, plans).

    The function must return, for each stage, every micro-batch's forward before its
    backward, 2 m actions in all; `build_schedule` checks this.

    Raises:
        ValueError: If `name` is taken and `replace` is False.
    """
    SCHEDULES.register(name, schedule, replace=replace)


def _gpipe(num_stages: int, stage: int, m: int) -> list[Action]:
    return [("F", j) for j in range(m)] + [("B", j) for j in range(m)]


def _one_f_one_b(num_stages: int, stage: int, m: int) -> list[Action]:
    warmup = min(num_stages - stage - 1, m)
    actions: list[Action] = [("F", j) for j in range(warmup)]
    for i in range(m - warmup):
        actions += [("F", warmup + i), ("B", i)]
    return actions + [("B", j) for j in range(m - warmup, m)]


register_schedule("gpipe", _gpipe)
register_schedule("1f1b", _one_f_one_b)


def build_schedule(
    schedule: str, num_stages: int, stage: int, num_microbatches: int
) -> list[Action]:
    """The ordered actions of `stage` for one step.

    Args:
        schedule: A registered schedule ("gpipe", "1f1b", or one a user registered).
        num_stages: p, >= 1.
        stage: s in [0, p).
        num_microbatches: m, >= 1.

    Returns:
        2 m actions: each micro-batch's forward before its backward.

    Raises:
        ValueError: If the schedule is unknown, an argument is out of range, or a registered
            schedule returns something other than each micro-batch's F before its B.
    """
    if not 0 <= stage < num_stages or num_microbatches < 1:
        raise ValueError(
            f"stage={stage} must be in [0, num_stages={num_stages}) and "
            f"num_microbatches={num_microbatches} >= 1"
        )
    actions = SCHEDULES.get(schedule)(num_stages, stage, num_microbatches)
    forwards = [j for op, j in actions if op == "F"]
    backwards = [j for op, j in actions if op == "B"]
    expected = list(range(num_microbatches))
    position = {action: k for k, action in enumerate(actions)}
    if (
        sorted(forwards) != expected
        or sorted(backwards) != expected
        or any(position[("F", j)] > position[("B", j)] for j in expected)
    ):
        raise ValueError(
            f"schedule {schedule!r} gave stage {stage} the actions {actions[:8]}...; a schedule "
            "must run each micro-batch's forward once, before its backward"
        )
    return actions


def peak_in_flight(actions: list[Action]) -> int:
    """Most micro-batches whose forward ran and backward has not (activations held at once).

    GPipe: m on every stage; 1F1B: min(p - s, m) on stage s.
    """
    live = peak = 0
    for op, _ in actions:
        live += 1 if op == "F" else -1
        peak = max(peak, live)
    return peak
