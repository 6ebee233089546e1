"""Launch helpers: a free port, killing every process of a launch, the oversubscription guard."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from frugal.config import ConfigError
from frugal.launch import (
    FORCE_ENV,
    LAUNCH_ENV,
    OversubscriptionWarning,
    TorchrunJob,
    check_process_count,
    exception_lines,
    free_port,
    kill_launch,
    launch_marker,
    run_torchrun,
    usable_cores,
)


def test_free_port_can_be_bound() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_kill_launch_reaches_a_grandchild_in_its_own_session() -> None:
    marker = launch_marker()
    assert set(marker) == {LAUNCH_ENV} and marker != launch_marker()
    env = {**os.environ, **marker}
    # The child starts a grandchild in a new session (as torchrun does) and exits.
    code = (
        "import subprocess, sys;"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
        " start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL);"
        " print(p.pid)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30
    )
    grandchild = int(out.stdout.strip())
    assert kill_launch(marker) == 1
    for _ in range(100):  # reaped by init; /proc entry disappears or turns zombie
        try:
            state = Path(f"/proc/{grandchild}/stat").read_text().split()[2]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"process {grandchild} still running after kill_launch")
    assert kill_launch(marker) == 0
    assert kill_launch({}) == 0


def test_exception_lines_pick_the_workers_errors_not_torchruns_summary() -> None:
    log = "\n".join(
        [
            "W1129 starting 2 workers",
            "[rank1]: Traceback (most recent call last):",
            "[rank1]: frugal.recsys.errors.RecsysError: id 9 out of range [0, 8) in feature c3",
            "[rank0]: ValueError: empty batch",
            "[rank1]: frugal.recsys.errors.RecsysError: id 9 out of range [0, 8) in feature c3",
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
            "============================================================",
        ]
    )
    assert exception_lines(log, limit=2) == [
        "[rank0]: ValueError: empty batch",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
    ]
    assert exception_lines(log)[0].endswith("id 9 out of range [0, 8) in feature c3")
    assert exception_lines("all good\n") == []


def test_a_few_processes_per_core_start_without_a_word() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_process_count(8, cores=2)  # CI's largest distributed test: 4 per core


def test_several_processes_per_core_warn_with_the_count() -> None:
    with pytest.warns(OversubscriptionWarning, match=r"starting 9 processes on 2 usable cores"):
        check_process_count(9, cores=2)


def test_too_many_processes_are_refused_with_the_limit_that_is_then_accepted() -> None:
    with pytest.raises(ConfigError, match=r"64 processes on 2 usable cores .*at most 32 here"):
        check_process_count(64, cores=2, env={})
    with pytest.warns(OversubscriptionWarning):
        check_process_count(32, cores=2, env={})  # the number the error names is accepted
    with pytest.warns(OversubscriptionWarning):  # forced: it starts, with the warning
        check_process_count(64, cores=2, env={FORCE_ENV: "1"})


def test_run_torchrun_refuses_an_oversubscribed_job_before_starting_it(tmp_path: Path) -> None:
    job = TorchrunJob(
        target=["frugal.no_such_worker"], nproc=1000 * usable_cores(), timeout_s=5,
        log_dir=tmp_path / "logs",
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"pass --force \(or set FRUGAL_FORCE=1\)"):
        run_torchrun(job)
    assert not (tmp_path / "logs").exists()  # nothing was started or written
