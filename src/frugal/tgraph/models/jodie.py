"""JODIE in the TGN framework: RNN memory, identity messages, time-projection embedding.

As in TGN's and Benchtemp's JODIE: no t-batches and no projection loss.

References:
    Predicting Dynamic Embedding Trajectory in Temporal Interaction Networks, KDD 2019,
    arXiv 1908.01207 (RNN update and projection, section 3); Temporal Graph Networks for
    Deep Learning on Dynamic Graphs, arXiv 2006.10637 (JODIE as a TGN variant, table 1).
"""

from __future__ import annotations

from torch import nn

from frugal.tgraph.models.blocks import TimeEncoder
from frugal.tgraph.models.components import IdentityMessage, TimeProjectionEmbedding
from frugal.tgraph.models.registry import ModelInputs, register_model
from frugal.tgraph.models.tgnn import TemporalGNN, memory_cell

__all__ = ["build_jodie"]


def build_jodie(inputs: ModelInputs) -> TemporalGNN:
    """JODIE: z(u, t) = m_u * (1 + W dt_hat), dt normalised by `inputs.train_dt_stats`.

    Args:
        inputs: Sizes and shared settings.

    Returns:
        The model, initialised under the caller's torch seed.
    """
    time_encoder = TimeEncoder(inputs.embedding_dim)
    updater = memory_cell(nn.RNNCell, inputs)
    embedding = TimeProjectionEmbedding(inputs.embedding_dim, inputs.train_dt_stats)
    return TemporalGNN.from_inputs(
        inputs, time_encoder=time_encoder, embedding=embedding, memory_updater=updater,
        message=IdentityMessage(),
    )  # fmt: skip


register_model(
    "jodie", build_jodie, description="JODIE: RNN memory, time projection (arXiv 1908.01207)"
)
