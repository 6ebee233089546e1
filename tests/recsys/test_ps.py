"""Sharding, dedup and version-clock invariants of the embedding PS."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from frugal.recsys.batch import KJTBatch
from frugal.recsys.client import EmbeddingClient
from frugal.recsys.config import staleness_bound
from frugal.recsys.ps import (
    NUM_VIRTUAL_SHARDS,
    EmbeddingShard,
    default_owners,
    virtual_shard,
)
from frugal.recsys.transport import LocalTransport, ShardServer


def _batch() -> KJTBatch:
    # feature a: bags [3, 3, 7], [], [7]; feature b: bags [3], [5, 5], [900]
    return KJTBatch(
        keys=("a", "b"),
        values=np.array([3, 3, 7, 7, 3, 5, 5, 900], np.int64),
        lengths=np.array([3, 0, 1, 1, 2, 1], np.int32),
        dense=np.zeros((3, 0), np.float32),
        labels=np.zeros(3, np.float32),
        batch_id=0,
    )


def test_virtual_shards_are_stable_and_in_range() -> None:
    ids = np.arange(100_000, dtype=np.int64)
    vshard = virtual_shard(0, ids)
    assert vshard.min() >= 0 and vshard.max() < NUM_VIRTUAL_SHARDS
    counts = np.bincount(vshard, minlength=NUM_VIRTUAL_SHARDS)
    assert counts.min() > 40 and counts.max() < 160  # ~98 per vshard: hashed, not clustered
    assert not np.array_equal(vshard, virtual_shard(1, ids))  # the table is part of the key
    np.testing.assert_array_equal(vshard, virtual_shard(0, ids.copy()))  # deterministic
    owners = default_owners(3)
    assert np.bincount(owners).tolist() == [342, 341, 341]
    with pytest.raises(ValueError, match="num_shards=0"):
        default_owners(0)


def test_route_dedups_per_table_and_sends_each_pair_to_its_owner() -> None:
    owners = default_owners(2)
    client = EmbeddingClient(LocalTransport([], timeout_s=1), owners, 2, 4)
    batch = _batch()
    pending = client.route(batch)
    # unique pairs: a:{3, 7}, b:{3, 5, 900}
    assert pending.unique_tables.tolist() == [0, 0, 1, 1, 1]
    assert pending.unique_ids.tolist() == [3, 7, 3, 5, 900]
    # every value maps back to its own (table, id)
    feature_of_value = np.repeat([0, 1], [4, 4])
    inv = pending.inverse.numpy()
    np.testing.assert_array_equal(pending.unique_ids[inv], batch.values)
    np.testing.assert_array_equal(pending.unique_tables[inv], feature_of_value)
    # each owner gets exactly the pairs whose vshard it owns, grouped by table
    seen = 0
    for p, (lo, hi) in pending.owner_slices.items():
        rows = pending.owner_order[lo:hi]
        for t, i in zip(pending.unique_tables[rows], pending.unique_ids[rows], strict=True):
            assert owners[virtual_shard(int(t), np.array([i]))[0]] == p
        assert (np.diff(pending.unique_tables[rows]) >= 0).all()
        assert pending.owner_counts[p].sum() == hi - lo
        seen += hi - lo
    assert seen == 5


def test_pooling_sums_bags_and_empty_bags_are_zero(tmp_path: Path) -> None:
    config = EmbeddingShard.Config(embedding_dim=4)
    shards = [EmbeddingShard(tmp_path / f"s{p}", (1000, 1000), config) for p in range(2)]
    transport = LocalTransport([ShardServer(s, None, 0.0) for s in shards], timeout_s=5)
    client = EmbeddingClient(transport, default_owners(2), 2, 4, "float32")
    try:
        result = client.wait(client.lookup(_batch()))
        pooled = client.pool(result)  # (B=3, F=2, E=4)
        rows = {
            (int(t), int(i)): result.rows[u]
            for u, (t, i) in enumerate(
                zip(result.pending.unique_tables, result.pending.unique_ids, strict=True)
            )
        }
        torch.testing.assert_close(pooled[0, 0], 2 * rows[(0, 3)] + rows[(0, 7)])
        torch.testing.assert_close(pooled[1, 0], torch.zeros(4))
        torch.testing.assert_close(pooled[1, 1], 2 * rows[(1, 5)])
        torch.testing.assert_close(pooled[2, 1], rows[(1, 900)])
        # the same id in two tables is two different rows
        assert not torch.equal(rows[(0, 3)], rows[(1, 3)])
    finally:
        transport.close()
        for s in shards:
            s.close()


def test_version_clocks_measure_the_real_lag(tmp_path: Path) -> None:
    shard = EmbeddingShard(tmp_path / "s", (10,), EmbeddingShard.Config(embedding_dim=2))
    try:
        ids = torch.tensor([1, 4])
        counts = torch.tensor([2])
        _, versions_read = shard.lookup(ids, counts)
        assert versions_read.tolist() == [0, 0]
        grad = torch.ones(2, 2, dtype=torch.float16)
        # three other pushes touch row 1, one touches row 4, before our own push lands
        for _ in range(3):
            assert (
                shard.push(
                    torch.tensor([1]), counts.new_tensor([1]), grad[:1], torch.tensor([0]), 1.0, 0
                )
                >= 0
            )
        shard.push(torch.tensor([4]), counts.new_tensor([1]), grad[:1], torch.tensor([0]), 1.0, 0)
        lag = shard.push(ids, counts, grad, versions_read, 1.0, 1)
        assert lag == 3
        stats = shard.stats()
        # lags recorded: 0, 1, 2 (the three pushes to row 1), 0 (row 4), then 3 and 1
        assert stats["lag_hist"][:4] == [2, 2, 1, 1]
        assert stats["lag_max"] == 3
        assert stats["updates_applied"] == [6]
        _, after = shard.lookup(ids, counts)
        assert after.tolist() == [4, 2]
    finally:
        shard.close()


def test_fp16_wire_scale_is_divided_out(tmp_path: Path) -> None:
    config = EmbeddingShard.Config(
        embedding_dim=2,
        optimizer=__import__("frugal.store", fromlist=["OptimizerConfig"]).OptimizerConfig(
            kind="sgd", lr=1.0
        ),
    )
    shard = EmbeddingShard(tmp_path / "s", (4,), config)
    try:
        ids, counts = torch.tensor([2]), torch.tensor([1])
        before = shard.peek_table(0, np.array([2]))
        grad = torch.tensor([[0.25, -0.5]]) * 1024.0
        shard.push(ids, counts, grad.to(torch.float16), torch.tensor([0]), 1024.0, 0)
        after = shard.peek_table(0, np.array([2]))
        np.testing.assert_allclose(after - before, [[-0.25, 0.5]], rtol=1e-6)
    finally:
        shard.close()


def test_staleness_bounds_by_mode() -> None:
    assert staleness_bound("sync", 8, 2) == 1
    assert staleness_bound("hybrid", 1, 1) == 0  # K = 1, one trainer: never stale
    assert staleness_bound("hybrid", 4, 2) == 3 + 12
    assert staleness_bound("async", 16, 2) == 15 + 49
