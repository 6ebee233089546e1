"""TGN: GRU memory, identity messages, keep-last aggregation, one graph-attention layer.

References:
    Temporal Graph Networks for Deep Learning on Dynamic Graphs, ICML 2020 GRL workshop,
    arXiv 2006.10637 (section 3; the TGN-attn configuration of table 1).
"""

from __future__ import annotations

from torch import nn

from frugal.tgraph.models.blocks import TimeEncoder
from frugal.tgraph.models.components import GraphAttentionEmbedding, IdentityMessage
from frugal.tgraph.models.registry import ModelInputs, register_model
from frugal.tgraph.models.tgnn import TemporalGNN

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
    d, edge_dim = inputs.embedding_dim, int(inputs.msg.shape[1])
    time_encoder = TimeEncoder(d)
    embedding = GraphAttentionEmbedding(
        d, edge_dim, time_encoder, num_layers=num_layers, num_neighbors=inputs.num_neighbors,
        num_heads=num_heads, dropout=inputs.dropout, neighbor_strategy=inputs.neighbor_strategy,
    )  # fmt: skip
    # Message [m_u || m_v || e || phi]: width 2 D + F + D.
    updater = nn.GRUCell(2 * d + edge_dim + d, d)
    return TemporalGNN(
        inputs.num_nodes, inputs.msg, time_encoder=time_encoder, embedding=embedding,
        memory_updater=updater, message=IdentityMessage(), dropout=inputs.dropout,
        time_origin=inputs.time_origin,
    )  # fmt: skip


register_model(
    "tgn", build_tgn, description="TGN: GRU memory, 1 attention layer (arXiv 2006.10637)"
)
