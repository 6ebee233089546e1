"""`Topology`: devices and the links between them, as the planner sees a cluster.

Shape legend: N devices.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from frugal._typing import F64

__all__ = ["Device", "Topology"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Device:
    """One accelerator."""

    name: str
    """Unique name, e.g. "oregon-3"."""
    host: str
    """Machine it sits in (devices of one host share its NIC)."""
    site: str
    """Data center or region."""
    speed: float = 1.0
    """Compute speed relative to the reference GPU (V100 = 1.0), > 0."""
    memory_gib: float = 16.0
    """Accelerator memory in GiB, > 0."""
    nic_gbps: float = math.inf
    """Capacity of the host's NIC in each direction, Gbit/s, > 0; messages between hosts share
    it (inf: the links' own bandwidth is the only limit)."""


@dataclass(frozen=True, eq=False)
class Topology:
    """Devices plus per-pair one-way delay (ms) and bandwidth (Gbps).

    Attributes:
        devices: The devices; their index is the device id used everywhere in the planner.
        delay_ms: One-way delay from device a to device b in milliseconds, >= 0.
        bandwidth_gbps: Bandwidth from a to b in Gbit/s, > 0 off the diagonal.
        name: What the topology describes (a scenario name or a file).

    Raises:
        ValueError: On construction, if shapes disagree, names repeat, or a delay is negative,
            a bandwidth is not positive, or a value is NaN.

    Shapes:
        delay_ms, bandwidth_gbps: (N, N); the diagonal is ignored.
    """

    devices: tuple[Device, ...]
    delay_ms: F64
    bandwidth_gbps: F64
    name: str = ""

    def __post_init__(self) -> None:
        n = len(self.devices)
        if n < 1:
            raise ValueError("a topology needs at least one device")
        names = [d.name for d in self.devices]
        if len(set(names)) != n:
            dup = next(x for x in names if names.count(x) > 1)
            raise ValueError(f"device name {dup!r} appears more than once; names must be unique")
        for label, matrix in (("delay_ms", self.delay_ms), ("bandwidth_gbps", self.bandwidth_gbps)):
            if matrix.shape != (n, n):
                raise ValueError(f"{label} has shape {matrix.shape}, expected ({n}, {n})")
        off = ~np.eye(n, dtype=bool)
        if np.isnan(self.delay_ms[off]).any() or np.isnan(self.bandwidth_gbps[off]).any():
            raise ValueError("delay_ms and bandwidth_gbps must not hold NaN off the diagonal")
        if (self.delay_ms[off] < 0).any():
            a, b = np.argwhere((self.delay_ms < 0) & off)[0]
            raise ValueError(
                f"delay {names[a]} -> {names[b]} = {self.delay_ms[a, b]} ms must be >= 0"
            )
        if (self.bandwidth_gbps[off] <= 0).any():
            a, b = np.argwhere((self.bandwidth_gbps <= 0) & off)[0]
            raise ValueError(
                f"bandwidth {names[a]} -> {names[b]} = {self.bandwidth_gbps[a, b]} Gbps must be "
                "> 0 (a missing link is not a zero-bandwidth link)"
            )
        for device in self.devices:
            if device.speed <= 0 or device.memory_gib <= 0 or not device.nic_gbps > 0:
                raise ValueError(
                    f"device {device.name}: speed={device.speed}, memory_gib="
                    f"{device.memory_gib} and nic_gbps={device.nic_gbps} must be > 0"
                )

    @property
    def num_devices(self) -> int:
        """N."""
        return len(self.devices)

    @property
    def sites(self) -> tuple[str, ...]:
        """Site of every device."""
        return tuple(d.site for d in self.devices)

    def is_symmetric(self) -> bool:
        """Whether both matrices equal their transposes."""
        return bool(
            np.allclose(self.delay_ms, self.delay_ms.T)
            and np.allclose(self.bandwidth_gbps, self.bandwidth_gbps.T)
        )

    def sha256(self) -> str:
        """Digest of the devices and both matrices (so a plan names the cluster it was made for)."""
        digest = hashlib.sha256()
        for d in self.devices:
            nic = f"|{d.nic_gbps}" if math.isfinite(d.nic_gbps) else ""  # older digests hold
            digest.update(f"{d.name}|{d.host}|{d.site}|{d.speed}|{d.memory_gib}{nic};".encode())
        digest.update(np.ascontiguousarray(self.delay_ms, dtype=np.float64).tobytes())
        digest.update(np.ascontiguousarray(self.bandwidth_gbps, dtype=np.float64).tobytes())
        return digest.hexdigest()
