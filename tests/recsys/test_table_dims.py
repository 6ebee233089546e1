"""Per-table embedding widths: one store per width in a PS shard, pooled side by side."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from frugal.config import ConfigError
from frugal.recsys.client import EmbeddingClient
from frugal.recsys.config import RecsysTrainConfig, table_dims
from frugal.recsys.datasets import RecsysDataConfig
from frugal.recsys.launch import _check_features
from frugal.recsys.models import DLRM, WideDeepMLP
from frugal.recsys.ps import (
    EmbeddingShard,
    _split_budget,
    default_owners,
    split_capacity,
    virtual_shard,
)
from frugal.recsys.shard_files import import_shard_rows, write_shard_file
from frugal.recsys.transport import LocalTransport, ShardServer
from tests.recsys.test_ps import _batch  # a: [3, 3, 7], [], [7]; b: [3], [5, 5], [900]

TABLES = (1000, 400, 600)
DIMS = (4, 8, 4)  # tables 0 and 2 share the width-4 store


def _grads(rng: np.random.Generator, ids: np.ndarray, dims: list[int]) -> list[np.ndarray]:
    return [rng.standard_normal((n, d)).astype(np.float32) for n, d in zip(ids, dims, strict=True)]


def test_a_shard_of_several_widths_equals_one_shard_per_width(tmp_path: Path) -> None:
    # The reference: a width-4 shard holding tables 0 and 2, a width-8 shard holding table 1.
    config = EmbeddingShard.Config(table_dims=DIMS)
    mixed = EmbeddingShard(tmp_path / "mixed", TABLES, config)
    narrow = EmbeddingShard(tmp_path / "w4", TABLES, EmbeddingShard.Config(embedding_dim=4))
    wide = EmbeddingShard(tmp_path / "w8", TABLES, EmbeddingShard.Config(embedding_dim=8))
    assert [g.config.embedding_dim for g in mixed.groups] == [4, 8]
    assert [g.capacity_rows for g in mixed.groups] == [1600, 400]  # declared rows per width
    assert mixed.row_widths == (5, 9, 5)  # vector + row-wise Adagrad's accumulator
    assert sorted(p.name for p in (tmp_path / "mixed").iterdir()) == ["dim4", "dim8"]
    rng = np.random.default_rng(0)
    try:
        for step in range(6):
            per_table = [np.unique(rng.integers(0, 50, size=20)) for _ in TABLES]
            counts = torch.tensor([len(i) for i in per_table])
            ids = torch.from_numpy(np.concatenate(per_table))
            grads = [torch.from_numpy(g) for g in _grads(rng, counts.tolist(), list(DIMS))]
            rows, versions = mixed.lookup(ids, counts, torch.float32, step=step)
            assert isinstance(rows, list) and [tuple(r.shape) for r in rows] == [
                (len(per_table[0]) + len(per_table[2]), 4),
                (len(per_table[1]), 8),
            ]
            # each width's rows in the order of the ids: tables 0 then 2, and table 1
            want4 = np.concatenate(
                [narrow.peek_table(0, per_table[0]), narrow.peek_table(2, per_table[2])]
            )
            np.testing.assert_array_equal(rows[0].numpy(), want4)
            np.testing.assert_array_equal(rows[1].numpy(), wide.peek_table(1, per_table[1]))
            lag = mixed.push(
                ids, counts, [torch.cat([grads[0], grads[2]]), grads[1]], versions, 1.0, step
            )
            assert lag == 0
            narrow.push(
                torch.from_numpy(np.concatenate([per_table[0], per_table[2]])),
                torch.tensor([counts[0], 0, counts[2]]),
                torch.cat([grads[0], grads[2]]),
                torch.cat([versions[: counts[0]], versions[counts[0] + counts[1] :]]),
                1.0,
                step,
            )
            wide.push(
                torch.from_numpy(per_table[1]),
                torch.tensor([0, counts[1], 0]),
                grads[1],
                versions[counts[0] : counts[0] + counts[1]],
                1.0,
                step,
            )
        for t, reference in ((0, narrow), (1, wide), (2, narrow)):
            ids_t = np.arange(50)
            np.testing.assert_array_equal(
                mixed.peek_table(t, ids_t, cols="all"), reference.peek_table(t, ids_t, cols="all")
            )
            np.testing.assert_array_equal(
                mixed.row_versions(t, ids_t), reference.row_versions(t, ids_t)
            )
        stats = mixed.stats()
        assert stats["updates_applied"] == [
            narrow.stats()["updates_applied"][0],
            wide.stats()["updates_applied"][1],
            narrow.stats()["updates_applied"][2],
        ]
        assert stats["live_rows"] == narrow.stats()["live_rows"] + wide.stats()["live_rows"]
        cached = [g.stats()["store"]["capacity_rows"] for g in mixed.groups]
        assert stats["store"]["capacity_rows"] == sum(cached)  # cache slots of both stores
        with pytest.raises(ValueError, match="grads has 1 tensors for the shard's 2"):
            mixed.push(ids, counts, [grads[0]], versions, 1.0, 9)
    finally:
        for shard in (mixed, narrow, wide):
            shard.close()


def test_a_shard_file_of_several_widths_loads_back_exactly(tmp_path: Path) -> None:
    config = EmbeddingShard.Config(table_dims=DIMS, admit_after=2)
    shard = EmbeddingShard(tmp_path / "a", TABLES, config)
    ids = torch.tensor([1, 2, 3, 1, 2, 7])
    counts = torch.tensor([3, 2, 1])
    grads = [torch.ones(4, 4), torch.ones(2, 8)]
    try:
        for step in range(3):  # admitted on the second push
            _, versions = shard.lookup(ids, counts, torch.float32)
            shard.push(ids, counts, grads, versions, 1.0, step)
        path = tmp_path / "shard0.npz"
        write_shard_file(shard, path, shard.row_clocks())
        state = shard.policy_state()
        assert sorted(state) == ["dim4.expiry_check", "dim4.sketch", "dim8.expiry_check",
                                 "dim8.sketch"]  # fmt: skip
        loaded = EmbeddingShard(tmp_path / "b", TABLES, config)
        try:
            import_shard_rows(loaded, default_owners(1), 0, [path], 3)
            for t, table_ids in enumerate(([1, 2, 3], [1, 2], [7])):
                got = loaded.peek_table(t, np.array(table_ids), cols="all")
                assert got.shape == (len(table_ids), shard.row_widths[t])
                np.testing.assert_array_equal(
                    got, shard.peek_table(t, np.array(table_ids), cols="all")
                )
                np.testing.assert_array_equal(
                    loaded.row_versions(t, np.array(table_ids)), [2] * len(table_ids)
                )
            for group, original in zip(loaded.groups, shard.groups, strict=True):
                assert group.sketch is not None and original.sketch is not None
                np.testing.assert_array_equal(group.sketch.counts, original.sketch.counts)
        finally:
            loaded.close()
    finally:
        shard.close()


def test_the_client_pools_each_table_at_its_width_and_pushes_its_gradients(
    tmp_path: Path,
) -> None:
    config = EmbeddingShard.Config(table_dims=(6, 2))
    shards = [EmbeddingShard(tmp_path / f"s{p}", (1000, 1000), config) for p in range(2)]
    transport = LocalTransport([ShardServer(s, None, 0.0) for s in shards], timeout_s=5)
    client = EmbeddingClient(
        transport, default_owners(2), 2, (6, 2), "float32", pooling=("mean", "sum")
    )
    owners = default_owners(2)

    def row(t: int, i: int) -> torch.Tensor:
        owner = int(owners[virtual_shard(t, np.array([i]))[0]])
        return torch.from_numpy(shards[owner].peek_table(t, np.array([i]))[0])

    try:
        result = client.wait(client.lookup(_batch()))
        assert [tuple(r.shape) for r in result.rows] == [(3, 2), (2, 6)]  # width 2 first
        pooled = client.pool(result)
        assert pooled.shape == (3, 8)  # feature a's 6 columns, then feature b's 2
        torch.testing.assert_close(pooled[0, :6], (2 * row(0, 3) + row(0, 7)) / 3)
        torch.testing.assert_close(pooled[1, :6], torch.zeros(6))
        torch.testing.assert_close(pooled[1, 6:], 2 * row(1, 5))
        torch.testing.assert_close(pooled[2, 6:], row(1, 900))
        pooled[:, 6:].sum().backward()  # only feature b gets a gradient
        assert result.rows[1].grad is not None and not result.rows[1].grad.any()
        before = {(1, i): row(1, i) for i in (3, 5, 900)} | {(0, 3): row(0, 3)}
        for handle in client.push(result, step=0, world_size=1):
            handle.wait()
        assert torch.equal(row(0, 3), before[(0, 3)])  # zero gradient: row-wise Adagrad keeps
        for i in (3, 5, 900):  # every row of b moved against its gradient (all positive)
            assert (row(1, i) < before[(1, i)]).all()
        with pytest.raises(ValueError, match="embedding_dim has 3 widths for 2 tables"):
            EmbeddingClient(transport, owners, 2, (4, 4, 4))
    finally:
        transport.close()
        for s in shards:
            s.close()


def test_a_budget_splits_by_rows_bytes_with_a_floor_per_store() -> None:
    shares = _split_budget(1_000_000, {2: 10, 8: 3000, 16: 7000})
    # width 2's share (10 B of 10,010) is below a store's 131,072 B: it gets that, and the
    # other two split the 868,928 B left 3:7
    assert shares == {2: 131072, 8: 260678, 16: 608249}
    assert _split_budget(None, {2: 10, 8: 30}) == {2: None, 8: None}
    assert _split_budget(5000, {8: 30}) == {8: 5000}  # one width: the whole budget
    with pytest.raises(ValueError, match="set it to at least 262144"):
        _split_budget(200_000, {2: 10, 8: 30})
    config = EmbeddingShard.Config(backend="file", memory_budget_bytes=262144, table_dims=DIMS)
    assert _split_budget(262144, {4: 1, 8: 1}) == {4: 131072, 8: 131072}
    assert config.memory_budget_bytes == 262144


def test_split_capacity_by_declared_rows() -> None:
    assert split_capacity((100, 300, 600), (8, 16, 8), None) == {8: 700, 16: 300}
    assert split_capacity((100, 300, 600), (8, 16, 8), 500) == {8: 350, 16: 150}
    assert split_capacity((100, 300), (8, 8), 50) == {8: 50}
    assert split_capacity((0, 0), (8, 16), 10) == {8: 5, 16: 5}  # no sizes: an even split


def test_models_take_per_feature_widths() -> None:
    model = WideDeepMLP(3, (4, 8, 2), dense_dim=5, hidden=(6,))
    out = model(torch.zeros(7, 14), torch.zeros(7, 5))
    assert out.shape == (7,)
    assert model.wide.in_features == 14 + 5
    # dlrm projects each narrower feature to the widest width (MD embeddings). With a
    # projection that pads with zeros it is the single-width dlrm on zero-padded features.
    torch.manual_seed(0)
    mixed = DLRM(2, (2, 4), dense_dim=3, hidden=(5,))
    single = DLRM(2, 4, dense_dim=3, hidden=(5,))
    single.load_state_dict(mixed.state_dict(), strict=False)  # bottom and top MLPs
    assert isinstance(mixed.projections[1], nn.Identity)  # already the widest
    with torch.no_grad():
        mixed.projections[0].weight.copy_(torch.eye(4, 2))  # (4, 2): x -> [x, 0, 0]
    narrow, wide, dense = torch.randn(6, 2), torch.randn(6, 4), torch.randn(6, 3)
    padded = torch.cat([narrow, torch.zeros(6, 2)], dim=1)
    torch.testing.assert_close(
        mixed(torch.cat([narrow, wide], dim=1), dense),
        single(torch.stack([padded, wide], dim=1), dense),
    )
    assert sorted(single.state_dict()) == sorted(
        k for k in mixed.state_dict() if not k.startswith("projections")
    )  # one width: no projection, the state dict of earlier checkpoints


def test_widths_are_checked_against_the_data_and_the_model_before_launch() -> None:
    data = RecsysDataConfig(dataset="movielens100k")  # 7 tables
    with pytest.raises(ValueError, match=r"embedding_dims=\[8, 0\] must each be >= 1"):
        RecsysTrainConfig(data=data, embedding_dims=(8, 0))
    short = RecsysTrainConfig(data=data, model="mlp", embedding_dims=(8, 16))
    with pytest.raises(ConfigError, match="embedding_dims has 2 widths, movielens100k has 7"):
        _check_features(short)
    dlrm = RecsysTrainConfig(data=data, model="dlrm", embedding_dims=(8, 16, 4, 4, 4, 8, 4))
    _check_features(dlrm)  # accepted: dlrm projects the narrower features
    ok = RecsysTrainConfig(data=data, model="mlp", embedding_dims=(8, 16, 4, 4, 4, 8, 4))
    _check_features(ok)  # accepted
    assert table_dims(ok, 7) == (8, 16, 4, 4, 4, 8, 4)
    assert table_dims(RecsysTrainConfig(embedding_dim=12), 3) == (12, 12, 12)
