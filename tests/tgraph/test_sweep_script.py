"""benchmarks/tgraph/sweep.sh: its workers share the (protocol, group, seed) tasks.

A stand-in for the `frugal` executable records each bench's --out folder and --first-seed
("all" for the bench that writes a group's results over every seed) and sleeps; the real
benches are covered by test_bench.py. What is tested here is the script's scheduling.
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
out="" first=all seeds=""
while [ $# -gt 0 ]; do
    case $1 in
        --out) out=$2; shift ;;
        --first-seed) first=$2; shift ;;
        --seeds) seeds=$2; shift ;;
        --model) echo "$2" >> "$TRACE.models"; shift ;;
    esac
    shift
done
if [ "$first" = all ] && [ "$seeds" != "${SEEDS:-3}" ]; then
    echo "the results bench asked for --seeds $seeds" >&2
    exit 3
fi
echo "start $out $first" >> "$TRACE"
case "$out:$first" in */frugal/collegemsg:0) sleep 5 ;; *) sleep 0.05 ;; esac
if [ "$out $first" = "${FAIL:-}" ]; then
    exit 1
fi
echo "end $out $first" >> "$TRACE"
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


@pytest.mark.slow
def test_every_task_runs_once_and_a_free_worker_takes_the_other_protocol(
    tmp_path: Path,
) -> None:
    proc, lines = _run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out"
    folders = {f"{out}/{p}/{g}" for p in ("frugal", "benchtemp") for g in GROUPS} - {
        f"{out}/benchtemp/pubmed"  # Benchtemp's split is not defined on PubMed's years
    }
    expected = {f"{f} {seed}" for f in folders for seed in ("0", "1", "2", "all")}
    starts = [line.removeprefix("start ") for line in lines if line.startswith("start ")]
    assert sorted(starts) == sorted(expected)  # each seed and each group's results once
    for folder in folders:  # a group's results bench starts after all its seeds ended
        ends = [lines.index(f"end {folder} {seed}") for seed in "012"]
        assert lines.index(f"start {folder} all") > max(ends)
    # frugal/collegemsg seed 0 holds worker 1 for 5 s; worker 2 runs every other task
    # meanwhile, the group's other seeds included, so frugal/collegemsg's results come last
    assert lines[-2:] == [f"start {out}/frugal/collegemsg all", f"end {out}/frugal/collegemsg all"]
    taker = {}
    for line in (out / "frugal" / "sweep.log").read_text().splitlines():
        if " takes " in line:  # "<time> worker <id> takes <protocol>/<group> seed <seed>"
            _, _, worker, _, task, _, seed = line.split()
            taker[task, seed] = worker
    assert set(taker) == {(f"frugal/{g}", s) for g in GROUPS for s in "012"}
    assert taker["frugal/collegemsg", "1"] != taker["frugal/collegemsg", "0"]


def test_one_worker_runs_the_tasks_in_order(tmp_path: Path) -> None:
    proc, lines = _run(tmp_path, WORKERS="1", PROTOCOLS="benchtemp")
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out"
    benchtemp_groups = [g for g in GROUPS if g != "pubmed"]
    assert lines == [
        f"{kind} {out}/benchtemp/{g} {seed}"
        for g in benchtemp_groups
        for seed in ("0", "1", "2", "all")
        for kind in ("start", "end")
    ]
    log = (out / "benchtemp" / "sweep.log").read_text()
    assert "not run: benchtemp/pubmed: Benchtemp's time quantiles" in log


def test_a_failed_seed_leaves_its_group_without_results_and_the_rest_runs(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    failing = f"{out}/benchtemp/sociopatterns 1"
    proc, lines = _run(tmp_path, WORKERS="1", PROTOCOLS="benchtemp", SEEDS="2", FAIL=failing)
    assert proc.returncode == 1
    starts = [line.removeprefix("start ") for line in lines if line.startswith("start ")]
    assert f"{out}/benchtemp/sociopatterns all" not in starts
    assert starts[-3:] == [f"{out}/benchtemp/movielens100k {s}" for s in ("0", "1", "all")]
    assert (
        "FAILED benchtemp/sociopatterns seed 1 (exit 1)"
        in (out / "benchtemp" / "sweep.log").read_text()
    )


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("SEEDS", "0", "must be an integer from 1 to 999"),
        ("SEEDS", "x", "must be an integer from 1 to 999"),
        ("SEEDS", "99999999999999999999999", "must be an integer from 1 to 999"),  # hung
        ("RUN_TIMEOUT_S", "abc", "must be a positive whole number of seconds"),
        ("RUN_TIMEOUT_S", "0", "must be a positive whole number of seconds"),
        ("RUN_TIMEOUT_S", "1.5", "must be a positive whole number of seconds"),
        ("WORKERS", "0", "must be a positive integer"),
        ("WORKERS", "two", "must be a positive integer"),
        ("WORKERS", "-1", "must be a positive integer"),
    ],
)
def test_bad_setting_is_refused_before_any_bench(
    tmp_path: Path, variable: str, value: str, message: str
) -> None:
    proc, lines = _run(tmp_path, **{variable: value})
    assert proc.returncode == 2
    assert f"{variable}={value} {message}" in proc.stderr
    assert lines == []


def test_unknown_protocol_is_refused_before_any_bench(tmp_path: Path) -> None:
    proc, lines = _run(tmp_path, PROTOCOLS="frugal benchtmp")
    assert proc.returncode == 2
    assert "PROTOCOLS names 'benchtmp'; each must be frugal or benchtemp" in proc.stderr
    assert lines == []


@pytest.mark.slow
def test_models_names_the_models_every_bench_runs(tmp_path: Path) -> None:
    proc, lines = _run(tmp_path, MODELS="nat cawn", SEEDS="1", PROTOCOLS="frugal", WORKERS="1")
    assert proc.returncode == 0, proc.stderr
    benches = [line for line in lines if line.startswith("start ")]
    models = (tmp_path / "trace.models").read_text().split()
    assert len(benches) > 0 and models == ["nat", "cawn"] * len(benches)
