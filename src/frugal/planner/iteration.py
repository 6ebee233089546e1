"""The `iteration` objective: seconds per training iteration of a placement (analytic).

Better than the paper's communication-only cost: it adds compute, pipeline fill and drain, the
overlap of data-parallel gradient exchange with the backward pass, and the cheapest collective
per stage group. For pipeline j with stages i (device d = `mesh[j][i]`, l_i layers):

- f_i = l_i tau_f(d), g_i = l_i tau_b(d), tau(d) = tau_ref / speed(d) (forward : backward
  incl. recompute = 1 : 3);
- x_i = alpha(d_i, d_{i+1}) + w / beta(d_i, d_{i+1}): one micro-batch's activation message of
  w bytes (the wire size of the codec) from send to arrival; the link itself is busy for
  o_i = x_i (`message_latency = "serialised"`, the default: the delay is paid per message, as
  NCCL over TCP on the DT-FM testbed) or o_i = w / beta only (`"overlapped"`: the delay
  overlaps the next message's transfer, as in `frugal.comm.link`'s shaper);
- T_fwd(j) = sum_i (f_i + x_i) + (M - 1) max_i max(f_i, o_i); T_bwd alike with g;
  T_pp(j) = A (T_fwd + T_bwd) for A accumulation steps of M micro-batches (GPipe);
- T_coll(i): the cheapest of the paper's sequential peer exchange, a ring all-reduce along the
  best ring of the group (bottleneck-optimal cycle) and a central parameter server;
- stage i's gradients are ready slack_i = sum_{k < i} (g_k + x_k) before stage 0 finishes, so
  T_iter = max_j T_pp(j) + max(0, max_i (T_coll(i) - slack_i)).

- NIC sharing: a cross-host message gets beta_eff = min(beta, NIC_out / n_out, NIC_in / n_in),
  n = the host's concurrent cross-host pipeline messages in that direction.
- NIC sharing in the gradient exchange: every stage's DP group exchanges at once after the
  last backward, so a host's n devices share its NIC: the collectives see cross-host links
  capped at min(beta, NIC(a) / n(a), NIC(b) / n(b)) (`collective_links`).
- TCP window (`WorkloadConfig.tcp_window_bytes` W > 0): every cross-host link's beta is first
  limited to 8 W / RTT, RTT = 2 alpha (`frugal.comm.link.window_limited_bits_per_s`, the
  shaper's formula), for pipeline messages and collectives alike (`window_limited`).

This closed form is GPipe's. `frugal.planner.sim` simulates a plan op by op with link and NIC
queues under GPipe (it reproduces this model) or 1F1B (which overlaps forward and backward
messages: faster on communication-bound placements, slower when messages rival compute).
Units: seconds, bytes, Gbit/s, ms.

References:
    Decentralized Training of Foundation Models in Heterogeneous Environments, NeurIPS 2022,
    arXiv 2206.01288 (scenarios, GPT3-XL workload; the runtime this model predicts).
    GPipe: Efficient Training of Giant Neural Networks using Pipeline Parallelism, NeurIPS 2019,
    arXiv 1811.06965 (fill/drain of a micro-batched pipeline).
"""

from __future__ import annotations

import functools
import itertools
import weakref
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from frugal._typing import F64, I64
from frugal.comm.link import window_limited_bits_per_s
from frugal.config import check_types
from frugal.parallel.codec import (
    KIND_ACTIVATION,
    KIND_GRADIENT,
    CodecSpec,
    mean_message_wire_bytes,
)
from frugal.parallel.plan import DP_COLLECTIVES
from frugal.parallel.schedule import SCHEDULES, build_schedule, peak_in_flight
from frugal.planner.topology import Topology

__all__ = [
    "AUTO",
    "DEFAULT_CODEC_CANDIDATES",
    "IterationCost",
    "WorkloadConfig",
    "accumulation_steps",
    "collective_links",
    "iteration_cost",
    "microbatches_in_flight",
    "stage_collective",
    "stage_memory_gib",
    "window_limited",
]


TAU_REF_S = 0.0206
"""Seconds per layer per micro-batch on a V100, forward + backward + recompute (fp16); fitted to
the DT-FM authors' data-center log through a GPipe model (planner.md, section 6)."""
_BITS_PER_BYTE = 8.0
_GBIT = 1e9
AUTO = "auto"
"""The value of `WorkloadConfig.codec` and `.schedule` that leaves the choice to the planner."""
DEFAULT_CODEC_CANDIDATES = ("fp16", "bf16", "fp32")
"""`codec_candidates` by default: the uncompressed codecs, fp16 first (the DT-FM runs').
"""


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkloadConfig:
    """The training job: GPT3-XL-shaped by default (h 2048, seq 2048, fp16)."""

    num_layers: int = 24
    """Transformer layers L, >= 1."""
    hidden_size: int = 2048
    """h, >= 1."""
    seq_len: int = 2048
    """Tokens per sequence, >= 1."""
    global_batch_size: int = 1024
    """Sequences per iteration over all replicas, >= 1."""
    microbatch_size: int = 1
    """Sequences per micro-batch, >= 1."""
    microbatches_per_step: int = 64
    """Micro-batches per pipeline between two accumulation boundaries (M), >= 1; 0 =
    `build_plan` chooses, among the divisors of the micro-batches a replica runs per
    iteration, the cheapest that fits device memory (the search runs with the largest
    divisor <= 64, the DT-FM runs' M)."""
    codec: str = "fp16"
    """Codec of the pipeline messages (`frugal.parallel.CodecSpec`: fp32, fp16, bf16,
    directq:fwK,bwJ, aqsgd:fwK,bwJ, ...; qK = directq:fwK,bwK:row), or "auto": `build_plan`
    chooses the cheapest of `codec_candidates` for the placement and records it. Each
    direction's message is priced at its exact wire size (128-byte header + payload),
    averaged over the run: AQ-SGD's first visits and every codec's warm-up included (see
    `num_epochs`)."""
    codec_candidates: tuple[str, ...] = DEFAULT_CODEC_CANDIDATES
    """The codecs `codec = "auto"` chooses from (CodecSpec texts). The default holds only
    the uncompressed codecs, whose quality does not depend on the choice; list lossy ones to
    opt in, e.g. ["fp16", "aqsgd:fw2,bw4", "aqsgd:fw4,bw8"] (AQ-SGD's paper reports fp32
    quality at 2-4 bits, but that is a claim about its fine-tuning runs, not yours)."""
    gradient_bytes_per_value: float = 2.0
    """Wire bytes per gradient value in the DP exchange, > 0."""
    tau_ref_s: float = TAU_REF_S
    """Seconds per layer per micro-batch on a speed-1.0 device, > 0."""
    message_latency: Literal["overlapped", "serialised"] = "serialised"
    """How a pipeline message's one-way delay uses its link: "serialised" (default: the link
    is held for delay + bytes / bandwidth per message, as NCCL over TCP on the DT-FM testbed,
    where an added one-way delay of 1 / 5 / 10 ms made a 64 MB send 4 / 25 / 58 ms slower,
    i.e. several delays per message, never overlapped; planner.md, section 3) or "overlapped"
    (the link is busy for bytes / bandwidth and the message arrives one delay later, so
    back-to-back messages overlap their delays: `frugal.comm.link`'s shaper, which `frugal
    plan validate` runs on)."""
    schedule: str = "gpipe"
    """Pipeline schedule the plan runs (`frugal.parallel.schedule`); it sets the activations
    each stage keeps in flight (GPipe: every micro-batch of a step; 1F1B: at most
    num_stages - stage). "auto": `build_plan` prices every registered schedule (GPipe in
    closed form, the others in the event simulator) and records the cheapest that fits."""
    dp_collectives: tuple[str, ...] = DP_COLLECTIVES
    """Gradient exchanges the planner may choose for a stage's DP group (of
    `frugal.parallel.DP_COLLECTIVES`: seq_peer, ring, central_ps). The pipeline runs the one
    the plan records, so restrict this to what the job's DP method can run: `["ring"]` for
    fp16 or powersgd (they all-reduce), `["seq_peer"]` for ef-kbit or qadam (sharded)."""
    num_epochs: int = 1
    """Passes over the training set, >= 1: AQ-SGD sends an example's activation in full on
    its first visit (its buffer is empty) and k-bit deltas on later ones, so its forward
    bytes are the first visit's spread over this many epochs. The default 1 is a
    pretraining run (the default workload: every example seen once, so AQ-SGD's forward
    costs fp32); set the fine-tuning run's epochs to price AQ-SGD's savings."""
    warmup_iterations: int = 0
    """Iterations sent uncompressed first (the pipeline's `warmup_steps`), >= 0; their
    bytes are spread over the run (needs `num_train_samples`)."""
    num_train_samples: int = 0
    """Sequences in one epoch, >= global_batch_size when `warmup_iterations` > 0 (it sets the
    run's length, num_epochs x num_train_samples / global_batch_size iterations); 0 = not
    given."""
    tcp_window_bytes: float = 0.0
    """Largest TCP window of a cross-host connection, bytes, >= 0; 0 = no limit (the links'
    bandwidths as given). A connection moves at most one window per round trip, so each
    cross-host link runs at min(bandwidth, 8 W / (2 x delay)) (`window_limited`). Set it to
    the hosts' receive-window maximum: Linux's default `net.ipv4.tcp_rmem` max is 6291456
    (6 MiB: 503 Mbit/s at 100 ms RTT); a cluster file's measured bandwidths (`frugal plan
    probe`) already include the window, so leave it 0 for those."""

    def __post_init__(self) -> None:
        check_types(self)
        for name in ("num_layers", "hidden_size", "seq_len", "global_batch_size",
                     "microbatch_size", "num_epochs"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.microbatches_per_step < 0:
            raise ValueError(
                f"microbatches_per_step={self.microbatches_per_step} must be >= 1, or 0 to let "
                "the planner choose"
            )
        if min(self.gradient_bytes_per_value, self.tau_ref_s) <= 0:
            raise ValueError("gradient_bytes_per_value and tau_ref_s must be > 0")
        if not self.codec_candidates:
            raise ValueError(
                'codec_candidates is empty; list the codecs codec = "auto" may choose, e.g. '
                '["fp16", "aqsgd:fw2,bw4"]'
            )
        for codec in self.codec_candidates:
            CodecSpec.parse(codec)
        if self.codec != AUTO:
            CodecSpec.parse(self.codec)
        if self.schedule != AUTO:
            SCHEDULES.check(self.schedule)
        if self.tcp_window_bytes < 0:
            raise ValueError(
                f"tcp_window_bytes={self.tcp_window_bytes} must be >= 0 (0 = no window limit; "
                "Linux's default tcp_rmem max is 6291456)"
            )
        if self.warmup_iterations < 0 or self.num_train_samples < 0:
            raise ValueError(
                f"warmup_iterations={self.warmup_iterations} and num_train_samples="
                f"{self.num_train_samples} must be >= 0"
            )
        if self.warmup_iterations and self.num_train_samples < self.global_batch_size:
            raise ValueError(
                f"warmup_iterations={self.warmup_iterations} needs the epoch's length to spread "
                f"its bytes over the run: set num_train_samples (sequences per epoch, >= "
                f"global_batch_size={self.global_batch_size}), or warmup_iterations=0"
            )
        unknown = [c for c in self.dp_collectives if c not in DP_COLLECTIVES]
        if not self.dp_collectives or unknown:
            raise ValueError(
                f"dp_collectives={list(self.dp_collectives)}: give one or more of "
                f'{", ".join(DP_COLLECTIVES)} (e.g. dp_collectives = ["ring"])'
            )

    @property
    def params_per_layer(self) -> float:
        """12 h^2 (attention 4 h^2 + MLP 8 h^2)."""
        return 12.0 * self.hidden_size**2

    @property
    def message_fractions(self) -> tuple[float, float]:
        """(first-visit, warm-up) shares of the run's pipeline messages.

        With W warm-up iterations, I = num_train_samples / global_batch_size iterations per
        epoch and E epochs (N = E I in all): the warm-up is min(W, N) / N of the messages
        and fills AQ-SGD's buffers, so the first visits are the rest of the first epoch,
        max(0, I - W) / N; without warm-up they are 1 / E.
        """
        if not self.warmup_iterations:
            return 1.0 / self.num_epochs, 0.0
        per_epoch = self.num_train_samples / self.global_batch_size
        total = self.num_epochs * per_epoch
        warm = min(self.warmup_iterations, total)
        return max(0.0, per_epoch - warm) / total, warm / total

    @property
    def activation_bytes(self) -> float:
        """Mean wire bytes of one micro-batch's activation message (b s tokens x h).

        Under `codec`, over the run (`message_fractions`).

        Raises:
            ValueError: If `codec` is "auto" (`build_plan` resolves it first).
        """
        return self._mean_bytes(KIND_ACTIVATION)

    @property
    def gradient_bytes(self) -> float:
        """Mean wire bytes of one micro-batch's gradient message (the backward direction).

        Raises:
            ValueError: If `codec` is "auto" (`build_plan` resolves it first).
        """
        return self._mean_bytes(KIND_GRADIENT)

    def _mean_bytes(self, kind: int) -> float:
        if self.codec == AUTO:
            raise ValueError(
                'codec = "auto" has no wire size: build_plan chooses the codec first; price a '
                "WorkloadConfig with a codec of codec_candidates"
            )
        shape = (self.microbatch_size, self.seq_len, self.hidden_size)
        return _mean_message_bytes(self.codec, kind, shape, *self.message_fractions)


@functools.lru_cache(maxsize=256)
def _mean_message_bytes(
    codec: str, kind: int, shape: tuple[int, int, int], first_visit: float, warmup: float
) -> float:
    return mean_message_wire_bytes(
        CodecSpec.parse(codec), kind, shape, first_visit_fraction=first_visit,
        warmup_fraction=warmup,
    )  # fmt: skip


_GIB = float(1 << 30)
_TRAINING_BYTES_PER_PARAM = 4.0  # fp16 weights + fp16 gradients on the GPU (fp32 master on CPU)
_ACTIVATION_BUFFERS = 4  # per micro-batch: checkpointed input, send, receive, recompute
_ACTIVATION_VALUE_BYTES = 2.0  # fp16 activations, as in the DT-FM runs (planner.md, section 6)


def microbatches_in_flight(workload: WorkloadConfig, stage: int, num_stages: int) -> int:
    """Micro-batches whose activations stage `stage` holds at once under the workload's schedule.

    GPipe runs every forward of a step before any backward, so each stage holds all M
    micro-batches; 1F1B (PipeDream-Flush) starts the backward of micro-batch k after the warm-up
    forwards, so stage i holds at most min(num_stages - i, M).

    Raises:
        ValueError: If stage is not in [0, num_stages).

    References:
        GPipe, NeurIPS 2019, arXiv 1811.06965; Memory-Efficient Pipeline-Parallel DNN Training
        (PipeDream-Flush / 1F1B), ICML 2021, arXiv 2006.09503 (section 3.1).
    """
    if not 0 <= stage < num_stages:
        raise ValueError(f"stage={stage} must lie in [0, num_stages={num_stages})")
    m = workload.microbatches_per_step
    return peak_in_flight(build_schedule(workload.schedule, num_stages, stage, m))


def stage_memory_gib(
    workload: WorkloadConfig, layers: int, stage: int = 0, num_stages: int = 1
) -> float:
    """GPU memory stage `stage` (of `num_stages`, with `layers` layers) needs, GiB.

    Weights and gradients in fp16 (4 B per parameter; fp32 master weights live on the CPU, as in
    the DT-FM runs) plus, with full recomputation, four activation-sized buffers (checkpointed
    input, send, receive, recompute) per micro-batch in flight (`microbatches_in_flight`: M under
    GPipe, min(num_stages - stage, M) under 1F1B). At 3 layers and 64 micro-batches (GPipe):
    0.56 + 2.0 GiB (the brief's 1.73 GB + 3 GB at 96 micro-batches is of this order).

    Raises:
        ValueError: If stage is not in [0, num_stages).
    """
    weights = layers * workload.params_per_layer * _TRAINING_BYTES_PER_PARAM
    in_flight = microbatches_in_flight(workload, stage, num_stages)
    # The buffers hold activations in the compute dtype (fp16), whatever the link's codec.
    values = workload.microbatch_size * workload.seq_len * workload.hidden_size
    activations = in_flight * values * _ACTIVATION_VALUE_BYTES * _ACTIVATION_BUFFERS
    return (weights + activations) / _GIB


@dataclass(frozen=True, slots=True)
class IterationCost:
    """Predicted seconds per iteration and its parts."""

    total_s: float
    pipeline_s: float
    """max_j T_pp(j)."""
    dp_exposed_s: float
    """Gradient exchange not hidden behind the backward pass."""
    collective: tuple[str, ...]
    """Chosen collective per stage: seq_peer, ring or central_ps."""
    microbatches: tuple[int, ...] = ()
    """Micro-batches per accumulation step of each pipeline."""
    tiebreak_s: float = 0.0
    """Mean over pipelines of T_pp(j) plus mean over stages of the exposed collective time: it
    falls when a pipeline or stage that is not the slowest improves (a search tie-breaker on
    plateaus of the max terms)."""


_RING_EDGES: dict[int, I64] = {}


def _ring_edges(k: int) -> I64:
    """Every ring through K members starting at member 0, as flat edge indices.

    Returns (K, R) indices a K + b of each ring's directed edges (a -> b) into a K x K
    matrix, R = (K-1)! rings (edge-major, so reductions over a ring's edges run along the
    contiguous axis).
    """
    if k not in _RING_EDGES:
        perms = np.array(list(itertools.permutations(range(1, k))), dtype=np.int64).reshape(
            -1, k - 1
        )
        rings = np.concatenate([np.zeros((len(perms), 1), dtype=np.int64), perms], axis=1)
        _RING_EDGES[k] = np.ascontiguousarray((rings * k + np.roll(rings, -1, axis=1)).T)
    return _RING_EDGES[k]


def _ring_seconds(members: I64, topology: Topology, size_bytes: float) -> float:
    """Ring all-reduce on the best ring: 2 (K-1)/K size over the slowest edge + 2 (K-1) delays.

    Every ring is scored (vectorised gather on the group's K x K link matrices; (K-1)! rings,
    K <= 8); larger groups keep their order.
    """
    k = len(members)
    if k == 1:
        return 0.0
    if k <= 8:
        edges = _ring_edges(k)
    else:
        order = np.arange(k, dtype=np.int64)
        edges = (order * k + np.roll(order, -1))[:, None]
    sub = np.ix_(members, members)
    bandwidth = topology.bandwidth_gbps[sub].ravel()[edges].min(axis=0)
    delay = topology.delay_ms[sub].ravel()[edges].max(axis=0) / 1000.0
    seconds = 2 * (k - 1) * (size_bytes / k * _BITS_PER_BYTE / (bandwidth * _GBIT) + delay)
    return float(seconds.min())


def _seq_peer_seconds(members: I64, topology: Topology, size_bytes: float) -> float:
    """The paper's exchange: each member sends its 1/K slice to every peer in turn, twice."""
    k = len(members)
    sub_delay = topology.delay_ms[np.ix_(members, members)] / 1000.0
    sub_bw = topology.bandwidth_gbps[np.ix_(members, members)]
    with np.errstate(divide="ignore"):
        pair = 2.0 * (sub_delay + size_bytes / k * _BITS_PER_BYTE / (sub_bw * _GBIT))
    np.fill_diagonal(pair, 0.0)
    return float(pair.sum(axis=1).max())


def _central_ps_seconds(members: I64, topology: Topology, size_bytes: float) -> float:
    """A parameter server on the best member: everyone sends and receives the full gradient."""
    k = len(members)
    if k == 1:
        return 0.0
    best = np.inf
    for server in members:
        others = [m for m in members if m != server]
        slowest = max(
            topology.delay_ms[m, server] / 1000.0
            + size_bytes * _BITS_PER_BYTE / (topology.bandwidth_gbps[m, server] * _GBIT)
            for m in others
        )
        # The server's link is shared by K-1 uploads and K-1 downloads.
        incoming = (
            (k - 1)
            * size_bytes
            * _BITS_PER_BYTE
            / (min(topology.bandwidth_gbps[m, server] for m in others) * _GBIT)
        )
        best = min(best, 2 * max(slowest, incoming))
    return float(best)


_WINDOW_LIMITED: weakref.WeakKeyDictionary[Topology, dict[float, Topology]] = (
    weakref.WeakKeyDictionary()
)


def window_limited(topology: Topology, tcp_window_bytes: float) -> Topology:
    """`topology` with every cross-host link limited by a TCP window of `tcp_window_bytes`.

    beta'(a, b) = `window_limited_bits_per_s`(beta, 2 delay(a, b), W) for devices on
    different hosts (RTT assumed twice the one-way delay, as `frugal.comm.link`'s shaper);
    links inside a host are kept. W = 0 returns `topology` itself. Results are cached per
    topology object, so a search pays for the matrix once.

    Raises:
        ValueError: If tcp_window_bytes < 0.
    """
    if tcp_window_bytes < 0:
        raise ValueError(f"tcp_window_bytes={tcp_window_bytes} must be >= 0 (0 = no limit)")
    if tcp_window_bytes == 0:
        return topology
    cache = _WINDOW_LIMITED.setdefault(topology, {})
    if tcp_window_bytes not in cache:
        hosts = [d.host for d in topology.devices]
        bandwidth = topology.bandwidth_gbps.astype(np.float64)
        for a, b in itertools.permutations(range(topology.num_devices), 2):
            if hosts[a] != hosts[b]:
                bandwidth[a, b] = (
                    window_limited_bits_per_s(
                        bandwidth[a, b] * _GBIT,
                        2.0 * topology.delay_ms[a, b] / 1000.0,
                        tcp_window_bytes,
                    )
                    / _GBIT
                )
        cache[tcp_window_bytes] = replace(topology, bandwidth_gbps=bandwidth)
    return cache[tcp_window_bytes]


_COLLECTIVE_LINKS: weakref.WeakKeyDictionary[Topology, Topology] = weakref.WeakKeyDictionary()


def collective_links(topology: Topology) -> Topology:
    """The links the DP collectives see: cross-host bandwidths shared by the hosts' devices.

    beta'(a, b) = min(beta, NIC(a) / n(a), NIC(b) / n(b)) for devices on different hosts, n =
    the devices of that host (each stage's group exchanges at the same time, after the last
    backward, so every device of a host sends and receives through its NIC at once). Without
    NIC caps (inf, the default) this is `topology` itself. Cached per topology object.
    """
    if topology not in _COLLECTIVE_LINKS:
        hosts = [d.host for d in topology.devices]
        nic = np.array([d.nic_gbps for d in topology.devices])
        if not np.isfinite(nic).any():
            _COLLECTIVE_LINKS[topology] = topology
        else:
            count = {h: hosts.count(h) for h in hosts}
            share = nic / np.array([count[h] for h in hosts])
            cross = np.array(hosts)[:, None] != np.array(hosts)[None, :]
            capped = np.minimum(topology.bandwidth_gbps, np.minimum.outer(share, share))
            bandwidth = np.where(cross, capped, topology.bandwidth_gbps)
            _COLLECTIVE_LINKS[topology] = replace(topology, bandwidth_gbps=bandwidth)
    return _COLLECTIVE_LINKS[topology]


def _effective_gbps(topology: Topology, src: I64, dst: I64) -> F64:
    """Bandwidth of concurrent messages src -> dst (same shapes) after NIC sharing.

    beta_eff = min(beta, NIC_out(host src) / n_out, NIC_in(host dst) / n_in), where n counts the
    concurrent cross-host messages of that host and direction among all pairs given (every
    pipeline edge sends at once in the steady state). Same-host messages skip the NIC.
    """
    hosts = {name: k for k, name in enumerate(dict.fromkeys(d.host for d in topology.devices))}
    host_N = np.array([hosts[d.host] for d in topology.devices], dtype=np.int64)
    nic_N = np.array([d.nic_gbps for d in topology.devices])
    beta = topology.bandwidth_gbps[src, dst].astype(np.float64)
    cross = host_N[src] != host_N[dst]
    if not cross.any() or not np.isfinite(nic_N).any():
        return beta
    n_out = np.bincount(host_N[src][cross], minlength=len(hosts))
    n_in = np.bincount(host_N[dst][cross], minlength=len(hosts))
    with np.errstate(divide="ignore"):
        cap = np.minimum(
            nic_N[src] / np.maximum(n_out[host_N[src]], 1),
            nic_N[dst] / np.maximum(n_in[host_N[dst]], 1),
        )
    return np.where(cross, np.minimum(beta, cap), beta)


def stage_collective(
    members: I64,
    topology: Topology,
    size_bytes: float,
    allowed: tuple[str, ...] = DP_COLLECTIVES,
) -> tuple[str, float]:
    """The cheapest gradient exchange of one stage's DP group and its seconds.

    Candidates: the paper's sequential peer exchange (`seq_peer`), a ring all-reduce on the
    best ring (`ring`) and a central parameter server on the best member (`central_ps`); a
    tie goes to the first of them in that order.

    Args:
        members: Device ids of the group, shape (K,).
        topology: Devices and links.
        size_bytes: Gradient bytes each member holds.
        allowed: The candidates to choose from (`WorkloadConfig.dp_collectives`).

    Returns:
        (name, seconds) of the cheapest allowed collective.
    """
    price = {
        "seq_peer": _seq_peer_seconds,
        "ring": _ring_seconds,
        "central_ps": _central_ps_seconds,
    }
    options = {
        name: price[name](members, topology, size_bytes)
        for name in DP_COLLECTIVES
        if name in allowed
    }
    name = min(options, key=lambda key: options[key])
    return name, options[name]


def _balance(fill: F64, slope: F64, total: int) -> I64:
    """Integer micro-batch counts (>= 1, summing to `total`) minimising max fill + (m-1) slope.

    Greedy: each next micro-batch goes to the pipeline that would finish it earliest, which is
    optimal for this max of increasing linear functions.
    """
    import heapq

    counts = np.ones(len(fill), dtype=np.int64)
    heap = [(float(fill[j] + slope[j]), j) for j in range(len(fill))]
    heapq.heapify(heap)
    for _ in range(total - len(fill)):
        _, j = heapq.heappop(heap)
        counts[j] += 1
        heapq.heappush(heap, (float(fill[j] + counts[j] * slope[j]), j))
    return counts


def accumulation_steps(
    mesh_JI: I64, layers_per_stage: tuple[int, ...], workload: WorkloadConfig
) -> int:
    """Accumulation steps A per iteration, after checking the mesh, layers and batch agree.

    Raises:
        ValueError: If layers_per_stage does not have one entry per stage summing to
            num_layers, or the global batch does not split into whole steps per replica.
    """
    num_replicas, num_stages = mesh_JI.shape
    if workload.microbatches_per_step == 0:
        raise ValueError(
            "microbatches_per_step=0 (the planner chooses) has no accumulation steps: "
            "build_plan chooses it first; price a WorkloadConfig with microbatches_per_step >= 1"
        )
    if len(layers_per_stage) != num_stages or sum(layers_per_stage) != workload.num_layers:
        raise ValueError(
            f"layers_per_stage={layers_per_stage} must have {num_stages} entries summing to "
            f"num_layers={workload.num_layers}"
        )
    per_replica = workload.global_batch_size // num_replicas
    step = workload.microbatch_size * workload.microbatches_per_step
    if per_replica * num_replicas != workload.global_batch_size or per_replica % step:
        multiple = num_replicas * step
        raise ValueError(
            f"model.global_batch_size={workload.global_batch_size} must split into "
            f"{num_replicas} replicas of whole steps of {step} sequences (microbatch_size "
            f"{workload.microbatch_size} x microbatches_per_step "
            f"{workload.microbatches_per_step}): use a multiple of {multiple}, e.g. "
            f"{max(multiple, round(workload.global_batch_size / multiple) * multiple)}"
        )
    return int(per_replica // step)


def iteration_cost(
    topology: Topology,
    mesh_JI: I64,
    layers_per_stage: tuple[int, ...],
    workload: WorkloadConfig,
    *,
    balance_microbatches: bool = False,
    collective_cache: dict[tuple[bytes, float], tuple[str, float]] | None = None,
) -> IterationCost:
    """Predict seconds per iteration of a placement (see the module docstring).

    With `balance_microbatches`, the J x M micro-batches of a step are shared between the
    pipelines so that the slowest finishes first possible (faster pipelines take more; the
    runtime then weights each replica's gradient by its share), else each takes M.

    Args:
        topology: Devices and links.
        mesh_JI: `mesh[j][i]` = device of pipeline j at stage i.
        layers_per_stage: l_i per stage (sum = num_layers).
        workload: The training job.
        balance_microbatches: Share micro-batches in proportion to pipeline speed.
        collective_cache: A dict owned by the caller (one per topology and workload) that
            memoises each stage group's collective by its member set, so a search re-scores
            only the groups a move changed.

    Returns:
        The prediction and its parts.

    Raises:
        ValueError: If the mesh and layers disagree in length or the batch does not split.

    Shapes:
        mesh_JI: (J replicas, I stages).
    """
    num_replicas, num_stages = mesh_JI.shape
    accumulation = accumulation_steps(mesh_JI, layers_per_stage, workload)
    topology = window_limited(topology, workload.tcp_window_bytes)
    m = workload.microbatches_per_step
    layers = np.array(layers_per_stage, dtype=np.float64)
    speed = np.array([d.speed for d in topology.devices])
    tau = workload.tau_ref_s / speed[mesh_JI]  # (J, I)
    f = layers * tau / 4.0  # forward : backward (with recompute) = 1 : 3
    g = layers * tau * 3.0 / 4.0
    send, recv = mesh_JI[:, :-1], mesh_JI[:, 1:]
    bits = workload.activation_bytes * _BITS_PER_BYTE
    bits_back = workload.gradient_bytes * _BITS_PER_BYTE
    x = np.zeros_like(f)  # forward: activations stage i -> i+1
    xb = np.zeros_like(f)  # backward: gradients stage i+1 -> i (the reverse link)
    if num_stages > 1:
        x[:, :-1] = topology.delay_ms[send, recv] / 1000.0 + bits / (
            _effective_gbps(topology, send, recv) * _GBIT
        )
        xb[:, :-1] = topology.delay_ms[recv, send] / 1000.0 + bits_back / (
            _effective_gbps(topology, recv, send) * _GBIT
        )
    fill = (f + x).sum(axis=1) + (g + xb).sum(axis=1)  # one micro-batch through and back
    if workload.message_latency == "overlapped" and num_stages > 1:
        # Back-to-back messages overlap their delays: a link is busy for the transfer only.
        o, ob = np.zeros_like(f), np.zeros_like(f)
        o[:, :-1] = x[:, :-1] - topology.delay_ms[send, recv] / 1000.0
        ob[:, :-1] = xb[:, :-1] - topology.delay_ms[recv, send] / 1000.0
    else:
        o, ob = x, xb
    slope = np.maximum(f, o).max(axis=1) + np.maximum(g, ob).max(axis=1)  # each further one
    if balance_microbatches:
        counts = _balance(fill, slope, num_replicas * m)
    else:
        counts = np.full(num_replicas, m, dtype=np.int64)
    pipeline_J = accumulation * (fill + (counts - 1) * slope)
    pipeline = float(pipeline_J.max())
    exposed_I = np.zeros(num_stages)
    exposed = 0.0
    choices = []
    shared = collective_links(topology)
    for i in range(num_stages):
        size = layers[i] * workload.params_per_layer * workload.gradient_bytes_per_value
        if collective_cache is None:
            name, seconds = stage_collective(mesh_JI[:, i], shared, size, workload.dp_collectives)
        else:  # a group's collective depends on its member set only: re-score changed groups
            key = (np.sort(mesh_JI[:, i]).tobytes(), size)
            if key not in collective_cache:
                collective_cache[key] = stage_collective(
                    mesh_JI[:, i], shared, size, workload.dp_collectives
                )
            name, seconds = collective_cache[key]
        choices.append(name)
        slack = float((g[:, :i] + xb[:, :i]).sum(axis=1).min()) if i else 0.0
        exposed = max(exposed, seconds - slack)
        exposed_I[i] = max(0.0, seconds - slack)
    return IterationCost(
        total_s=pipeline + exposed,
        pipeline_s=pipeline,
        dp_exposed_s=exposed,
        microbatches=tuple(int(c) for c in counts),
        tiebreak_s=float(pipeline_J.mean() + exposed_I.mean()),
        collective=tuple(choices),
    )
