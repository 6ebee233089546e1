"""The pipeline bench's end-to-end section: the warm-up ceiling, settings, a tiny real run."""

from __future__ import annotations

import pytest

from frugal.bench.pipeline_e2e import E2EBenchConfig, amdahl_ceiling, run_e2e_section
from frugal.pipeline.models import TinyGPTConfig
from frugal.pipeline.train import PipelineTrainConfig


def test_the_warm_up_ceiling_by_hand() -> None:
    # 4 epochs, 1 at FP32's speed, the other 3 at 3x: 4 / (1 + 3 / 3) = 2.
    assert amdahl_ceiling(4, 1, 3.0) == pytest.approx(2.0)
    assert amdahl_ceiling(8, 0, 2.5) == pytest.approx(2.5)  # no warm-up: the steady state
    assert amdahl_ceiling(5, 4, 1.0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match=r"warmup_epochs=4, epochs=4 .* 0 <= W < E and s > 0"):
        amdahl_ceiling(4, 4, 2.0)


def test_settings_the_section_cannot_run_are_refused() -> None:
    with pytest.raises(ValueError, match=r"codec='fp32': give a compressed codec"):
        E2EBenchConfig(codec="fp32")
    with pytest.raises(ValueError, match=r"epochs=3 must be >= 2 and warmup_epochs=3 in"):
        E2EBenchConfig(epochs=3, warmup_epochs=3)
    with pytest.raises(ValueError, match=r"rhos=\(200.0,\): 200 is outside"):
        E2EBenchConfig(rho=200.0)
    with pytest.raises(ValueError, match=r"num_train=30 must be a multiple of the macro-batch"):
        run_e2e_section(E2EBenchConfig(num_train=30), PipelineTrainConfig())


@pytest.mark.distributed
def test_a_tiny_section_times_both_fine_tunes() -> None:
    train = PipelineTrainConfig(
        gpt=TinyGPTConfig(context=16, hidden=32, num_heads=2, num_layers=2), num_stages=2,
        micro_batch_size=2, num_microbatches=4, num_train=64, num_eval=8, schedule="gpipe",
        calibrate_steps=2,
    )  # fmt: skip
    config = E2EBenchConfig(codec="aqsgd:fw2,bw4", epochs=3, warmup_epochs=1, num_train=16)
    rows, summary = run_e2e_section(config, train)
    assert [(r["method"], r["steps"], r["warmup_epochs"]) for r in rows] == [
        ("fp32", 6, 0), ("aqsgd:fw2,bw4", 6, 1),
    ]  # fmt: skip
    fp32, ours = rows
    assert summary.e2e_speedup_at_slowest == pytest.approx(
        fp32["end_to_end_s"] / ours["end_to_end_s"]
    )
    assert summary.e2e_amdahl_ceiling == pytest.approx(
        amdahl_ceiling(3, 1, summary.e2e_steady_speedup)
    )
    assert summary.e2e_eval_loss_gap == pytest.approx(
        ours["final_eval_loss"] / fp32["final_eval_loss"] - 1
    )
    assert fp32["link_mbps"] == ours["link_mbps"] > 0  # one calibration, one shaped link
