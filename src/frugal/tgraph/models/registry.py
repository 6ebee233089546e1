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

Or name it as `package.module:attribute` (`--model my_pkg.models:MyTGNN`) with no registration
code: the attribute is a `ModelSpec`, a `HeuristicModel` subclass (built as
`cls(num_nodes, window_s=...)`), a class with a `from_inputs(inputs)` classmethod (a
`TemporalGNN` subclass has one), or any callable `(ModelInputs) -> model`. A learned model is a
`torch.nn.Module` with the methods of `LEARNED_MODEL_METHODS` (`TemporalGNN` has them all);
`check_learned_model` names any that is missing.

A model declares how it scores (`ModelSpec.scoring`): 'node' models (every `TemporalGNN`) embed
nodes, so the evaluator ranks each query against every candidate destination from one
embedding per node; 'pair' models (CAWN, DyGFormer, NAT) score (src, dst, t) jointly through
`score_pairs` (`PAIR_MODEL_METHODS`), and are ranked against the protocol's fixed sample of
`num_ranking_candidates` destinations per query (rows say `ranking="sampled:N"`). A
referenced class or builder declares 'pair' with a `scoring = "pair"` attribute.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from dataclasses import replace as _replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from frugal import ConfigError
from frugal.registry import Registry, import_object
from frugal.tgraph.neighbors import NeighborStrategy

if TYPE_CHECKING:
    from frugal.tgraph.models.heuristics import HeuristicModel
    from frugal.tgraph.models.pair import PairScoringModel
    from frugal.tgraph.models.tgnn import TemporalGNN
    from frugal.tgraph.protocol import ProtocolConfig

__all__ = [
    "LEARNED_MODEL_METHODS",
    "MODELS",
    "PAIR_MODEL_METHODS",
    "TRAINING_SETTINGS",
    "ModelInputs",
    "ModelKind",
    "ModelProtocolError",
    "ModelSpec",
    "Scoring",
    "check_learned_model",
    "check_model_builds",
    "default_model_names",
    "heuristic_names",
    "model_names",
    "model_source_sha256",
    "register_model",
]

ModelKind = Literal["heuristic", "learned"]
Scoring = Literal["node", "pair"]


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
        scoring: 'node' (embeds nodes: `embed` + `score_all`, full candidate ranking) or
            'pair' (scores (src, dst, t) jointly with `score_pairs`, ranked against the
            protocol's sampled candidates). Heuristics score any pair matrix: 'node'.
        training: Per protocol name, training settings (`TRAINING_SETTINGS`) this model
            trains with instead of the protocol's: the values its reference ran (Benchtemp
            trains CAWN with batches of 32). The split, negatives and evaluation stay the
            protocol's, so every model is scored on the same events; a setting the user
            changed from the preset wins; rows list what was changed
            (`training_overrides`).
        in_default: Whether `frugal tgraph bench` runs it when no `--model` is given (False
            for models whose run takes hours on a CPU: name them with `--model`).
    """

    build: Callable[[ModelInputs], TemporalGNN | HeuristicModel | PairScoringModel]
    kind: ModelKind
    description: str = ""
    native_neighbor_strategy: NeighborStrategy = "recent"
    scoring: Scoring = "node"
    training: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    in_default: bool = True

    def training_overrides(self, protocol_name: str) -> dict[str, float]:
        """The training settings this model brings for the protocol `protocol_name`."""
        return dict(self.training.get(protocol_name, {}))

    def applied_training(self, config: ProtocolConfig) -> dict[str, float]:
        """The model's training settings that apply under `config`.

        A setting the user changed from the protocol's preset (`--set protocol.KEY=...`)
        wins over the model's own value.
        """
        from frugal.tgraph.protocol import PROTOCOLS

        overrides = self.training_overrides(config.name)
        if not overrides or config.name not in PROTOCOLS:
            return overrides
        preset = PROTOCOLS.get(config.name)
        return {k: v for k, v in overrides.items() if getattr(config, k) == getattr(preset, k)}

    def training_config(self, config: ProtocolConfig) -> ProtocolConfig:
        """`config` with this model's applicable training settings (`applied_training`)."""
        overrides: dict[str, Any] = self.applied_training(config)
        return _replace(config, **overrides) if overrides else config

    def __post_init__(self) -> None:
        for protocol, settings in self.training.items():
            unknown = sorted(set(settings) - set(TRAINING_SETTINGS))
            if unknown:
                raise ValueError(
                    f"training[{protocol!r}] sets {unknown}; a model may change only the "
                    f"training settings {', '.join(TRAINING_SETTINGS)} (the split, negatives "
                    "and evaluation are the protocol's)"
                )
        if self.scoring not in ("node", "pair"):
            raise ValueError(f"scoring={self.scoring!r} must be 'node' or 'pair'")
        if self.scoring == "pair" and self.kind != "learned":
            raise ValueError(
                f"scoring='pair' with kind={self.kind!r}: a heuristic scores any (src, dst) "
                "matrix; register it with scoring='node'"
            )


TRAINING_SETTINGS: tuple[str, ...] = (
    "train_batch_size",
    "max_epochs",
    "patience",
    "tolerance",
    "learning_rate",
)
"""The `ProtocolConfig` fields a model may set for itself (`ModelSpec.training`)."""


LEARNED_MODEL_METHODS: tuple[str, ...] = (
    "reset_state",  # () -> None: forget every event (start of each epoch)
    "state",  # () -> dict[str, Tensor]: a copy of the event state (buffers of state_dict)
    "load_state",  # (state) -> None: restore a `state()` copy
    "forward_batch",  # (src, dst_sets, t, first_eid, finder, rng) -> (logits list, memory,
    #                    last_update, message vectors or None); see TemporalGNN.forward_batch
    "commit_numpy",  # (src, dst, t, eid, vectors) -> None: store a scored batch's events
    "store_events",  # (src, dst, t, eid, vectors) -> None: store held-back events
    "write_staged",  # () -> None: write what the last forward_batch flushed, store nothing
    "peek_memory",  # () -> (memory (N, D), last_update (N,)) with every message applied
    "embed",  # (node, t, max_eid, finder, memory, last_update, rng) -> (B, D) embeddings
    "score_all",  # (z_src (B, D), z_cand (C, D)) -> (B, C) logits
    "neighbor_strategy",  # attribute: 'recent' or 'uniform'
)
"""What the trainer and evaluator call on a learned node-scoring model besides
`torch.nn.Module`'s own (`parameters`, `train`, `eval`, `state_dict`). `TemporalGNN`
documents each signature."""

PAIR_MODEL_METHODS: tuple[str, ...] = (
    "reset_state",
    "state",
    "load_state",
    "forward_batch",  # as a node model's; the memory and last_update it returns may be empty
    "commit_numpy",
    "store_events",
    "write_staged",
    "score_pairs",  # (src (B,), dst (B, C), t (B,), first_eid, finder, rng) -> (B, C) logits,
    #                  side-effect free (no state is read from or written to the batch)
    "neighbor_strategy",
)
"""What the trainer and evaluator call on a learned pair-scoring model (`scoring='pair'`):
no `embed`, `score_all` or `peek_memory`; `score_pairs` instead. `PairScoringModel`
documents each and implements all but `score_pairs` and `neighbor_strategy`."""


class ModelProtocolError(ConfigError, TypeError):
    """A model's builder returned something the trainer cannot run (bad input: CLI exit 2)."""


def check_learned_model(model: object, name: str, scoring: Scoring = "node") -> None:
    """Check that a learned model's builder returned what the trainer can run.

    Args:
        model: What the builder returned.
        name: The model's registered name, for messages.
        scoring: The spec's scoring: 'node' checks `LEARNED_MODEL_METHODS`, 'pair'
            `PAIR_MODEL_METHODS`.

    Raises:
        ModelProtocolError: (a `TypeError` and a `ConfigError`) If `model` is a
            `HeuristicModel`, is not a `torch.nn.Module`, or lacks any of the methods its
            scoring needs (the message names every missing one).
    """
    from torch import nn

    from frugal.tgraph.models.heuristics import HeuristicModel

    kind = type(model).__name__
    if isinstance(model, HeuristicModel):
        raise ModelProtocolError(
            f"model={name!r} is registered as kind='learned' but its builder returned a "
            f"{kind} (a HeuristicModel); register it with kind='heuristic'"
        )
    methods = PAIR_MODEL_METHODS if scoring == "pair" else LEARNED_MODEL_METHODS
    missing = [m for m in methods if not hasattr(model, m)]
    if not isinstance(model, nn.Module) or missing:
        what = "is not a torch.nn.Module" if not isinstance(model, nn.Module) else ""
        if missing:
            what += (" and " if what else "") + f"lacks {', '.join(missing)}"
        if scoring == "pair":
            raise ModelProtocolError(
                f"model={name!r} built a {kind}, which {what}: a pair-scoring tgraph model "
                "implements frugal.tgraph.models.PAIR_MODEL_METHODS (subclass PairScoringModel)"
            )
        raise ModelProtocolError(
            f"model={name!r} built a {kind}, which {what}: a learned tgraph model implements "
            "frugal.tgraph.models.LEARNED_MODEL_METHODS; subclass TemporalGNN (or assemble "
            "one from its parts, as examples/tgraph_own_model.py does) to get them all"
        )


def check_model_builds(name: str, inputs: ModelInputs) -> None:
    """Build a model once and check that the trainer can run it (before any training run).

    A learned model must pass `check_learned_model`; a heuristic must score a pair.

    Args:
        name: A registered model or a `package.module:attribute` reference.
        inputs: What its builder gets (the first dataset's, under the bench's protocol).

    Raises:
        ConfigError: If the name does not resolve, the builder fails (the message names the
            exception and how a model is built), or the model cannot be run.
    """
    from frugal.tgraph.models.heuristics import HeuristicModel

    spec = MODELS.get(name)
    try:
        model = spec.build(inputs)
    except Exception as exc:
        raise ConfigError(
            f"model={name!r}: building it from ModelInputs failed with {type(exc).__name__}: "
            f"{exc}; a model class needs a classmethod from_inputs(inputs) (a TemporalGNN "
            "subclass must pass its parts to TemporalGNN.from_inputs, as "
            "examples/tgraph_own_model.py does) or an __init__(inputs); a builder takes the "
            "ModelInputs and returns the model"
        ) from exc
    if spec.kind == "learned":
        check_learned_model(model, name, spec.scoring)
        return
    if not isinstance(model, HeuristicModel):
        raise ModelProtocolError(
            f"model={name!r} is registered as kind='heuristic' but its builder returned a "
            f"{type(model).__name__}; return a HeuristicModel, or register it as 'learned'"
        )
    one = np.zeros(1, dtype=np.int64)
    try:
        model.score(one, one, one + inputs.time_origin)
    except Exception as exc:
        raise ModelProtocolError(
            f"model={name!r} ({type(model).__name__}) cannot score a pair: "
            f"{type(exc).__name__}: {exc}; a HeuristicModel subclass defines "
            "_score(src, dst, t) -> scores"
        ) from exc


def model_source_sha256(name: str) -> str | None:
    """sha256 of the file of the module a `package.module:attribute` model lives in.

    Results of a model named by reference are keyed by it, so editing your model's module
    makes a bench run it again instead of reusing its earlier runs (a change in another
    module it imports is not seen). None for a registered name.

    Raises:
        ConfigError: If the reference does not resolve (see `MODELS.get`).
    """
    if ":" not in name or name in _REGISTERED_BY_NAME:
        return None
    MODELS.get(name)  # imports the module
    module = sys.modules.get(name.partition(":")[0])
    path = getattr(module, "__file__", None)
    if path is None:
        return None
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _resolve_reference(reference: str) -> ModelSpec:
    """The `ModelSpec` of a `package.module:attribute` model reference (see the module doc).

    Raises:
        ConfigError: If the reference does not import, or names no model, class or builder.
    """
    from frugal.tgraph.models.heuristics import HeuristicModel

    value = import_object(reference, field="model")
    if isinstance(value, ModelSpec):
        return value
    described = f"{reference} (user model)"
    if isinstance(value, type) and issubclass(value, HeuristicModel):
        cls = value

        def heuristic(inputs: ModelInputs) -> HeuristicModel:
            return cls(inputs.num_nodes, window_s=inputs.window_s)

        return ModelSpec(heuristic, "heuristic", described)
    build = getattr(value, "from_inputs", value) if isinstance(value, type) else value
    if not callable(build):
        raise ConfigError(
            f"model={reference!r} names a {type(value).__name__}, not a model: point it at a "
            "HeuristicModel or TemporalGNN subclass, a builder function (ModelInputs) -> "
            "model, or a ModelSpec"
        )
    scoring = getattr(value, "scoring", "node")
    if scoring == "pair":
        return ModelSpec(build, "learned", described, scoring="pair")
    if scoring != "node":
        raise ConfigError(
            f"model={reference!r} has scoring={scoring!r}; set it to 'node' or 'pair'"
        )
    return ModelSpec(build, "learned", described)


_REGISTERED_BY_NAME: set[str] = set()  # names given to register_model (not references)

MODELS: Registry[ModelSpec] = Registry("tgraph model", field="model", resolver=_resolve_reference)
"""Every model `run_link_prediction` and `frugal tgraph bench --model` accept (also
`package.module:attribute` references, resolved on first use)."""


def register_model(
    name: str,
    build: Callable[[ModelInputs], TemporalGNN | HeuristicModel | PairScoringModel],
    *,
    kind: ModelKind = "learned",
    description: str = "",
    native_neighbor_strategy: NeighborStrategy = "recent",
    scoring: Scoring = "node",
    training: Mapping[str, Mapping[str, float]] | None = None,
    in_default: bool = True,
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
        scoring: 'node' (embeds nodes; full candidate ranking) or 'pair' (implements
            `score_pairs`; ranked against the protocol's sampled candidates).
        training: Per protocol name, training settings the model uses instead of the
            protocol's (`ModelSpec.training`).
        in_default: Whether the bench runs it when no model is named (`ModelSpec.in_default`).
        replace: Whether to replace a model registered under the same name.

    Returns:
        The registered spec.

    Raises:
        ValueError: If `name` is taken and `replace` is False, scoring is 'pair' for a
            heuristic, or `training` sets more than `TRAINING_SETTINGS`.
    """
    spec = ModelSpec(
        build,
        kind,
        description,
        native_neighbor_strategy,
        scoring,
        dict(training or {}),
        in_default,
    )
    _REGISTERED_BY_NAME.add(name)
    return MODELS.register(name, spec, replace=replace)


def model_names() -> tuple[str, ...]:
    """Every registered model's name, built-in ones first."""
    return MODELS.names()


def default_model_names() -> tuple[str, ...]:
    """The models `frugal tgraph bench` runs when none is named (`ModelSpec.in_default`)."""
    return tuple(name for name in MODELS.names() if MODELS.get(name).in_default)


def heuristic_names() -> tuple[str, ...]:
    """The registered heuristic floors' names (each bench runs all of them)."""
    return tuple(name for name in MODELS if MODELS.get(name).kind == "heuristic")
