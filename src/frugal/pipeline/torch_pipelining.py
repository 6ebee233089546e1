"""Baseline: the same model and batch under PyTorch's own `torch.distributed.pipelining`.

Each torchrun process wraps its stage (the same `build_model_stages` split our runtime uses)
in `PipelineStage` and runs `ScheduleGPipe` or `Schedule1F1B` over gloo on 127.0.0.1, FP32,
with AdamW after each step, so tokens/s compare side by side with our FP32 runtime. Entry
point of one process: `python -m frugal.pipeline.torch_pipelining JOB.json OUT_DIR`, launched
by `launch_torch_pipelining` (the job file is `train.launch_torchrun`'s: a
`PipelineTrainConfig` and `RunSpec`s whose `label` names the schedule, "gpipe" or "1f1b").

Not shaped: torch's stages send with `dist.batch_isend_irecv` from inside the schedule, with
no hook where `frugal.comm.link`'s per-link shaper could sit, so this baseline runs on the raw
loopback link (compare it with our unshaped FP32 run). Every collective is bounded by the
process group's timeout and the launch by `timeout_s`; a hang (pytorch/pytorch#132644 on
older torch) is reported as a `PipelineError`, never waited out.

References:
    PiPPy / torch.distributed.pipelining (PyTorch 2.4+), GPipe (arXiv 1811.06965) and
    PipeDream-Flush 1F1B (arXiv 2006.09503) schedules.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from frugal import FrugalError
from frugal.pipeline.train import (
    PipelineTrainConfig,
    RunSpec,
    launch_torchrun,
)
from frugal.pipeline.worker import run_job_file
from frugal.pipeline.zoo import (
    build_model,
    build_model_stages,
    default_layers,
    load_model_windows,
    model_context,
)
from frugal.results import write_text_atomically

__all__ = ["SCHEDULES", "launch_torch_pipelining", "main", "run_torch_worker", "summarize"]

SCHEDULES = ("gpipe", "1f1b")
"""The schedules a run's label may name: the keys of `_schedule_classes()`."""


def _schedule_classes() -> dict[str, Any]:
    """torch.distributed.pipelining's class of each schedule name in `SCHEDULES`."""
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    return {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def run_torch_worker(config: PipelineTrainConfig, runs: Sequence[RunSpec], out_dir: Path) -> None:
    """Body of one process: init gloo, run each schedule for `run.steps` steps, write JSON.

    Every step uses the same macro-batch (the first `micro_batch_size x num_microbatches`
    train windows of epoch 0's order), as the bench's speed runs do.

    Raises:
        ValueError: If a run's label is not a schedule name, or world size != num_stages.
        RuntimeError: From torch on a peer timeout (bounded by comm_timeout_s).
    """
    from torch.distributed.pipelining import PipelineStage

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    if world_size != config.num_stages:
        raise ValueError(
            f"world_size={world_size} but num_stages={config.num_stages}: launch one process "
            "per stage"
        )
    for run in runs:
        if run.label not in SCHEDULES:
            raise ValueError(f"run label {run.label!r} must be one of {SCHEDULES}")
    timeout = datetime.timedelta(seconds=config.comm_timeout_s)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timeout)
    try:
        data = load_model_windows(config)
        layers = default_layers(config, world_size)
        m = config.num_microbatches
        per_step = m * config.micro_batch_size
        ids = data.epoch_order(0, config.seed)[:per_step]
        inputs, targets = data.batch(ids)
        results: dict[str, Any] = {"rank": rank, "runs": []}
        for run in runs:
            torch.manual_seed(config.seed)
            model = build_model(config)
            module = build_model_stages(config, model, layers)[rank]
            assert isinstance(module, torch.nn.Module)
            stage = PipelineStage(module, rank, world_size, torch.device("cpu"))

            def loss_fn(logits: Tensor, target: Tensor) -> Tensor:
                return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))

            schedule_class = _schedule_classes()[run.label]
            schedule = schedule_class(stage, n_microbatches=m, loss_fn=loss_fn)
            params = [p for p in module.parameters() if p.requires_grad]
            optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=0.0)
            step_s, losses = [], []
            dist.barrier()
            for _ in range(run.steps):
                optimizer.zero_grad(set_to_none=True)
                t0 = time.perf_counter()
                mb_losses: list[Tensor] = []
                if rank == 0:
                    schedule.step(inputs)
                elif rank == world_size - 1:
                    schedule.step(target=targets, losses=mb_losses)
                else:
                    schedule.step()
                optimizer.step()
                step_s.append(time.perf_counter() - t0)
                if mb_losses:
                    losses.append(float(torch.stack([x.detach() for x in mb_losses]).mean()))
            results["runs"].append(
                {"label": run.label, "steps": run.steps, "step_s": step_s, "losses": losses}
            )
            dist.barrier()
        out_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomically(out_dir / f"rank{rank}.json", json.dumps(results))
    finally:
        dist.destroy_process_group()


def launch_torch_pipelining(
    config: PipelineTrainConfig,
    schedules: Sequence[str],
    steps: int,
    out_dir: Path,
    *,
    timeout_s: float,
) -> list[dict[str, Any]]:
    """Run each schedule for `steps` steps on `config.num_stages` gloo ranks; rank results.

    Raises:
        ValueError: If a schedule is unknown or steps < 1.
        PipelineError: If the launch fails or exceeds `timeout_s` (e.g. a hang).
    """
    unknown = [s for s in schedules if s not in SCHEDULES]
    if unknown or steps < 1:
        raise ValueError(f"schedules {unknown} must be in {SCHEDULES} and steps={steps} >= 1")
    runs = [RunSpec(label=s, codec="fp32", steps=steps, repeat_examples=True) for s in schedules]
    return launch_torchrun(
        config,
        runs,
        out_dir,
        nproc=config.num_stages,
        timeout_s=timeout_s,
        module="frugal.pipeline.torch_pipelining",
    )


def summarize(config: PipelineTrainConfig, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Per schedule: tokens/s (median step after the first, slowest rank) and the losses.

    Returns:
        schedule -> {"tokens_per_s", "step_time_ms", "losses"}.
    """
    tokens_per_step = config.micro_batch_size * config.num_microbatches * model_context(config)
    out: dict[str, Any] = {}
    for k, run in enumerate(ranks[0]["runs"]):
        per_rank = [r["runs"][k]["step_s"] for r in ranks]
        steps = [max(s[i] for s in per_rank) for i in range(1, len(per_rank[0]))] or [
            max(s[0] for s in per_rank)
        ]
        median_s = statistics.median(steps)
        losses: list[float] = next(
            (r["runs"][k]["losses"] for r in ranks if r["runs"][k]["losses"]), []
        )
        out[run["label"]] = {
            "tokens_per_s": tokens_per_step / median_s,
            "step_time_ms": median_s * 1e3,
            "losses": losses,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the job file's schedules on this rank; 0 on success, 1 on a failure."""
    return run_job_file(
        argv,
        module="frugal.pipeline.torch_pipelining",
        body=run_torch_worker,
        errors=(FrugalError, ValueError, RuntimeError),
    )


if __name__ == "__main__":
    sys.exit(main())
