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
from frugal.tgraph.models.components import AttentionMessage, MemoryEmbedding
from frugal.tgraph.models.registry import ModelInputs, register_model
from frugal.tgraph.models.tgnn import TemporalGNN, attention_embedding, memory_cell

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
    time_encoder = TimeEncoder(inputs.embedding_dim)
    # The endpoints of each scored batch are embedded as they are (no deduplication).
    attention = attention_embedding(
        inputs, time_encoder, num_layers=1, num_heads=num_heads, use_dedup=False
    )
    message = AttentionMessage(attention)
    # Message [m_u || z_v || e || phi].
    updater = memory_cell(nn.RNNCell, inputs)
    return TemporalGNN.from_inputs(
        inputs, time_encoder=time_encoder, embedding=MemoryEmbedding(), memory_updater=updater,
        message=message,
    )  # fmt: skip


register_model(
    "dyrep", build_dyrep, description="DyRep: RNN memory, attention messages (ICLR 2019)"
)
