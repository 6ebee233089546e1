"""One pipeline training job: check a `PipelineTrainConfig`, launch its ranks, summarise them.

What `frugal pipeline train` runs. `check_training` refuses a job that cannot run (a plan that
does not fit, a batch larger than the data, a link too slow for the timeout, weights that do not
fit the model) before any process starts; `run_training` launches the ranks with torchrun on
127.0.0.1 and writes `train.json` and `loss_curve.png`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from frugal.comm.gradcomp import DP_METHODS
from frugal.config import ConfigError
from frugal.disk import guard_write
from frugal.launch.guards import MemoryEstimate
from frugal.pipeline.checkpoint import (
    fingerprint,
    latest_checkpoint,
    relayout_sources,
    saved_layout,
)
from frugal.pipeline.device import resolve_device
from frugal.pipeline.runtime import PipelineError
from frugal.pipeline.train import Layout, PipelineTrainConfig, RunSpec, launch_torchrun, make_layout
from frugal.results import write_text_atomically

if TYPE_CHECKING:
    from frugal.parallel.plan import Plan

__all__ = [
    "RANK_BASELINE_BYTES",
    "TrainingJob",
    "TrainingSummary",
    "check_nodes",
    "check_training",
    "load_plan",
    "memory_estimate",
    "run_training",
]

StepProgress = Callable[[int, float], None]


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainingJob:
    """A checked training job: its config and the rank layout it runs with."""

    config: PipelineTrainConfig
    """The settings of the job."""
    layout: Layout
    """Stages, replicas and their ranks: from the plan file, or linear."""
    world_size: int
    """Processes launched: the plan's world size, or one per stage."""
    memory: MemoryEstimate
    """What the job's processes together need (`memory_estimate`), checked at launch."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainingSummary:
    """The outcome of a training job, as `frugal pipeline train` prints it."""

    codec: str
    """The activation codec the ranks ran (`CodecSpec.label`)."""
    schedule: str
    """The pipeline schedule the ranks ran."""
    num_microbatches_per_replica: tuple[int, ...]
    """Micro-batches per step each replica ran (the plan's, or `num_microbatches`)."""
    dp_collective_per_stage: tuple[str, ...]
    """Per stage, the gradient collective its replicas ran; () without data parallelism."""
    device: str
    """Where global rank 0 ran ("cpu", "cuda:0"), resolved from `device`."""
    dtype: str
    """The compute and activation dtype the ranks ran."""
    world_size: int
    """Processes launched."""
    steps: int
    """Optimizer steps run."""
    final_train_loss: float
    """Training loss of the last step, nats per token (per byte for the tiny GPT)."""
    initial_eval_loss: float | None
    """Evaluation loss before the first step, as `eval_loss` (None if not measured)."""
    eval_loss: float
    """Evaluation loss after the last step, nats per token (per byte for the tiny GPT)."""
    bandwidth_bits_per_s: float
    """Emulated link bandwidth the run used, bits per second (0 = unshaped)."""
    median_step_s: float
    """Median wall time of one step, seconds."""
    bytes_sent_per_rank: tuple[int, ...]
    """Activation plus gradient bytes each rank sent over the whole run."""
    dp_compression: str
    """How data-parallel replicas agreed on gradients."""
    dp_bytes_last_step_per_rank: tuple[int, ...]
    """Data-parallel gradient bytes each rank sent in the last step."""
    resumed_from_step: int = 0
    """The checkpoint's step the job resumed from (0: it started fresh)."""
    resumed_on_another_plan: bool = False
    """Whether that checkpoint was written under another plan (state mapped by stage)."""


def load_plan(path: str | Path) -> Plan:
    """Read a planner `Plan` from its JSON file, with the fix in each error.

    Args:
        path: The plan file, as given to `--plan`.

    Returns:
        The plan.

    Raises:
        ConfigError: If the path is a folder, missing, or not a plan.
    """
    from frugal.parallel.plan import Plan

    if Path(path).is_dir():
        raise ConfigError(f"--plan {path} is a folder; give the plan's JSON file")
    if not Path(path).is_file():
        raise ConfigError(f"--plan {path}: no such file; write one with `frugal plan --out FILE`")
    try:
        return Plan.from_json(Path(path).read_text())
    except ValueError as exc:  # Plan.from_json's "not a plan: ..." names what is wrong
        raise ConfigError(f"--plan {path}: {exc}") from exc


def check_nodes(job: TrainingJob, nnodes: int) -> int:
    """Processes per machine of `job` over `nnodes` machines, checked against its device.

    Raises:
        ConfigError: If nnodes < 1 or does not divide the world size, or `device` is "cuda"
            and this machine has no GPU or fewer GPUs than its processes.
    """
    if nnodes < 1 or job.world_size % nnodes:
        raise ConfigError(
            f"--nnodes {nnodes} does not divide the job's {job.world_size} processes; give a "
            f"divisor of {job.world_size} (each machine runs world_size / nnodes of them)"
        )
    nproc = job.world_size // nnodes
    resolve_device(job.config.device, nproc)  # refused here, before any process starts
    return nproc


def check_training(config: PipelineTrainConfig, *, num_stages: int | None = None) -> TrainingJob:
    """Check that `config` can run, before any process starts; return the checked job.

    Args:
        config: The job's settings.
        num_stages: The number of stages the caller asked for explicitly (`--stages`), or
            None; a plan with another number of stages is refused.

    Returns:
        The job with its layout and world size.

    Raises:
        ConfigError: If the plan does not fit the model or `num_stages`, the corpus has
            fewer windows than `num_train` or `num_eval`, one step needs more windows than
            `num_train`, data-parallel compression has no replicas, the link is
            too slow for `comm_timeout_s`, `init_weights` does not fit the model, or
            `device` is "cuda" on a machine without a GPU.
        PlanMismatchError: If the plan was priced for another codec, schedule or micro-batch
            size, or `dp_compression` cannot run a stage's planned collective (a
            ConfigError).
    """
    resolve_device(config.device)  # no GPU at all: refused before anything is loaded
    world_size = config.num_stages
    if config.plan:
        plan = load_plan(config.plan)
        if num_stages is not None and num_stages != plan.num_stages:
            raise ConfigError(
                f"--stages {num_stages} but the plan has {plan.num_stages} stages; drop "
                "--stages (the plan decides) or plan again"
            )
        world_size = plan.world_size
    layout = make_layout(config, world_size)  # a plan that does not fit fails here
    from frugal.pipeline.zoo import load_model_windows

    try:  # a corpus too small for num_train / num_eval fails here, not in every rank
        load_model_windows(config)
    except ValueError as exc:
        raise ConfigError(f"dataset {config.dataset!r}: {exc}") from exc
    per_step = sum(layout.num_microbatches) * config.micro_batch_size
    if per_step > config.num_train:
        raise ConfigError(
            f"one step needs {per_step} training windows ({sum(layout.num_microbatches)} "
            f"micro-batches of {config.micro_batch_size}) but num_train={config.num_train}; "
            f"raise it (--set num_train={per_step}) or plan a smaller global batch"
        )
    if DP_METHODS.get(config.dp_compression).requires_replicas and layout.num_replicas == 1:
        raise ConfigError(
            f"--dp-compress {config.dp_compression} needs data-parallel replicas: give a --plan "
            "with num_replicas >= 2 ("
            + ("this plan has" if config.plan else "the linear layout has")
            + " one pipeline)"
        )
    _check_link(config, layout)
    if config.init_weights:  # a file that cannot start the model fails here, not in every rank
        from frugal.pipeline.zoo import build_model

        build_model(config)
    memory = memory_estimate(config, layout, world_size)
    return TrainingJob(config=config, layout=layout, world_size=world_size, memory=memory)


RANK_BASELINE_BYTES = 410 << 20
"""A rank's memory besides the model and buffers: Python, torch, gloo, the corpus windows.
Measured: the peak RSS of `frugal pipeline train --steps 8` (tiny GPT, 4 stages, fp32) is
1.61 GiB over 4 ranks, of which 6 MiB a rank is the model's."""

_TRAINED_BYTES_PER_PARAM = 12
"""A trained parameter's gradient and AdamW's two moments, float32."""


def memory_estimate(config: PipelineTrainConfig, layout: Layout, world_size: int) -> MemoryEstimate:
    """What a job's `world_size` processes together hold in RAM, by part.

    - every process: `RANK_BASELINE_BYTES` (Python, torch, gloo, the corpus) plus the whole model's
      float32 weights, since each rank builds the whole model before keeping its stage;
    - every replica: a gradient and two AdamW moments per parameter (12 B; its stages
      together hold one model);
    - AQ-SGD with the `memory` buffer backend: each link's sender and receiver keep a float32
      boundary activation (T x H) per training window; the other backends keep at most
      `buffer_budget_mib` per side in RAM.

    Activations in flight and allocator slack are left out (small next to these at the sizes
    frugal runs on CPU), and frozen parameters are counted as trained: an estimate of the
    steady state, not a bound.

    Args:
        config: The job's settings.
        layout: Its stages and replicas (`make_layout`).
        world_size: Processes launched.

    Returns:
        The estimate, term by term.
    """
    from frugal.parallel.codec import CodecSpec
    from frugal.pipeline.zoo import boundary_shape, model_num_params

    params = model_num_params(config)
    links = (layout.num_stages - 1) * layout.num_replicas
    _, context, hidden = boundary_shape(config)
    terms = [
        (f"{world_size} ranks x {RANK_BASELINE_BYTES >> 20} MiB", world_size * RANK_BASELINE_BYTES),
        (f"{world_size} whole-model copies of {params:,} float32 weights", world_size * 4 * params),
        (
            f"gradients and AdamW moments of {layout.num_replicas} replica(s)",
            layout.num_replicas * _TRAINED_BYTES_PER_PARAM * params,
        ),
    ]
    if CodecSpec.parse(config.codec).method == "aqsgd" and links:
        if config.buffer_backend == "memory":
            per_side = config.num_train * context * hidden * 4
            what = f"AQ-SGD buffers: {links} links x 2 sides x {config.num_train} windows"
        else:
            per_side = config.buffer_budget_mib << 20
            what = f"AQ-SGD buffers: {links} links x 2 sides x buffer_budget_mib"
        terms.append((what, 2 * links * per_side))
    fix = ""
    if any(what.startswith("AQ-SGD") for what, _ in terms) and config.buffer_backend == "memory":
        fix = "keep the AQ-SGD buffers on disk (--set buffer_backend=store)"
    return MemoryEstimate(tuple(terms), fix=fix)


def _check_link(config: PipelineTrainConfig, layout: Layout) -> None:
    """Refuse a link on which one step's first messages cannot arrive within the timeout."""
    if not (config.bandwidth_mbps > 0 or config.latency_ms > 0):
        return
    from frugal.parallel.codec import CodecSpec, message_wire_bytes
    from frugal.pipeline.zoo import boundary_shape

    shape = boundary_shape(config)
    first = message_wire_bytes(CodecSpec.parse(config.codec), 0, shape, num_new=shape[0])
    num_messages = max(layout.num_microbatches)
    transfer_s = 8.0 * first / (config.bandwidth_mbps * 1e6) if config.bandwidth_mbps else 0
    queued_s = num_messages * (transfer_s + config.latency_ms / 1e3)
    if queued_s <= config.comm_timeout_s:
        return
    need = f"{queued_s:,.0f}" if queued_s < 1e9 else f"{queued_s:.3g}"
    link = (
        f"at {f'{config.bandwidth_mbps:g} Mbit/s' if transfer_s else 'full speed'} "
        f"and {config.latency_ms:g} ms latency a "
        f"step's {num_messages} first-visit activation messages of {first:,} bytes "
        f"need {need} s on one link, over comm_timeout_s={config.comm_timeout_s:g}"
    )
    if queued_s <= 86_400:
        fix = (
            "raise the bandwidth, lower latency_ms, or --set "
            f"comm_timeout_s={math.ceil(2 * queued_s)}"
        )
    else:  # no sensible timeout covers it: the link itself is the mistake
        spare_s = config.comm_timeout_s / num_messages - config.latency_ms / 1e3
        fix = (
            f"lower latency_ms below {1e3 * config.comm_timeout_s / num_messages:,.0f}"
            if spare_s <= 0
            else f"use at least {8.0 * first / (spare_s * 1e6):,.3g} Mbit/s"
        )
    raise ConfigError(f"{link}; {fix}")


def run_training(
    job: TrainingJob,
    out_dir: Path,
    *,
    on_step: StepProgress | None = None,
    force: bool = False,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
) -> TrainingSummary | None:
    """Train `job` with one torchrun process per rank; write `train.json` and `loss_curve.png`.

    Args:
        job: A job from `check_training`.
        out_dir: An existing folder; an earlier run's `train.json` and curve are removed first,
            so a failed run leaves no stale results.
        on_step: Called with (step, train loss) after each step, or None.
        force: Start even where a resource guard (process count, `job.memory`) refuses.
        nnodes: Machines in the job; each runs this same call with `job.world_size / nnodes`
            processes and the same `rdzv_endpoint`.
        rdzv_endpoint: `host:port` of the rendezvous every machine reaches (needed when
            nnodes > 1).

    Returns:
        The run's summary; `out_dir / "train.json"` holds it with the loss of every step.
        None on a machine other than global rank 0's (which writes the results).

    Raises:
        ConfigError: If the world size does not split evenly over `nnodes` machines.
        PipelineError: If a rank fails or the launch exceeds its timeout.
        CheckpointMismatchError: If the checkpoint folder holds another job's checkpoint.
    """
    nproc = check_nodes(job, nnodes)
    config = job.config
    for stale in ("train.json", "loss_curve.png"):
        (out_dir / stale).unlink(missing_ok=True)
    run = RunSpec(
        label=config.codec,
        codec=config.codec,
        steps=config.steps,
        rho=config.rho,
        bandwidth_mbps=config.bandwidth_mbps,
        latency_ms=config.latency_ms,
        dp_compression=config.dp_compression,
        dp_bits=config.dp_bits,
        checkpoint=True,
    )

    if config.checkpoint_every > 0:  # another job's checkpoints are refused before launching
        root = Path(config.checkpoint_dir) if config.checkpoint_dir else out_dir / "checkpoints"
        found = latest_checkpoint(
            root, fingerprint(config, run.label, str(job.layout)), relayout=True
        )
        saved = saved_layout(found[1]) if found is not None else None
        if saved is not None:  # another plan: the stages and batch must match (refused here)
            relayout_sources(
                saved,
                layers=job.layout.layers,
                num_microbatches=job.layout.num_microbatches,
                replica=0,
                stage=0,
            )

    def on_progress(event: dict[str, Any]) -> None:
        if on_step is not None and event["run"] == run.label:
            on_step(int(event["step"]), float(event["loss"]))

    ranks = launch_torchrun(
        config,
        [run],
        out_dir,
        nproc=nproc,
        timeout_s=max(600.0, 30.0 * config.steps),
        on_progress=on_progress,
        memory_estimate=job.memory.per_machine(nnodes),
        force=force,
        nnodes=nnodes,
        rdzv_endpoint=rdzv_endpoint,
    )
    if not ranks:
        return None  # global rank 0 is on another machine: it writes the results
    last = next(r for r in ranks if r["runs"][0]["eval_loss"] is not None)["runs"][0]
    ran = [r["runs"][0] for r in sorted(ranks, key=lambda r: (r["replica"], r["stage"]))]
    layout = job.layout
    summary = TrainingSummary(
        codec=_agreed(ran, "ran_codec"),
        schedule=_agreed(ran, "schedule"),
        num_microbatches_per_replica=tuple(
            ran[j * layout.num_stages]["num_microbatches"] for j in range(layout.num_replicas)
        ),
        dp_collective_per_stage=tuple(ran[i]["dp_collective"] for i in range(layout.num_stages))
        if layout.num_replicas > 1
        else (),
        device=next(r for r in ranks if r["rank"] == 0)["runs"][0]["device"],
        dtype=_agreed(ran, "dtype"),
        world_size=job.world_size,
        steps=config.steps,
        final_train_loss=last["losses"][-1],
        initial_eval_loss=last.get("initial_eval_loss"),
        eval_loss=last["eval_loss"],
        bandwidth_bits_per_s=last["bandwidth_bits_per_s"],
        median_step_s=sorted(last["step_s"])[len(last["step_s"]) // 2],
        bytes_sent_per_rank=tuple(
            sum(map(sum, r["runs"][0]["activation_bytes"]))
            + sum(map(sum, r["runs"][0]["gradient_bytes"]))
            for r in ranks
        ),
        dp_compression=config.dp_compression,
        dp_bytes_last_step_per_rank=tuple((r["runs"][0]["dp_bytes"] or [0])[-1] for r in ranks),
        resumed_from_step=int(last.get("resumed_from_step", 0)),
        resumed_on_another_plan=bool(last.get("resumed_on_another_plan", False)),
    )
    curve = out_dir / "loss_curve.png"
    with guard_write(curve, what="writing loss_curve.png", partial=[curve]):
        _plot_losses(last["losses"], config.codec, curve)
    # train.json last: it marks a finished run (a rerun refuses it without --overwrite), so a
    # disk that fills at the curve leaves nothing that blocks the rerun.
    document = {"summary": asdict(summary), "losses": last["losses"]}
    write_text_atomically(out_dir / "train.json", json.dumps(document))
    return summary


def _agreed(runs: list[dict[str, Any]], key: str) -> Any:
    """The value every rank reports for `key` (they agree: the job checked it at start)."""
    values = {run[key] for run in runs}
    if len(values) != 1:
        raise PipelineError(f"the ranks ran different {key}: {sorted(values)}")
    return values.pop()


def _plot_losses(losses: list[float], label: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(losses) + 1), losses, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("train loss (nats/byte)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
