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
from pathlib import Path

from frugal._libc import LAUNCH_ENV

__all__ = [
    "EXCEPTION_LINE",
    "LAUNCH_ENV",
    "exception_lines",
    "free_port",
    "kill_launch",
    "launch_marker",
]


EXCEPTION_LINE = re.compile(r"\b\w*(Error|Exception)\b: ")
"""Matches a worker's exception line ("ValueError: ...", "[rank1]: frugal...Error: ...")."""


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
