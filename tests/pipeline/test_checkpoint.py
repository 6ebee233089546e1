"""Pipeline checkpoints: a resumed run continues bit for bit; bad checkpoints are refused.

The fast tests drive every stage in one process (LocalTransport, as `train_local`); the
distributed test kills a real torchrun rank and lets torchrun restart the job.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from frugal.parallel.codec import CodecSpec
from frugal.parallel.schedule import build_schedule
from frugal.pipeline.checkpoint import (
    CheckpointMismatchError,
    commit_checkpoint,
    fingerprint,
    latest_checkpoint,
    load_stage,
    save_stage,
)
from frugal.pipeline.models import TinyGPTConfig
from frugal.pipeline.runtime import LocalTransport, StageRunner, run_local_step
from frugal.pipeline.train import (
    PipelineTrainConfig,
    _buffer_set,
    _microbatches,
    _step_ids,
    load_windows,
)
from frugal.pipeline.zoo import boundary_shape, build_model, build_model_stages, default_layers

CONFIG = PipelineTrainConfig(
    gpt=TinyGPTConfig(context=16, hidden=32, num_heads=2, num_layers=3),
    num_stages=3, codec="aqsgd:fw2,bw4:ef", schedule="1f1b", micro_batch_size=2,
    num_microbatches=3, num_train=24, num_eval=8, steps=7, learning_rate=3e-3,
)  # fmt: skip


class _Job:
    """Every stage of CONFIG in this process, from a fresh model (as `train_local` builds it)."""

    def __init__(self, config: PipelineTrainConfig) -> None:
        torch.manual_seed(config.seed)
        self.config = config
        self.data = load_windows(config)
        layers = default_layers(config, config.num_stages)
        self.transport = LocalTransport()
        self.buffers = _buffer_set(config, self.data)
        m = config.num_microbatches
        self.runners = [
            StageRunner(
                module,
                CodecSpec.parse(config.codec),
                self.transport,
                learning_rate=config.learning_rate,
                num_microbatches_total=m,
                buffers=self.buffers.factory,
                example_shape=boundary_shape(config)[1:],
            )
            for module in build_model_stages(config, build_model(config), layers)
        ]
        self.actions = [
            build_schedule(config.schedule, len(layers), s, m) for s in range(len(layers))
        ]

    def train(self, steps: range) -> list[float]:
        per_step = self.config.num_microbatches * self.config.micro_batch_size
        losses = []
        for step in steps:
            ids = _step_ids(self.data, self.config, step, per_step, repeat=False)
            mbs = _microbatches(self.data, ids, self.config.micro_batch_size)
            losses.append(run_local_step(self.runners, self.transport, self.actions, step, mbs))
        return losses

    def save(self, root: Path, step: int, expected: dict[str, str]) -> None:
        for rank, runner in enumerate(self.runners):
            save_stage(root / f"step-{step:08d}", rank, runner, step=step, extra={"k": step})
        commit_checkpoint(root, step, len(self.runners), expected)

    def load(self, root: Path, expected: dict[str, str]) -> int:
        found = latest_checkpoint(root, expected)
        assert found is not None
        steps = {load_stage(found[1], rank, r)[0] for rank, r in enumerate(self.runners)}
        assert len(steps) == 1
        return steps.pop()


@pytest.mark.parametrize("backend", ["memory", "store"])
def test_a_resumed_run_continues_bit_for_bit(tmp_path: Path, backend: str) -> None:
    config = replace(CONFIG, buffer_backend=backend, buffer_dir=str(tmp_path / "buffers"))
    expected = fingerprint(config, config.codec, "linear")
    whole = _Job(config)
    reference = whole.train(range(7))
    first = _Job(config)
    head = first.train(range(3))
    first.save(tmp_path / "ckpt", 3, expected)
    # Every per-example buffer was saved: AQ-SGD's on both sides of both links, and the
    # senders' gradient error-feedback residuals (`:ef`).
    files = sorted(p.name for p in (tmp_path / "ckpt" / "step-00000003").glob("*.ids.npy"))
    assert files == [
        "rank0.act_out.delta.ids.npy", "rank1.act_in.delta.ids.npy",
        "rank1.act_out.delta.ids.npy", "rank1.grad_out.feedback.ids.npy",
        "rank2.act_in.delta.ids.npy", "rank2.grad_out.feedback.ids.npy",
    ]  # fmt: skip
    resumed = _Job(config)
    assert resumed.load(tmp_path / "ckpt", expected) == 3
    tail = resumed.train(range(3, 7))
    assert head + tail == reference  # exactly: weights, AdamW, buffers and data cursor
    assert resumed.runners[-1].stats.losses == reference  # the whole curve is reported
    for job in (whole, first, resumed):
        job.buffers.close()


def _saved(root: Path, steps: int) -> tuple[_Job, dict[str, str]]:
    """A job of CONFIG trained `steps` steps and checkpointed under `root`."""
    expected = fingerprint(CONFIG, CONFIG.codec, "linear")
    job = _Job(CONFIG)
    job.train(range(steps))
    job.save(root, steps, expected)
    return job, expected


def test_only_complete_checkpoints_are_read_and_older_ones_are_removed(tmp_path: Path) -> None:
    job, expected = _saved(tmp_path, 2)
    job.train(range(2, 4))
    job.save(tmp_path, 4, expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000004"]  # step 2 pruned
    # A crash while writing step 6: rank 0's file exists, COMPLETE does not.
    save_stage(tmp_path / "step-00000006", 0, job.runners[0], step=6, extra={})
    found = latest_checkpoint(tmp_path, expected)
    assert found is not None and found[0] == 4
    with pytest.raises(FileNotFoundError, match=r"ranks \[1, 2\] wrote no checkpoint"):
        commit_checkpoint(tmp_path, 6, 3, expected)
    assert not (tmp_path / "step-00000006" / "COMPLETE").exists()
    job.buffers.close()


def test_a_checkpoint_of_another_job_is_refused_by_name(tmp_path: Path) -> None:
    job, _ = _saved(tmp_path, 1)
    # Training longer, other links or a new timeout may resume; another model or codec not.
    longer = replace(CONFIG, steps=20, latency_ms=5.0, comm_timeout_s=30.0, max_restarts=2)
    assert latest_checkpoint(tmp_path, fingerprint(longer, CONFIG.codec, "linear")) is not None
    other = replace(CONFIG, learning_rate=1e-3, gpt=replace(CONFIG.gpt, hidden=64))
    with pytest.raises(CheckpointMismatchError, match=r"other gpt, learning_rate; resume with"):
        latest_checkpoint(tmp_path, fingerprint(other, CONFIG.codec, "linear"))
    with pytest.raises(CheckpointMismatchError, match=r"other layout, run"):
        latest_checkpoint(tmp_path, fingerprint(CONFIG, "fp32", "2x1"))
    # A stage of another shape: its parameters are named.
    wide = _Job(replace(CONFIG, gpt=replace(CONFIG.gpt, hidden=64)))
    with pytest.raises(CheckpointMismatchError, match=r"does not fit this rank's stage"):
        load_stage(tmp_path / "step-00000001", 0, wide.runners[0])
    for j in (job, wide):
        j.buffers.close()


def test_settings_checkpoints_cannot_honour_are_refused() -> None:
    with pytest.raises(ValueError, match=r"checkpoint_every=-1 and max_restarts=0 must be >= 0"):
        replace(CONFIG, checkpoint_every=-1)
    with pytest.raises(ValueError, match=r"dp_compression='powersgd' keeps state frugal cannot"):
        replace(CONFIG, checkpoint_every=2, dp_compression="powersgd", plan="x.json")


def _worker_pids(rank: int, out_dir: Path) -> list[int]:
    """Pids of this test's pipeline workers (writing to `out_dir`) whose RANK is `rank`.

    Other jobs on the machine are left alone.
    """
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        mine = b"frugal.pipeline.worker" in cmdline and str(out_dir).encode() in cmdline
        if mine and f"RANK={rank}".encode() in environ:
            pids.append(int(proc.name))
    return pids


@pytest.mark.distributed
def test_a_killed_rank_restarts_and_resumes_to_the_uninterrupted_curve(tmp_path: Path) -> None:
    import os
    import signal
    import threading

    from frugal.pipeline.job import check_training, run_training

    config = replace(
        CONFIG, num_stages=2, steps=16, checkpoint_every=4, latency_ms=20.0, comm_timeout_s=20.0
    )
    plain = run_training(check_training(config), _folder(tmp_path / "plain"))
    killed: list[int] = []

    def kill_rank_1_after_step_6(step: int, loss: float) -> None:
        if step == 6 and not killed:
            for pid in _worker_pids(1, tmp_path / "restarted"):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

    restarted = run_training(
        check_training(replace(config, max_restarts=1)),
        _folder(tmp_path / "restarted"),
        on_step=lambda step, loss: threading.Thread(
            target=kill_rank_1_after_step_6, args=(step, loss)
        ).start(),
    )
    assert killed, "rank 1 was never killed"
    saved: dict[str, Any] = json.loads((tmp_path / "restarted" / "train.json").read_text())
    assert saved["losses"] == json.loads((tmp_path / "plain" / "train.json").read_text())["losses"]
    assert restarted.eval_loss == plain.eval_loss and len(saved["losses"]) == 16
    logs = "\n".join(p.read_text() for p in (tmp_path / "restarted" / "logs").rglob("*.log"))
    assert ("resumed from" in logs and "(step 4)" in logs) or "(step 8)" in logs


def _folder(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def test_pipeline_train_refuses_another_jobs_checkpoints_before_launching(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from frugal.cli.main import main

    job, _ = _saved(tmp_path / "run" / "checkpoints", 1)
    job.buffers.close()
    code = main(["pipeline", "train", "--stages", "2", "--steps", "2", "--set", "num_train=64",
                 "--set", "checkpoint_every=1", "--out", str(tmp_path / "run")])  # fmt: skip
    assert code == 1
    err = capsys.readouterr().err
    assert "was written by a job with other" in err and "codec" in err
    assert not (tmp_path / "run" / "logs").exists()  # nothing was launched


@pytest.mark.distributed
@pytest.mark.timeout(400)  # four torchrun jobs on a loaded 2-core machine
def test_a_job_resumes_on_a_replanned_layout_with_every_buffer(tmp_path: Path) -> None:
    from frugal.parallel.codec import message_wire_bytes
    from frugal.parallel.plan import Plan
    from frugal.pipeline.checkpoint import saved_layout
    from frugal.pipeline.train import RunSpec, launch_torchrun
    from tests.pipeline.test_distributed import CONFIG as DIST
    from tests.pipeline.test_distributed import _dp_plan

    four = _dp_plan(tmp_path)  # 2 stages x 2 replicas of 2 micro-batches (8 rows)
    plan = Plan.from_json(four.read_text())
    moved = tmp_path / "moved.json"  # the same grid on other ranks (the replicas swapped)
    moved.write_text(replace(plan, mesh=((1, 3), (0, 2))).to_json())
    two = tmp_path / "two.json"  # a re-planned job on 2 ranks: one replica of 4 micro-batches
    two.write_text(
        replace(
            plan, world_size=2, num_replicas=1, mesh=((0, 1),), num_microbatches_per_replica=(4,),
            devices=plan.devices[:2],
        ).to_json()
    )  # fmt: skip
    codec = "aqsgd:fw2,bw4"
    base = replace(DIST, codec=codec, checkpoint_every=2, steps=6)

    def launch(plan_path: Path, steps: int, ckpt: Path, nproc: int) -> list[dict[str, Any]]:
        config = replace(base, plan=str(plan_path), steps=steps, checkpoint_dir=str(ckpt))
        run = RunSpec(label=codec, codec=codec, steps=steps, checkpoint=True)
        out = tmp_path / f"out-{ckpt.name}-{plan_path.stem}-{steps}"
        return launch_torchrun(config, [run], out, nproc=nproc, timeout_s=240)

    def reporter(ranks: list[dict[str, Any]]) -> dict[str, Any]:
        run: dict[str, Any] = next(r for r in ranks if r["runs"][0]["eval_loss"] is not None)
        return run["runs"][0]

    whole = reporter(launch(four, 6, tmp_path / "whole", 4))
    head = reporter(launch(four, 4, tmp_path / "ckpt", 4))  # stops after step 4 (saved)
    saved = saved_layout(tmp_path / "ckpt" / "step-00000004")
    assert saved == {"mesh": [[0, 2], [1, 3]], "layers": [2, 2], "num_microbatches": [2, 2]}
    shutil.copytree(tmp_path / "ckpt", tmp_path / "ckpt2")  # a second copy of step 4
    # Same grid, other ranks: state mapped by stage, each replica keeps its shard of the data,
    # so the run goes on exactly as the uninterrupted one.
    swapped = reporter(launch(moved, 6, tmp_path / "ckpt", 4))
    assert swapped["losses"] == whole["losses"] and swapped["eval_loss"] == whole["eval_loss"]
    assert (swapped["resumed_from_step"], swapped["resumed_on_another_plan"]) == (4, True)
    assert (whole["resumed_from_step"], whole["resumed_on_another_plan"]) == (0, False)
    # Onto one replica on 2 ranks, from the copy of the step-4 checkpoint.
    tail_ranks = launch(two, 6, tmp_path / "ckpt2", 2)
    tail = reporter(tail_ranks)
    assert tail["losses"][:4] == head["losses"] and len(tail["losses"]) == 6
    # Every example was seen in epochs 0-1 by one of the two old replicas: the merged buffers
    # let stage 0 send 2-bit deltas for all 4 micro-batches of step 4 (no first visit).
    sender = next(r for r in tail_ranks if r["stage"] == 0)["runs"][0]
    delta = message_wire_bytes(CodecSpec.parse(codec), 0, (8, 64, 128))
    assert sender["activation_bytes"][4] == [delta] * 4
    logs = "\n".join(p.read_text() for p in tmp_path.rglob("*.log"))
    assert "written on another plan" in logs


def test_relayout_maps_each_new_rank_to_its_stage_in_the_old_layout() -> None:
    from frugal.pipeline.checkpoint import relayout_sources

    # Old: 3 replicas x 2 stages; mesh[j][i] = rank.
    saved = {"mesh": [[0, 3], [1, 4], [2, 5]], "layers": [2, 2], "num_microbatches": [2, 2, 2]}
    new = {"layers": (2, 2), "num_microbatches": (3, 3)}  # 2 replicas, same global batch
    assert relayout_sources(saved, **new, replica=0, stage=1) == (3, (3, 4, 5))
    assert relayout_sources(saved, **new, replica=1, stage=0) == (1, (0, 1, 2))
    grown = {"layers": (2, 2), "num_microbatches": (1, 1, 1, 1, 1, 1)}  # 6 replicas
    assert relayout_sources(saved, **grown, replica=5, stage=0) == (2, (0, 1, 2))
    with pytest.raises(CheckpointMismatchError, match=r"hold \[2, 2\] layers but the new plan's"):
        relayout_sources(saved, layers=(3, 1), num_microbatches=(3, 3), replica=0, stage=0)
    with pytest.raises(CheckpointMismatchError, match=r"6 micro-batches .* new plan's 4"):
        relayout_sources(saved, layers=(2, 2), num_microbatches=(2, 2), replica=0, stage=0)


def test_another_plan_is_accepted_only_with_a_recorded_layout(tmp_path: Path) -> None:
    job, expected = _saved(tmp_path, 1)  # committed without a layout (as before this version)
    job.buffers.close()
    moved = expected | {"layout": "other", "plan": "other"}
    with pytest.raises(CheckpointMismatchError, match="did not record its layout"):
        latest_checkpoint(tmp_path, moved, relayout=True)
    with pytest.raises(CheckpointMismatchError, match="other layout, plan"):
        latest_checkpoint(tmp_path, moved)  # without relayout: refused as before
    marker = json.loads((tmp_path / "step-00000001" / "COMPLETE").read_text())
    marker["layout"] = {"mesh": [[0, 1, 2]], "layers": [1, 1, 1], "num_microbatches": [3]}
    (tmp_path / "step-00000001" / "COMPLETE").write_text(json.dumps(marker))
    assert latest_checkpoint(tmp_path, moved, relayout=True) == (1, tmp_path / "step-00000001")
    other_model = moved | {"gpt": "x"}
    with pytest.raises(CheckpointMismatchError, match="other gpt, layout, plan"):
        latest_checkpoint(tmp_path, other_model, relayout=True)


def test_each_replica_reads_only_its_own_shard_every_epoch() -> None:
    config = replace(CONFIG, num_train=48, micro_batch_size=2)
    data = load_windows(config)
    replicas = (2, 1)  # micro-batches per replica: 4 + 2 windows a step, 8 steps an epoch
    seen: list[set[int]] = [set(), set()]
    for step in range(3 * 8):  # three epochs
        ids = _step_ids(data, config, step, 6, False, replicas).tolist()
        assert len(ids) == 6 and len(set(ids)) == 6
        for j, part in enumerate((ids[:4], ids[4:])):
            if step < 8:
                seen[j].update(part)
            else:
                assert set(part) <= seen[j]  # later epochs: the same shard, reshuffled
    assert len(seen[0]) == 32 and len(seen[1]) == 16 and not seen[0] & seen[1]
    assert (
        _step_ids(data, config, 8, 6, False, replicas).tolist()
        != _step_ids(data, config, 0, 6, False, replicas).tolist()
    )  # each epoch in a new order
    # One pipeline: a fresh permutation of every window each epoch, as before.
    one = _step_ids(data, config, 9, 6, False, (3,))
    assert one.tolist() == data.epoch_order(1, config.seed)[6:12].tolist()
