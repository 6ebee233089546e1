"""StoreEmbeddingBag + the store's fused optimizers against torch.nn.EmbeddingBag + torch.optim."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from frugal.store import EmbeddingStore, OptimizerConfig, RowSpec, init_rows
from frugal.store.nn import StoreEmbeddingBag, StoreSparseOptimizer

NUM_ROWS, DIM = 12, 4


def _run_both(
    tmp_path: Path,
    opt: OptimizerConfig,
    make_torch_opt: object,
    batches: list[torch.Tensor],
    mode: str = "sum",
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Train the store and a dense reference on the same bags; return both tables."""
    spec = RowSpec(embedding_dim=DIM, optimizer=opt)
    init = init_rows(np.arange(NUM_ROWS, dtype=np.int64), spec, seed=7)[:, :DIM]
    reference = torch.nn.EmbeddingBag(NUM_ROWS, DIM, mode=mode)
    with torch.no_grad():
        reference.weight.copy_(torch.from_numpy(init))
    torch_opt = make_torch_opt(reference.parameters())  # type: ignore[operator]
    target = torch.linspace(-1, 1, DIM)
    touched: set[int] = set()
    with EmbeddingStore.create(tmp_path / "s", num_rows=NUM_ROWS, spec=spec, seed=7) as store:
        bag = StoreEmbeddingBag(store, mode=mode)  # type: ignore[arg-type]
        sparse_opt = StoreSparseOptimizer(bag)
        for indices in batches:
            touched |= set(indices.flatten().tolist())
            loss = ((bag(indices) - target) ** 2).sum()
            loss.backward()
            sparse_opt.step()
            torch_opt.zero_grad()
            ((reference(indices) - target) ** 2).sum().backward()
            torch_opt.step()
        ours = store.peek(np.arange(NUM_ROWS), cols="emb")
    return ours, reference.weight.detach().numpy(), sorted(touched)


def _random_bags(steps: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, NUM_ROWS, (5, 3), generator=gen) for _ in range(steps)]


def _all_rows_bags(steps: int) -> list[torch.Tensor]:
    # Every row in every step, with repeats (ids 0..11 and 0..2 twice): optimizers whose dense
    # form also moves untouched rows (momentum, Adam) are then comparable exactly.
    return [torch.cat([torch.arange(NUM_ROWS), torch.tensor([0, 1, 2])]).reshape(5, 3)] * steps


@pytest.mark.parametrize(
    ("opt", "torch_opt", "bags"),
    [
        (
            OptimizerConfig(kind="sgd", lr=0.1),
            lambda p: torch.optim.SGD(p, lr=0.1),
            _random_bags(6),
        ),
        (
            OptimizerConfig(kind="sgd", lr=0.05, momentum=0.9, weight_decay=0.01),
            lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.01),
            _all_rows_bags(5),
        ),
        (
            OptimizerConfig(kind="adagrad", lr=0.1, eps=1e-10),
            lambda p: torch.optim.Adagrad(p, lr=0.1, eps=1e-10),
            _random_bags(6),
        ),
        (
            OptimizerConfig(kind="adam", lr=0.01, weight_decay=0.001),
            lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.001),
            _all_rows_bags(5),
        ),
    ],
    ids=["sgd", "sgd-momentum-wd", "adagrad", "adam"],
)
def test_touched_rows_match_torch(
    tmp_path: Path, opt: OptimizerConfig, torch_opt: object, bags: list[torch.Tensor]
) -> None:
    ours, reference, touched = _run_both(tmp_path, opt, torch_opt, bags)
    np.testing.assert_allclose(ours[touched], reference[touched], rtol=2e-6, atol=2e-7)


def test_mean_mode_and_offsets_match_torch(tmp_path: Path) -> None:
    ours, reference, touched = _run_both(
        tmp_path, OptimizerConfig(kind="sgd", lr=0.2), lambda p: torch.optim.SGD(p, lr=0.2),
        _random_bags(4, seed=1), mode="mean",
    )  # fmt: skip
    np.testing.assert_allclose(ours[touched], reference[touched], rtol=2e-6, atol=2e-7)
    spec = RowSpec(embedding_dim=DIM)
    with EmbeddingStore.create(tmp_path / "o", num_rows=NUM_ROWS, spec=spec) as store:
        bag = StoreEmbeddingBag(store).eval()
        flat, offsets = torch.tensor([3, 4, 4, 9]), torch.tensor([0, 1])  # bags [3], [4, 4, 9]
        out = bag(flat, offsets)
        rows = torch.from_numpy(init_rows(np.arange(NUM_ROWS), spec, 0))
        expected = torch.stack([rows[3], rows[4] * 2 + rows[9]])
        torch.testing.assert_close(out, expected)
        assert bag.pending == []  # eval mode opens no update
        with pytest.raises(ValueError, match="need offsets iff they are 1-D"):
            bag(flat)
        assert store.cache.readers.sum() == 0  # eval reads open nothing: close can checkpoint


def test_rowwise_adagrad_matches_the_formula(tmp_path: Path) -> None:
    # One step on row 2 with gradient g = [1, 2, 3, 4] (lr 0.5, eps 1e-8):
    # a = mean(g^2) = 7.5; w -= 0.5 * g / (sqrt(7.5) + eps).
    spec = RowSpec(embedding_dim=DIM, optimizer=OptimizerConfig(kind="rowwise_adagrad", lr=0.5))
    w0 = init_rows(np.array([2]), spec, 0)[0]
    with EmbeddingStore.create(tmp_path / "s", num_rows=4, spec=spec) as store:
        store.get(np.array([2]))
        g = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
        store.apply_gradients(np.array([2]), g)
        row = store.peek(np.array([2]))[0]
    assert row[DIM] == pytest.approx(7.5)
    np.testing.assert_allclose(row[:DIM], w0[:DIM] - 0.5 * g[0] / np.sqrt(7.5), rtol=1e-6)


def test_adam_step_counts_are_per_row(tmp_path: Path) -> None:
    # Row 1 is updated twice, row 2 once: t = 2 and 1, each with its own bias correction.
    spec = RowSpec(embedding_dim=DIM, optimizer=OptimizerConfig(kind="adam", lr=0.1))
    with EmbeddingStore.create(tmp_path / "s", num_rows=4, spec=spec) as store:
        g = np.ones((1, DIM), dtype=np.float32)
        for step, ids in enumerate(([1], [1, 2])):
            store.get(np.array(ids), step=step)
            store.apply_gradients(np.array(ids), np.repeat(g, len(ids), axis=0), step=step)
        rows = store.peek(np.array([1, 2]))
    assert rows[:, 3 * DIM].tolist() == [2.0, 1.0]
    # First Adam step with g = 1 moves every weight by lr * (m/(1-b1)) / (sqrt(v/(1-b2)) + eps)
    # = 0.1 * 1 / (1 + 1e-8).
    w0 = init_rows(np.array([2]), spec, 0)[0, :DIM]
    np.testing.assert_allclose(rows[1, :DIM], w0 - 0.1 / (1 + 1e-8), rtol=1e-6)


def test_float_indices_and_a_step_without_backward_are_refused(tmp_path: Path) -> None:
    spec = RowSpec(embedding_dim=DIM)
    with EmbeddingStore.create(tmp_path / "s", num_rows=NUM_ROWS, spec=spec) as store:
        bag = StoreEmbeddingBag(store)
        with pytest.raises(TypeError, match="integer tensor"):
            bag(torch.tensor([[1.0, 2.0]]))
        opt = StoreSparseOptimizer(bag)
        out = bag(torch.tensor([[1, 2]]))
        with pytest.raises(RuntimeError, match="has no gradient"):
            opt.step()
        assert len(bag.pending) == 1  # kept: backward, then step again
        out.sum().backward()
        opt.step()
        assert bag.pending == []
        assert store.cache.readers.sum() == 0
