"""benchmarks/tgraph/sweep.sh: its workers share the (protocol, group) tasks.

A stand-in for the `frugal` executable records each bench's --out folder and sleeps; the
real benches are covered by test_bench.py. What is tested here is the script's scheduling.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "benchmarks" / "tgraph" / "sweep.sh"
GROUPS = ["collegemsg", "sociopatterns", "pubmed", "movielens100k"]

STAND_IN = """#!/usr/bin/env bash
out=""
while [ $# -gt 0 ]; do
    case $1 in --out) out=$2; shift ;; esac
    shift
done
echo "start $out" >> "$TRACE"
case $out in */frugal/collegemsg) sleep 2 ;; *) sleep 0.2 ;; esac
echo "end $out" >> "$TRACE"
"""

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or shutil.which("flock") is None,
    reason="sweep.sh needs bash and flock (util-linux)",
)


def _run(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    stand_in = tmp_path / "frugal"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)
    trace = tmp_path / "trace"
    proc = subprocess.run(
        ["bash", str(SWEEP)],
        env={
            **os.environ,
            "FRUGAL": str(stand_in),
            "OUT": str(tmp_path / "out"),
            "TRACE": str(trace),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = trace.read_text().splitlines() if trace.exists() else []
    return proc, lines


def test_every_task_runs_once_and_a_free_worker_takes_the_other_protocol(
    tmp_path: Path,
) -> None:
    proc, lines = _run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out"
    expected = {f"{out}/{p}/{g}" for p in ("frugal", "benchtemp") for g in GROUPS} - {
        f"{out}/benchtemp/pubmed"  # Benchtemp's split is not defined on PubMed's years
    }
    starts = [line.removeprefix("start ") for line in lines if line.startswith("start ")]
    assert sorted(starts) == sorted(expected)  # each task exactly once
    # frugal/collegemsg holds worker 1 for 2 s; worker 2 runs every other task meanwhile,
    # frugal groups included, so frugal/collegemsg ends after all the rest
    assert lines[-1] == f"end {out}/frugal/collegemsg"
    taker = {}
    for line in (out / "frugal" / "sweep.log").read_text().splitlines():
        if " takes " in line:  # "<time> worker <id> takes <protocol>/<group>"
            _, _, worker, _, task = line.split()
            taker[task] = worker
    assert set(taker) == {f"frugal/{g}" for g in GROUPS}
    assert taker["frugal/sociopatterns"] != taker["frugal/collegemsg"]


def test_one_worker_runs_the_tasks_in_order(tmp_path: Path) -> None:
    proc, lines = _run(tmp_path, WORKERS="1", PROTOCOLS="benchtemp")
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out"
    benchtemp_groups = [g for g in GROUPS if g != "pubmed"]
    assert lines == [
        f"{kind} {out}/benchtemp/{g}" for g in benchtemp_groups for kind in ("start", "end")
    ]
    log = (out / "benchtemp" / "sweep.log").read_text()
    assert "not run: benchtemp/pubmed: Benchtemp's time quantiles" in log


@pytest.mark.parametrize("workers", ["0", "two", "-1"])
def test_bad_workers_is_refused_before_any_bench(tmp_path: Path, workers: str) -> None:
    proc, lines = _run(tmp_path, WORKERS=workers)
    assert proc.returncode == 2
    assert f"WORKERS={workers} must be a positive integer" in proc.stderr
    assert lines == []


def test_unknown_protocol_is_refused_before_any_bench(tmp_path: Path) -> None:
    proc, lines = _run(tmp_path, PROTOCOLS="frugal benchtmp")
    assert proc.returncode == 2
    assert "PROTOCOLS names 'benchtmp'; each must be frugal or benchtemp" in proc.stderr
    assert lines == []
