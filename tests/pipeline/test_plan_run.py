"""`frugal pipeline train --plan` runs what the planner chose, or refuses the plan.

It runs the codec, schedule, micro-batches and DP collective the plan records and reports
them in train.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from frugal.cli.main import main
from frugal.parallel.plan import Plan
from frugal.planner.iteration import WorkloadConfig
from frugal.planner.plan import PlannerConfig, build_plan
from frugal.planner.topology import Device, Topology


def _planned(tmp_path: Path) -> tuple[Plan, Path]:
    """A plan for the tiny GPT on 2 sites of 2 devices over a 10 Mbit/s link.

    4 layers, 64 tokens x 128, micro-batches of 8; codec, schedule and M left to the planner.
    """
    site = np.array([0, 0, 1, 1])
    same = site[:, None] == site[None, :]
    topology = Topology(
        devices=tuple(
            Device(name=f"cpu{r}", host="localhost", site="ab"[site[r]]) for r in range(4)
        ),
        delay_ms=np.where(same, 0.1, 10.0),
        bandwidth_gbps=np.where(same, 10.0, 0.01),
    )
    workload = WorkloadConfig(
        num_layers=4, hidden_size=128, seq_len=64, global_batch_size=32, microbatch_size=8,
        microbatches_per_step=0, codec="auto", schedule="auto", num_epochs=10, tau_ref_s=0.01,
        codec_candidates=("fp32", "aqsgd:fw2,bw4"),
    )  # fmt: skip
    plan = build_plan(topology, PlannerConfig(num_stages=2, num_replicas=2, budget=20,
                                              workload=workload))  # fmt: skip
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    return plan, path


def test_a_plan_the_pipeline_cannot_run_exits_2_naming_the_value_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan, path = _planned(tmp_path)
    assert plan.codec == "aqsgd:fw2,bw4"  # 10 epochs over a 10 Mbit/s link: deltas pay
    data = json.loads(path.read_text())
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({**data, "codec": "zstd"}))
    out = ["--out", str(tmp_path / "run")]
    assert main(["pipeline", "train", "--plan", str(unknown), *out]) == 2
    err = capsys.readouterr().err
    assert "the plan's codec 'zstd' is not one the pipeline runs" in err
    assert "plan again with workload.codec" in err
    other = "1f1b" if plan.schedule == "gpipe" else "gpipe"
    args = ["pipeline", "train", "--plan", str(path), "--codec", plan.codec, *out]
    assert main([*args, "--set", f"schedule={other}"]) == 2
    err = capsys.readouterr().err
    assert f"priced for schedule {plan.schedule!r} but the job runs {other!r}" in err
    assert main([*args[:4], "--codec", "fp32", *out, "--set", f"schedule={plan.schedule}"]) == 2
    assert "priced for codec 'aqsgd:fw2,bw4' but the job runs 'fp32'" in capsys.readouterr().err


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_train_json_reports_the_codec_schedule_and_collective_the_plan_chose(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan, path = _planned(tmp_path)
    out = tmp_path / "run"
    args = ["pipeline", "train", "--plan", str(path), "--codec", plan.codec, "--steps", "2",
            "--set", f"schedule={plan.schedule}", "--set", "num_train=64", "--set",
            "num_eval=16", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    capsys.readouterr()
    ran = json.loads((out / "train.json").read_text())["summary"]
    assert ran["codec"] == plan.codec
    assert ran["schedule"] == plan.schedule
    assert tuple(ran["num_microbatches_per_replica"]) == plan.num_microbatches_per_replica
    assert tuple(ran["dp_collective_per_stage"]) == plan.dp_collective
    assert (ran["device"], ran["dtype"]) == ("cpu", "float32")
