"""`frugal.results.BenchJournal`: finished cells survive an interrupted bench, per config."""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from frugal.results import BenchJournal, source_digest, write_results


@dataclass(frozen=True)
class _Config:
    seeds: int = 3
    name: str = "full"


def test_journal_resumes_cells_of_the_same_config_only(tmp_path: Path) -> None:
    path = tmp_path / "out" / "runs.jsonl"
    journal = BenchJournal(path, _Config())
    assert journal.get("collegemsg/tgn/0") is None
    journal.record("collegemsg/tgn/0", [{"auc": 0.91, "epochs": float("nan")}])
    journal.record("collegemsg/tgn/1", [{"auc": 0.92, "epochs": np.int64(7)}])
    with path.open("a") as handle:
        handle.write('{"config": "cut by a cra')  # a crash mid-line
    again = BenchJournal(path, _Config())
    assert again.get("collegemsg/tgn/0") == [{"auc": 0.91, "epochs": None}]  # NaN -> null
    assert again.get("collegemsg/tgn/1") == [{"auc": 0.92, "epochs": 7}]
    again.record("collegemsg/tgn/2", [{"auc": 0.93}])  # after the cut line
    assert BenchJournal(path, _Config()).get("collegemsg/tgn/2") == [{"auc": 0.93}]
    other = BenchJournal(path, _Config(seeds=1))  # another config measures everything again
    assert other.key != again.key
    assert other.get("collegemsg/tgn/0") is None


def test_journal_keyed_on_code_resumes_only_unchanged_code(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "a.py").write_text("x = 1\n")
    (package / "sub" / "b.py").write_text("y = 2\n")
    (package / "notes.txt").write_text("not code")
    path = tmp_path / "runs.jsonl"
    first = BenchJournal(path, _Config(), code=(package,))
    first.record("cell", 1.0)
    assert first.key != BenchJournal(path, _Config()).key  # the code is part of the key
    (package / "notes.txt").write_text("edited, still not code")
    assert BenchJournal(path, _Config(), code=(package,)).get("cell") == 1.0
    copy = tmp_path / "copy"  # the same files elsewhere (a wheel): the same key
    (copy / "sub").mkdir(parents=True)
    (copy / "a.py").write_text("x = 1\n")
    (copy / "sub" / "b.py").write_text("y = 2\n")
    assert BenchJournal(path, _Config(), code=(copy,)).get("cell") == 1.0
    (package / "sub" / "b.py").write_text("y = 3\n")  # one edit measures everything again
    assert BenchJournal(path, _Config(), code=(package,)).get("cell") is None
    assert source_digest(package) != source_digest(copy)


def _run_at_once(target: Callable[..., None], calls: list[tuple[Any, ...]]) -> list[int | None]:
    """Exit codes of one forked process per `calls` entry, all started before any is joined."""
    context = multiprocessing.get_context("fork")
    processes = [context.Process(target=target, args=args) for args in calls]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)
    return [process.exitcode for process in processes]


def _append_cells(path: Path, prefix: str, count: int) -> None:
    journal = BenchJournal(path, _Config())
    for index in range(count):  # rows well past any write buffer, as a TGNN run's are
        journal.record(f"{prefix}/{index}", [{"auc": index, "pad": "x" * 200_000}])


@pytest.mark.slow
def test_two_benches_appending_to_one_journal_keep_every_line(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    assert _run_at_once(_append_cells, [(path, p, 25) for p in "ab"]) == [0, 0]
    lines = path.read_text().splitlines()
    assert len(lines) == 50
    journal = BenchJournal(path, _Config())
    for prefix in "ab":
        for index in range(25):
            assert journal.get(f"{prefix}/{index}")[0]["auc"] == index


def _rewrite_results(path: Path, marker: str, count: int) -> None:
    for index in range(count):
        write_results(path, {"writer": marker, "index": index, "pad": "x" * 50_000})


@pytest.mark.slow
def test_two_benches_writing_one_results_file_never_fail_or_tear_it(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    # A shared temporary name made one writer's rename fail (exit code 1).
    assert _run_at_once(_rewrite_results, [(path, m, 200) for m in "ab"]) == [0, 0]
    assert json.loads(path.read_text())["index"] == 199
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]  # no temp left
