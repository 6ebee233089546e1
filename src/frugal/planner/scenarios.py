"""The network scenarios of the DT-FM paper as `Topology` presets, from bundled measurements.

The link tables ship inside the package (`frugal/planner/data/`, with `SOURCES.md`): city-pair
ping delays and shaping bandwidths re-tabulated from the authors' public repositories.

| name | devices | inside a group | between groups |
| --- | --- | --- | --- |
| `datacenter` | 8 hosts x 8 GPUs | 100 Gbps, 0 ms | 3.125 Gbps (25 Gbps NIC / 8), 0 ms |
| `spot` | 8 x 4-GPU + 32 x 1-GPU hosts | 100 Gbps, 0 ms | 1.25 Gbps (10 / 8), 0 ms |
| `two_sites` | 32 Ohio + 32 Virginia | 5 Gbps, 1 ms | 1.12 Gbps, 11 ms |
| `regional` | 16 each Virginia, Oregon, California, Ohio | 2 Gbps, 5 ms | case-4 pairs |
| `world` | 8 each of 8 cities | 2 Gbps, 5 ms | city pairs |
| `fluidstack_3region` | 8 each East, Mid, West | 10 Gbps, 0.5 ms (assumed) | measured, asymmetric |
| `world_uneven` | 64 in 8 cities, 4 to 13 each | as `world` | city pairs |
| `world_mixed` | `world` with a seeded half at 0.5x speed and memory | as `world` | city pairs |

Device ids are site-sorted as listed (the Megatron default order). `world_uneven`: London 13,
Oregon 13, Ohio 9, Virginia 7, Tokyo 7, Frankfurt 6, Seoul 5, Ireland 4 (planner.md, 9.3).
Delays are the ping times the authors applied as one-way delays (`delay_semantics =
"as_emulated"` in the brief).

References:
    Decentralized Training of Foundation Models in Heterogeneous Environments, NeurIPS 2022,
    arXiv 2206.01288 (section 4 and appendix: the five scenarios).
"""

from __future__ import annotations

import csv
import importlib.resources
from collections.abc import Callable

import numpy as np

from frugal.config import ConfigError
from frugal.planner.topology import Device, Topology

__all__ = [
    "SCENARIOS",
    "build_scenario",
    "city_cluster",
    "city_links",
    "mixed_generations",
    "region_links",
]

# Inside one region: the DT-FM scheduler's 5 ms / 2 Gbps (its tc scripts used 10 ms).
_INTRA_REGION_DELAY_MS = 5.0
_INTRA_REGION_BANDWIDTH_GBPS = 2.0
_WORLD_CITIES = ("Oregon", "Virginia", "Ohio", "Tokyo", "Seoul", "London", "Frankfurt", "Ireland")
_REGIONAL = ("Virginia", "Oregon", "California", "Ohio")
# planner.md, section 9.3: the unbalanced worldwide cluster (64 GPUs).
_UNEVEN_WORLD = {"London": 13, "Oregon": 13, "Ohio": 9, "Virginia": 7, "Tokyo": 7,
                 "Frankfurt": 6, "Seoul": 5, "Ireland": 4}  # fmt: skip


def _rows(name: str) -> list[dict[str, str]]:
    text = importlib.resources.files("frugal.planner").joinpath("data", name).read_text()
    return list(csv.DictReader(text.splitlines()))


def city_links() -> dict[frozenset[str], tuple[float, float]]:
    """City pair -> (delay ms, bandwidth Gbps) from the bundled `city_pairs.csv`."""
    return {
        frozenset((r["city_a"], r["city_b"])): (float(r["delay_ms"]), float(r["bandwidth_gbps"]))
        for r in _rows("city_pairs.csv")
    }


def region_links() -> dict[frozenset[str], tuple[float, float]]:
    """Region pair -> (delay ms, bandwidth Gbps) of case 4, from `case4_regional_pairs.csv`."""
    return {
        frozenset((r["region_a"], r["region_b"])): (
            float(r["delay_ms"]),
            float(r["bandwidth_gbps"]),
        )
        for r in _rows("case4_regional_pairs.csv")
    }


def _build(
    name: str, devices: list[Device], link: Callable[[Device, Device], tuple[float, float]]
) -> Topology:
    """Fill the delay and bandwidth matrices from a per-pair link function."""
    n = len(devices)
    delay = np.zeros((n, n))
    bandwidth = np.zeros((n, n))
    for a, da in enumerate(devices):
        for b, db in enumerate(devices):
            if a != b:
                delay[a, b], bandwidth[a, b] = link(da, db)
    return Topology(devices=tuple(devices), delay_ms=delay, bandwidth_gbps=bandwidth, name=name)


def _instances(
    name: str, hosts: list[tuple[str, int]], inside: tuple[float, float], between_gbps: float
) -> Topology:
    """Cloud instances (host, GPUs): fast inside an instance, one rate between instances."""
    devices = [
        Device(name=f"{host}-{k}", host=host, site=host)
        for host, count in hosts
        for k in range(count)
    ]
    return _build(name, devices, lambda a, b: inside if a.host == b.host else (0.0, between_gbps))


def _datacenter() -> Topology:
    hosts = [(f"p3-16x-{h}", 8) for h in range(8)]
    return _instances("datacenter", hosts, (0.0, 100.0), 25.0 / 8)


def _spot() -> Topology:
    hosts = [(f"p3-8x-{h}", 4) for h in range(8)] + [(f"p3-2x-{h}", 1) for h in range(32)]
    return _instances("spot", hosts, (0.0, 100.0), 10.0 / 8)


def _sites(name: str, sites: tuple[str, ...], per_site: int, intra: tuple[float, float],
           between: Callable[[str, str], tuple[float, float]]) -> Topology:  # fmt: skip
    """One GPU per host; devices of a site share the intra-site link."""
    devices = [
        Device(name=f"{site.lower()}-{k}", host=f"{site.lower()}-{k}", site=site)
        for site in sites
        for k in range(per_site)
    ]
    return _build(
        name, devices, lambda a, b: intra if a.site == b.site else between(a.site, b.site)
    )


def _two_sites() -> Topology:
    return _sites("two_sites", ("Ohio", "Virginia"), 32, (1.0, 5.0), lambda a, b: (11.0, 1.12))


def _regional() -> Topology:
    links = region_links()
    intra = (_INTRA_REGION_DELAY_MS, _INTRA_REGION_BANDWIDTH_GBPS)
    return _sites("regional", _REGIONAL, 16, intra, lambda a, b: links[frozenset((a, b))])


def _world() -> Topology:
    links = city_links()
    intra = (_INTRA_REGION_DELAY_MS, _INTRA_REGION_BANDWIDTH_GBPS)
    return _sites("world", _WORLD_CITIES, 8, intra, lambda a, b: links[frozenset((a, b))])


def city_cluster(counts: dict[str, int], *, name: str = "cities") -> Topology:
    """A cluster with `counts[city]` single-GPU hosts in each city of the bundled table.

    Cities: Oregon, Virginia, Ohio, Tokyo, Seoul, Singapore, Sydney, London, Frankfurt,
    Ireland; links from `city_pairs.csv`, 5 ms / 2 Gbps inside a city.

    Raises:
        ValueError: If a city is unknown or a count is < 1.
    """
    links = city_links()
    known = sorted({c for pair in links for c in pair})
    for city, count in counts.items():
        if city not in known:
            raise ValueError(f"unknown city {city!r}; the table has {', '.join(known)}")
        if count < 1:
            raise ValueError(f"{city}: count = {count} must be >= 1")
    devices = [
        Device(name=f"{city.lower()}-{k}", host=f"{city.lower()}-{k}", site=city)
        for city, count in counts.items()
        for k in range(count)
    ]
    intra = (_INTRA_REGION_DELAY_MS, _INTRA_REGION_BANDWIDTH_GBPS)
    return _build(
        name,
        devices,
        lambda a, b: intra if a.site == b.site else links[frozenset((a.site, b.site))],
    )


def mixed_generations(
    topology: Topology, *, fraction_slow: float = 0.5, factor: float = 0.5, seed: int = 0
) -> Topology:
    """A copy in which a seeded `fraction_slow` of devices has `factor` x speed and memory.

    Raises:
        ValueError: If fraction_slow is not in [0, 1] or factor not in (0, 1].
    """
    import dataclasses

    if not 0 <= fraction_slow <= 1 or not 0 < factor <= 1:
        raise ValueError(f"fraction_slow={fraction_slow} in [0, 1], factor={factor} in (0, 1]")
    n = topology.num_devices
    slow = set(np.random.default_rng(seed).permutation(n)[: round(fraction_slow * n)].tolist())
    devices = tuple(
        dataclasses.replace(d, speed=d.speed * factor, memory_gib=d.memory_gib * factor)
        if i in slow
        else d
        for i, d in enumerate(topology.devices)
    )
    return Topology(
        devices=devices,
        delay_ms=topology.delay_ms.copy(),
        bandwidth_gbps=topology.bandwidth_gbps.copy(),
        name=f"{topology.name}_mixed",
    )


def _fluidstack() -> Topology:
    delay: dict[frozenset[str], float] = {}
    bandwidth: dict[tuple[str, str], float] = {}  # (sender, receiver) -> Gbps
    for r in _rows("fluidstack_3region.csv"):
        if r["matrix"] == "delay":
            delay[frozenset((r["from_or_recv"], r["to_or_send"]))] = float(r["value"])
        else:
            receiver = r["from_or_recv"].removesuffix("(recv)")
            sender = r["to_or_send"].removesuffix("(send)")
            bandwidth[(sender, receiver)] = float(r["value"])
    sites = ("East", "Mid", "West")
    devices = [
        Device(name=f"{s.lower()}-{k}", host=f"{s.lower()}-{k}", site=s, memory_gib=48.0)
        for s in sites
        for k in range(8)
    ]

    def link(a: Device, b: Device) -> tuple[float, float]:
        if a.site == b.site:  # assumed inside a FluidStack region (not measured)
            return 0.5, 10.0
        return delay[frozenset((a.site, b.site))], bandwidth[(a.site, b.site)]

    return _build("fluidstack_3region", devices, link)


SCENARIOS: dict[str, Callable[[], Topology]] = {
    "datacenter": _datacenter,
    "spot": _spot,
    "two_sites": _two_sites,
    "regional": _regional,
    "world": _world,
    "fluidstack_3region": _fluidstack,
    "world_uneven": lambda: city_cluster(_UNEVEN_WORLD, name="world_uneven"),
    "world_mixed": lambda: mixed_generations(_world()),
}


def build_scenario(name: str) -> Topology:
    """Return the named preset.

    Raises:
        ConfigError: If the name is unknown; the message lists the known ones.
    """
    try:
        return SCENARIOS[name]()
    except KeyError:
        raise ConfigError(
            f"unknown scenario {name!r}; choose one of {', '.join(SCENARIOS)}"
        ) from None
