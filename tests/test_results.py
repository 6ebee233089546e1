"""`frugal.results.BenchJournal`: finished cells survive an interrupted bench, per config."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from frugal.results import BenchJournal


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
