"""`frugal plan validate`: how well the planner's cost models predict a real pipeline run.

A small heterogeneous cluster (sites of a few ranks, fast links inside a site, slow links
between sites, bandwidths in Mbit/s so that communication matters next to the tiny GPT's CPU
compute) is planned with several methods (`ours`, `megatron_default`, `megatron_random`, and the
worst placement found by enumeration); each plan is executed for a few steps under torchrun
(gloo on 127.0.0.1) with every directed pair of ranks shaped as the topology says
(`frugal.comm.link`), and the DP all-reduce shaped as a ring over the group's slowest link.
Per method: the analytic `iteration` prediction, the event simulation (`frugal.planner.sim`,
GPipe), and the measured median seconds per iteration after warm-up (max over ranks).

The workload the planner prices is the tiny GPT job itself: its layers, hidden size, context,
micro-batch size and count, the fp32 activation codec, gradient bytes per value calibrated from
the model's real parameter count, the link shaper's message semantics (a message's delay
overlaps the next one's transfer: `message_latency = "overlapped"`), and tau_ref_s (forward +
backward seconds per layer per micro-batch) measured in this process on one thread. Co-located
ranks share the machine's cores: with `compute_sharing="cores"` each rank is priced at speed
min(1, cores / world_size) (all ranks computing at once, a pessimistic bound); "none" prices
them at full speed. Both predictions are reported (`predicted_*` under the chosen model,
`*_unshared_s` under the other bound). The machine may also be loaded by other work, which no
a-priori model sees: each method runs `rounds` times round-robin and keeps its fastest launch,
and a `replay_*` prediction re-prices the plan with each rank's speed taken from its own
measured median forward/backward seconds, separating the compute calibration's error from the
schedule and network model's.

Emulated hosts, NICs and TCP windows (`ranks_per_host`, `nic_mbps`, `tcp_window_bytes`):
several ranks may sit on one emulated host; messages between hosts then also queue on both
hosts' NICs, shared across the host's processes (`frugal.comm.link.HostNics`, the rule of the
simulator's NIC queues), and every link between hosts is limited to 8 window / (2 latency),
the same `frugal.comm.link.window_limited_bits_per_s` the planner's models use
(`WorkloadConfig.tcp_window_bytes`). `site_links = "world"` gives the sites the world
scenario's relative delays and bandwidths (`WORLD_SITES`), scaled so that the slowest delay
is `inter_site_latency_ms` and the fastest bandwidth `inter_site_mbps`. `sixteen_ranks`
builds the full tier's 16-rank clusters (two sites, world-shaped); the summary reports the
speed-ups of ours over Megatron's orders, predicted and measured, side by side.

The worst placement's Plan carries method "random" (the Plan format names planner searches
only); its row says "worst" (clusters of at most 8 ranks: it enumerates every placement).

References:
    Decentralized Training of Foundation Models in Heterogeneous Environments, NeurIPS 2022,
    arXiv 2206.01288 (the cost model and placements validated here).
    GPipe: Efficient Training of Giant Neural Networks using Pipeline Parallelism, NeurIPS 2019,
    arXiv 1811.06965 (the schedule executed and simulated).
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from frugal.bench.harness import (
    BenchResult,
    Preset,
    Progress,
    median,
    median_after_warmup,
    write_bench_results,
)
from frugal.bench.planner import PlanValidationSummary
from frugal.config import check_types
from frugal.pipeline.models import TinyGPT, TinyGPTConfig
from frugal.pipeline.train import PipelineTrainConfig, RunSpec, launch_torchrun
from frugal.planner.iteration import WorkloadConfig, iteration_cost
from frugal.planner.plan import Plan, PlannerConfig, build_plan
from frugal.planner.scenarios import city_links
from frugal.planner.sim import simulate_iteration
from frugal.planner.topology import Device, Topology

__all__ = [
    "WORLD_SITES",
    "Config",
    "PlanValidationSummary",
    "build_topology",
    "host_rows",
    "link_rows",
    "measure_tau_s",
    "preset",
    "quick",
    "ranking_agrees",
    "run_plan_validation",
    "sixteen_ranks",
    "workload_for",
    "worst_plan",
]

Method = Literal["ours", "megatron_default", "megatron_random", "worst"]

WORLD_SITES = ("Oregon", "Virginia", "Tokyo", "Frankfurt", "Ohio", "Seoul", "London", "Ireland")
"""The world scenario's cities in the order `site_links = "world"` takes them (the first
num_sites; four span three continents)."""
_MAX_WORLD_SIZE = 16
_MAX_WORST_WORLD_SIZE = 8  # "worst" enumerates all N! placements


@dataclass(frozen=True, kw_only=True, slots=True)
class Config:
    """A validation run (`frugal plan validate`)."""

    num_sites: int = 2
    """Sites, >= 2; rank r sits at site r // ranks_per_site."""
    ranks_per_site: int = 4
    """Ranks per site, >= 1; world size = num_sites x ranks_per_site <= 16 (default 8
    processes: 4 stages x 2 replicas, the brief's validation grid)."""
    ranks_per_host: int = 1
    """Ranks per emulated host (divides ranks_per_site); they share the host's NIC."""
    nic_mbps: float = 0.0
    """Each host's NIC capacity per direction, Mbit/s, >= 0 (0 = no NIC cap)."""
    tcp_window_bytes: float = 0.0
    """TCP window of every link between hosts, bytes, >= 0 (0 = no limit)."""
    site_links: Literal["uniform", "world"] = "uniform"
    """Links between sites: all alike (inter_site_*), or the world scenario's relative delays
    and bandwidths between `WORLD_SITES` (num_sites <= 8), scaled to inter_site_*."""
    num_stages: int = 4
    """Pipeline stages D_pp (divides the world size)."""
    intra_site_mbps: float = 200.0
    """Bandwidth between ranks of one site, Mbit/s, > 0."""
    inter_site_mbps: float = 10.0
    """Bandwidth between sites, Mbit/s, > 0."""
    intra_site_latency_ms: float = 1.0
    """One-way latency inside a site, ms, >= 0."""
    inter_site_latency_ms: float = 20.0
    """One-way latency between sites, ms, >= 0."""
    gpt: TinyGPTConfig = field(default_factory=TinyGPTConfig)
    """The tiny GPT (its num_layers are the workload's layers)."""
    micro_batch_size: int = 8
    """Sequences per micro-batch, >= 1."""
    num_microbatches: int = 4
    """Micro-batches per replica per step (M), >= 1."""
    methods: tuple[Method, ...] = ("ours", "megatron_default", "megatron_random", "worst")
    """Placements to execute (worst = the highest predicted cost over all placements)."""
    seed: int = 0
    """Seed of the planner and of megatron_random's rank order."""
    steps: int = 8
    """Steps per method, > warmup_steps."""
    warmup_steps: int = 2
    """Steps not measured."""
    calibrate_repeats: int = 7
    """Timed forward+backward repeats for tau_ref_s (median), >= 3."""
    compute_sharing: Literal["cores", "none"] = "cores"
    """How co-located ranks share the CPU in the prediction (see the module docstring)."""
    cores: int = 0
    """Cores the ranks share (0 = os.cpu_count())."""
    rounds: int = 3
    """Launches per method (round-robin over methods); each keeps its fastest, >= 1."""
    timeout_s: float = 300.0
    """Limit of each torchrun launch, seconds."""

    def __post_init__(self) -> None:
        check_types(self)
        world = self.num_sites * self.ranks_per_site
        if self.num_sites < 2 or self.ranks_per_site < 1 or world > _MAX_WORLD_SIZE:
            raise ValueError(
                f"num_sites={self.num_sites} must be >= 2 and ranks_per_site="
                f"{self.ranks_per_site} >= 1 with at most {_MAX_WORLD_SIZE} ranks (got {world})"
            )
        if "worst" in self.methods and world > _MAX_WORST_WORLD_SIZE:
            raise ValueError(
                f"methods includes worst, which enumerates every placement of the {world} "
                f"ranks; leave it out of methods or use at most {_MAX_WORST_WORLD_SIZE} ranks"
            )
        if self.ranks_per_host < 1 or self.ranks_per_site % self.ranks_per_host:
            raise ValueError(
                f"ranks_per_host={self.ranks_per_host} must be >= 1 and divide ranks_per_site="
                f"{self.ranks_per_site}"
            )
        if min(self.nic_mbps, self.tcp_window_bytes) < 0:
            raise ValueError(
                f"nic_mbps={self.nic_mbps} and tcp_window_bytes={self.tcp_window_bytes} must be "
                ">= 0 (0 = off)"
            )
        if self.site_links == "world" and self.num_sites > len(WORLD_SITES):
            raise ValueError(
                f'site_links = "world" has {len(WORLD_SITES)} cities; num_sites='
                f"{self.num_sites} is too many"
            )
        if self.num_stages < 1 or world % self.num_stages or self.num_stages > self.gpt.num_layers:
            raise ValueError(
                f"num_stages={self.num_stages} must divide the world size {world} and be <= "
                f"gpt.num_layers={self.gpt.num_layers}"
            )
        if min(self.intra_site_mbps, self.inter_site_mbps) <= 0:
            raise ValueError("intra_site_mbps and inter_site_mbps must be > 0")
        if min(self.intra_site_latency_ms, self.inter_site_latency_ms) < 0:
            raise ValueError("intra_site_latency_ms and inter_site_latency_ms must be >= 0")
        if min(self.micro_batch_size, self.num_microbatches) < 1:
            raise ValueError("micro_batch_size and num_microbatches must be >= 1")
        if not self.methods or len(set(self.methods)) != len(self.methods):
            raise ValueError(f"methods={self.methods} must be non-empty and distinct")
        if self.warmup_steps < 0 or self.steps <= self.warmup_steps:
            raise ValueError(
                f"steps={self.steps} must exceed warmup_steps={self.warmup_steps} >= 0"
            )
        if self.calibrate_repeats < 3 or self.timeout_s <= 0 or self.cores < 0 or self.rounds < 1:
            raise ValueError(
                "calibrate_repeats must be >= 3, timeout_s > 0, cores >= 0 and rounds >= 1"
            )

    @property
    def world_size(self) -> int:
        """num_sites x ranks_per_site."""
        return self.num_sites * self.ranks_per_site

    @property
    def num_replicas(self) -> int:
        """D_dp = world size / D_pp."""
        return self.world_size // self.num_stages


def quick() -> Config:
    """The `--quick` preset: 4 ranks on 2 sites, 2 stages x 2 replicas, 4 methods, 2 rounds."""
    return Config(
        ranks_per_site=2, num_stages=2, steps=6, warmup_steps=1, calibrate_repeats=5, rounds=2
    )


def sixteen_ranks(site_links: Literal["uniform", "world"]) -> Config:
    """The full tier's 16-rank clusters: 4 stages x 4 replicas, 2 ranks per emulated host.

    "uniform": two sites of 8 ranks (200 Mbit/s and 1 ms inside, 20 Mbit/s and 20 ms
    between); "world": four sites of 4 ranks (Oregon, Virginia, Tokyo, Frankfurt) with the
    world scenario's relative links, the fastest 20 Mbit/s and the longest delay 40 ms. Each
    host's NIC carries 20 Mbit/s per direction, so its two ranks' concurrent messages to other
    hosts share it. The TCP window is Linux's default maximum (6 MiB) scaled like the links
    (6 MiB x 20 Mbit/s / 1,020 Mbit/s x 40 ms / 223 ms = 22 kB for the world, the same
    bandwidth-delay ratio as 6 MiB on the real links): it binds on the long links, as 6 MiB
    does over the real ones (503 Mbit/s at 100 ms RTT). The smallest settings that fit 16
    processes on 2 cores: micro-batches of 4, two rounds of 5 steps (each method keeps its
    faster), the three methods without "worst" (16! placements cannot be enumerated).
    """
    world = site_links == "world"
    return Config(
        num_sites=4 if world else 2,
        ranks_per_site=4 if world else 8,
        num_stages=4,
        ranks_per_host=2,
        nic_mbps=20.0,
        tcp_window_bytes=22_000.0,
        site_links=site_links,
        inter_site_mbps=20.0,
        inter_site_latency_ms=40.0 if world else 20.0,
        micro_batch_size=4,
        methods=("ours", "megatron_default", "megatron_random"),
        steps=5,
        warmup_steps=2,
        calibrate_repeats=5,
        rounds=2,
        timeout_s=900.0,
    )


def preset(name: Preset) -> Config:
    """The sizes `frugal reproduce` runs.

    `full`: the default Config (8 ranks, 3 rounds of 8 steps per method); `quick` and `smoke`:
    `quick()` (reproduce's smoke skips the validation).
    """
    return Config() if name == "full" else quick()


def build_topology(config: Config) -> Topology:
    """The emulated cluster: `num_sites` sites of `ranks_per_site` devices.

    Device r is "site{s}-{k}" at site s = r // ranks_per_site, on host "site{s}-{r}" (one rank
    per host) or "site{s}-h{k // ranks_per_host}", whose NIC runs at nic_mbps (0: uncapped);
    links inside a site run at intra_site_mbps with intra_site_latency_ms, links between sites
    at inter_site_mbps with inter_site_latency_ms, or their world-scenario shares
    (`site_links`; Topology holds Gbit/s: Mbit/s / 1000). Speeds are all 1.0: every rank
    runs on the same CPU.
    """
    site = np.arange(config.world_size) // config.ranks_per_site
    same = site[:, None] == site[None, :]
    nic_gbps = config.nic_mbps / 1000.0 if config.nic_mbps > 0 else math.inf
    devices = tuple(
        Device(
            name=f"site{s}-{r % config.ranks_per_site}",
            host=f"site{s}-{r}"
            if config.ranks_per_host == 1
            else f"site{s}-h{r % config.ranks_per_site // config.ranks_per_host}",
            site=f"site{s}",
            nic_gbps=nic_gbps,
        )
        for r, s in enumerate(site.tolist())
    )
    inter_mbps = np.full((config.num_sites,) * 2, config.inter_site_mbps)
    inter_ms = np.full((config.num_sites,) * 2, config.inter_site_latency_ms)
    if config.site_links == "world":
        links = city_links()
        cities = WORLD_SITES[: config.num_sites]
        pairs = [(a, b) for a in range(config.num_sites) for b in range(config.num_sites) if a != b]
        ms = {p: links[frozenset((cities[p[0]], cities[p[1]]))][0] for p in pairs}
        gbps = {p: links[frozenset((cities[p[0]], cities[p[1]]))][1] for p in pairs}
        for p in pairs:
            inter_ms[p] = config.inter_site_latency_ms * ms[p] / max(ms.values())
            inter_mbps[p] = config.inter_site_mbps * gbps[p] / max(gbps.values())
    bandwidth = np.where(same, config.intra_site_mbps, inter_mbps[np.ix_(site, site)]) / 1000.0
    delay = np.where(same, config.intra_site_latency_ms, inter_ms[np.ix_(site, site)])
    np.fill_diagonal(delay, 0.0)
    return Topology(
        devices,
        delay.astype(np.float64),
        bandwidth.astype(np.float64),
        name=f"validate-{config.num_sites}x{config.ranks_per_site}",
    )


def host_rows(topology: Topology) -> tuple[tuple[str, float], ...]:
    """(host, nic_mbps) of every rank (device index) for `RunSpec.hosts`; 0 = no NIC cap."""
    return tuple(
        (d.host, d.nic_gbps * 1000.0 if math.isfinite(d.nic_gbps) else 0.0)
        for d in topology.devices
    )


def link_rows(topology: Topology) -> tuple[tuple[int, int, float, float], ...]:
    """The topology as a per-pair link table for `RunSpec.links`.

    Returns:
        (src, dst, bandwidth_mbps, latency_ms) for every ordered pair of distinct ranks
        (rank = device index).
    """
    n = topology.num_devices
    return tuple(
        (a, b, float(topology.bandwidth_gbps[a, b]) * 1000.0, float(topology.delay_ms[a, b]))
        for a in range(n)
        for b in range(n)
        if a != b
    )


def measure_tau_s(gpt: TinyGPTConfig, micro_batch_size: int, repeats: int, seed: int = 0) -> float:
    """Forward + backward seconds per layer per micro-batch of the tiny GPT, on one thread.

    The whole model (embedding, blocks, head, loss) is timed on random bytes after one
    untimed warm-up pass; the median of `repeats` is divided by the number of blocks, so the
    embedding and head are spread over the layers.
    """
    import torch
    import torch.nn.functional as F

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = TinyGPT(gpt, seed=seed)
        generator = torch.Generator().manual_seed(seed)
        ids = torch.randint(
            0, gpt.vocab_size, (micro_batch_size, gpt.context + 1), generator=generator
        )
        inputs, targets = ids[:, :-1], ids[:, 1:]
        times = []
        for k in range(repeats + 1):
            t0 = time.perf_counter()
            logits = model(inputs)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
            torch.autograd.backward(loss)
            model.zero_grad(set_to_none=True)
            if k:
                times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return median(times) / gpt.num_layers


def workload_for(config: Config, tau_ref_s: float) -> WorkloadConfig:
    """The planner's description of the tiny GPT job.

    gradient_bytes_per_value = 4 (fp32 all-reduce) x the model's real parameter count /
    (num_layers x 12 h^2), so the planner's per-layer gradient size (12 h^2 values) adds up to
    the bytes the runtime really all-reduces (blocks plus embedding and head).
    """
    gpt = config.gpt
    params = sum(p.numel() for p in TinyGPT(gpt, seed=0).parameters())
    return WorkloadConfig(
        num_layers=gpt.num_layers,
        hidden_size=gpt.hidden,
        seq_len=gpt.context,
        global_batch_size=config.num_replicas * config.num_microbatches * config.micro_batch_size,
        microbatch_size=config.micro_batch_size,
        microbatches_per_step=config.num_microbatches,
        codec="fp32",
        gradient_bytes_per_value=4.0 * params / (gpt.num_layers * 12.0 * gpt.hidden**2),
        tau_ref_s=tau_ref_s,
        message_latency="overlapped",  # frugal.comm.link's shaper overlaps delay and transfer
        tcp_window_bytes=config.tcp_window_bytes,
    )


def worst_plan(topology: Topology, reference: Plan, workload: WorkloadConfig) -> Plan:
    """The placement with the highest `iteration` prediction (all meshes up to N = 8).

    Meshes that differ only in the order of their pipelines cost the same, so one order each
    is scored (N! / D_dp! meshes). The result copies `reference` (same grid and layers) with
    the worst mesh; its `method` field reads "random" (a placement no search chose).
    """
    n, d_dp, d_pp = topology.num_devices, reference.num_replicas, reference.num_stages
    layers = reference.num_layers_per_stage
    worst_s, worst = -math.inf, None
    cache: dict[tuple[bytes, float], tuple[str, float]] = {}
    for perm in itertools.permutations(range(n)):
        mesh = np.array(perm, dtype=np.int64).reshape(d_dp, d_pp)
        if (np.diff(mesh[:, 0]) < 0).any():
            continue  # the cost ignores the order of the pipelines: one order per mesh
        cost = iteration_cost(topology, mesh, layers, workload, collective_cache=cache)
        if cost.total_s > worst_s:
            worst_s, worst = cost.total_s, (mesh, cost)
    assert worst is not None
    mesh, cost = worst
    return replace(
        reference,
        mesh=tuple(tuple(int(r) for r in row) for row in mesh),
        num_microbatches_per_replica=cost.microbatches,
        method="random",
        predicted_cost_s=cost.total_s,
        breakdown=(("pipeline_s", cost.pipeline_s), ("dp_exposed_s", cost.dp_exposed_s)),
        gap=cost.total_s / reference.lower_bound_s - 1.0,
    )


def _plans(config: Config, topology: Topology, workload: WorkloadConfig) -> dict[str, Plan]:
    base = PlannerConfig(
        num_stages=config.num_stages,
        num_replicas=config.num_replicas,
        workload=workload,
        budget=500,
        time_limit_s=10.0,
        seed=config.seed,
    )
    plans: dict[str, Plan] = {}
    for method in config.methods:
        if method == "worst":
            reference = build_plan(topology, replace(base, method="megatron_default"))
            plans[method] = worst_plan(topology, reference, workload)
        else:
            plans[method] = build_plan(topology, replace(base, method=method))
    return plans


def _with_speeds(topology: Topology, speeds: Sequence[float]) -> Topology:
    """`topology` with device i running at `speeds[i]`."""
    devices = tuple(replace(d, speed=v) for d, v in zip(topology.devices, speeds, strict=True))
    return Topology(devices, topology.delay_ms, topology.bandwidth_gbps, name=topology.name)


def _rel_error(predicted_s: float, measured_s: float) -> float:
    return (predicted_s - measured_s) / measured_s


def _predict(topology: Topology, plan: Plan, workload: WorkloadConfig) -> tuple[float, float]:
    mesh = np.array(plan.mesh, dtype=np.int64)
    counts = np.array(plan.num_microbatches_per_replica, dtype=np.int64)
    analytic = iteration_cost(topology, mesh, plan.num_layers_per_stage, workload)
    if tuple(counts.tolist()) != analytic.microbatches:  # a balanced plan: price its counts
        analytic = iteration_cost(
            topology, mesh, plan.num_layers_per_stage, workload, balance_microbatches=True
        )
    sim = simulate_iteration(
        topology, mesh, plan.num_layers_per_stage, workload, microbatches_J=counts
    )
    return analytic.total_s, sim.total_s


def _run_speeds(results: list[dict[str, Any]], plan: Plan, tau_ref_s: float) -> list[float]:
    """Speed of each rank as the run itself paced it: tau_ref_s / tau_r.

    tau_r = (median forward + median backward wall seconds per micro-batch, blocking excluded)
    / layers of the rank's stage; it includes whatever CPU sharing the run met.
    """
    speeds = [1.0] * len(results)
    for r in results:
        run = r["runs"][0]
        tau_r = (run["median_forward_s"] + run["median_backward_s"]) / plan.num_layers_per_stage[
            r["stage"]
        ]
        speeds[r["rank"]] = tau_ref_s / tau_r if tau_r > 0 else 1.0
    return speeds


def _ranking(values: dict[str, float]) -> list[str]:
    return sorted(values, key=lambda k: values[k])


def _speedups(seconds: dict[str, float]) -> dict[str, float]:
    """Baseline seconds over ours, per Megatron baseline that ran (> 1: ours faster)."""
    if "ours" not in seconds:
        return {}
    return {
        f"vs_{b}": seconds[b] / seconds["ours"]
        for b in ("megatron_default", "megatron_random")
        if b in seconds
    }


def ranking_agrees(
    predicted: dict[str, float], measured: dict[str, float], *, tie_rel: float = 0.05
) -> bool:
    """Whether `measured` orders every pair of methods as `predicted` does.

    Pairs whose predictions differ by at most `tie_rel` (relative to the smaller; e.g. the
    same placement with sites relabelled) count as ties and are not compared.
    """
    for a, b in itertools.combinations(predicted, 2):
        low, high = sorted((predicted[a], predicted[b]))
        if high - low <= tie_rel * low:
            continue
        if (predicted[a] < predicted[b]) != (measured[a] < measured[b]):
            return False
    return True


def run_plan_validation(
    config: Config, out_dir: Path, *, progress: Progress | None = None
) -> BenchResult[PlanValidationSummary]:
    """Plan, predict, execute and compare; write `results.json` (and the plans) to `out_dir`.

    Rows (one per method): method, mesh, predicted_iteration_s (analytic `iteration`),
    simulated_iteration_s (`planner.sim`, GPipe), measured_iteration_s (median seconds per
    step after warm-up, max over ranks; the fastest of `rounds` launches),
    analytic_rel_error and sim_rel_error ((predicted - measured) / measured), the same under
    the other compute-sharing bound (*_unshared_s), replay_* (the same models with each rank's
    speed taken from the run's own median forward/backward seconds: what is left is the
    error of the schedule and network model, not of the compute calibration),
    executed_as_planned (every rank ran the (replica, stage) the plan gives it) and
    plan_sha256. Summary: tau_ref_s, sim_vs_measured_max_error,
    analytic_vs_measured_max_error, replay_*_max_error, the predicted / measured rankings and
    whether the measured one orders every pair the prediction separates by > 5%.

    Returns:
        The typed summary, the rows and the results document.

    Raises:
        PipelineError: If a torchrun launch fails or times out.
        OSError: If `out_dir` cannot be written.
    """
    say = progress or (lambda _: None)
    out_dir.mkdir(parents=True, exist_ok=True)
    topology = build_topology(config)
    tau_s = measure_tau_s(
        config.gpt, config.micro_batch_size, config.calibrate_repeats, config.seed
    )
    cores = config.cores or os.cpu_count() or 1
    share = min(1.0, cores / config.world_size)
    say(f"tau_ref_s = {tau_s * 1e3:.2f} ms per layer per micro-batch (one thread); share {share}")
    workload = workload_for(config, tau_s)
    shared = _with_speeds(topology, [share] * len(topology.devices))
    chosen, other = (shared, topology) if config.compute_sharing == "cores" else (topology, shared)
    plans = _plans(config, chosen, workload)  # the planner sees the compute model chosen
    links, hosts = link_rows(topology), host_rows(topology)
    trains: dict[str, PipelineTrainConfig] = {}
    for method, plan in plans.items():
        plan.validate(chosen)
        path = out_dir / "plans" / f"{method}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(plan.to_json() + "\n")
        trains[method] = PipelineTrainConfig(
            gpt=config.gpt,
            num_train=max(
                64, config.num_replicas * config.num_microbatches * config.micro_batch_size
            ),
            num_eval=8,
            schedule="gpipe",
            micro_batch_size=config.micro_batch_size,
            num_microbatches=config.num_microbatches,
            plan=str(path.resolve()),
            seed=config.seed,
            comm_timeout_s=min(120.0, config.timeout_s),
        )
    # Rounds run the methods round-robin, so a burst of outside load hits different methods
    # in different rounds; each method keeps its fastest round (load only slows a run down).
    best: dict[str, tuple[float, list[float], list[dict[str, Any]]]] = {}
    for k in range(config.rounds):
        for method, plan in plans.items():
            run = RunSpec(
                label=method,
                codec="fp32",
                steps=config.steps,
                repeat_examples=True,
                links=links,
                hosts=hosts if config.nic_mbps > 0 else (),
                tcp_window_bytes=config.tcp_window_bytes,
            )
            folder = out_dir / "runs" / method / f"round{k}"
            results = launch_torchrun(
                trains[method], [run], folder, nproc=config.world_size, timeout_s=config.timeout_s
            )
            per_rank = [
                median_after_warmup(r["runs"][0]["step_s"], config.warmup_steps) for r in results
            ]
            say(f"round {k} {method}: mesh {plan.mesh}, measured {max(per_rank):.3f} s")
            if method not in best or max(per_rank) < best[method][0]:
                best[method] = (max(per_rank), per_rank, results)
    rows: list[dict[str, Any]] = []
    for method, plan in plans.items():
        analytic_s, sim_s = _predict(chosen, plan, workload)
        analytic_other_s, sim_other_s = _predict(other, plan, workload)
        measured_s, per_rank, results = best[method]
        run_speed = _run_speeds(results, plan, tau_s)
        replay = _with_speeds(topology, run_speed)
        replay_analytic_s, replay_sim_s = _predict(replay, plan, workload)
        executed = all(plan.mesh[r["replica"]][r["stage"]] == r["rank"] for r in results)
        say(
            f"{method}: predicted {analytic_s:.3f} s, simulated {sim_s:.3f} s, replayed "
            f"{replay_sim_s:.3f} s, measured {measured_s:.3f} s"
        )
        rows.append(
            {
                "method": method,
                "mesh": [list(row) for row in plan.mesh],
                "predicted_iteration_s": analytic_s,
                "simulated_iteration_s": sim_s,
                "measured_iteration_s": measured_s,
                "analytic_rel_error": _rel_error(analytic_s, measured_s),
                "sim_rel_error": _rel_error(sim_s, measured_s),
                "predicted_unshared_s": analytic_other_s,
                "simulated_unshared_s": sim_other_s,
                "unshared_sim_rel_error": _rel_error(sim_other_s, measured_s),
                "replay_predicted_s": replay_analytic_s,
                "replay_simulated_s": replay_sim_s,
                "replay_sim_rel_error": _rel_error(replay_sim_s, measured_s),
                "replay_analytic_rel_error": _rel_error(replay_analytic_s, measured_s),
                "run_speed_per_rank": run_speed,
                "measured_per_rank_s": per_rank,
                "executed_as_planned": executed,
                "plan_sha256": plan.sha256,
            }
        )
    simulated = {r["method"]: r["simulated_iteration_s"] for r in rows}
    analytic = {r["method"]: r["predicted_iteration_s"] for r in rows}
    measured = {r["method"]: r["measured_iteration_s"] for r in rows}
    predicted_rank, analytic_rank = _ranking(simulated), _ranking(analytic)
    measured_rank = _ranking(measured)

    def worst(key: str) -> float:
        """The largest |relative error| `key` over the methods."""
        return float(max(abs(r[key]) for r in rows))

    summary = PlanValidationSummary(
        world_size=config.world_size,
        rel_error_by_method={r["method"]: r["sim_rel_error"] for r in rows},
        speedup_predicted=_speedups(simulated),
        speedup_measured=_speedups(measured),
        speedup_replayed=_speedups({r["method"]: r["replay_simulated_s"] for r in rows}),
        tau_ref_s=tau_s,
        compute_share=share,
        compute_sharing=config.compute_sharing,
        sim_vs_measured_max_error=worst("sim_rel_error"),
        analytic_vs_measured_max_error=worst("analytic_rel_error"),
        unshared_sim_vs_measured_max_error=worst("unshared_sim_rel_error"),
        replay_sim_vs_measured_max_error=worst("replay_sim_rel_error"),
        replay_analytic_vs_measured_max_error=worst("replay_analytic_rel_error"),
        predicted_ranking=predicted_rank,
        analytic_ranking=analytic_rank,
        measured_ranking=measured_rank,
        ranking_matches=ranking_agrees(simulated, measured),
        analytic_ranking_matches=ranking_agrees(analytic, measured),
        all_executed_as_planned=all(r["executed_as_planned"] for r in rows),
    )
    return write_bench_results("plan_validate", config, rows, summary, out_dir / "results.json")
