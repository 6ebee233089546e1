"""`frugal pipeline bench`: FP32, fp16, DirectQ and AQ-SGD side by side, 4 stages, 5 rho points.

Both presets run `aqsgd:fw2,bw4:row` ("ours": per-row min/step scales instead of the
reference's per-channel abs-max over all tokens, so one outlier token no longer coarsens a
whole channel; the same bytes up to the scale overhead). The full preset adds
`aqsgd:fw2,bw4:row:fv8`: first visits and the warm-up as 8-bit codes instead of float32 (a
quarter of the bytes of AQ-SGD's first epoch), both sides buffering the decoded value, and
`aqsgd:fw2,bw4:row:ef`: 4-bit gradients with error feedback per example. One flag each.

Three parts, one results.json:

1. Quality: each method fine-tunes the tiny GPT for `epochs` epochs over the same windows,
   seed and order, all stages in one process (LocalTransport: the same runtime, codecs and
   schedule as the distributed run, no shaping), from weights pre-trained in FP32 for
   `pretrain_epochs` on the corpus windows the runs never see (AQ-SGD's setting: a pretrained
   model, whose activations change slowly; `pretrain_epochs = 0` trains from scratch, where
   2-bit deltas of fast-moving activations cost more). Final train loss (mean of the last
   epoch) and eval loss of the whole model.
2. Speed: one torchrun launch of `num_stages` gloo ranks on 127.0.0.1 runs every (method, rho)
   for `speed_steps` steps over one repeated macro-batch (AQ-SGD's examples are all seen after
   the first step, so later steps are steady state), in `speed_rounds` interleaved rounds.
   The bandwidth of each rho point is B = 16 S / (rho c) with c measured at the start of
   each round, minutes from the cells it sets (`frugal.comm.link`; `calibration_ms` in the
   summary, one per round). tokens_per_s = tokens per step / median step time over every
   round's steps after its first (max over ranks);
   `tokens_per_s_by_round` keeps each round's, and the summary's `speedup_range_by_link` the
   spread of the per-round speed-ups.
3. Simulation: `frugal.planner.sim.simulate_step` replays the same schedule from each round's median
   per-stage forward/backward seconds, its link speed and the exact wire bytes
   (`simulated_tokens_per_s_by_round`); `simulated_tokens_per_s` is the median step over the
   rounds. The summary's `sim_speedup_free_codec_at_slowest` replays FP32's compute with
   AQ-SGD fw2/bw4's bytes at the slowest link: the speed-up the schedule and link allow if the
   codec cost no CPU.

The full preset adds three more launches: torch.distributed.pipelining head to head with our
FP32 runtime, the data-parallel section (`frugal.bench.pipeline_dp`) and the SmolLM2-135M
section (`frugal.bench.pipeline_llm`: FP32 vs AQ-SGD fw2/bw4 on the pre-trained LM, where a
stage's compute dwarfs the codec's, as in the paper's setting).

`time_to_fp32_loss_s`: the first time the quality run's train-loss EMA (0.9) reaches FP32's
final EMA, where each step costs its simulated time at that rho point, with the bytes that
step really sent (AQ-SGD's first epoch carries first visits in fp32). None = never reached.

References:
    Fine-tuning Language Models over Slow Networks using Activation Compression with
    Guarantees, NeurIPS 2022, arXiv 2206.01299 (section 5: methods, bit pairs, link speeds).
"""

from __future__ import annotations

import concurrent.futures
import functools
import itertools
import json
import math
import os
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from frugal.bench.harness import (
    Bench,
    BenchConfig,
    BenchResult,
    BenchSpec,
    Progress,
    Summary,
    median,
    process_pool,
    write_bench_results,
)
from frugal.bench.pipeline_dp import DPBenchConfig, run_dp_section
from frugal.bench.pipeline_e2e import E2EBenchConfig, run_e2e_section
from frugal.bench.pipeline_llm import LLMBenchConfig, interleaved_runs, run_llm_section
from frugal.comm.link import RHO_POINTS
from frugal.config import check_types
from frugal.parallel.codec import CodecSpec, message_wire_bytes
from frugal.pipeline.train import (
    LocalResult,
    PipelineTrainConfig,
    RunSpec,
    cell_rounds,
    check_rhos,
    launch_torchrun,
    pretrain_local,
    rho_label,
    train_local,
)
from frugal.planner.sim import simulate_step

__all__ = [
    "PIPELINE_BENCH",
    "PipelineBenchConfig",
    "PipelineSummary",
    "TorchPipeliningSummary",
    "run_pipeline_bench",
]

_QUICK_METHODS = ("fp32", "fp16", "directq:fw2,bw4", "aqsgd:fw2,bw4", "aqsgd:fw2,bw4:row")
_FULL_METHODS = (
    "fp32",
    "fp16",
    "directq:fw2,bw4",
    "directq:fw3,bw6",
    "directq:fw4,bw8",
    "aqsgd:fw2,bw4",
    "aqsgd:fw3,bw6",
    "aqsgd:fw4,bw8",
    "aqsgd:fw2,bw4:row",
    "aqsgd:fw2,bw4:row:fv8",
    "aqsgd:fw2,bw4:row:ef",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineBenchConfig(BenchConfig):
    """What `frugal pipeline bench` runs; `quick()` is the small preset."""

    train: PipelineTrainConfig = field(
        default_factory=lambda: PipelineTrainConfig(
            num_train=1024,
            num_eval=128,
            schedule="gpipe",
            micro_batch_size=4,
            num_microbatches=8,
            calibrate_steps=9,  # c = the median of 8 steps: one slow step cannot move every B
        )
    )
    """Model, data, stages, schedule and batch of every run (its codec/steps are replaced)."""
    methods: tuple[str, ...] = _FULL_METHODS
    """Codecs compared; must include fp32 (the reference)."""
    rhos: tuple[float, ...] = tuple(RHO_POINTS.values())
    """Transfer/compute ratios (the paper's 10 Gbps ... 100 Mbps)."""
    epochs: int = 8
    """Quality runs: epochs over the train windows, >= 2 (AQ-SGD needs revisits)."""
    pretrain_epochs: int = 2
    """Quality runs fine-tune, as AQ-SGD is evaluated: the tiny GPT is first trained in FP32
    for this many epochs over the corpus windows the runs never see (`pretrain_local`), and
    every method starts from those weights; 0 = every method trains from scratch."""
    pretrain_windows: int = 0
    """Pre-training windows used (the first ones), >= 0; 0 = every unseen window."""
    finetune_learning_rate: float = 3e-4
    """AdamW learning rate of the quality runs when they fine-tune, > 0: a tenth of the
    pre-training rate (`train.learning_rate`, 3e-3), as fine-tuning runs go. AQ-SGD's error
    grows with how far the model moves between two visits of an example: at 1e-3 the full
    preset's fw2/bw4 gap to FP32 is +8.1% (FP32 then reaches a lower loss, 2.247 vs 2.451)."""
    aqsgd_warmup_epochs: int = 1
    """AQ-SGD quality runs send everything as fp32 for this many epochs first (the
    reference's warm-up), >= 0."""
    speed_steps: int = 4
    """Speed runs: steps per (method, rho) and round, >= 2; the first is excluded."""
    speed_rounds: int = 3
    """Speed runs: rounds over every (method, rho), >= 1, interleaved (round 2 starts after
    round 1 ran every cell), so slow drift of the machine's speed (other jobs, thermal)
    lands on every cell alike; a cell's tokens/s is the median over all its timed steps."""
    quality_workers: int = 2
    """Quality runs in parallel processes (each one thread), >= 1."""
    launch_timeout_s: float = 1800.0
    """Limit of the torchrun launch, seconds."""
    sim_num_cores: float = 0.0
    """Processors the simulated stages share, >= 1 (0 = fitted: the core count, in steps of
    0.05, at which the simulator reproduces the unshaped calibration run's step time)."""
    torch_pipelining: tuple[str, ...] = ("gpipe", "1f1b")
    """Schedules of the torch.distributed.pipelining FP32 baseline ("gpipe", "1f1b"), run for
    1 + speed_rounds (speed_steps - 1) steps (as many timed steps as one of our cells) and
    compared with our FP32 run on the same unshaped loopback link
    (torch's sends cannot go through our shaper); empty = skip the baseline."""
    dp: DPBenchConfig = field(default_factory=DPBenchConfig)
    """The data-parallel section (2 stages x 2 replicas, AQ-SGD + DP compression)."""
    llm: LLMBenchConfig = field(default_factory=LLMBenchConfig)
    """The LLM section: FP32 vs AQ-SGD on pre-trained SmolLM2-135M (`frugal.bench.pipeline_llm`)."""
    e2e: E2EBenchConfig = field(default_factory=E2EBenchConfig)
    """The end-to-end section: whole fine-tunes of FP32 and AQ-SGD timed on the slowest link,
    warm-up included (`frugal.bench.pipeline_e2e`)."""

    def __post_init__(self) -> None:
        check_types(self)
        for method in self.methods:
            CodecSpec.parse(method)
        if "fp32" not in self.methods:
            raise ValueError(f"methods={self.methods} must include 'fp32' (the reference)")
        check_rhos(self.rhos)
        for name in ("methods", "rhos", "torch_pipelining"):
            values = getattr(self, name)
            if len(set(values)) != len(values):
                raise ValueError(f"{name}={values} lists a value twice; list each once")
        if self.aqsgd_warmup_epochs < 0 or self.aqsgd_warmup_epochs >= self.epochs:
            raise ValueError(
                f"aqsgd_warmup_epochs={self.aqsgd_warmup_epochs} must be in [0, epochs)"
            )
        if self.sim_num_cores != 0 and self.sim_num_cores < 1:
            raise ValueError(
                f"sim_num_cores={self.sim_num_cores} must be >= 1, or 0 to fit it on the "
                f"calibration run"
            )
        if min(self.pretrain_epochs, self.pretrain_windows) < 0 or self.finetune_learning_rate <= 0:
            raise ValueError(
                f"pretrain_epochs={self.pretrain_epochs} and pretrain_windows="
                f"{self.pretrain_windows} must be >= 0, finetune_learning_rate="
                f"{self.finetune_learning_rate} > 0"
            )
        if (
            self.epochs < 2
            or self.speed_steps < 2
            or self.speed_rounds < 1
            or self.quality_workers < 1
        ):
            raise ValueError(
                f"epochs={self.epochs} and speed_steps={self.speed_steps} must be >= 2, "
                f"speed_rounds={self.speed_rounds} and quality_workers={self.quality_workers} >= 1"
            )
        for name in self.torch_pipelining:
            if name not in ("gpipe", "1f1b"):
                raise ValueError(
                    f"torch_pipelining={self.torch_pipelining}: each must be 'gpipe' or '1f1b'"
                )

    QUICK: ClassVar = {
        "train": PipelineTrainConfig(
            num_train=512,
            num_eval=64,
            schedule="gpipe",
            micro_batch_size=4,
            num_microbatches=8,
        ),
        "methods": _QUICK_METHODS,
        "epochs": 6,
        "pretrain_epochs": 1,
        "speed_steps": 3,
        "speed_rounds": 2,
        "dp": DPBenchConfig.QUICK,
        "llm": {"enabled": False},
        "e2e": E2EBenchConfig.QUICK,
    }
    """`--quick`: 5 methods, 1 pre-training epoch, 6 epochs, 2 x 3 speed steps."""
    PRESETS: ClassVar = {
        "smoke": {
            "train": {"num_train": 64, "num_eval": 16, "num_microbatches": 4},
            "methods": ("fp32", "aqsgd:fw2,bw4"),
            "rhos": (min(RHO_POINTS.values()), max(RHO_POINTS.values())),
            "epochs": 2,
            "pretrain_windows": 256,
            "speed_steps": 2,
            "speed_rounds": 1,
            "torch_pipelining": (),
            "dp": {"enabled": False},
            "e2e": {"enabled": False},
        }
    }
    """`quick` is `quick()`; `smoke`: that with 64 training windows, FP32 and AQ-SGD fw2/bw4
    only, the fastest and slowest rho, 2 epochs, 2 speed steps in 1 round, no
    torch.pipelining and no DP."""


def _quality_job(train: PipelineTrainConfig) -> LocalResult:
    import torch

    torch.set_num_threads(1)
    return train_local(train)


def _pretrain_job(
    train: PipelineTrainConfig, epochs: int, path: Path, max_windows: int | None
) -> dict[str, Any]:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each quality run: the same arithmetic wherever it runs
    try:
        return pretrain_local(train, epochs, path, max_windows=max_windows)
    finally:
        torch.set_num_threads(threads)


def _ema(values: list[float], decay: float = 0.9) -> list[float]:
    out, acc = [], values[0]
    for v in values:
        acc = decay * acc + (1 - decay) * v
        out.append(acc)
    return out


def _quality_runs(
    config: PipelineBenchConfig,
    weights_dir: Path,
    quality_steps: int,
    warmup_steps: int,
    say: Callable[[str], None],
) -> tuple[dict[str, LocalResult], dict[str, Any] | None]:
    """Pre-train (if asked), then train every method in `quality_workers` processes."""
    train = config.train
    pretraining: dict[str, Any] | None = None
    if config.pretrain_epochs:
        weights = weights_dir / "pretrained.pt"
        say(f"pre-training: {config.pretrain_epochs} FP32 epochs on the unseen windows")
        pretraining = _pretrain_job(
            train, config.pretrain_epochs, weights, config.pretrain_windows or None
        )
        say(f"  eval loss after pre-training {pretraining['eval_loss']:.4f}")
        train = replace(
            train, init_weights=str(weights), learning_rate=config.finetune_learning_rate
        )
    jobs = {
        m: replace(
            train,
            codec=m,
            steps=quality_steps,
            warmup_steps=warmup_steps if m.startswith("aqsgd") else 0,
        )
        for m in config.methods
    }
    say(f"quality: {len(jobs)} methods x {quality_steps} steps (one process each)")
    quality: dict[str, LocalResult] = {}
    with process_pool(config.quality_workers) as ex:
        futures = {ex.submit(_quality_job, job): m for m, job in jobs.items()}
        for future in concurrent.futures.as_completed(futures):
            method = futures[future]
            quality[method] = future.result()
            say(f"  {method}: eval loss {quality[method].eval_loss:.4f}")
    return quality, pretraining


def run_pipeline_bench(
    config: PipelineBenchConfig,
    out_dir: Path,
    progress: Progress | None = None,
) -> BenchResult[PipelineSummary]:
    """Run the bench and write `results.json` and `loss_curves.png` into `out_dir`.

    Args:
        config: Methods, rho points, sizes and the optional sections.
        out_dir: Output folder (created).
        progress: Called with one line per finished step.

    Returns:
        The typed summary, the rows (as documented in the module) and the results document.

    Raises:
        PipelineError: If the torchrun launch fails or times out.
        OSError: If `out_dir` cannot be written.
    """
    say = progress or (lambda _: None)
    train = config.train
    steps_per_epoch = train.num_train // (train.micro_batch_size * train.num_microbatches)
    quality_steps = config.epochs * steps_per_epoch
    warmup_steps = config.aqsgd_warmup_epochs * steps_per_epoch
    e2e_rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="frugal-pretrained-") as weights_dir:
        quality, pretraining = _quality_runs(
            config, Path(weights_dir), quality_steps, warmup_steps, say
        )
        if config.e2e.enabled:  # the same pre-trained start as the quality runs
            fine_tune = (
                replace(
                    train,
                    init_weights=str(Path(weights_dir) / "pretrained.pt"),
                    learning_rate=config.finetune_learning_rate,
                )
                if pretraining
                else train
            )
            e2e_rows, e2e_summary = run_e2e_section(config.e2e, fine_tune, say)

    cells = [(m, rho) for rho in config.rhos for m in config.methods]
    if config.torch_pipelining:  # our FP32 on the raw link, beside torch's pipelining
        cells.append(("fp32", 0.0))
    runs = interleaved_runs(cells, num_rounds=config.speed_rounds, steps=config.speed_steps)
    say(
        f"speed: {len(cells)} cells x {config.speed_rounds} interleaved rounds on "
        f"{train.num_stages} gloo ranks"
    )
    with tempfile.TemporaryDirectory(prefix="frugal-pipeline-") as tmp:
        ranks = launch_torchrun(
            train,
            runs,
            Path(tmp),
            nproc=train.num_stages,
            timeout_s=config.launch_timeout_s,
            on_progress=None,
        )
    by_stage = sorted(ranks, key=lambda r: r["stage"])
    tokens_per_step = train.micro_batch_size * train.num_microbatches * train.gpt.context
    shape = (train.micro_batch_size, train.gpt.context, train.gpt.hidden)
    m = train.num_microbatches
    cores = config.sim_num_cores or _effective_cores(by_stage, train.schedule)
    fp32_final = _ema(quality["fp32"].losses)[-1]

    rows: list[dict[str, Any]] = []
    compute_by_cell: dict[tuple[str, float], tuple[list[float], ...]] = {}
    for c, (method, rho) in enumerate(cells):
        # This cell's run in every round: rounds[i][stage] is one rank's output.
        rounds, round_step_s, measured_s = cell_rounds(by_stage, len(cells), c, config.speed_rounds)
        outs = rounds[-1]
        fwd = _median_by_rank(rounds, "median_forward_cpu_s")
        bwd = _median_by_rank(rounds, "median_backward_cpu_s")
        opt = _median_by_rank(rounds, "median_optimizer_s")
        compute_by_cell[(method, rho)] = (fwd, bwd, opt)
        act = [o["activation_bytes"][-1] for o in outs[:-1]]
        grad = [o["gradient_bytes"][-1] for o in outs[1:]]
        # Each round's link speed comes from its own calibration and its compute was timed in
        # that same run: simulate every round from its own bandwidth and per-stage seconds and
        # keep the median step, as for the measured side. (Pairing every round's bandwidth with
        # the compute pooled over all rounds can mis-estimate a cell when the machine's speed
        # drifts between rounds.)
        bandwidths = [rnd[0]["bandwidth_bits_per_s"] or math.inf for rnd in rounds]
        bandwidth = median(bandwidths)
        round_sim_s = _simulate_rounds(train.schedule, m, rounds, act, grad, bandwidths, cores)
        sim_step_s = median(round_sim_s)
        spec = CodecSpec.parse(method)
        result = quality[method]
        # Per quality step: simulated time with the bytes that step sent.
        # AQ-SGD's first epoch sends first visits as fp32 (and everything in its warm-up).
        warm = config.aqsgd_warmup_epochs > 0
        first = message_wire_bytes(spec, 0, shape, num_new=shape[0], warmup=warm)
        first_grad = message_wire_bytes(spec, 1, shape, warmup=warm)
        first_sim = simulate_step(
            schedule=train.schedule,
            num_microbatches=m,
            forward_s=fwd,
            backward_s=bwd,
            activation_bytes=[[first] * m] * len(act),
            gradient_bytes=[[first_grad] * m] * len(grad),
            bandwidth_bits_per_s=bandwidth,
            optimizer_s=opt,
            num_cores=cores,
        )
        elapsed, reached = 0.0, None
        for step, value in enumerate(_ema(result.losses)):
            new_visits = spec.method == "aqsgd" and step < max(steps_per_epoch, warmup_steps)
            elapsed += first_sim.step_time_s if new_visits else sim_step_s
            if value <= fp32_final:
                reached = elapsed
                break
        rows.append(
            {
                "codec": spec.method,
                "method": method,
                "fw_bits": spec.fw_bits,
                "bw_bits": spec.bw_bits,
                "rho": rho,
                "link": rho_label(rho) if rho > 0 else "unshaped",
                "link_mbps": bandwidth / 1e6 if math.isfinite(bandwidth) else None,
                "link_mbps_by_round": [b / 1e6 if math.isfinite(b) else None for b in bandwidths],
                "tokens_per_s": tokens_per_step / measured_s,
                "tokens_per_s_by_round": [
                    tokens_per_step / median(steps) for steps in round_step_s
                ],
                "step_time_ms": measured_s * 1e3,
                "bytes_per_step": sum(map(sum, act)) + sum(map(sum, grad)),
                "analytic_bytes_per_step": (len(act) * m)
                * (message_wire_bytes(spec, 0, shape) + message_wire_bytes(spec, 1, shape)),
                "final_train_loss": statistics.fmean(result.losses[-steps_per_epoch:]),
                "final_eval_loss": result.eval_loss,
                "time_to_fp32_loss_s": reached,
                "simulated_tokens_per_s": tokens_per_step / sim_step_s,
                "simulated_tokens_per_s_by_round": [tokens_per_step / s for s in round_sim_s],
                "stage_compute_ms": [1e3 * (f + b) for f, b in zip(fwd, bwd, strict=True)],
                "buffer_bytes": result.buffer_bytes,
            }
        )
        say(
            f"  {method}@{rho}: {rows[-1]['tokens_per_s']:.0f} tok/s (sim "
            f"{rows[-1]['simulated_tokens_per_s']:.0f})"
        )

    summary: dict[str, Any] = _summary(rows, config)
    summary["sim_speedup_free_codec_at_slowest"] = _free_codec_speedup(
        rows, compute_by_cell, config, cores
    )
    summary["sim_num_cores"] = cores
    summary["calibration_ms"] = [1e3 * c for c in by_stage[0].get("calibration_s", [])]
    summary["quality_start"] = "fine-tune" if pretraining else "scratch"
    summary["pretraining"] = pretraining
    if config.torch_pipelining:
        say(f"baseline: torch.distributed.pipelining {', '.join(config.torch_pipelining)}")
        baseline_rows, baseline_summary = torch_pipelining_rows(config, rows)
        rows.extend(baseline_rows)
        summary.update(baseline_summary.to_dict())
    if config.dp.enabled:  # the main bench has no DP replicas: its own launch, 2 x 2 ranks
        dp_rows, dp_summary = run_dp_section(config.dp, train, say)
        rows.extend(dp_rows)
        summary.update(dp_summary.to_dict())
    if config.llm.enabled:  # the paper's regime: a pre-trained LM, several wide blocks a stage
        from frugal import FrugalError

        try:
            llm_rows, llm_section = run_llm_section(config.llm, train.schedule, say)
            summary.update(llm_section.to_dict())
        except (FrugalError, ValueError, OSError) as exc:  # e.g. no model wheel: keep the rest
            say(f"llm section skipped: {exc}")
            llm_rows = []
            summary["llm_skipped"] = f"{type(exc).__name__}: {exc}"
        rows.extend(llm_rows)
    if config.e2e.enabled:
        rows.extend(e2e_rows)
        summary.update(e2e_summary.to_dict())
    typed = PipelineSummary(**summary)  # a key no field names is a TypeError here
    out_dir.mkdir(parents=True, exist_ok=True)
    written = write_bench_results("pipeline", config, rows, typed, out_dir / "results.json")
    (out_dir / "speed_ranks.json").write_text(json.dumps(ranks))
    _plot(quality, out_dir / "loss_curves.png", typed.quality_start)
    return written


def torch_pipelining_rows(
    config: PipelineBenchConfig, rows: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], TorchPipeliningSummary]:
    """Run the torch.distributed.pipelining baseline head to head; its rows and summary keys.

    In each of `speed_rounds` rounds, our FP32 runtime (unshaped) and torch's schedules are
    launched one after the other, each in fresh processes for `speed_steps` steps, so both
    see the same machine state; each side's tokens/s is the median over all rounds' timed
    steps (a launch's first step is not timed). Rows carry `codec` "torch.pipelining",
    `method` "torch.pipelining:SCHEDULE", FP32 bits, rho 0 (link "unshaped"), measured
    tokens/s and the first step's loss; `skipped` holds the reason when a launch failed or
    hung (the bench goes on). Our runtime runs its own schedule and every other schedule of
    `torch_pipelining` (GPipe and 1F1B in the full preset). Summary:
    `torch_pipelining_tokens_per_s` per schedule, `fp32_unshaped_tokens_per_s` (ours, from the
    speed cells), `fp32_head_to_head_tokens_per_s` (ours on the bench's schedule, launched
    like torch's), `speedup_vs_torch_pipelining` (head to head on that schedule), and
    `fp32_head_to_head_tokens_per_s_by_schedule` and `speedup_vs_torch_pipelining_by_schedule`
    (ours against torch's, schedule by schedule).
    """
    from frugal.pipeline.runtime import PipelineError
    from frugal.pipeline.torch_pipelining import launch_torch_pipelining

    train = config.train
    shape = (train.micro_batch_size, train.gpt.context, train.gpt.hidden)
    fp32 = CodecSpec.parse("fp32")
    analytic = (train.num_stages - 1) * train.num_microbatches * 4 * math.prod(shape) * 2
    tokens_per_step = train.micro_batch_size * train.num_microbatches * train.gpt.context
    timeout_s = min(config.launch_timeout_s, 600.0)
    # Ours on its own schedule first, then on each other schedule torch runs.
    ours_schedules = tuple(dict.fromkeys((train.schedule, *config.torch_pipelining)))
    steps_by_side: dict[str, list[float]] = {name: [] for name in config.torch_pipelining}
    steps_by_side |= {f"ours:{name}": [] for name in ours_schedules}
    first_losses: dict[str, list[float]] = {}
    reason = None
    ours_spec = RunSpec(
        label="fp32@head-to-head", codec="fp32", steps=config.speed_steps, repeat_examples=True
    )
    with tempfile.TemporaryDirectory(prefix="frugal-torch-pipelining-") as tmp:
        side = "torch.distributed.pipelining"
        try:
            for r in range(config.speed_rounds):  # ours, then torch's, in every round
                for name in ours_schedules:
                    side = f"frugal's own pipeline ({name}, round {r})"
                    ours_ranks = launch_torchrun(
                        replace(train, schedule=name), [ours_spec],
                        Path(tmp) / f"ours-{name}{r}", nproc=train.num_stages, timeout_s=timeout_s,
                    )  # fmt: skip
                    steps_by_side[f"ours:{name}"] += _timed_steps(
                        [rank["runs"][0] for rank in ours_ranks]
                    )
                side = f"torch.distributed.pipelining (round {r})"
                torch_ranks = launch_torch_pipelining(
                    train, config.torch_pipelining, config.speed_steps, Path(tmp) / f"torch{r}",
                    timeout_s=timeout_s,
                )  # fmt: skip
                for k, name in enumerate(config.torch_pipelining):
                    runs = [rank["runs"][k] for rank in torch_ranks]
                    steps_by_side[name] += _timed_steps(runs)
                    losses: list[float] = next((x["losses"] for x in runs if x["losses"]), [])
                    first_losses.setdefault(name, losses)
        except PipelineError as exc:  # either side failing leaves no fair comparison
            reason = f"{side} failed or hung: {exc}"
    measured: dict[str, dict[str, Any]] = {
        name: {
            "tokens_per_s": tokens_per_step / median(steps),
            "step_time_ms": 1e3 * median(steps),
            "losses": first_losses.get(name, []),
        }
        for name, steps in steps_by_side.items()
        if steps and reason is None
    }
    out_rows = []
    for name in config.torch_pipelining:
        result = measured.get(name)
        out_rows.append(
            {
                "codec": "torch.pipelining",
                "method": f"torch.pipelining:{name}",
                "fw_bits": fp32.fw_bits,
                "bw_bits": fp32.bw_bits,
                "rho": 0.0,
                "link": "unshaped",
                "link_mbps": None,
                "tokens_per_s": result["tokens_per_s"] if result else None,
                "step_time_ms": result["step_time_ms"] if result else None,
                # torch sends raw fp32 tensors (no header): activation + gradient per link
                "bytes_per_step": None,
                "analytic_bytes_per_step": analytic,
                "first_step_loss": result["losses"][0] if result and result["losses"] else None,
                "final_train_loss": None,
                "final_eval_loss": None,
                "time_to_fp32_loss_s": None,
                "simulated_tokens_per_s": None,
                "skipped": reason,
            }
        )
    ours_cell = next((r for r in rows if r["method"] == "fp32" and r["rho"] == 0.0), None)
    head_to_head = measured.get(f"ours:{train.schedule}")
    theirs = measured.get(train.schedule)
    by_schedule = {
        name: measured[f"ours:{name}"]["tokens_per_s"] / measured[name]["tokens_per_s"]
        for name in config.torch_pipelining
        if name in measured and f"ours:{name}" in measured
    }
    summary = TorchPipeliningSummary(
        torch_pipelining_tokens_per_s={
            k: v["tokens_per_s"] for k, v in measured.items() if not k.startswith("ours:")
        },
        fp32_head_to_head_tokens_per_s_by_schedule={
            k.removeprefix("ours:"): v["tokens_per_s"]
            for k, v in measured.items()
            if k.startswith("ours:")
        },
        speedup_vs_torch_pipelining_by_schedule=by_schedule,
        fp32_unshaped_tokens_per_s=ours_cell["tokens_per_s"] if ours_cell else None,
        fp32_head_to_head_tokens_per_s=head_to_head["tokens_per_s"] if head_to_head else None,
        speedup_vs_torch_pipelining=head_to_head["tokens_per_s"] / theirs["tokens_per_s"]
        if head_to_head and theirs
        else None,
        torch_pipelining_skipped=reason,
    )
    return out_rows, summary


def _simulate_rounds(
    schedule: str,
    num_microbatches: int,
    rounds: list[list[dict[str, Any]]],
    activation_bytes: list[list[int]],
    gradient_bytes: list[list[int]],
    bandwidths_bits_per_s: list[float],
    num_cores: float,
) -> list[float]:
    """Simulated step seconds of each round of one cell, each from that round's own run.

    Args:
        schedule: "gpipe" or "1f1b".
        num_microbatches: m.
        rounds: rounds[i][stage]: a rank's output of this cell in round i (its
            `median_forward_cpu_s`, `median_backward_cpu_s`, `median_optimizer_s`).
        activation_bytes: [s][j] wire bytes, as `simulate_step` takes them.
        gradient_bytes: [s][j] wire bytes.
        bandwidths_bits_per_s: Round i's link speed (from its own calibration; inf =
            unshaped).
        num_cores: Cores the ranks share (fitted on the calibrations).

    Returns:
        One step time (s) per round.

    Raises:
        ValueError: If the rounds and bandwidths differ in number, or `simulate_step` refuses
            the inputs.
    """
    if len(rounds) != len(bandwidths_bits_per_s):
        raise ValueError(
            f"{len(rounds)} rounds but {len(bandwidths_bits_per_s)} bandwidths; give one "
            "bandwidth per round"
        )
    return [
        simulate_step(
            schedule=schedule,
            num_microbatches=num_microbatches,
            forward_s=[o["median_forward_cpu_s"] for o in outs],
            backward_s=[o["median_backward_cpu_s"] for o in outs],
            activation_bytes=activation_bytes,
            gradient_bytes=gradient_bytes,
            bandwidth_bits_per_s=b,
            optimizer_s=[o["median_optimizer_s"] for o in outs],
            num_cores=num_cores,
        ).step_time_s
        for outs, b in zip(rounds, bandwidths_bits_per_s, strict=True)
    ]


def _free_codec_speedup(
    rows: list[dict[str, Any]],
    compute_by_cell: dict[tuple[str, float], tuple[list[float], ...]],
    config: PipelineBenchConfig,
    cores: float,
) -> float | None:
    """AQ-SGD fw2/bw4's simulated speed-up at the slowest link if its codec cost no CPU.

    Both sides are simulated with FP32's measured per-stage compute at that link, one with
    FP32's wire bytes and one with AQ-SGD's (steady state), at the same bandwidth: what the
    schedule and the link alone allow. The measured speed-up falls short of it by the
    codec's CPU share.
    """
    slowest = max(config.rhos)
    fp32 = _row(rows, "fp32", slowest)
    if fp32 is None or fp32["link_mbps"] is None or ("fp32", slowest) not in compute_by_cell:
        return None
    train = config.train
    shape = (train.micro_batch_size, train.gpt.context, train.gpt.hidden)
    fwd, bwd, opt = compute_by_cell[("fp32", slowest)]
    links, m = train.num_stages - 1, train.num_microbatches

    def step_s(method: str) -> float:
        spec = CodecSpec.parse(method)
        return simulate_step(
            schedule=train.schedule,
            num_microbatches=m,
            forward_s=fwd,
            backward_s=bwd,
            activation_bytes=[[message_wire_bytes(spec, 0, shape)] * m] * links,
            gradient_bytes=[[message_wire_bytes(spec, 1, shape)] * m] * links,
            bandwidth_bits_per_s=fp32["link_mbps"] * 1e6,
            optimizer_s=opt,
            num_cores=cores,
        ).step_time_s

    return step_s("fp32") / step_s("aqsgd:fw2,bw4")


def _timed_steps(runs: list[dict[str, Any]]) -> list[float]:
    """Step seconds of one launch (slowest rank per step), its first step left out."""
    per_rank = [run["step_s"] for run in runs]
    steps = [max(s[i] for s in per_rank) for i in range(len(per_rank[0]))]
    return steps[1:] or steps


def _effective_cores(by_stage: list[dict[str, Any]], schedule: str) -> float:
    """Cores the ranks really had, fitted on the unshaped FP32 calibration runs.

    The simulator replays the calibration step (the per-stage forward, backward and
    optimizer seconds, free links; medians over every round's calibration) with c cores for
    c = 1, 1.05, ... up to min(CPU count, stages); the c whose step time is closest to the
    measured wall step time (max over ranks per step, median over every calibration's steps
    after the first) is returned. On a shared machine other jobs hold part of the CPUs, so c
    is often fractional (ranks time-sharing ~1.3 cores of 2); rounding it to an integer made
    every simulated point 20-25% slower than measured. Fitting on the first round's
    calibration alone let one disturbed calibration (another job's burst) slow every
    simulated point by ~28%.
    """
    # rounds[i][stage]: stage's calibration run of round i.
    rounds = [list(col) for col in zip(*(r["calibrations"] for r in by_stage), strict=True)]
    wall = median(
        max(c["step_s"][i] for c in calib)
        for calib in rounds
        for i in range(1, len(calib[0]["step_s"]))
    )
    p = len(by_stage)
    m = int(rounds[0][0]["num_microbatches"])
    no_bytes = [[0] * m] * (p - 1)
    replay = functools.partial(
        simulate_step,
        schedule=schedule,
        num_microbatches=m,
        forward_s=_median_by_rank(rounds, "median_forward_cpu_s"),
        backward_s=_median_by_rank(rounds, "median_backward_cpu_s"),
        activation_bytes=no_bytes,
        gradient_bytes=no_bytes,
        bandwidth_bits_per_s=math.inf,
        optimizer_s=_median_by_rank(rounds, "median_optimizer_s"),
    )
    upper = max(1, min(os.cpu_count() or 1, p))
    grid = [1 + 0.05 * k for k in range(round((upper - 1) / 0.05) + 1)]
    best = min(grid, key=lambda c: abs(replay(num_cores=c).step_time_s - wall))
    return round(best, 2)


def _median_by_rank(rounds: list[list[dict[str, Any]]], key: str) -> list[float]:
    """Per rank (stage), the median over rounds of `key`; rounds[i][stage] is a rank's run."""
    return [median(o[key] for o in col) for col in zip(*rounds, strict=True)]


@dataclass(frozen=True, kw_only=True, slots=True)
class TorchPipeliningSummary(Summary):
    """The torch.distributed.pipelining head-to-head keys of the pipeline bench's summary."""

    torch_pipelining_tokens_per_s: dict[str, float]
    """torch's tokens/s per schedule."""
    fp32_head_to_head_tokens_per_s_by_schedule: dict[str, float]
    """Ours (FP32, launched like torch's) per schedule."""
    speedup_vs_torch_pipelining_by_schedule: dict[str, float]
    fp32_unshaped_tokens_per_s: float | None
    """Ours from the speed cells (unshaped link)."""
    fp32_head_to_head_tokens_per_s: float | None
    speedup_vs_torch_pipelining: float | None
    """Ours over torch's on the bench's own schedule."""
    torch_pipelining_skipped: str | None
    """Why a launch failed or hung; None when all ran."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineSummary(Summary):
    """The `"summary"` of `frugal pipeline bench`'s `results.json` (see the module).

    The keys of a section that did not run (torch.pipelining, DP, LLM) are None. Loss gaps are
    relative to FP32's final eval loss (`loss / fp32 - 1`); speed-ups are tokens/s over FP32's
    at the same link.
    """

    slowest_link: str
    speedup_at_slowest: float | None
    """AQ-SGD fw2/bw4 over FP32 at the slowest link."""
    speedup_by_link: dict[str, float]
    speedup_monotone: bool
    """The speed-up grows strictly as the bandwidth falls."""
    speedup_range_by_link: dict[str, list[float]]
    """[min, max] of the per-round speed-ups per link."""
    speedup_monotone_within_noise: bool
    """No slower link's round range lies wholly below a faster one's."""
    loss_gap_aqsgd_fw2: float | None
    loss_gap_directq_fw2: float | None
    loss_gap_ours_fw2: float | None
    speedup_at_slowest_ours: float | None
    loss_gap_ours_fv8: float | None
    loss_gap_ours_ef: float | None
    fp32_final_eval_loss: float
    max_sim_gap: float
    """max |measured / simulated tokens/s - 1| over the rho points."""
    median_sim_gap: float
    bytes_match_analytic: bool
    """Every run's bytes on the wire equal the codecs' analytic sizes."""
    sim_speedup_free_codec_at_slowest: float | None
    sim_num_cores: float
    calibration_ms: list[float]
    """c per round, ms."""
    quality_start: str
    """"fine-tune" (from FP32 pre-trained weights) or "scratch"."""
    pretraining: dict[str, Any] | None
    """The FP32 pre-training's record; None when training from scratch."""
    torch_pipelining_tokens_per_s: dict[str, float] | None = None
    fp32_head_to_head_tokens_per_s_by_schedule: dict[str, float] | None = None
    speedup_vs_torch_pipelining_by_schedule: dict[str, float] | None = None
    fp32_unshaped_tokens_per_s: float | None = None
    fp32_head_to_head_tokens_per_s: float | None = None
    speedup_vs_torch_pipelining: float | None = None
    torch_pipelining_skipped: str | None = None
    dp_setup: str | None = None
    dp_speedup_at_slowest: float | None = None
    dp_speedup_aqsgd_only_at_slowest: float | None = None
    dp_bytes_match_analytic: bool | None = None
    llm_model: str | None = None
    llm_slowest_link: str | None = None
    llm_speedup_at_slowest: float | None = None
    llm_speedup_range: list[float] | None = None
    llm_tokens_per_s: dict[str, float] | None = None
    llm_calibration_ms: list[float] | None = None
    llm_bytes_match_analytic: bool | None = None
    llm_layers: list[int] | None = None
    llm_skipped: str | None = None
    """Why the LLM section did not run (e.g. no model wheel); None otherwise."""
    e2e_setup: str | None = None
    e2e_speedup_at_slowest: float | None = None
    """AQ-SGD's whole fine-tune (warm-up included) vs FP32's, wall time at the slowest link."""
    e2e_steady_speedup: float | None = None
    e2e_amdahl_ceiling: float | None = None
    e2e_eval_loss_gap: float | None = None
    e2e_fp32_s: float | None = None
    e2e_compressed_s: float | None = None


PIPELINE_BENCH: Bench[PipelineBenchConfig, PipelineSummary] = BenchSpec(
    name="pipeline",
    summary_type=PipelineSummary,
    preset=PipelineBenchConfig.preset,
    run=run_pipeline_bench,
)
"""The pipeline bench, as `frugal reproduce` runs it."""


def _row(rows: list[dict[str, Any]], method: str, rho: float) -> dict[str, Any] | None:
    return next((r for r in rows if r["method"] == method and r["rho"] == rho), None)


def _summary(rows: list[dict[str, Any]], config: PipelineBenchConfig) -> dict[str, Any]:
    slowest = max(config.rhos)
    fp32 = _row(rows, "fp32", slowest)
    assert fp32 is not None
    out: dict[str, Any] = {"slowest_link": rho_label(slowest)}
    speedups = {}
    for rho in sorted(config.rhos):
        a, f = _row(rows, "aqsgd:fw2,bw4", rho), _row(rows, "fp32", rho)
        if a is not None and f is not None:
            speedups[rho_label(rho)] = a["tokens_per_s"] / f["tokens_per_s"]
    aq = _row(rows, "aqsgd:fw2,bw4", slowest)
    dq = _row(rows, "directq:fw2,bw4", slowest)
    base = fp32["final_eval_loss"]
    out["speedup_at_slowest"] = speedups.get(rho_label(slowest))
    out["speedup_by_link"] = speedups
    out["speedup_monotone"] = list(speedups.values()) == sorted(speedups.values())
    # Per-round speed-ups (AQ-SGD and FP32 of the same round, run minutes apart): the spread
    # a single cell's ratio shows from round to round.
    ranges: dict[str, list[float]] = {}
    for rho in sorted(config.rhos):
        a, f = _row(rows, "aqsgd:fw2,bw4", rho), _row(rows, "fp32", rho)
        if a is not None and f is not None:
            ratios = [
                x / y
                for x, y in zip(a["tokens_per_s_by_round"], f["tokens_per_s_by_round"], strict=True)
            ]
            ranges[rho_label(rho)] = [min(ratios), max(ratios)]
    out["speedup_range_by_link"] = ranges
    bounds = list(ranges.values())
    # Monotone within noise: no slower link's round range lies wholly below a faster one's.
    out["speedup_monotone_within_noise"] = all(
        slow[1] >= fast[0] for fast, slow in itertools.pairwise(bounds)
    )
    out["loss_gap_aqsgd_fw2"] = aq["final_eval_loss"] / base - 1 if aq else None
    out["loss_gap_directq_fw2"] = dq["final_eval_loss"] / base - 1 if dq else None
    ours = _row(rows, "aqsgd:fw2,bw4:row", slowest)
    out["loss_gap_ours_fw2"] = ours["final_eval_loss"] / base - 1 if ours else None
    out["speedup_at_slowest_ours"] = ours["tokens_per_s"] / fp32["tokens_per_s"] if ours else None
    fv8 = _row(rows, "aqsgd:fw2,bw4:row:fv8", slowest)
    out["loss_gap_ours_fv8"] = fv8["final_eval_loss"] / base - 1 if fv8 else None
    ef = _row(rows, "aqsgd:fw2,bw4:row:ef", slowest)
    out["loss_gap_ours_ef"] = ef["final_eval_loss"] / base - 1 if ef else None
    out["fp32_final_eval_loss"] = base
    gaps = [
        abs(r["tokens_per_s"] / r["simulated_tokens_per_s"] - 1)
        for r in rows
        if r["rho"] in config.rhos  # the rho points (not the unshaped FP32 row)
    ]
    out["max_sim_gap"] = max(gaps)
    out["median_sim_gap"] = median(gaps)
    out["bytes_match_analytic"] = all(
        r["bytes_per_step"] == r["analytic_bytes_per_step"] for r in rows
    )
    return out


def _plot(quality: dict[str, LocalResult], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for method, result in quality.items():
        ax.plot(_ema(result.losses), label=f"{method} (eval {result.eval_loss:.3f})")
    ax.set_xlabel("step")
    ax.set_ylabel("train loss, EMA 0.9 (nats/byte)")
    ax.set_title(f"tiny GPT, 4 stages: quality per codec ({title})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
