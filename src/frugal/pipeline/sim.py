"""Deterministic discrete-event simulation of one pipeline step.

Inputs: each stage's action list (`build_schedule`), its median forward and backward seconds
per micro-batch (codec work included), the exact wire bytes of every message, each link's
bandwidth and latency, and the processors the stages share. Rules: a stage runs its actions in
order; F(j) waits for j's activation, B(j) for j's gradient, and every action for a free core
(list scheduling: the action that can start first goes first); a send holds its directed link
(FIFO) for 8 L / B seconds and lands `latency_s` later; compute overlaps sends. The step ends
when the last action finished and the last message landed, plus each stage's optimizer step.
A fractional core count c (ranks time-sharing a machine whose other jobs hold part of it) is
the linear interpolation between floor(c) and ceil(c) cores.

References:
    Fine-tuning Language Models over Slow Networks using Activation Compression with
    Guarantees, NeurIPS 2022, arXiv 2206.01299 (the pipelined setting it speeds up).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from frugal.parallel.schedule import build_schedule

__all__ = ["SimulatedStep", "simulate_step"]


@dataclass(frozen=True, slots=True)
class SimulatedStep:
    """Outcome of one simulated step."""

    step_time_s: float
    """From the first action to the last completion or arrival."""
    stage_busy_s: tuple[float, ...]
    """Compute seconds of each stage."""
    link_busy_s: float
    """Seconds the busiest directed link transferred."""


def simulate_step(
    *,
    schedule: str,
    num_microbatches: int,
    forward_s: Sequence[float],
    backward_s: Sequence[float],
    activation_bytes: Sequence[Sequence[int]],
    gradient_bytes: Sequence[Sequence[int]],
    bandwidth_bits_per_s: float,
    latency_s: float = 0.0,
    optimizer_s: Sequence[float] | None = None,
    num_cores: float | None = None,
) -> SimulatedStep:
    """Simulate one step of a p-stage pipeline.

    Args:
        schedule: "gpipe" or "1f1b".
        num_microbatches: m.
        forward_s: Per stage, seconds of one micro-batch's forward (p entries).
        backward_s: Per stage, seconds of one micro-batch's backward.
        activation_bytes: `[s][j]`: wire bytes of micro-batch j's activation from s to s + 1
            (p - 1 rows).
        gradient_bytes: `[s][j]`: wire bytes of j's gradient from s + 1 back to s.
        bandwidth_bits_per_s: Every link's bandwidth (inf = instantaneous).
        latency_s: Every link's one-way latency.
        optimizer_s: Per stage, seconds of the optimizer step after the stage's last action
            and its last send (None = 0).
        num_cores: Processors shared by all stages (co-located ranks), >= 1; None = one per
            stage. A compute action waits for a free core. A fractional value interpolates
            the step time linearly between floor and ceil cores.

    Returns:
        The step time and busy times.

    Raises:
        ValueError: If the lengths disagree, num_cores < 1, or the schedule deadlocks.
    """
    run = functools.partial(
        _simulate,
        schedule=schedule,
        num_microbatches=num_microbatches,
        forward_s=forward_s,
        backward_s=backward_s,
        activation_bytes=activation_bytes,
        gradient_bytes=gradient_bytes,
        bandwidth_bits_per_s=bandwidth_bits_per_s,
        latency_s=latency_s,
        optimizer_s=optimizer_s,
    )
    if num_cores is None:
        return run(num_cores=len(forward_s))
    if not num_cores >= 1:
        raise ValueError(f"num_cores={num_cores} must be >= 1 (or None for one per stage)")
    low = run(num_cores=math.floor(num_cores))
    weight = num_cores - math.floor(num_cores)
    if weight == 0:
        return low
    high = run(num_cores=math.ceil(num_cores))
    return SimulatedStep(
        (1 - weight) * low.step_time_s + weight * high.step_time_s,
        low.stage_busy_s,
        low.link_busy_s,
    )


def _simulate(
    *,
    schedule: str,
    num_microbatches: int,
    forward_s: Sequence[float],
    backward_s: Sequence[float],
    activation_bytes: Sequence[Sequence[int]],
    gradient_bytes: Sequence[Sequence[int]],
    bandwidth_bits_per_s: float,
    latency_s: float,
    optimizer_s: Sequence[float] | None,
    num_cores: int,
) -> SimulatedStep:
    p, m = len(forward_s), num_microbatches
    if len(backward_s) != p or len(activation_bytes) != p - 1 or len(gradient_bytes) != p - 1:
        raise ValueError(
            f"{p} stages need {p} backward times and {p - 1} rows of activation and gradient bytes"
        )

    def hold(num_bytes: int) -> float:
        return 8.0 * num_bytes / bandwidth_bits_per_s if math.isfinite(bandwidth_bits_per_s) else 0

    actions = [build_schedule(schedule, p, s, m) for s in range(p)]
    position = [0] * p
    clock = [0.0] * p
    fwd_arrival: dict[tuple[int, int], float] = {}  # (stage receiving, mb) -> time
    bwd_arrival: dict[tuple[int, int], float] = {}
    link_free = {(s, d): 0.0 for s in range(p) for d in (s - 1, s + 1) if 0 <= d < p}
    link_busy = dict.fromkeys(link_free, 0.0)
    cores = [0.0] * num_cores  # when each core is free
    end = 0.0

    def candidate(s: int) -> float:
        op, j = actions[s][position[s]]
        if op == "F":
            ready = 0.0 if s == 0 else fwd_arrival.get((s, j), -1.0)
        else:
            ready = 0.0 if s == p - 1 else bwd_arrival.get((s, j), -1.0)
        return -1.0 if ready < 0 else max(clock[s], ready)

    for _ in range(2 * m * p):
        # List scheduling: the runnable action that can start first (lowest stage on ties)
        # takes the core that frees first.
        starts = [(candidate(s), s) for s in range(p) if position[s] < len(actions[s])]
        runnable = [(t, s) for t, s in starts if t >= 0]
        if not runnable:
            raise ValueError("the schedule deadlocks: an action waits for a message never sent")
        ready_at, s = min(runnable)
        core = min(range(len(cores)), key=lambda c: cores[c])
        op, j = actions[s][position[s]]
        cost = forward_s[s] if op == "F" else backward_s[s]
        done = max(ready_at, cores[core]) + cost
        cores[core] = done
        clock[s] = done
        end = max(end, done)
        if op == "F" and s < p - 1:
            dst, num_bytes, target = s + 1, activation_bytes[s][j], fwd_arrival
        elif op == "B" and s > 0:
            dst, num_bytes, target = s - 1, gradient_bytes[s - 1][j], bwd_arrival
        else:
            dst, num_bytes, target = -1, 0, fwd_arrival
        if dst >= 0:
            t0 = max(done, link_free[(s, dst)])
            link_free[(s, dst)] = t0 + hold(num_bytes)
            link_busy[(s, dst)] += hold(num_bytes)
            target[(dst, j)] = link_free[(s, dst)] + latency_s
            end = max(end, target[(dst, j)])
        position[s] += 1
    if optimizer_s is not None:
        # A stage steps its optimizer once its sends have left (the runtime waits on them).
        sent = [
            max(
                [clock[s]]
                + [t for (d, _), t in bwd_arrival.items() if d == s - 1]
                + [t for (d, _), t in fwd_arrival.items() if d == s + 1]
            )
            for s in range(p)
        ]
        end = max(end, max(sent[s] + optimizer_s[s] for s in range(p)))
    busy = tuple(m * (forward_s[s] + backward_s[s]) for s in range(p))
    return SimulatedStep(end, busy, max(link_busy.values(), default=0.0))
