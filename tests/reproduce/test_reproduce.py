"""frugal reproduce: verdict arithmetic, config checks, failure isolation, resume, the report."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from frugal import FrugalError
from frugal.bench.harness import BenchResult, Summary, write_bench_results
from frugal.config import ConfigError
from frugal.reproduce import PART_NAMES, ReproduceConfig, Verdict, get_part, run_reproduce
from frugal.reproduce import parts as parts_module
from frugal.reproduce.report import verdict_table
from frugal.results import git_commit
from tests.bench._summaries import (
    pipeline_summary,
    plan_validation_summary,
    planner_summary,
    store_summary,
)


def _result(summary: Summary, rows: list[dict[str, Any]] | None = None) -> BenchResult[Any]:
    rows = rows or []
    return BenchResult(summary=summary, rows=rows, document={"rows": rows})


def test_verdict_met_follows_the_comparison_and_is_none_when_unmeasured() -> None:
    base = {"part": "store", "claim": "c", "target": 3.0}
    assert Verdict(**base, value=3.0, comparison=">=").met is True
    assert Verdict(**base, value=2.99, comparison=">=").met is False
    assert Verdict(**base, value=2.0, comparison="<=").met is True
    assert Verdict(**base, value=None, comparison=">=").met is None
    assert Verdict(**base, value=float("nan"), comparison=">=").met is None
    assert Verdict(**base, value=4.0, comparison=">=").as_row()["met"] is True


def test_config_rejects_unknown_duplicate_and_empty_parts() -> None:
    assert ReproduceConfig().only == PART_NAMES
    with pytest.raises(ValueError, match="unknown part 'stor'"):
        ReproduceConfig(only=("stor",))
    with pytest.raises(ValueError, match="twice"):
        ReproduceConfig(only=("store", "store"))
    with pytest.raises(ValueError, match="selects no part"):
        ReproduceConfig(only=())
    with pytest.raises(ConfigError, match="fast"):
        ReproduceConfig(mode="fast")  # type: ignore[arg-type]


def _store_row(
    system: str,
    ratio: float,
    lookahead: int,
    samples_per_s: float,
    workload: str = "criteo_zipf",
) -> dict[str, Any]:
    return {
        "system": system,
        "workload": workload,
        "memory_ratio": ratio,
        "lookahead": lookahead,
        "staleness_bound": 0,
        "samples_per_s": samples_per_s,
        "status": "ok",
    }


def test_store_verdicts_divide_the_right_cells() -> None:
    rows = [
        _store_row("frugal", 0.10, 4, 900.0),
        _store_row("frugal", 0.10, 0, 1.0),  # not the headline window
        _store_row("rocksdb_offload", 0.10, 0, 200.0),
        _store_row("mlkv", 0.10, 4, 600.0),
        _store_row("frugal", 0.25, 4, 1000.0),
        _store_row("ram", 0.25, 0, 2500.0),
        _store_row("frugal", 0.10, 4, 900.0, "kge_freebase"),
        _store_row("rocksdb_offload", 0.10, 0, 100.0, "kge_freebase"),
        _store_row("mlkv", 0.10, 4, 750.0, "kge_freebase"),
    ]
    summary = store_summary(lookahead=4, bit_identical_at_staleness_0={"criteo_zipf": True})
    verdicts = get_part("store").verdicts(_result(summary, rows))
    values = [v.value for v in verdicts]
    # criteo: 900/200, 900/600, 1000/2500; KGE: 900/100, 900/750; GNN: not measured;
    # bit-identical
    assert values[:5] == pytest.approx([4.5, 1.5, 0.4, 9.0, 1.2])
    assert values[5:] == [None, None, 1.0]
    assert [v.met for v in verdicts] == [True, True, False, True, False, None, None, True]
    assert "KGE" in verdicts[3].claim and "8.0x rocksdb_offload" in verdicts[3].claim
    assert "GNN" in verdicts[5].claim and "1.5x rocksdb_offload" in verdicts[5].claim
    assert verdicts[0].baseline == 200.0 and verdicts[0].ours == 900.0


def test_pipeline_verdicts_include_dp_and_torch_baseline_only_when_measured() -> None:
    summary = pipeline_summary(
        slowest_link="100mbps",
        speedup_at_slowest=3.5,
        speedup_monotone_within_noise=True,
        loss_gap_aqsgd_fw2=0.004,
        loss_gap_directq_fw2=0.02,
        max_sim_gap=0.2,
        bytes_match_analytic=True,
        quality_start="scratch",  # "pre-trained" below names the LLM claim only
    )
    part = get_part("pipeline")
    base = part.verdicts(_result(summary))
    assert [v.met for v in base] == [True, True, True, True, False, True]
    summary = replace(
        summary,
        dp_speedup_at_slowest=2.5,
        torch_pipelining_tokens_per_s={"gpipe": 100.0},
        speedup_vs_torch_pipelining=1.2,
    )
    extra = part.verdicts(_result(summary))[len(base) :]
    assert [(v.value, v.met) for v in extra] == [(2.5, False), (1.2, True)]
    with_llm = part.verdicts(_result(replace(summary, llm_speedup_at_slowest=3.2)))
    llm = [v for v in with_llm if "pre-trained" in v.claim]
    assert [(v.value, v.met) for v in llm] == [(3.2, True)]
    assert "smollm2-135m" in llm[0].claim and "100mbps" in llm[0].claim
    skipped = part.verdicts(_result(replace(summary, llm_skipped="no wheel")))
    assert [v.met for v in skipped if "pre-trained" in v.claim] == [None]  # not measured
    both = replace(summary, speedup_vs_torch_pipelining_by_schedule={"gpipe": 1.2, "1f1b": 0.9})
    torch_verdict = [v for v in part.verdicts(_result(both)) if "torch" in v.claim]
    assert [(v.value, v.met) for v in torch_verdict] == [(0.9, False)]  # the worst schedule
    assert "gpipe, 1f1b" in torch_verdict[0].claim
    assert [v.met for v in skipped if "pre-trained" in v.claim] == [None]  # not measured
    # The end-to-end section: judged against what its warm-up epochs allow, and its loss.
    e2e = replace(
        summary, e2e_speedup_at_slowest=1.8, e2e_amdahl_ceiling=1.875, e2e_eval_loss_gap=0.02
    )
    rows = [v for v in part.verdicts(_result(e2e)) if v.claim.startswith("AQ-SGD end")]
    assert [(v.value, v.met) for v in rows] == [(pytest.approx(0.96), True), (0.02, False)]
    assert "1.80x" in rows[0].claim and "1.88x" in rows[0].claim and "4.3x" in rows[0].claim
    assert not [v for v in base if v.claim.startswith("AQ-SGD end")]  # no section, no claim


def test_planner_verdicts_average_the_random_seeds() -> None:
    cell = {"scenario": "world", "num_layers": 24, "global_batch": 1024, "status": "ok"}
    rows = [
            cell | {"method": "ours", "predicted_iteration_s": 10.0},
            cell | {"method": "megatron_random", "predicted_iteration_s": 40.0},
            cell | {"method": "megatron_random", "predicted_iteration_s": 60.0},
            cell | {"method": "megatron_default", "predicted_iteration_s": 30.0},
            cell | {"method": "deepspeed_pp", "predicted_iteration_s": 8.0},
            cell | {"method": "dtfm_ga", "predicted_iteration_s": 12.0},
            cell | {"num_layers": 40, "method": "ours", "predicted_iteration_s": 20.0},
            cell | {"num_layers": 40, "method": "dtfm_ga", "predicted_iteration_s": 19.0},
            {"scenario": "world", "method": "ours", "objective": "paper", "paper_cost_s": 5.0},
            {"scenario": "world", "method": "dtfm_ga", "objective": "paper", "paper_cost_s": 4.0},
    ]  # fmt: skip
    summary = planner_summary(search_s_world=2.0)  # validation: max error 0.25, ranking matches
    verdicts = get_part("planner").verdicts(_result(summary, rows))
    # ..., GA vs ours under the iteration model (worst cell: 19 / 20), under the paper's cost
    assert [v.value for v in verdicts] == pytest.approx([5.0, 3.0, 0.8, 0.95, 0.8, 0.25, 1.0, 2.0])
    assert [v.met for v in verdicts] == [True, True, False, False, False, False, True, True]
    assert "worst of 2 cells: world L40 B1024" in verdicts[3].claim


def test_planner_verdicts_compare_with_the_released_scheduler_when_the_bench_ran_it() -> None:
    cell = {"scenario": "world", "num_layers": 24, "global_batch": 1024, "status": "ok"}
    rows = [
        cell | {"method": "ours", "predicted_iteration_s": 10.0},
        cell | {"method": "dtfm_ga", "predicted_iteration_s": 12.0},
        cell | {"method": "dtfm", "predicted_iteration_s": 11.0},
        {"scenario": "world", "method": "ours", "objective": "paper", "paper_cost_s": 5.0},
        {"scenario": "world", "method": "dtfm_ga", "objective": "paper", "paper_cost_s": 6.0},
        {"scenario": "world", "method": "dtfm", "objective": "paper", "paper_cost_s": 4.0},
    ]
    verdicts = get_part("planner").verdicts(_result(planner_summary(search_s_world=2.0), rows))
    released = [v for v in verdicts if v.baseline_name == "dtfm"]
    # 11 / 10 under the iteration model; 4 / 5 under the paper's cost (not met).
    assert [(v.value, v.met) for v in released] == [
        (pytest.approx(1.1), True),
        (pytest.approx(0.8), False),
    ]
    assert "the released DT-FM scheduler" in released[1].claim


def test_verdict_table_has_one_row_per_verdict_and_names_the_baseline() -> None:
    verdict = Verdict(part="planner", claim="x", value=2.0, target=1.0, comparison=">=",
                      ours=1.0, baseline_name="ga", baseline=2.0, unit="s")  # fmt: skip
    lines = verdict_table([verdict, replace(verdict, value=None)])
    assert len(lines) == 4
    assert "ga: 2 s" in lines[2] and "**met**" in lines[2]
    assert "not measured" in lines[3]
    piped = verdict_table([replace(verdict, claim="|a - b| <= 1")])[2]
    assert "\\|a - b\\| <= 1" in piped and piped.count(" | ") == 6


def test_a_resumed_part_whose_summary_lacks_a_field_fails_instead_of_not_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(part: Any, mode: str, out: Path, progress: Any) -> BenchResult[Any]:
        raise AssertionError("a finished part is read back, not run again")

    monkeypatch.setattr(parts_module.Part, "run", never)
    folder = tmp_path / "parts" / "store"
    rows = [_store_row("frugal", 0.10, 4, 900.0), _store_row("rocksdb_offload", 0.10, 0, 200.0)]
    config = ReproduceConfig(mode="smoke", only=("store",))
    written = write_bench_results("store", config, rows, store_summary(), folder / "results.json")
    marker = {"mode": "smoke", "status": "ok", "git_commit": git_commit(), "wall_s": 1.0}
    (folder / "part.json").write_text(json.dumps(marker))
    # Intact, the part comes back with its verdicts.
    _, outcomes = run_reproduce(config, tmp_path, show_progress=False)
    assert outcomes[0].resumed and outcomes[0].status == "ok"
    assert outcomes[0].verdicts[0].value == pytest.approx(4.5)
    # A renamed key: the part fails and says which key, its claims are not "not measured".
    document = written.document
    document["summary"]["speedup_vs_rocksdb"] = document["summary"].pop(
        "speedup_vs_rocksdb_offload"
    )
    (folder / "results.json").write_text(json.dumps(document))
    report, outcomes = run_reproduce(config, tmp_path, show_progress=False)
    assert outcomes[0].status == "failed" and outcomes[0].verdicts == ()
    assert "lacks StoreSummary.speedup_vs_rocksdb_offload" in (outcomes[0].error or "")
    assert report["summary"]["parts_failed"] == ["store"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class _ScriptedPart(parts_module.Part):
    """A part whose run is a test's function instead of its bench."""

    script: Callable[[str, Path, Any], Any]

    def run(self, mode: Any, out: Path, progress: Any) -> Any:
        return self.script(mode, out, progress)


def _scripted(part: parts_module.Part, script: Callable[[str, Path, Any], Any]) -> _ScriptedPart:
    fields = {f.name: getattr(part, f.name) for f in dataclasses.fields(parts_module.Part)}
    return _ScriptedPart(**fields, script=script)


@pytest.mark.slow
def test_a_failing_part_is_reported_and_the_others_still_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(mode: str, out: Path, progress: Any) -> dict[str, Any]:
        raise FrugalError("disk on fire")

    monkeypatch.setitem(
        parts_module._PARTS, "store", _scripted(parts_module._PARTS["store"], broken)
    )
    config = ReproduceConfig(mode="smoke", only=("store", "planner"))
    document, outcomes = run_reproduce(config, tmp_path, show_progress=False)
    assert [o.status for o in outcomes] == ["failed", "ok"]
    assert document["summary"]["parts_failed"] == ["store"]
    report = (tmp_path / "report.md").read_text()
    assert "FrugalError: disk on fire" in report
    assert (tmp_path / "planner.png").exists() and not (tmp_path / "store.png").exists()
    assert {r["part"] for r in document["rows"]} == {"planner"}

    # A second call resumes the finished part and retries only the failed one.
    calls: list[str] = []

    def record(name: str) -> Any:
        def run(mode: str, out: Path, progress: Any) -> dict[str, Any]:
            calls.append(name)
            raise FrugalError("still broken")

        return run

    for name in ("store", "planner"):
        monkeypatch.setitem(
            parts_module._PARTS, name, _scripted(parts_module._PARTS[name], record(name))
        )
    document2, outcomes2 = run_reproduce(config, tmp_path, show_progress=False)
    assert calls == ["store"]  # planner came back from its results.json
    assert outcomes2[1].resumed and outcomes2[1].status == "ok"
    planner_rows = [r for r in document["rows"] if r["part"] == "planner"]
    assert [r for r in document2["rows"] if r["part"] == "planner"] == planner_rows


@pytest.mark.slow
def test_cli_smoke_run_writes_every_section_and_figure(tmp_path: Path) -> None:
    out = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "frugal.cli.main", "reproduce", "--smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    document = json.loads((out / "results.json").read_text())
    failed = document["summary"]["parts_failed"]
    assert proc.returncode == (1 if failed else 0), proc.stderr[-2000:]
    report = (out / "report.md").read_text()
    for name in PART_NAMES:
        assert f"## {name}: " in report
        status = document["summary"]["parts"][name]["status"]
        assert status in ("ok", "failed")
        if status == "ok":
            assert (out / f"{name}.png").stat().st_size > 1000
    assert "## Verdicts" in report and "## Environment" in report


def test_versus_divides_throughputs_and_inverts_times() -> None:
    versus = parts_module._versus
    # Throughput: 900 / 200 = 4.5 >= 3. Time: baseline 6 s / ours 2 s = 3.0 >= 3.
    fast = versus("store", "c", ours=900.0, baseline_name="b", baseline=200.0, target=3.0, unit="")
    assert (fast.value, fast.met, fast.ours, fast.baseline) == (4.5, True, 900.0, 200.0)
    timed = versus(
        "planner", "c", ours=2.0, baseline_name="b", baseline=6.0, target=3.0, unit="s",
        lower_is_better=True,
    )  # fmt: skip
    assert (timed.value, timed.met, timed.comparison) == (3.0, True, ">=")
    missing = versus("store", "c", ours=None, baseline_name="b", baseline=1.0, target=1, unit="")
    assert missing.value is None and missing.met is None


def test_the_planner_part_folds_its_validation_into_the_bench_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from frugal.bench import plan_validation

    validation = plan_validation_summary(sim_vs_measured_max_error=0.07)
    runs: list[str] = []

    def fake_validation(config: Any, out: Path, progress: Any = None) -> BenchResult[Any]:
        runs.append(str(out))
        return BenchResult(summary=validation, rows=[{"method": "ours"}], document={})

    monkeypatch.setattr(plan_validation, "run_plan_validation", fake_validation)
    bench = BenchResult(summary=planner_summary(), rows=[{"scenario": "world"}], document={})
    part = get_part("planner")
    assert part.extend is not None
    assert part.extend("smoke", tmp_path, print, bench) is bench  # smoke skips the emulation
    folded = part.extend("quick", tmp_path, print, bench)
    assert runs == [str(tmp_path / "validation")]
    assert folded.summary.validation == validation
    assert folded.summary.sim_vs_measured_max_error == 0.07
    assert folded.rows == [{"scenario": "world"}, {"validation": True, "method": "ours"}]
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["summary"]["sim_vs_measured_max_error"] == 0.07  # a resumed part reads it back
    runs.clear()  # full: the 16-rank clusters run too, their rows marked by cluster
    full = part.extend("full", tmp_path, print, bench)
    assert runs == [str(tmp_path / p) for p in ("validation", "validation16/uniform",
                                                 "validation16/world")]  # fmt: skip
    assert full.rows[-1] == {"validation": True, "cluster16": "world", "method": "ours"}


def test_recsys_rows_for_out_of_core_and_bounded_tables_appear_only_when_measured() -> None:
    from frugal.bench.recsys import RecsysBoundedSummary, RecsysOutOfCoreSummary
    from tests.bench._summaries import recsys_summary

    plain = parts_module._recsys_table_verdicts(recsys_summary())
    assert plain == []
    ooc = RecsysOutOfCoreSummary(
        throughput_over_in_ram={"1": 1.0, "0.25": 0.95, "0.1": 0.85},
        auc_gap_vs_in_ram={"1": 0.0, "0.25": 0.0, "0.1": -0.0004},
        ps_hit_ratio={"1": 1.0, "0.25": 0.99, "0.1": 0.97},
    )
    bounded = RecsysBoundedSummary(
        distinct_ids=1000, capacity_rows={"10": 50}, completed={"10": True},
        auc_cost_vs_unbounded={"10": 0.0123}, throughput_over_unbounded={"10": 0.9},
        evicted_rows={"10": 5.0}, expired_rows={"10": 0.0}, rejected_updates={"10": 7.0},
    )  # fmt: skip
    summary = recsys_summary(out_of_core={"z": ooc}, bounded={"z": bounded})
    rows = parts_module._recsys_table_verdicts(summary)
    assert [r.claim[:32] for r in rows] == [
        "z: hybrid with PS shards at memo",
        "z: |AUC(memory:data 0.1) - AUC(e",
        "z: PS shards holding 1/10 of the",
    ]
    assert (rows[0].value, rows[0].met, rows[1].value, rows[1].met) == (0.85, True, 0.0004, True)
    assert "AUC cost vs unbounded +0.0123" in rows[2].claim and rows[2].met
