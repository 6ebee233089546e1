"""frugal's one deterministic discrete-event simulator of pipelined training.

One event engine serves two callers: `simulate_iteration` / `simulate_pipelines` score a
planner's pipeline x data-parallel placement, and `simulate_step` replays one pipeline whose
ranks share a machine's cores (how `frugal pipeline bench` predicts its measured runs).

The analytic `iteration` objective (`frugal.planner.iteration`) scores candidates inside the
search; this simulator scores a final plan op by op. Each device runs its stage's operations in
schedule order (GPipe: every forward, then every backward; 1F1B: warm-up forwards, then one
forward / one backward, then cool-down backwards). A forward of micro-batch m at stage i waits
for the activation from stage i-1, a backward for the gradient from stage i+1. Every message
queues, first come first served, on its directed link and, when the two devices sit on
different hosts, on the sender host's NIC (out) and the receiver host's NIC (in), each a FIFO
queue of its own. It starts on its link when the link is free and holds it for `bytes / link
bandwidth` (the delay is propagation and overlaps the next message, as in `frugal.comm.link`'s
shaper; with `latency_holds_link` the link is held until the arrival, a stop-and-wait
transport); each capped NIC carries it from max(start, NIC free) for `bytes / NIC capacity`,
so n messages through one NIC of capacity C take at least n bytes / C; it arrives `delay`
after the last of the three is done (the emulated NICs of `frugal.comm.link.HostNics` follow
the same rule).
After the last backward of the last accumulation step, each stage's DP group runs its cheapest
collective (`stage_collective`); the iteration ends when the last collective does.

Units: seconds, bytes, Gbit/s (topology), ms (topology delays). Shapes: J pipelines (replicas),
I stages, N devices.

References:
    Decentralized Training of Foundation Models in Heterogeneous Environments (Yuan et al.,
    NeurIPS 2022, arXiv 2206.01288): the placements and workload this scores.
    GPipe (Huang et al., NeurIPS 2019, arXiv 1811.06965) and PipeDream's 1F1B (Narayanan et
    al., SOSP 2019, arXiv 1806.03377 / PipeDream-Flush, arXiv 2006.09503): the schedules.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from frugal._typing import F64, I64
from frugal.parallel.schedule import build_schedule
from frugal.planner.iteration import (
    WorkloadConfig,
    accumulation_steps,
    collective_links,
    stage_collective,
    window_limited,
)
from frugal.planner.topology import Topology

__all__ = [
    "SimResult",
    "SimulatedStep",
    "simulate_iteration",
    "simulate_pipelines",
    "simulate_step",
]


_BITS_PER_BYTE = 8.0
_GBIT = 1e9
_FWD, _BWD = 0, 1


@dataclass(frozen=True, slots=True)
class SimResult:
    """What the simulator measured for one iteration (seconds)."""

    total_s: float
    """End of the last DP collective (or of the last backward without DP)."""
    pipeline_s: tuple[float, ...]
    """Per pipeline: end of its last backward over all accumulation steps."""
    dp_exposed_s: float
    """total_s - max(pipeline_s): collective time not hidden behind the backward pass."""
    busy_fraction: tuple[float, ...]
    """Per stage: compute-busy share of max(pipeline_s), averaged over the replicas."""
    collective: tuple[str, ...] = ()
    """Chosen collective per stage (simulate_iteration only)."""


def simulate_pipelines(
    forward_s_JI: F64,
    backward_s_JI: F64,
    mesh_JI: I64,
    message_bytes: float,
    *,
    delay_s_NN: F64,
    bandwidth_bytes_per_s_NN: F64,
    host_N: I64,
    nic_bytes_per_s_N: F64,
    microbatches_J: I64,
    schedule: str = "gpipe",
    backward_message_bytes: float | None = None,
    latency_holds_link: bool = False,
) -> tuple[F64, F64]:
    """Simulate one accumulation step of J pipelines that share links and NICs.

    Args:
        forward_s_JI: Forward seconds of one micro-batch on stage i of pipeline j.
        backward_s_JI: Backward seconds (incl. recomputation) likewise.
        mesh_JI: Device of stage i of pipeline j.
        message_bytes: Wire bytes of one forward activation message.
        delay_s_NN: One-way link delay between devices, seconds.
        bandwidth_bytes_per_s_NN: Link bandwidth between devices, bytes/s (> 0 off-diagonal).
        host_N: Host id per device; messages between hosts also queue on both NICs.
        nic_bytes_per_s_N: NIC capacity of each device's host, bytes/s (inf = no cap).
        microbatches_J: Micro-batches of each pipeline, >= 1.
        schedule: A registered schedule (`frugal.parallel.schedule`): "gpipe" or "1f1b".
        backward_message_bytes: Wire bytes of one gradient message (default: message_bytes).
        latency_holds_link: Hold a link for delay + transfer per message (stop-and-wait)
            instead of the transfer only (the delay overlaps the next message).

    Returns:
        (end_J, last_backward_end_JI): each pipeline's makespan and the end of stage i's last
        backward in pipeline j, seconds from the step's start.

    Raises:
        ValueError: If shapes disagree, a time is negative, or a pipeline has no micro-batch.
    """
    bwd_bytes = message_bytes if backward_message_bytes is None else backward_message_bytes
    timeline = _simulate(
        forward_s_JI,
        backward_s_JI,
        mesh_JI,
        forward_bytes=lambda j, i, m: message_bytes,
        backward_bytes=lambda j, i, m: bwd_bytes,
        delay_s_NN=delay_s_NN,
        bandwidth_bytes_per_s_NN=bandwidth_bytes_per_s_NN,
        host_N=host_N,
        nic_bytes_per_s_N=nic_bytes_per_s_N,
        microbatches_J=microbatches_J,
        schedule=schedule,
        latency_holds_link=latency_holds_link,
    )
    return timeline.end, timeline.last_backward


@dataclass(frozen=True, slots=True)
class _Timeline:
    """Raw outcome of one `_simulate` run (seconds from the step's start)."""

    end: F64
    """[j]: end of pipeline j's last backward."""
    last_backward: F64
    """[j, i]: end of stage i's last backward in pipeline j."""
    last_op: F64
    """[j, i]: end of stage i's last operation in pipeline j."""
    landed: F64
    """[j, i]: arrival of the last message stage i of pipeline j sent (0 if none)."""
    link_busy_s: float
    """Transfer seconds of the busiest directed link."""


def _simulate(
    forward_s_JI: F64,
    backward_s_JI: F64,
    mesh_JI: I64,
    *,
    forward_bytes: Callable[[int, int, int], float],
    backward_bytes: Callable[[int, int, int], float],
    delay_s_NN: F64,
    bandwidth_bytes_per_s_NN: F64,
    host_N: I64,
    nic_bytes_per_s_N: F64,
    microbatches_J: I64,
    schedule: str,
    latency_holds_link: bool,
    cores_H: I64 | None = None,
) -> _Timeline:
    """The one event engine behind `simulate_pipelines` and `simulate_step`.

    `forward_bytes(j, i, m)` is the wire size of micro-batch m's activation from stage i to
    i + 1 of pipeline j, `backward_bytes(j, i, m)` of its gradient from i to i - 1. With
    `cores_H`, host h runs at most `cores_H[h]` operations at once: an operation whose input
    and device are ready waits for a free core, and a core that frees goes to the waiting
    operation that was ready first (lowest pipeline, then stage, on ties): list scheduling.
    Without it every device has its own processor.
    """
    num_replicas, num_stages = mesh_JI.shape
    for label, array in (("forward_s_JI", forward_s_JI), ("backward_s_JI", backward_s_JI)):
        if array.shape != mesh_JI.shape:
            raise ValueError(f"{label} has shape {array.shape}, expected {mesh_JI.shape}")
        if (array < 0).any() or not np.isfinite(array).all():
            raise ValueError(f"{label} must be finite and >= 0")
    if microbatches_J.shape != (num_replicas,) or (microbatches_J < 1).any():
        raise ValueError(f"microbatches_J={microbatches_J} must hold {num_replicas} counts >= 1")
    orders = [
        [
            [
                (_FWD if op == "F" else _BWD, k)
                for op, k in build_schedule(schedule, num_stages, i, int(microbatches_J[j]))
            ]
            for i in range(num_stages)
        ]
        for j in range(num_replicas)
    ]
    position = np.zeros((num_replicas, num_stages), dtype=np.int64)
    device_free = np.zeros((num_replicas, num_stages))
    # arrived[(j, i, kind, m)] = time the op's remote input arrived (stage 0 fwd needs none).
    arrived: dict[tuple[int, int, int, int], float] = {}
    fwd_done: dict[tuple[int, int, int], float] = {}
    link_free: dict[tuple[int, int], float] = {}
    link_busy: dict[tuple[int, int], float] = {}
    nic_out_free: dict[int, float] = {}
    nic_in_free: dict[int, float] = {}
    last_bwd = np.zeros((num_replicas, num_stages))
    last_op = np.zeros((num_replicas, num_stages))
    landed = np.zeros((num_replicas, num_stages))
    end = np.zeros(num_replicas)
    free_cores = None if cores_H is None else [int(c) for c in cores_H]
    host_JI = host_N[mesh_JI]
    events: list[tuple[float, int, int, int, int, int, int]] = []
    sequence = 0

    def ready_time(j: int, i: int) -> float | None:
        """When the next op of (j, i) may start, or None while an input is missing."""
        if position[j, i] >= len(orders[j][i]) or device_free[j, i] < 0:  # < 0: op running
            return None
        kind, m = orders[j][i][position[j, i]]
        if kind == _FWD:
            if i == 0:
                return float(device_free[j, i])
            t = arrived.get((j, i, _FWD, m))
        else:
            if (j, i, m) not in fwd_done:
                return None
            t = fwd_done[(j, i, m)] if i == num_stages - 1 else arrived.get((j, i, _BWD, m))
        return None if t is None else max(t, float(device_free[j, i]))

    def start(j: int, i: int, at: float) -> None:
        nonlocal sequence
        kind, m = orders[j][i][position[j, i]]
        duration = forward_s_JI[j, i] if kind == _FWD else backward_s_JI[j, i]
        device_free[j, i] = -1.0
        if free_cores is not None:
            free_cores[host_JI[j, i]] -= 1
        heapq.heappush(events, (at + duration, sequence, 0, j, i, kind, m))
        sequence += 1

    def dispatch(now: float) -> None:
        """At time `now`, give each free core to the waiting op that was ready first."""
        assert free_cores is not None
        waiting = sorted(
            (t, j, i)
            for j in range(num_replicas)
            for i in range(num_stages)
            if free_cores[host_JI[j, i]] > 0 and (t := ready_time(j, i)) is not None
        )
        for t, j, i in waiting:
            if free_cores[host_JI[j, i]] > 0:
                start(j, i, max(t, now))

    def send(t: float, j: int, src_stage: int, dst_stage: int, kind: int, m: int) -> None:
        nonlocal sequence
        a, b = int(mesh_JI[j, src_stage]), int(mesh_JI[j, dst_stage])
        size = (forward_bytes if kind == _FWD else backward_bytes)(j, src_stage, m)
        rate = float(bandwidth_bytes_per_s_NN[a, b])
        begin = max(t, link_free.get((a, b), 0.0))
        done = begin + size / rate
        if host_N[a] != host_N[b]:  # each capped NIC is a FIFO queue of its own
            for free, host, capacity in (
                (nic_out_free, int(host_N[a]), float(nic_bytes_per_s_N[a])),
                (nic_in_free, int(host_N[b]), float(nic_bytes_per_s_N[b])),
            ):
                if math.isfinite(capacity):
                    free[host] = max(begin, free.get(host, 0.0)) + size / capacity
                    done = max(done, free[host])
        arrival = done + float(delay_s_NN[a, b])
        # The link is busy for the transfer; the delay is propagation, which the next message's
        # transfer overlaps (the link shaper's and tc netem's semantics), unless the transport
        # is stop-and-wait.
        link_free[(a, b)] = arrival if latency_holds_link else begin + size / rate
        link_busy[(a, b)] = link_busy.get((a, b), 0.0) + size / rate
        landed[j, src_stage] = max(landed[j, src_stage], arrival)
        heapq.heappush(events, (arrival, sequence, 1, j, dst_stage, kind, m))
        sequence += 1

    def try_start(j: int, i: int) -> None:
        if free_cores is None and (at := ready_time(j, i)) is not None:
            start(j, i, at)

    if free_cores is None:
        for j in range(num_replicas):
            try_start(j, 0)
    else:
        dispatch(0.0)
    while events:
        t, _, event, j, i, kind, m = heapq.heappop(events)
        if event == 0:  # an op finished on (j, i)
            device_free[j, i] = t
            last_op[j, i] = t
            position[j, i] += 1
            if free_cores is not None:
                free_cores[host_JI[j, i]] += 1
            if kind == _FWD:
                fwd_done[(j, i, m)] = t
                if i + 1 < num_stages:
                    send(t, j, i, i + 1, _FWD, m)
            else:
                last_bwd[j, i] = t
                end[j] = max(end[j], t)
                if i > 0:
                    send(t, j, i, i - 1, _BWD, m)
        else:  # a message arrived at (j, i)
            arrived[(j, i, kind, m)] = t
        if free_cores is None:
            try_start(j, i)
        elif not events or events[0][0] > t:  # every event at t is in: hand out the cores
            dispatch(t)
    unfinished = [
        (j, i) for j in range(num_replicas) for i in range(num_stages)
        if position[j, i] < len(orders[j][i])
    ]  # fmt: skip
    if unfinished:
        raise ValueError(
            f"schedule {schedule!r} deadlocks at (pipeline, stage) {unfinished[:4]}: an action "
            "waits for a message its schedule never sends; fix the registered schedule"
        )
    return _Timeline(end, last_bwd, last_op, landed, max(link_busy.values(), default=0.0))


def simulate_iteration(
    topology: Topology,
    mesh_JI: I64,
    layers_per_stage: tuple[int, ...],
    workload: WorkloadConfig,
    *,
    microbatches_J: I64 | None = None,
    schedule: str = "gpipe",
) -> SimResult:
    """Simulate one training iteration of a placement, op by op (see the module docstring).

    Compute times follow `frugal.planner.iteration`: tau(d) = tau_ref / speed(d) per layer and
    micro-batch, forward : backward = 1 : 3; messages carry the workload codec's wire bytes;
    hosts' NICs cap cross-host messages (`Device.nic_gbps`); cross-host links are limited by
    the workload's TCP window (`frugal.planner.iteration.window_limited`).

    Args:
        topology: Devices and links.
        mesh_JI: `mesh[j][i]` = device of pipeline j at stage i.
        layers_per_stage: l_i per stage (sum = num_layers).
        workload: The training job (its micro-batches per step unless `microbatches_J`).
        microbatches_J: Micro-batches per accumulation step of each pipeline.
        schedule: "gpipe" or "1f1b".

    Returns:
        The simulated iteration.

    Raises:
        ValueError: If the mesh, layers and batch disagree (as `iteration_cost`).
    """
    num_replicas, num_stages = mesh_JI.shape
    accumulation = accumulation_steps(mesh_JI, layers_per_stage, workload)
    topology = window_limited(topology, workload.tcp_window_bytes)
    if microbatches_J is None:
        microbatches_J = np.full(num_replicas, workload.microbatches_per_step, dtype=np.int64)
    speed = np.array([d.speed for d in topology.devices])
    layers = np.array(layers_per_stage, dtype=np.float64)
    tau = workload.tau_ref_s / speed[mesh_JI]
    forward = layers * tau / 4.0
    backward = layers * tau * 3.0 / 4.0
    hosts = {name: k for k, name in enumerate(dict.fromkeys(d.host for d in topology.devices))}
    host_N = np.array([hosts[d.host] for d in topology.devices], dtype=np.int64)
    nic = np.array([d.nic_gbps for d in topology.devices]) * _GBIT / _BITS_PER_BYTE
    bandwidth = topology.bandwidth_gbps * _GBIT / _BITS_PER_BYTE
    end_J, last_bwd = simulate_pipelines(
        forward,
        backward,
        mesh_JI,
        workload.activation_bytes,
        delay_s_NN=topology.delay_ms / 1000.0,
        bandwidth_bytes_per_s_NN=bandwidth,
        host_N=host_N,
        nic_bytes_per_s_N=nic,
        microbatches_J=microbatches_J,
        schedule=schedule,
        backward_message_bytes=workload.gradient_bytes,
        latency_holds_link=workload.message_latency == "serialised",
    )
    # Accumulation steps flush the pipeline, so they repeat; gradients are exchanged after the
    # last one, per stage, as soon as every replica's last backward of that stage is done.
    offset_J = (accumulation - 1) * end_J
    pipeline_J = accumulation * end_J
    total = float(pipeline_J.max())
    choices = []
    shared = collective_links(topology)  # the hosts' NICs, shared by their devices' exchanges
    for i in range(num_stages):
        size = layers[i] * workload.params_per_layer * workload.gradient_bytes_per_value
        name, seconds = stage_collective(mesh_JI[:, i], shared, size, workload.dp_collectives)
        choices.append(name)
        total = max(total, float((offset_J + last_bwd[:, i]).max()) + seconds)
    busy = (forward + backward) * microbatches_J[:, None] * accumulation
    return SimResult(
        total_s=total,
        pipeline_s=tuple(float(x) for x in pipeline_J),
        dp_exposed_s=total - float(pipeline_J.max()),
        busy_fraction=tuple(float(x) for x in (busy / pipeline_J.max()).mean(axis=0)),
        collective=tuple(choices),
    )


@dataclass(frozen=True, slots=True)
class SimulatedStep:
    """Outcome of one simulated pipeline step (`simulate_step`)."""

    step_time_s: float
    """From the first action to the last completion or arrival (optimizer steps included)."""
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
    """Simulate one step of one p-stage pipeline whose ranks may share a machine's cores.

    The same event engine as `simulate_pipelines` (one pipeline, one host): a stage runs its
    actions in schedule order, F(j) waits for j's activation and B(j) for its gradient, every
    action for a free core (list scheduling); a send holds its directed link for 8 L / B
    seconds and lands `latency_s` later; compute overlaps sends. The step ends when the last
    action finished and the last message landed, plus each stage's optimizer step after its
    last action and its last send. A fractional core count c (ranks time-sharing a machine
    whose other jobs hold part of it) is the linear interpolation between floor(c) and
    ceil(c) cores. This is how `frugal pipeline bench` replays its measured runs.

    Args:
        schedule: A registered schedule: "gpipe" or "1f1b".
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
            stage.

    Returns:
        The step time and busy times.

    Raises:
        ValueError: If the lengths disagree, num_cores < 1, or the schedule deadlocks.

    References:
        Fine-tuning Language Models over Slow Networks using Activation Compression with
        Guarantees, NeurIPS 2022, arXiv 2206.01299 (the pipelined setting it speeds up).
    """
    p = len(forward_s)
    if len(backward_s) != p or len(activation_bytes) != p - 1 or len(gradient_bytes) != p - 1:
        raise ValueError(
            f"{p} stages need {p} backward times and {p - 1} rows of activation and gradient bytes"
        )
    if num_cores is not None and not num_cores >= 1:
        raise ValueError(f"num_cores={num_cores} must be >= 1 (or None for one per stage)")

    def run(cores: int) -> SimulatedStep:
        timeline = _simulate(
            np.array([forward_s], dtype=np.float64),
            np.array([backward_s], dtype=np.float64),
            np.arange(p, dtype=np.int64)[None, :],
            forward_bytes=lambda j, i, m: activation_bytes[i][m],
            backward_bytes=lambda j, i, m: gradient_bytes[i - 1][m],
            delay_s_NN=np.full((p, p), latency_s),
            bandwidth_bytes_per_s_NN=np.full((p, p), bandwidth_bits_per_s / _BITS_PER_BYTE),
            host_N=np.zeros(p, dtype=np.int64),
            nic_bytes_per_s_N=np.full(p, math.inf),
            microbatches_J=np.array([num_microbatches], dtype=np.int64),
            schedule=schedule,
            latency_holds_link=False,
            cores_H=np.array([cores], dtype=np.int64),
        )
        end = max(float(timeline.last_op.max()), float(timeline.landed.max()))
        if optimizer_s is not None:
            # A stage steps its optimizer once its sends have landed (the runtime waits on them).
            sent = np.maximum(timeline.last_op[0], timeline.landed[0])
            end = max(end, float((sent + np.asarray(optimizer_s, dtype=np.float64)).max()))
        busy = tuple(num_microbatches * (forward_s[s] + backward_s[s]) for s in range(p))
        return SimulatedStep(end, busy, timeline.link_busy_s)

    if num_cores is None:
        return run(p)
    low = run(math.floor(num_cores))
    weight = num_cores - math.floor(num_cores)
    if weight == 0:
        return low
    high = run(math.ceil(num_cores))
    return SimulatedStep(
        (1 - weight) * low.step_time_s + weight * high.step_time_s,
        low.stage_busy_s,
        low.link_busy_s,
    )
