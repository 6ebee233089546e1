"""Launch a training job: N trainer processes under torchrun on 127.0.0.1, with a timeout.

torchrun (`python -m torch.distributed.run`) runs a c10d rendezvous on a free loopback port;
the same trainer module runs unchanged under a multi-machine torchrun command line.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frugal.config import ConfigError, config_to_dict
from frugal.disk import lock_file
from frugal.launch import MemoryEstimate, TorchrunJob, check_job, run_torchrun
from frugal.recsys.batch import RecsysData, RecsysSplit
from frugal.recsys.client import EmbeddingClient
from frugal.recsys.config import (
    RecsysTrainConfig,
    sequence_indices,
    shard_budget_bytes,
    shard_rows_bytes,
    table_dims,
)
from frugal.recsys.datasets import RecsysDataConfig, load_recsys_data
from frugal.recsys.errors import RecsysError
from frugal.recsys.loader import BatchSource, count_total_samples
from frugal.recsys.models import build_model
from frugal.recsys.ps import default_owners, shard_capacity, shard_memory_bytes
from frugal.recsys.transport import LocalTransport
from frugal.store import EmbeddingStore
from frugal.store.rows import RowSpec
from frugal.store.store import MIN_BUDGET_BYTES

__all__ = [
    "TRAINER_BASELINE_BYTES",
    "check_run",
    "launch_runs",
    "launch_training",
    "max_batch_rows",
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
    simple = config.features is None and len(config.pooling) == 1
    if simple and not config.embedding_dims and not config.sequence_features:
        if config.sequence_target is not None:
            raise ConfigError(
                f"sequence_target={config.sequence_target!r} needs sequence_features (the "
                "features whose attention it drives)"
            )
        return
    train, _ = load_recsys_data(config.data)
    try:
        dims = table_dims(config, len(train.keys))
        sequences, target = sequence_indices(config, train.keys)
    except ValueError as exc:
        raise ConfigError(f"{exc} (tables {list(train.keys)})") from exc
    if target is not None and not sequences:
        raise ConfigError(
            f"sequence_target={config.sequence_target!r} needs sequence_features (the "
            "features whose attention it drives)"
        )
    if len(set(dims)) > 1 or sequences:
        try:  # the model refuses widths or sequences it cannot take
            build_model(
                config.model,
                len(dims),
                dims[0] if len(set(dims)) == 1 else dims,
                train.dense_dim,
                config.hidden,
                sequence_features=sequences,
                sequence_target=target,
            )
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


def max_batch_rows(train: RecsysSplit, config: RecsysTrainConfig, num_steps: int = 4) -> int:
    """The most distinct (table, id) rows one trainer's batch brings to one PS shard.

    Each push holds one trainer's batch's ids owned by one shard, and a push that does not
    fit a shard fails. Measured on the batches of the first `num_steps` steps, each rank's
    as its `BatchSource` reads them, routed as the trainers route them
    (`EmbeddingClient.route`: raw ids hashed, then by virtual shard over `nproc` shards):
    a capacity below it fails in those steps; a later batch may bring more.

    Args:
        train: The training split, at least one step (batch_size x nproc samples) long.
        config: The run (batch_size, nproc, seed, epochs, max_steps).
        num_steps: Steps measured, >= 1.

    Returns:
        The largest count over (rank, step, shard).
    """
    transport = LocalTransport([], threads=1)  # routing makes no call
    client = EmbeddingClient(
        transport, default_owners(config.nproc), len(train.keys), 1, raw_ids=train.raw_ids
    )
    most = 0
    try:
        for rank in range(config.nproc):
            source = BatchSource(train, config, rank, config.nproc)
            for step in range(min(num_steps, source.num_steps)):
                routed = client.route(source.batch(step))
                most = max([most, *(stop - start for start, stop in routed.owner_slices.values())])
    finally:
        transport.close()
    return most


@dataclass(frozen=True, slots=True)
class _SplitFacts:
    """What the checks before launch need of a training split (not the split itself)."""

    num_samples: int
    num_embeddings: tuple[int, ...]
    batch_rows: int | None
    """`max_batch_rows`; None if the split is shorter than one step."""
    is_stream: bool


@functools.lru_cache(maxsize=16)
def _split_facts(
    data: RecsysDataConfig, batch_size: int, nproc: int, seed: int, max_steps: int | None
) -> _SplitFacts:
    """Facts of a training split, cached: a bench checks many runs of the same data."""
    train, _ = load_recsys_data(data)
    shape = RecsysTrainConfig(
        data=data, batch_size=batch_size, nproc=nproc, seed=seed, max_steps=max_steps
    )
    long_enough = train.num_samples >= batch_size * nproc
    return _SplitFacts(
        num_samples=train.num_samples,
        num_embeddings=tuple(train.num_embeddings),
        batch_rows=max_batch_rows(train, shape) if long_enough else None,
        is_stream=not isinstance(train, RecsysData),
    )


def _check_one_step(config: RecsysTrainConfig, facts: _SplitFacts) -> None:
    """Refuse a training split shorter than one step (the trainers' `count_total_samples`)."""
    step = config.batch_size * config.nproc
    try:
        count_total_samples(config, facts.num_samples, config.nproc)
    except ValueError:
        pass
    else:
        return
    data = config.data
    if data.max_train_samples is not None and data.max_train_samples < step:
        given = f" (data.max_train_samples={data.max_train_samples})"
        fix = f"set data.max_train_samples >= {step:,}"
    elif facts.is_stream:
        given = f" (data.stream_num_samples={data.stream_num_samples})"
        fix = f"set data.stream_num_samples >= {step:,}"
    else:
        given, fix = "", f"give a dataset of {step:,} training samples or more"
    raise ConfigError(
        f"{data.dataset}'s training split has {facts.num_samples:,} samples{given}, fewer than "
        f"one step of batch_size={config.batch_size} x nproc={config.nproc} = {step:,} "
        f"samples; {fix}, or lower batch_size or nproc"
    )


def _check_capacity(config: RecsysTrainConfig, facts: _SplitFacts) -> None:
    """Refuse a `ps_capacity_rows` below the rows one batch brings to a shard.

    Such a push fails in every mode (`EmbeddingShard._make_room`): with ps_when_full="error"
    at once, with "evict_lru" because the rows of the push itself cannot be evicted.
    """
    capacity, needed = config.ps_capacity_rows, facts.batch_rows
    if capacity is None or needed is None or capacity >= needed:
        return
    raise ConfigError(
        f"ps_capacity_rows={capacity:,} is below the {needed:,} distinct ids one trainer's "
        f"batch brings to one PS shard in the first steps (batch_size={config.batch_size} "
        f"samples over {len(facts.num_embeddings)} tables of {config.data.dataset}, routed "
        f"over nproc={config.nproc} shards); a push that does not fit stops training with "
        f"KeySpaceFullError, evicting or not: set ps_capacity_rows >= {needed:,} (later "
        "batches may bring more: leave room), lower batch_size, or leave ps_capacity_rows "
        "unset (the tables' declared sizes)"
    )


def _check_budget(config: RecsysTrainConfig, facts: _SplitFacts) -> None:
    """Refuse a PS memory budget below the minimum of the shard's store (its `create`)."""
    capacity = config.ps_capacity_rows or shard_capacity(facts.num_embeddings, config.nproc)
    budget = shard_budget_bytes(config, capacity, facts.num_embeddings)
    if budget is None:
        return
    widths = sorted(set(table_dims(config, len(facts.num_embeddings))))
    if len(widths) > 1:  # one store per width, each at least MIN_BUDGET_BYTES
        floor = MIN_BUDGET_BYTES * len(widths)
        if budget < floor:
            raise ConfigError(
                f"a PS shard budget of {budget:,} bytes is below the {floor:,} its "
                f"{len(widths)} embedding widths {widths} need ({MIN_BUDGET_BYTES:,} bytes per "
                f"width's store); set ps_memory_budget_bytes >= {floor:,}, or use fewer widths"
            )
        return
    spec = RowSpec(embedding_dim=widths[0], optimizer=config.embedding_optimizer)
    shape: dict[str, Any] = {
        "num_rows": capacity,
        "spec": spec,
        "config": EmbeddingStore.Config(
            backend=config.store_backend, staleness_bound=None, use_direct_io=True
        ),
        "key_space": "hashed",
    }
    minimum = EmbeddingStore.minimum_budget_bytes(**shape)
    needs = "per-row maps, I/O buffers and 64 cached rows"
    if facts.batch_rows is not None:  # a lookup reads a batch's rows into the cache at once
        for_batch = EmbeddingStore.budget_for_cached_rows(facts.batch_rows, **shape)
        if for_batch > minimum:
            minimum = for_batch
            needs = (
                f"per-row maps, I/O buffers and a cache of the {facts.batch_rows:,} rows one "
                "trainer's batch reads from a shard in the first steps; later batches may "
                "read more: leave room"
            )
    if budget >= minimum:
        return
    rows_bytes = capacity * spec.row_bytes
    fix = f"set ps_memory_budget_bytes >= {minimum:,}"
    if config.ps_memory_ratio is None:
        given = f"ps_memory_budget_bytes={budget:,}"
    else:
        given = f"ps_memory_ratio={config.ps_memory_ratio:g} gives {budget:,} bytes, which"
        ratio = math.ceil(minimum / rows_bytes * 1e4) / 1e4
        while int(ratio * rows_bytes) < minimum:  # shard_budget_bytes rounds down
            ratio += 1e-4
        if ratio <= 1:
            fix = f"set ps_memory_ratio >= {ratio:.4g} or ps_memory_budget_bytes >= {minimum:,}"
        else:
            fix += (
                f" (a ratio would need {ratio:.3g} > 1: rows this narrow cost more in the "
                "per-row maps than in data)"
            )
    raise ConfigError(
        f"{given} is below the {minimum:,} bytes each PS shard's store needs for its "
        f"{capacity:,} rows of {spec.row_bytes} B ({needs}); {fix}, or leave both unset to "
        "hold every row in RAM"
    )


def check_run(config: RecsysTrainConfig) -> None:
    """Refuse, before any process starts, settings the trainers would fail on.

    The feature names and pooling modes fit the data; the checkpoint folder can be used
    (a fresh run does not replace an earlier run's checkpoints, a resume matches them); the
    training split holds one step (batch_size x nproc samples; not checked on a resume,
    which keeps its checkpoint's length); a set `ps_capacity_rows` holds the rows one batch
    brings to a shard in the first steps (`max_batch_rows`); a PS memory budget is at least
    its store's minimum (`EmbeddingStore.minimum_budget_bytes`).

    Args:
        config: The training run (its dataset is loaded; the facts checked are cached).

    Raises:
        ConfigError: Naming the setting, the value that is accepted and the fix.
    """
    _check_features(config)
    _check_checkpoint_dir(config)
    facts = _split_facts(
        config.data, config.batch_size, config.nproc, config.seed, config.max_steps
    )
    latest = None if config.checkpoint_dir is None else Path(config.checkpoint_dir) / "LATEST"
    if not (config.resume and latest is not None and latest.is_file()):
        _check_one_step(config, facts)
    _check_capacity(config, facts)
    _check_budget(config, facts)


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
        ConfigError: If the settings would fail in the trainers (`check_run`).
        RecsysError: If the job fails or times out (the failed ranks and their errors are in
            the message).
    """
    return launch_runs([(config, out_dir)], out_dir, timeout_s=timeout_s, force=force)[0]


CHECKPOINT_LOCK = "JOB.lock"
"""File in a `checkpoint_dir` a running job holds locked (flock; its pid inside)."""


@contextlib.contextmanager
def _hold_checkpoint_dirs(configs: list[RecsysTrainConfig]) -> Iterator[None]:
    """Hold every run's `checkpoint_dir` for the job: a second job writing there is refused.

    An exclusive `flock` on `checkpoint_dir/JOB.lock`, released when the job ends (or its
    launcher dies: the kernel drops the lock with the process).

    Raises:
        ConfigError: If another job holds one of the folders (names its process).
    """
    held: list[int] = []
    try:
        folders = dict.fromkeys(
            Path(c.checkpoint_dir).resolve() for c in configs if c.checkpoint_dir is not None
        )
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
            fd = lock_file(folder / CHECKPOINT_LOCK)
            if isinstance(fd, str):
                raise ConfigError(
                    f"checkpoint_dir={folder} is in use by another training job (process "
                    f"{fd}); two jobs writing one checkpoint chain would break it: wait for "
                    "that job to end, or give this one another checkpoint_dir"
                )
            held.append(fd)
        yield
    finally:
        for fd in held:
            os.close(fd)  # releases the lock


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
        ValueError: If `runs` is empty or the configs disagree on `nproc`.
        ConfigError: If a run's settings would fail in the trainers (`check_run`).
        RecsysError: If the job fails or times out (the failed ranks and their errors are in
            the message).
    """
    if not runs:
        raise ValueError("runs is empty; give at least one (config, out_dir)")
    nprocs = {config.nproc for config, _ in runs}
    if len(nprocs) != 1:
        raise ValueError(f"runs of one job need one nproc, got {sorted(nprocs)}; split the job")
    for run_config, _ in runs:
        check_run(run_config)
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
    with _hold_checkpoint_dirs([c for c, _ in runs]):
        job_dir.mkdir(parents=True, exist_ok=True)
        for _, out_dir in runs:
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "result.json").unlink(missing_ok=True)
        job = {"runs": [{"config": config_to_dict(c), "out_dir": str(d)} for c, d in runs]}
        config_path.write_text(json.dumps(job, indent=1) + "\n")
        try:
            result = run_torchrun(launch)
        finally:  # a killed trainer leaves its shard's rows (the table's size) behind; the
            for _, out_dir in runs:  # next job rebuilds them from checkpoints anyway
                shutil.rmtree(out_dir / "ps", ignore_errors=True)
    missing = [d for _, d in runs if not (d / "result.json").exists()]
    if not result.ok or missing:
        why = result.failure_message() or f"no result.json in {[str(d) for d in missing]}"
        raise RecsysError(f"recsys training ({config.mode}) failed: {why}")
    results: list[dict[str, Any]] = [json.loads((d / "result.json").read_text()) for _, d in runs]
    return results
