"""Launch a training job: N trainer processes under torchrun on 127.0.0.1, with a timeout.

torchrun (`python -m torch.distributed.run`) runs a c10d rendezvous on a free loopback port;
the same trainer module runs unchanged under a multi-machine torchrun command line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from frugal.config import ConfigError, config_to_dict
from frugal.launch import TorchrunJob, run_torchrun
from frugal.recsys.config import RecsysTrainConfig
from frugal.recsys.datasets import load_recsys_data
from frugal.recsys.errors import RecsysError

__all__ = ["launch_runs", "launch_training"]


def _check_features(config: RecsysTrainConfig) -> None:
    """Refuse a config whose feature names differ from the data's, before any process starts."""
    if config.features is None:
        return
    train, _ = load_recsys_data(config.data)
    if tuple(config.features) != train.keys:
        raise ConfigError(
            f"features={list(config.features)} do not match {config.data.dataset}'s features "
            f"{list(train.keys)}; fix the config's features list"
        )


def launch_training(
    config: RecsysTrainConfig, out_dir: Path, *, timeout_s: float = 600.0
) -> dict[str, Any]:
    """Run `config` as `config.nproc` torchrun processes; return rank 0's result.

    Args:
        config: The training run.
        out_dir: Folder for `job.json`, `result.json`, the per-rank logs and PS files.
        timeout_s: Wall-clock limit of the whole job; the process group is killed after it.

    Returns:
        The content of `result.json`.

    Raises:
        RecsysError: If the job fails or times out (the failed ranks and their errors are in
            the message).
    """
    return launch_runs([(config, out_dir)], out_dir, timeout_s=timeout_s)[0]


def launch_runs(
    runs: list[tuple[RecsysTrainConfig, Path]], job_dir: Path, *, timeout_s: float = 600.0
) -> list[dict[str, Any]]:
    """Run several trainings one after the other in one torchrun job (one process group).

    Args:
        runs: (config, out_dir) pairs; every config must have the same `nproc`.
        job_dir: Folder for `job.json` and the per-rank logs (`logs/`).
        timeout_s: Wall-clock limit of the whole job.

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
    config = runs[0][0]
    job_dir.mkdir(parents=True, exist_ok=True)
    for _, out_dir in runs:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "result.json").unlink(missing_ok=True)
    config_path = job_dir / "job.json"
    job = {"runs": [{"config": config_to_dict(c), "out_dir": str(d)} for c, d in runs]}
    config_path.write_text(json.dumps(job, indent=1) + "\n")
    result = run_torchrun(
        TorchrunJob(
            target=["frugal.recsys.trainer", str(config_path)],
            nproc=config.nproc,
            timeout_s=timeout_s,
            max_restarts=max(c.max_restarts for c, _ in runs),
            env={"PYTHONWARNINGS": "ignore"},
            log_dir=job_dir / "logs",
        )
    )
    missing = [d for _, d in runs if not (d / "result.json").exists()]
    if not result.ok or missing:
        why = result.failure_message() or f"no result.json in {[str(d) for d in missing]}"
        raise RecsysError(f"recsys training ({config.mode}) failed: {why}")
    results: list[dict[str, Any]] = [json.loads((d / "result.json").read_text()) for _, d in runs]
    return results
