"""Multi-process gloo runs on 127.0.0.1: torchrun training, DP replicas, failures."""

from __future__ import annotations

import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest

from frugal.parallel.codec import CodecSpec, message_wire_bytes
from frugal.pipeline.train import (
    PipelineTrainConfig,
    RunSpec,
    launch_torchrun,
    train_local,
)
from tests.pipeline._launch import start_ranks, write_job

pytestmark = pytest.mark.distributed

# 64 windows, 4 micro-batches of 8 per step: 2 steps per epoch, so AQ-SGD sends deltas from
# step 2 on.
CONFIG = PipelineTrainConfig(
    num_train=64, num_eval=16, steps=6, comm_timeout_s=20.0, drift_check_every=1
)


def test_four_stage_torchrun_fp32_matches_one_process_and_aqsgd_trains(tmp_path: Path) -> None:
    runs = [
        RunSpec(label="fp32", codec="fp32", steps=6),
        RunSpec(label="aq", codec="aqsgd:fw2,bw4", steps=6),
    ]
    ranks = launch_torchrun(CONFIG, runs, tmp_path, nproc=4, timeout_s=240)
    last = next(r for r in ranks if r["stage"] == 3)
    fp32, aq = last["runs"]
    local = train_local(replace(CONFIG, codec="fp32"))
    # Same runtime over gloo as in one process: identical arithmetic, so equal losses.
    assert fp32["losses"] == pytest.approx(local.losses, rel=1e-5)
    assert fp32["eval_loss"] == pytest.approx(local.eval_loss, rel=1e-5)
    for run in (fp32, aq):
        assert run["losses"][-1] < run["losses"][0] - 0.5  # 5.55 nats at init, falls fast
    assert abs(aq["eval_loss"] - fp32["eval_loss"]) < 0.1
    spec = CodecSpec.parse("aqsgd:fw2,bw4")
    shape = (8, 64, 128)
    for r in ranks:
        sent = r["runs"][1]["activation_bytes"]
        if r["stage"] < 3:
            first = message_wire_bytes(spec, 0, shape, num_new=8)
            assert sent[0] == [first] * 4  # epoch 0: every example is new (fp32)
            assert sent[5] == [message_wire_bytes(spec, 0, shape)] * 4  # 2-bit deltas
        if r["stage"] > 0:
            assert r["runs"][1]["gradient_bytes"][5] == [message_wire_bytes(spec, 1, shape)] * 4


def test_bfloat16_over_gloo_matches_one_process(tmp_path: Path) -> None:
    # The worker resolves device "cpu" (gloo) and runs autocast in bfloat16; the messages
    # carry bfloat16 in their header and the same bytes as float32's.
    config = replace(CONFIG, num_stages=2, dtype="bfloat16", device="auto", steps=4)
    runs = [RunSpec(label="aq", codec="aqsgd:fw2,bw4", steps=4)]
    ranks = launch_torchrun(config, runs, tmp_path, nproc=2, timeout_s=240)
    last = next(r for r in ranks if r["stage"] == 1)["runs"][0]
    local = train_local(replace(config, codec="aqsgd:fw2,bw4", device="cpu"))
    assert last["losses"] == pytest.approx(local.losses, rel=1e-5)
    assert last["losses"][-1] < last["losses"][0]
    first = next(r for r in ranks if r["stage"] == 0)["runs"][0]
    assert first["activation_bytes"] == local.activation_bytes[0]


def _dp_plan(tmp_path: Path) -> Path:
    from frugal.planner.plan import Plan

    plan = Plan(
        world_size=4,
        num_stages=2,
        num_replicas=2,
        num_layers_per_stage=(2, 2),
        num_microbatches_per_replica=(2, 2),
        mesh=((0, 2), (1, 3)),
        stage_order=(0, 1),
        devices=tuple((f"cpu{r}", "localhost", "local") for r in range(4)),
        objective="iteration",
        method="ours",
        predicted_cost_s=1.0,
        breakdown=(),
        lower_bound_s=1.0,
        gap=0.0,
        seed=0,
        cluster="loopback",
        cluster_sha256="0" * 64,
    )
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    return path


def test_plan_with_two_replicas_all_reduces_like_one_pipeline(tmp_path: Path) -> None:
    plan = _dp_plan(tmp_path)
    config = replace(CONFIG, plan=str(plan), steps=4)
    runs = [RunSpec(label="dp", codec="fp32", steps=4),
            RunSpec(label="dp16", codec="fp32", steps=4, dp_compression="fp16")]  # fmt: skip
    ranks = launch_torchrun(config, runs, tmp_path / "out", nproc=4, timeout_s=240)
    reporter = next(r for r in ranks if r["runs"][0]["eval_loss"] is not None)
    assert (reporter["replica"], reporter["stage"]) == (0, 1)
    # 2 replicas x 2 micro-batches, gradients all-reduced = one 2-stage pipeline of 4 reading
    # the steps in the replicas' order (each replica keeps its own shard of the windows).
    local = train_local(replace(CONFIG, num_stages=2, steps=4), replicas=(2, 2))
    assert reporter["runs"][0]["eval_loss"] == pytest.approx(local.eval_loss, rel=1e-5)
    # fp16 all-reduce (torch's fp16_compress_hook arithmetic): half the bytes, nearly the
    # same model.
    fp32_bytes, fp16_bytes = reporter["runs"][0]["dp_bytes"], reporter["runs"][1]["dp_bytes"]
    assert len(fp32_bytes) == 4 and fp16_bytes == [b // 2 for b in fp32_bytes]
    assert reporter["runs"][1]["eval_loss"] == pytest.approx(local.eval_loss, rel=1e-2)


def test_each_replica_keeps_its_examples_so_aqsgd_sends_deltas_after_epoch_0(
    tmp_path: Path,
) -> None:
    # 64 windows, 2 replicas x 2 micro-batches of 8: 2 steps an epoch. Each replica keeps its
    # shard of 32 windows, so from epoch 1 on every example it sends has a buffer on its
    # pipeline: only 2-bit deltas leave stage 0 (an example moving to the other replica would
    # go out in full precision again).
    config = replace(CONFIG, plan=str(_dp_plan(tmp_path)), steps=6)
    runs = [RunSpec(label="aq", codec="aqsgd:fw2,bw4", steps=6)]
    ranks = launch_torchrun(config, runs, tmp_path / "out", nproc=4, timeout_s=240)
    delta = message_wire_bytes(CodecSpec.parse("aqsgd:fw2,bw4"), 0, (8, 64, 128))
    first = message_wire_bytes(CodecSpec.parse("aqsgd:fw2,bw4"), 0, (8, 64, 128), num_new=8)
    for rank in (r for r in ranks if r["stage"] == 0):
        sent = rank["runs"][0]["activation_bytes"]
        assert sent[:2] == [[first] * 2] * 2 and sent[2:] == [[delta] * 2] * 4, sent


@pytest.mark.timeout(300)  # four torch imports on a loaded 2-core machine can take a minute
def test_a_killed_rank_stops_the_others_with_a_clear_error(tmp_path: Path) -> None:
    config = replace(CONFIG, steps=10, bandwidth_mbps=20.0)  # ~0.1 s per message: long steps
    job = write_job(
        tmp_path / "job.json",
        config,
        [RunSpec(label="r", codec="fp32", steps=10, bandwidth_mbps=20.0)],
    )
    ranks = start_ranks([job] * 4, tmp_path)
    try:
        assert ranks.procs[3].stdout is not None
        line = ranks.procs[3].stdout.readline()  # step 0 done: everyone is in step 1
        assert line.startswith("FRUGAL_PROGRESS"), line
        ranks.procs[2].send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        results = ranks.wait(timeout_s=config.comm_timeout_s + 10)
        assert time.monotonic() - t0 < config.comm_timeout_s + 10
    finally:
        ranks.kill_all()
    assert results[2][0] == -signal.SIGKILL
    for rank in (0, 1, 3):
        code, _, stderr = results[rank]
        assert code == 1, stderr[-2000:]
        assert "PeerLostError" in stderr and f"rank {rank}" in stderr, stderr[-2000:]


def test_mismatched_configs_fail_at_start_naming_the_key(tmp_path: Path) -> None:
    config = replace(CONFIG, num_stages=2)
    good = write_job(tmp_path / "a.json", config, [RunSpec(label="r", codec="fp32", steps=1)])
    bad = write_job(
        tmp_path / "b.json",
        replace(config, learning_rate=1e-2),
        [RunSpec(label="r", codec="fp32", steps=1)],
    )
    results = start_ranks([good, bad], tmp_path).wait(timeout_s=60)
    for code, _, stderr in results:
        assert code == 1
        assert "ConfigMismatchError" in stderr and "learning_rate" in stderr, stderr[-2000:]


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


def test_a_launch_past_its_time_limit_is_killed(tmp_path: Path) -> None:
    from frugal.pipeline.runtime import PipelineError

    config = replace(CONFIG, num_stages=2)
    runs = [RunSpec(label="slow", codec="fp32", steps=100, bandwidth_mbps=1.0)]  # ~2 s/message
    t0 = time.monotonic()
    with pytest.raises(PipelineError, match="exceeded its 8 s limit"):
        launch_torchrun(config, runs, tmp_path, nproc=2, timeout_s=8)
    assert time.monotonic() - t0 < 40  # stopped, not waited for
    time.sleep(1)
    job = str(tmp_path / "job.json").encode()
    alive = [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and job in _cmdline(p)]
    assert alive == []  # no worker of this launch survives


def test_receives_posted_ahead_change_no_result(tmp_path: Path) -> None:
    # 1F1B with AQ-SGD: activation sizes change with the buffers (first visits go out whole),
    # gradient sizes are known only after the forward; posting every receive one action
    # ahead must leave the arithmetic exactly as the one-process run's.
    config = replace(CONFIG, steps=4, schedule="1f1b", drift_check_every=0)
    runs = [RunSpec(label="aq", codec="aqsgd:fw2,bw4", steps=4)]
    local = train_local(replace(config, codec="aqsgd:fw2,bw4"))
    for prepost in (True, False):
        ranks = launch_torchrun(
            replace(config, prepost_receives=prepost), runs, tmp_path / str(prepost),
            nproc=4, timeout_s=240,
        )  # fmt: skip
        last = next(r for r in ranks if r["stage"] == 3)
        assert last["runs"][0]["losses"] == pytest.approx(local.losses, rel=1e-5), prepost
