"""Run a torchrun job on 127.0.0.1 with a free port and a timeout, capturing each rank's output.

`run_torchrun` launches `python -m torch.distributed.run` with a c10d rendezvous on a free
loopback port, one thread per process, each rank's stdout and stderr redirected to its own
log file, and a wall-clock limit after which the whole process group is killed. The result
gives each rank's output, so a failing test can print it by rank.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from frugal.comm.launch import free_port, kill_launch, launch_marker

__all__ = ["TorchrunResult", "free_port", "run_torchrun"]


@dataclass(frozen=True, slots=True)
class TorchrunResult:
    """What a torchrun job left behind.

    Attributes:
        returncode: torchrun's exit code (None if it was killed at the timeout).
        launcher_output: torchrun's own stdout and stderr.
        rank_output: Per local rank, its stdout then stderr (last attempt).
    """

    returncode: int | None
    launcher_output: str
    rank_output: dict[int, str]

    @property
    def ok(self) -> bool:
        """True if torchrun exited 0 (every rank exited 0)."""
        return self.returncode == 0

    def format(self) -> str:
        """All output, rank by rank, for a failure message."""
        parts = [f"torchrun exit code: {self.returncode}", self.launcher_output[-4000:]]
        for rank, text in sorted(self.rank_output.items()):
            parts.append(f"----- rank {rank} -----\n{text[-4000:]}")
        return "\n".join(parts)


def _read_rank_logs(log_dir: Path) -> dict[int, str]:
    """Collect `<attempt>/<local_rank>/{stdout,stderr}.log` of the last attempt."""
    output: dict[int, str] = {}
    attempts = sorted(log_dir.glob("**/attempt_*"), key=lambda p: int(p.name.split("_")[-1]))
    if not attempts:
        return output
    for rank_dir in attempts[-1].iterdir():
        if rank_dir.is_dir() and rank_dir.name.isdigit():
            text = ""
            for name in ("stdout.log", "stderr.log"):
                path = rank_dir / name
                if path.exists():
                    text += path.read_text(errors="replace")
            output[int(rank_dir.name)] = text
    return output


def run_torchrun(
    target: list[str],
    *,
    nproc: int,
    timeout_s: float,
    module: bool = True,
    max_restarts: int = 0,
    env: dict[str, str] | None = None,
    log_dir: Path | None = None,
) -> TorchrunResult:
    """Run `target` as `nproc` processes under torchrun on loopback.

    Args:
        target: A module name and its arguments (or a script path and arguments if
            `module=False`).
        nproc: Processes (`--nproc-per-node`), >= 1.
        timeout_s: Wall-clock limit; after it the process group is killed (SIGKILL).
        module: Whether `target[0]` is a module (`-m`).
        max_restarts: torchrun's `--max-restarts`.
        env: Extra environment variables for every process.
        log_dir: Where rank logs go (a temporary folder if None).

    Returns:
        Exit code and each rank's output.

    Raises:
        ValueError: If `nproc` < 1 or `target` is empty.
    """
    if nproc < 1:
        raise ValueError(f"nproc={nproc} must be >= 1")
    if not target:
        raise ValueError("target is empty; give a module or script and its arguments")
    logs = log_dir if log_dir is not None else Path(tempfile.mkdtemp(prefix="frugal-torchrun-"))
    command = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1",
        "--nproc-per-node", str(nproc),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
        "--max-restarts", str(max_restarts),
        "--log-dir", str(logs),
        "--redirects", "3",
    ]  # fmt: skip
    command += ["-m", *target] if module else target
    full_env = dict(os.environ)
    full_env.update(
        OMP_NUM_THREADS="1",
        GLOO_SOCKET_IFNAME=full_env.get("GLOO_SOCKET_IFNAME", "lo"),
        TP_SOCKET_IFNAME=full_env.get("TP_SOCKET_IFNAME", "lo"),
    )
    full_env.update(env or {})
    full_env.update(launch_marker())
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=full_env,
        start_new_session=True,
        text=True,
    )
    try:
        launcher_output, _ = process.communicate(timeout=timeout_s)
        code: int | None = process.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        launcher_output, _ = process.communicate()
        code = None
    finally:
        kill_launch(full_env)  # workers live in their own sessions: killpg misses them
    return TorchrunResult(code, launcher_output or "", _read_rank_logs(logs))
