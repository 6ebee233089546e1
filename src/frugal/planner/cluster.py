"""Cluster files: a strict TOML description of sites, hosts and the links between sites.

```toml
planner = {num_stages = 4, num_replicas = 2}           # optional: PlannerConfig fields
model = {num_layers = 24, global_batch_size = 1024}    # optional: WorkloadConfig fields
sites = [{name = "Oregon", delay_ms = 5, bandwidth_gbps = 2}]          # links inside a site
hosts = [{name = "or0", site = "Oregon", num_gpus = 4, memory_gib = 16, speed = 1.0}]
links = [{a = "Oregon", b = "Virginia", delay_ms = 67, bandwidth_gbps = 0.79}]
```

Devices of one host talk over `intra_gbps` / `intra_delay_ms`; devices of one site over the
site's link; devices of two sites over their `links` entry (both directions unless
`direction = "a_to_b"`, then give the other direction too). Every pair of sites with devices
needs a link. An unknown key, a missing field or a bad value is an error naming the file, the
dotted key and the rule.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from frugal.config import ConfigError, check_types, config_from_dict
from frugal.planner.iteration import WorkloadConfig
from frugal.planner.plan import PlannerConfig
from frugal.planner.topology import Device, Topology

__all__ = ["ClusterFile", "load_cluster"]


MAX_DEVICES = 1024
_RANGES = {  # sane physical ranges: outside them a value is a typo, not a cluster
    "bandwidth_gbps": (1e-6, 1e6),
    "intra_gbps": (1e-6, 1e6),
    "nic_gbps": (1e-6, 1e6),
    "delay_ms": (0.0, 1e6),
    "intra_delay_ms": (0.0, 1e6),
    "speed": (1e-3, 1e3),
    "memory_gib": (1e-2, 1e5),
}


def _in_range(owner: str, **values: float) -> None:
    for name, value in values.items():
        low, high = _RANGES[name]
        if not low <= value <= high:
            raise ValueError(f"{owner}: {name} = {value} must lie in [{low:g}, {high:g}]")


def _named(kind: str, name: str) -> None:
    if not name.strip():
        raise ValueError(f"a {kind} needs a non-empty name")


@dataclass(frozen=True, kw_only=True, slots=True)
class SiteSpec:
    """A site and the link between two of its hosts."""

    name: str
    """Unique site name."""
    delay_ms: float = 0.0
    """One-way delay between hosts of the site, ms, >= 0."""
    bandwidth_gbps: float = 10.0
    """Bandwidth between hosts of the site, Gbit/s, > 0."""

    def __post_init__(self) -> None:
        check_types(self)
        _named("site", self.name)
        _in_range(f"site {self.name}", bandwidth_gbps=self.bandwidth_gbps, delay_ms=self.delay_ms)


@dataclass(frozen=True, kw_only=True, slots=True)
class HostSpec:
    """A machine with one or more identical GPUs."""

    name: str
    """Unique host name."""
    site: str
    """Name of its site (must be listed in `sites`)."""
    num_gpus: int = 1
    """GPUs in the host, >= 1."""
    gpu: str = ""
    """GPU model, informational (e.g. "V100-16GB")."""
    memory_gib: float = 16.0
    """Memory per GPU, GiB, > 0."""
    speed: float = 1.0
    """Compute speed per GPU relative to a V100, > 0."""
    nic_gbps: float = 10.0
    """Host NIC capacity per direction, Gbit/s, > 0: the host's cross-host messages share it."""
    intra_gbps: float = 100.0
    """Bandwidth between GPUs of the host, Gbit/s, > 0."""
    intra_delay_ms: float = 0.0
    """Delay between GPUs of the host, ms, >= 0."""

    def __post_init__(self) -> None:
        check_types(self)
        _named("host", self.name)
        if not 1 <= self.num_gpus <= MAX_DEVICES:
            raise ValueError(
                f"host {self.name}: num_gpus = {self.num_gpus} must lie in [1, {MAX_DEVICES}]"
            )
        _in_range(
            f"host {self.name}",
            memory_gib=self.memory_gib,
            speed=self.speed,
            nic_gbps=self.nic_gbps,
            intra_gbps=self.intra_gbps,
            intra_delay_ms=self.intra_delay_ms,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkSpec:
    """The link between two sites."""

    a: str
    """First site."""
    b: str
    """Second site."""
    delay_ms: float
    """One-way delay, ms, >= 0."""
    bandwidth_gbps: float
    """Bandwidth, Gbit/s, > 0."""
    direction: Literal["both", "a_to_b"] = "both"
    """Whether the values hold both ways or only from a to b."""

    def __post_init__(self) -> None:
        check_types(self)
        if self.a == self.b:
            raise ValueError(f"link {self.a}-{self.b} joins a site to itself; set the site's own "
                             "delay_ms and bandwidth_gbps instead")  # fmt: skip
        _in_range(
            f"link {self.a}-{self.b}", bandwidth_gbps=self.bandwidth_gbps, delay_ms=self.delay_ms
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterFile:
    """The whole file."""

    sites: tuple[SiteSpec, ...]
    """Sites, at least one."""
    hosts: tuple[HostSpec, ...]
    """Hosts, at least one."""
    links: tuple[LinkSpec, ...] = ()
    """Links between sites."""
    planner: dict[str, Any] = field(default_factory=dict)
    """PlannerConfig fields (checked when the plan is built)."""
    model: dict[str, Any] = field(default_factory=dict)
    """WorkloadConfig fields."""


def load_cluster(path: str | Path) -> tuple[Topology, dict[str, Any]]:
    """Read a cluster file into a `Topology` and the planner settings it carries.

    Args:
        path: The TOML file.

    Returns:
        (topology, plain PlannerConfig data with the `model` table as its `workload`).

    Raises:
        ConfigError: If the file is unreadable or breaks a rule (names file, key and rule).
    """
    source = str(path)
    try:
        with open(path, "rb") as fh:
            raw = tomllib.load(fh)
    except FileNotFoundError as exc:
        raise ConfigError(f"cluster file {path} does not exist") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    allowed = {"sites", "hosts", "links", "planner", "model"}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ConfigError(
            f"{source}: unknown key {unknown[0]}; allowed keys: {', '.join(sorted(allowed))}"
        )
    for key in ("planner", "model"):
        if key in raw and not isinstance(raw[key], dict):
            raise ConfigError(f"{source}: {key} must be a table")
    if "model" in raw:  # checked now, so a typo is reported against this file
        config_from_dict(WorkloadConfig, raw["model"], source=source, prefix="model")
    if "planner" in raw:
        config_from_dict(PlannerConfig, raw["planner"], source=source, prefix="planner")
    spec = config_from_dict(
        ClusterFile,
        {k: v for k, v in raw.items() if k in ("sites", "hosts", "links")},
        source=source,
    )
    topology = _build(spec, source, Path(path).stem)
    settings: dict[str, Any] = dict(raw.get("planner", {}))
    if "model" in raw:
        settings["workload"] = dict(raw["model"])
    return topology, settings


def _build(spec: ClusterFile, source: str, name: str) -> Topology:
    if not spec.sites or not spec.hosts:
        raise ConfigError(f"{source}: sites and hosts must each list at least one entry")
    sites = {s.name: s for s in spec.sites}
    if len(sites) != len(spec.sites):
        names = [s.name for s in spec.sites]
        dup_site = next(n for n in names if names.count(n) > 1)
        raise ConfigError(f"{source}: site {dup_site!r} appears twice in sites; rename one")
    host_names = [h.name for h in spec.hosts]
    if len(set(host_names)) != len(host_names):
        dup = next(h for h in host_names if host_names.count(h) > 1)
        raise ConfigError(f"{source}: host {dup!r} appears twice; host names must be unique")
    for host in spec.hosts:
        if host.site not in sites:
            raise ConfigError(
                f"{source}: host {host.name} is in unknown site {host.site!r}; known sites: "
                f"{', '.join(sites)}"
            )
    total = sum(h.num_gpus for h in spec.hosts)
    if total > MAX_DEVICES:
        raise ConfigError(f"{source}: {total} devices; the planner handles up to {MAX_DEVICES}")
    pair: dict[tuple[str, str], tuple[float, float]] = {}
    for k, link in enumerate(spec.links):
        for end in (link.a, link.b):
            if end not in sites:
                raise ConfigError(f"{source}: link {link.a}-{link.b} names unknown site {end!r}")
        directions = [(link.a, link.b)] + ([(link.b, link.a)] if link.direction == "both" else [])
        for direction in directions:
            if direction in pair:
                raise ConfigError(
                    f"{source}: links[{k}] gives {direction[0]}->{direction[1]} again; each "
                    "direction of a site pair may be given once"
                )
            pair[direction] = (link.delay_ms, link.bandwidth_gbps)
    devices = [
        Device(
            name=f"{h.name}-{k}" if h.num_gpus > 1 else h.name,
            host=h.name,
            site=h.site,
            speed=h.speed,
            memory_gib=h.memory_gib,
            nic_gbps=h.nic_gbps,
        )
        for h in spec.hosts
        for k in range(h.num_gpus)
    ]
    hosts = {h.name: h for h in spec.hosts}
    used_sites = sorted({d.site for d in devices})
    missing = [f"{a}->{b}" for a in used_sites for b in used_sites if a != b and (a, b) not in pair]
    if missing:
        raise ConfigError(
            f"{source}: no link for {', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}; "
            "every pair of sites with devices needs a links entry (devices would be cut off)"
        )
    n = len(devices)
    delay, bandwidth = np.zeros((n, n)), np.zeros((n, n))
    for i, di in enumerate(devices):
        for j, dj in enumerate(devices):
            if i == j:
                continue
            if di.host == dj.host:
                host = hosts[di.host]
                delay[i, j], bandwidth[i, j] = host.intra_delay_ms, host.intra_gbps
            elif di.site == dj.site:
                site = sites[di.site]
                delay[i, j], bandwidth[i, j] = site.delay_ms, site.bandwidth_gbps
            else:
                delay[i, j], bandwidth[i, j] = pair[(di.site, dj.site)]
    return Topology(devices=tuple(devices), delay_ms=delay, bandwidth_gbps=bandwidth, name=name)
