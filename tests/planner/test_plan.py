"""Plan as data: JSON round trip, canonical hash, validation, the CLI."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from frugal.cli.main import main
from frugal.planner import build_scenario
from frugal.planner.iteration import WorkloadConfig
from frugal.planner.plan import Plan, PlannerConfig, build_plan


@pytest.fixture(scope="module")
def world_plan() -> Plan:
    return build_plan(build_scenario("world"), PlannerConfig(budget=10, seed=3))


def test_json_round_trip_and_canonical_bytes(world_plan: Plan) -> None:
    text = world_plan.to_json()
    assert Plan.from_json(text) == world_plan
    assert Plan.from_json(text).to_json() == text
    assert json.loads(text)["format_version"] == 2
    again = build_plan(build_scenario("world"), PlannerConfig(budget=10, seed=3))
    assert again.sha256 == world_plan.sha256  # same inputs and seed, same plan bytes


def test_plan_fields(world_plan: Plan) -> None:
    assert (world_plan.world_size, world_plan.num_stages, world_plan.num_replicas) == (64, 8, 8)
    assert world_plan.num_layers_per_stage == (3,) * 8
    assert sorted(r for row in world_plan.mesh for r in row) == list(range(64))
    world_plan.validate(build_scenario("world"))
    with pytest.raises(ValueError, match="another cluster"):
        world_plan.validate(build_scenario("regional"))


def test_layers_split_unevenly_keep_every_stage_non_empty() -> None:
    plan = build_plan(
        build_scenario("two_sites"),
        PlannerConfig(
            num_stages=8,
            num_replicas=8,
            method="megatron_default",
            workload=WorkloadConfig(num_layers=26),
        ),
    )
    assert plan.num_layers_per_stage == (4, 4, 3, 3, 3, 3, 3, 3)


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"mesh": ((0, 0),) * 32}, "permutation of ranks"),
        ({"num_layers_per_stage": (0,) + (3,) * 7}, "each >= 1"),
        ({"format_version": 3}, "format_version 3"),
    ],
)
def test_bad_plans_are_refused(world_plan: Plan, change: dict[str, object], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        replace(world_plan, **change)  # type: ignore[arg-type]


def test_from_json_names_unknown_and_missing_fields(world_plan: Plan) -> None:
    data = json.loads(world_plan.to_json())
    data["extra"] = 1
    del data["seed"]
    with pytest.raises(ValueError, match=r"unknown fields \['extra'\], missing \['seed'\]"):
        Plan.from_json(json.dumps(data))
    with pytest.raises(ValueError, match="invalid JSON"):
        Plan.from_json("{")


def test_config_rules() -> None:
    with pytest.raises(ValueError, match="set num_stages <= 6"):
        PlannerConfig(num_stages=8, workload=WorkloadConfig(num_layers=6))


def test_cli_writes_the_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    code = main(["plan", "--scenario", "two_sites", "--set", "budget=5", "--out", str(out)])
    assert code == 0
    plan = Plan.from_json(out.read_text())
    assert plan.cluster == "two_sites"
    assert (tmp_path / "plan.png").read_bytes()[:4] == b"\x89PNG"
    assert "iteration cost" in capsys.readouterr().out
    assert main(["plan", "--scenario", "two_sites", "--set", "num_replicas=3"]) == 2
    assert "num_replicas=3 does not divide world_size=64" in capsys.readouterr().err
    assert main(["plan", "--scenario", "two_sites", "--out", str(tmp_path / "p.png")]) == 2
    assert "give the .json path" in capsys.readouterr().err


def test_auto_grid_picks_the_fastest_factor_pair() -> None:
    top = build_scenario("two_sites")
    auto = build_plan(top, PlannerConfig(num_stages=0, num_replicas=0, budget=30))
    # 64 devices, 24 layers, batch 1024 in steps of 64: D_pp in {1, 2, 4, 8, 16}.
    assert auto.num_stages * auto.num_replicas == 64
    fixed = build_plan(top, PlannerConfig(num_stages=8, num_replicas=8, budget=30))
    assert auto.predicted_cost_s <= fixed.predicted_cost_s + 1e-9
    derived = build_plan(top, PlannerConfig(num_stages=4, num_replicas=0, budget=5))
    assert (derived.num_stages, derived.num_replicas) == (4, 16)


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (lambda d: d.update(world_size="64"), "world_size = '64' must be an integer"),
        (lambda d: d.update(mesh=[["a"] * 8] * 8), "must be an integer"),
        (lambda d: d.update(objective="magic"), "choose one of 'iteration', 'paper'"),
        (lambda d: d.update(devices=d["devices"][:3]), "devices lists 3 ranks"),
        (lambda d: d.update(predicted_cost_s=float("nan")), "must be finite"),
    ],
)
def test_tampered_plans_are_value_errors(world_plan: Plan, edit: object, fragment: str) -> None:
    data = json.loads(world_plan.to_json())
    edit(data)  # type: ignore[operator]
    with pytest.raises(ValueError, match=re.escape(fragment)):
        Plan.from_json(json.dumps(data))
    with pytest.raises(ValueError, match="not an object"):
        Plan.from_json("3")


def test_seed_must_be_non_negative() -> None:
    with pytest.raises(ValueError, match="seed=-1 must be >= 0"):
        PlannerConfig(seed=-1)


def test_scenario_or_cluster_before_bench_or_validate_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["plan", "--scenario", "world", "validate"]) == 2
    assert "--scenario world applies to `frugal plan` alone" in capsys.readouterr().err
    assert main(["plan", "--cluster", "sites.toml", "bench", "--quick"]) == 2
    assert "not to `frugal plan bench`" in capsys.readouterr().err


def test_the_papers_ga_plans_under_its_own_cost_and_is_priced_by_the_objective() -> None:
    from frugal.planner.cost import paper_cost
    from frugal.planner.iteration import iteration_cost
    from frugal.planner.search import dtfm_ga

    top = build_scenario("world")
    ga = dtfm_ga(top, 8, 8, budget=40, seed=1).cost
    priced = build_plan(top, PlannerConfig(num_stages=8, num_replicas=8, method="dtfm_ga",
                                           budget=40, seed=1))  # fmt: skip
    assert priced.mesh == ga.mesh and priced.method == "dtfm_ga"
    mesh = np.array(priced.mesh)
    assert priced.predicted_cost_s == pytest.approx(
        iteration_cost(top, mesh, priced.num_layers_per_stage, WorkloadConfig()).total_s
    )
    paper = build_plan(top, PlannerConfig(num_stages=8, num_replicas=8, method="dtfm_ga",
                                          objective="paper", budget=40, seed=1))  # fmt: skip
    assert paper.predicted_cost_s == pytest.approx(ga.total_s)
    assert paper_cost(top, np.ascontiguousarray(mesh.T)).total_s == pytest.approx(ga.total_s)


def test_the_collective_restriction_the_pipeline_suggests_is_accepted(tmp_path: Path) -> None:
    # gradcomp's refusal tells the user to plan with workload.dp_collectives=[...]: do so.
    from frugal.comm.gradcomp import DP_METHODS

    out = tmp_path / "plan.json"
    restrict = 'workload.dp_collectives=["ring"]'
    args = ["plan", "--scenario", "two_sites", "--set", "budget=5", "--set", restrict]
    assert main([*args, "--out", str(out)]) == 0
    plan = Plan.from_json(out.read_text())
    assert set(plan.dp_collective) == {"ring"}
    for stage, collective in enumerate(plan.dp_collective):
        DP_METHODS.get("fp16").check_collective("fp16", collective, stage=stage)
