"""Sparse optimizers through the PS path (client -> transport -> shard -> store) = PyTorch.

References: dense `nn.EmbeddingBag` + torch.optim where lazy and dense agree (SGD without
momentum/decay, Adagrad), per-row torch.optim / hand-written torch otherwise.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from frugal.recsys.batch import KJTBatch
from frugal.recsys.client import EmbeddingClient
from frugal.recsys.ps import EmbeddingShard, default_owners
from frugal.recsys.transport import LocalTransport, ShardServer
from frugal.store import OptimizerConfig, RowSpec, init_rows

NUM_ROWS, DIM, BAGS, STEPS, SEED = 20, 4, 6, 20, 3


def _batches() -> list[tuple[KJTBatch, torch.Tensor]]:
    """20 one-feature batches of 6 bags with duplicate ids; ids 15..19 are never touched."""
    rng = np.random.default_rng(0)
    out = []
    for step in range(STEPS):
        lengths = rng.integers(0, 4, size=BAGS).astype(np.int32)  # empty bags included
        values = rng.integers(0, 15 if step % 2 else 8, size=int(lengths.sum())).astype(np.int64)
        batch = KJTBatch(
            keys=("f",),
            values=values,
            lengths=lengths,
            dense=np.zeros((BAGS, 0), np.float32),
            labels=np.zeros(BAGS, np.float32),
            batch_id=step,
        )
        target = torch.from_numpy(rng.standard_normal((BAGS, DIM)).astype(np.float32))
        out.append((batch, target))
    return out


def _run_ps(tmp_path: Path, optimizer: OptimizerConfig, num_shards: int) -> np.ndarray:
    """Train through 2 in-process PS shards over LocalTransport; return the final table."""
    config = EmbeddingShard.Config(embedding_dim=DIM, optimizer=optimizer, seed=SEED)
    shards = [EmbeddingShard(tmp_path / f"s{p}", (NUM_ROWS,), config) for p in range(num_shards)]
    transport = LocalTransport([ShardServer(s, None, 0.0) for s in shards], timeout_s=10)
    client = EmbeddingClient(transport, default_owners(num_shards), 1, DIM, "float32")
    try:
        for batch, target in _batches():
            result = client.wait(client.lookup(batch))
            pooled = client.pool(result)  # (B, F=1, E)
            loss = (pooled[:, 0, :] * target).sum() + 0.5 * (pooled**2).sum()
            loss.backward()
            for handle in client.push(result, batch.batch_id, world_size=1):
                handle.wait()
        ids = np.arange(NUM_ROWS, dtype=np.int64)
        owners = default_owners(num_shards)
        from frugal.recsys.ps import virtual_shard

        owner = owners[virtual_shard(0, ids)]
        table = np.empty((NUM_ROWS, DIM), np.float32)
        for p in range(num_shards):
            mine = ids[owner == p]
            table[mine] = shards[p].peek_table(0, mine)
        return table
    finally:
        transport.close()
        for shard in shards:
            shard.close()


def _initial(optimizer: OptimizerConfig) -> torch.Tensor:
    spec = RowSpec(embedding_dim=DIM, optimizer=optimizer)
    # table 0 of shard config seed SEED uses store seed SEED + 0
    return torch.from_numpy(init_rows(np.arange(NUM_ROWS, dtype=np.int64), spec, SEED)[:, :DIM])


def _dense_reference(
    optimizer: OptimizerConfig, make: type[torch.optim.Optimizer], **kw: float
) -> np.ndarray:
    bag = nn.EmbeddingBag(NUM_ROWS, DIM, mode="sum")
    with torch.no_grad():
        bag.weight.copy_(_initial(optimizer))
    opt = make([bag.weight], **kw)
    for batch, target in _batches():
        offsets = torch.cat(
            [
                torch.zeros(1, dtype=torch.int64),
                torch.cumsum(torch.from_numpy(batch.lengths.astype(np.int64)), 0)[:-1],
            ]
        )
        pooled = bag(torch.from_numpy(batch.values), offsets)
        loss = (pooled * target).sum() + 0.5 * (pooled**2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return bag.weight.detach().numpy()


def _per_row_reference(optimizer: OptimizerConfig) -> np.ndarray:
    """Each row its own parameter, stepped only on steps that touch it (lazy)."""
    rows = [nn.Parameter(r.clone()) for r in _initial(optimizer)]
    kind = optimizer.kind
    state = [torch.zeros(1) for _ in rows]  # row-wise Adagrad accumulators
    opts: list[torch.optim.Optimizer] = []
    if kind == "adam":
        opts = [
            torch.optim.Adam(
                [r], lr=optimizer.lr, betas=(optimizer.beta1, optimizer.beta2), eps=optimizer.eps
            )
            for r in rows
        ]
    elif kind == "sgd":
        opts = [
            torch.optim.SGD(
                [r],
                lr=optimizer.lr,
                momentum=optimizer.momentum,
                weight_decay=optimizer.weight_decay,
            )
            for r in rows
        ]
    for batch, target in _batches():
        table = torch.stack(list(rows))
        offsets = torch.cat(
            [
                torch.zeros(1, dtype=torch.int64),
                torch.cumsum(torch.from_numpy(batch.lengths.astype(np.int64)), 0)[:-1],
            ]
        )
        pooled = nn.functional.embedding_bag(
            torch.from_numpy(batch.values), table, offsets, mode="sum"
        )
        loss = (pooled * target).sum() + 0.5 * (pooled**2).sum()
        for r in rows:
            r.grad = None
        loss.backward()
        for i in np.unique(batch.values):
            grad = rows[i].grad
            assert grad is not None
            if kind == "rowwise_adagrad":
                with torch.no_grad():
                    state[i] += (grad * grad).mean()
                    rows[i] -= optimizer.lr * grad / (state[i].sqrt() + optimizer.eps)
            else:
                opts[i].step()
    return torch.stack(list(rows)).detach().numpy()


@pytest.mark.parametrize("num_shards", [1, 2])
def test_sgd_equals_dense_torch(tmp_path: Path, num_shards: int) -> None:
    optimizer = OptimizerConfig(kind="sgd", lr=0.05)
    got = _run_ps(tmp_path, optimizer, num_shards)
    want = _dense_reference(optimizer, torch.optim.SGD, lr=0.05)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert not np.allclose(got[:15], _initial(optimizer).numpy()[:15])  # rows did train
    np.testing.assert_array_equal(got[15:], _initial(optimizer).numpy()[15:])  # untouched


def test_adagrad_equals_dense_torch(tmp_path: Path) -> None:
    optimizer = OptimizerConfig(kind="adagrad", lr=0.1, eps=1e-10)
    got = _run_ps(tmp_path, optimizer, 2)
    want = _dense_reference(optimizer, torch.optim.Adagrad, lr=0.1, eps=1e-10)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "optimizer",
    [
        OptimizerConfig(kind="rowwise_adagrad", lr=0.1, eps=1e-10),
        OptimizerConfig(kind="adam", lr=0.01),
        OptimizerConfig(kind="sgd", lr=0.05, momentum=0.9, weight_decay=0.01),
    ],
    ids=["rowwise_adagrad", "adam", "sgd_momentum_decay"],
)
def test_lazy_optimizers_equal_per_row_torch(tmp_path: Path, optimizer: OptimizerConfig) -> None:
    got = _run_ps(tmp_path, optimizer, 2)
    want = _per_row_reference(optimizer)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
