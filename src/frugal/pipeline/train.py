"""Pipeline training: the config, the layout of ranks, one-process and torchrun runs.

`train_local` runs every stage in this process over `LocalTransport` (exact same runtime,
codecs and schedule; used for quality sweeps and tests). `run_worker` is what each torchrun
process executes (`python -m frugal.pipeline.worker`): it checks that every rank has the same
configuration, builds its stage, and runs a list of `RunSpec`s (codec, link) one after the
other, writing its measurements to `rank{r}.json`. `launch_torchrun` starts the workers.

References:
    Fine-tuning Language Models over Slow Networks using Activation Compression with
    Guarantees, NeurIPS 2022, arXiv 2206.01299.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F

import frugal
from frugal.comm.collectives import COLLECTIVES, bottleneck_link
from frugal.comm.gradcomp import DP_METHODS
from frugal.comm.link import RHO_POINTS, LinkSpec, NicRoute, bandwidth_from_rho
from frugal.config import ConfigError, check_types, config_from_dict, config_to_dict
from frugal.launch import MemoryEstimate, TorchrunJob, check_job, run_torchrun
from frugal.launch.group import init_group
from frugal.parallel.codec import CodecSpec
from frugal.parallel.schedule import SCHEDULES, build_schedule
from frugal.pipeline.buffers import BUFFER_BACKENDS, BufferSet
from frugal.pipeline.checkpoint import (
    commit_checkpoint,
    fingerprint,
    latest_checkpoint,
    load_stage,
    relayout_sources,
    remove_incomplete,
    save_stage,
    saved_layout,
)
from frugal.pipeline.device import (
    DTYPES,
    Precision,
    process_group_backend,
    rank_device,
    resolve_device,
)
from frugal.pipeline.models import TextWindows, TinyGPTConfig, split_layers
from frugal.pipeline.runtime import (
    ConfigMismatchError,
    DistTransport,
    LocalTransport,
    Microbatch,
    PipelineError,
    StageRunner,
    run_local_step,
)
from frugal.pipeline.zoo import (
    MODELS,
    HFModelConfig,
    SmolLMConfig,
    boundary_shape,
    build_model,
    build_model_stages,
    default_layers,
    load_model_windows,
    mean_token_loss,
    model_num_layers,
)
from frugal.results import write_text_atomically

__all__ = [
    "Layout",
    "PipelineTrainConfig",
    "RunSpec",
    "evaluate",
    "launch_torchrun",
    "make_layout",
    "pretrain_local",
    "run_worker",
    "train_local",
]

PROGRESS_PREFIX = "FRUGAL_PROGRESS "


_SHUTDOWN_TIMEOUT_S = 5
"""Seconds torchrun gives the other ranks of a failed job after SIGTERM before SIGKILL."""

MAX_RHO = 100.0
"""Largest transfer/compute ratio a config accepts (30x the paper's slowest link)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineTrainConfig:
    """A pipeline training job (`frugal pipeline train`)."""

    model: str = "tiny-gpt"
    """A name in `frugal.pipeline.zoo.MODELS` (tiny-gpt: byte-level GPT; smollm2-135m:
    SmolLM2 from its bundled GGUF; hf: your Hugging Face folder, `hf.path`; or one added by
    `register_model`)."""
    gpt: TinyGPTConfig = field(default_factory=TinyGPTConfig)
    """Shape of the tiny GPT."""
    smollm: SmolLMConfig = field(default_factory=SmolLMConfig)
    """SmolLM2-135M settings (context, embeddings, partition)."""
    hf: HFModelConfig = field(default_factory=HFModelConfig)
    """Settings of `model = "hf"`: your Hugging Face model folder (path), context,
    embeddings, partition."""
    dataset: str = "pydoc_topics"
    """Text corpus: a bundled one from frugal.data, or the path of your own .txt (paragraphs)
    or .jsonl (one {"text": ...} per line) file."""
    num_train: int = 512
    """Train windows (examples), >= micro_batch_size x num_microbatches."""
    num_eval: int = 64
    """Held-out windows for the eval loss."""
    num_stages: int = 4
    """Pipeline stages S (default layout: rank = stage); a plan overrides it."""
    codec: str = "fp32"
    """fp32, fp16, bf16, directq:fwK,bwJ or aqsgd:fwK,bwJ."""
    schedule: str = "1f1b"
    """Pipeline schedule: "gpipe", "1f1b" or one added by
    `frugal.parallel.register_schedule`."""
    micro_batch_size: int = 8
    """Examples per micro-batch, >= 1."""
    num_microbatches: int = 4
    """Micro-batches per step (per replica; a plan sets its own), >= 1."""
    steps: int = 64
    """Optimizer steps, >= 1 (512 windows / 32 per step = 16 steps per epoch)."""
    learning_rate: float = 3e-3
    """AdamW learning rate, > 0."""
    seed: int = 0
    """Seed of the weights and the sample order."""
    bandwidth_mbps: float = 0.0
    """Emulated bandwidth of every pipeline link in Mbit/s; 0 = unshaped (or set by rho)."""
    rho: float = 0.0
    """Transfer/compute ratio to emulate (B = 16 S / (rho c) from a measured c); 0 = off."""
    latency_ms: float = 0.0
    """Emulated one-way latency of every link, ms."""
    calibrate_steps: int = 3
    """Unshaped fp32 steps that measure c when rho > 0."""
    plan: str = ""
    """Path of a planner Plan JSON to execute ("" = linear layout, one replica)."""
    warmup_steps: int = 0
    """Steps sent as fp32 first (the reference's warm-up; 0 = none)."""
    drift_check_every: int = 0
    """Steps between AQ-SGD sender/receiver buffer checksum checks (0 = never)."""
    use_recompute: bool = False
    """Recompute each block's activations in the backward pass."""
    comm_timeout_s: float = 120.0
    """Limit of every wait, collective and rendezvous, seconds."""
    prepost_receives: bool = True
    """Post each receive one action ahead, so the transfer overlaps the compute before it
    (False: post it when the action starts, as torch.distributed.pipelining does)."""
    dp_compression: str = "none"
    """How the replicas of a stage (a plan with DP) agree on gradients: a name in
    `frugal.comm.gradcomp.DP_METHODS`; see RunSpec."""
    dp_bits: int = 8
    """Bits of the ef-kbit / qadam gradient exchange, 1..8."""
    buffer_backend: str = "memory"
    """Where AQ-SGD's per-example buffers live: RAM ("memory"), a memory-mapped file
    ("memmap"), frugal.store ("store"), or a backend added by
    `frugal.pipeline.buffers.register_buffer_backend`."""
    buffer_dir: str = ""
    """Where memmap / store buffers go: a fresh folder inside it, removed at the end ("" =
    the system's temporary folder)."""
    buffer_budget_mib: int = 64
    """RAM budget of each store-backed buffer (one per link side), MiB, >= 1."""
    init_weights: str = ""
    """A `torch.save`d state_dict of the whole model to start from (fine-tuning), e.g. what
    `frugal.bench.pipeline.pretrain` writes; "" = the seeded initialisation (or SmolLM2's
    GGUF weights)."""
    checkpoint_every: int = 0
    """Steps between checkpoints of every rank's whole state (weights, optimizer, AQ-SGD
    buffers, data cursor; `frugal.pipeline.checkpoint`), plus one at the end; 0 = none. A job
    started with the same settings resumes from the newest complete checkpoint."""
    checkpoint_dir: str = ""
    """Folder of the checkpoints ("" = `checkpoints` in the job's output folder)."""
    max_restarts: int = 0
    """torchrun's --max-restarts: after a rank dies, restart every rank this many times, each
    resuming from the last checkpoint, >= 0."""
    device: Literal["auto", "cpu", "cuda"] = "cpu"
    """Where the stages run: "cpu" (gloo), "cuda" (rank r on GPU `cuda:{local_rank}`, NCCL;
    every process of a machine needs a GPU of its own) or "auto" (cuda when that holds, else
    cpu). The default stays cpu: frugal's benchmarks emulate slow links on CPU ranks."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Compute and activation dtype: the matmuls run under torch.autocast in it and the
    activations and gradients between stages (what the codecs see) have it; weights, optimizer
    state and loss stay float32 (float16 adds a static loss scale, see
    `frugal.pipeline.device`)."""

    def __post_init__(self) -> None:
        check_types(self)
        MODELS.check(self.model)
        CodecSpec.parse(self.codec)
        counts = {
            "micro_batch_size": self.micro_batch_size,
            "num_microbatches": self.num_microbatches,
            "steps": self.steps,
            "num_eval": self.num_eval,
        }
        for name, value in counts.items():
            if value < 1:
                raise ValueError(f"{name}={value} must be >= 1")
        from frugal.data.records import DATASETS, get_dataset_info
        from frugal.data.text_files import TEXT_FILE_SUFFIXES, is_text_file

        texts = ", ".join(d.name for d in DATASETS if d.kind == "text")
        if is_text_file(self.dataset):
            if not Path(self.dataset).is_file():
                raise ValueError(
                    f"dataset={self.dataset!r}: no such file; give the path of your "
                    f"{' or '.join(TEXT_FILE_SUFFIXES)} corpus, or one of: {texts}"
                )
        elif self.dataset not in {d.name for d in DATASETS}:
            raise ValueError(
                f"unknown dataset {self.dataset!r}; the pipeline trains on one of: {texts}, or "
                f"your own {' or '.join(TEXT_FILE_SUFFIXES)} file"
            )
        elif get_dataset_info(self.dataset).kind != "text":
            raise ValueError(
                f"dataset={self.dataset!r} is not a text corpus; the pipeline trains a language "
                f"model on one of: {texts}"
            )
        if self.num_train < self.micro_batch_size * self.num_microbatches:
            raise ValueError(
                f"num_train={self.num_train} is below one step's "
                f"{self.micro_batch_size * self.num_microbatches} examples; raise num_train"
            )
        if not self.plan:
            split_layers(model_num_layers(self), self.num_stages)
        SCHEDULES.check(self.schedule)
        if self.bandwidth_mbps < 0 or self.rho < 0 or self.latency_ms < 0:
            raise ValueError(
                f"bandwidth_mbps={self.bandwidth_mbps}, rho={self.rho}, "
                f"latency_ms={self.latency_ms} must be >= 0"
            )
        if self.bandwidth_mbps > 0 and self.rho > 0:
            raise ValueError("set bandwidth_mbps or rho, not both")
        if self.rho > MAX_RHO:
            raise ValueError(
                f"rho={self.rho:g} is above {MAX_RHO:g}: each link would take over {MAX_RHO:g}x "
                "a stage's compute per message (the paper's slowest link is rho 3.3); choose "
                "a rho in (0, 100]"
            )
        if self.comm_timeout_s < 1.0:
            raise ValueError(
                f"comm_timeout_s={self.comm_timeout_s:g} must be >= 1 s: every wait for a "
                "peer would time out; the default is 120"
            )
        if self.learning_rate <= 0 or self.comm_timeout_s <= 0:
            raise ValueError(
                f"learning_rate={self.learning_rate} and comm_timeout_s={self.comm_timeout_s} "
                "must be > 0"
            )
        BUFFER_BACKENDS.check(self.buffer_backend)
        if self.buffer_budget_mib < 1:
            raise ValueError(f"buffer_budget_mib={self.buffer_budget_mib} must be >= 1")
        if not 1 <= self.dp_bits <= 8:
            raise ValueError(f"dp_bits={self.dp_bits} must be in [1, 8]")
        if self.warmup_steps < 0 or self.drift_check_every < 0:
            raise ValueError(
                f"warmup_steps={self.warmup_steps} and drift_check_every="
                f"{self.drift_check_every} must be >= 0 (0 = off)"
            )
        if (
            self.buffer_dir
            and Path(self.buffer_dir).exists()
            and not Path(self.buffer_dir).is_dir()
        ):
            raise ValueError(
                f"buffer_dir={self.buffer_dir!r} is a file; give a folder (AQ-SGD buffers go in a "
                "fresh folder inside it) or '' for the temporary folder"
            )
        if self.init_weights and not Path(self.init_weights).is_file():
            raise ValueError(
                f"init_weights={self.init_weights!r}: no such file; give a torch.save'd "
                "state_dict of the model, or '' for the seeded initialisation"
            )
        # Without a plan there are no replicas either: name both fixes at once.
        replicas = "" if self.plan else "a plan with num_replicas >= 2 (--plan) and "
        DP_METHODS.get(self.dp_compression).check_warmup(
            self.dp_compression, self.warmup_steps, also=replicas
        )
        if self.checkpoint_every < 0 or self.max_restarts < 0:
            raise ValueError(
                f"checkpoint_every={self.checkpoint_every} and max_restarts={self.max_restarts} "
                "must be >= 0 (0 = off)"
            )
        if self.checkpoint_every > 0 and not DP_METHODS.get(self.dp_compression).checkpointable:
            able = [m for m in DP_METHODS if DP_METHODS.get(m).checkpointable]
            raise ValueError(
                f"dp_compression={self.dp_compression!r} keeps state frugal cannot checkpoint; "
                f"choose one of {', '.join(able)}, or checkpoint_every=0"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class RunSpec:
    """One run inside a torchrun launch: codec and link (the bench runs many)."""

    label: str
    """Row name, e.g. "aqsgd:fw2,bw4@100mbps"."""
    codec: str
    """Codec of every pipeline link."""
    steps: int
    """Optimizer steps."""
    rho: float = 0.0
    """Transfer/compute ratio (0 = use bandwidth_mbps)."""
    bandwidth_mbps: float = 0.0
    """Bandwidth of every link (0 with rho 0 = unshaped)."""
    latency_ms: float = 0.0
    """One-way latency."""
    dp_compression: str = "none"
    """How replicas of a stage agree, a name in `frugal.comm.gradcomp.DP_METHODS`: fp32 sum
    by the planned collective ("none"), torch's fp16 / PowerSGD hooks, k-bit gradients with
    error feedback, AQ-SGD's qadam, or one added by `register_dp_method`."""
    dp_bits: int = 8
    """Bits of ef-kbit / qadam."""
    shape_dp: bool = False
    """Shape each stage's DP ring at the run's link bandwidth too (without `links`)."""
    repeat_examples: bool = False
    """Every step uses the same macro-batch (a steady-state speed run: AQ-SGD's examples
    are all seen after step 0)."""
    links: tuple[tuple[int, int, float, float], ...] = ()
    """Per directed pair of ranks (src, dst, bandwidth_mbps, latency_ms), overriding
    bandwidth_mbps / latency_ms for that pair (bandwidth 0 = unshaped); a topology's link
    table. When set, the DP all-reduce is shaped too (see `rank_links`)."""
    tcp_window_bytes: float = 0.0
    """TCP window of every link between two hosts, bytes, >= 0 (0 = no limit): such a link
    moves at most 8 window / (2 latency) bit/s (`frugal.comm.link.window_limited_bits_per_s`)."""
    hosts: tuple[tuple[str, float], ...] = ()
    """(host, nic_mbps) of each rank, in rank order: the emulated host it sits on and that
    host's NIC capacity per direction (0 = no cap). Messages between hosts also queue on both
    hosts' NICs, shared by the host's processes (`frugal.comm.link.HostNics`; one machine
    only); empty = every rank its own host, no NIC."""
    calibrate: bool = False
    """Measure c (an unshaped FP32 calibration run) right before this run; this run and the
    next ones use it until the next run that calibrates. Without any such run, a launch
    with a rho > 0 calibrates once, before its first run."""
    evaluate: bool = True
    """Evaluate the whole model before and after the run (`initial_eval_loss`, `eval_loss`:
    the stages' trained weights are gathered on the last stage); False for speed-only runs,
    where both stay None (SmolLM2's blocks are ~430 MB to gather per run)."""
    checkpoint: bool = False
    """Checkpoint every `config.checkpoint_every` steps and resume from the newest complete
    checkpoint (`pipeline train`'s run; the bench's runs do not)."""

    def __post_init__(self) -> None:
        DP_METHODS.check(self.dp_compression)


@dataclass(frozen=True, slots=True)
class Layout:
    """Where this rank sits: pipeline j, stage i, and who its neighbours are."""

    num_stages: int
    num_replicas: int
    layers: tuple[int, ...]
    mesh: tuple[tuple[int, ...], ...]
    num_microbatches: tuple[int, ...]
    dp_collective: tuple[str, ...] = ()
    """Per stage, the collective the plan priced for its DP group (`Plan.dp_collective`);
    () = not recorded (every stage's group all-reduces, a ring)."""

    def stage_collective(self, stage: int) -> str:
        """The collective the plan priced for stage `stage`'s DP group ("" = not recorded)."""
        return self.dp_collective[stage] if self.dp_collective else ""

    def role(self, rank: int) -> str:
        """What `rank` runs: "stage 1", or "stage 1, replica 0" with data parallelism."""
        replica, stage = self.position(rank)
        return f"stage {stage}" + (f", replica {replica}" if self.num_replicas > 1 else "")

    def position(self, rank: int) -> tuple[int, int]:
        """(replica, stage) of `rank`."""
        for j, row in enumerate(self.mesh):
            if rank in row:
                return j, row.index(rank)
        raise ValueError(f"rank {rank} is not in the layout's mesh")


def make_layout(
    config: PipelineTrainConfig, world_size: int, runs: Sequence[RunSpec] = ()
) -> Layout:
    """The rank layout: from the plan file, or linear (rank = stage, one replica).

    A plan that records its codec, schedule and micro-batch size (format 2) runs only with
    those: the job's `codec` and every run's must be the plan's (`Plan.check_runnable`). A
    format-1 plan records none of them and runs with the job's after a warning. Each stage's
    DP group runs the collective the plan priced for it (`Plan.dp_collective`), so the job's
    and every run's `dp_compression` must be able to run it (`DPMethodSpec.check_collective`).

    Raises:
        PlanMismatchError: If the job's codec, schedule or micro-batch size differ from the
            plan's, or a DP compression method cannot run a stage's planned collective.
        ValueError: If the plan's world size, layers or stages do not fit this job.
        OSError: If the plan file cannot be read.
    """
    if not config.plan:
        if world_size != config.num_stages:
            raise ConfigError(
                f"world_size={world_size} but num_stages={config.num_stages}; the linear layout "
                "runs one process per stage: launch --nproc-per-node equal to --stages"
            )
        return Layout(
            config.num_stages,
            1,
            default_layers(config, config.num_stages),
            (tuple(range(config.num_stages)),),
            (config.num_microbatches,),
        )
    from frugal.parallel.plan import Plan

    plan = Plan.from_json(Path(config.plan).read_text())
    if plan.is_recorded:
        plan.check_runnable(
            codecs=(config.codec, *(run.codec for run in runs)),
            schedule=config.schedule,
            microbatch_size=config.micro_batch_size,
        )
    else:
        warnings.warn(
            f"the plan {config.plan} does not record the codec, schedule and micro-batch size "
            "it was priced for (plan format 1 or a hand-made plan); running with the job's. "
            "Plan again with this frugal to have them checked.",
            stacklevel=2,
        )
    if plan.num_replicas > 1:
        for name in dict.fromkeys((config.dp_compression, *(run.dp_compression for run in runs))):
            method = DP_METHODS.get(name)
            for stage, collective in enumerate(plan.dp_collective):
                method.check_collective(name, collective, stage=stage)
    if plan.world_size != world_size:
        raise ConfigError(
            f"the plan {config.plan} is for world_size={plan.world_size} but "
            f"{world_size} processes were launched; launch {plan.world_size} or plan again"
        )
    if sum(plan.num_layers_per_stage) != model_num_layers(config):
        raise ConfigError(
            f"the plan places {sum(plan.num_layers_per_stage)} layers but the model has "
            f"{model_num_layers(config)}; set gpt.num_layers={sum(plan.num_layers_per_stage)} "
            "or plan with workload.num_layers matching the model"
        )
    return Layout(
        plan.num_stages,
        plan.num_replicas,
        plan.num_layers_per_stage,
        plan.mesh,
        plan.num_microbatches_per_replica,
        plan.dp_collective if plan.num_replicas > 1 else (),
    )


def load_windows(config: PipelineTrainConfig) -> TextWindows:
    """The train/eval windows of the configured corpus (bytes, or BPE ids for SmolLM2)."""
    return load_model_windows(config)


def _step_ids(
    data: TextWindows,
    config: PipelineTrainConfig,
    step: int,
    per_step: int,
    repeat: bool,
    replicas: Sequence[int] = (),
) -> torch.Tensor:
    """The windows of one step, replica after replica (`replicas[j]` micro-batches each).

    One pipeline (`replicas` of one entry or empty) reads a fresh seeded permutation of the
    training windows each epoch. With data parallelism every replica keeps its own shard for
    the whole run (a contiguous share of epoch 0's permutation, in proportion to its
    micro-batches) and permutes only that shard each epoch, so an example always meets the
    same pipeline: AQ-SGD's per-example buffers live on that pipeline's ranks, and an
    example that moved to another replica would be sent in full precision again.
    """
    if repeat:
        return data.epoch_order(0, config.seed)[:per_step]
    per_epoch = len(data.train_ids) // per_step
    if per_epoch == 0:
        raise ValueError(
            f"one step needs {per_step} training windows but there are "
            f"{len(data.train_ids)}; raise num_train or use a smaller global batch"
        )
    epoch, k = divmod(step, per_epoch)
    if len(replicas) <= 1:
        return data.epoch_order(epoch, config.seed)[k * per_step : (k + 1) * per_step]
    base = data.epoch_order(0, config.seed)
    parts, start = [], 0
    for j, count in enumerate(replicas):
        take = count * config.micro_batch_size
        shard = base[start : start + take * per_epoch]
        start += take * per_epoch
        gen = torch.Generator().manual_seed((config.seed * 1_000_003 + epoch) * 1_009 + j)
        order = shard[torch.randperm(len(shard), generator=gen)]
        parts.append(order[k * take : (k + 1) * take])
    return torch.cat(parts)


def _microbatches(data: TextWindows, ids: torch.Tensor, size: int) -> list[Microbatch]:
    return [Microbatch(chunk, *data.batch(chunk)) for chunk in torch.split(ids, size)]


def _buffer_set(config: PipelineTrainConfig, data: TextWindows) -> BufferSet:
    """The AQ-SGD buffers of a run (ids are window indices: N = all windows)."""
    return BufferSet(
        config.buffer_backend,
        int(data.windows.shape[0]),
        config.buffer_dir,
        store_budget_bytes=config.buffer_budget_mib << 20,
        timeout_s=config.comm_timeout_s,
    )


def evaluate(model: torch.nn.Module, data: TextWindows, batch_size: int = 32) -> float:
    """Mean next-token cross-entropy (nats) of the unpartitioned model on the eval windows.

    On the model's device, in float32 (the weights; `dtype` is the training compute's).
    """
    return mean_token_loss(model, data, data.eval_ids, batch_size)


@dataclass(slots=True)
class LocalResult:
    """Outcome of `train_local`."""

    losses: list[float]
    """Train loss of each step (nats per byte)."""
    eval_loss: float
    """Final eval loss of the whole model."""
    activation_bytes: list[list[list[int]]]
    """`[stage][step][mb]` wire bytes of the activations stage sent."""
    gradient_bytes: list[list[list[int]]]
    """`[stage][step][mb]` wire bytes of the gradients stage sent."""
    buffer_bytes: int
    """AQ-SGD buffer bytes over all links and both sides."""


def train_local(
    config: PipelineTrainConfig,
    progress: Callable[[int, float], None] | None = None,
    data: TextWindows | None = None,
    *,
    replicas: Sequence[int] = (),
) -> LocalResult:
    """Train with every stage in this process (LocalTransport, no shaping).

    The stages run on `config.device` (one process: "cuda" is `cuda:0`) in `config.dtype`.
    `replicas` (micro-batches per replica, summing to `num_microbatches`) reads the steps in
    the order a data-parallel job of those replicas does (`_step_ids`), so one pipeline
    reproduces it (its gradients are the replicas' all-reduced ones).

    Raises:
        NonFiniteError: On NaN/inf.
        ConfigError: If `config.device` is "cuda" and this machine has no GPU.
    """
    precision = Precision(rank_device(resolve_device(config.device), 0), DTYPES[config.dtype])
    torch.manual_seed(config.seed)
    data = data or load_windows(config)
    model = build_model(config).to(precision.device)
    layers = default_layers(config, config.num_stages)
    transport = LocalTransport()
    spec = CodecSpec.parse(config.codec)
    m = config.num_microbatches
    buffers = _buffer_set(config, data)
    runners = [
        StageRunner(
            module,
            spec,
            transport,
            learning_rate=config.learning_rate,
            num_microbatches_total=m,
            drift_check_every=config.drift_check_every,
            warmup_steps=config.warmup_steps,
            buffers=buffers.factory,
            example_shape=boundary_shape(config)[1:],
            precision=precision,
        )
        for module in build_model_stages(config, model, layers)
    ]
    actions = [build_schedule(config.schedule, len(layers), s, m) for s in range(len(layers))]
    per_step = m * config.micro_batch_size
    losses = []
    try:
        for step in range(config.steps):
            ids = _step_ids(data, config, step, per_step, False, replicas)
            if step + 1 < config.steps:  # the loader knows the order: read the next rows ahead
                upcoming = _step_ids(data, config, step + 1, per_step, False, replicas)
                for runner in runners:
                    runner.prefetch(upcoming, step + 1)
            loss = run_local_step(
                runners, transport, actions, step, _microbatches(data, ids, config.micro_batch_size)
            )
            losses.append(loss)
            if progress is not None:
                progress(step, loss)
        buffer_bytes = sum(
            c.delta.buffer_bytes
            for r in runners
            for c in (r.act_in, r.act_out)
            if c.delta is not None
        )
    finally:
        buffers.close()
    return LocalResult(
        losses,
        evaluate(model, data),
        [r.stats.activation_bytes for r in runners],
        [r.stats.gradient_bytes for r in runners],
        buffer_bytes,
    )


def pretrain_local(
    config: PipelineTrainConfig, epochs: int, path: Path, *, max_windows: int | None = None
) -> dict[str, Any]:
    """Pre-train the whole model in FP32 on the corpus windows a run never sees; save it.

    The windows are `TextWindows.rest_ids`: train-side windows past `num_train`, disjoint from
    the train and the eval windows, so that a later run from `init_weights=path` fine-tunes,
    as AQ-SGD is evaluated (a pretrained model whose activations change slowly). One process,
    no pipeline split, AdamW at `config.learning_rate` (weight decay 0, as the stages use),
    batches of `micro_batch_size x num_microbatches` windows in a seeded order per epoch.

    Args:
        config: Model, corpus, batch, learning rate and seed (codec and steps are ignored).
        epochs: Passes over the pre-training windows, >= 1.
        path: Where the state_dict goes (`torch.save`).
        max_windows: Use only the first this many pre-training windows (None = all).

    Returns:
        `{"windows", "steps", "train_loss", "eval_loss"}`: the pre-training windows and steps,
        the mean loss of the last 10 steps and the eval loss (nats per token) afterwards.

    Raises:
        ValueError: If epochs < 1 or the corpus leaves less than one batch for pre-training.
    """
    if epochs < 1:
        raise ValueError(f"epochs={epochs} must be >= 1")
    torch.manual_seed(config.seed)
    data = load_windows(config)
    per_step = config.micro_batch_size * config.num_microbatches
    rest = data.rest_ids[:max_windows]
    if len(rest) < per_step:
        raise ValueError(
            f"{len(rest)} windows are left for pre-training past num_train={config.num_train}; "
            f"one batch needs {per_step}: lower num_train or use a larger corpus"
        )
    model = build_model(config)
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=config.learning_rate,
        weight_decay=0.0,
    )  # fmt: skip
    losses: list[float] = []
    for epoch in range(epochs):
        gen = torch.Generator().manual_seed(config.seed * 1_000_003 + 7_919 + epoch)
        order = rest[torch.randperm(len(rest), generator=gen)]
        for start in range(0, len(order) - per_step + 1, per_step):
            inputs, targets = data.batch(order[start : start + per_step])
            logits = model(inputs)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]  # torch stub gap
            optimizer.step()
            losses.append(float(loss.detach()))
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path)
    return {
        "windows": len(rest),
        "steps": len(losses),
        "train_loss": sum(losses[-10:]) / len(losses[-10:]),
        "eval_loss": evaluate(model, data),
    }


# --- distributed ---------------------------------------------------------------------------


def _digest(config: PipelineTrainConfig) -> dict[str, str]:
    data = config_to_dict(config)
    return {
        k: hashlib.sha256(json.dumps(v, sort_keys=True).encode()).hexdigest()[:16]
        for k, v in data.items()
    }


def check_same_config(
    config: PipelineTrainConfig, runs: Sequence[RunSpec], extra: dict[str, str], timeout_s: float
) -> None:
    """All ranks compare (version, torch, config keys, runs, plan and data digests).

    Raises:
        ConfigMismatchError: Naming the keys that differ and the ranks holding each value.
    """
    mine = {
        "frugal": frugal.__version__,
        "torch": torch.__version__,
        **_digest(config),
        "runs": hashlib.sha256(json.dumps([asdict(r) for r in runs]).encode()).hexdigest(),
        **extra,
    }
    gathered: list[dict[str, str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    differing = sorted(
        {k for g in gathered if g is not None for k in g if g.get(k) != mine.get(k)}
        | {k for g in gathered if g is not None for k in mine if k not in g}
    )
    if differing:
        detail = "; ".join(
            f"{k}: " + ", ".join(f"rank {r}={(g or {}).get(k)}" for r, g in enumerate(gathered))
            for k in differing
        )
        raise ConfigMismatchError(
            f"ranks started with different configurations ({detail}); launch every rank with "
            "the same config and frugal version"
        )


def _barrier(timeout_s: float) -> None:
    work = dist.barrier(async_op=True)
    assert work is not None
    work.wait(datetime.timedelta(seconds=timeout_s))


def _resolve_bandwidth(run: RunSpec, boundary_bytes: int, compute_s: float) -> float:
    if run.rho > 0:
        return bandwidth_from_rho(run.rho, boundary_bytes, compute_s)
    return run.bandwidth_mbps * 1e6 if run.bandwidth_mbps > 0 else math.inf


def rank_links(
    run: RunSpec, world_size: int, default_bandwidth: float, nic_state_path: str = ""
) -> dict[tuple[int, int], LinkSpec]:
    """The LinkSpec of every directed pair of ranks for `run` (`frugal.comm.link.link_table`).

    Pairs not in `run.links` get (default_bandwidth bit/s, run.latency_ms). Pairs on two
    hosts (`run.hosts`; every pair without it) get `run.tcp_window_bytes`, and, with
    `nic_state_path` and a NIC cap on either host, a route through both hosts' NICs.

    Raises:
        ValueError: If a pair names a rank outside [0, world_size), src == dst, a
            bandwidth / latency is negative, or `run.hosts` does not list every rank.
    """
    from frugal.comm.link import link_table  # here, not above: keeps the import block as main's

    overrides = {}
    for src, dst, mbps, latency_ms in run.links:
        if mbps < 0 or latency_ms < 0:
            raise ValueError(
                f"link ({src}, {dst}): bandwidth_mbps={mbps} and latency_ms={latency_ms} must "
                "be >= 0"
            )
        overrides[(int(src), int(dst))] = LinkSpec(
            bandwidth_bits_per_s=mbps * 1e6 if mbps > 0 else math.inf,
            latency_s=latency_ms / 1e3,
        )
    default = LinkSpec(bandwidth_bits_per_s=default_bandwidth, latency_s=run.latency_ms / 1e3)
    table = link_table(world_size, default, overrides)
    if run.hosts and len(run.hosts) != world_size:
        raise ValueError(f"run.hosts lists {len(run.hosts)} ranks; the job has {world_size}")
    if run.tcp_window_bytes < 0 or any(mbps < 0 for _, mbps in run.hosts):
        raise ValueError("tcp_window_bytes and every host's nic_mbps must be >= 0 (0 = no limit)")
    names = [host for host, _ in run.hosts] or [str(rank) for rank in range(world_size)]
    host_ids = {name: k for k, name in enumerate(dict.fromkeys(names))}
    nic_bits = [mbps * 1e6 if mbps > 0 else math.inf for _, mbps in run.hosts]
    window = run.tcp_window_bytes or math.inf
    for (src, dst), spec in table.items():
        if names[src] == names[dst]:
            continue
        nic = None
        if nic_state_path and run.hosts and min(nic_bits[src], nic_bits[dst]) < math.inf:
            nic = NicRoute(
                state_path=nic_state_path,
                num_hosts=len(host_ids),
                src_host=host_ids[names[src]],
                dst_host=host_ids[names[dst]],
                out_bits_per_s=nic_bits[src],
                in_bits_per_s=nic_bits[dst],
            )
        if nic is not None or window < math.inf:
            table[(src, dst)] = replace(spec, window_bytes=window, nic=nic)
    return table


NIC_STATE_FILE = "host_nics.f64"
"""The job's shared NIC state (`frugal.comm.link.HostNics`) in its output folder; the
launcher removes it when the job ends."""


def ring_bottleneck(
    members: Sequence[int], table: dict[tuple[int, int], LinkSpec]
) -> LinkSpec | None:
    """Slowest bandwidth and largest latency along the ring members[0] -> members[1] -> ...

    None for a group of one.
    """
    return bottleneck_link(COLLECTIVES.get("ring").edges(members), table)


def run_worker(config: PipelineTrainConfig, runs: Sequence[RunSpec], out_dir: Path) -> None:
    """Body of one torchrun process: init gloo, check configs, run `runs`, write rank JSON.

    Raises:
        ConfigMismatchError: If the ranks' configurations differ.
        PeerLostError: If a peer dies or stops answering.
        NonFiniteError: On NaN/inf (naming step and stage).
        ValueError: If the plan does not fit the world size or the model.
    """
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=config.comm_timeout_s)
    device = worker_device(config)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL and the *_object collectives use this device
    init_group(  # under this restart attempt's prefix
        rank,
        world_size,
        config.comm_timeout_s,
        backend=process_group_backend(device.type),
        device=device if device.type == "cuda" else None,
    )
    try:
        layout = make_layout(config, world_size, runs)
        data = load_windows(config)
        data_sha = hashlib.sha256(data.windows.numpy().tobytes()).hexdigest()[:16]
        check_same_config(
            config, runs, {"data": data_sha, "layout": str(layout)}, config.comm_timeout_s
        )
        replica, stage = layout.position(rank)
        dp_group = None
        for i in range(layout.num_stages):  # every rank creates every group, same order
            group = (
                dist.new_group([row[i] for row in layout.mesh], timeout=timeout)
                if layout.num_replicas > 1
                else None
            )
            if i == stage:
                dp_group = group
        results: dict[str, Any] = {"rank": rank, "replica": replica, "stage": stage, "runs": []}
        calib = RunSpec(
            label="calibrate",
            codec="fp32",
            steps=max(config.calibrate_steps, 2),
            repeat_examples=True,
        )

        def calibrate() -> float:
            out = _run_one(
                config, calib, layout, rank, replica, stage, dp_group, data, math.inf, out_dir
            )
            # c = the pace of one stage per micro-batch as this machine runs it: an unshaped
            # flush step takes (m + p - 1) c, so c includes the CPU sharing of co-located
            # ranks (4 stages on 2 cores run at half speed each).
            pace = median_or_zero(out["step_s"][1:]) / (
                max(layout.num_microbatches) + layout.num_stages - 1
            )
            mine = torch.tensor([pace], device=device)
            dist.all_reduce(mine, op=dist.ReduceOp.MAX)
            results.setdefault("calibrations", []).append(out)  # the simulator's core fit
            results.setdefault("calibration_s", []).append(float(mine))
            return float(mine)

        compute_s = 0.0
        if any(r.rho > 0 for r in runs) and not any(r.calibrate for r in runs):
            compute_s = calibrate()
        boundary = math.prod(boundary_shape(config)) * 4
        for run in runs:
            if run.calibrate:
                compute_s = calibrate()
            bandwidth = _resolve_bandwidth(run, boundary, compute_s)
            out = _run_one(
                config, run, layout, rank, replica, stage, dp_group, data, bandwidth, out_dir
            )
            out.update(
                label=run.label,
                codec=run.codec,
                rho=run.rho,
                compute_s=compute_s,
                bandwidth_bits_per_s=bandwidth if math.isfinite(bandwidth) else None,
            )
            results["runs"].append(out)
            _barrier(config.comm_timeout_s)
        out_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomically(out_dir / f"rank{rank}.json", json.dumps(results))
        # Every rank's results to rank 0, whose node may not hold the others' files (several
        # machines): it writes them all, in rank order.
        everyone: list[Any] = [None] * world_size
        dist.gather_object(results, everyone if rank == 0 else None, dst=0)
        if rank == 0:
            write_text_atomically(out_dir / RANKS_FILE, json.dumps(everyone))
        # No rank tears its connections down while rank 0 may still be receiving: a peer
        # closing its sockets mid-gather aborted rank 0 ("terminate called without an
        # active exception") in about one clean-clone test run in two.
        _barrier(config.comm_timeout_s)
    finally:
        dist.destroy_process_group()


RANKS_FILE = "ranks.json"
"""What global rank 0 writes into its node's output folder: every rank's results."""


def worker_device(config: PipelineTrainConfig) -> torch.device:
    """This torchrun process's device: `cuda:{LOCAL_RANK}` on CUDA, else the CPU.

    Raises:
        ConfigError: If `config.device` is "cuda" and this machine has fewer GPUs than
            processes (LOCAL_WORLD_SIZE).
    """
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return rank_device(resolve_device(config.device, local_world_size), local_rank)


@dataclass(frozen=True, slots=True)
class _Checkpoints:
    """The checkpoints of one run: where they go, what they must match, when they are due."""

    root: Path
    every: int
    expected: dict[str, str]
    timeout_s: float
    layout: Layout

    @classmethod
    def of(
        cls, config: PipelineTrainConfig, run: RunSpec, layout: Layout, out_dir: Path
    ) -> _Checkpoints | None:
        if not run.checkpoint or config.checkpoint_every <= 0:
            return None
        root = Path(config.checkpoint_dir) if config.checkpoint_dir else out_dir / "checkpoints"
        return cls(
            root,
            config.checkpoint_every,
            fingerprint(config, run.label, str(layout)),
            config.comm_timeout_s,
            layout,
        )

    def _saved(self) -> dict[str, Any]:
        """This layout as `COMPLETE` records it (what a job on another plan maps from)."""
        return {
            "mesh": [list(row) for row in self.layout.mesh],
            "layers": list(self.layout.layers),
            "num_microbatches": list(self.layout.num_microbatches),
        }

    def resume(self, rank: int, runner: StageRunner) -> tuple[int, dict[str, Any], bool]:
        """Load the newest complete checkpoint, if any: (steps done, extra values, relaid).

        A checkpoint written on another plan (same stages and global batch) is mapped onto
        this layout by `relayout_sources` (relaid = True).
        """
        found = latest_checkpoint(self.root, self.expected, relayout=True)
        step, relaid = 0, False
        extra: dict[str, Any] = {}
        if found is not None:
            saved = saved_layout(found[1])
            if saved is None or saved == self._saved():
                step, extra = load_stage(found[1], rank, runner)
            else:
                replica, stage = self.layout.position(rank)
                source, owners = relayout_sources(
                    saved,
                    layers=self.layout.layers,
                    num_microbatches=self.layout.num_microbatches,
                    replica=replica,
                    stage=stage,
                )
                step, extra = load_stage(found[1], source, runner, buffer_ranks=owners)
                relaid = True
        _barrier(self.timeout_s)  # every rank has read before rank 0 tidies the folder
        if rank == 0:
            remove_incomplete(self.root, step)
            if found is not None:
                other = " (written on another plan: state mapped by stage)" if relaid else ""
                print(f"rank 0: resumed from {found[1]} (step {step}){other}", file=sys.stderr)
        return step, extra, relaid

    def due(self, steps_done: int, total_steps: int) -> bool:
        return steps_done % self.every == 0 or steps_done == total_steps

    def save(self, rank: int, runner: StageRunner, steps_done: int, extra: dict[str, Any]) -> None:
        """Every rank writes its state; once all have, rank 0 marks the checkpoint complete."""
        save_stage(self.root / f"step-{steps_done:08d}", rank, runner, step=steps_done, extra=extra)
        _barrier(self.timeout_s)
        if rank == 0:
            commit_checkpoint(
                self.root,
                steps_done,
                dist.get_world_size(),
                self.expected,
                layout=self._saved(),
            )


def _run_one(
    config: PipelineTrainConfig,
    run: RunSpec,
    layout: Layout,
    rank: int,
    replica: int,
    stage: int,
    dp_group: dist.ProcessGroup | None,
    data: TextWindows,
    bandwidth: float,
    out_dir: Path,
) -> dict[str, Any]:
    torch.manual_seed(config.seed)
    precision = Precision(worker_device(config), DTYPES[config.dtype])
    model = build_model(config).to(precision.device)
    module = build_model_stages(config, model, layout.layers)[stage]
    row = layout.mesh[replica]
    peers = {s: row[s] for s in (stage - 1, stage + 1) if 0 <= s < layout.num_stages}
    links = rank_links(run, dist.get_world_size(), bandwidth, str(out_dir / NIC_STATE_FILE))
    collective = layout.stage_collective(stage)
    # The DP exchange goes through the emulated links too (each message its pair's shaper).
    dp_links = links if (run.links or run.shape_dp) and dp_group is not None else None
    transport = DistTransport(
        rank=rank,
        stage=stage,
        peer_ranks=peers,
        links=links,
        timeout_s=config.comm_timeout_s,
        device=precision.device,
    )
    total_mbs = sum(layout.num_microbatches)
    buffers = _buffer_set(config, data)
    runner = StageRunner(
        module,
        CodecSpec.parse(run.codec),
        transport,
        learning_rate=config.learning_rate,
        num_microbatches_total=total_mbs,
        dp_group=dp_group,
        dp_compression=run.dp_compression,
        dp_bits=run.dp_bits,
        drift_check_every=config.drift_check_every,
        warmup_steps=config.warmup_steps,
        timeout_s=config.comm_timeout_s,
        dp_links=dp_links,
        buffers=buffers.factory,
        example_shape=boundary_shape(config)[1:],
        dp_collective=collective,
        precision=precision,
    )
    m = layout.num_microbatches[replica]
    actions = build_schedule(config.schedule, layout.num_stages, stage, m)
    offset = sum(layout.num_microbatches[:replica]) * config.micro_batch_size
    per_step = total_mbs * config.micro_batch_size
    shards = layout.num_microbatches  # each replica keeps its own shard (`_step_ids`)
    reporter = stage == layout.num_stages - 1 and replica == 0
    checkpoints = _Checkpoints.of(config, run, layout, out_dir)
    first_step, initial_eval_loss, relaid = 0, None, False
    if checkpoints is not None:
        first_step, saved, relaid = checkpoints.resume(rank, runner)
        initial_eval_loss = saved.get("initial_eval_loss")
    if first_step == 0 and reporter and run.evaluate:
        # The whole model's eval loss before training (SmolLM2: its perplexity as loaded).
        initial_eval_loss = evaluate(model, data)
    try:
        _barrier(config.comm_timeout_s)
        for step in range(first_step, run.steps):
            ids = _step_ids(data, config, step, per_step, run.repeat_examples, shards)
            mine = ids[offset : offset + m * config.micro_batch_size]
            if step + 1 < run.steps:  # read the next step's rows ahead (sample order)
                upcoming = _step_ids(data, config, step + 1, per_step, run.repeat_examples, shards)
                runner.prefetch(upcoming[offset : offset + m * config.micro_batch_size], step + 1)
            t0 = time.perf_counter()
            runner.begin_step(step, _microbatches(data, mine, config.micro_batch_size))
            for i, action in enumerate(actions):
                next_action = (
                    actions[i + 1] if config.prepost_receives and i + 1 < len(actions) else None
                )
                runner.run(action, upcoming=next_action)
            loss = runner.end_step()
            runner.stats.step_s.append(time.perf_counter() - t0)
            if reporter and loss is not None:
                event = {"run": run.label, "step": step, "loss": loss}
                event["step_s"] = runner.stats.step_s[-1]
                # One write of the whole line: print() writes the text and the newline apart,
                # and torchrun's log tail can split the line between them.
                sys.stdout.write(PROGRESS_PREFIX + json.dumps(event) + "\n")
                sys.stdout.flush()
            if checkpoints is not None and checkpoints.due(step + 1, run.steps):
                checkpoints.save(rank, runner, step + 1, {"initial_eval_loss": initial_eval_loss})
        buffer_bytes = sum(
            c.delta.buffer_bytes for c in (runner.act_in, runner.act_out) if c.delta is not None
        )
    finally:
        transport.close()
        runner.close()
        buffers.close()
    # Eval on the whole model: replica 0's stages send their trained weights to the reporting
    # rank (a few MB for the tiny GPT, ~400 MB for SmolLM2's blocks; frozen weights are the
    # same everywhere and stay home), which reassembles and evaluates it.
    eval_loss = None
    gathered: list[Any] = [None] * dist.get_world_size()
    trained = {k: p.detach().cpu() for k, p in module.named_parameters() if p.requires_grad}
    if run.evaluate:
        dist.gather_object(
            trained if replica == 0 else {},
            gathered if reporter else None,
            dst=layout.mesh[0][layout.num_stages - 1],
        )
    if reporter and run.evaluate:
        full = model.state_dict()
        for s, r in enumerate(layout.mesh[0]):
            first_block = sum(layout.layers[:s])
            for key, value in gathered[r].items():
                if key.startswith("blocks."):  # stage-local block index -> model index
                    _, index, rest = key.split(".", 2)
                    key = f"blocks.{first_block + int(index)}.{rest}"
                full[key] = value
        model.load_state_dict(full)
        eval_loss = evaluate(model, data)
    stats = runner.stats
    return {
        "steps": run.steps,
        "resumed_from_step": first_step,
        "resumed_on_another_plan": relaid,
        "losses": stats.losses,
        "eval_loss": eval_loss,
        "initial_eval_loss": initial_eval_loss,
        "step_s": stats.step_s,
        "median_forward_s": stats.median_forward_s(),
        "median_backward_s": stats.median_backward_s(),
        "median_optimizer_s": median_or_zero(stats.optimizer_s),
        "median_forward_cpu_s": median_or_zero(stats.forward_cpu_s),
        "median_backward_cpu_s": median_or_zero(stats.backward_cpu_s),
        "activation_bytes": stats.activation_bytes,
        "gradient_bytes": stats.gradient_bytes,
        "num_microbatches": m,
        # What ran, as the runner resolved it (train.json reports it against the plan's).
        "ran_codec": runner.spec.label,
        "schedule": config.schedule,
        "dp_collective": runner.dp_sync.collective_name if runner.dp_sync is not None else "",
        "device": str(precision.device),
        "dtype": str(precision.dtype).removeprefix("torch."),
        "dp_bytes": stats.dp_bytes,
        "buffer_bytes": buffer_bytes,
    }


def launch_torchrun(
    config: PipelineTrainConfig,
    runs: Sequence[RunSpec],
    out_dir: Path,
    *,
    nproc: int,
    timeout_s: float,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    module: str = "frugal.pipeline.worker",
    memory_estimate: MemoryEstimate | None = None,
    force: bool = False,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
) -> list[dict[str, Any]]:
    """Start `nproc` workers per node with torchrun; return every rank's results.

    On one node (the default) the rendezvous is on 127.0.0.1. With `nnodes` > 1 every machine
    runs the same call with the same `rdzv_endpoint` (`host:port` all of them reach); global
    rank 0 gathers every rank's results, so its node returns them all and every other node
    returns [] (its ranks finished; the results are on rank 0's node).

    `module` is the worker's entry point (`python -m module JOB.json OUT_DIR`);
    `memory_estimate` and `force` go to the launch's resource guards (`TorchrunJob`).

    Raises:
        PipelineError: If a worker fails (its last output lines are in the message) or the
            launch exceeds `timeout_s`.
    """
    # A plan that does not fit this job fails here, before any process starts.
    world_size = nproc * nnodes
    layout = make_layout(config, world_size, runs)
    job = out_dir / "job.json"
    launch = TorchrunJob(
        target=[module, str(job), str(out_dir)],
        nproc=nproc,
        nnodes=nnodes,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_id="frugal-pipeline",
        timeout_s=timeout_s,
        max_restarts=config.max_restarts,
        rank_roles={rank: layout.role(rank) for rank in range(world_size)},
        shutdown_timeout_s=_SHUTDOWN_TIMEOUT_S,
        log_dir=out_dir / "logs",
        memory_estimate=memory_estimate,
        force=force,
    )
    check_job(nproc, memory_estimate, force=force)  # a refused job writes nothing
    out_dir.mkdir(parents=True, exist_ok=True)
    job.write_text(
        json.dumps({"config": config_to_dict(config), "runs": [asdict(r) for r in runs]})
    )
    for old in [*out_dir.glob("rank*.json"), out_dir / RANKS_FILE, out_dir / NIC_STATE_FILE]:
        old.unlink(missing_ok=True)

    def on_line(local_rank: int, line: str) -> None:
        if on_progress is not None and (event := progress_event(line)) is not None:
            on_progress(event)

    result = run_torchrun(launch, on_line=on_line)
    (out_dir / NIC_STATE_FILE).unlink(missing_ok=True)  # the emulated NICs end with the job
    if not result.ok:
        raise PipelineError(f"pipeline launch failed: {result.failure_message()}")
    if (out_dir / RANKS_FILE).exists():
        ranks: list[dict[str, Any]] = json.loads((out_dir / RANKS_FILE).read_text())
        return ranks
    if nnodes > 1:
        return []  # another node holds global rank 0 and the results
    # One node, a worker that writes only its own file (torch.distributed.pipelining's).
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(nproc)]


def progress_event(line: str) -> dict[str, Any] | None:
    """The progress event a rank's output line carries, or None.

    A line is `FRUGAL_PROGRESS {json}`; what follows the JSON object (another rank's output
    that torchrun's log tail joined to the line) is ignored, and a cut or garbled line gives
    None: progress is for display, it never stops a job.
    """
    if not line.startswith(PROGRESS_PREFIX):
        return None
    try:
        event, _ = json.JSONDecoder().raw_decode(line, len(PROGRESS_PREFIX))
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def config_from_job(path: Path) -> tuple[PipelineTrainConfig, list[RunSpec]]:
    """Read the job file written by `launch_torchrun`."""
    job = json.loads(path.read_text())
    config = config_from_dict(PipelineTrainConfig, job["config"], source=str(path))
    return config, [
        RunSpec(
            **{
                **r,
                "links": tuple(tuple(x) for x in r.get("links", ())),
                "hosts": tuple(tuple(x) for x in r.get("hosts", ())),
            }
        )
        for r in job["runs"]
    ]


def rho_label(rho: float) -> str:
    """The paper link a rho point stands for ("100mbps"), or "rho=X"."""
    for name, value in RHO_POINTS.items():
        if value == rho:
            return name
    return f"rho={rho}"


def check_rhos(rhos: Sequence[float]) -> None:
    """Check a bench's transfer/compute ratios: at least one, each in (0, MAX_RHO].

    Raises:
        ValueError: Naming the first bad value and the range.
    """
    if not rhos:
        raise ValueError("rhos is empty; list at least one transfer/compute ratio, e.g. [3.3]")
    for rho in rhos:
        if not 0 < rho <= MAX_RHO:
            raise ValueError(
                f"rhos={tuple(rhos)}: {rho:g} is outside (0, {MAX_RHO:g}] (the paper's slowest "
                "link is rho 3.3)"
            )


def median_or_zero(values: Sequence[float]) -> float:
    """Median, or 0 for an empty list."""
    return statistics.median(values) if values else 0.0


def cell_rounds(
    by_stage: Sequence[dict[str, Any]], num_cells: int, cell: int, num_rounds: int
) -> tuple[list[list[dict[str, Any]]], list[list[float]], float]:
    """One bench cell's runs in an interleaved launch (round r runs cells 0..num_cells-1).

    Args:
        by_stage: Rank outputs of `launch_torchrun`, sorted by stage.
        num_cells: Cells per round.
        cell: This cell's index within a round.
        num_rounds: Rounds in the launch.

    Returns:
        (rounds, round_step_s, median_s): `rounds[i][stage]` is a rank's run of this cell in
        round i; round_step_s[i] the step seconds of round i (slowest rank per step, the
        first step left out); median_s the median over every round's timed steps.
    """
    rounds = [[r["runs"][i * num_cells + cell] for r in by_stage] for i in range(num_rounds)]
    round_step_s = [
        [max(o["step_s"][i] for o in outs) for i in range(1, len(outs[0]["step_s"]))]
        for outs in rounds
    ]
    return rounds, round_step_s, statistics.median(s for steps in round_step_s for s in steps)
