"""Torch modules over an `EmbeddingStore`: an embedding bag and its sparse optimizer step.

The table is never a `torch.nn.Parameter`: each forward reads the unique rows it needs into a
leaf tensor, and `StoreSparseOptimizer.step()` sends that leaf's gradient to the store's fused
optimizer, which writes the rows back. Shape legend: B bags (samples), F ids per bag, U unique
ids, D embedding_dim.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from frugal.store.store import EmbeddingStore

__all__ = ["StoreEmbeddingBag", "StoreSparseOptimizer"]


class StoreEmbeddingBag(nn.Module):
    """`torch.nn.EmbeddingBag` whose weight lives in an `EmbeddingStore`.

    Args:
        store: The store holding the table (rows carry the optimizer state).
        mode: "sum" or "mean" pooling per bag.

    Raises:
        ValueError: If `mode` is not "sum" or "mean".
    """

    def __init__(self, store: EmbeddingStore, mode: Literal["sum", "mean"] = "sum") -> None:
        super().__init__()
        if mode not in ("sum", "mean"):
            raise ValueError(f"mode={mode!r}; choose 'sum' or 'mean'")
        self.store = store
        self.mode = mode
        self.step = 0
        self.pending: list[tuple[int, npt.NDArray[np.int64], Tensor]] = []

    @property
    def embedding_dim(self) -> int:
        """D, the length of each row's vector."""
        return self.store.spec.embedding_dim

    def forward(self, indices: Tensor, offsets: Tensor | None = None) -> Tensor:
        """Pool the rows of each bag.

        Args:
            indices: int64 ids, (B, F) for fixed-size bags, or flat (N,) with `offsets`.
            offsets: Start of each bag in flat `indices`, (B,); None for 2-D `indices`.

        Returns:
            Pooled embeddings, float32 (B, D).

        Raises:
            ValueError: If `indices` is 1-D without offsets or 2-D with offsets.
        """
        if indices.is_floating_point() or indices.is_complex() or indices.dtype == torch.bool:
            raise TypeError(
                f"indices must be an integer tensor, got {indices.dtype}; pass torch.long ids"
            )
        if (indices.dim() == 1) != (offsets is not None):
            raise ValueError(
                f"indices of shape {tuple(indices.shape)} need offsets iff they are 1-D"
            )
        unique_U, inverse = torch.unique(indices, return_inverse=True)
        ids = unique_U.numpy().astype(np.int64)
        if self.training:  # opens reads that StoreSparseOptimizer.step() closes
            rows_UD = self.store.get(ids, step=self.step, cols="emb")
        else:  # evaluation: no update follows, so read without opening reads
            rows_UD = self.store.peek(ids, cols="emb")
        weight_UD = torch.from_numpy(rows_UD).requires_grad_(self.training)
        if self.training:
            self.pending.append((self.step, ids, weight_UD))
        self.step += 1
        return F.embedding_bag(inverse, weight_UD, offsets, mode=self.mode)


class StoreSparseOptimizer:
    """Apply the store's fused optimizer to the rows each forward of `module` read.

    Call `zero_grad()` is not needed: every step uses fresh leaf tensors. Until `step()` runs,
    the rows' reads stay open (they count against the store's staleness bound).
    """

    def __init__(self, module: StoreEmbeddingBag) -> None:
        self.module = module

    def step(self) -> None:
        """Send each pending forward's gradient to `apply_gradients`, oldest first.

        Raises:
            RuntimeError: If a pending forward has no gradient (backward was not called); then
                nothing is applied and the forwards stay pending.
        """
        pending = self.module.pending
        for step, _, weight in pending:  # check all before applying any: nothing half-done
            if weight.grad is None:
                raise RuntimeError(
                    f"the forward of step {step} has no gradient; call loss.backward() first "
                    "(its rows stay read until a step() with gradients)"
                )
        self.module.pending = []
        for step, ids, weight in pending:
            assert weight.grad is not None  # checked above
            grads = weight.grad.detach().numpy().astype(np.float32, copy=False)
            self.module.store.apply_gradients(ids, np.ascontiguousarray(grads), step=step)
