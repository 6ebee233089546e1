"""`frugal plan probe`: measure the ranks of a torchrun job and write the cluster file.

Every rank of the job (one process per GPU, or per CPU socket) takes part; rank 0 writes the
TOML that `frugal plan --cluster` reads. Pairs are probed one at a time while the others wait
at a barrier, so no measurement shares a link or a NIC with another:

- **delay**: `pings` ping-pongs of a 4-byte tensor; the one-way delay is half the median
  round trip (links are taken as symmetric in delay, as `ping` does);
- **bandwidth**, each direction apart: a `message_bytes` send answered by a 4-byte ack,
  `repeats` times; bandwidth = 8 S / (median time - median round trip);
- **compute**: each rank times a square matmul on its device, one rank at a time (ranks of
  a CPU host share its cores); `speed` in the file is relative to the fastest rank (1.0), so
  the planner's `tau_ref_s` must be that rank's seconds per layer and micro-batch;
- **memory**: the GPU's memory, or the host's RAM divided by its ranks.

Ranks with the same host name are one `hosts` entry (their links are its `intra_gbps` /
`intra_delay_ms`); hosts whose mutual one-way delay is at most `site_delay_ms` form a site
(connected components), whose `delay_ms`/`bandwidth_gbps` are the medians over its host
pairs; every pair of sites gets a `links` entry (medians over the device pairs, one entry per
direction when the two directions' bandwidths differ by more than 10 %).

`emulate` (a cluster file with one device per rank) shapes every send with the file's delay
and bandwidth (`frugal.comm.link`), and names each rank's host and site as the file does: a
one-machine rehearsal of a geo-distributed probe, and how the tests check the measurement.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from frugal.config import ConfigError, check_types

__all__ = ["ProbeConfig", "ProbeResult", "cluster_toml", "main", "run_probe", "sites_of"]

_PING_BYTES = 4


@dataclass(frozen=True, kw_only=True, slots=True)
class ProbeConfig:
    """What `frugal plan probe` measures and how."""

    message_bytes: int = 4 << 20
    """Bytes of each bandwidth message, >= 1024 (4 MiB: long enough to dwarf the delay on
    links up to ~10 Gbit/s at 1 ms)."""
    pings: int = 10
    """Round trips per pair for the delay, >= 1."""
    repeats: int = 3
    """Bandwidth messages per direction and pair, >= 1."""
    site_delay_ms: float = 5.0
    """Hosts whose one-way delay is at most this (ms) share a site, >= 0."""
    matmul_size: int = 1024
    """Side of the square matmul timed for `speed` (fp32 on CPU, fp16 on CUDA), >= 64."""
    timeout_s: float = 120.0
    """Limit of every collective and point-to-point wait, seconds, > 0."""
    emulate: str = ""
    """A cluster file with one device per rank whose links are emulated ("" = none)."""

    def __post_init__(self) -> None:
        check_types(self)
        for name, low in (("message_bytes", 1024), ("pings", 1), ("repeats", 1),
                          ("matmul_size", 64)):  # fmt: skip
            if getattr(self, name) < low:
                raise ValueError(f"{name}={getattr(self, name)} must be >= {low}")
        if not self.site_delay_ms >= 0:
            raise ValueError(f"site_delay_ms={self.site_delay_ms} must be >= 0 (ms)")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s={self.timeout_s} must be > 0 seconds")


@dataclass(frozen=True, kw_only=True, slots=True)
class ProbeResult:
    """What the probe measured, per rank and per directed pair of ranks.

    Shapes:
        delay_ms, bandwidth_gbps: (N, N) one-way ms and Gbit/s from row to column; the
        diagonal is 0.
    """

    hosts: tuple[str, ...]
    """Host name of each rank."""
    sites: tuple[str, ...] = ()
    """Site of each rank when emulated (else () and sites are found by delay)."""
    devices: tuple[str, ...]
    """Device model of each rank ("cpu" or the GPU's name)."""
    memory_gib: tuple[float, ...]
    """Memory of each rank's device, GiB."""
    tflops: tuple[float, ...]
    """Measured matmul TFLOP/s of each rank."""
    delay_ms: list[list[float]] = field(default_factory=list)
    bandwidth_gbps: list[list[float]] = field(default_factory=list)


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def sites_of(result: ProbeResult, site_delay_ms: float) -> dict[str, str]:
    """Site of every host: its emulated site, or connected components under the delay.

    Hosts a and b are joined when the median one-way delay between their ranks (both
    directions) is at most `site_delay_ms`; a component is named after its first host
    ("site-<host>").
    """
    hosts = list(dict.fromkeys(result.hosts))
    if result.sites:
        return {h: result.sites[result.hosts.index(h)] for h in hosts}
    delay = np.asarray(result.delay_ms)
    parent = {h: h for h in hosts}

    def root(h: str) -> str:
        while parent[h] != h:
            h = parent[h]
        return h

    for i, a in enumerate(hosts):
        for b in hosts[i + 1 :]:
            ra = [r for r, h in enumerate(result.hosts) if h == a]
            rb = [r for r, h in enumerate(result.hosts) if h == b]
            pairs = [delay[x, y] for x in ra for y in rb] + [delay[y, x] for x in ra for y in rb]
            if _median(pairs) <= site_delay_ms:
                parent[root(b)] = root(a)
    return {h: f"site-{root(h)}" for h in hosts}


def _fmt(value: float) -> str:
    return f"{value:.6g}"


def cluster_toml(result: ProbeResult, config: ProbeConfig) -> str:
    """The cluster file (TOML, `frugal.planner.cluster` format) of a probe's measurements.

    Raises:
        ValueError: If the matrices do not match the ranks.
    """
    n = len(result.hosts)
    delay, bandwidth = np.asarray(result.delay_ms), np.asarray(result.bandwidth_gbps)
    if delay.shape != (n, n) or bandwidth.shape != (n, n):
        raise ValueError(f"delay and bandwidth must be ({n}, {n}) for {n} ranks")
    site_of = sites_of(result, config.site_delay_ms)
    hosts = list(dict.fromkeys(result.hosts))
    ranks = {h: [r for r, x in enumerate(result.hosts) if x == h] for h in hosts}
    fastest = max(result.tflops)
    lines = [
        "# Written by `frugal plan probe`: measured delays (one-way, half the round trip) and",
        "# bandwidths between the job's ranks; speed is relative to the fastest rank",
        f"# ({_fmt(fastest)} TFLOP/s matmul), so set model.tau_ref_s to its seconds per layer.",
        f"# Hosts within {_fmt(config.site_delay_ms)} ms of each other share a site.",
    ]

    def pairs(a: list[int], b: list[int]) -> tuple[list[float], list[float]]:
        d = [float(delay[x, y]) for x in a for y in b if x != y]
        g = [float(bandwidth[x, y]) for x in a for y in b if x != y]
        return d, g

    site_names = list(dict.fromkeys(site_of[h] for h in hosts))
    lines.append("sites = [")
    for site in site_names:
        members = [r for h in hosts if site_of[h] == site for r in ranks[h]]
        cross = [(x, y) for x in members for y in members if result.hosts[x] != result.hosts[y]]
        if cross:
            d = _median([float(delay[x, y]) for x, y in cross])
            g = _median([float(bandwidth[x, y]) for x, y in cross])
            lines.append(
                f'    {{name = "{site}", delay_ms = {_fmt(d)}, bandwidth_gbps = {_fmt(g)}}},'
            )
        else:
            lines.append(f'    {{name = "{site}"}},  # one host: no link inside the site measured')
    lines.append("]")
    lines.append("hosts = [")
    for h in hosts:
        rs = ranks[h]
        first = rs[0]
        memory = min(result.memory_gib[r] for r in rs)
        speed = max(1e-3, min(result.tflops[r] for r in rs) / fastest)
        entry = (
            f'    {{name = "{h}", site = "{site_of[h]}", num_gpus = {len(rs)}, '
            f'gpu = "{result.devices[first]}", memory_gib = {_fmt(memory)}, speed = {_fmt(speed)}'
        )
        if len(rs) > 1:
            d_in, g_in = pairs(rs, rs)
            entry += f", intra_gbps = {_fmt(_median(g_in))}, intra_delay_ms = {_fmt(_median(d_in))}"
        lines.append(entry + "},")
    lines.append("]")
    lines.append("links = [")
    for i, sa in enumerate(site_names):
        for sb in site_names[i + 1 :]:
            ra = [r for r in range(n) if site_of[result.hosts[r]] == sa]
            rb = [r for r in range(n) if site_of[result.hosts[r]] == sb]
            d_ab, g_ab = pairs(ra, rb)
            d_ba, g_ba = pairs(rb, ra)
            d = _median(d_ab + d_ba)
            ab, ba = _median(g_ab), _median(g_ba)
            if abs(ab - ba) <= 0.1 * max(ab, ba):
                lines.append(
                    f'    {{a = "{sa}", b = "{sb}", delay_ms = {_fmt(d)}, '
                    f"bandwidth_gbps = {_fmt(_median(g_ab + g_ba))}}},"
                )
            else:
                for x, y, g in ((sa, sb, ab), (sb, sa, ba)):
                    lines.append(
                        f'    {{a = "{x}", b = "{y}", delay_ms = {_fmt(d)}, '
                        f'bandwidth_gbps = {_fmt(g)}, direction = "a_to_b"}},'
                    )
    lines.append("]")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------- the worker (one rank) ---


def _device_facts() -> tuple[str, float, Any]:
    """(device model, memory GiB, torch device) of this rank."""
    import torch

    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local % torch.cuda.device_count())
        props = torch.cuda.get_device_properties(device)
        return props.name, props.total_memory / 2**30, device
    from frugal.launch import machine_memory_bytes

    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    total, _ = machine_memory_bytes()
    return "cpu", total / 2**30 / max(1, local_ranks), torch.device("cpu")


def _matmul_tflops(device: Any, size: int) -> float:
    import torch

    dtype = torch.float16 if device.type == "cuda" else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    times = []
    for k in range(4):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        (a @ b).sum().item()
        if k:  # the first is a warm-up
            times.append(time.perf_counter() - t0)
    return 2 * size**3 / _median(times) / 1e12


def _shapers(config: ProbeConfig, rank: int, world_size: int) -> tuple[dict[int, Any], str, str]:
    """Link shapers from this rank to every other (emulated), and its emulated host and site."""
    if not config.emulate:
        return {}, socket.gethostname(), ""
    from frugal.comm.link import LinkShaper, LinkSpec
    from frugal.planner.cluster import load_cluster

    topology, _ = load_cluster(config.emulate)
    if topology.num_devices != world_size:
        raise ConfigError(
            f"emulate={config.emulate} has {topology.num_devices} devices but the job has "
            f"{world_size} ranks; launch one rank per device"
        )
    shapers = {
        peer: LinkShaper(
            LinkSpec(
                bandwidth_bits_per_s=float(topology.bandwidth_gbps[rank, peer]) * 1e9,
                latency_s=float(topology.delay_ms[rank, peer]) / 1e3,
            ),
            name=f"probe-{rank}-{peer}",
        )
        for peer in range(world_size)
        if peer != rank
    }
    me = topology.devices[rank]
    return shapers, me.host, me.site


def measure(config: ProbeConfig) -> ProbeResult | None:
    """Probe every pair of ranks of the running process group (rank 0 gets the result).

    Raises:
        ConfigError: If `emulate` does not have one device per rank.
    """
    import torch
    import torch.distributed as dist

    rank, world_size = dist.get_rank(), dist.get_world_size()
    shapers, host, site = _shapers(config, rank, world_size)
    model, memory_gib, device = _device_facts()

    def send(tensor: torch.Tensor, peer: int) -> None:
        if peer in shapers:
            num_bytes = tensor.numel() * tensor.element_size()
            handle = shapers[peer].submit(num_bytes, lambda: dist.send(tensor, peer))
            handle.wait(config.timeout_s)
        else:
            dist.send(tensor, peer)

    ping = torch.zeros(_PING_BYTES // 4, dtype=torch.float32)
    payload = torch.zeros(config.message_bytes // 4, dtype=torch.float32)
    delay = np.zeros((world_size, world_size))
    bandwidth = np.zeros((world_size, world_size))

    def round_trip(a: int, b: int, tensor: torch.Tensor) -> float | None:
        """A sends `tensor` to b, b answers with a ping; a's elapsed seconds (None on b)."""
        if rank == a:
            t0 = time.perf_counter()
            send(tensor, b)
            dist.recv(ping, b)
            return time.perf_counter() - t0
        dist.recv(tensor, a)
        send(ping, a)
        return None

    for a in range(world_size):
        for b in range(a + 1, world_size):
            dist.barrier()
            if rank not in (a, b):
                continue
            rtts = [round_trip(a, b, ping) for _ in range(config.pings + 1)][1:]  # 1 warm-up
            forward = [round_trip(a, b, payload) for _ in range(config.repeats)]
            backward = [round_trip(b, a, payload) for _ in range(config.repeats)]
            if rank == a:
                rtt = _median([x for x in rtts if x is not None])
                sent = [x for x in forward if x is not None]
                row = [rtt, _median(sent)]
            else:
                got = [x for x in backward if x is not None]
                row = [0.0, _median(got)]
            # a knows the round trip and a->b; b knows b->a (timed against a's round trip)
            mine = torch.tensor(row, dtype=torch.float64)
            theirs = torch.zeros(2, dtype=torch.float64)
            other = b if rank == a else a
            if rank == a:
                dist.send(mine, other)
                dist.recv(theirs, other)
            else:
                dist.recv(theirs, other)
                dist.send(mine, other)
            rtt = float(mine[0] if rank == a else theirs[0])
            t_ab = float(mine[1] if rank == a else theirs[1])
            t_ba = float(theirs[1] if rank == a else mine[1])
            bits = 8.0 * config.message_bytes
            delay[a, b] = delay[b, a] = rtt / 2 * 1e3
            bandwidth[a, b] = bits / max(t_ab - rtt, 1e-9) / 1e9
            bandwidth[b, a] = bits / max(t_ba - rtt, 1e-9) / 1e9
    dist.barrier()
    tflops = 0.0
    for r in range(world_size):  # one rank at a time: CPU ranks share their host's cores
        if r == rank:
            tflops = _matmul_tflops(device, config.matmul_size)
        dist.barrier()
    for s in shapers.values():
        s.close()
    facts = {"host": host, "site": site, "device": model, "memory_gib": memory_gib,
             "tflops": tflops}  # fmt: skip
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, facts)
    matrices = torch.from_numpy(np.stack([delay, bandwidth]))
    dist.all_reduce(matrices)  # each pair's values live on its two ranks (the same numbers)
    both = matrices.numpy() / 2.0
    if rank != 0:
        return None
    return ProbeResult(
        hosts=tuple(f["host"] for f in gathered),
        sites=tuple(f["site"] for f in gathered) if config.emulate else (),
        devices=tuple(f["device"] for f in gathered),
        memory_gib=tuple(float(f["memory_gib"]) for f in gathered),
        tflops=tuple(float(f["tflops"]) for f in gathered),
        delay_ms=both[0].tolist(),
        bandwidth_gbps=both[1].tolist(),
    )


def main(argv: list[str] | None = None) -> int:
    """One rank: `python -m frugal.planner.probe JOB.json`; rank 0 writes the cluster file."""
    from frugal.config import config_from_dict
    from frugal.launch.group import init_group
    from frugal.results import write_text_atomically

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m frugal.planner.probe JOB.json", file=sys.stderr)
        return 2
    rank = int(os.environ.get("RANK", "0"))
    try:
        job = json.loads(Path(args[0]).read_text())
        config = config_from_dict(ProbeConfig, job["config"], source=args[0])
        init_group(rank, int(os.environ.get("WORLD_SIZE", "1")), config.timeout_s)
        result = measure(config)
        if result is not None:
            out = Path(job["out"])
            write_text_atomically(out, cluster_toml(result, config))
            write_text_atomically(out.with_suffix(".json"), json.dumps(asdict(result)))
    except (ConfigError, ValueError, OSError, RuntimeError) as exc:
        print(f"frugal: rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


def run_probe(
    config: ProbeConfig,
    out: Path,
    *,
    nproc: int,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    force: bool = False,
    on_line: Callable[[int, str], None] | None = None,
) -> Path | None:
    """Launch the probe under torchrun; rank 0 writes `out` (TOML) and `out.json` (raw).

    Returns:
        `out` on the node of global rank 0 (None on the other nodes).

    Raises:
        ConfigError: If `emulate` does not list nproc x nnodes devices, or the launch fails.
    """
    from frugal.config import config_to_dict
    from frugal.launch import TorchrunJob, run_torchrun

    if config.emulate:
        from frugal.planner.cluster import load_cluster

        if not Path(config.emulate).is_file():
            raise ConfigError(
                f"emulate={config.emulate}: no such cluster file; give the TOML whose links to "
                "emulate (one device per rank)"
            )
        topology, _ = load_cluster(config.emulate)
        if topology.num_devices != nproc * nnodes:
            raise ConfigError(
                f"emulate={config.emulate} has {topology.num_devices} devices but "
                f"--nproc-per-node {nproc} x --nnodes {nnodes} = {nproc * nnodes} ranks; launch "
                f"{topology.num_devices}"
            )
    out.parent.mkdir(parents=True, exist_ok=True)
    job_file = out.with_name(out.stem + ".job.json")
    job_file.write_text(json.dumps({"config": config_to_dict(config), "out": str(out)}))
    world_size = nproc * nnodes
    pairs = world_size * (world_size - 1) // 2
    launch = TorchrunJob(
        target=["frugal.planner.probe", str(job_file)],
        nproc=nproc,
        nnodes=nnodes,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_id="frugal-probe",
        # every pair's probes, with room for slow links, plus start-up
        timeout_s=120.0 + pairs * config.timeout_s / 4,
        log_dir=out.parent / f"{out.stem}-logs",
        env={"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
        force=force,
    )
    try:
        result = run_torchrun(launch, on_line=on_line)
    finally:
        job_file.unlink(missing_ok=True)
    if not result.ok:
        raise ConfigError(f"the probe failed: {result.failure_message()}")
    return out if out.is_file() else None


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip the interpreter's teardown (gloo's threads), as the pipeline does
