"""Use a disk-backed embedding table in your own PyTorch training loop.

The table lives in a `frugal.store.EmbeddingStore` on local disk behind a cache of
`--budget-mib`; `StoreEmbeddingBag` reads the rows a batch needs, and `StoreSparseOptimizer`
sends their gradients to the store's fused optimizer (Adagrad here), while the dense layer
trains with a plain `torch.optim` optimizer. The task is synthetic: each row has a hidden
scalar, and a sample's label is the sum of the scalars of its ids.

    python examples/store_training_loop.py            # 200k rows, 300 steps
    python examples/store_training_loop.py --tiny     # 2k rows, 40 steps (what the test runs)

Prints the loss of the first and last steps, and checks that the rows written with
`put` come back from `get` after a checkpoint and a reopen.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from frugal.store import EmbeddingStore, OptimizerConfig, RowSpec
from frugal.store.nn import StoreEmbeddingBag, StoreSparseOptimizer


def train(directory: Path, *, num_rows: int, steps: int, budget_mib: int) -> tuple[float, float]:
    """Train an embedding bag over a store plus a linear head; return first and last loss."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    hidden = rng.normal(size=num_rows).astype(np.float32)  # the scalar behind each row
    spec = RowSpec(embedding_dim=8, optimizer=OptimizerConfig(kind="adagrad", lr=0.1))
    config = EmbeddingStore.Config(memory_budget_bytes=budget_mib << 20)
    with EmbeddingStore.create(directory, num_rows=num_rows, spec=spec, config=config) as store:
        bag = StoreEmbeddingBag(store, mode="sum")
        head = torch.nn.Linear(bag.embedding_dim, 1)
        sparse_opt = StoreSparseOptimizer(bag)
        dense_opt = torch.optim.SGD(head.parameters(), lr=0.05)
        losses = []
        for _ in range(steps):
            ids_BF = rng.integers(0, num_rows, size=(64, 4))  # 64 samples of 4 ids
            target_B = torch.from_numpy(hidden[ids_BF].sum(axis=1))
            pred_B = head(bag(torch.from_numpy(ids_BF))).squeeze(1)
            loss = torch.nn.functional.mse_loss(pred_B, target_B)
            dense_opt.zero_grad()
            loss.backward()
            dense_opt.step()
            sparse_opt.step()  # the store applies Adagrad to the rows this step read
            losses.append(loss.item())
        store.checkpoint(meta={"steps": steps})
    return float(np.mean(losses[:5])), float(np.mean(losses[-5:]))


def round_trip(directory: Path) -> bool:
    """Write rows with `put`, checkpoint, reopen, and read them back with `get`."""
    spec = RowSpec(embedding_dim=4)  # plain SGD: a row is just its 4 floats
    ids = np.array([3, 17, 42], dtype=np.int64)
    rows = np.arange(12, dtype=np.float32).reshape(3, 4)
    with EmbeddingStore.create(directory, num_rows=100, spec=spec) as store:
        store.put(ids, rows)
        store.checkpoint()
    with EmbeddingStore.open(directory) as store:
        back = store.get(ids)
        store.apply_gradients(ids, np.zeros_like(back))  # closes the reads `get` opened
    return bool(np.array_equal(back, rows))


def main(argv: list[str] | None = None) -> dict[str, float | bool]:
    """Run the example; return the numbers it prints."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tiny", action="store_true", default=os.environ.get("FRUGAL_TINY", "") not in ("", "0")
    )
    parser.add_argument("--budget-mib", type=int, default=1, help="the store's RAM budget")
    parser.add_argument("--dir", type=Path, default=None, help="folder for the tables")
    args = parser.parse_args(argv)
    num_rows, steps = (2_000, 40) if args.tiny else (200_000, 300)
    with tempfile.TemporaryDirectory() as scratch:
        root = args.dir or Path(scratch)
        first, last = train(
            root / "table", num_rows=num_rows, steps=steps, budget_mib=args.budget_mib
        )
        same = round_trip(root / "roundtrip")
    print(f"loss: first steps {first:.4f}, last steps {last:.4f}")
    print(f"rows written with put come back after reopen: {same}")
    return {"first_loss": first, "last_loss": last, "round_trip": same}


if __name__ == "__main__":
    main()
