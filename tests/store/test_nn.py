"""frugal.store.nn modules + the store's fused optimizers against torch.nn + torch.optim."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pytest
import torch

from frugal.store import EmbeddingStore, NonFiniteError, OptimizerConfig, RowSpec, init_rows
from frugal.store.nn import StoreEmbedding, StoreEmbeddingBag, StoreSparseOptimizer, _stage

NUM_ROWS, DIM = 12, 4
TorchOpt = Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]


def _init(spec: RowSpec, seed: int = 7) -> torch.Tensor:
    return torch.from_numpy(init_rows(np.arange(NUM_ROWS, dtype=np.int64), spec, seed)[:, :DIM])


def _run_both(
    tmp_path: Path,
    opt: OptimizerConfig,
    make_torch_opt: object,
    batches: list[torch.Tensor],
    mode: str = "sum",
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Train the store and a dense reference on the same bags; return both tables."""
    spec = RowSpec(embedding_dim=DIM, optimizer=opt)
    reference = torch.nn.EmbeddingBag(NUM_ROWS, DIM, mode=mode)
    with torch.no_grad():
        reference.weight.copy_(_init(spec))
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


# torch's sparse Adagrad (nn.Embedding(sparse=True)) coalesces the gradient, then does
# state += g^2; w -= lr * g / (sqrt(state) + eps), the store's rule; eps 1e-10 on both sides.
@pytest.mark.filterwarnings("ignore:Sparse invariant checks:UserWarning")
@pytest.mark.parametrize(
    ("opt", "torch_opt", "padding_idx"),
    [
        (OptimizerConfig(kind="sgd", lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1), None),
        (
            OptimizerConfig(kind="adagrad", lr=0.1, eps=1e-10),
            lambda p: torch.optim.Adagrad(p, lr=0.1, eps=1e-10),
            None,
        ),
        (OptimizerConfig(kind="sgd", lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1), 3),
        (
            OptimizerConfig(kind="adagrad", lr=0.1, eps=1e-10),
            lambda p: torch.optim.Adagrad(p, lr=0.1, eps=1e-10),
            -1,  # = row 11
        ),
    ],
    ids=["sgd", "adagrad", "sgd-padding", "adagrad-padding-negative"],
)
def test_embedding_matches_torch_sparse_embedding(
    tmp_path: Path, opt: OptimizerConfig, torch_opt: TorchOpt, padding_idx: int | None
) -> None:
    spec = RowSpec(embedding_dim=DIM, optimizer=opt)
    reference = torch.nn.Embedding(NUM_ROWS, DIM, padding_idx=padding_idx, sparse=True)
    with torch.no_grad():
        reference.weight.copy_(_init(spec))
        if padding_idx is not None:  # torch's own init zeroes the padding row
            reference.weight[padding_idx] = 0.0
    reference_opt = torch_opt(reference.parameters())
    gen = torch.Generator().manual_seed(3)
    target = torch.linspace(-1, 1, DIM)
    touched: set[int] = set()
    with EmbeddingStore.create(tmp_path / "s", num_rows=NUM_ROWS, spec=spec, seed=7) as store:
        emb = StoreEmbedding(store, padding_idx=padding_idx)
        sparse_opt = StoreSparseOptimizer(emb)
        for step in range(5):
            ids = torch.randint(0, NUM_ROWS, (2, 3, 4), generator=gen)  # any shape, repeats
            if padding_idx is not None:
                ids[0, 0, :2] = padding_idx % NUM_ROWS
            touched |= set(ids.flatten().tolist())
            out = emb(ids)
            expected = reference(ids)
            torch.testing.assert_close(out, expected, msg=f"step {step}")
            assert out.shape == (2, 3, 4, DIM)
            ((out - target) ** 2 * torch.arange(1, DIM + 1)).sum().backward()
            sparse_opt.step()
            reference_opt.zero_grad()
            ((expected - target) ** 2 * torch.arange(1, DIM + 1)).sum().backward()
            reference_opt.step()
            assert emb.step == step + 1
        assert store.cache.readers.sum() == 0  # every read closed
        rows = store.peek(np.arange(NUM_ROWS), cols="emb")
    if padding_idx is not None:  # never read, never written: still the store's initial row
        pad = padding_idx % NUM_ROWS
        touched.discard(pad)
        np.testing.assert_array_equal(rows[pad], _init(spec)[pad].numpy())
    idx = sorted(touched)
    torch.testing.assert_close(torch.from_numpy(rows[idx]), reference.weight.detach()[idx])


# Each case: input, offsets, per_sample_weights (None or True for random weights).
_FLAT = torch.tensor([1, 5, 5, 2, 7, 0, 7, 9, 3, 3, 11])
_BAG_CASES = {
    "sum-weights": ("sum", None, False, _FLAT, torch.tensor([0, 3, 3, 7]), True),
    "mean-padding": ("mean", 7, False, _FLAT, torch.tensor([0, 3, 3, 7]), False),
    "max-padding": ("max", 5, False, _FLAT, torch.tensor([0, 1, 3, 3, 9]), False),
    "sum-last-offset-padding-weights": (
        "sum", 3, True, _FLAT, torch.tensor([0, 2, 2, 8, 11]), True,
    ),
    "mean-2d": ("mean", None, False, _FLAT[:10].reshape(5, 2), None, False),
    "max-2d-padding": ("max", 0, False, _FLAT[1:].reshape(2, 5), None, False),
}  # fmt: skip


@pytest.mark.parametrize("case", list(_BAG_CASES))
def test_bag_matches_torch_embedding_bag(tmp_path: Path, case: str) -> None:
    mode, padding_idx, last, flat, offsets, weighted = _BAG_CASES[case]
    spec = RowSpec(embedding_dim=DIM, optimizer=OptimizerConfig(kind="sgd", lr=0.3))
    reference = torch.nn.EmbeddingBag(
        NUM_ROWS, DIM, mode=mode, padding_idx=padding_idx, include_last_offset=last
    )
    with torch.no_grad():
        reference.weight.copy_(_init(spec))
    reference_opt = torch.optim.SGD(reference.parameters(), lr=0.3)
    gen = torch.Generator().manual_seed(5)
    target = torch.linspace(-1, 1, DIM)
    with EmbeddingStore.create(tmp_path / "s", num_rows=NUM_ROWS, spec=spec, seed=7) as store:
        bag = StoreEmbeddingBag(store, mode, padding_idx=padding_idx, include_last_offset=last)
        sparse_opt = StoreSparseOptimizer(bag)
        for step in range(4):
            weights = torch.rand(flat.shape, generator=gen)
            psw = weights if weighted else None
            out = bag(flat, offsets, per_sample_weights=psw)
            expected = reference(flat, offsets, per_sample_weights=psw)
            torch.testing.assert_close(out, expected, msg=f"step {step}")
            ((out - target) ** 2).sum().backward()
            sparse_opt.step()
            reference_opt.zero_grad()
            ((expected - target) ** 2).sum().backward()
            reference_opt.step()
        rows = torch.from_numpy(store.peek(np.arange(NUM_ROWS), cols="emb"))
    if offsets is not None and len(offsets) > 2:  # an empty bag (equal offsets) pools to 0
        empty = int(torch.nonzero(offsets[1:] == offsets[:-1])[0, 0])
        assert out[empty].abs().sum() == 0
    # SGD leaves untouched rows where they were; torch's padding row gets no gradient.
    torch.testing.assert_close(rows, reference.weight.detach())
    if padding_idx is not None:
        torch.testing.assert_close(rows[padding_idx], _init(spec)[padding_idx], rtol=0, atol=0)


def test_eval_and_no_grad_read_without_opening_reads(tmp_path: Path) -> None:
    spec = RowSpec(embedding_dim=DIM)
    with EmbeddingStore.create(tmp_path / "o", num_rows=NUM_ROWS, spec=spec) as store:
        bag = StoreEmbeddingBag(store).eval()
        flat, offsets = torch.tensor([3, 4, 4, 9]), torch.tensor([0, 1])  # bags [3], [4, 4, 9]
        out = bag(flat, offsets)
        rows = torch.from_numpy(init_rows(np.arange(NUM_ROWS), spec, 0))
        expected = torch.stack([rows[3], rows[4] * 2 + rows[9]])
        torch.testing.assert_close(out, expected)
        emb = StoreEmbedding(store)  # training mode, but under no_grad no update can follow
        with torch.no_grad():
            torch.testing.assert_close(emb(torch.tensor([9, 3])), rows[[9, 3]])
        assert bag.pending == [] and emb.pending == []
        assert store.cache.readers.sum() == 0  # nothing open: close can checkpoint


def test_bad_input_is_refused_before_any_read(tmp_path: Path) -> None:
    spec = RowSpec(embedding_dim=DIM)
    with EmbeddingStore.create(tmp_path / "s", num_rows=NUM_ROWS, spec=spec) as store:
        bag = StoreEmbeddingBag(store, "sum")
        mean = StoreEmbeddingBag(store, "mean")
        last = StoreEmbeddingBag(store, include_last_offset=True)
        emb = StoreEmbedding(store)
        flat = torch.tensor([1, 2, 3])
        refused: list[tuple[type[Exception], str, Callable[[], object]]] = [
            (TypeError, r"integer tensor, got torch.float32.*\.long\(\)",
             lambda: emb(torch.tensor([1.0, 2.0]))),
            (TypeError, "integer tensor", lambda: bag(torch.tensor([[1.0, 2.0]]))),
            (IndexError, r"outside \[0, num_rows=12\), e.g. \[-1, 12\]; re-index",
             lambda: emb(torch.tensor([[3, 12], [-1, 4]]))),
            (IndexError, r"e.g. \[40\]", lambda: bag(torch.tensor([[40]]))),
            (ValueError, r"need mode='sum', but .* mode='mean'",
             lambda: mean(flat, torch.tensor([0]), per_sample_weights=torch.ones(3))),
            (ValueError, r"shape \(2,\) must have the shape of input, \(3,\)",
             lambda: bag(flat, torch.tensor([0]), per_sample_weights=torch.ones(2))),
            (TypeError, "float32 tensor, got torch.float64",
             lambda: bag(flat, torch.tensor([0]), per_sample_weights=torch.ones(3).double())),
            (ValueError, r"offsets\[0\]=1, but the first bag must start at 0",
             lambda: bag(flat, torch.tensor([1, 2]))),
            (ValueError, r"offsets decrease at position 2 \(2 then 1\)",
             lambda: bag(flat, torch.tensor([0, 2, 1]))),
            (ValueError, r"offsets\[-1\]=5 is past the end of input \(length 3\)",
             lambda: bag(flat, torch.tensor([0, 5]))),
            (TypeError, "offsets must be an integer tensor",
             lambda: bag(flat, torch.tensor([0.0]))),
            (ValueError, r"offsets must be 1-D, got shape \(1, 1\)",
             lambda: bag(flat, torch.tensor([[0]]))),
            (ValueError, "is flat, so pass offsets", lambda: bag(flat)),
            (ValueError, "is 2-D, one bag per row, so offsets must be None",
             lambda: bag(flat.reshape(1, 3), torch.tensor([0]))),
            (ValueError, r"1-D \(with offsets\) or 2-D", lambda: bag(flat.reshape(1, 1, 3))),
            (ValueError, "include_last_offset=True needs the end",
             lambda: last(flat, torch.tensor([], dtype=torch.long))),
            (ValueError, r"padding_idx=12 must be in \[-num_embeddings, num_embeddings\)",
             lambda: StoreEmbedding(store, padding_idx=12)),
            (ValueError, "mode='median'; choose", lambda: StoreEmbeddingBag(store, "median")),  # type: ignore[arg-type]
        ]  # fmt: skip
        for error, match, call in refused:
            with pytest.raises(error, match=match):
                call()
        for module in (bag, mean, last, emb):
            assert module.pending == []
        assert store.cache.readers.sum() == 0  # nothing was read for training


def test_a_step_without_backward_or_with_nan_is_refused(tmp_path: Path) -> None:
    spec = RowSpec(embedding_dim=DIM)
    with EmbeddingStore.create(tmp_path / "s", num_rows=NUM_ROWS, spec=spec) as store:
        bag = StoreEmbeddingBag(store)
        opt = StoreSparseOptimizer(bag)
        out = bag(torch.tensor([[1, 2]]))
        with pytest.raises(RuntimeError, match="has no gradient"):
            opt.step()
        assert len(bag.pending) == 1  # kept: backward, then step again
        (out.sum() * float("nan")).backward()
        with pytest.raises(NonFiniteError, match="NaN or inf; nothing was applied"):
            opt.step()
        opt.zero_grad()
        assert bag.pending[0][2].grad is None
        out = bag.pending[0][2].sum()  # the same rows, a fresh finite gradient of ones
        out.backward()
        before = store.peek(np.array([1, 2]), cols="emb")
        opt.step()
        assert bag.pending == [] and bag.step == 1
        np.testing.assert_allclose(store.peek(np.array([1, 2]), cols="emb"), before - 0.01)
        assert store.cache.readers.sum() == 0


def test_one_optimizer_steps_several_modules_all_or_nothing(tmp_path: Path) -> None:
    sgd = RowSpec(embedding_dim=DIM, optimizer=OptimizerConfig(kind="sgd", lr=0.5))
    with (
        EmbeddingStore.create(tmp_path / "a", num_rows=NUM_ROWS, spec=sgd) as entities,
        EmbeddingStore.create(tmp_path / "b", num_rows=NUM_ROWS, spec=sgd) as features,
    ):
        model = torch.nn.ModuleDict(
            {"emb": StoreEmbedding(entities), "bag": StoreEmbeddingBag(features, "mean")}
        )
        assert StoreSparseOptimizer(model).modules == [model["emb"], model["bag"]]
        opt = StoreSparseOptimizer([model["emb"], model["bag"], model["emb"]])
        assert opt.modules == [model["emb"], model["bag"]]  # each module once
        with pytest.raises(ValueError, match="no StoreEmbedding or StoreEmbeddingBag"):
            StoreSparseOptimizer(torch.nn.Linear(2, 2))
        with pytest.raises(TypeError, match="takes torch modules, got EmbeddingStore"):
            StoreSparseOptimizer([entities])  # type: ignore[list-item]
        sha_a, sha_b = entities.table_sha256(), features.table_sha256()
        emb_out = model["emb"](torch.tensor([0, 1]))
        bag_out = model["bag"](torch.tensor([[2, 3]]))
        emb_out.sum().backward()  # the bag's forward has no gradient yet
        with pytest.raises(RuntimeError, match="of StoreEmbeddingBag has no gradient"):
            opt.step()
        assert (entities.table_sha256(), features.table_sha256()) == (sha_a, sha_b)
        bag_out.sum().backward()
        opt.step()
        # d(sum)/d row = 1 for the embedding; 1/2 per row of the mean of two; lr 0.5.
        init = _init(sgd, seed=0).numpy()
        np.testing.assert_allclose(entities.peek(np.array([0, 1]), "emb"), init[[0, 1]] - 0.5)
        np.testing.assert_allclose(features.peek(np.array([2, 3]), "emb"), init[[2, 3]] - 0.25)
        assert model["emb"].step == model["bag"].step == 1
        assert entities.cache.readers.sum() == features.cache.readers.sum() == 0


@pytest.mark.parametrize("backend", ["file", "memory"])
def test_state_dict_restores_rows_bit_identically(tmp_path: Path, backend: str) -> None:
    spec = RowSpec(embedding_dim=DIM, optimizer=OptimizerConfig(kind="adagrad", lr=0.2))
    config = EmbeddingStore.Config(backend=backend)
    gen = torch.Generator().manual_seed(11)
    batches = [torch.randint(0, NUM_ROWS, (3, 4), generator=gen) for _ in range(6)]

    def train(model: torch.nn.Module, opt: StoreSparseOptimizer, part: list[torch.Tensor]) -> None:
        for ids in part:
            (model(ids) ** 2).sum().backward()
            opt.step()

    with EmbeddingStore.create(
        tmp_path / "s", num_rows=NUM_ROWS, spec=spec, config=config
    ) as store:
        store.checkpoint(meta={"cursor": 0})
        model = torch.nn.Sequential(StoreEmbeddingBag(store, "sum"))
        opt = StoreSparseOptimizer(model)
        train(model, opt, batches[:3])
        torch.save(model.state_dict(), tmp_path / "model.pt")
        saved_sha = store.table_sha256()
        train(model, opt, batches[3:])  # further training, after the checkpoint
        trained_sha, trained_rows = store.table_sha256(), store.peek(np.arange(NUM_ROWS))
        assert trained_sha != saved_sha
        state = torch.load(tmp_path / "model.pt", weights_only=True)
        extra = state["0._extra_state"]
        assert (extra["epoch"], extra["rows_epoch"], extra["step"]) == (2, 2, 2)
        assert extra["meta"] == {"cursor": 0}  # the user's checkpoint meta is kept
        assert extra["module_step"] == 3
        model.load_state_dict(state)
        assert store.table_sha256() == saved_sha  # the handle `store` sees the checkpoint
        assert model[0].step == 3
        train(model, opt, batches[3:])  # the same further training gives the same bits
        assert store.table_sha256() == trained_sha
        np.testing.assert_array_equal(store.peek(np.arange(NUM_ROWS)), trained_rows)
        torch.save(model.state_dict(), tmp_path / "last.pt")
    # close() checkpointed again, with no change: the state still names the rows on disk.
    with EmbeddingStore.open(tmp_path / "s", config) as store:
        assert store.epoch == 4 and store.rows_epoch == 3
        model = torch.nn.Sequential(StoreEmbeddingBag(store, "sum"))
        model.load_state_dict(torch.load(tmp_path / "last.pt", weights_only=True))
        assert store.table_sha256() == trained_sha and model[0].step == 6


def test_load_state_dict_refuses_a_superseded_or_foreign_checkpoint(tmp_path: Path) -> None:
    spec = RowSpec(embedding_dim=DIM)
    with (
        EmbeddingStore.create(tmp_path / "a", num_rows=NUM_ROWS, spec=spec) as store,
        EmbeddingStore.create(tmp_path / "b", num_rows=NUM_ROWS, spec=RowSpec(embedding_dim=2))
        as other,
    ):  # fmt: skip
        emb = StoreEmbedding(store)
        state = emb.state_dict()
        out = emb(torch.tensor([1]))
        with pytest.raises(RuntimeError, match="1 training forwards of StoreEmbedding"):
            emb.state_dict()
        out.sum().backward()
        StoreSparseOptimizer(emb).step()
        # `state` is epoch 1, which changed nothing: it names the rows of epoch 0.
        assert state["_extra_state"]["rows_epoch"] == 0
        store.checkpoint()  # epoch 2 saves changed rows in place of those
        with pytest.raises(ValueError, match=r"rows_epoch=0 \(step=0\) .* rows_epoch=2 \(epoch"):
            emb.load_state_dict(state)
        with pytest.raises(ValueError, match=r"spec=.*'embedding_dim': 4.*embedding_dim': 2"):
            StoreEmbedding(other).load_state_dict(state)
        with pytest.raises(TypeError, match="must be a dict from its state_dict"):
            emb.load_state_dict({"_extra_state": [1]})
        with pytest.raises(RuntimeError, match="Missing key"):
            emb.load_state_dict({})  # strict, as in torch


def test_rows_stage_to_the_input_device(tmp_path: Path) -> None:
    rows = np.arange(8, dtype=np.float32).reshape(2, 4)
    host = _stage(rows, torch.device("cpu"))
    assert host.data_ptr() == rows.ctypes.data and not host.is_pinned()  # no copy on CPU
    # A non-CPU device without CUDA: copied with .to(), never pinned (pin_memory needs CUDA).
    moved = _stage(rows, torch.device("meta"))
    assert moved.device.type == "meta" and moved.shape == (2, 4)
    spec = RowSpec(embedding_dim=DIM, optimizer=OptimizerConfig(kind="sgd", lr=1.0))
    with EmbeddingStore.create(tmp_path / "s", num_rows=NUM_ROWS, spec=spec) as store:
        emb = StoreEmbedding(store)
        ids = torch.tensor([2, 2, 5], device=torch.device("cpu"))
        out = emb(ids)
        assert out.device == ids.device and out.dtype == torch.float32
        out.sum().backward()
        assert emb.pending[0][2].grad is not None
        assert emb.pending[0][2].grad.device == ids.device
        StoreSparseOptimizer(emb).step()  # gradient 2 for row 2 (twice), 1 for row 5
        init = _init(spec, seed=0).numpy()
        np.testing.assert_allclose(store.peek(np.array([2, 5]), "emb"), init[[2, 5]] - [[2], [1]])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_input_gives_cuda_output_and_cpu_updates(tmp_path: Path) -> None:
    spec = RowSpec(embedding_dim=DIM, optimizer=OptimizerConfig(kind="sgd", lr=0.5))
    with EmbeddingStore.create(tmp_path / "s", num_rows=NUM_ROWS, spec=spec) as store:
        bag = StoreEmbeddingBag(store, "mean", padding_idx=0)
        ids = torch.tensor([[1, 0, 3], [3, 3, 4]], device="cuda")
        out = bag(ids)
        assert out.device == ids.device
        expected = StoreEmbeddingBag(store, "mean", padding_idx=0).eval()(ids.cpu())
        torch.testing.assert_close(out.cpu(), expected)
        out.sum().backward()
        StoreSparseOptimizer(bag).step()
        # mean over 2 ids (row 0 is padding) and 3 ids: rows 1, 3 (bag 0) get 1/2,
        # row 3 (bag 1, twice) 2/3, row 4 1/3; lr 0.5.
        init = _init(spec, seed=0).numpy()
        expected_rows = init[[1, 3, 4]] - 0.5 * np.array([[0.5], [0.5 + 2 / 3], [1 / 3]])
        np.testing.assert_allclose(store.peek(np.array([1, 3, 4]), "emb"), expected_rows)


def test_embedding_over_hashed_keys_pads_and_trains(tmp_path: Path) -> None:
    spec = RowSpec(embedding_dim=DIM, optimizer=OptimizerConfig(kind="sgd", lr=1.0))
    keys = torch.tensor([[10**12, 7], [2**62, 10**12]])
    with EmbeddingStore.create(
        tmp_path / "h", num_rows=NUM_ROWS, spec=spec, key_space="hashed"
    ) as store:
        with pytest.raises(ValueError, match="padding_idx=-1 must be a key >= 0"):
            StoreEmbedding(store, padding_idx=-1)
        emb = StoreEmbedding(store, padding_idx=7)
        assert "padding_idx=7" in repr(emb)
        out = emb(keys)
        init = torch.from_numpy(init_rows(np.array([10**12, 2**62]), spec, 0)[:, :DIM])
        zero = torch.zeros(DIM)  # key 7 is the padding
        torch.testing.assert_close(
            out, torch.stack([init[0], zero, init[1], init[0]]).view(2, 2, -1)
        )
        out.sum().backward()
        StoreSparseOptimizer(emb).step()
        # Gradient 2 for key 10**12 (twice), 1 for 2**62; key 7 is padding and never stored.
        rows = store.peek(np.array([10**12, 2**62]), cols="emb")
        np.testing.assert_allclose(rows, init.numpy() - [[2.0], [1.0]])
        assert store.stats()["num_keys"] == 2


def test_a_failed_step_can_be_discarded_and_the_store_closes(tmp_path: Path) -> None:
    spec = RowSpec(embedding_dim=4, optimizer=OptimizerConfig(kind="sgd", lr=0.1))
    store = EmbeddingStore.create(
        tmp_path / "s", num_rows=20, spec=spec, config=EmbeddingStore.Config(timeout_s=2.0)
    )
    emb = StoreEmbedding(store)
    opt = StoreSparseOptimizer(emb)
    before = store.peek(np.arange(20), cols="emb").copy()
    (emb(torch.tensor([1, 2])).sum() * float("nan")).backward()
    with pytest.raises(NonFiniteError):
        opt.step()
    assert opt.discard() == 1  # the NaN step is dropped, its reads released
    assert np.array_equal(store.peek(np.arange(20), cols="emb"), before)
    emb(torch.tensor([1, 2])).sum().backward()  # no 2 s wait on the staleness bound
    opt.step()
    assert not np.array_equal(store.peek(np.array([1]), cols="emb"), before[1:2])
    store.close()  # checkpoints: no read is left open
    assert EmbeddingStore.open(tmp_path / "s").epoch == 1


def test_reads_that_no_step_could_close_are_refused_at_once(tmp_path: Path) -> None:
    plain = RowSpec(embedding_dim=4, optimizer=OptimizerConfig(kind="none"))
    with EmbeddingStore.create(tmp_path / "n", num_rows=10, spec=plain) as store:
        emb = StoreEmbedding(store)
        with pytest.raises(ValueError, match=r"no optimizer .* torch.no_grad"):
            emb(torch.tensor([1]))
        with torch.no_grad():
            assert emb(torch.tensor([1])).shape == (1, 4)  # lookups still work
    spec = RowSpec(embedding_dim=4, optimizer=OptimizerConfig(kind="sgd"))
    with EmbeddingStore.create(tmp_path / "s", num_rows=10, spec=spec) as store:
        emb = StoreEmbedding(store)
        opt = StoreSparseOptimizer(emb)
        heads = emb(torch.tensor([1, 2]))
        with pytest.raises(ValueError, match=r"1 ids \(e.g. 2\) were already read .* torch.cat"):
            emb(torch.tensor([2, 3]))  # at once, not after the store's timeout
        heads.sum().backward()
        opt.step()


def test_a_state_dict_of_another_store_of_the_same_shape_is_refused(tmp_path: Path) -> None:
    spec = RowSpec(embedding_dim=4, optimizer=OptimizerConfig(kind="sgd"))
    with (
        EmbeddingStore.create(tmp_path / "a", num_rows=10, spec=spec) as a,
        EmbeddingStore.create(tmp_path / "b", num_rows=10, spec=spec) as b,
    ):
        assert a.store_id != b.store_id and len(a.store_id) == 32
        state = StoreEmbedding(a).state_dict()
        with pytest.raises(ValueError, match="a different table of the same shape"):
            StoreEmbedding(b).load_state_dict(state)
    moved = tmp_path / "moved"
    (tmp_path / "a").rename(moved)  # a moved folder keeps its id: its state still loads
    with EmbeddingStore.open(moved) as again:
        StoreEmbedding(again).load_state_dict(state)


def test_pickling_a_store_module_names_what_to_save_instead(tmp_path: Path) -> None:
    import copy
    import io

    with EmbeddingStore.create(
        tmp_path / "s", num_rows=NUM_ROWS, spec=RowSpec(embedding_dim=DIM)
    ) as store:
        model = torch.nn.Sequential(StoreEmbedding(store), torch.nn.Linear(DIM, 1))
        for attempt in (lambda: torch.save(model, io.BytesIO()), lambda: copy.deepcopy(model)):
            with pytest.raises(TypeError, match=r"cannot be pickled .* save model\.state_dict\(\)"):
                attempt()
        torch.save(model.state_dict(), io.BytesIO())  # what the message suggests works


def test_the_optimizers_state_dict_round_trips_through_torch_save(tmp_path: Path) -> None:
    # A standard checkpoint loop saves the optimizer's state_dict beside the model's; the
    # rows (and their optimizer state) travel with the module's, this only checks the shape.
    spec = RowSpec(embedding_dim=DIM)
    with EmbeddingStore.create(tmp_path / "s", num_rows=NUM_ROWS, spec=spec) as store:
        bag = StoreEmbeddingBag(store)
        opt = StoreSparseOptimizer(bag)
        out = bag(torch.tensor([[1, 2]]))
        with pytest.raises(RuntimeError, match=r"1 forwards are pending; .* before state_dict"):
            opt.state_dict()
        out.sum().backward()
        opt.step()
        torch.save({"model": bag.state_dict(), "opt": opt.state_dict()}, tmp_path / "c.pt")
        saved = torch.load(tmp_path / "c.pt", weights_only=True)
        opt.load_state_dict(saved["opt"])
        assert saved["opt"]["num_store_modules"] == 1
        with pytest.raises(ValueError, match="saved for 2 store modules but this optimizer has 1"):
            opt.load_state_dict(saved["opt"] | {"num_store_modules": 2})
        with pytest.raises(
            ValueError,
            match=r"takes what StoreSparseOptimizer\.state_dict.*keys \['param_groups', 'state'\]",
        ):
            opt.load_state_dict(torch.optim.SGD([torch.zeros(1)]).state_dict())
