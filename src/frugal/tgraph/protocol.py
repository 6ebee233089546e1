"""The evaluation protocol: chronological split, masked-node inductive views, fixed negatives.

One `Protocol` is built per (dataset, `ProtocolConfig`) and used unchanged by every model: the
train/val/test cut, the masked nodes and every evaluation negative are fixed here, saved to a
`.npz` file with its SHA-256, and folded into `protocol_hash`, which goes on every result row.

Every choice in which Benchtemp's pipeline differs from frugal's is a `ProtocolConfig` field,
and the two protocols are presets in `PROTOCOLS` (`protocol_preset(name)`):
- `frugal` (default): cuts at the timestamp boundary nearest to 70 % / 85 % of the events (no
  timestamp in two splits), 10 % of the nodes active after the val cut masked with a seeded
  numpy generator, random / historical / inductive negatives shared by all views, collisions
  with true events at the same time filtered and counted.
- `benchtemp`: Benchtemp's exact split (linear quantiles of t, `ts <= val_time`), its node
  masking (`random.seed(2020)`, `random.sample` over the same set iteration order) and its
  seeded per-view random negatives (`RandEdgeSampler` seeds 0-5, drawn per eval batch).

Shape legend: E events, N nodes, S events of one split.

References:
    BenchTemp: A General Benchmark for Evaluating Temporal Graph Neural Networks, ICDE 2024,
    arXiv 2308.16385 (section III, data split and negative sampling).
    Towards Better Evaluation for Dynamic Link Prediction, NeurIPS 2022 Datasets and
    Benchmarks, arXiv 2207.10128 (historical and inductive negatives).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from frugal import FrugalError
from frugal._typing import I64, Bool
from frugal.config import ConfigError, check_types
from frugal.data import TemporalEvents
from frugal.disk import guard_write
from frugal.registry import Registry
from frugal.results import write_text_atomically

__all__ = [
    "PROTOCOLS",
    "SPLITS",
    "VIEWS",
    "Protocol",
    "ProtocolConfig",
    "ProtocolError",
    "TemporalSplit",
    "build_protocol",
    "build_split",
    "check_protocol",
    "protocol_preset",
    "register_protocol",
]

NegativeStrategy = Literal["random", "historical", "inductive"]
SplitCut = Literal["timestamp_boundary", "time_quantile"]
MaskSampler = Literal["numpy", "python_random"]
NegativeSampler = Literal["shared", "rand_edge_sampler"]
NeighborBound = Literal["batch", "time"]
EvalNeighborEvents = Literal["visible", "all"]
EarlyStoppingMetric = Literal["ap", "ap_per_batch"]
NeighborSampling = Literal["recent", "native"]
SPLITS = ("val", "test")
VIEWS = ("transductive", "inductive", "new_old", "new_new")
_RESAMPLE_ROUNDS = 8
# Benchtemp's RandEdgeSampler seeds per (split, view) for the TGN family (section 4 of the brief).
_BENCHTEMP_SEEDS = {
    ("val", "transductive"): 0,
    ("val", "inductive"): 1,
    ("test", "transductive"): 2,
    ("test", "inductive"): 3,
    ("test", "new_old"): 4,
    ("test", "new_new"): 5,
}


class ProtocolError(FrugalError):
    """A protocol check failed (a future event in training, val/test overlap, a leaked node)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ProtocolConfig:
    """Every setting that must be equal across models for results to be comparable.

    The defaults are the `frugal` protocol. Each way in which Benchtemp's pipeline differs is
    a field of its own (`split_cut`, `mask_sampler`, `negative_sampler`, `use_tie_holdback`,
    `neighbor_bound`, `eval_neighbor_events`, `use_view_passes`, `early_stopping_metric`,
    `num_zero_edge_features`, `neighbor_sampling`), so a protocol between the two is one
    `dataclasses.replace` away. The named presets live in `PROTOCOLS` (`protocol_preset`);
    `name` only labels results, no code reads it.

    Example:
        >>> from dataclasses import replace
        >>> config = replace(protocol_preset("frugal"), use_tie_holdback=False)
        >>> config.name, config.use_tie_holdback
        ('frugal', False)
    """

    name: str = "frugal"
    """Label of the protocol on result rows and tables (a preset's name, or your own); the
    behaviour comes from the other fields only."""
    val_quantile: float = 0.70
    """Fraction of events before the validation cut, in (0, 1)."""
    test_quantile: float = 0.85
    """Fraction of events before the test cut, in (val_quantile, 1)."""
    split_cut: SplitCut = "timestamp_boundary"
    """'timestamp_boundary': cut at the timestamp boundary nearest to the quantile's event
    position (no timestamp in two splits); 'time_quantile': Benchtemp's linear quantiles of t,
    train `t <= val_time`, val `val_time < t <= test_time`, test `t > test_time`."""
    mask_fraction: float = 0.1
    """Share of all nodes masked from training for the inductive views, in [0, 0.5]."""
    mask_seed: int = 2020
    """Seed of the node mask (Benchtemp: random.seed(2020))."""
    mask_sampler: MaskSampler = "numpy"
    """'numpy': a seeded numpy draw from the nodes active after the val cut; 'python_random':
    Benchtemp's `random.sample` over the same pool in Python set iteration order (1-based
    ids), bit for bit."""
    negative_sampler: NegativeSampler = "shared"
    """'shared': one negative per event and strategy in `negative_strategies`, shared by all
    views, collisions with true events redrawn; 'rand_edge_sampler': Benchtemp's seeded
    random `RandEdgeSampler` per (split, view), drawn per eval batch (random only)."""
    negative_strategies: tuple[NegativeStrategy, ...] = ("random", "historical", "inductive")
    """Evaluation negatives; 'rand_edge_sampler' takes ('random',) only."""
    negative_seed: int = 0
    """Seed of the 'shared' evaluation negatives."""
    use_tie_holdback: bool = True
    """Hold a scored eval batch's events back from memory and heuristics until the first
    batch that starts after their time (False: commit each batch right after scoring it, as
    Benchtemp does)."""
    neighbor_bound: NeighborBound = "batch"
    """'batch': a query sees only events before its time and before its batch's first event;
    'time': only the time bound (Benchtemp: a query sees its own batch's earlier events)."""
    eval_neighbor_events: EvalNeighborEvents = "visible"
    """Events the val/test neighbour finder holds: 'visible' = the training events and every
    event from the val cut on (masked nodes' training-period events stay hidden); 'all' =
    every event (Benchtemp's full-data finder)."""
    use_view_passes: bool = False
    """Score each inductive test view (inductive, new_old, new_new) in a pass of its own from
    the state backed up after validation, as Benchtemp does (False: masks over one pass)."""
    early_stopping_metric: EarlyStoppingMetric = "ap"
    """Validation statistic early stopping reads: 'ap' (global) or 'ap_per_batch' (the mean
    over eval batches, Benchtemp's)."""
    num_zero_edge_features: int = 0
    """Width of the all-zero edge features given to models on data without edge features,
    >= 0 (Benchtemp: 172)."""
    neighbor_sampling: NeighborSampling = "recent"
    """'recent': every model samples its K most recent neighbours; 'native': each model its
    published sampler (`ModelSpec.native_neighbor_strategy`; TGAT uniform)."""
    train_batch_size: int = 200
    """Events per training batch."""
    eval_batch_size: int = 200
    """Events per evaluation batch (also the per-batch metric's batch)."""
    max_epochs: int = 50
    """Epoch cap."""
    patience: int = 5
    """Epochs without validation improvement before stopping (never looks at test)."""
    tolerance: float = 1e-4
    """Minimum absolute gain of the early-stopping statistic that counts as an improvement."""
    learning_rate: float = 1e-4
    """Adam learning rate."""
    dropout: float = 0.1
    """Dropout of attention and decoder layers."""
    embedding_dim: int = 100
    """Memory, embedding and time-encoding width (Benchtemp: 172)."""
    num_neighbors: int = 10
    """Temporal neighbours per attention layer (TGN family; TGAT uses twice this)."""
    use_ranking: bool = True
    """Compute MRR / Hits@k on the test split: node-scoring models and heuristics against all
    candidate destinations (`ranking="all"`), pair-scoring models against the sampled set
    below (`ranking="sampled:N"`)."""
    num_ranking_candidates: int = 100
    """N, the fixed sample of candidate destinations per test query that pair-scoring models
    (CAWN) are ranked against, and every other model as well (`sampled_mrr`), >= 0 (0: no
    sampled ranking; pair models then get no MRR). Drawn once per protocol without
    replacement, uniformly from the candidate destinations (items if bipartite) minus every
    true destination of the same (src, t), stored and hashed with the negatives. 100 is the
    number of negatives per query of TGB's `NegativeEdgeGenerator` (`num_neg_e`)."""

    def __post_init__(self) -> None:
        check_types(self)
        if not self.name or self.name != self.name.strip():
            raise ValueError(f"name={self.name!r} must be a non-empty label without spaces")
        if not 0 < self.val_quantile < self.test_quantile < 1:
            raise ValueError(
                f"val_quantile={self.val_quantile}, test_quantile={self.test_quantile}: need "
                "0 < val_quantile < test_quantile < 1"
            )
        if not 0 <= self.mask_fraction <= 0.5:
            raise ValueError(f"mask_fraction={self.mask_fraction} must lie in [0, 0.5]")
        if not self.negative_strategies:
            raise ValueError("negative_strategies is empty; list at least 'random'")
        if self.negative_sampler == "rand_edge_sampler" and self.negative_strategies != ("random",):
            raise ValueError(
                f"negative_strategies={self.negative_strategies} but negative_sampler="
                "'rand_edge_sampler' draws random negatives only; set negative_strategies="
                "('random',) or negative_sampler='shared'"
            )
        for name in ("train_batch_size", "eval_batch_size", "max_epochs", "embedding_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.num_zero_edge_features < 0:
            raise ValueError(f"num_zero_edge_features={self.num_zero_edge_features} must be >= 0")
        if self.patience < 0 or self.tolerance < 0 or self.learning_rate <= 0:
            raise ValueError("patience and tolerance must be >= 0 and learning_rate > 0")
        if not 0 <= self.dropout < 1 or self.num_neighbors < 1:
            raise ValueError("dropout must lie in [0, 1) and num_neighbors be >= 1")
        if self.num_ranking_candidates < 0:
            raise ValueError(
                f"num_ranking_candidates={self.num_ranking_candidates} must be >= 0 (0 turns "
                "the sampled ranking off)"
            )

    @classmethod
    def benchtemp(cls) -> ProtocolConfig:
        """The registered `benchtemp` preset (`protocol_preset("benchtemp")`)."""
        return protocol_preset("benchtemp")


PROTOCOLS: Registry[ProtocolConfig] = Registry("tgraph protocol", field="protocol")
"""The named protocol presets (`--protocol`, `protocol.name` in a recipe): `frugal`,
`benchtemp`, and any registered with `register_protocol`."""


def register_protocol(config: ProtocolConfig, *, replace: bool = False) -> ProtocolConfig:
    """Make `config` a preset under `config.name`; return it.

    Args:
        config: The preset's settings.
        replace: Whether to replace a preset registered under the same name.

    Returns:
        `config`.

    Raises:
        ValueError: If the name is taken and `replace` is False.
    """
    return PROTOCOLS.register(config.name, config, replace=replace)


def protocol_preset(name: str) -> ProtocolConfig:
    """The preset registered as `name`.

    Raises:
        ValueError: If no preset has that name (the message lists the registered ones).
    """
    return PROTOCOLS.get(name)


register_protocol(ProtocolConfig())
register_protocol(
    # Benchtemp's choices for the TGN family (section III of the paper; its TGN/JODIE/DyRep
    # and TGAT scripts): dims 172, patience 3, tolerance 1e-10, seeded random negatives.
    ProtocolConfig(
        name="benchtemp",
        split_cut="time_quantile",
        mask_sampler="python_random",
        negative_sampler="rand_edge_sampler",
        negative_strategies=("random",),
        use_tie_holdback=False,
        neighbor_bound="time",
        eval_neighbor_events="all",
        use_view_passes=True,
        early_stopping_metric="ap_per_batch",
        num_zero_edge_features=172,
        neighbor_sampling="native",
        embedding_dim=172,
        patience=3,
        tolerance=1e-10,
        dropout=0.1,
        num_neighbors=10,
    )
)


@dataclass(frozen=True, eq=False)
class TemporalSplit:
    """A chronological train/val/test split with masked nodes for the inductive views.

    Attributes:
        events: The full event stream.
        val_start: Position of the first validation event.
        test_start: Position of the first test event.
        train_index: Positions of the training events (train period, no masked endpoint).
        masked_nodes: Nodes whose training events were dropped, sorted.
        new_node: True for nodes absent from the training graph, shape (N,).
        fractions: Realised train/val/test shares of the events.
    """

    events: TemporalEvents
    val_start: int
    test_start: int
    train_index: I64
    masked_nodes: I64
    new_node: Bool
    fractions: dict[str, float] = field(default_factory=dict)

    def bounds(self, split: str) -> tuple[int, int]:
        """Positions [start, end) of the events of `split` ('val' or 'test').

        Raises:
            ValueError: On an unknown split.
        """
        if split == "val":
            return self.val_start, self.test_start
        if split == "test":
            return self.test_start, self.events.num_events
        raise ValueError(f"split={split!r} must be 'val' or 'test'")

    def view_mask(self, split: str, view: str) -> Bool:
        """Which events of `split` belong to `view`, shape (S,).

        Transductive: all; inductive: >= 1 new endpoint; new_old: exactly 1; new_new: both.

        Raises:
            ValueError: On an unknown split or view.
        """
        start, end = self.bounds(split)
        new_count = self.new_node[self.events.src[start:end]].astype(np.int64) + self.new_node[
            self.events.dst[start:end]
        ].astype(np.int64)
        if view == "transductive":
            return np.ones(end - start, dtype=bool)
        wanted = {"inductive": (1, 2), "new_old": (1, 1), "new_new": (2, 2)}.get(view)
        if wanted is not None:
            mask: Bool = (new_count >= wanted[0]) & (new_count <= wanted[1])
            return mask
        raise ValueError(f"view={view!r} must be one of {VIEWS}")


def _nearest_boundary(t: I64, target: float) -> int:
    """Position p with t[p-1] < t[p] (a timestamp boundary) nearest to `target`."""
    boundaries = np.flatnonzero(np.concatenate([[True], t[1:] != t[:-1], [True]]))
    return int(boundaries[np.argmin(np.abs(boundaries - target))])


def build_split(events: TemporalEvents, config: ProtocolConfig) -> TemporalSplit:
    """Cut `events` chronologically and mask nodes (`config.split_cut`, `mask_sampler`).

    Args:
        events: The time-sorted events.
        config: The protocol settings.

    Returns:
        The split.

    Raises:
        ConfigError: (a `ValueError`) If a split would be empty (too few distinct timestamps).
    """
    num_events = events.num_events
    t = events.t
    val_start, test_start = _SPLIT_CUTS[config.split_cut](t, config)
    if not 0 < val_start < test_start < num_events:
        if config.split_cut == "time_quantile":
            val_time, test_time = np.quantile(t, [config.val_quantile, config.test_quantile])
            raise ConfigError(
                f"Benchtemp's split cuts at the time quantiles {config.val_quantile}/"
                f"{config.test_quantile}, here t={val_time:g} and t={test_time:g}: train is "
                f"events [0, {val_start}), val [{val_start}, {test_start}), test "
                f"[{test_start}, {num_events}), so a split is empty and Benchtemp's protocol "
                "is not defined on this data; use --protocol frugal (cuts at timestamp "
                "boundaries, split_cut='timestamp_boundary')"
            )
        distinct = len(np.unique(t))
        raise ConfigError(
            f"the split of {num_events} events ({distinct} distinct timestamps) at positions "
            f"val={val_start}, test={test_start} leaves a split empty: train, val and test "
            "each need events at times of their own; give data with more events at more "
            "distinct times (or other val_quantile/test_quantile)"
        )
    masked = _MASK_SAMPLERS[config.mask_sampler](events, val_start, config)
    is_masked = np.zeros(events.num_nodes, dtype=bool)
    is_masked[masked] = True
    train_period = np.arange(val_start)
    keep = ~(is_masked[events.src[:val_start]] | is_masked[events.dst[:val_start]])
    train_index = train_period[keep].astype(np.int64)
    in_train = np.zeros(events.num_nodes, dtype=bool)
    in_train[events.src[train_index]] = True
    in_train[events.dst[train_index]] = True
    fractions = {
        "train": val_start / num_events,
        "val": (test_start - val_start) / num_events,
        "test": (num_events - test_start) / num_events,
    }
    expected_test = 1 - config.test_quantile
    if abs(fractions["test"] - expected_test) > 0.02:
        warnings.warn(
            f"the test split holds {fractions['test']:.1%} of the events instead of "
            f"{expected_test:.0%} (coarse timestamps move the cut)",
            stacklevel=2,
        )
    return TemporalSplit(
        events=events,
        val_start=val_start,
        test_start=test_start,
        train_index=train_index,
        masked_nodes=np.sort(masked).astype(np.int64),
        new_node=~in_train,
        fractions=fractions,
    )


def _boundary_cut(t: I64, config: ProtocolConfig) -> tuple[int, int]:
    """Cut positions at the timestamp boundaries nearest to the quantiles' event positions."""
    num_events = len(t)
    return (
        _nearest_boundary(t, config.val_quantile * num_events),
        _nearest_boundary(t, config.test_quantile * num_events),
    )


def _quantile_cut(t: I64, config: ProtocolConfig) -> tuple[int, int]:
    """Benchtemp's cut: linear quantiles of t, each split ending at `t <= cut time`."""
    val_time, test_time = np.quantile(t, [config.val_quantile, config.test_quantile])
    val_start = int(np.searchsorted(t, val_time, side="right"))
    test_start = int(np.searchsorted(t, test_time, side="right"))
    return val_start, test_start


def _numpy_masked_nodes(events: TemporalEvents, val_start: int, config: ProtocolConfig) -> I64:
    active = np.union1d(events.src, events.dst)
    pool = np.union1d(events.src[val_start:], events.dst[val_start:])
    count = min(int(config.mask_fraction * len(active)), len(pool))
    rng = np.random.default_rng(config.mask_seed)
    return rng.choice(pool, size=count, replace=False).astype(np.int64)


def _python_random_masked_nodes(
    events: TemporalEvents, val_start: int, config: ProtocolConfig
) -> I64:
    """Benchtemp's mask, bit for bit: 1-based ids, set iteration order, `random.sample`."""
    src1 = (events.src + 1).tolist()
    dst1 = (events.dst + 1).tolist()
    n_total = len(set(src1) | set(dst1))
    pool = set(src1[val_start:]).union(set(dst1[val_start:]))
    rnd = random.Random(config.mask_seed)  # Benchtemp: random.seed(2020) on the global RNG
    masked = rnd.sample(tuple(pool), int(config.mask_fraction * n_total))
    return np.asarray(masked, dtype=np.int64) - 1


_SPLIT_CUTS = {"timestamp_boundary": _boundary_cut, "time_quantile": _quantile_cut}
_MASK_SAMPLERS = {"numpy": _numpy_masked_nodes, "python_random": _python_random_masked_nodes}


@dataclass(frozen=True, eq=False)
class Protocol:
    """The split, the fixed evaluation negatives and the hash that identifies them.

    Attributes:
        dataset: Dataset id.
        config: The settings.
        split: The split.
        negatives: Negative destination per split event, keyed 'split/view/strategy' (view
            'all' = shared by every view); -1 where an event is outside the view. Shape (S,).
        negative_sha256: SHA-256 of the negatives file content.
        negative_collisions: Negatives equal to a true destination of the same (src, t) that
            could not be redrawn, per key.
        protocol_hash: SHA-256 of the canonical JSON of config, dataset, cut and negatives.
        checks: Results of `check_protocol`.
        ranking_candidates: The sampled ranking's candidates per split ('test'), (S, N):
            `num_ranking_candidates` distinct destinations per query, none a true
            destination of the same (src, t); -1 pads a row when fewer exist. Stored in the
            negatives file and part of `negative_sha256`. Empty when the sampled ranking is
            off.
    """

    dataset: str
    config: ProtocolConfig
    split: TemporalSplit
    negatives: dict[str, I64]
    negative_sha256: str
    negative_collisions: dict[str, int]
    protocol_hash: str
    checks: dict[str, object]
    ranking_candidates: dict[str, I64] = field(default_factory=dict)

    @property
    def sampled_ranking(self) -> str | None:
        """The label of the sampled ranking ('sampled:N'), or None when there is none."""
        if "test" not in self.ranking_candidates:
            return None
        return f"sampled:{self.config.num_ranking_candidates}"

    def negatives_for(self, split: str, view: str, strategy: str) -> I64:
        """Negatives of (split, view, strategy), aligned with the split's events (-1 = none).

        Raises:
            KeyError: If that combination was not generated.
        """
        for key in (f"{split}/{view}/{strategy}", f"{split}/all/{strategy}"):
            if key in self.negatives:
                negatives = self.negatives[key]
                return np.where(self.split.view_mask(split, view), negatives, -1)
        raise KeyError(
            f"no negatives for split={split}, view={view}, strategy={strategy}; this protocol "
            f"has {sorted(self.negatives)}"
        )

    def strategies(self) -> tuple[str, ...]:
        """Negative strategies this protocol evaluates."""
        return tuple(sorted({key.split("/")[2] for key in self.negatives}))

    def describe(self) -> dict[str, object]:
        """JSON-ready summary: hash, cut positions, fractions, mask, sampled ranking, checks."""
        return {
            "protocol": self.config.name,
            "protocol_hash": self.protocol_hash,
            "val_start": self.split.val_start,
            "test_start": self.split.test_start,
            "fractions": self.split.fractions,
            "num_train_events": len(self.split.train_index),
            "num_masked_nodes": len(self.split.masked_nodes),
            "negative_sha256": self.negative_sha256,
            "negative_collisions": self.negative_collisions,
            "sampled_ranking": self.sampled_ranking,
            "checks": self.checks,
        }


def _candidates(events: TemporalEvents) -> I64:
    """Destinations a negative may take: items for a bipartite graph, else every node."""
    if events.bipartite:
        return np.arange(events.num_src_nodes, events.num_nodes, dtype=np.int64)
    return np.arange(events.num_nodes, dtype=np.int64)


def true_destination_keys(events: TemporalEvents, start: int, end: int) -> tuple[I64, I64]:
    """Integer keys of (src, t, dst) for events [start, end) and the (src, t) group of each.

    Returns:
        (keys of the true events sorted, group id of each event), so that a candidate c for
        event i collides iff `group[i] * N + c` is in the keys.
    """
    src, t, dst = events.src[start:end], events.t[start:end], events.dst[start:end]
    _, group = np.unique(np.stack([src, t]), axis=1, return_inverse=True)
    group = group.ravel().astype(np.int64)
    keys = np.unique(group * events.num_nodes + dst)
    return keys, group


def _collides(keys: I64, group: I64, negative: I64, num_nodes: int) -> Bool:
    probe = group * num_nodes + negative
    pos = np.searchsorted(keys, probe)
    pos = np.minimum(pos, len(keys) - 1)
    hit: Bool = (keys[pos] == probe) & (negative >= 0)
    return hit


def _pair_csr(src: I64, dst: I64, num_nodes: int) -> tuple[I64, I64]:
    """Unique (src, dst) pairs as CSR: (indptr (N+1,), dst sorted by src)."""
    pairs = np.unique(src * num_nodes + dst)
    pair_src = pairs // num_nodes
    indptr = np.concatenate([[0], np.cumsum(np.bincount(pair_src, minlength=num_nodes))])
    return indptr.astype(np.int64), (pairs % num_nodes).astype(np.int64)


def _draw_from_csr(src: I64, indptr: I64, values: I64, rng: np.random.Generator) -> I64:
    """One value per src from its CSR row, uniformly; -1 where the row is empty."""
    start = indptr[src]
    count = indptr[src + 1] - start
    offset = np.floor(rng.random(len(src)) * count).astype(np.int64)
    out = np.full(len(src), -1, dtype=np.int64)
    has = count > 0
    out[has] = values[start[has] + offset[has]]
    return out


def _shared_negatives(
    events: TemporalEvents, split: TemporalSplit, config: ProtocolConfig
) -> tuple[dict[str, I64], dict[str, int]]:
    candidates = _candidates(events)
    negatives: dict[str, I64] = {}
    collisions: dict[str, int] = {}
    n = events.num_nodes
    for split_index, split_name in enumerate(SPLITS):
        start, end = split.bounds(split_name)
        keys, group = true_destination_keys(events, start, end)
        src = events.src[start:end]
        before_src, before_dst = events.src[:start], events.dst[:start]
        seen_before = np.unique(before_src * n + before_dst)
        split_pairs = np.unique(src * n + events.dst[start:end])
        new_pairs = np.setdiff1d(split_pairs, seen_before, assume_unique=True)
        pools = {
            "historical": _pair_csr(before_src, before_dst, n),
            "inductive": _pair_csr(new_pairs // n, new_pairs % n, n),
        }
        for strategy_index, strategy in enumerate(config.negative_strategies):
            rng = np.random.default_rng([config.negative_seed, split_index, strategy_index, 0x7467])
            negative = candidates[rng.integers(0, len(candidates), size=end - start)]
            if strategy in pools:
                indptr, values = pools[strategy]
                drawn = _draw_from_csr(src, indptr, values, rng)
                for _ in range(_RESAMPLE_ROUNDS):
                    bad = (drawn >= 0) & _collides(keys, group, drawn, n)
                    if not bad.any():
                        break
                    drawn[bad] = _draw_from_csr(src[bad], indptr, values, rng)
                bad = (drawn < 0) | _collides(keys, group, drawn, n)
                negative = np.where(bad, negative, drawn)  # empty pool -> random fallback
            for _ in range(_RESAMPLE_ROUNDS):
                bad = _collides(keys, group, negative, n)
                if not bad.any():
                    break
                negative[bad] = candidates[rng.integers(0, len(candidates), size=int(bad.sum()))]
            key = f"{split_name}/all/{strategy}"
            negatives[key] = negative
            collisions[key] = int(_collides(keys, group, negative, n).sum())
    return negatives, collisions


def _rand_edge_sampler_negatives(
    events: TemporalEvents, split: TemporalSplit, config: ProtocolConfig
) -> tuple[dict[str, I64], dict[str, int]]:
    """Benchtemp's RandEdgeSampler draws: per eval batch n source then n destination indices."""
    negatives: dict[str, I64] = {}
    collisions: dict[str, int] = {}
    for (split_name, view), seed in _BENCHTEMP_SEEDS.items():
        start, end = split.bounds(split_name)
        mask = split.view_mask(split_name, view)
        if view == "transductive":  # the sampler over all events of the dataset
            pool_src, pool_dst = events.src, events.dst
        else:  # the sampler over the view's own events
            pool_src, pool_dst = events.src[start:end][mask], events.dst[start:end][mask]
        src_list, dst_list = np.unique(pool_src), np.unique(pool_dst)
        state = np.random.RandomState(seed)
        count = int(mask.sum())
        drawn = np.empty(count, dtype=np.int64)
        batch = config.eval_batch_size
        for lo in range(0, count, batch):  # one iteration per eval batch
            size = min(batch, count - lo)
            state.randint(0, len(src_list), size)  # source draws, unused by Benchtemp
            drawn[lo : lo + size] = dst_list[state.randint(0, len(dst_list), size)]
        negative = np.full(end - start, -1, dtype=np.int64)
        negative[mask] = drawn
        key = f"{split_name}/{view}/random"
        negatives[key] = negative
        keys, group = true_destination_keys(events, start, end)
        collisions[key] = int(_collides(keys, group, negative, events.num_nodes).sum())
    return negatives, collisions


_RANKING_PREFIX = "ranking/"
_RANKING_ROWS_PER_CHUNK = 256  # rows of the (rows, candidates) random-key matrix at once


def _ranking_candidates(
    events: TemporalEvents, split: TemporalSplit, config: ProtocolConfig
) -> dict[str, I64]:
    """`num_ranking_candidates` distinct candidates per test query, none a true destination.

    Each query gets a random key per candidate destination; the keys of every true
    destination of the query's (src, t) are set above all others and the N smallest are
    kept (uniform sampling without replacement). -1 pads rows with fewer than N left.

    Returns:
        {'test': (S, N) int64}, or {} when ranking or the sampled ranking is off.
    """
    n = config.num_ranking_candidates
    if not config.use_ranking or n == 0:
        return {}
    pool = _candidates(events)
    offset = int(pool[0])
    start, end = split.bounds("test")
    dst = events.dst[start:end]
    _, group = true_destination_keys(events, start, end)
    order = np.argsort(group, kind="stable")
    group_start = np.searchsorted(group[order], np.arange(group.max() + 1))
    group_size = np.bincount(group)
    rng = np.random.default_rng([config.negative_seed, 0x72616E6B])
    out = np.full((end - start, n), -1, dtype=np.int64)
    for lo in range(0, end - start, _RANKING_ROWS_PER_CHUNK):  # one chunk of queries each
        rows = np.arange(lo, min(lo + _RANKING_ROWS_PER_CHUNK, end - start))
        key = rng.random((len(rows), len(pool)))
        # Every (row, true destination of its group): a ragged arange over the groups.
        size = group_size[group[rows]]
        row_rep = np.repeat(np.arange(len(rows)), size)
        within = np.arange(size.sum()) - np.repeat(np.cumsum(size) - size, size)
        member = order[np.repeat(group_start[group[rows]], size) + within]
        key[row_rep, dst[member] - offset] = 2.0  # never among the N smallest valid keys
        take = min(n, len(pool))
        if take < len(pool):
            pick = np.argpartition(key, take - 1, axis=1)[:, :take]
        else:
            pick = np.broadcast_to(np.arange(len(pool)), key.shape)
        picked_key = np.take_along_axis(key, pick, axis=1)
        # Ascending ids, -1 padding last (an id past every node sorts the padding last).
        chosen = np.sort(np.where(picked_key < 1.0, pool[pick], events.num_nodes), axis=1)
        out[rows, :take] = np.where(chosen < events.num_nodes, chosen, -1)
    return {"test": out}


_NEGATIVE_SAMPLERS = {
    "shared": _shared_negatives,
    "rand_edge_sampler": _rand_edge_sampler_negatives,
}


def _arrays_sha256(arrays: dict[str, I64]) -> str:
    digest = hashlib.sha256()
    for key in sorted(arrays):
        digest.update(key.encode())
        digest.update(np.ascontiguousarray(arrays[key], dtype="<i8").tobytes())
    return digest.hexdigest()


def build_protocol(
    events: TemporalEvents,
    dataset: str,
    config: ProtocolConfig,
    cache_dir: Path | None = None,
) -> Protocol:
    """Split `events`, generate (or reload) the negatives, hash everything and run the checks.

    Negatives (and the sampled ranking's candidates) are written once to
    `cache_dir/negatives-DATASET-HASH.npz`; a later call with the same inputs reloads that
    file and verifies its SHA-256, so every model of every run evaluates against the same
    negatives and candidates.

    Args:
        events: The dataset's events.
        dataset: Dataset id (goes into the hash).
        config: Protocol settings.
        cache_dir: Folder for the negatives file, or None to keep them in memory only.

    Returns:
        The protocol.

    Raises:
        ValueError: If a split is empty.
        ProtocolError: If a protocol check fails or a cached negatives file was altered.
    """
    split = build_split(events, config)
    setup = {
        "dataset": dataset,
        "num_events": events.num_events,
        "config": asdict(config),
        "val_start": split.val_start,
        "test_start": split.test_start,
        "masked_nodes_sha256": hashlib.sha256(split.masked_nodes.tobytes()).hexdigest(),
    }
    setup_hash = hashlib.sha256(json.dumps(setup, sort_keys=True).encode()).hexdigest()
    path = None if cache_dir is None else cache_dir / f"negatives-{dataset}-{setup_hash[:16]}.npz"
    builder = _NEGATIVE_SAMPLERS[config.negative_sampler]
    if path is not None and path.exists():
        with np.load(path) as stored:
            arrays_read = {key.replace("__", "/"): stored[key] for key in stored.files}
        negatives = {k: v for k, v in arrays_read.items() if not k.startswith(_RANKING_PREFIX)}
        ranking = {
            k.removeprefix(_RANKING_PREFIX): v
            for k, v in arrays_read.items()
            if k.startswith(_RANKING_PREFIX)
        }
        expected = path.with_suffix(".sha256").read_text().strip()
        if _arrays_sha256(arrays_read) != expected:
            raise ProtocolError(
                f"{path} does not match its recorded SHA-256 {expected}; delete it to regenerate"
            )
        _, collisions = builder(events, split, config)
    else:
        negatives, collisions = builder(events, split, config)
        ranking = _ranking_candidates(events, split, config)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            # One temporary file per process: benches sharing a folder may build at once. The
            # digest lands first, so a reader that finds the .npz also finds its .sha256.
            tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npz")
            stored_arrays = {**negatives, **_prefixed(ranking)}
            arrays: dict[str, Any] = {key.replace("/", "__"): v for key, v in stored_arrays.items()}
            with guard_write(
                path,
                what=f"the negatives cache of {dataset}",
                needed_bytes=sum(int(v.nbytes) for v in arrays.values()),
                fix="free space there or give --out a folder on a larger disk",
                partial=[tmp],
            ):
                np.savez(tmp, **arrays)
                write_text_atomically(
                    path.with_suffix(".sha256"), _arrays_sha256(stored_arrays) + "\n"
                )
                tmp.replace(path)
    negative_sha256 = _arrays_sha256({**negatives, **_prefixed(ranking)})
    protocol_hash = hashlib.sha256(
        json.dumps({**setup, "negatives": negative_sha256}, sort_keys=True).encode()
    ).hexdigest()
    checks = check_protocol(split, negatives, ranking)
    return Protocol(
        dataset=dataset,
        config=config,
        split=split,
        negatives=negatives,
        negative_sha256=negative_sha256,
        negative_collisions=collisions,
        protocol_hash=protocol_hash,
        checks=checks,
        ranking_candidates=ranking,
    )


def _prefixed(ranking: dict[str, I64]) -> dict[str, I64]:
    return {_RANKING_PREFIX + key: value for key, value in ranking.items()}


def check_protocol(
    split: TemporalSplit,
    negatives: dict[str, I64],
    ranking_candidates: dict[str, I64] | None = None,
) -> dict[str, object]:
    """Verify the leakage invariants of a split and its negatives.

    Checks: training events all precede the validation events in time; val and test are
    disjoint and ordered; no masked node occurs in a training event; every negative array has
    one entry per split event and valid node ids; every sampled ranking candidate is a valid
    id and never a true destination of its query's (src, t), with no repeat in a row.
    Collisions of negatives with true events are counted (not fatal;
    `Protocol.negative_collisions`).

    Args:
        split: The split.
        negatives: Negatives keyed 'split/view/strategy'.
        ranking_candidates: The sampled ranking's candidates per split, (S, N) each.

    Returns:
        {check name: True or a count}.

    Raises:
        ProtocolError: If an invariant is violated.
    """
    events = split.events
    t = events.t
    train_t = t[split.train_index]
    if len(train_t) == 0:
        raise ProtocolError("the training set is empty after masking; lower mask_fraction")
    if split.train_index.max() >= split.val_start:
        raise ProtocolError("a training event lies after the validation cut")
    if train_t.max() >= t[split.val_start]:
        raise ProtocolError(
            f"training time {train_t.max()} is not before the first validation time "
            f"{t[split.val_start]}: a timestamp is cut in two"
        )
    if t[split.test_start - 1] >= t[split.test_start]:
        raise ProtocolError("validation and test share a timestamp")
    train_nodes = np.union1d(events.src[split.train_index], events.dst[split.train_index])
    if np.intersect1d(train_nodes, split.masked_nodes).size:
        raise ProtocolError("a masked node occurs in a training event")
    for key, negative in negatives.items():
        split_name = key.split("/")[0]
        start, end = split.bounds(split_name)
        if negative.shape != (end - start,):
            raise ProtocolError(
                f"negatives {key} have shape {negative.shape}, not ({end - start},)"
            )
        if negative.max(initial=-1) >= events.num_nodes or negative.min(initial=0) < -1:
            raise ProtocolError(f"negatives {key} hold ids outside [-1, {events.num_nodes})")
    for split_name, candidates in (ranking_candidates or {}).items():
        start, end = split.bounds(split_name)
        if candidates.ndim != 2 or candidates.shape[0] != end - start:
            raise ProtocolError(
                f"ranking candidates of {split_name} have shape {candidates.shape}, not "
                f"({end - start}, N)"
            )
        if candidates.max(initial=-1) >= events.num_nodes or candidates.min(initial=0) < -1:
            raise ProtocolError(f"ranking candidates of {split_name} hold ids outside the nodes")
        keys, group = true_destination_keys(events, start, end)
        if _collides(keys, np.repeat(group, candidates.shape[1]), candidates.ravel(),
                     events.num_nodes).any():  # fmt: skip
            raise ProtocolError(f"a ranking candidate of {split_name} is a true destination")
        ordered = np.sort(candidates, axis=1)
        if ((ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)).any():
            raise ProtocolError(f"a query of {split_name} has a ranking candidate twice")
    return {
        "train_before_val": True,
        "val_test_disjoint": True,
        "masked_nodes_absent_from_train": True,
        "negative_shapes": True,
        "num_new_nodes": int(split.new_node[np.union1d(events.src, events.dst)].sum()),
    }
