"""The LLM section of the pipeline bench: config checks, and one real 4-rank launch."""

from __future__ import annotations

import math

import pytest

from frugal.bench.pipeline import PipelineBenchConfig
from frugal.bench.pipeline_llm import LLMBenchConfig, run_llm_section
from frugal.parallel.codec import CodecSpec, message_wire_bytes


def test_quick_preset_skips_the_llm_section_and_the_full_one_runs_smollm2() -> None:
    assert PipelineBenchConfig.quick().llm.enabled is False
    full = PipelineBenchConfig().llm
    assert full.enabled and full.model == "smollm2-135m"
    assert set(full.methods) >= {"fp32", "aqsgd:fw2,bw4"}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"methods": ("aqsgd:fw2,bw4",)}, "must include 'fp32'"),
        ({"methods": ("fp32", "fp16")}, "'aqsgd:fw2,bw4'"),
        ({"rhos": ()}, "rhos is empty"),
        ({"rhos": (0.0,)}, r"outside \(0, 100\]"),
        ({"rhos": (1000.0,)}, r"1000 is outside \(0, 100\]"),
        ({"rhos": (float("nan"),)}, r"rhos\[0\] = nan must be finite"),
        ({"rhos": (3.3, 3.3)}, "lists a value twice"),
        ({"methods": ("fp32", "aqsgd:fw2,bw4", "fp32")}, "lists a value twice"),
        ({"speed_steps": 1}, "speed_steps=1 must be >= 2"),
        ({"calibrate_steps": 1}, "calibrate_steps=1 must be >= 2"),
        ({"num_microbatches": 0}, "num_microbatches=0 must be >= 1"),
        ({"micro_batch_size": 1000}, "8000 examples per step exceed"),
        ({"dataset": "collegemsg"}, "not a text corpus"),
        ({"dataset": "nonexistent"}, "unknown dataset 'nonexistent'"),
        ({"launch_timeout_s": 0.0}, "launch_timeout_s=0.0 must be > 0"),
    ],
)
def test_bad_llm_settings_are_named(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LLMBenchConfig(**changes)  # type: ignore[arg-type]


def test_an_unknown_codec_is_refused() -> None:
    with pytest.raises(ValueError, match="codec 'zip:9'"):
        LLMBenchConfig(methods=("fp32", "aqsgd:fw2,bw4", "zip:9"))


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_llm_section_measures_fp32_and_aqsgd_with_exact_bytes() -> None:
    # The tiny GPT stands in for SmolLM2 (same launch, rows and summary; seconds, not minutes).
    config = LLMBenchConfig(
        model="tiny-gpt",
        rhos=(3.3,),
        micro_batch_size=2,
        num_microbatches=2,
        speed_steps=2,
        speed_rounds=1,
        calibrate_steps=2,
        launch_timeout_s=240.0,
    )
    rows, summary = run_llm_section(config)
    assert [(r["method"], r["rho"]) for r in rows] == [("fp32", 3.3), ("aqsgd:fw2,bw4", 3.3)]
    shape = (2, 64, 128)  # micro-batch x context x hidden of the tiny GPT
    for row in rows:
        spec = CodecSpec.parse(row["method"])
        per_link = 2 * (message_wire_bytes(spec, 0, shape) + message_wire_bytes(spec, 1, shape))
        assert row["bytes_per_step"] == row["analytic_bytes_per_step"] == 3 * per_link
        assert row["tokens_per_s"] == pytest.approx(2 * 2 * 64 / (row["step_time_ms"] / 1e3))
        assert row["bandwidth_mbps"] > 0 and len(row["stage_compute_ms"]) == 4
    fp32, aqsgd = rows
    assert fp32["speedup_vs_fp32"] == 1.0
    assert summary.llm_speedup_at_slowest == aqsgd["speedup_vs_fp32"]
    assert summary.llm_bytes_match_analytic is True
    assert summary.llm_model == "tiny-gpt" and summary.llm_layers == [1, 1, 1, 1]
    assert len(summary.llm_calibration_ms) == 1 and math.isfinite(summary.llm_calibration_ms[0])
    low, high = summary.llm_speedup_range
    assert low == high == pytest.approx(aqsgd["speedup_vs_fp32"])


def test_main_bench_rejects_duplicates_and_rhos_out_of_range() -> None:
    with pytest.raises(ValueError, match="lists a value twice"):
        PipelineBenchConfig(methods=("fp32", "fp32"))
    with pytest.raises(ValueError, match="lists a value twice"):
        PipelineBenchConfig(torch_pipelining=("gpipe", "gpipe"))
    with pytest.raises(ValueError, match=r"1000 is outside \(0, 100\]"):
        PipelineBenchConfig(rhos=(3.3, 1000.0))
