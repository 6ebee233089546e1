"""Launch helpers: a free port, and killing every process of a launch by its marker."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from frugal.launch import LAUNCH_ENV, exception_lines, free_port, kill_launch, launch_marker


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
