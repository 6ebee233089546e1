"""The recsys job's memory estimate: each part by hand, and a shard's part against a real one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from frugal.recsys.batch import RecsysData
from frugal.recsys.config import RecsysTrainConfig
from frugal.recsys.datasets import load_recsys_data
from frugal.recsys.launch import TRAINER_BASELINE_BYTES, memory_estimate
from frugal.recsys.ps import EmbeddingShard, shard_capacity, shard_memory_bytes


def test_a_shards_estimate_is_its_store_budget_and_row_clocks(tmp_path: Path) -> None:
    config = EmbeddingShard.Config(embedding_dim=8)
    shard = EmbeddingShard(tmp_path / "shard", (1000, 500), config, capacity_rows=900)
    try:
        row_bytes = 4 * shard.row_widths[0]
        (group,) = shard.groups  # one width: one store
        held = (
            group.store.config.memory_budget_bytes  # the store's budget and its key map
            + group._versions.nbytes
            + group._last_push.nbytes
            + group._changed.nbytes
        )
        assert shard_memory_bytes(900, row_bytes) == held
    finally:
        shard.close()


def test_a_splits_bytes_count_every_array() -> None:
    data = RecsysData(
        keys=("a", "b"),
        num_embeddings=(10, 20),
        values=(np.arange(3, dtype=np.int64), np.arange(5, dtype=np.int64)),
        offsets=(np.array([0, 1, 3], dtype=np.int64), np.array([0, 2, 5], dtype=np.int64)),
        dense=np.zeros((2, 4), dtype=np.float32),
        labels=np.zeros(2, dtype=np.float32),
    )
    assert data.nbytes == (3 + 5 + 3 + 3) * 8 + (2 * 4 + 2) * 4


def test_the_job_estimate_has_each_part_by_hand() -> None:
    config = RecsysTrainConfig(nproc=3, embedding_dim=8)
    train, test = load_recsys_data(config.data)
    data_bytes = train.nbytes + test.nbytes
    capacity = shard_capacity(train.num_embeddings, 3)
    row_bytes = 4 * (8 + 1)  # rowwise Adagrad keeps one state value per row
    assert dict(memory_estimate(config).terms) == {
        "3 trainers x 580 MiB": 3 * TRAINER_BASELINE_BYTES,
        "3 copies of the movielens100k data": 3 * data_bytes,
        f"3 PS shards of {capacity:,} rows x {row_bytes} B": 3
        * shard_memory_bytes(capacity, row_bytes),
    }


def test_recsys_train_refuses_tables_over_the_machines_memory_before_starting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from frugal.cli.main import main

    out = tmp_path / "out"
    # MovieLens's 3,056 ids with 2M-wide rows: about 22 GiB a shard, two shards.
    argv = ["recsys", "train", "--out", str(out), "--set", "embedding_dim=2000000"]
    assert main(argv) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "PS shards of" in error and "pass --force (or set FRUGAL_FORCE=1)" in error
    assert not (out / "job.json").exists() and not (out / "logs").exists()  # nothing started
