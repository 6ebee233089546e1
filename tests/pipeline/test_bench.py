"""The bench at its smallest setting: rows and summary keys, exact bytes, simulated speed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from frugal.pipeline.bench import PipelineBenchConfig, run_pipeline_bench
from frugal.pipeline.dpbench import DPBenchConfig
from frugal.pipeline.train import PipelineTrainConfig


@pytest.mark.slow
@pytest.mark.distributed
def test_smallest_bench_writes_rows_and_summary(tmp_path: Path) -> None:
    config = PipelineBenchConfig(
        train=PipelineTrainConfig(num_train=32, num_eval=8, schedule="gpipe",
                                  micro_batch_size=4, num_microbatches=4, num_stages=2,
                                  calibrate_steps=2),
        methods=("fp32", "aqsgd:fw2,bw4"), rhos=(3.3,), epochs=2, speed_steps=2,
        pretrain_epochs=1, pretrain_windows=32,
        quality_workers=1, torch_pipelining=("gpipe",), dp=DPBenchConfig(enabled=False),
    )  # fmt: skip
    document = run_pipeline_bench(config, tmp_path)
    saved = json.loads((tmp_path / "results.json").read_text())
    # 2 methods at one rho, our FP32 unshaped, torch.distributed.pipelining GPipe (unshaped)
    assert saved["benchmark"] == "pipeline" and len(saved["rows"]) == 4
    baseline = saved["rows"][-1]
    assert baseline["method"] == "torch.pipelining:gpipe" and baseline["skipped"] is None
    assert baseline["tokens_per_s"] > 0 and baseline["link"] == "unshaped"
    assert saved["rows"][-2]["method"] == "fp32" and saved["rows"][-2]["link"] == "unshaped"
    assert document["summary"]["speedup_vs_torch_pipelining"] > 0
    for row in saved["rows"][:-1]:
        for key in ("codec", "fw_bits", "bw_bits", "rho", "link_mbps", "tokens_per_s",
                    "bytes_per_step", "final_train_loss", "final_eval_loss",
                    "time_to_fp32_loss_s", "simulated_tokens_per_s"):  # fmt: skip
            assert key in row
        assert row["bytes_per_step"] == row["analytic_bytes_per_step"]
    summary = document["summary"]
    assert summary["bytes_match_analytic"] is True
    assert summary["quality_start"] == "fine-tune"
    assert summary["pretraining"]["windows"] == 32 and summary["pretraining"]["steps"] == 2
    assert summary["loss_gap_directq_fw2"] is None  # DirectQ was not run
    assert summary["speedup_at_slowest"] > 0 and summary["slowest_link"] == "100mbps"
    assert (tmp_path / "loss_curves.png").read_bytes()[:4] == b"\x89PNG"


def test_effective_cores_fit_the_calibration_step() -> None:
    from frugal.pipeline.bench import _effective_cores

    # 2 stages, m = 2, GPipe, F = 1 s, B = 2 s: 12 s on one core, 9 s on two (see
    # test_link.py). A measured step of 11.25 s is 1.25 cores; 9 s is both cores.
    def ranks(wall_s: float) -> list[dict[str, object]]:
        calib = {
            "num_microbatches": 2,
            "median_forward_cpu_s": 1.0,
            "median_backward_cpu_s": 2.0,
            "median_optimizer_s": 0.0,
            "step_s": [99.0, wall_s, wall_s],
        }
        return [{"stage": s, "calibration": calib} for s in range(2)]

    if (os.cpu_count() or 1) >= 2:
        assert _effective_cores(ranks(11.25), "gpipe") == pytest.approx(1.25)
        assert _effective_cores(ranks(8.0), "gpipe") == pytest.approx(2.0)
    assert _effective_cores(ranks(20.0), "gpipe") == pytest.approx(1.0)
    with pytest.raises(ValueError, match=r"sim_num_cores=0.5 must be >= 1"):
        PipelineBenchConfig(sim_num_cores=0.5)
