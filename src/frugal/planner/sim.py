"""A deterministic discrete-event simulator of pipeline x data-parallel training iterations.

The analytic `iteration` objective (`frugal.planner.iteration`) scores candidates inside the
search; this simulator scores a final plan op by op. Each device runs its stage's operations in
schedule order (GPipe: every forward, then every backward; 1F1B: warm-up forwards, then one
forward / one backward, then cool-down backwards). A forward of micro-batch m at stage i waits
for the activation from stage i-1, a backward for the gradient from stage i+1. Every message
queues, first come first served, on three resources: its directed link, the sender host's NIC
(out) and the receiver host's NIC (in), when the two devices sit on different hosts. It starts
when all three are free, arrives `bytes / link bandwidth + delay` later, holds its link for
`bytes / link bandwidth` (the delay is propagation and overlaps the next message, as in
`frugal.comm.link`'s shaper; with `latency_holds_link` the link is held until the arrival, a
stop-and-wait transport) and each NIC for `bytes / NIC capacity`, so n messages through one NIC
of capacity C take at least n bytes / C (FIFO sharing).
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
from dataclasses import dataclass

import numpy as np

from frugal._typing import F64, I64
from frugal.parallel.schedule import build_schedule
from frugal.planner.iteration import WorkloadConfig, accumulation_steps, stage_collective
from frugal.planner.topology import Topology

__all__ = ["SimResult", "simulate_iteration", "simulate_pipelines"]


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
    num_replicas, num_stages = mesh_JI.shape
    for label, array in (("forward_s_JI", forward_s_JI), ("backward_s_JI", backward_s_JI)):
        if array.shape != mesh_JI.shape:
            raise ValueError(f"{label} has shape {array.shape}, expected {mesh_JI.shape}")
        if (array < 0).any() or not np.isfinite(array).all():
            raise ValueError(f"{label} must be finite and >= 0")
    if microbatches_J.shape != (num_replicas,) or (microbatches_J < 1).any():
        raise ValueError(f"microbatches_J={microbatches_J} must hold {num_replicas} counts >= 1")
    bwd_bytes = message_bytes if backward_message_bytes is None else backward_message_bytes
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
    nic_out_free: dict[int, float] = {}
    nic_in_free: dict[int, float] = {}
    last_bwd = np.zeros((num_replicas, num_stages))
    end = np.zeros(num_replicas)
    events: list[tuple[float, int, int, int, int, int, int]] = []
    sequence = 0

    def ready_time(j: int, i: int) -> float | None:
        """When the next op of (j, i) may start, or None while an input is missing."""
        if position[j, i] >= len(orders[j][i]):
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

    def try_start(j: int, i: int) -> None:
        nonlocal sequence
        start = ready_time(j, i)
        if start is None or device_free[j, i] < 0:  # < 0: an op is running
            return
        kind, m = orders[j][i][position[j, i]]
        duration = forward_s_JI[j, i] if kind == _FWD else backward_s_JI[j, i]
        device_free[j, i] = -1.0
        heapq.heappush(events, (start + duration, sequence, 0, j, i, kind, m))
        sequence += 1

    def send(t: float, j: int, src_stage: int, dst_stage: int, kind: int, m: int) -> None:
        nonlocal sequence
        a, b = int(mesh_JI[j, src_stage]), int(mesh_JI[j, dst_stage])
        size = message_bytes if kind == _FWD else bwd_bytes
        rate = float(bandwidth_bytes_per_s_NN[a, b])
        cross_host = host_N[a] != host_N[b]
        start = max(t, link_free.get((a, b), 0.0))
        if cross_host:
            start = max(start, nic_out_free.get(int(host_N[a]), 0.0))
            start = max(start, nic_in_free.get(int(host_N[b]), 0.0))
        arrival = start + size / rate + float(delay_s_NN[a, b])
        # The link is busy for the transfer; the delay is propagation, which the next message's
        # transfer overlaps (the link shaper's and tc netem's semantics), unless the transport
        # is stop-and-wait. Each NIC is busy only for its own share.
        link_free[(a, b)] = arrival if latency_holds_link else start + size / rate
        if cross_host:
            host_a, host_b = int(host_N[a]), int(host_N[b])
            nic_out_free[host_a] = start + size / float(nic_bytes_per_s_N[a])
            nic_in_free[host_b] = start + size / float(nic_bytes_per_s_N[b])
        heapq.heappush(events, (arrival, sequence, 1, j, dst_stage, kind, m))
        sequence += 1

    for j in range(num_replicas):
        try_start(j, 0)
    while events:
        t, _, event, j, i, kind, m = heapq.heappop(events)
        if event == 0:  # an op finished on (j, i)
            device_free[j, i] = t
            position[j, i] += 1
            if kind == _FWD:
                fwd_done[(j, i, m)] = t
                if i + 1 < num_stages:
                    send(t, j, i, i + 1, _FWD, m)
            else:
                last_bwd[j, i] = t
                end[j] = max(end[j], t)
                if i > 0:
                    send(t, j, i, i - 1, _BWD, m)
            try_start(j, i)
        else:  # a message arrived at (j, i)
            arrived[(j, i, kind, m)] = t
            try_start(j, i)
    unfinished = [
        (j, i) for j in range(num_replicas) for i in range(num_stages)
        if position[j, i] < len(orders[j][i])
    ]  # fmt: skip
    if unfinished:  # pragma: no cover - the schedules above are deadlock-free
        raise RuntimeError(f"simulation deadlocked at (pipeline, stage) {unfinished[:4]}")
    return end, last_bwd


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
    hosts' NICs cap cross-host messages (`Device.nic_gbps`).

    Args:
        topology: Devices and links.
        mesh_JI: mesh[j][i] = device of pipeline j at stage i.
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
    for i in range(num_stages):
        size = layers[i] * workload.params_per_layer * workload.gradient_bytes_per_value
        name, seconds = stage_collective(mesh_JI[:, i], topology, size, workload.dp_collectives)
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
