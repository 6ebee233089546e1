"""The DLRM workload: interactions worked out by hand, learning, equality across tables."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from frugal.store import EmbeddingStore, OptimizerConfig, RowSpec
from frugal.store.baselines import RamTable
from frugal.store.dlrm import DLRM, dlrm_step


def test_interaction_features_are_the_pairwise_dots() -> None:
    model = DLRM(num_fields=3, embedding_dim=2, top_mlp=(4,))
    emb = torch.tensor([[[1.0, 0.0], [2.0, 1.0], [0.0, 3.0]]])
    # the 6 embedding values, then <e0,e1> = 2, <e0,e2> = 0, <e1,e2> = 3
    assert model.features(emb).tolist() == [[1.0, 0.0, 2.0, 1.0, 0.0, 3.0, 2.0, 0.0, 3.0]]
    assert model(emb).shape == (1,)


def test_bad_shapes_name_the_expected_one() -> None:
    with pytest.raises(ValueError, match="num_fields=1 must be >= 2"):
        DLRM(num_fields=1, embedding_dim=4)
    with pytest.raises(ValueError, match=r"expected \(B, 3, D\)"):
        DLRM(num_fields=3, embedding_dim=2)(torch.zeros(4, 2, 2))


def _train(table: object, steps: int = 40) -> list[float]:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 500, size=(steps, 64, 4))
    signs = np.where(np.arange(500) % 2 == 0, 1.0, -1.0)  # a planted teacher
    labels = (signs[ids].sum(axis=2) > 0).astype(np.float32)
    model = DLRM(num_fields=4, embedding_dim=8, top_mlp=(16,), seed=0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    return [dlrm_step(model, optimizer, table, ids[t], labels[t], step=t) for t in range(steps)]


def test_dlrm_learns_and_every_table_gives_the_same_run(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    spec = RowSpec(embedding_dim=8, optimizer=OptimizerConfig(kind="adagrad", lr=0.1))
    ram = RamTable(500, spec, seed=0)
    losses = _train(ram)
    assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5])
    store = EmbeddingStore.create(
        tmp_path / "s", num_rows=500, spec=spec, seed=0,
        config=EmbeddingStore.Config(memory_budget_bytes=256 << 10),
    )  # fmt: skip
    assert _train(store) == losses
    assert store.table_sha256() == ram.table_sha256()
    store.close()


def test_a_bad_batch_is_refused_before_any_read_and_a_failed_one_releases(
    tmp_path: Path,
) -> None:
    spec = RowSpec(embedding_dim=8, optimizer=OptimizerConfig(kind="adagrad", lr=0.1))
    store = EmbeddingStore.create(
        tmp_path / "s", num_rows=100, spec=spec, config=EmbeddingStore.Config(timeout_s=2.0)
    )
    model = DLRM(num_fields=4, embedding_dim=8, top_mlp=(16,))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    ids = np.arange(32 * 4).reshape(32, 4) % 100
    labels = np.zeros(32, dtype=np.float32)
    weights = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=r"labels must be float32 of shape \(32,\)"):
        dlrm_step(model, optimizer, store, ids, labels[:31], step=0)
    with pytest.raises(ValueError, match=r"3 fields per sample .* num_fields=4"):
        dlrm_step(model, optimizer, store, ids[:, :3], labels, step=0)
    with pytest.raises(TypeError, match=r"ids\.numpy"):
        dlrm_step(model, optimizer, store, torch.from_numpy(ids), labels, step=0)  # type: ignore[arg-type]
    wide = DLRM(num_fields=4, embedding_dim=6, top_mlp=(16,))
    with pytest.raises(ValueError, match="embedding_dim=8 but the model was built for 6"):
        dlrm_step(wide, optimizer, store, ids, labels, step=0)
    # a failure inside the forward after the read: the rows' reads are released
    model.top.insert(0, torch.nn.Flatten(0))  # breaks the forward's shapes
    with pytest.raises(RuntimeError):
        dlrm_step(model, optimizer, store, ids, labels, step=0)
    del model.top[0]
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters(), strict=True))
    assert dlrm_step(model, optimizer, store, ids, labels, step=1) > 0  # no 2 s wait
    store.close()  # no open reads: the checkpoint is taken
    assert EmbeddingStore.open(tmp_path / "s").epoch == 1
