"""TGN: GRU memory, identity messages, keep-last aggregation, one graph-attention layer.

References:
    Temporal Graph Networks for Deep Learning on Dynamic Graphs, ICML 2020 GRL workshop,
    arXiv 2006.10637 (section 3; the TGN-attn configuration of table 1).
"""

from __future__ import annotations

from torch import nn

from frugal.tgraph.models.blocks import TimeEncoder
from frugal.tgraph.models.components import IdentityMessage
from frugal.tgraph.models.registry import ModelInputs, register_model
from frugal.tgraph.models.tgnn import TemporalGNN, attention_embedding, memory_cell

__all__ = ["build_tgn"]


def build_tgn(inputs: ModelInputs, *, num_layers: int = 1, num_heads: int = 2) -> TemporalGNN:
    """TGN over the K most recent neighbours (`inputs.num_neighbors`).

    Args:
        inputs: Sizes and shared settings.
        num_layers: Attention layers over memory.
        num_heads: Attention heads.

    Returns:
        The model, initialised under the caller's torch seed.

    Raises:
        ValueError: If `embedding_dim` is not divisible by `num_heads`.
    """
    time_encoder = TimeEncoder(inputs.embedding_dim)
    embedding = attention_embedding(
        inputs, time_encoder, num_layers=num_layers, num_heads=num_heads
    )
    # Message [m_u || m_v || e || phi].
    updater = memory_cell(nn.GRUCell, inputs)
    return TemporalGNN.from_inputs(
        inputs, time_encoder=time_encoder, embedding=embedding, memory_updater=updater,
        message=IdentityMessage(),
    )  # fmt: skip


register_model(
    "tgn", build_tgn, description="TGN: GRU memory, 1 attention layer (arXiv 2006.10637)"
)
