"""The bench harness: typed summaries through JSON, strict reading, cells, medians, presets."""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

import pytest

from frugal import FrugalError
from frugal.bench.harness import (
    PRESETS,
    Bench,
    Summary,
    load_bench_result,
    median,
    median_after_warmup,
    median_item,
    run_cell,
    write_bench_results,
)
from frugal.bench.pipeline import PIPELINE_BENCH, PipelineBenchConfig
from frugal.bench.planner import PLAN_BENCH, PlanBenchConfig, PlannerSummary
from frugal.bench.recsys import RECSYS_BENCH, RecsysBenchConfig
from frugal.bench.store import STORE_BENCH, StoreBenchConfig, StoreSummary
from frugal.bench.tgraph import TGRAPH_BENCH, TgraphBenchConfig, TgraphSummary
from tests.bench._summaries import every_summary, planner_summary, store_summary


@pytest.mark.parametrize("summary", every_summary(), ids=lambda s: type(s).__name__)
def test_every_summary_round_trips_through_json(summary: Summary) -> None:
    text = summary.to_json()
    assert type(summary).from_json(text) == summary
    # The serialisation is the plain dataclass one: one key per field, nested as dicts.
    assert json.loads(text) == asdict(summary)  # type: ignore[call-overload]  # a dataclass


def test_a_missing_key_is_an_error_naming_it() -> None:
    data = store_summary().to_dict()
    del data["speedup_vs_rocksdb_offload"]
    with pytest.raises(ValueError, match=r"lacks StoreSummary\.speedup_vs_rocksdb_offload"):
        StoreSummary.from_dict(data)
    # A field that may be None must still be present.
    data = planner_summary().to_dict()
    del data["search_s_world"]
    with pytest.raises(ValueError, match=r"lacks PlannerSummary\.search_s_world"):
        PlannerSummary.from_dict(data)


def test_a_missing_key_of_a_nested_summary_is_an_error_with_its_dotted_path() -> None:
    data = planner_summary().to_dict()
    del data["validation"]["ranking_matches"]
    with pytest.raises(ValueError, match=r"PlannerSummary\.validation\.ranking_matches"):
        PlannerSummary.from_dict(data)


def test_an_unknown_key_is_an_error() -> None:
    data = store_summary().to_dict() | {"speedup_vs_rocksdb": {"0.1": 4.5}}  # a renamed key
    with pytest.raises(ValueError, match=r"unknown StoreSummary\.speedup_vs_rocksdb\b"):
        StoreSummary.from_dict(data)


def test_a_wrong_type_is_an_error() -> None:
    data = store_summary().to_dict() | {"lookahead": "4"}
    with pytest.raises(TypeError, match=r"StoreSummary\.lookahead='4' must be an integer"):
        StoreSummary.from_dict(data)


def test_a_null_float_reads_back_as_nan() -> None:
    # results.json writes NaN as null; a plain float field reads it back as NaN.
    data = TgraphSummary.from_dict(
        json.loads(
            json.dumps(
                {
                    "protocols": {},
                    "datasets": {},
                    "tgn_vs_pyg_reference": None,
                }
            )
        )
    )
    assert data.tgn_vs_pyg_reference is None
    point = store_summary().to_dict()
    point["staleness_study"][0]["final_loss"] = None
    assert math.isnan(StoreSummary.from_dict(point).staleness_study[0].final_loss)


def test_results_file_round_trip_and_a_clear_error_on_a_bad_one(tmp_path: Path) -> None:
    summary = store_summary()
    path = tmp_path / "results.json"
    written = write_bench_results("store", StoreBenchConfig(), [{"system": "ram"}], summary, path)
    assert written.document["summary"] == summary.to_dict()
    back = load_bench_result(path, StoreSummary)
    assert back.summary == summary and back.rows == [{"system": "ram"}]
    document = json.loads(path.read_text())
    del document["summary"]["lookahead"]
    path.write_text(json.dumps(document))
    with pytest.raises(ValueError, match=r"json: StoreSummary lacks StoreSummary\.lookahead;"):
        load_bench_result(path, StoreSummary)


def test_run_cell_returns_the_value_of_a_child() -> None:
    outcome = run_cell(math.sqrt, 16.0, timeout_s=60)
    assert (outcome.status, outcome.value, outcome.error) == ("ok", 4.0, None)
    assert outcome.unwrap("sqrt") == 4.0


def test_run_cell_reports_an_exception_as_an_error() -> None:
    outcome = run_cell(math.sqrt, -1.0, timeout_s=60)
    assert outcome.status == "error" and outcome.value is None
    assert outcome.error == "ValueError: math domain error"
    assert outcome.traceback is not None and "ValueError" in outcome.traceback
    with pytest.raises(FrugalError, match=r"cell 7 failed \(error\): ValueError: math domain"):
        outcome.unwrap("cell 7")


def test_run_cell_kills_a_child_past_its_timeout() -> None:
    began = time.perf_counter()
    outcome = run_cell(time.sleep, 30.0, timeout_s=0.2)
    assert outcome.status == "timeout" and outcome.error == "over 0.2 s; killed"
    assert time.perf_counter() - began < 10  # killed, not waited for
    with pytest.raises(ValueError, match="timeout_s=0 must be > 0"):
        run_cell(math.sqrt, 1.0, timeout_s=0)


def test_medians() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5  # mean of the two middle values
    # 10 warm-up values (slow first steps) are left out: median of [1, 2, 3]
    assert median_after_warmup([9.0] * 10 + [1.0, 2.0, 3.0], 10) == 2.0
    assert median_after_warmup([5.0, 7.0], 4) == 6.0  # warm-up leaves none: all values
    assert median_item([{"v": 3.0}, {"v": 1.0}, {"v": 2.0}, {"v": 4.0}], key=lambda r: r["v"]) == {
        "v": 3.0
    }  # the upper middle of an even count: one whole measurement
    with pytest.raises(ValueError, match="no values"):
        median([])
    with pytest.raises(ValueError, match="warmup=-1"):
        median_after_warmup([1.0], -1)


@pytest.mark.parametrize(
    "config_type",
    [
        StoreBenchConfig,
        TgraphBenchConfig,
        RecsysBenchConfig,
        PipelineBenchConfig,
        PlanBenchConfig,
    ],
)
def test_every_bench_declares_each_preset(config_type: type) -> None:
    configs = {name: config_type.preset(name) for name in PRESETS}
    assert configs["full"] == config_type()
    assert configs["smoke"] != configs["full"]


@pytest.mark.parametrize(
    ("bench", "name", "config_type"),
    [
        (STORE_BENCH, "store", StoreBenchConfig),
        (TGRAPH_BENCH, "tgraph", TgraphBenchConfig),
        (RECSYS_BENCH, "recsys", RecsysBenchConfig),
        (PIPELINE_BENCH, "pipeline", PipelineBenchConfig),
        (PLAN_BENCH, "planner", PlanBenchConfig),
    ],
)
def test_every_bench_spec_names_its_area_and_builds_its_presets(
    bench: Bench[object, Summary], name: str, config_type: type
) -> None:
    assert bench.name == name
    assert issubclass(bench.summary_type, Summary)
    assert bench.preset("smoke") == config_type.preset("smoke")


def test_bench_config_builds_presets_from_its_tables() -> None:
    from frugal.bench.harness import BenchConfig

    # ClassVar is imported at module level: dataclasses recognises a string annotation
    # (from __future__ import annotations) as ClassVar only through the module's globals.
    @dataclass(frozen=True, kw_only=True, slots=True)
    class Inner:
        epochs: int = 8
        lr: float = 0.1

    @dataclass(frozen=True, kw_only=True, slots=True)
    class DemoConfig(BenchConfig):
        steps: int = 100
        seeds: tuple[int, ...] = (0, 1, 2)
        inner: Inner = field(default_factory=Inner)
        QUICK: ClassVar = {"steps": 10, "inner": {"epochs": 2}}
        PRESETS: ClassVar = {"quick": {"seeds": (0,)}, "smoke": {"inner": Inner(epochs=1)}}

    # --quick: the defaults + QUICK (a mapping updates the nested Config field by field)
    assert DemoConfig.quick() == DemoConfig(steps=10, inner=Inner(epochs=2))
    assert DemoConfig.preset("full") == DemoConfig()
    assert DemoConfig.preset("quick") == DemoConfig(steps=10, seeds=(0,), inner=Inner(epochs=2))
    # smoke: the quick preset + its own settings (a Config value replaces the field)
    assert DemoConfig.preset("smoke") == DemoConfig(steps=10, seeds=(0,), inner=Inner(epochs=1))
    with pytest.raises(ValueError, match="choose one of smoke, quick, full"):
        DemoConfig.preset("huge")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"PRESETS names \['full'\]"):

        class _Bad(BenchConfig):
            PRESETS: ClassVar = {"full": {}}
