"""Child process of the kill -9 test: train forever, checkpointing every 3 steps.

Usage: python crash_child.py STORE_DIR BACKEND. Resumes from the store's last checkpoint.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from frugal.store import EmbeddingStore, OptimizerConfig, RowSpec

NUM_ROWS = 20_000
SPEC = RowSpec(embedding_dim=8, optimizer=OptimizerConfig(kind="adam", lr=0.05))
CHECKPOINT_EVERY = 3


def step_batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    """The ids and gradients of one step, a function of the step only."""
    rng = np.random.default_rng(step)
    ids = rng.integers(0, NUM_ROWS, 400)
    grads = rng.standard_normal((400, SPEC.embedding_dim)).astype(np.float32)
    return ids, grads


def main() -> None:
    directory, backend = Path(sys.argv[1]), sys.argv[2]
    config = EmbeddingStore.Config(backend=backend, memory_budget_bytes=2 << 20)  # type: ignore[arg-type]
    if (directory / "MANIFEST").exists():
        store = EmbeddingStore.open(directory, config)
    else:
        store = EmbeddingStore.create(
            directory, num_rows=NUM_ROWS, spec=SPEC, config=config, seed=5
        )
    step = store.step
    while True:
        ids, grads = step_batch(step)
        store.get(ids, step=step)
        store.apply_gradients(ids, grads, step=step)
        step += 1
        if step % CHECKPOINT_EVERY == 0:
            store.checkpoint(step=step)


if __name__ == "__main__":
    main()
