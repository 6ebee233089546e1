"""The bench at its smallest setting: rows and summary keys, exact bytes, simulated speed."""

from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path

import pytest

from frugal.bench.pipeline import PipelineBenchConfig, run_pipeline_bench
from frugal.bench.pipeline_dp import DPBenchConfig
from frugal.bench.pipeline_e2e import E2EBenchConfig
from frugal.bench.pipeline_llm import LLMBenchConfig
from frugal.pipeline.train import PipelineTrainConfig


@pytest.mark.slow
@pytest.mark.distributed
def test_smallest_bench_writes_rows_and_summary(tmp_path: Path) -> None:
    config = PipelineBenchConfig(
        train=PipelineTrainConfig(num_train=32, num_eval=8, schedule="gpipe",
                                  micro_batch_size=4, num_microbatches=4, num_stages=2,
                                  calibrate_steps=2),
        methods=("fp32", "aqsgd:fw2,bw4"), rhos=(3.3,), epochs=2, speed_steps=2,
        speed_rounds=2, pretrain_epochs=1, pretrain_windows=32,
        quality_workers=1, torch_pipelining=("gpipe",), dp=DPBenchConfig(enabled=False),
        llm=LLMBenchConfig(enabled=False), e2e=E2EBenchConfig(enabled=False),
    )  # fmt: skip
    document = run_pipeline_bench(config, tmp_path).document
    saved = json.loads((tmp_path / "results.json").read_text())
    # 2 methods at one rho, our FP32 unshaped, torch.distributed.pipelining GPipe (unshaped)
    assert saved["benchmark"] == "pipeline" and len(saved["rows"]) == 4
    baseline = saved["rows"][-1]
    assert baseline["method"] == "torch.pipelining:gpipe" and baseline["skipped"] is None
    assert baseline["tokens_per_s"] > 0 and baseline["link"] == "unshaped"
    assert saved["rows"][-2]["method"] == "fp32" and saved["rows"][-2]["link"] == "unshaped"
    assert document["summary"]["speedup_vs_torch_pipelining"] > 0
    # head to head: our FP32 launched like torch's in every round
    assert document["summary"]["fp32_head_to_head_tokens_per_s"] > 0
    by_schedule = document["summary"]["speedup_vs_torch_pipelining_by_schedule"]
    assert by_schedule == {"gpipe": document["summary"]["speedup_vs_torch_pipelining"]}
    for row in saved["rows"][:-1]:
        for key in ("codec", "fw_bits", "bw_bits", "rho", "link_mbps", "tokens_per_s",
                    "bytes_per_step", "final_train_loss", "final_eval_loss",
                    "time_to_fp32_loss_s", "simulated_tokens_per_s"):  # fmt: skip
            assert key in row
        assert row["bytes_per_step"] == row["analytic_bytes_per_step"]
        # one step timed per round; the cell's median over 2 values is their mean
        by_round = row["tokens_per_s_by_round"]
        assert len(by_round) == 2 and min(by_round) > 0
        assert row["tokens_per_s"] == pytest.approx(2 / sum(1 / v for v in by_round))
    summary = document["summary"]
    assert summary["bytes_match_analytic"] is True
    assert summary["quality_start"] == "fine-tune"
    assert summary["pretraining"]["windows"] == 32 and summary["pretraining"]["steps"] == 2
    assert summary["loss_gap_directq_fw2"] is None  # DirectQ was not run
    assert summary["speedup_at_slowest"] > 0 and summary["slowest_link"] == "100mbps"
    # AQ-SGD sends a tenth of FP32's bytes: with FP32's compute the link-bound step shrinks.
    assert summary["sim_speedup_free_codec_at_slowest"] > 1
    low, high = summary["speedup_range_by_link"]["100mbps"]
    assert low <= high and low > 0
    assert len(summary["calibration_ms"]) == 2 and min(summary["calibration_ms"]) > 0  # per round
    shaped = saved["rows"][0]
    assert len(shaped["link_mbps_by_round"]) == 2
    assert shaped["link_mbps"] == pytest.approx(sum(shaped["link_mbps_by_round"]) / 2)
    assert (tmp_path / "loss_curves.png").read_bytes()[:4] == b"\x89PNG"


def test_effective_cores_fit_the_calibration_step() -> None:
    from frugal.bench.pipeline import _effective_cores

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
        return [{"stage": s, "calibrations": [calib]} for s in range(2)]

    if (os.cpu_count() or 1) >= 2:
        assert _effective_cores(ranks(11.25), "gpipe") == pytest.approx(1.25)
        assert _effective_cores(ranks(8.0), "gpipe") == pytest.approx(2.0)
    assert _effective_cores(ranks(20.0), "gpipe") == pytest.approx(1.0)
    if (os.cpu_count() or 1) >= 2:  # one disturbed calibration of three does not move the fit
        rounds = [ranks(11.25), ranks(20.0), ranks(11.25)]
        runs = [
            {"stage": s, "calibrations": [r[s]["calibrations"][0] for r in rounds]}
            for s in range(2)
        ]
        assert _effective_cores(runs, "gpipe") == pytest.approx(1.25)
        runs[0]["calibrations"] = runs[0]["calibrations"][1:2]  # type: ignore[index]
        runs[1]["calibrations"] = runs[1]["calibrations"][1:2]  # type: ignore[index]
        assert _effective_cores(runs, "gpipe") == pytest.approx(1.0)  # only the disturbed one
    with pytest.raises(ValueError, match=r"sim_num_cores=0.5 must be >= 1"):
        PipelineBenchConfig(sim_num_cores=0.5)


def test_each_round_is_simulated_from_its_own_compute_and_link() -> None:
    from frugal.bench.pipeline import _simulate_rounds

    # 2 stages, m = 1, GPipe, one core each: a step is F0 + send + F1 + B1 + send + B0, where
    # a send of 1,000 B takes 8,000 / B s. Rounds (F, B per stage; both sends):
    # (3, 6 ms; 30 ms) -> 48 ms, (2, 4 ms; free link) -> 12 ms, (1, 2 ms; 10 ms) -> 16 ms.
    def outs(forward_ms: float) -> list[dict[str, float]]:
        run = {
            "median_forward_cpu_s": forward_ms / 1e3,
            "median_backward_cpu_s": 2 * forward_ms / 1e3,
            "median_optimizer_s": 0.0,
        }
        return [run, run]

    rounds = [outs(3.0), outs(2.0), outs(1.0)]
    bandwidths = [8_000 / 0.015, math.inf, 8_000 / 0.005]
    steps = _simulate_rounds("gpipe", 1, rounds, [[1_000]], [[1_000]], bandwidths, 2.0)
    assert steps == pytest.approx([0.048, 0.012, 0.016])
    # The cell's simulated step is their median, 16 ms; the compute pooled over the rounds
    # (2, 4 ms) with each round's link would have given 22 ms.
    assert statistics.median(steps) == pytest.approx(0.016)
    with pytest.raises(ValueError, match=r"3 rounds but 2 bandwidths"):
        _simulate_rounds("gpipe", 1, rounds, [[1_000]], [[1_000]], bandwidths[:2], 2.0)


def test_summary_monotone_within_noise_uses_per_round_ranges() -> None:
    from frugal.bench.pipeline import _summary

    # Speed-ups by link, fast to slow: 1.00 (rounds 0.95..1.05), 0.97 (0.96..0.98),
    # 3.0 (2.9..3.1). Strictly the second drops; its round range overlaps the first's.
    def rows(aq_by_round: list[float], rho: float) -> list[dict[str, object]]:
        fp32 = [100.0, 100.0]
        return [
            {"method": "fp32", "rho": rho, "tokens_per_s": 100.0, "tokens_per_s_by_round": fp32,
             "final_eval_loss": 2.0, "simulated_tokens_per_s": 100.0, "bytes_per_step": 1,
             "analytic_bytes_per_step": 1},
            {"method": "aqsgd:fw2,bw4", "rho": rho, "tokens_per_s": sum(aq_by_round) / 2,
             "tokens_per_s_by_round": aq_by_round, "final_eval_loss": 2.01,
             "simulated_tokens_per_s": 100.0, "bytes_per_step": 1,
             "analytic_bytes_per_step": 1},
        ]  # fmt: skip

    config = PipelineBenchConfig(rhos=(0.03, 0.33, 3.3))
    table = rows([95.0, 105.0], 0.03) + rows([96.0, 98.0], 0.33) + rows([290.0, 310.0], 3.3)
    summary = _summary(table, config)
    assert summary["speedup_by_link"]["1gbps"] == pytest.approx(0.97)
    assert summary["speedup_monotone"] is False
    assert summary["speedup_range_by_link"]["10gbps"] == pytest.approx([0.95, 1.05])
    assert summary["speedup_monotone_within_noise"] is True
    assert summary["loss_gap_aqsgd_fw2"] == pytest.approx(0.005)
    # A slower link wholly below a faster one's range is a real drop.
    table = rows([95.0, 105.0], 0.03) + rows([90.0, 94.0], 0.33) + rows([290.0, 310.0], 3.3)
    assert _summary(table, config)["speedup_monotone_within_noise"] is False


def test_free_codec_speedup_replays_fp32_compute_with_aqsgd_bytes() -> None:
    from frugal.bench.pipeline import _free_codec_speedup

    # With no compute, a step is every message's transfer: one micro-batch on 2 stages
    # sends one activation and one gradient, so the speed-up is the byte ratio.
    train = PipelineTrainConfig(num_stages=2, num_microbatches=1, micro_batch_size=4)
    config = PipelineBenchConfig(train=train, rhos=(3.3,))
    rows = [{"method": "fp32", "rho": 3.3, "link_mbps": 8.0}]
    zero = ([0.0, 0.0], [0.0, 0.0], [0.0, 0.0])
    n, channels = 4 * 64 * 128, 128
    fp32 = 2 * (128 + 4 * n)
    aqsgd = (128 + 2 * channels + n * 2 // 8) + (128 + 2 * channels + n * 4 // 8)
    speedup = _free_codec_speedup(rows, {("fp32", 3.3): zero}, config, cores=2.0)
    assert speedup == pytest.approx(fp32 / aqsgd)
    # Compute that dwarfs the link leaves nothing to gain.
    slow = ([100.0, 100.0], [100.0, 100.0], [0.0, 0.0])
    assert _free_codec_speedup(rows, {("fp32", 3.3): slow}, config, 2.0) == pytest.approx(
        1.0, abs=0.01
    )
    # No FP32 row at the slowest link: not measured.
    assert _free_codec_speedup([], {}, config, 2.0) is None
