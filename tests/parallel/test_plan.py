"""Plan format 2: what it records, the format-1 upgrade, and the pipeline refusing a mismatch."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from frugal.parallel.plan import PLAN_FORMAT_VERSION, Plan, PlanMismatchError


def _plan(**overrides: object) -> Plan:
    fields: dict[str, object] = {
        "world_size": 4,
        "num_stages": 2,
        "num_replicas": 2,
        "num_layers_per_stage": (2, 2),
        "num_microbatches_per_replica": (2, 2),
        "mesh": ((0, 2), (1, 3)),
        "stage_order": (0, 1),
        "devices": tuple((f"cpu{r}", "localhost", "local") for r in range(4)),
        "objective": "iteration",
        "method": "ours",
        "predicted_cost_s": 1.0,
        "breakdown": (),
        "lower_bound_s": 1.0,
        "gap": 0.0,
        "seed": 0,
        "cluster": "loopback",
        "cluster_sha256": "0" * 64,
        "codec": "aqsgd:fw2,bw4",
        "schedule": "gpipe",
        "microbatch_size": 8,
        "dp_collective": ("ring", "seq_peer"),
    }
    fields.update(overrides)
    return Plan(**fields)  # type: ignore[arg-type]


def test_format_2_records_codec_schedule_microbatch_size_and_collectives() -> None:
    plan = _plan()
    text = plan.to_json()
    data = json.loads(text)
    assert data["format_version"] == PLAN_FORMAT_VERSION == 2
    assert (data["codec"], data["schedule"], data["microbatch_size"]) == (
        "aqsgd:fw2,bw4",
        "gpipe",
        8,
    )
    assert data["dp_collective"] == ["ring", "seq_peer"]
    assert Plan.from_json(text) == plan and plan.is_recorded
    assert "codec aqsgd:fw2,bw4, schedule gpipe, micro-batch size 8" in plan.table()


def test_a_format_1_plan_loads_with_nothing_recorded() -> None:
    data = json.loads(_plan().to_json())
    for key in ("codec", "schedule", "microbatch_size", "dp_collective"):
        del data[key]
    data["format_version"] = 1
    plan = Plan.from_json(json.dumps(data))
    assert not plan.is_recorded and plan.codec == "" and plan.format_version == 2
    assert plan.mesh == ((0, 2), (1, 3))
    # Nothing recorded, nothing checked: it runs with the job's settings.
    plan.check_runnable(codecs=("fp32",), schedule="1f1b", microbatch_size=3)


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"codec": "q4"}, "not canonical; write 'directq:fw4,bw4:row'"),
        ({"codec": "zip"}, "codec 'zip'"),
        ({"schedule": "zb"}, "schedule='zb' is not a registered"),
        ({"dp_collective": ("ring",)}, "per stage"),
        ({"dp_collective": ("ring", "allgather")}, "per stage"),
        ({"microbatch_size": -1}, "microbatch_size=-1"),
    ],
)
def test_bad_fields_are_refused(change: dict[str, object], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        replace(_plan(), **change)  # type: ignore[arg-type]


def test_check_runnable_names_the_field_and_both_fixes() -> None:
    plan = _plan()
    plan.check_runnable(codecs=("aqsgd:fw2,bw4",), schedule="gpipe", microbatch_size=8)
    with pytest.raises(PlanMismatchError, match=r"codec 'aqsgd:fw2,bw4' but the job runs 'fp32'"):
        plan.check_runnable(codecs=("aqsgd:fw2,bw4", "fp32"), schedule="gpipe", microbatch_size=8)
    with pytest.raises(PlanMismatchError, match="schedule 'gpipe' but the job runs '1f1b'"):
        plan.check_runnable(codecs=(), schedule="1f1b", microbatch_size=8)
    with pytest.raises(PlanMismatchError, match="set micro_batch_size=8 or plan again"):
        plan.check_runnable(codecs=(), schedule="gpipe", microbatch_size=4)
    # Every mismatch at once: one run shows them all.
    with pytest.raises(PlanMismatchError) as every:
        plan.check_runnable(codecs=("fp32",), schedule="1f1b", microbatch_size=4)
    message = str(every.value)
    assert "codec 'aqsgd:fw2,bw4'" in message and "schedule 'gpipe'" in message
    assert "microbatch_size=8" in message and message.count("; and ") == 2


def test_the_pipeline_refuses_a_plan_priced_for_another_codec(tmp_path: Path) -> None:
    from frugal.pipeline.train import PipelineTrainConfig, RunSpec, make_layout

    path = tmp_path / "plan.json"
    path.write_text(_plan().to_json())
    ok = PipelineTrainConfig(
        plan=str(path), codec="aqsgd:fw2,bw4", schedule="gpipe", micro_batch_size=8
    )
    assert make_layout(ok, 4).mesh == ((0, 2), (1, 3))
    with pytest.raises(PlanMismatchError, match="--codec aqsgd:fw2,bw4"):
        make_layout(replace(ok, codec="fp32"), 4)
    with pytest.raises(PlanMismatchError, match="'directq:fw2,bw4'"):
        make_layout(ok, 4, [RunSpec(label="x", codec="directq:fw2,bw4", steps=1)])
    with pytest.raises(PlanMismatchError, match="schedule"):
        make_layout(replace(ok, schedule="1f1b"), 4)


def test_the_planner_records_what_it_priced() -> None:
    from frugal.planner.iteration import WorkloadConfig
    from frugal.planner.plan import PlannerConfig, build_plan
    from frugal.planner.scenarios import build_scenario

    workload = WorkloadConfig(codec="q4", schedule="1f1b", microbatch_size=1)
    plan = build_plan(
        build_scenario("datacenter"),
        PlannerConfig(num_stages=8, num_replicas=8, budget=20, workload=workload),
    )
    assert (plan.codec, plan.schedule, plan.microbatch_size) == ("directq:fw4,bw4:row", "1f1b", 1)
    assert len(plan.dp_collective) == 8
    assert set(plan.dp_collective) <= {"seq_peer", "ring", "central_ps"}
