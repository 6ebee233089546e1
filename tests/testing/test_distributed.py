"""frugal.testing.run_torchrun: per-rank output, exit codes, the timeout."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from frugal.testing import free_port, run_torchrun

TARGET = str(Path(__file__).with_name("rank_echo.py"))


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="nproc=0"):
        run_torchrun(["x"], nproc=0, timeout_s=1)
    with pytest.raises(ValueError, match="target is empty"):
        run_torchrun([], nproc=1, timeout_s=1)


@pytest.mark.distributed
@pytest.mark.slow
def test_each_rank_output_is_captured(tmp_path: Path) -> None:
    result = run_torchrun([TARGET, "0"], nproc=2, timeout_s=120, module=False, log_dir=tmp_path)
    assert result.ok, result.format()
    assert result.rank_output == {
        0: "rank 0 of 2 says ['0']\n",
        1: "rank 1 of 2 says ['0']\n",
    }


@pytest.mark.distributed
@pytest.mark.slow
def test_a_failing_rank_fails_the_job(tmp_path: Path) -> None:
    result = run_torchrun([TARGET, "3"], nproc=2, timeout_s=120, module=False, log_dir=tmp_path)
    assert not result.ok and result.returncode not in (0, None)
    assert "----- rank 1 -----" in result.format()
