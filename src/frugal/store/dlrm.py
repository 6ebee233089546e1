"""A DLRM whose embedding tables live in a store: MLKV's DLRM workload with a real model.

DLRM (Naumov et al., "Deep Learning Recommendation Model for Personalization and
Recommendation Systems", arXiv 1906.00091): each of F categorical fields looks up a D-dim
embedding; the pairwise dot products of the F embeddings (and of the bottom MLP's output, when
there are dense features) go with the embeddings into a top MLP that predicts a click logit.
Here the F fields share one table of rows (the Criteo layout of the store bench: field f's ids
are offset into one id space), read through any table with `get` / `apply_gradients` /
`lookahead` (an `EmbeddingStore`, or the store bench's baselines); the dense MLPs are torch
parameters with a torch optimizer, as Persia and TorchRec train them.

Shape legend: B samples, F fields, U unique ids of a batch, D embedding_dim.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from frugal._typing import F32, I64

__all__ = ["DLRM", "dlrm_step", "dlrm_update"]


class DLRM(nn.Module):
    """DLRM's interaction and top MLP over F looked-up embeddings (no dense features).

    Args:
        num_fields: F, categorical fields per sample.
        embedding_dim: D.
        top_mlp: Hidden widths of the top MLP (DLRM's Criteo-Kaggle setup: 512, 256).
        seed: Seed of the MLP's initial weights.

    Raises:
        ValueError: If `num_fields` < 2 (nothing interacts) or a width is < 1.
    """

    def __init__(
        self,
        num_fields: int,
        embedding_dim: int,
        top_mlp: tuple[int, ...] = (512, 256),
        seed: int = 0,
    ) -> None:
        super().__init__()
        if num_fields < 2:
            raise ValueError(f"num_fields={num_fields} must be >= 2 (dot interactions)")
        if embedding_dim < 1 or any(width < 1 for width in top_mlp):
            raise ValueError(f"embedding_dim={embedding_dim} and top_mlp={top_mlp} must be >= 1")
        self.num_fields = num_fields
        rows, cols = torch.triu_indices(num_fields, num_fields, offset=1)
        self.pair_rows: Tensor = rows  # the F(F-1)/2 pairs i < j (CPU indices, not state)
        self.pair_cols: Tensor = cols
        widths = (num_fields * embedding_dim + len(rows), *top_mlp)
        generator = torch.Generator().manual_seed(seed)
        layers: list[nn.Module] = []
        for width_in, width_out in itertools.pairwise(widths):
            layers += [nn.Linear(width_in, width_out), nn.ReLU()]
        layers.append(nn.Linear(widths[-1], 1))
        self.top = nn.Sequential(*layers)
        with torch.no_grad():  # seeded, independent of torch's global RNG
            for layer in self.top:
                if isinstance(layer, nn.Linear):
                    bound = 1.0 / float(np.sqrt(layer.in_features))
                    layer.weight.uniform_(-bound, bound, generator=generator)
                    layer.bias.uniform_(-bound, bound, generator=generator)

    def features(self, emb_BFD: Tensor) -> Tensor:
        """The top MLP's input: the F embeddings, then the F(F-1)/2 dots i < j, (B, F*D + P).

        Raises:
            ValueError: If the field count differs from `num_fields`.
        """
        if emb_BFD.dim() != 3 or emb_BFD.shape[1] != self.num_fields:
            raise ValueError(
                f"embeddings of shape {tuple(emb_BFD.shape)}; expected (B, {self.num_fields}, D)"
            )
        dots_BFF = torch.bmm(emb_BFD, emb_BFD.transpose(1, 2))
        pairs = dots_BFF[:, self.pair_rows, self.pair_cols]  # (B, F(F-1)/2)
        return torch.cat([emb_BFD.flatten(1), pairs], dim=1)

    def forward(self, emb_BFD: Tensor) -> Tensor:
        """Click logits of B samples from their F embeddings, (B, F, D) -> (B,).

        Raises:
            ValueError: If the field count differs from `num_fields`.
        """
        logits: Tensor = self.top(self.features(emb_BFD)).squeeze(1)
        return logits


def dlrm_update(
    model: DLRM,
    optimizer: torch.optim.Optimizer,
    rows_UD: F32,
    inverse_BF: I64,
    labels_B: F32,
) -> tuple[float, F32]:
    """Forward and backward over rows already read: the loss and the gradient of each row.

    The MLP's gradients are left in its parameters; the caller steps `optimizer` once the
    rows' update has gone through (`dlrm_step` does), so a refused row update changes nothing.

    Args:
        model: The DLRM.
        optimizer: The MLP's torch optimizer (its gradients are zeroed first).
        rows_UD: The batch's unique rows, float32 (U, D).
        inverse_BF: Each sample's field ids as indices into `rows_UD`, (B, F).
        labels_B: float32 click labels in {0, 1}, (B,).

    Returns:
        The batch's mean binary cross-entropy and the gradient of each unique row, (U, D).
    """
    leaf = torch.from_numpy(np.ascontiguousarray(rows_UD)).requires_grad_(True)
    emb_BFD = leaf[torch.from_numpy(np.ascontiguousarray(inverse_BF))]
    logits = model(emb_BFD)
    loss = F.binary_cross_entropy_with_logits(logits, torch.from_numpy(labels_B))
    optimizer.zero_grad()
    loss.backward()  # type: ignore[no-untyped-call]  # torch stub gap
    assert leaf.grad is not None  # a leaf the loss used
    grads: F32 = leaf.grad.numpy()
    return float(loss.detach()), grads


def _check_batch(model: DLRM, ids_BF: Any, labels_B: Any, embedding_dim: int | None) -> None:
    """Refuse a batch before any row is read (a failed step must not leave reads open)."""
    if not isinstance(ids_BF, np.ndarray) or ids_BF.dtype.kind not in "iu" or ids_BF.ndim != 2:
        raise TypeError(
            f"ids must be a 2-D integer numpy array (B, F), got {type(ids_BF).__name__} "
            f"{getattr(ids_BF, 'dtype', '')} {getattr(ids_BF, 'shape', '')}; for a tensor "
            "pass ids.numpy()"
        )
    if ids_BF.shape[1] != model.num_fields:
        raise ValueError(
            f"ids have {ids_BF.shape[1]} fields per sample but the model was built for "
            f"num_fields={model.num_fields}"
        )
    if (
        not isinstance(labels_B, np.ndarray)
        or labels_B.dtype != np.float32
        or labels_B.shape != (ids_BF.shape[0],)
    ):
        raise ValueError(
            f"labels must be float32 of shape ({ids_BF.shape[0]},), one per sample, got "
            f"{getattr(labels_B, 'dtype', type(labels_B).__name__)} "
            f"{getattr(labels_B, 'shape', '')}"
        )
    if not ((labels_B == 0) | (labels_B == 1)).all():
        raise ValueError("labels must be 0 or 1 (click or not)")
    width = model.top[0].in_features if isinstance(model.top[0], nn.Linear) else None
    if embedding_dim is not None and width is not None:
        pairs = len(model.pair_rows)
        if width != model.num_fields * embedding_dim + pairs:
            raise ValueError(
                f"the table's rows have embedding_dim={embedding_dim} but the model was "
                f"built for {(width - pairs) // model.num_fields}; build DLRM(num_fields, "
                f"{embedding_dim})"
            )


def dlrm_step(
    model: DLRM,
    optimizer: torch.optim.Optimizer,
    table: Any,
    ids_BF: I64,
    labels_B: F32,
    step: int,
) -> float:
    """One training step: read the batch's rows, forward, backward, update rows and MLP.

    The batch is checked before any row is read; if the forward or backward fails after the
    read, the rows' reads are released (`table.release`, when the table has it) and nothing
    is updated.

    Args:
        model: The DLRM.
        optimizer: The MLP's torch optimizer.
        table: The embedding table (`get(ids, step)`, `apply_gradients(ids, grads, step)`).
        ids_BF: int64 ids, (B, F).
        labels_B: float32 click labels in {0, 1}, (B,).
        step: The training step (staleness and lookahead bookkeeping of the table).

    Returns:
        The batch's mean binary cross-entropy.

    Raises:
        TypeError: If ids are not a 2-D integer numpy array.
        ValueError: If the field count, the labels or the table's embedding_dim do not fit
            the model.
    """
    spec = getattr(table, "spec", None)
    _check_batch(model, ids_BF, labels_B, getattr(spec, "embedding_dim", None))
    unique_U, inverse = np.unique(ids_BF, return_inverse=True)
    rows_UD = table.get(unique_U, step)
    try:
        loss, grads = dlrm_update(
            model, optimizer, rows_UD, inverse.reshape(ids_BF.shape), labels_B
        )
    except BaseException:
        release = getattr(table, "release", None)
        if release is not None:
            release(unique_U, step)
        raise
    table.apply_gradients(unique_U, grads, step)
    optimizer.step()
    return loss
