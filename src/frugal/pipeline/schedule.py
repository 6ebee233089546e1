"""Pipeline schedules as per-stage action lists, shared by the runtime and the simulator.

An action is ("F", j) or ("B", j): forward or backward of micro-batch j on that stage. The
communication follows from it: F(j) on stage s > 0 receives j's activation from s - 1 and, on
s < p - 1, sends its output to s + 1; B(j) on s < p - 1 receives the gradient from s + 1 and, on
s > 0, sends the input gradient to s - 1. Both schedules flush at the end of the step, so the
bubble is (p - 1) / (m + p - 1) of the step.

References:
    GPipe: Efficient Training of Giant Neural Networks using Pipeline Parallelism, NeurIPS
    2019, arXiv 1811.06965 (all forwards, then all backwards).
    Memory-Efficient Pipeline-Parallel DNN Training, ICML 2021, arXiv 2006.09503
    (PipeDream-Flush, "1F1B": p - s - 1 warm-up forwards, then alternate, then drain).
"""

from __future__ import annotations

from typing import Literal

__all__ = ["Action", "ScheduleName", "build_schedule"]

ScheduleName = Literal["gpipe", "1f1b"]
Action = tuple[Literal["F", "B"], int]


def build_schedule(
    schedule: str, num_stages: int, stage: int, num_microbatches: int
) -> list[Action]:
    """The ordered actions of `stage` for one step.

    Args:
        schedule: "gpipe" or "1f1b".
        num_stages: p, >= 1.
        stage: s in [0, p).
        num_microbatches: m, >= 1.

    Returns:
        2 m actions: each micro-batch's forward before its backward.

    Raises:
        ValueError: If the schedule is unknown or an argument is out of range.
    """
    if not 0 <= stage < num_stages or num_microbatches < 1:
        raise ValueError(
            f"stage={stage} must be in [0, num_stages={num_stages}) and "
            f"num_microbatches={num_microbatches} >= 1"
        )
    m = num_microbatches
    if schedule == "gpipe":
        return [("F", j) for j in range(m)] + [("B", j) for j in range(m)]
    if schedule == "1f1b":
        warmup = min(num_stages - stage - 1, m)
        actions: list[Action] = [("F", j) for j in range(warmup)]
        for i in range(m - warmup):
            actions += [("F", warmup + i), ("B", i)]
        actions += [("B", j) for j in range(m - warmup, m)]
        return actions
    raise ValueError(f"schedule={schedule!r}; choose 'gpipe' or '1f1b'")
