"""The tgraph model registry: each model registers how to build it from `ModelInputs`.

`run_link_prediction(name, ...)`, `frugal tgraph bench --model NAME` and the bench config look
models up here. Adding a model is one module that builds it plus one `register_model` call
(the built-in ones register at the bottom of their own module, imported by
`frugal.tgraph.models`); a user can register their own from outside the package:

    >>> from frugal.tgraph.models import MODELS, ModelInputs, register_model
    >>> from frugal.tgraph.models.tgn import build_tgn
    >>> register_model("tgn_wide", lambda inputs: build_tgn(inputs, num_heads=4),
    ...                description="TGN with 4 attention heads")
    >>> "tgn_wide" in MODELS
    True
    >>> _ = MODELS.unregister("tgn_wide")
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import numpy.typing as npt

from frugal.registry import Registry
from frugal.tgraph.neighbors import NeighborStrategy

if TYPE_CHECKING:
    from frugal.tgraph.models.heuristics import HeuristicModel
    from frugal.tgraph.models.tgnn import TemporalGNN

__all__ = [
    "MODELS",
    "ModelInputs",
    "ModelKind",
    "ModelSpec",
    "heuristic_names",
    "model_names",
    "register_model",
]

ModelKind = Literal["heuristic", "learned"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelInputs:
    """What a model builder gets: the graph's sizes and the protocol's shared settings.

    Attributes:
        num_nodes: N.
        msg: Edge features of every event, (E, F) float32 (F may be 0; under a protocol with
            `num_zero_edge_features` > 0, that many zero columns on featureless data).
        embedding_dim: D, memory / embedding / time-encoding width.
        num_neighbors: K, temporal neighbours per attention layer (TGAT uses 2 K).
        dropout: Dropout of attention and decoder layers.
        neighbor_strategy: How attention samples neighbours: 'recent' or 'uniform'.
        train_dt_stats: (mean, std) of the time since a node's previous training event.
        time_origin: Time of the stream's first event.
        window_s: The time window of the heuristics (EdgeBank-window, popularity), > 0.
    """

    num_nodes: int
    msg: npt.NDArray[np.float32]
    embedding_dim: int = 100
    num_neighbors: int = 10
    dropout: float = 0.1
    neighbor_strategy: NeighborStrategy = "recent"
    train_dt_stats: tuple[float, float] = (0.0, 1.0)
    time_origin: int = 0
    window_s: float = 1.0

    def __post_init__(self) -> None:
        if self.num_nodes < 1 or self.embedding_dim < 1 or self.num_neighbors < 1:
            raise ValueError(
                f"num_nodes={self.num_nodes}, embedding_dim={self.embedding_dim} and "
                f"num_neighbors={self.num_neighbors} must each be >= 1"
            )
        if self.msg.ndim != 2:
            raise ValueError(f"msg has shape {self.msg.shape}; edge features must be (E, F)")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One registered model.

    Attributes:
        build: Builds a fresh model from `ModelInputs` (under the caller's torch seed).
        kind: 'heuristic' (fitted in one pass, run once, no training) or 'learned'
            (trained by `run_link_prediction`, one run per seed).
        description: One line for `--help` and the docs.
        native_neighbor_strategy: The neighbour sampler of the model's published code, used
            under a protocol with `neighbor_sampling='native'` (TGAT: 'uniform').
    """

    build: Callable[[ModelInputs], TemporalGNN | HeuristicModel]
    kind: ModelKind
    description: str = ""
    native_neighbor_strategy: NeighborStrategy = "recent"


MODELS: Registry[ModelSpec] = Registry("tgraph model", field="model")
"""Every model `run_link_prediction` and `frugal tgraph bench --model` accept."""


def register_model(
    name: str,
    build: Callable[[ModelInputs], TemporalGNN | HeuristicModel],
    *,
    kind: ModelKind = "learned",
    description: str = "",
    native_neighbor_strategy: NeighborStrategy = "recent",
    replace: bool = False,
) -> ModelSpec:
    """Make `name` a model of `run_link_prediction` and `TgraphBenchConfig.models`.

    Args:
        name: The model's name, as users write it (`--model NAME`).
        build: Builds the model from `ModelInputs`: a `TemporalGNN` (or an `nn.Module` with
            its calls) for 'learned', a `HeuristicModel` for 'heuristic'.
        kind: 'learned' or 'heuristic'.
        description: One line saying what the model is.
        native_neighbor_strategy: The published code's neighbour sampler ('recent' or
            'uniform').
        replace: Whether to replace a model registered under the same name.

    Returns:
        The registered spec.

    Raises:
        ValueError: If `name` is taken and `replace` is False.
    """
    spec = ModelSpec(build, kind, description, native_neighbor_strategy)
    return MODELS.register(name, spec, replace=replace)


def model_names() -> tuple[str, ...]:
    """Every registered model's name, built-in ones first."""
    return MODELS.names()


def heuristic_names() -> tuple[str, ...]:
    """The registered heuristic floors' names (each bench runs all of them)."""
    return tuple(name for name in MODELS if MODELS.get(name).kind == "heuristic")
