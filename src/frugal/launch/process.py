"""Process helpers of the torchrun launcher: free ports, launch markers, killing a whole job.

torchrun starts its workers in their own sessions, so killing torchrun's process group can
leave workers running. Each launch therefore puts a unique marker in the environment
(`launch_marker()`), which every worker inherits, and `kill_launch(marker)` finds and kills
every process that carries it (Linux /proc; elsewhere it kills nothing and says so).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import uuid
import warnings
from collections.abc import Mapping
from pathlib import Path

from frugal._libc import LAUNCH_ENV
from frugal.config import ConfigError

__all__ = [
    "EXCEPTION_LINE",
    "FORCE_ENV",
    "LAUNCH_ENV",
    "OVERSUBSCRIBE_REFUSE_FACTOR",
    "OVERSUBSCRIBE_WARN_FACTOR",
    "OversubscriptionWarning",
    "check_process_count",
    "exception_lines",
    "free_port",
    "kill_launch",
    "launch_marker",
    "usable_cores",
]


EXCEPTION_LINE = re.compile(r"\b\w*(Error|Exception)\b: ")
"""Matches a worker's exception line ("ValueError: ...", "[rank1]: frugal...Error: ...")."""


FORCE_ENV = "FRUGAL_FORCE_OVERSUBSCRIBE"
"""Set to 1 to start a job that `check_process_count` would refuse."""

OVERSUBSCRIBE_WARN_FACTOR = 4
"""More processes than this many per usable core warn (CI's 8 ranks on 2 cores do not)."""

OVERSUBSCRIBE_REFUSE_FACTOR = 16
"""More processes than this many per usable core are refused unless `FORCE_ENV` is 1."""


class OversubscriptionWarning(UserWarning):
    """A job starts several times more processes than the machine has cores."""


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where known, else `os.cpu_count()`)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def check_process_count(
    nproc: int, *, cores: int | None = None, env: Mapping[str, str] | None = None
) -> None:
    """Warn about, or refuse, a job of `nproc` processes on one machine before it starts.

    A 64-rank plan on a 2-core laptop would otherwise start 64 processes that thrash for
    minutes before their collectives time out.

    Args:
        nproc: Processes the job starts on this machine, >= 1.
        cores: Usable cores (default `usable_cores()`).
        env: Environment to read `FORCE_ENV` from (default `os.environ`).

    Warns:
        OversubscriptionWarning: If `nproc` > `OVERSUBSCRIBE_WARN_FACTOR` x cores.

    Raises:
        ConfigError: If `nproc` > `OVERSUBSCRIBE_REFUSE_FACTOR` x cores and `FORCE_ENV` is
            not "1"; the message names both numbers and the fix.
    """
    cores = usable_cores() if cores is None else cores
    env = os.environ if env is None else env
    per_core = nproc / cores
    if nproc > OVERSUBSCRIBE_REFUSE_FACTOR * cores and env.get(FORCE_ENV) != "1":
        raise ConfigError(
            f"the job would start {nproc} processes on {cores} usable cores ({per_core:g} per "
            f"core, limit {OVERSUBSCRIBE_REFUSE_FACTOR}); use fewer ranks (at most "
            f"{OVERSUBSCRIBE_REFUSE_FACTOR * cores} here), spread them over machines (nnodes), or "
            f"set {FORCE_ENV}=1 to start it anyway"
        )
    if nproc > OVERSUBSCRIBE_WARN_FACTOR * cores:
        warnings.warn(
            f"starting {nproc} processes on {cores} usable cores ({per_core:g} per core): "
            "expect each rank to run several times slower than alone",
            OversubscriptionWarning,
            stacklevel=2,
        )


def exception_lines(text: str, limit: int = 4) -> list[str]:
    """The last `limit` distinct exception lines of a launch's output, oldest first.

    torchrun ends a failed job with its own summary, which hides the workers' errors; these
    lines name the cause.
    """
    found = [line.strip() for line in text.splitlines() if EXCEPTION_LINE.search(line)]
    return list(dict.fromkeys(found))[-limit:]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def launch_marker() -> dict[str, str]:
    """A fresh `{LAUNCH_ENV: id}` to merge into a launch's environment."""
    return {LAUNCH_ENV: uuid.uuid4().hex}


def kill_launch(env: dict[str, str]) -> int:
    """SIGKILL every process (but this one) whose environment carries `env[LAUNCH_ENV]`.

    Args:
        env: The launch's environment (or just its marker).

    Returns:
        How many processes were signalled (0 where /proc is missing).
    """
    marker = env.get(LAUNCH_ENV)
    proc_dir = Path("/proc")
    if not marker or not proc_dir.is_dir():
        return 0
    needle = f"{LAUNCH_ENV}={marker}".encode()
    killed = 0
    for entry in proc_dir.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if needle in environ.split(b"\0"):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
            except OSError:
                continue
    return killed
