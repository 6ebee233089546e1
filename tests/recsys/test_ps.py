"""Sharding, dedup and version-clock invariants of the embedding PS."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from frugal.recsys.batch import KJTBatch
from frugal.recsys.client import EmbeddingClient
from frugal.recsys.config import (
    RecsysTrainConfig,
    prefetch_depth,
    shard_budget_bytes,
    staleness_bound,
)
from frugal.recsys.errors import PSUnavailableError
from frugal.recsys.ps import (
    NUM_VIRTUAL_SHARDS,
    EmbeddingShard,
    default_owners,
    shard_capacity,
    virtual_shard,
)
from frugal.recsys.transport import LocalTransport, ShardServer
from frugal.store import KeySpaceFullError, OptimizerConfig


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
            (int(t), int(i)): result.rows[0][u]  # one width: rows[0] holds every pair
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


def test_mean_and_max_pooling_per_table_and_their_gradients(tmp_path: Path) -> None:
    shard = EmbeddingShard(tmp_path / "s", (1000, 1000), EmbeddingShard.Config(embedding_dim=4))
    transport = LocalTransport([ShardServer(shard, None, 0.0)], timeout_s=5)
    client = EmbeddingClient(transport, default_owners(1), 2, 4, "float32", pooling=("mean", "max"))
    try:
        result = client.wait(client.lookup(_batch()))
        pooled = client.pool(result)
        rows = {
            (int(t), int(i)): result.rows[0][u]  # one width: rows[0] holds every pair
            for u, (t, i) in enumerate(
                zip(result.pending.unique_tables, result.pending.unique_ids, strict=True)
            )
        }
        # feature a (mean): bag [3, 3, 7] and an empty bag; feature b (max): bag [5, 5]
        torch.testing.assert_close(pooled[0, 0], (2 * rows[(0, 3)] + rows[(0, 7)]) / 3)
        torch.testing.assert_close(pooled[1, 0], torch.zeros(4))
        torch.testing.assert_close(pooled[1, 1], rows[(1, 5)])
        torch.testing.assert_close(pooled[0, 1], rows[(1, 3)])
        # max's gradient flows to the row it took (one-id bag [900])
        pooled[2, 1].sum().backward()
        assert result.rows[0].grad is not None
        u = next(k for k, key in enumerate(rows) if key == (1, 900))
        torch.testing.assert_close(result.rows[0].grad[u], torch.ones(4))
        with pytest.raises(ValueError, match="pooling has 3 modes for 2 tables"):
            EmbeddingClient(transport, default_owners(1), 2, 4, pooling=("sum",) * 3)
        with pytest.raises(ValueError, match="pooling mode 'avg'"):
            EmbeddingClient(transport, default_owners(1), 2, 4, pooling=("avg",))
    finally:
        transport.close()
        shard.close()
    with pytest.raises(ValueError, match=r"pooling=\(\) names no mode"):
        RecsysTrainConfig(pooling=())


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
    assert staleness_bound("async", 16, 2) == 15 + 79  # window t - 3K + 1 .. t + 2K - 1
    assert staleness_bound("async", 4, 3) == 3 + 2 * 19


def _adagrad_shard(path: Path, **fields: Any) -> EmbeddingShard:
    config = EmbeddingShard.Config(embedding_dim=2, **fields)
    return EmbeddingShard(path, (8,), config)


def test_sequenced_pushes_apply_in_sequence_order(tmp_path: Path) -> None:
    ids, counts = torch.tensor([3]), torch.tensor([1])
    first = torch.tensor([[1.0, -2.0]], dtype=torch.float16)
    second = torch.tensor([[4.0, 0.5]], dtype=torch.float16)
    zero = torch.tensor([0])
    # reference: push 0 then push 1, unsequenced, one thread (row-wise Adagrad: order matters)
    reference = _adagrad_shard(tmp_path / "ref")
    reference.push(ids, counts, first, zero, 1.0, 0)
    reference.push(ids, counts, second, zero, 1.0, 0)
    want = reference.peek_table(0, np.array([3]), cols="all")
    swapped = _adagrad_shard(tmp_path / "swapped")
    swapped.push(ids, counts, second, zero, 1.0, 0)
    swapped.push(ids, counts, first, zero, 1.0, 0)
    assert not np.array_equal(want, swapped.peek_table(0, np.array([3]), cols="all"))
    shard = _adagrad_shard(tmp_path / "s")
    try:
        lags: list[int] = []
        late = threading.Thread(
            target=lambda: lags.append(shard.push(ids, counts, second, zero, 1.0, 0, seq=1))
        )
        late.start()  # arrives first, waits for push 0
        late.join(timeout=0.2)
        assert late.is_alive() and shard.row_versions(0, np.array([3])).tolist() == [0]
        assert shard.push(ids, counts, first, zero, 1.0, 0, seq=0) == 0
        late.join(timeout=10)
        assert lags == [1]  # push 1 read version 0, applied after push 0
        np.testing.assert_array_equal(shard.peek_table(0, np.array([3]), cols="all"), want)
        # an empty sequenced push only advances the turn
        empty = torch.empty(0, dtype=torch.int64)
        assert shard.push(empty, torch.tensor([0]), torch.empty(0, 2), empty, 1.0, 0, seq=2) == 0
    finally:
        for s in (reference, swapped, shard):
            s.close()


def test_a_sequenced_push_whose_predecessor_never_comes_times_out(tmp_path: Path) -> None:
    shard = _adagrad_shard(tmp_path / "s", timeout_s=0.05)
    try:
        grad = torch.ones(1, 2, dtype=torch.float16)
        with pytest.raises(PSUnavailableError, match=r"sequenced push 1 waited 0\.05 s for push 0"):
            shard.push(torch.tensor([1]), torch.tensor([1]), grad, torch.tensor([0]), 1.0, 0, seq=1)
        assert shard.row_versions(0, np.array([1])).tolist() == [0]  # nothing applied
    finally:
        shard.close()


def test_hashed_keys_take_any_id_below_2_56_up_to_the_capacity(tmp_path: Path) -> None:
    config = EmbeddingShard.Config(embedding_dim=2)
    shard = EmbeddingShard(tmp_path / "s", (4, 4), config, capacity_rows=3)
    try:
        big = np.array([(1 << 56) - 1, 123_456_789_012], dtype=np.int64)
        before = shard.peek_table(1, big)
        assert shard.peek_table(0, big[:1]).tolist() != before[:1].tolist()  # keyed by table
        grad = torch.ones(2, 2, dtype=torch.float16)
        unread = torch.zeros(2, dtype=torch.int64)
        shard.push(torch.from_numpy(big), torch.tensor([0, 2]), grad, unread, 1.0, 0)
        assert shard.row_versions(1, big).tolist() == [1, 1]
        assert shard.row_versions(0, big).tolist() == [0, 0]  # table 0's rows untouched
        assert not np.array_equal(shard.peek_table(1, big), before)
        assert shard.stats()["updates_applied"] == [0, 2]
        (ids0, _, _, _), (ids1, rows1, v1, last1) = shard.updated_rows()
        assert len(ids0) == 0 and sorted(ids1.tolist()) == sorted(big.tolist())
        assert rows1.shape == (2, shard.row_widths[1]) and v1.tolist() == [1, 1]
        assert last1.tolist() == [0, 0]  # pushed at step 0
        with pytest.raises(ValueError, match=r"id 72057594037927936 is outside \[0, 2\^56\)"):
            shard.lookup(torch.tensor([1 << 56]), torch.tensor([1, 0]))
        with pytest.raises(KeySpaceFullError):  # a third and fourth new row: capacity 3
            shard.push(torch.tensor([5, 6]), torch.tensor([2, 0]), grad, unread, 1.0, 0)
    finally:
        shard.close()


def test_shard_capacity_leaves_slack_and_never_exceeds_the_tables() -> None:
    assert shard_capacity((1000, 2), 1) == 1002
    assert shard_capacity((100_000, 2), 2) == 100_002 * 5 // 8 + 1024
    with pytest.raises(ValueError, match="num_shards=0"):
        shard_capacity((10,), 0)


def test_prefetch_depth_is_capped_by_k_and_async_runs_ahead_k() -> None:
    assert prefetch_depth(RecsysTrainConfig(mode="hybrid", staleness=16)) == 1
    assert prefetch_depth(RecsysTrainConfig(mode="hybrid", staleness=16, prefetch_depth=3)) == 3
    assert prefetch_depth(RecsysTrainConfig(mode="hybrid", staleness=2, prefetch_depth=3)) == 2
    assert prefetch_depth(RecsysTrainConfig(mode="hybrid", staleness=16, prefetch_depth=None)) == 16
    assert prefetch_depth(RecsysTrainConfig(mode="async", staleness=16)) == 16
    assert prefetch_depth(RecsysTrainConfig(mode="sync")) == 1
    with pytest.raises(ValueError, match=r"prefetch_depth=0 must be >= 1 \(lookups started ahead"):
        RecsysTrainConfig(prefetch_depth=0)


TABLES = (40_000, 40_000)


def _push_rounds(shard: EmbeddingShard, rounds: int, seed: int) -> None:
    """Deterministic pushes: 300 rows of each of the two tables a round, each read first."""
    rng = np.random.default_rng(seed)
    for step in range(rounds):
        ids = [np.sort(rng.choice(TABLES[0], size=300, replace=False)) for _ in TABLES]
        ids_t = torch.from_numpy(np.concatenate(ids).astype(np.int64))
        counts = torch.tensor([300, 300])
        _, versions = shard.lookup(ids_t, counts, torch.float32, step=step)
        grads = torch.from_numpy(rng.standard_normal((600, 8)).astype(np.float32))
        shard.push(ids_t, counts, grads, versions, 1.0, step)


def _minimum_budget(directory: Path) -> int:
    """The budget the store names as the least for a shard over TABLES."""
    config = EmbeddingShard.Config(embedding_dim=8, backend="file", memory_budget_bytes=1)
    with pytest.raises(ValueError, match=r"set it to at least (\d+)") as info:
        EmbeddingShard(directory, TABLES, config)
    return int(str(info.value).rsplit(" ", 1)[1])


def _out_of_core_shard(directory: Path) -> EmbeddingShard:
    """A shard whose cache holds about 10% of its 80,000 rows (36 B each)."""
    budget = _minimum_budget(directory / "probe") + 80_000 * 36 // 10
    config = EmbeddingShard.Config(embedding_dim=8, backend="file", memory_budget_bytes=budget)
    return EmbeddingShard(directory / "shard", TABLES, config)


def test_an_out_of_core_shard_trains_the_same_rows_as_one_in_ram(tmp_path: Path) -> None:
    # Most rows live on disk (direct I/O where the file system has it) and come back through
    # the cache; every row must end bit-identical to the in-RAM shard's.
    in_ram = EmbeddingShard(tmp_path / "ram", TABLES, EmbeddingShard.Config(embedding_dim=8))
    on_disk = _out_of_core_shard(tmp_path / "disk")
    try:
        for shard in (in_ram, on_disk):
            _push_rounds(shard, 40, seed=7)
        stats = on_disk.stats()["store"]
        assert stats["capacity_rows"] < 80_000 // 5  # the cache cannot hold the table
        assert stats["misses"] > 0 and stats["bytes_read"] > 0 and stats["bytes_written"] > 0
        assert in_ram.stats()["store"]["bytes_read"] == 0
        ids = np.arange(TABLES[0], dtype=np.int64)
        for table in (0, 1):
            np.testing.assert_array_equal(
                in_ram.peek_table(table, ids, cols="all"), on_disk.peek_table(table, ids, "all")
            )
            np.testing.assert_array_equal(
                in_ram.row_versions(table, ids), on_disk.row_versions(table, ids)
            )
    finally:
        in_ram.close()
        on_disk.close()


def test_lookahead_hints_prefetch_the_rows_of_a_coming_lookup(tmp_path: Path) -> None:
    shard = _out_of_core_shard(tmp_path)
    try:
        _push_rounds(shard, 40, seed=8)  # 24,000 row updates: most rows evicted to disk
        written = np.flatnonzero(shard.row_versions(0, np.arange(TABLES[0])) > 0)[:200]
        ids = torch.from_numpy(written.astype(np.int64))
        counts = torch.tensor([len(ids), 0])
        expected, _ = shard.lookup(ids, counts, torch.float32)  # an untracked read
        before = shard.stats()["store"]
        shard.lookahead(ids, counts, step=100)
        shard.lookahead(torch.tensor([39_999]), torch.tensor([0, 1]), step=100)  # never written
        deadline = time.monotonic() + 30
        while shard.stats()["store"]["prefetched"] == before["prefetched"]:
            assert time.monotonic() < deadline, "the hint prefetched nothing"
            time.sleep(0.01)
        rows, _ = shard.lookup(ids, counts, torch.float32, step=100)
        after = shard.stats()["store"]
        torch.testing.assert_close(rows, expected, rtol=0, atol=0)
        assert after["prefetched"] > before["prefetched"]
        assert after["hits"] - before["hits"] == len(ids)  # every row was resident or loading
        assert after["misses"] == before["misses"]
    finally:
        shard.close()


def test_a_shard_budget_below_the_minimum_names_one_that_is_accepted(tmp_path: Path) -> None:
    minimum = _minimum_budget(tmp_path / "a")
    config = EmbeddingShard.Config(embedding_dim=8, backend="file", memory_budget_bytes=minimum)
    EmbeddingShard(tmp_path / "b", TABLES, config).close()


def test_ps_budget_settings_are_checked() -> None:
    with pytest.raises(ValueError, match=r"needs backend='file' \(backend='memory' keeps"):
        EmbeddingShard.Config(memory_budget_bytes=1 << 20)
    with pytest.raises(ValueError, match=r"set store_backend = \"file\""):
        RecsysTrainConfig(ps_memory_ratio=0.1)
    with pytest.raises(ValueError, match="name the same budget; give one of them"):
        RecsysTrainConfig(store_backend="file", ps_memory_ratio=0.1, ps_memory_budget_bytes=9)
    with pytest.raises(ValueError, match=r"ps_memory_ratio=1.5 must be in \(0, 1\]"):
        RecsysTrainConfig(store_backend="file", ps_memory_ratio=1.5)
    with pytest.raises(ValueError, match="ps_lookahead=-1 must be >= 0"):
        RecsysTrainConfig(ps_lookahead=-1)
    config = RecsysTrainConfig(store_backend="file", ps_memory_ratio=0.25, embedding_dim=8)
    # 1,000 rows of 8 floats + row-wise Adagrad's 1: 36 B each
    assert shard_budget_bytes(config, 1000, (5000, 3000)) == 9000
    assert shard_budget_bytes(RecsysTrainConfig(), 1000, (5000, 3000)) is None
    # per-table widths 8 and 24 (rows of 36 and 100 B): the 1,000 rows split 5:3 by declared
    # sizes, 625 x 36 + 375 x 100 = 60,000 B, a quarter of it
    wide = RecsysTrainConfig(store_backend="file", ps_memory_ratio=0.25, embedding_dims=(8, 24))
    assert shard_budget_bytes(wide, 1000, (5000, 3000)) == 15000


def _push(
    shard: EmbeddingShard, ids: list[int], step: int, versions: list[int] | None = None
) -> int:
    """Push a gradient of ones for `ids` of table 0 at `step`; return the largest lag."""
    read = torch.tensor(versions if versions is not None else [0] * len(ids), dtype=torch.int64)
    grads = torch.ones(len(ids), shard.config.embedding_dim)
    return shard.push(torch.tensor(ids), torch.tensor([len(ids)]), grads, read, 1.0, step)


def test_expiry_and_lru_eviction_follow_a_hand_computed_trace(tmp_path: Path) -> None:
    sgd = OptimizerConfig(kind="sgd", lr=0.5)
    config = EmbeddingShard.Config(
        embedding_dim=2, optimizer=sgd, expire_after_steps=3, when_full="evict_lru"
    )
    shard = EmbeddingShard(tmp_path / "s", (100,), config, capacity_rows=4)
    fresh = EmbeddingShard(
        tmp_path / "f", (100,), EmbeddingShard.Config(embedding_dim=2, optimizer=sgd)
    )
    try:
        initial = fresh.peek_table(0, np.arange(10))

        def live() -> dict[int, int]:
            ids, _, _, last = shard.updated_rows()[0]
            return dict(zip(ids.tolist(), last.tolist(), strict=True))

        _push(shard, [1, 2], 0)
        _push(shard, [3], 1)
        _push(shard, [1, 4], 2)
        assert live() == {1: 2, 2: 0, 3: 1, 4: 2}  # full: 4 of 4 rows
        # Step 3: nothing is older than 3 - 3 = 0; id 5 needs a row: the least recently
        # pushed one goes (id 2, last pushed at 0).
        _push(shard, [5], 3)
        assert live() == {1: 2, 3: 1, 4: 2, 5: 3}
        assert (shard.stats()["evicted_rows"], shard.stats()["expired_rows"]) == (1, 0)
        # Step 5: id 3 (last pushed at 1 < 5 - 3) expires; id 2 comes back fresh.
        assert _push(shard, [2], 5, versions=[1]) == 0  # read before its deletion: lag 0
        assert live() == {1: 2, 4: 2, 5: 3, 2: 5}
        assert shard.stats()["expired_rows"] == 1
        np.testing.assert_array_equal(shard.peek_table(0, np.array([3])), initial[[3]])
        np.testing.assert_array_equal(shard.peek_table(0, np.array([2])), initial[[2]] - 0.5)
        assert shard.row_versions(0, np.array([1, 2, 3])).tolist() == [2, 1, 0]
        # Step 9: everything is older than 9 - 3 = 6.
        _push(shard, [6], 9)
        assert live() == {6: 9}
        stats = shard.stats()
        assert (stats["expired_rows"], stats["evicted_rows"], stats["live_rows"]) == (5, 1, 1)
        assert stats["updates_applied"] == [8]  # every update ever applied, deleted rows too
    finally:
        shard.close()
        fresh.close()


def test_a_full_shard_without_eviction_names_the_settings_that_help(tmp_path: Path) -> None:
    shard = EmbeddingShard(
        tmp_path / "s", (100,), EmbeddingShard.Config(embedding_dim=2), capacity_rows=2
    )
    try:
        _push(shard, [1, 2], 0)
        with pytest.raises(KeySpaceFullError, match='when_full="evict_lru"'):
            _push(shard, [3], 1)
        assert shard.updated_rows()[0][0].tolist() == [1, 2]  # nothing lost
    finally:
        shard.close()
    with pytest.raises(ValueError, match="expire_after_steps=0 must be >= 1"):
        EmbeddingShard.Config(expire_after_steps=0)


def test_a_checkpoint_keeps_last_pushes_and_an_older_one_restarts_expiry(tmp_path: Path) -> None:
    from frugal.recsys.checkpoint import export_shard_rows, import_shard_rows

    config = EmbeddingShard.Config(embedding_dim=2, expire_after_steps=4)
    shard = EmbeddingShard(tmp_path / "a", (100,), config)
    path = tmp_path / "shard0.npz"
    try:
        _push(shard, [1, 2], 3)
        _push(shard, [2], 7)
        export_shard_rows(shard, path)
        expected = shard.updated_rows()[0]
    finally:
        shard.close()
    restored = EmbeddingShard(tmp_path / "b", (100,), config)
    try:
        assert import_shard_rows(restored, default_owners(1), 0, [path], step=50) == 2
        for got, want in zip(restored.updated_rows()[0], expected, strict=True):
            np.testing.assert_array_equal(got, want)
        _push(restored, [9], 8)  # id 1 (last pushed at 3 < 8 - 4) expires as it would have
        assert restored.updated_rows()[0][0].tolist() == [2, 9]
    finally:
        restored.close()
    with np.load(path) as data:  # a file from before expiry existed: no last pushes
        np.savez(tmp_path / "old.npz", **{k: data[k] for k in data.files if "last_push" not in k})
    older = EmbeddingShard(tmp_path / "c", (100,), config)
    try:
        import_shard_rows(older, default_owners(1), 0, [tmp_path / "old.npz"], step=50)
        assert older.updated_rows()[0][3].tolist() == [50, 50]
    finally:
        older.close()


def test_a_checkpoint_restores_the_admission_counts_and_the_expiry_schedule(
    tmp_path: Path,
) -> None:
    """A restored shard decides admission and expiry as the original goes on to."""
    from frugal.recsys.checkpoint import export_shard_rows, import_shard_rows

    config = EmbeddingShard.Config(
        embedding_dim=2, admit_after=3, admission_sketch_width=64, expire_after_steps=16
    )
    original = EmbeddingShard(tmp_path / "a", (100,), config)
    restored = EmbeddingShard(tmp_path / "b", (100,), config)
    merged = EmbeddingShard(tmp_path / "c", (100,), config)
    try:
        for step, ids in enumerate([[1, 2], [1, 3], [2, 3], [4]]):
            _push(original, ids, step)
        path = tmp_path / "shard0.npz"
        export_shard_rows(original, path)
        import_shard_rows(restored, default_owners(1), 0, [path])
        # scans every 16 // 8 = 2 steps: at 0 and 2, the next at 4
        assert restored.policy_state()["expiry_check"].tolist() == [4]
        np.testing.assert_array_equal(
            restored.policy_state()["sketch"], original.policy_state()["sketch"]
        )
        # Ids 1, 2, 3 were pushed twice: their third push is admitted in both; 5 is not.
        for shard in (original, restored):
            _push(shard, [1, 5], 4)
        assert restored.updated_rows()[0][0].tolist() == original.updated_rows()[0][0].tolist()
        assert restored.updated_rows()[0][0].tolist() == [1]
        # Two old shards' files onto one shard: the counters add up (admission never later).
        import_shard_rows(merged, default_owners(1), 0, [path, path])
        sketch = merged.policy_state()["sketch"].astype(np.int64)
        np.testing.assert_array_equal(sketch, 2 * original_sketch_before(path))
    finally:
        for shard in (original, restored, merged):
            shard.close()


def original_sketch_before(path: Path) -> np.ndarray:
    """The sketch a shard file recorded."""
    with np.load(path) as data:
        return data["sketch"].astype(np.int64)
