"""The pipeline runs each stage's DP collective as the plan priced it, or refuses the plan."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from frugal.cli.main import main
from frugal.parallel.plan import Plan, PlanMismatchError
from frugal.pipeline.job import check_training
from frugal.pipeline.train import PipelineTrainConfig, RunSpec, launch_torchrun, train_local
from tests.pipeline.test_distributed import CONFIG, _dp_plan


def _plan_with(tmp_path: Path, collectives: tuple[str, ...]) -> Path:
    """`_dp_plan` (2 stages x 2 replicas) recording `collectives` per stage."""
    path = _dp_plan(tmp_path)
    plan = dataclasses.replace(Plan.from_json(path.read_text()), dp_collective=collectives)
    path.write_text(plan.to_json())
    return path


@pytest.mark.filterwarnings("ignore:the plan .* does not record")
def test_a_plan_collective_a_method_cannot_run_is_refused_before_launch(tmp_path: Path) -> None:
    plan = str(_plan_with(tmp_path, ("ring", "central_ps")))
    job = check_training(PipelineTrainConfig(plan=plan))  # the float32 sum runs any collective
    assert job.layout.dp_collective == ("ring", "central_ps")
    assert job.layout.stage_collective(1) == "central_ps"
    message = (
        "stage 1's data-parallel exchange as 'central_ps' but dp_compression='fp16' always "
        "exchanges by ring; run with --dp-compress none"
    )
    with pytest.raises(PlanMismatchError, match=message):
        check_training(PipelineTrainConfig(plan=plan, dp_compression="fp16"))
    seq = str(_plan_with(tmp_path, ("seq_peer", "seq_peer")))
    check_training(PipelineTrainConfig(plan=seq, dp_compression="ef-kbit"))
    with pytest.raises(PlanMismatchError, match=r"stage 0's .* 'seq_peer' .*='powersgd'"):
        check_training(PipelineTrainConfig(plan=seq, dp_compression="powersgd"))


def test_unrecorded_collectives_run_every_method(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match="does not record"):
        job = check_training(PipelineTrainConfig(plan=str(_dp_plan(tmp_path)), warmup_steps=1,
                                                 dp_compression="qadam"))  # fmt: skip
    assert job.layout.dp_collective == () and job.layout.stage_collective(0) == ""


@pytest.mark.filterwarnings("ignore:the plan .* does not record")
def test_the_cli_exits_2_naming_the_plan_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = str(_plan_with(tmp_path, ("central_ps", "central_ps")))
    args = ["pipeline", "train", "--plan", plan, "--dp-compress", "powersgd"]
    assert main([*args, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "'central_ps'" in err and "--dp-compress none" in err
    assert not (tmp_path / "run" / "train.json").exists()


@pytest.mark.distributed
@pytest.mark.filterwarnings("ignore:the plan .* does not record")
def test_central_ps_and_seq_peer_plans_train_like_one_pipeline(tmp_path: Path) -> None:
    plan = _plan_with(tmp_path, ("central_ps", "seq_peer"))
    config = dataclasses.replace(CONFIG, plan=str(plan), steps=4)
    runs = [RunSpec(label="dp", codec="fp32", steps=4)]
    ranks = launch_torchrun(config, runs, tmp_path / "out", nproc=4, timeout_s=240)
    reporter = next(r for r in ranks if r["runs"][0]["eval_loss"] is not None)
    # Two replicas: a sum of two is the same in any order, so the loss is the one pipeline's
    # reading the steps in the replicas' order (each replica keeps its shard).
    local = train_local(dataclasses.replace(CONFIG, num_stages=2, steps=4), replicas=(2, 2))
    assert reporter["runs"][0]["eval_loss"] == pytest.approx(local.eval_loss, rel=1e-5)
    assert all(len(r["runs"][0]["dp_bytes"]) == 4 for r in ranks)
