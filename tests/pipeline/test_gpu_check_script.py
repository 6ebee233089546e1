"""benchmarks/gpu/check.py runs its every check on the CPU at its tiny size (so it never rots)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "check.py"


def test_the_gpu_check_passes_on_the_cpu_when_tiny(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "summary.json"
    argv = ["--device", "cpu", "--tiny", "--steps", "5", "--repeats", "1", "--codecs",
            "aqsgd:fw2,bw4", "--out", str(out)]  # fmt: skip
    assert module.main(argv) == 0
    printed = capsys.readouterr().out
    summary = json.loads(printed.strip().splitlines()[-1])  # the compact JSON comes last
    assert summary == json.loads(out.read_text())
    assert summary["ok"] and summary["failed"] == [] and summary["num_checks"] > 40
    (run,) = summary["pipeline"]["runs"]
    assert run["codec"] == "aqsgd:fw2,bw4" and run["tokens_per_s"] > 0
    assert run["loss_last"] < run["loss_first"]
    assert {(row["codec"], row["dtype"]) for row in summary["codecs"]} >= {
        ("aqsgd2", "bfloat16"),
        ("c2", "bfloat16"),
        ("q2", "float32"),
    }
