"""The one torchrun launcher: a job spec, per-rank logs, failure reported by rank, a timeout.

`run_torchrun(job)` starts torchrun (`python -m frugal.launch.agent`) for a `TorchrunJob` (the
worker module and its arguments, processes per node, the rendezvous), tees every rank's stdout and
stderr into its own log file under `job.log_dir`, streams each output line to an optional
callback, and kills the whole job (torchrun, its agent and every worker, found by a launch
marker) when `job.timeout_s` passes. The `LaunchResult` names which rank failed, with what
exit code or signal, and the exception lines that rank printed, so a failed job reads as
"rank 2 died of SIGSEGV" rather than torchrun's summary.

One node runs on 127.0.0.1 with a free port; several nodes run the same job on each machine
with `nnodes` and one shared `rdzv_endpoint` (`torchrun_command` prints that command line).
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from frugal._libc import die_with_parent
from frugal.disk import free_bytes, human_bytes, is_disk_full
from frugal.launch.guards import MemoryEstimate, check_job
from frugal.launch.process import (
    EXCEPTION_LINE,
    free_port,
    kill_launch,
    launch_marker,
)

__all__ = [
    "LaunchResult",
    "RankFailure",
    "TorchrunJob",
    "run_torchrun",
    "torchrun_command",
]

RANK_PREFIX = re.compile(r"^\[(?:[^\]\d]*?)(\d+)\]:")
"""torchrun's `--tee` prefix of a rank's line ("[default1]:text" -> local rank 1)."""

_FAILURE_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)", re.M)
_FAILURE_CODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)", re.M)


@dataclass(frozen=True, slots=True)
class TorchrunJob:
    """What to launch under torchrun and how.

    Attributes:
        target: The worker module and its arguments (`["frugal.pipeline.worker", "job.json"]`),
            or a script path and its arguments when `module` is False.
        nproc: Processes on this node (`--nproc-per-node`), >= 1.
        timeout_s: Wall-clock limit of the whole job in seconds, > 0; after it every process
            of the job is killed.
        module: Whether `target[0]` is a module (`-m`) or a script path.
        max_restarts: torchrun's `--max-restarts` (restarts of the worker group), >= 0.
        env: Extra environment variables for every worker.
        log_dir: Folder for per-rank logs (`<run>/attempt_<k>/<local_rank>/stdout.log`) and
            `launcher.log`; a fresh temporary folder when None.
        nnodes: Machines in the job, >= 1; each runs this same job.
        rdzv_endpoint: `host:port` of the c10d rendezvous all nodes share; None = 127.0.0.1
            with a free port (one node only).
        rdzv_id: Name of the rendezvous; nodes of one job use the same id.
        memory_estimate: What this node's processes together need, checked against the
            machine's memory before starting (`frugal.launch.guards.check_memory`); None
            skips the check.
        force: Start the job even where a resource guard would refuse it (`--force`).
        rank_roles: What each global rank does ("stage 1"), named beside it in failures.
        shutdown_timeout_s: Seconds torchrun waits after SIGTERM before it SIGKILLs the other
            ranks of a failed group (`--shutdown-timeout`; a stopped rank ignores SIGTERM).
    """

    target: Sequence[str]
    nproc: int
    timeout_s: float
    module: bool = True
    max_restarts: int = 0
    env: Mapping[str, str] = field(default_factory=dict)
    log_dir: Path | None = None
    nnodes: int = 1
    rdzv_endpoint: str | None = None
    rdzv_id: str = "frugal"
    memory_estimate: MemoryEstimate | None = None
    force: bool = False
    rank_roles: Mapping[int, str] = field(default_factory=dict)
    shutdown_timeout_s: int = 30

    def __post_init__(self) -> None:
        if not self.target:
            raise ValueError("target is empty; give a module or script and its arguments")
        if self.nproc < 1:
            raise ValueError(f"nproc={self.nproc} must be >= 1; give the processes per node")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s={self.timeout_s} must be > 0 seconds")
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts={self.max_restarts} must be >= 0")
        if self.nnodes < 1:
            raise ValueError(f"nnodes={self.nnodes} must be >= 1")
        if self.nnodes > 1 and self.rdzv_endpoint is None:
            raise ValueError(
                f"nnodes={self.nnodes} needs rdzv_endpoint='host:port' reachable by every node "
                "(the default 127.0.0.1 rendezvous serves one machine)"
            )


_LOW_DISK_BYTES = 64 << 10
"""Free space under which a failed job's missing rank output is put down to a full disk."""


@dataclass(frozen=True, slots=True)
class RankFailure:
    """One rank that did not exit 0.

    Attributes:
        rank: Global rank (torchrun's numbering).
        exitcode: Its exit code; negative = killed by that signal.
        raised: The exception lines it printed ("ValueError: ..."), oldest first.
    """

    rank: int
    exitcode: int
    raised: tuple[str, ...]

    @property
    def signal_name(self) -> str | None:
        """The signal that killed the rank ("SIGSEGV"), or None when it exited by itself."""
        if self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"

    def describe(self, role: str = "") -> str:
        """One line: `rank 2 exited with 1: ValueError: ...` or `rank 1 (stage 1) died of SIGKILL`.

        Args:
            role: What the rank does, named in parentheses ("" = nothing).
        """
        how = (
            f"died of {self.signal_name}"
            if self.signal_name is not None
            else f"exited with {self.exitcode}"
        )
        who = f"rank {self.rank}" + (f" ({role})" if role else "")
        return f"{who} {how}" + (f": {' | '.join(self.raised)}" if self.raised else "")


@dataclass(frozen=True, slots=True)
class LaunchResult:
    """What a torchrun job left behind.

    Attributes:
        returncode: torchrun's exit code; None when the job was killed at its timeout.
        launcher_output: torchrun's own output (the agent's lines, not the ranks').
        rank_output: Per local rank, its stdout then stderr of the last attempt.
        failures: The ranks torchrun reported as failed (root cause first).
        log_dir: Where the logs are.
        timeout_s: The job's limit (for the message).
        rank_roles: What each rank does (`TorchrunJob.rank_roles`), for the message.
    """

    returncode: int | None
    launcher_output: str
    rank_output: dict[int, str]
    failures: tuple[RankFailure, ...]
    log_dir: Path
    timeout_s: float
    rank_roles: Mapping[int, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when torchrun exited 0 (every rank exited 0)."""
        return self.returncode == 0

    @property
    def timed_out(self) -> bool:
        """True when the job was killed at its timeout."""
        return self.returncode is None

    def failure_message(self) -> str:
        """Why the job failed, by rank, in one paragraph ('' when it succeeded).

        Names each failed rank's exit code or signal and its exception lines; where no rank
        is named (a timeout, a rendezvous failure) it gives the last output lines instead.
        """
        if self.ok:
            return ""
        if self.timed_out:
            head = f"the job exceeded its {self.timeout_s:g} s limit and was killed"
        else:
            head = f"torchrun exited with {self.returncode}"
        parts = [f.describe(self.rank_roles.get(f.rank, "")) for f in self.failures]
        if not any(failure.raised for failure in self.failures):
            raised = {
                rank: _exception_lines(text) for rank, text in sorted(self.rank_output.items())
            }
            parts += [
                f"rank {r} printed: {' | '.join(lines)}" for r, lines in raised.items() if lines
            ]
        if not parts:
            tail = [line for line in self.launcher_output.splitlines() if line.strip()][-4:]
            parts = [f"last output: {' | '.join(tail)}"] if tail else []
        if not any(failure.raised for failure in self.failures):
            free = free_bytes(self.log_dir)
            if free < _LOW_DISK_BYTES:  # the ranks could not even write why they failed
                parts.append(
                    f"the disk holding {self.log_dir} is full ({human_bytes(free)} free), so "
                    "the ranks' output and results could not be written; free space there or "
                    "give --out a folder on a larger disk"
                )
        return "; ".join([head, *parts]) + f" (rank logs: {self.log_dir})"

    def format(self) -> str:
        """All output, rank by rank, for a test's failure message."""
        parts = [self.failure_message() or "ok", self.launcher_output[-4000:]]
        for rank, text in sorted(self.rank_output.items()):
            parts.append(f"----- rank {rank} -----\n{text[-4000:]}")
        return "\n".join(parts)


def _exception_lines(text: str, limit: int = 4) -> list[str]:
    found = [line.strip() for line in text.splitlines() if EXCEPTION_LINE.search(line)]
    return list(dict.fromkeys(found))[-limit:]


def torchrun_command(job: TorchrunJob, *, log_dir: Path, rdzv_endpoint: str) -> list[str]:
    """The torchrun command line of `job` (for each node): `python -m frugal.launch.agent ...`.

    `frugal.launch.agent` is torch's `torch.distributed.run` with `--shutdown-timeout`
    honoured when a failed group is stopped too (see that module).

    Args:
        job: The job.
        log_dir: Where the per-rank logs go (`--log-dir`).
        rdzv_endpoint: The resolved `host:port` of the rendezvous.
    """
    command = [
        sys.executable, "-m", "frugal.launch.agent",
        "--nnodes", str(job.nnodes),
        "--nproc-per-node", str(job.nproc),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", rdzv_endpoint,
        "--rdzv-id", job.rdzv_id,
        "--max-restarts", str(job.max_restarts),
        "--shutdown-timeout", str(job.shutdown_timeout_s),
        "--log-dir", str(log_dir),
        "--redirects", "3",
        "--tee", "3",
    ]  # fmt: skip
    return command + (["-m", *job.target] if job.module else list(job.target))


def _read_rank_logs(log_dir: Path) -> dict[int, str]:
    """`<run>/attempt_<k>/<local_rank>/{stdout,stderr}.log` of the last attempt, per rank."""
    output: dict[int, str] = {}
    runs = sorted((p for p in log_dir.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    if not runs:  # a reused log_dir holds earlier jobs' folders: the newest is this job's
        return output
    attempts = sorted(runs[-1].glob("attempt_*"), key=lambda p: int(p.name.split("_")[-1]))
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


def _failures(launcher_output: str, rank_output: dict[int, str]) -> tuple[RankFailure, ...]:
    """Failed ranks from torchrun's failure summary (`rank : R (local_rank: L)`, `exitcode`)."""
    found: list[RankFailure] = []
    ranks = list(_FAILURE_RANK.finditer(launcher_output))
    for i, match in enumerate(ranks):
        end = ranks[i + 1].start() if i + 1 < len(ranks) else len(launcher_output)
        code = _FAILURE_CODE.search(launcher_output, match.end(), end)
        local = int(match.group(2))
        found.append(
            RankFailure(
                rank=int(match.group(1)),
                exitcode=int(code.group(1)) if code else 1,
                raised=tuple(_exception_lines(rank_output.get(local, ""))),
            )
        )
    # the summary lists "Failures" before "Root Cause": put the root cause first, once each
    unique = {f.rank: f for f in reversed(found)}
    return tuple(unique.values())


def run_torchrun(
    job: TorchrunJob, *, on_line: Callable[[int, str], None] | None = None
) -> LaunchResult:
    """Run `job` under torchrun; return every rank's output and which ranks failed.

    Args:
        job: What to run.
        on_line: Called with (local rank, line without its newline) for each line a rank
            prints, as it is printed (progress reports); an exception it raises stops the job.

    Returns:
        The exit code, torchrun's and each rank's output, the failed ranks. It does not raise
        on a failed job: callers turn `failure_message()` into their own error.

    Warns:
        OversubscriptionWarning: If `job.nproc` is several times the usable cores.
        MemoryWarning: If `job.memory_estimate` exceeds the memory free now.

    Raises:
        ConfigError: If `job.nproc` exceeds `OVERSUBSCRIBE_REFUSE_FACTOR` x the usable cores
            (see `check_process_count`) or `job.memory_estimate` the machine's memory (see
            `check_memory`), and `job.force` is not set; nothing is started.
        OSError: If torchrun cannot be started.
    """
    check_job(job.nproc, job.memory_estimate, force=job.force)
    log_dir = (
        job.log_dir if job.log_dir is not None else Path(tempfile.mkdtemp(prefix="frugal-run-"))
    )
    log_dir.mkdir(parents=True, exist_ok=True)
    endpoint = job.rdzv_endpoint or f"127.0.0.1:{free_port()}"
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
        MASTER_ADDR=env.get("MASTER_ADDR", "127.0.0.1"),
        GLOO_SOCKET_IFNAME=env.get("GLOO_SOCKET_IFNAME", "lo"),
        TP_SOCKET_IFNAME=env.get("TP_SOCKET_IFNAME", "lo"),
        PYTHONUNBUFFERED="1",
    )
    src = str(Path(__file__).resolve().parents[2])  # workers import this frugal
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    env.update(job.env)
    env.update(launch_marker())
    process = subprocess.Popen(
        torchrun_command(job, log_dir=log_dir, rdzv_endpoint=endpoint),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        env=env,
        start_new_session=True,  # its own process group: a timeout kills torchrun and agent
        # kill -9 of this process takes the agent with it (its workers follow: die_with_launcher)
        preexec_fn=functools.partial(die_with_parent, parent_pid=os.getpid()),
    )
    lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()

    def pump() -> None:
        assert process.stdout is not None
        for text in process.stdout:
            lines.put(text)
        lines.put(None)

    threading.Thread(target=pump, name="frugal-torchrun-output", daemon=True).start()
    launcher: list[str] = []
    deadline = time.monotonic() + job.timeout_s
    code: int | None = None
    try:
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break  # timed out: code stays None
            if line is None:
                code = process.wait(timeout=max(1.0, deadline - time.monotonic()))
                break
            match = RANK_PREFIX.match(line)
            if match is None:
                launcher.append(line)
            elif on_line is not None:
                on_line(int(match.group(1)), line[match.end() :].rstrip("\n"))
    except subprocess.TimeoutExpired:
        code = None
    finally:
        if process.poll() is None:
            process.terminate()  # torchrun's agent stops its workers on SIGTERM
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        kill_launch(env)  # workers live in their own sessions: killpg misses them
    launcher_output = "".join(launcher)
    try:
        (log_dir / "launcher.log").write_text(launcher_output)
    except OSError as exc:  # a full disk: the output is still in the result; say so, go on
        if not is_disk_full(exc):
            raise
        (log_dir / "launcher.log").unlink(missing_ok=True)
        launcher_output += f"\n(launcher.log not written: the disk holding {log_dir} is full)\n"
    rank_output = _read_rank_logs(log_dir)
    failures = _failures(launcher_output, rank_output) if code != 0 else ()
    return LaunchResult(
        code, launcher_output, rank_output, failures, log_dir, job.timeout_s, job.rank_roles
    )
