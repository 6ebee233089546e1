"""Models of the tgraph benchmark: heuristic floors and TGNNs on shared building blocks.

New models (CAWN, NAT, NeurTW) plug in by implementing the same four calls the runner uses
(`reset_state`, `state`/`load_state`, scoring a batch, observing it); see `frugal.tgraph.train`.
"""

from typing import Literal

from frugal.tgraph.models.heuristics import HeuristicModel, HeuristicName
from frugal.tgraph.models.tgnn import TemporalAttention, TemporalGNN, TimeEncoder

__all__ = [
    "HEURISTICS",
    "MODELS",
    "TGNNS",
    "HeuristicModel",
    "HeuristicName",
    "ModelName",
    "TemporalAttention",
    "TemporalGNN",
    "TimeEncoder",
]

ModelName = Literal[
    "edgebank", "edgebank_window", "recency", "popularity", "jodie", "dyrep", "tgn", "tgat"
]
HEURISTICS: tuple[HeuristicName, ...] = ("edgebank", "edgebank_window", "recency", "popularity")
TGNNS: tuple[ModelName, ...] = ("jodie", "dyrep", "tgn", "tgat")
MODELS: tuple[ModelName, ...] = (*HEURISTICS, *TGNNS)
