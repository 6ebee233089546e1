"""Hybrid sync/async recommender training (Persia, KDD 2022, arXiv 2111.05897).

Embedding tables live on parameter-server shards backed by `frugal.store` and train
asynchronously with a bounded, measured staleness; the dense network trains synchronously
(AllReduce every step). `launch_training` runs a job under torchrun; the benchmark comparing
sync, hybrid and async side by side is `frugal.bench.recsys`. The trainer module
(`frugal.recsys.trainer`) is what each torchrun process runs. Checkpoints are full or
incremental (`frugal.recsys.checkpoint`); `Snapshot` serves one read-only (embedding
lookups, click predictions).
"""

from frugal.recsys.config import Mode, RecsysTrainConfig, staleness_bound
from frugal.recsys.datasets import RecsysDataConfig, load_recsys_data
from frugal.recsys.errors import (
    BadBatchError,
    PSUnavailableError,
    RecsysError,
    StalenessBoundError,
)
from frugal.recsys.launch import launch_runs, launch_training
from frugal.recsys.serving import Snapshot

__all__ = [
    "BadBatchError",
    "Mode",
    "PSUnavailableError",
    "RecsysDataConfig",
    "RecsysError",
    "RecsysTrainConfig",
    "Snapshot",
    "StalenessBoundError",
    "launch_runs",
    "launch_training",
    "load_recsys_data",
    "staleness_bound",
]
