"""Models of the tgraph benchmark: a registry of heuristic floors and TGNNs.

`MODELS` maps each name `run_link_prediction` and `frugal tgraph bench --model` accept to a
`ModelSpec` that builds the model from `ModelInputs`. The TGNNs are `TemporalGNN`s assembled
from exchangeable parts (`frugal.tgraph.models.components`); a new model is one module with a
builder and one `register_model` call (its import below), or a `register_model` call in your
own code, or a `package.module:attribute` reference (`--model my_pkg.models:MyTGNN`). A model
that fits no part implements the calls the runner makes (`LEARNED_MODEL_METHODS`;
`check_learned_model` names any that is missing); a pair-scoring model such as `CAWN`,
`DyGFormer` or `NAT` implements `PAIR_MODEL_METHODS` (subclass `PairScoringModel`) and registers
with `scoring='pair'`.
"""

from frugal.tgraph.models.blocks import TemporalAttention, TimeEncoder
from frugal.tgraph.models.components import (
    AttentionMessage,
    EmbeddingModule,
    GraphAttentionEmbedding,
    IdentityMessage,
    LastAggregator,
    MemoryEmbedding,
    MessageFunction,
    TimeProjectionEmbedding,
)
from frugal.tgraph.models.heuristics import (
    EdgeBank,
    EdgeBankWindow,
    HeuristicModel,
    Popularity,
    Recency,
)
from frugal.tgraph.models.pair import PairScoringModel
from frugal.tgraph.models.registry import (
    LEARNED_MODEL_METHODS,
    MODELS,
    PAIR_MODEL_METHODS,
    ModelInputs,
    ModelKind,
    ModelProtocolError,
    ModelSpec,
    Scoring,
    check_learned_model,
    check_model_builds,
    default_model_names,
    heuristic_names,
    model_names,
    model_source_sha256,
    register_model,
)
from frugal.tgraph.models.tgnn import TemporalGNN

# The built-in learned models register on import, in this order (the bench's default order).
# isort: off
from frugal.tgraph.models import jodie as jodie
from frugal.tgraph.models import dyrep as dyrep
from frugal.tgraph.models import tgn as tgn
from frugal.tgraph.models import tgat as tgat
from frugal.tgraph.models import graphmixer as graphmixer
from frugal.tgraph.models import cawn as cawn
from frugal.tgraph.models import dygformer as dygformer
from frugal.tgraph.models import nat as nat
from frugal.tgraph.models import neurtw as neurtw

# isort: on
from frugal.tgraph.models.cawn import CAWN  # after the order above
from frugal.tgraph.models.dygformer import DyGFormer
from frugal.tgraph.models.graphmixer import MixerEmbedding, MixerLayer
from frugal.tgraph.models.nat import NAT
from frugal.tgraph.models.neurtw import NeurTW

__all__ = [
    "CAWN",
    "LEARNED_MODEL_METHODS",
    "MODELS",
    "NAT",
    "PAIR_MODEL_METHODS",
    "AttentionMessage",
    "DyGFormer",
    "EdgeBank",
    "EdgeBankWindow",
    "EmbeddingModule",
    "GraphAttentionEmbedding",
    "HeuristicModel",
    "IdentityMessage",
    "LastAggregator",
    "MemoryEmbedding",
    "MessageFunction",
    "MixerEmbedding",
    "MixerLayer",
    "ModelInputs",
    "ModelKind",
    "ModelProtocolError",
    "ModelSpec",
    "NeurTW",
    "PairScoringModel",
    "Popularity",
    "Recency",
    "Scoring",
    "TemporalAttention",
    "TemporalGNN",
    "TimeEncoder",
    "TimeProjectionEmbedding",
    "check_learned_model",
    "check_model_builds",
    "default_model_names",
    "heuristic_names",
    "model_names",
    "model_source_sha256",
    "register_model",
]
