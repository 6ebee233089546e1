"""TGAT: no memory; two temporal attention layers over zero node features.

References:
    Inductive Representation Learning on Temporal Graphs, ICLR 2020, arXiv 2002.07962
    (section 3; its code samples the 20 neighbours of each layer uniformly from the past).
"""

from __future__ import annotations

from frugal.tgraph.models.blocks import TimeEncoder
from frugal.tgraph.models.components import IdentityMessage
from frugal.tgraph.models.registry import ModelInputs, register_model
from frugal.tgraph.models.tgnn import TemporalGNN, attention_embedding

__all__ = ["build_tgat"]


def build_tgat(inputs: ModelInputs, *, num_layers: int = 2, num_heads: int = 2) -> TemporalGNN:
    """TGAT with 2 K neighbours per layer (K = `inputs.num_neighbors`; Benchtemp: 20).

    Args:
        inputs: Sizes and shared settings.
        num_layers: Attention layers.
        num_heads: Attention heads.

    Returns:
        The model, initialised under the caller's torch seed.

    Raises:
        ValueError: If `embedding_dim` is not divisible by `num_heads`.
    """
    time_encoder = TimeEncoder(inputs.embedding_dim)
    embedding = attention_embedding(
        inputs, time_encoder, num_layers=num_layers, num_heads=num_heads,
        num_neighbors=2 * inputs.num_neighbors, use_memory=False,
    )  # fmt: skip
    return TemporalGNN.from_inputs(
        inputs, time_encoder=time_encoder, embedding=embedding, memory_updater=None,
        message=IdentityMessage(),
    )  # fmt: skip


register_model(
    "tgat",
    build_tgat,
    description="TGAT: 2 attention layers, no memory (arXiv 2002.07962)",
    native_neighbor_strategy="uniform",
)
