"""DyRep in the TGN framework: RNN memory, attention-embedding messages, memory as output.

Each message carries the other endpoint's attention embedding instead of its memory.

As in TGN's and Benchtemp's DyRep: no point-process intensity loss.

References:
    DyRep: Learning Representations over Dynamic Graphs, ICLR 2019 (attention-based
    messages); Temporal Graph Networks for Deep Learning on Dynamic Graphs, arXiv 2006.10637
    (DyRep as a TGN variant, table 1).
"""

from __future__ import annotations

from torch import nn

from frugal.tgraph.models.blocks import TimeEncoder
from frugal.tgraph.models.components import (
    AttentionMessage,
    GraphAttentionEmbedding,
    MemoryEmbedding,
)
from frugal.tgraph.models.registry import ModelInputs, register_model
from frugal.tgraph.models.tgnn import TemporalGNN

__all__ = ["build_dyrep"]


def build_dyrep(inputs: ModelInputs, *, num_heads: int = 2) -> TemporalGNN:
    """DyRep: one attention layer embeds each event's endpoints for their messages.

    Args:
        inputs: Sizes and shared settings.
        num_heads: Heads of the message's attention layer.

    Returns:
        The model, initialised under the caller's torch seed.

    Raises:
        ValueError: If `embedding_dim` is not divisible by `num_heads`.
    """
    d, edge_dim = inputs.embedding_dim, int(inputs.msg.shape[1])
    time_encoder = TimeEncoder(d)
    # The endpoints of each scored batch are embedded as they are (no deduplication).
    attention = GraphAttentionEmbedding(
        d, edge_dim, time_encoder, num_layers=1, num_neighbors=inputs.num_neighbors,
        num_heads=num_heads, dropout=inputs.dropout, neighbor_strategy=inputs.neighbor_strategy,
        use_dedup=False,
    )  # fmt: skip
    message = AttentionMessage(attention)
    # Message [m_u || z_v || e || phi]: width 2 D + F + D.
    updater = nn.RNNCell(2 * d + edge_dim + d, d)
    return TemporalGNN(
        inputs.num_nodes, inputs.msg, time_encoder=time_encoder, embedding=MemoryEmbedding(),
        memory_updater=updater, message=message, dropout=inputs.dropout,
        time_origin=inputs.time_origin,
    )  # fmt: skip


register_model(
    "dyrep", build_dyrep, description="DyRep: RNN memory, attention messages (ICLR 2019)"
)
