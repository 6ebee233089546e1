"""Compressed data parallelism on the tiny GPT: 2 stages x 2 replicas over gloo."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from frugal.bench.pipeline_dp import DPBenchConfig, run_dp_section
from frugal.comm.gradcomp import dp_wire_bytes
from frugal.pipeline.models import TinyGPT, build_stages
from frugal.pipeline.train import PipelineTrainConfig, RunSpec, launch_torchrun
from tests.pipeline.test_distributed import CONFIG, _dp_plan

pytestmark = pytest.mark.distributed


@pytest.mark.timeout(300)
def test_compressed_dp_trains_like_fp32_dp_with_exact_bytes(tmp_path: Path) -> None:
    # fp16 is covered by tests/comm/test_gradcomp.py (2 ranks, a small model).
    config = replace(CONFIG, plan=str(_dp_plan(tmp_path)), steps=6, warmup_steps=2)
    methods = ("none", "qadam", "ef-kbit", "powersgd")
    runs = [
        RunSpec(label=m, codec="fp32", steps=6, dp_compression=m, dp_bits=8)  # type: ignore[arg-type]
        for m in methods
    ]
    ranks = launch_torchrun(config, runs, tmp_path / "out", nproc=4, timeout_s=280)
    stages = build_stages(TinyGPT(config.gpt), (2, 2))
    for rank in ranks:
        shapes = [tuple(p.shape) for p in stages[rank["stage"]].parameters()]
        for method, run in zip(methods, rank["runs"], strict=True):
            analytic = [dp_wire_bytes(method, shapes, 2, step, warmup_steps=2) for step in range(6)]
            assert run["dp_bytes"] == analytic, (rank["rank"], method)
    reporter = next(r for r in ranks if r["runs"][0]["eval_loss"] is not None)
    by_method = dict(zip(methods, reporter["runs"], strict=True))
    base = by_method["none"]
    assert base["losses"][-1] < base["losses"][0] - 0.5
    # 8-bit gradients with error feedback (ef-kbit) track fp32 closely (measured: 0.05%);
    # PowerSGD rank 1 is a coarser approximation (looser bound).
    for method, tolerance in (("ef-kbit", 0.02), ("powersgd", 0.1)):
        assert by_method[method]["eval_loss"] == pytest.approx(base["eval_loss"], rel=tolerance)
    # qadam is another optimizer after its 2 warm-up steps (Adam's variance frozen), so it
    # does not follow fp32 DP's trajectory (measured: 3.27 against 3.40 nats at step 6, it
    # happened to train faster). Its 8-bit momentum must not make it worse than fp32 DP.
    assert by_method["qadam"]["eval_loss"] < base["eval_loss"] * 1.02
    # The compressed steps really are smaller: qadam at 8 bits ~ 1/4 of fp32.
    stage0 = next(r for r in ranks if r["stage"] == 0)
    none_bytes, qadam_bytes = stage0["runs"][0]["dp_bytes"], stage0["runs"][1]["dp_bytes"]
    assert qadam_bytes[:2] == none_bytes[:2] and qadam_bytes[-1] < none_bytes[-1] / 3.9


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dp_bench_section_rows_and_summary() -> None:
    config = DPBenchConfig(
        pairs=(("fp32", "none"), ("aqsgd:fw2,bw4", "qadam")), rhos=(0.33,), speed_steps=2
    )
    train = PipelineTrainConfig(
        num_train=32, num_eval=8, micro_batch_size=4, num_microbatches=4, calibrate_steps=2
    )
    rows, summary = run_dp_section(config, train)
    assert [(r["codec"], r["dp_compression"]) for r in rows] == list(config.pairs)
    for row in rows:
        assert row["dp_bytes_per_step"] == row["analytic_dp_bytes_per_step"] > 0
        assert row["bandwidth_mbps"] > 0 and row["tokens_per_s"] > 0
    fp32, ours = rows
    assert fp32["speedup_vs_fp32"] == 1.0
    # 2-bit activations, 4-bit gradients, 8-bit momentum: far fewer bytes both ways.
    assert ours["pipeline_bytes_per_step"] < fp32["pipeline_bytes_per_step"] / 5
    assert ours["dp_bytes_per_step"] < fp32["dp_bytes_per_step"] / 3.9
    assert summary.dp_bytes_match_analytic is True
    assert summary.dp_speedup_at_slowest == ours["speedup_vs_fp32"]
