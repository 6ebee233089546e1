"""The data-parallel section of `frugal pipeline bench`: AQ-SGD + DP compression (paper's 4.9x).

The main bench runs one pipeline of 4 stages, so it has no data-parallel replicas. This
section runs 2 stages x 2 replicas (4 gloo ranks on 127.0.0.1, a planner `Plan`) with the same
model, batch and seed, and shapes **both** the pipeline links and each stage's DP ring at the
bandwidth of the rho point (B = 16 S / (rho c), c measured in the same launch): the DP ring
all-reduce (or sharded parameter server) costs 2 (K - 1) S_dp / (K B) seconds after the
backward passes. Pairs (pipeline codec, DP method): FP32 + fp32 all-reduce is the baseline;
AQ-SGD fw2/bw4 with and without `qadam` (AQ-SGD's reference momentum compression, 8 bits) is
the paper's "ours + DP compression"; torch's fp16 and PowerSGD hooks are the peers (full run).

Speed only: `speed_steps` steps over one repeated macro-batch per pair (the first, the fp32
warm-up step of qadam and AQ-SGD, excluded from the median). Quality of compressed DP is
covered by the tests (tests/pipeline/test_dpcomp.py), not here: it would need multi-epoch
multi-process runs beyond the quick budget.

References:
    Fine-tuning Language Models over Slow Networks using Activation Compression with
    Guarantees, NeurIPS 2022, arXiv 2206.01299 (section 5: "with DP momentum compression,
    4.9x end to end, 8.5x throughput").
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from frugal.bench.harness import BenchConfig, Summary, median
from frugal.comm.gradcomp import DP_METHODS, dp_wire_bytes
from frugal.comm.link import RHO_POINTS
from frugal.config import check_types
from frugal.parallel.codec import CodecSpec
from frugal.pipeline.models import TinyGPT, build_stages
from frugal.pipeline.train import (
    PipelineTrainConfig,
    RunSpec,
    check_rhos,
    launch_torchrun,
    rho_label,
)

__all__ = ["DPBenchConfig", "DPSectionSummary", "run_dp_section"]

_QUICK_PAIRS = (("fp32", "none"), ("aqsgd:fw2,bw4", "none"), ("aqsgd:fw2,bw4", "qadam"))
_FULL_PAIRS = (
    ("fp32", "none"),
    ("fp32", "fp16"),
    ("fp32", "powersgd"),
    ("fp32", "qadam"),
    ("aqsgd:fw2,bw4", "none"),
    ("aqsgd:fw2,bw4", "fp16"),
    ("aqsgd:fw2,bw4", "powersgd"),
    ("aqsgd:fw2,bw4", "qadam"),
)


@dataclass(frozen=True, kw_only=True, slots=True)
class DPBenchConfig(BenchConfig):
    """The DP section: which (pipeline codec, DP method) pairs at which rho points."""

    enabled: bool = True
    """Run the section."""
    pairs: tuple[tuple[str, str], ...] = _FULL_PAIRS
    """(pipeline codec, DP method); must include ("fp32", "none"), the baseline."""
    rhos: tuple[float, ...] = (RHO_POINTS["1gbps"], RHO_POINTS["100mbps"])
    """Transfer/compute ratios of the pipeline links; the DP rings get the same bandwidth."""
    speed_steps: int = 4
    """Steps per pair and rho, >= 2 (the first excluded)."""
    dp_bits: int = 8
    """Bits of qadam / ef-kbit (the reference: 8)."""
    launch_timeout_s: float = 900.0
    """Limit of the torchrun launch, seconds."""

    def __post_init__(self) -> None:
        check_types(self)
        for codec, method in self.pairs:
            CodecSpec.parse(codec)
            if method not in DP_METHODS:
                raise ValueError(f"DP method {method!r}; choose one of {', '.join(DP_METHODS)}")
        if ("fp32", "none") not in self.pairs:
            raise ValueError(f"pairs={self.pairs} must include ('fp32', 'none'), the baseline")
        check_rhos(self.rhos)
        for name in ("pairs", "rhos"):
            values = getattr(self, name)
            if len(set(values)) != len(values):
                raise ValueError(f"{name}={values} lists a value twice; list each once")
        if self.speed_steps < 2:
            raise ValueError(
                f"speed_steps={self.speed_steps} must be >= 2 (the first is not timed)"
            )

    QUICK: ClassVar = {
        "pairs": _QUICK_PAIRS,
        "rhos": (RHO_POINTS["100mbps"],),
        "speed_steps": 3,
    }
    """`--quick`: 3 pairs (FP32, AQ-SGD, AQ-SGD + qadam) at the slowest link, 3 steps each."""


def _plan(path: Path, train: PipelineTrainConfig) -> Path:
    from frugal.parallel.plan import Plan

    if train.gpt.num_layers % 2 or train.num_microbatches % 2:
        raise ValueError(
            f"the DP section splits {train.gpt.num_layers} layers over 2 stages and "
            f"{train.num_microbatches} micro-batches over 2 replicas: both must be even"
        )
    half = train.gpt.num_layers // 2
    plan = Plan(
        world_size=4,
        num_stages=2,
        num_replicas=2,
        num_layers_per_stage=(half, half),
        num_microbatches_per_replica=(train.num_microbatches // 2,) * 2,
        mesh=((0, 2), (1, 3)),
        stage_order=(0, 1),
        devices=tuple((f"cpu{r}", "localhost", "loopback") for r in range(4)),
        objective="iteration",
        method="ours",
        predicted_cost_s=0.0,
        breakdown=(),
        lower_bound_s=0.0,
        gap=0.0,
        seed=train.seed,
        cluster="loopback-2x2",
        cluster_sha256="0" * 64,
    )
    path.write_text(plan.to_json())
    return path


@dataclass(frozen=True, kw_only=True, slots=True)
class DPSectionSummary(Summary):
    """The DP section's keys of the pipeline bench's summary (2 stages x 2 replicas)."""

    dp_setup: str
    dp_speedup_at_slowest: float | None
    """AQ-SGD fw2/bw4 + qadam tokens/s over FP32 + fp32 all-reduce at the slowest link."""
    dp_speedup_aqsgd_only_at_slowest: float | None
    """AQ-SGD fw2/bw4 without DP compression over FP32 at the slowest link."""
    dp_bytes_match_analytic: bool
    """Every run's DP bytes equal the analytic size."""


def run_dp_section(
    config: DPBenchConfig,
    train: PipelineTrainConfig,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[dict[str, Any]], DPSectionSummary]:
    """Run the DP section; return its rows and summary keys.

    Rows: section "dp", method, codec, dp_compression, rho, link, bandwidth_mbps, tokens_per_s,
    step_time_ms, pipeline_bytes_per_step (replica 0's activations + gradients),
    dp_bytes_per_step (per rank, measured) and analytic_dp_bytes_per_step, speedup_vs_fp32.
    Summary: dp_speedup_at_slowest (AQ-SGD fw2/bw4 + qadam vs FP32 + fp32 all-reduce),
    dp_speedup_aqsgd_only_at_slowest (no DP compression), dp_bytes_match_analytic.

    Raises:
        PipelineError: If the launch fails or times out.
        ValueError: If the layers or micro-batches cannot be split in two.
    """
    say = progress or (lambda _: None)
    runs = [
        RunSpec(
            label=f"dp:{codec}+{method}@{rho}",
            codec=codec,
            steps=config.speed_steps,
            rho=rho,
            repeat_examples=True,
            dp_compression=method,
            dp_bits=config.dp_bits,
            shape_dp=True,
        )
        for rho in config.rhos
        for codec, method in config.pairs
    ]
    say(f"dp: {len(runs)} shaped runs, 2 stages x 2 replicas on 4 gloo ranks")
    with tempfile.TemporaryDirectory(prefix="frugal-dp-") as tmp:
        job = replace(train, plan=str(_plan(Path(tmp) / "plan.json", train)), warmup_steps=1)
        ranks = launch_torchrun(
            job, runs, Path(tmp) / "out", nproc=4, timeout_s=config.launch_timeout_s
        )
    stages = build_stages(TinyGPT(train.gpt), (train.gpt.num_layers // 2,) * 2)
    shapes = [[tuple(p.shape) for p in s.parameters()] for s in stages]
    tokens_per_step = train.micro_batch_size * train.num_microbatches * train.gpt.context
    rows: list[dict[str, Any]] = []
    for k, run in enumerate(runs):
        outs = [r["runs"][k] for r in ranks]
        step_s = median(max(o["step_s"][i] for o in outs) for i in range(1, run.steps))
        pipe0 = [r["runs"][k] for r in ranks if r["replica"] == 0]
        last = run.steps - 1
        pipeline_bytes = sum(sum(o["activation_bytes"][last]) for o in pipe0) + sum(
            sum(o["gradient_bytes"][last]) for o in pipe0
        )
        measured = [o["dp_bytes"][last] for o in outs]
        analytic = [
            dp_wire_bytes(
                run.dp_compression, shapes[r["stage"]], 2, last, bits=run.dp_bits, warmup_steps=1
            )
            for r in ranks
        ]
        bandwidth = outs[0]["bandwidth_bits_per_s"] or math.inf
        rows.append(
            {
                "section": "dp",
                "method": f"{run.codec} + dp {run.dp_compression}",
                "codec": run.codec,
                "dp_compression": run.dp_compression,
                "dp_bits": run.dp_bits if DP_METHODS.get(run.dp_compression).uses_bits else None,
                "rho": run.rho,
                "link": rho_label(run.rho),
                # not "link_mbps": the main section's speed-up figure plots rows that have it
                "bandwidth_mbps": bandwidth / 1e6 if math.isfinite(bandwidth) else None,
                "tokens_per_s": tokens_per_step / step_s,
                "step_time_ms": 1e3 * step_s,
                "pipeline_bytes_per_step": pipeline_bytes,
                "dp_bytes_per_step": max(measured),
                "analytic_dp_bytes_per_step": max(analytic),
                "dp_bytes_match": measured == analytic,
            }
        )
        say(f"  {run.label}: {rows[-1]['tokens_per_s']:.0f} tok/s")
    for row in rows:
        base = _find(rows, "fp32", "none", row["rho"])
        row["speedup_vs_fp32"] = row["tokens_per_s"] / base["tokens_per_s"] if base else None
    slowest = max(config.rhos)
    ours = _find(rows, "aqsgd:fw2,bw4", "qadam", slowest)
    alone = _find(rows, "aqsgd:fw2,bw4", "none", slowest)
    summary = DPSectionSummary(
        dp_setup="2 stages x 2 replicas, pipeline and DP links at the same bandwidth",
        dp_speedup_at_slowest=ours["speedup_vs_fp32"] if ours else None,
        dp_speedup_aqsgd_only_at_slowest=alone["speedup_vs_fp32"] if alone else None,
        dp_bytes_match_analytic=all(r["dp_bytes_match"] for r in rows),
    )
    return rows, summary


def _find(rows: Sequence[dict[str, Any]], codec: str, method: str, rho: float) -> Any:
    return next(
        (
            r
            for r in rows
            if r["codec"] == codec and r["dp_compression"] == method and r["rho"] == rho
        ),
        None,
    )
