"""The end-to-end section of `frugal pipeline bench`: whole fine-tunes timed, warm-up included.

The main bench's speed-up is a steady-state number: a few steps over one repeated macro-batch,
all of whose examples AQ-SGD has already buffered. The paper's 4.3x is end to end: a
multi-epoch fine-tune whose first epoch sends every activation in full precision (the
warm-up, and the first visit of every example) before the 2-bit deltas take over. This
section times exactly that on the shaped links: FP32 and AQ-SGD each fine-tune the tiny GPT
(from the same FP32 pre-trained weights as the quality runs) for `epochs` epochs over
`num_train` windows in one torchrun launch of `num_stages` gloo ranks at one rho point, AQ-SGD
sending fp32 for its first `warmup_epochs`; `rounds` interleaved rounds (order reversed every
other round). The end-to-end time is the sum of every step's time (slowest rank per step),
the first included; the eval loss is the whole model's after the last step.

The speed-up the warm-up leaves: with E epochs, W of them warm-up and a steady-state
speed-up s, the end-to-end speed-up is at most E / (W + (E - W) / s) (`amdahl_ceiling`); the
summary states it beside the measured value, from the steady-state speed-up this section's own
runs show after their warm-up.

References:
    Fine-tuning Language Models over Slow Networks using Activation Compression with
    Guarantees, NeurIPS 2022, arXiv 2206.01299 (section 5: "up to 4.3x end-to-end speed-up").
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from frugal.bench.harness import BenchConfig, Summary, median
from frugal.comm.link import RHO_POINTS
from frugal.config import check_types
from frugal.parallel.codec import CodecSpec
from frugal.pipeline.train import PipelineTrainConfig, RunSpec, check_rhos, launch_torchrun

__all__ = ["E2EBenchConfig", "E2ESectionSummary", "amdahl_ceiling", "run_e2e_section"]


@dataclass(frozen=True, kw_only=True, slots=True)
class E2EBenchConfig(BenchConfig):
    """The end-to-end section: which codec against FP32, how long, at which link."""

    enabled: bool = True
    """Run the section."""
    codec: str = "aqsgd:fw2,bw4:row"
    """The compressed run's codec (against "fp32")."""
    rho: float = RHO_POINTS["100mbps"]
    """Transfer/compute ratio of every link (the paper's slowest, 100 Mbps)."""
    epochs: int = 6
    """Epochs of each fine-tune, >= 2."""
    warmup_epochs: int = 1
    """Epochs AQ-SGD sends in fp32 first (the paper's protocol), in [0, epochs)."""
    num_train: int = 256
    """Train windows, a multiple of the macro-batch (micro_batch_size x num_microbatches)."""
    rounds: int = 1
    """Interleaved rounds of the two fine-tunes, >= 1."""
    launch_timeout_s: float = 1800.0
    """Limit of the torchrun launch, seconds."""

    def __post_init__(self) -> None:
        check_types(self)
        spec = CodecSpec.parse(self.codec)
        if spec.method == "fp32":
            raise ValueError(f"codec={self.codec!r}: give a compressed codec to compare with fp32")
        check_rhos((self.rho,))
        if self.epochs < 2 or not 0 <= self.warmup_epochs < self.epochs:
            raise ValueError(
                f"epochs={self.epochs} must be >= 2 and warmup_epochs={self.warmup_epochs} in "
                f"[0, epochs)"
            )
        if self.rounds < 1 or self.num_train < 1 or self.launch_timeout_s <= 0:
            raise ValueError(
                f"rounds={self.rounds} and num_train={self.num_train} must be >= 1, "
                f"launch_timeout_s={self.launch_timeout_s} > 0"
            )

    QUICK: ClassVar = {"epochs": 4, "num_train": 128}
    """`--quick`: 4 epochs over 128 windows (one of them AQ-SGD's fp32 warm-up)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class E2ESectionSummary(Summary):
    """The end-to-end section's keys of the pipeline bench's summary."""

    e2e_setup: str
    e2e_speedup_at_slowest: float
    """FP32's end-to-end fine-tune time over the compressed one's (median over rounds)."""
    e2e_steady_speedup: float
    """The same two runs' speed-up over their post-warm-up steps only."""
    e2e_amdahl_ceiling: float
    """E / (W + (E - W) / e2e_steady_speedup): what the warm-up epochs allow."""
    e2e_eval_loss_gap: float
    """Compressed final eval loss / FP32's - 1 (after the same steps)."""
    e2e_fp32_s: float
    e2e_compressed_s: float


def amdahl_ceiling(epochs: int, warmup_epochs: int, steady_speedup: float) -> float:
    """The end-to-end speed-up left when `warmup_epochs` of `epochs` run at FP32's speed.

    E / (W + (E - W) / s); s = 1 gives 1, W = 0 gives s.

    Raises:
        ValueError: If the epochs are not 0 <= W < E or s <= 0.
    """
    if not 0 <= warmup_epochs < epochs or steady_speedup <= 0:
        raise ValueError(
            f"warmup_epochs={warmup_epochs}, epochs={epochs} and steady_speedup="
            f"{steady_speedup} must satisfy 0 <= W < E and s > 0"
        )
    return epochs / (warmup_epochs + (epochs - warmup_epochs) / steady_speedup)


def run_e2e_section(
    config: E2EBenchConfig,
    train: PipelineTrainConfig,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[dict[str, Any]], E2ESectionSummary]:
    """Run the two fine-tunes; return their rows and the summary keys.

    Args:
        config: Codec, link, length and rounds.
        train: Model, stages, schedule, batch, pre-trained `init_weights` and learning rate
            of every run (its codec, steps and warm-up are set here).
        progress: Called with one line per finished run.

    Rows: section "e2e", method, round, epochs, steps, end_to_end_s, steady_step_ms (median
    step after the warm-up), final_eval_loss, link_mbps.

    Raises:
        PipelineError: If the launch fails or times out.
        ValueError: If `num_train` is not a multiple of the macro-batch.
    """
    say = progress or (lambda _: None)
    per_step = train.micro_batch_size * train.num_microbatches
    if config.num_train % per_step:
        raise ValueError(
            f"e2e num_train={config.num_train} must be a multiple of the macro-batch "
            f"({per_step} windows), so every epoch has whole steps"
        )
    steps_per_epoch = config.num_train // per_step
    steps = config.epochs * steps_per_epoch
    warmup = config.warmup_epochs * steps_per_epoch
    methods = ("fp32", config.codec)
    runs = [
        RunSpec(
            label=f"e2e:{method}#{k}",
            codec=method,
            steps=steps,
            rho=config.rho,
            calibrate=i == 0,
        )
        for k in range(config.rounds)
        for i, method in enumerate(methods if k % 2 == 0 else methods[::-1])
    ]
    say(
        f"e2e: {len(runs)} fine-tunes of {steps} steps ({config.epochs} epochs) at rho {config.rho}"
    )
    job = replace(train, num_train=config.num_train, warmup_steps=warmup)
    with tempfile.TemporaryDirectory(prefix="frugal-e2e-") as tmp:
        ranks = launch_torchrun(
            job, runs, Path(tmp), nproc=train.num_stages, timeout_s=config.launch_timeout_s
        )
    rows: list[dict[str, Any]] = []
    for i, run in enumerate(runs):
        outs = [r["runs"][i] for r in ranks]
        step_s = [max(o["step_s"][s] for o in outs) for s in range(steps)]
        evaluated = next(o["eval_loss"] for o in outs if o["eval_loss"] is not None)
        bandwidth = outs[0]["bandwidth_bits_per_s"]
        rows.append(
            {
                "section": "e2e",
                "method": run.codec,
                "round": int(run.label.rsplit("#", 1)[1]),
                "epochs": config.epochs,
                "warmup_epochs": config.warmup_epochs if run.codec != "fp32" else 0,
                "steps": steps,
                "end_to_end_s": sum(step_s),
                "steady_step_ms": 1e3 * statistics.median(step_s[max(warmup, 1) :]),
                "final_eval_loss": evaluated,
                "link_mbps": bandwidth / 1e6 if bandwidth else None,
            }
        )
        say(f"  {run.codec} round {rows[-1]['round']}: {rows[-1]['end_to_end_s']:.1f} s")

    def per_round(key: str, method: str) -> list[float]:
        return [float(r[key]) for r in rows if r["method"] == method]

    fp32_s, ours_s = per_round("end_to_end_s", "fp32"), per_round("end_to_end_s", config.codec)
    speedup = median(f / o for f, o in zip(fp32_s, ours_s, strict=True))
    steady = median(
        f / o
        for f, o in zip(
            per_round("steady_step_ms", "fp32"),
            per_round("steady_step_ms", config.codec),
            strict=True,
        )
    )
    fp32_loss = median(per_round("final_eval_loss", "fp32"))
    summary = E2ESectionSummary(
        e2e_setup=(
            f"{train.num_stages} stages, {config.epochs} epochs x {steps_per_epoch} steps, "
            f"{config.warmup_epochs} warm-up, {config.codec} vs fp32 at rho {config.rho}"
        ),
        e2e_speedup_at_slowest=speedup,
        e2e_steady_speedup=steady,
        e2e_amdahl_ceiling=amdahl_ceiling(config.epochs, config.warmup_epochs, steady),
        e2e_eval_loss_gap=median(per_round("final_eval_loss", config.codec)) / fp32_loss - 1.0,
        e2e_fp32_s=median(fp32_s),
        e2e_compressed_s=median(ours_s),
    )
    return rows, summary
