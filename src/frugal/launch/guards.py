"""Resource guards a job passes before any process starts: process count and memory.

A 64-rank plan on a 2-core laptop would start 64 processes that thrash for minutes before
their collectives time out; a job whose processes together need more memory than the machine
has is killed by the OOM killer part-way, often taking the desktop with it. Both are checked
before torchrun starts: past a soft limit the job warns with the numbers, past a hard limit
it is refused, unless forced (`--force` on the commands that launch, or `FRUGAL_FORCE=1`).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from frugal.config import ConfigError
from frugal.disk import human_bytes

__all__ = [
    "FORCE_ENV",
    "OVERSUBSCRIBE_REFUSE_FACTOR",
    "OVERSUBSCRIBE_WARN_FACTOR",
    "MemoryEstimate",
    "MemoryWarning",
    "OversubscriptionWarning",
    "check_job",
    "check_memory",
    "check_process_count",
    "forced",
    "machine_memory_bytes",
    "usable_cores",
]

FORCE_ENV = "FRUGAL_FORCE"
"""Set to 1 to start a job that a guard would refuse (as `--force` does)."""

OVERSUBSCRIBE_WARN_FACTOR = 4
"""More processes than this many per usable core warn (CI's 8 ranks on 2 cores do not)."""

OVERSUBSCRIBE_REFUSE_FACTOR = 16
"""More processes than this many per usable core are refused unless forced."""

_FORCE_FIX = f"pass --force (or set {FORCE_ENV}=1) to start it anyway"


class OversubscriptionWarning(UserWarning):
    """A job starts several times more processes than the machine has cores."""


class MemoryWarning(UserWarning):
    """A job's estimated memory exceeds what the machine has free now."""


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def forced(force: bool = False, env: Mapping[str, str] | None = None) -> bool:
    """Whether the guards are overridden: `force` (a command's `--force`) or `FORCE_ENV`.

    `FORCE_ENV` is read as a boolean: 1, true, yes or on (any case) force; unset, empty, 0,
    false, no or off do not.

    Raises:
        ConfigError: If `FORCE_ENV` holds another value.
    """
    env = os.environ if env is None else env
    value = env.get(FORCE_ENV, "").strip().lower()
    if value not in _TRUE + _FALSE:
        raise ConfigError(
            f"{FORCE_ENV}={env.get(FORCE_ENV)!r} is not a yes/no value; set it to 1 to force "
            "a job the resource guards refuse, or unset it"
        )
    return force or value in _TRUE


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where known, else `os.cpu_count()`)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def check_process_count(
    nproc: int, *, cores: int | None = None, force: bool = False,
    env: Mapping[str, str] | None = None,
) -> None:  # fmt: skip
    """Warn about, or refuse, a job of `nproc` processes on one machine before it starts.

    Args:
        nproc: Processes the job starts on this machine, >= 1.
        cores: Usable cores (default `usable_cores()`).
        force: Start it whatever the count (a command's `--force`).
        env: Environment to read `FORCE_ENV` from (default `os.environ`).

    Warns:
        OversubscriptionWarning: If `nproc` > `OVERSUBSCRIBE_WARN_FACTOR` x cores.

    Raises:
        ConfigError: If `nproc` > `OVERSUBSCRIBE_REFUSE_FACTOR` x cores and the job is not
            forced; the message names both numbers and the fix.
    """
    cores = usable_cores() if cores is None else cores
    per_core = nproc / cores
    if nproc > OVERSUBSCRIBE_REFUSE_FACTOR * cores and not forced(force, env):
        raise ConfigError(
            f"the job would start {nproc} processes on {cores} usable cores ({per_core:g} per "
            f"core, limit {OVERSUBSCRIBE_REFUSE_FACTOR}); use fewer ranks (at most "
            f"{OVERSUBSCRIBE_REFUSE_FACTOR * cores} here), spread them over machines (nnodes), or "
            f"{_FORCE_FIX}"
        )
    if nproc > OVERSUBSCRIBE_WARN_FACTOR * cores:
        warnings.warn(
            f"starting {nproc} processes on {cores} usable cores ({per_core:g} per core): "
            "expect each rank to run several times slower than alone",
            OversubscriptionWarning,
            stacklevel=2,
        )


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """Resident memory a job is expected to need, as named terms.

    An estimate, not a bound: each term is what its part holds in steady state (allocator
    slack, page cache and transient copies are left out), so a job near the machine's memory
    may still be killed. Terms name their arithmetic ("4 processes x 300 MiB").

    Attributes:
        terms: (what, bytes) pairs, bytes >= 0.
        fix: The job's own way to need less, first in a refusal's list of fixes ("" = none).
    """

    terms: tuple[tuple[str, int], ...]
    fix: str = ""

    def __post_init__(self) -> None:
        for what, count in self.terms:
            if count < 0:
                raise ValueError(f"memory term {what!r} = {count} bytes must be >= 0")

    @property
    def total_bytes(self) -> int:
        """The sum of the terms, bytes."""
        return sum(count for _, count in self.terms)

    def per_machine(self, nnodes: int) -> MemoryEstimate:
        """The share of one of `nnodes` machines that split the job evenly (terms / nnodes)."""
        if nnodes == 1:
            return self
        return MemoryEstimate(
            tuple((f"{what} / {nnodes} machines", count // nnodes) for what, count in self.terms),
            self.fix,
        )

    def describe(self) -> str:
        """`about 2.3 GiB (a: 1 GiB, b: 1.3 GiB)`, the terms of more than 0 bytes."""
        parts = ", ".join(f"{what}: {human_bytes(count)}" for what, count in self.terms if count)
        return f"about {human_bytes(self.total_bytes)} ({parts})"


def _cgroup_limit_bytes() -> int | None:
    """The memory limit of this process's cgroup (v2 `memory.max`, v1 `limit_in_bytes`)."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # v1 says "no limit" with a huge number
            return int(text)
    return None


def machine_memory_bytes() -> tuple[int, int]:
    """(total, available) memory of this machine in bytes, within its cgroup's limit.

    Total is physical memory (or the cgroup limit, if lower); available is Linux's
    `MemAvailable` (what can be allocated without swapping), capped at total. Where
    /proc/meminfo is missing, available equals total.
    """
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = _cgroup_limit_bytes()
    if limit is not None:
        total = min(total, limit)
    available = total
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = min(total, int(line.split()[1]) * 1024)
                break
    except OSError:
        pass
    return total, available


def check_memory(
    estimate: MemoryEstimate, *, what: str = "the job", force: bool = False,
    total_bytes: int | None = None, available_bytes: int | None = None,
    env: Mapping[str, str] | None = None,
) -> None:  # fmt: skip
    """Warn about, or refuse, a job whose estimated memory exceeds the machine's.

    Args:
        estimate: The job's memory estimate.
        what: The job, for the message.
        force: Start it whatever the estimate (a command's `--force`).
        total_bytes: The machine's memory (default `machine_memory_bytes()`).
        available_bytes: Memory free now (default `machine_memory_bytes()`).
        env: Environment to read `FORCE_ENV` from (default `os.environ`).

    Warns:
        MemoryWarning: If the estimate exceeds the memory available now (other programs hold
            the rest; the job may swap or be killed).

    Raises:
        ConfigError: If the estimate exceeds the machine's total memory and the job is not
            forced; the message gives the estimate term by term and the fix.
    """
    if total_bytes is None or available_bytes is None:
        total, available = machine_memory_bytes()
        total_bytes = total if total_bytes is None else total_bytes
        available_bytes = available if available_bytes is None else available_bytes
    need = estimate.total_bytes
    if need > total_bytes and not forced(force, env):
        raise ConfigError(
            f"{what} would need {estimate.describe()} but this machine has "
            f"{human_bytes(total_bytes)} of memory; "
            + (f"{estimate.fix}, " if estimate.fix else "")
            + f"use fewer processes or a smaller model, table or dataset, or {_FORCE_FIX}"
        )
    if need > available_bytes:
        warnings.warn(
            f"{what} would need {estimate.describe()}, more than the "
            f"{human_bytes(available_bytes)} free now: expect swapping or the OOM killer",
            MemoryWarning,
            stacklevel=2,
        )


def check_job(nproc: int, memory: MemoryEstimate | None, *, force: bool = False) -> None:
    """Every guard for a job of `nproc` processes on this machine (and its memory estimate).

    The launcher (`run_torchrun`) applies it; commands that print or write before launching
    call it first, so a refused job leaves nothing behind.

    Warns:
        OversubscriptionWarning: If `nproc` is several times the usable cores.
        MemoryWarning: If `memory` exceeds the memory free now.

    Raises:
        ConfigError: If a guard refuses the job and it is not forced.
    """
    check_process_count(nproc, force=force)
    if memory is not None:
        check_memory(memory, what=f"the {nproc}-process job", force=force)
