"""Launch a training job: N trainer processes under torchrun on 127.0.0.1, with a timeout.

torchrun (`python -m torch.distributed.run`) runs a c10d rendezvous on a free loopback port;
the same trainer module runs unchanged under a multi-machine torchrun command line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from frugal.config import ConfigError, config_to_dict
from frugal.launch import MemoryEstimate, TorchrunJob, check_job, run_torchrun
from frugal.recsys.config import (
    RecsysTrainConfig,
    shard_budget_bytes,
    shard_rows_bytes,
    table_dims,
)
from frugal.recsys.datasets import load_recsys_data
from frugal.recsys.errors import RecsysError
from frugal.recsys.models import build_model
from frugal.recsys.ps import shard_capacity, shard_memory_bytes

__all__ = [
    "TRAINER_BASELINE_BYTES",
    "launch_runs",
    "launch_training",
    "memory_estimate",
]


TRAINER_BASELINE_BYTES = 580 << 20
"""A trainer's memory besides its data and shard: Python, torch, gloo, the metrics libraries.
Measured: the peak RSS of `frugal recsys train --nproc 2` (movielens100k, whose data and
shards take 5 MiB) is 1.13 GiB over 2 trainers."""


def memory_estimate(config: RecsysTrainConfig) -> MemoryEstimate:
    """What a training job's `nproc` trainer processes together hold in RAM, by part.

    Each process holds `TRAINER_BASELINE_BYTES` (Python, torch, gloo, metrics), the whole dataset
    (every trainer loads it), and its parameter-server shard's store, sized to cache every
    row it owns (`shard_capacity` rows of embedding plus optimizer state). The dense network
    and the staging buffers are left out (KiB to a few MiB): an estimate, not a bound.

    Args:
        config: The training run (its dataset is loaded to read the table sizes).

    Returns:
        The estimate, term by term.
    """
    train, test = load_recsys_data(config.data)
    data_bytes = train.nbytes + test.nbytes
    capacity = config.ps_capacity_rows or shard_capacity(train.num_embeddings, config.nproc)
    row_bytes = -(-shard_rows_bytes(config, capacity, train.num_embeddings) // capacity)
    shard = shard_memory_bytes(
        capacity, row_bytes, shard_budget_bytes(config, capacity, train.num_embeddings)
    )
    n = config.nproc
    return MemoryEstimate(
        (
            (f"{n} trainers x {TRAINER_BASELINE_BYTES >> 20} MiB", n * TRAINER_BASELINE_BYTES),
            (f"{n} copies of the {config.data.dataset} data", n * data_bytes),
            (f"{n} PS shards of {capacity:,} rows x {row_bytes} B", n * shard),
        )
    )


def _check_checkpoint_dir(config: RecsysTrainConfig) -> None:
    """Check the checkpoint folder before any process starts.

    It can be created; a fresh run does not replace an earlier run's checkpoints; a resume
    matches the checkpoint's settings.

    Raises:
        ConfigError: Naming the folder, what it holds and the fix.
    """
    if config.checkpoint_dir is None:
        return
    from frugal.disk import make_folder
    from frugal.recsys.checkpoint import check_compat

    folder = make_folder(Path(config.checkpoint_dir), what="checkpoint_dir", error=ConfigError)
    latest = folder / "LATEST"
    if not latest.is_file():
        return
    name = latest.read_text().strip()
    if not config.resume:
        raise ConfigError(
            f"checkpoint_dir {folder} holds an earlier run's checkpoints (LATEST: {name}); a "
            "fresh run would replace them: set resume=true to go on from them, or give a new "
            "or empty checkpoint_dir"
        )
    try:
        manifest = json.loads((folder / name / "MANIFEST.json").read_text())
    except (OSError, ValueError):
        return  # the trainers report a damaged checkpoint with the full check
    if isinstance(manifest, dict) and isinstance(manifest.get("compat"), dict):
        try:
            check_compat(folder / name, manifest["compat"], config)
        except RecsysError as exc:
            raise ConfigError(str(exc)) from exc


def _check_features(config: RecsysTrainConfig) -> None:
    """Refuse, before any process starts, features, pooling or widths that do not fit."""
    if config.features is None and len(config.pooling) == 1 and not config.embedding_dims:
        return
    train, _ = load_recsys_data(config.data)
    try:
        dims = table_dims(config, len(train.keys))
    except ValueError as exc:
        raise ConfigError(f"{exc} (tables {list(train.keys)})") from exc
    if len(set(dims)) > 1:
        try:  # the model refuses widths it cannot take (dlrm: one width)
            build_model(config.model, len(dims), dims, train.dense_dim, config.hidden)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
    if len(config.pooling) not in (1, len(train.keys)):
        raise ConfigError(
            f"pooling has {len(config.pooling)} modes, {config.data.dataset} has "
            f"{len(train.keys)} tables {list(train.keys)}; give one mode for every table or "
            f"one per table"
        )
    if config.features is None:
        return
    if tuple(config.features) != train.keys:
        raise ConfigError(
            f"features={list(config.features)} do not match {config.data.dataset}'s features "
            f"{list(train.keys)}; fix the config's features list"
        )


def launch_training(
    config: RecsysTrainConfig, out_dir: Path, *, timeout_s: float = 600.0, force: bool = False
) -> dict[str, Any]:
    """Run `config` as `config.nproc` torchrun processes; return rank 0's result.

    Args:
        config: The training run.
        out_dir: Folder for `job.json`, `result.json`, the per-rank logs and PS files.
        timeout_s: Wall-clock limit of the whole job; the process group is killed after it.
        force: Start even where a resource guard (process count, memory) refuses.

    Returns:
        The content of `result.json`.

    Raises:
        RecsysError: If the job fails or times out (the failed ranks and their errors are in
            the message).
    """
    return launch_runs([(config, out_dir)], out_dir, timeout_s=timeout_s, force=force)[0]


def launch_runs(
    runs: list[tuple[RecsysTrainConfig, Path]],
    job_dir: Path,
    *,
    timeout_s: float = 600.0,
    force: bool = False,
) -> list[dict[str, Any]]:
    """Run several trainings one after the other in one torchrun job (one process group).

    Args:
        runs: (config, out_dir) pairs; every config must have the same `nproc`.
        job_dir: Folder for `job.json` and the per-rank logs (`logs/`).
        timeout_s: Wall-clock limit of the whole job.
        force: Start even where a resource guard (process count, memory) refuses; the memory
            checked is the largest run's `memory_estimate` (they run one after the other).

    Returns:
        Each run's `result.json` content, in order.

    Raises:
        ValueError: If `runs` is empty, the configs disagree on `nproc`, or a config's
            `features` do not match its dataset.
        RecsysError: If the job fails or times out (the failed ranks and their errors are in
            the message).
    """
    if not runs:
        raise ValueError("runs is empty; give at least one (config, out_dir)")
    nprocs = {config.nproc for config, _ in runs}
    if len(nprocs) != 1:
        raise ValueError(f"runs of one job need one nproc, got {sorted(nprocs)}; split the job")
    for run_config, _ in runs:
        _check_features(run_config)
        _check_checkpoint_dir(run_config)
    config = runs[0][0]
    estimates = [memory_estimate(c) for c in dict.fromkeys(c for c, _ in runs)]
    config_path = job_dir / "job.json"
    launch = TorchrunJob(
        target=["frugal.recsys.trainer", str(config_path)],
        nproc=config.nproc,
        timeout_s=timeout_s,
        max_restarts=max(c.max_restarts for c, _ in runs),
        env={"PYTHONWARNINGS": "ignore"},
        log_dir=job_dir / "logs",
        memory_estimate=max(estimates, key=lambda estimate: estimate.total_bytes),
        force=force,
    )
    check_job(launch.nproc, launch.memory_estimate, force=force)  # a refused job writes nothing
    job_dir.mkdir(parents=True, exist_ok=True)
    for _, out_dir in runs:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "result.json").unlink(missing_ok=True)
    job = {"runs": [{"config": config_to_dict(c), "out_dir": str(d)} for c, d in runs]}
    config_path.write_text(json.dumps(job, indent=1) + "\n")
    result = run_torchrun(launch)
    missing = [d for _, d in runs if not (d / "result.json").exists()]
    if not result.ok or missing:
        why = result.failure_message() or f"no result.json in {[str(d) for d in missing]}"
        raise RecsysError(f"recsys training ({config.mode}) failed: {why}")
    results: list[dict[str, Any]] = [json.loads((d / "result.json").read_text()) for _, d in runs]
    return results
