"""frugal.launch.run_torchrun: per-rank logs, streamed lines, failures named by rank, timeout."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from frugal.launch import (
    LaunchResult,
    RankFailure,
    TorchrunJob,
    free_port,
    run_torchrun,
    torchrun_command,
)
from frugal.launch.agent import shutdown_timeout_s
from frugal.launch.torchrun import RANK_PREFIX, _failures

TARGET = str(Path(__file__).with_name("rank_echo.py"))

# torchrun's failure summary, as torch 2.13 prints it (rank 1 killed by SIGSEGV).
SUMMARY = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
======================================================
w.py FAILED
------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-04_04:02:11
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 2287)
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-04_04:02:11
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -11 (pid: 2288)  (SIGSEGV)
  error_file: <N/A>
  traceback : Signal 11 (SIGSEGV) received by PID 2288
======================================================
"""


def test_bad_jobs_are_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="nproc=0 must be >= 1"):
        TorchrunJob(["x"], nproc=0, timeout_s=1)
    with pytest.raises(ValueError, match="target is empty"):
        TorchrunJob([], nproc=1, timeout_s=1)
    with pytest.raises(ValueError, match="timeout_s=0 must be > 0"):
        TorchrunJob(["x"], nproc=1, timeout_s=0)
    with pytest.raises(ValueError, match="nnodes=2 needs rdzv_endpoint"):
        TorchrunJob(["x"], nproc=1, timeout_s=1, nnodes=2)
    TorchrunJob(["x"], nproc=1, timeout_s=1, nnodes=2, rdzv_endpoint="10.0.0.1:29500")


def test_the_command_line_names_nodes_rendezvous_and_logs(tmp_path: Path) -> None:
    job = TorchrunJob(["frugal.pipeline.worker", "job.json"], nproc=4, timeout_s=9, nnodes=2,
                      rdzv_endpoint="10.0.0.1:29500", max_restarts=1)  # fmt: skip
    command = torchrun_command(job, log_dir=tmp_path, rdzv_endpoint="10.0.0.1:29500")
    flags = dict(zip(command[3::2], command[4::2], strict=False))
    assert command[1:3] == ["-m", "frugal.launch.agent"]
    assert flags["--nnodes"] == "2" and flags["--nproc-per-node"] == "4"
    assert flags["--rdzv-endpoint"] == "10.0.0.1:29500" and flags["--max-restarts"] == "1"
    assert flags["--log-dir"] == str(tmp_path) and flags["--shutdown-timeout"] == "30"
    assert command[-3:] == ["-m", "frugal.pipeline.worker", "job.json"]
    # The agent reads the grace back from torchrun's own options, not the worker's.
    assert shutdown_timeout_s(command[3:]) == 30
    assert shutdown_timeout_s(["--shutdown_timeout=4", "-m", "w", "--shutdown-timeout", "9"]) == 4
    assert shutdown_timeout_s(["--nnodes", "1", "w.py", "--shutdown-timeout", "9"]) == 30
    with pytest.raises(ValueError, match=r"--shutdown-timeout '-1' must be an integer >= 0"):
        shutdown_timeout_s(["--shutdown-timeout", "-1"])


def test_the_summary_names_the_root_cause_rank_first() -> None:
    failures = _failures(SUMMARY, {1: "Traceback\nRuntimeError: gloo lost\n", 0: ""})
    assert failures == (
        RankFailure(rank=1, exitcode=-11, raised=("RuntimeError: gloo lost",)),
        RankFailure(rank=0, exitcode=1, raised=()),
    )
    assert failures[0].describe() == "rank 1 died of SIGSEGV: RuntimeError: gloo lost"
    assert failures[1].describe() == "rank 0 exited with 1"
    assert failures[1].describe("stage 0") == "rank 0 (stage 0) exited with 1"


def test_the_tee_prefix_gives_the_local_rank() -> None:
    match = RANK_PREFIX.match("[default12]:FRUGAL_PROGRESS {}")
    assert match is not None and match.group(1) == "12"
    assert RANK_PREFIX.match("W1204 04:02:11 torch/distributed/run.py] Setting OMP") is None


@pytest.mark.distributed
@pytest.mark.slow
def test_each_rank_output_is_logged_and_streamed(tmp_path: Path) -> None:
    seen: list[tuple[int, str]] = []
    job = TorchrunJob([TARGET, "0"], nproc=2, timeout_s=120, module=False, log_dir=tmp_path)
    result = run_torchrun(job, on_line=lambda rank, line: seen.append((rank, line)))
    assert result.ok, result.format()
    assert result.rank_output == {
        0: "rank 0 of 2 says ['0']\n",
        1: "rank 1 of 2 says ['0']\n",
    }
    assert sorted(seen) == [(0, "rank 0 of 2 says ['0']"), (1, "rank 1 of 2 says ['0']")]
    assert (tmp_path / "launcher.log").exists() and result.failure_message() == ""


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize(
    ("action", "expected"),
    [
        ("3", "rank 1 exited with 3"),
        ("raise", "rank 1 exited with 1: ValueError: rank one refuses"),
        ("segv", "rank 1 died of SIGSEGV"),
    ],
)
def test_a_failing_rank_is_named_with_its_cause(tmp_path: Path, action: str, expected: str) -> None:
    job = TorchrunJob([TARGET, action], nproc=2, timeout_s=120, module=False, log_dir=tmp_path)
    result = run_torchrun(job)
    assert not result.ok and not result.timed_out
    assert result.failures[0].rank == 1
    assert expected in result.failure_message(), result.format()
    assert "----- rank 1 -----" in result.format()


@pytest.mark.distributed
@pytest.mark.slow
def test_a_job_past_its_limit_is_killed(tmp_path: Path) -> None:
    script = tmp_path / "sleepy.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(300)\n")
    job = TorchrunJob([str(script)], nproc=1, timeout_s=8, module=False, log_dir=tmp_path / "l")
    result = run_torchrun(job)
    assert result.timed_out and not result.ok
    assert "exceeded its 8 s limit" in result.failure_message()


@pytest.mark.distributed
@pytest.mark.slow
def test_two_agents_form_one_job_over_a_shared_rendezvous(tmp_path: Path) -> None:
    # Two torchrun agents on 127.0.0.1 stand for two machines: each runs one process, the
    # c10d rendezvous on one endpoint gives them ranks 0 and 1 of a world of 2.
    endpoint = f"127.0.0.1:{free_port()}"
    results: dict[int, LaunchResult] = {}

    def node(n: int) -> None:
        job = TorchrunJob([TARGET, "0"], nproc=1, timeout_s=120, module=False, nnodes=2,
                          rdzv_endpoint=endpoint, log_dir=tmp_path / f"node{n}")  # fmt: skip
        results[n] = run_torchrun(job)

    threads = [threading.Thread(target=node, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(150)
    assert all(results[n].ok for n in range(2)), [r.format() for r in results.values()]
    said = sorted(results[n].rank_output[0] for n in range(2))
    assert said == ["rank 0 of 2 says ['0']\n", "rank 1 of 2 says ['0']\n"]


@pytest.mark.distributed
@pytest.mark.faults
def test_a_stopped_rank_is_killed_after_the_grace_not_torchs_30_s(tmp_path: Path) -> None:
    # Rank 1 stops itself (SIGSTOP ignores SIGTERM); rank 0 exits 1. With torch's built-in
    # 30 s grace the job would outlive its 25 s limit and be reported as timed out.
    job = TorchrunJob([TARGET, "stop"], nproc=2, timeout_s=25, module=False, log_dir=tmp_path,
                      shutdown_timeout_s=2, rank_roles={0: "stage 0", 1: "stage 1"})  # fmt: skip
    result = run_torchrun(job)
    assert not result.timed_out, result.format()
    message = result.failure_message()
    assert "rank 0 (stage 0) exited with 1" in message
    assert "rank 1 (stage 1) died of SIGKILL" in message
