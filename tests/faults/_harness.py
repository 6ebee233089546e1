"""One harness for the faults tier: run a command, kill it at a seeded moment, resume, compare.

Every command runs in its own session with a unique `FAULT_TAG` in its environment, which each
process of its tree inherits (torchrun's agent and workers included); after a kill the harness
checks within a few seconds that no tagged process is left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

KILLS_ENV = "FRUGAL_FAULTS_KILLS"
"""Kills per command: 1 by default (CI), 5 in `make faults`."""

FULL_ENV = "FRUGAL_FAULTS_FULL"
"""Set to 1 (`make faults`) to run the whole tier; CI runs the part not marked `full_tier`."""

full_tier = pytest.mark.skipif(
    os.environ.get(FULL_ENV) != "1", reason=f"the full faults tier only ({FULL_ENV}=1, make faults)"
)
"""Marks a fault test that `make faults` runs and CI leaves out (minutes of CPU each)."""

REPORT_ENV = "FRUGAL_FAULTS_REPORT"
"""A JSONL file each survived fault is appended to (`make faults` renders it as RESULTS.md)."""

_ORPHAN_WAIT_S = 10.0


def record(command: str, fault: str, outcome: str) -> None:
    """Append one survived fault to the report file, if `REPORT_ENV` names one.

    Called only after every check of that fault passed, so the report lists what survived.
    """
    path = os.environ.get(REPORT_ENV)
    if path:
        line = {"command": command, "fault": fault, "outcome": outcome}
        with open(path, "a") as handle:
            handle.write(json.dumps(line) + "\n")


def kills_per_command() -> int:
    return max(1, int(os.environ.get(KILLS_ENV, "1")))


def frugal(*args: str) -> list[str]:
    """The argv of `python -m frugal ARGS` with this interpreter."""
    return [sys.executable, "-m", "frugal", *args]


def tagged_processes(tag: str) -> list[int]:
    """Pids whose environment carries FAULT_TAG=tag (zombies excluded)."""
    needle = f"FAULT_TAG={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@dataclass(frozen=True)
class Run:
    """How one attempt ended."""

    returncode: int
    stdout: str
    stderr: str
    elapsed_s: float


def _environment(tag: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "FAULT_TAG": tag}


def run(argv: Sequence[str], cwd: Path, *, timeout_s: float = 600.0) -> Run:
    """Run `argv` to its end; fail the test if it leaves a process behind."""
    tag = uuid.uuid4().hex
    start = time.monotonic()
    done = subprocess.run(
        list(argv), cwd=cwd, env=_environment(tag), capture_output=True, text=True,
        timeout=timeout_s, start_new_session=True,
    )  # fmt: skip
    _assert_no_orphans(tag)
    return Run(done.returncode, done.stdout, done.stderr, time.monotonic() - start)


def _start(argv: Sequence[str], cwd: Path) -> tuple[str, float, subprocess.Popen[str]]:
    """Start `argv` in its own session with a fresh tag; return (tag, start time, process)."""
    tag = uuid.uuid4().hex
    process = subprocess.Popen(
        list(argv), cwd=cwd, env=_environment(tag), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    return tag, time.monotonic(), process


def kill_after(argv: Sequence[str], cwd: Path, delay_s: float, *, whole_group: bool) -> Run:
    """Start `argv`, SIGKILL it after `delay_s`: its process group, or only its own pid.

    Returns how it ended (a run that finished first returns its real exit code). Fails the test
    if any process of its tree outlives the kill by more than a few seconds.
    """
    tag, start, process = _start(argv, cwd)
    try:
        stdout, stderr = process.communicate(timeout=delay_s)
    except subprocess.TimeoutExpired:
        if whole_group:
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.kill()
        stdout, stderr = process.communicate(timeout=60)
    _assert_no_orphans(tag)
    return Run(process.returncode, stdout, stderr, time.monotonic() - start)


def signal_when(
    argv: Sequence[str], cwd: Path, signum: int, *, ready_processes: int, settle_s: float = 1.0,
    whole_group: bool, timeout_s: float = 120.0,
) -> Run:  # fmt: skip
    """Start `argv`; once its tree has `ready_processes` processes (plus `settle_s`), signal it.

    Ctrl-C is SIGINT to the whole foreground group (`whole_group`); a supervisor signals the
    command's own pid. Returns how it ended; fails the test if the command does not end
    within `timeout_s` of the signal, never gets that many processes, or leaves a process.
    """
    tag, start, process = _start(argv, cwd)
    try:
        deadline = time.monotonic() + timeout_s
        while len(tagged_processes(tag)) < ready_processes:
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"never had {ready_processes} processes: {process.returncode} "
                    f"{process.stderr.read()[-2000:] if process.stderr else ''}"
                )
            time.sleep(0.05)
        time.sleep(settle_s)
        if whole_group:
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=timeout_s)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate(timeout=30)
    _assert_no_orphans(tag)
    return Run(process.returncode, stdout, stderr, time.monotonic() - start)


def _assert_no_orphans(tag: str) -> None:
    deadline = time.monotonic() + _ORPHAN_WAIT_S
    while (left := tagged_processes(tag)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:  # do not leave them to the next test
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
    assert left == [], f"processes outlived the command by {_ORPHAN_WAIT_S} s: {left}"


def assert_json_files_whole(folder: Path) -> None:
    """Every .json under `folder` parses: nothing was left half-written by a kill."""
    for path in folder.rglob("*.json"):
        try:
            json.loads(path.read_text())
        except ValueError as exc:
            raise AssertionError(f"{path} is not whole JSON after a kill: {exc}") from exc


MEASURED_SUFFIXES = ("_s", "_ms", "_per_s", "_per_epoch", "_mib", "_at", "_runs", "_mean")
"""Keys that hold timings or resource readings (`s_per_epoch`), which differ from run to run."""


def outcome(row: Mapping[str, Any], drop: Iterable[str] = ()) -> dict[str, Any]:
    """`row` without its timings and resource readings (and the keys in `drop`)."""
    dropped = set(drop)
    return {
        key: value
        for key, value in row.items()
        if key not in dropped and not key.endswith(MEASURED_SUFFIXES)
    }
