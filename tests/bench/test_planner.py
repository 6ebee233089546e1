"""The plan bench at its smallest setting writes complete results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frugal.bench.planner import PlanBenchConfig, run_plan_bench


@pytest.mark.slow
def test_smallest_plan_bench(tmp_path: Path) -> None:
    config = PlanBenchConfig(
        scenarios=("world",), num_layers=(24,), global_batches=(1024,), budget=5,
        random_seeds=(2022,), convergence_budget=5, convergence_scenarios=("world",),
    )  # fmt: skip
    document = run_plan_bench(config, tmp_path).document
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["benchmark"] == "plan"
    iteration_rows = [r for r in saved["rows"] if r.get("objective") != "paper"]
    assert [r["method"] for r in iteration_rows] == [
        "ours", "swap", "ours_grid", "megatron_default", "megatron_random", "deepspeed_pp",
        "random", "dtfm_ga", "dtfm",
    ]  # fmt: skip
    curves = [r for r in saved["rows"] if r.get("objective") == "paper"]
    assert [r["method"] for r in curves] == ["random", "dtfm_ga", "dtfm", "swap", "ours"]
    assert all(0 < r["lower_bound_s"] <= r["paper_cost_s"] for r in curves)
    assert all(r["candidates"] == 5 and r["curve"] for r in curves)
    assert (tmp_path / "convergence.png").stat().st_size > 1000
    keys = {"scenario", "num_layers", "global_batch", "method", "predicted_iteration_s",
            "paper_cost_s", "search_s", "lower_bound_s", "simulated_gpipe_s",
            "simulated_1f1b_s"}  # fmt: skip
    assert all(keys <= set(r) for r in iteration_rows)
    by_method = {r["method"]: r for r in iteration_rows}
    # The simulator reproduces the analytic GPipe model; deepspeed_pp is scored by 1F1B.
    ours = by_method["ours"]
    assert ours["simulated_gpipe_s"] == pytest.approx(ours["predicted_iteration_s"], rel=0.01)
    deepspeed = by_method["deepspeed_pp"]
    assert deepspeed["predicted_iteration_s"] == deepspeed["simulated_1f1b_s"]
    assert all(r["lower_bound_s"] <= r["predicted_iteration_s"] for r in iteration_rows)
    summary = document["summary"]
    assert summary["world_speedup_vs_megatron_random"] > 1.0
    assert set(summary["world_speedup_vs_megatron_random_best_schedule_by_cell"]) == {"L24/B1024"}
    assert summary["memetic_vs_swap_iteration_min"] > 0
    assert set(summary["convergence_memetic_vs_swap"]) == {"world"}
    ga = by_method["dtfm_ga"]
    assert summary["ours_vs_dtfm_ga_iteration_min"] == pytest.approx(
        ga["predicted_iteration_s"] / ours["predicted_iteration_s"]
    )
    costs = {r["method"]: r["paper_cost_s"] for r in curves}
    assert summary["ours_vs_dtfm_ga_paper_min"] == pytest.approx(costs["dtfm_ga"] / costs["ours"])
    assert summary["ours_vs_dtfm_paper_min"] == pytest.approx(costs["dtfm"] / costs["ours"])
    assert summary["ours_vs_dtfm_iteration_min"] == pytest.approx(
        by_method["dtfm"]["predicted_iteration_s"] / ours["predicted_iteration_s"]
    )
    # ours_grid may choose another grid; its rows say which (D_pp x D_dp = 64).
    grid_row = next(r for r in iteration_rows if r["method"] == "ours_grid")
    assert grid_row["num_stages"] * grid_row["num_replicas"] == 64


def test_bad_bench_config() -> None:
    with pytest.raises(ValueError, match="unknown scenario 'mars'"):
        PlanBenchConfig(scenarios=("mars",))
    with pytest.raises(ValueError, match="methods is empty"):
        PlanBenchConfig(methods=())


def test_every_compared_method_is_an_arm_of_a_registered_planner_method() -> None:
    from typing import get_args

    from frugal.bench.planner import _ARMS, Method
    from frugal.planner.methods import method_names

    assert set(_ARMS) == set(get_args(Method))
    assert {arm.method for arm in _ARMS.values()} <= set(method_names())
    # DeepSpeed's engine places as Megatron does; ours_grid is ours searching the shape too.
    assert _ARMS["deepspeed_pp"].method == "megatron_default" and _ARMS["deepspeed_pp"].deepspeed
    assert _ARMS["ours_grid"].method == "ours" and _ARMS["ours_grid"].search_shape
