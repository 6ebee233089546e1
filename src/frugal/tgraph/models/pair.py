"""The base of pair-scoring models (CAWN, DyGFormer, NAT): `PairScoringModel`.

A pair-scoring model (`ModelSpec.scoring='pair'`) scores (src, dst, t) jointly with
`score_pairs`. This base gives the event-state calls of `PAIR_MODEL_METHODS` as no-ops (a
model that reads only the neighbour finder the trainer passes in, as CAWN and DyGFormer do)
and `forward_batch` (through `score_pairs`), so such a subclass implements `score_pairs`
and `neighbor_strategy` only; a model with event state of its own (NAT's caches) overrides
`reset_state`, `state`, `load_state`, `commit_numpy` and `store_events` too.
"""

from __future__ import annotations

from typing import Self

import numpy as np
import torch
from torch import Tensor, nn

from frugal._typing import I64
from frugal.tgraph.models.registry import ModelInputs
from frugal.tgraph.neighbors import NeighborFinder

__all__ = ["PairScoringModel"]


class PairScoringModel(nn.Module):
    """A learned model that scores (src, dst, t) jointly and keeps no event state.

    `reset_state`, `load_state`, `commit_numpy`, `store_events` and `write_staged` do
    nothing and `state()` is empty: the model reads the neighbour finder only. A subclass
    implements `score_pairs` and a `neighbor_strategy` attribute or property ('recent', or
    'uniform' when it samples at random: the trainer then passes it an rng).
    """

    scoring = "pair"

    # -- event state: none ---------------------------------------------------------------
    @classmethod
    def from_inputs(cls, inputs: ModelInputs, **options: object) -> Self:
        """The model over the graph, width and dropout of `inputs`; `options` override.

        A subclass takes `(num_nodes, msg, *, embedding_dim, dropout, ...)`.
        """
        return cls(
            inputs.num_nodes, inputs.msg, embedding_dim=inputs.embedding_dim,
            dropout=inputs.dropout, **options,
        )  # fmt: skip

    def reset_state(self) -> None:
        """Nothing to forget: the model reads the neighbour finder."""

    def state(self) -> dict[str, Tensor]:
        """The event state: empty."""
        return {}

    def load_state(self, state: dict[str, Tensor]) -> None:
        """Nothing to restore."""

    def commit_numpy(
        self, src: I64, dst: I64, t: I64, eid: I64, other_vec: Tensor | None = None
    ) -> None:
        """Nothing to store: the finder holds the events."""

    store_events = commit_numpy

    def write_staged(self) -> None:
        """Nothing staged."""

    # -- scoring -------------------------------------------------------------------------
    def score_pairs(
        self,
        src: I64,
        dst: I64,
        t: I64,
        first_eid: int,
        finder: NeighborFinder,
        rng: np.random.Generator | None = None,
    ) -> Tensor:
        """Logits of (src[b], dst[b, c], t[b]) for every b and c; reads and writes no state.

        Args:
            src: Sources, (B,).
            dst: Destinations, (B, C).
            t: Query times, (B,).
            first_eid: Event-id bound: nothing with this id or later is read.
            finder: Neighbour finder over the events the model may see.
            rng: Generator of any random sampling.

        Returns:
            Logits, (B, C).
        """
        raise NotImplementedError

    def forward_batch(
        self,
        src: I64,
        dst_sets: list[I64],
        t: I64,
        first_eid: int,
        finder: NeighborFinder,
        rng: np.random.Generator | None = None,
    ) -> tuple[list[Tensor], Tensor, Tensor, None]:
        """Logits of each destination set (the trainer's call), through `score_pairs`.

        Returns:
            (logits per destination set, each (B,), an empty memory (0, 0), an empty
            last_update (0,), None): the model has no memory and no message vectors.
        """
        logits_BC = self.score_pairs(src, np.stack(dst_sets, axis=1), t, first_eid, finder, rng)
        return list(logits_BC.unbind(dim=1)), torch.zeros(0, 0), torch.zeros(0), None
