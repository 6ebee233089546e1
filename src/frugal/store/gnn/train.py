"""`train_gnn`: GraphSAGE node classification with node features and embeddings in tables.

MLKV's GNN workload (DGL GraphSAGE: 3 layers, 256 hidden, mean aggregator, fanouts 5,5,5,
batch 1024, Adam 1e-3): the read-only node features live in a table, and frugal adds
learnable node embeddings (GraphSAGE without input features) in a second table. Each step
samples a batch, pulls the rows of its `n_id` (features by `read`, embeddings by `get`), runs
the model, updates the dense weights with Adam and the embedding rows with the table's own
optimizer (`apply_gradients`). The sampler runs `lookahead` batches ahead and hints their ids
to both tables, so prefetching batch t+1 overlaps the pull of batch t.

Any object with the `frugal.store.baselines.BenchTable` calls works as a table: `RamTable`,
`KvOffloadTable`, `HybridLogTable` or an `EmbeddingStore`, so the store bench compares the
systems on this loop unchanged.

References:
    Inductive Representation Learning on Large Graphs (GraphSAGE), NeurIPS 2017,
    arXiv 1706.02216. MLKV: Efficiently Scaling up Large Embedding Model Training with
    Disk-based Key-Value Storage, ICDE 2025, arXiv 2504.01506 (the GNN workload).

Shape legend: B seed nodes, S sampled nodes, F feature width, D embedding width,
C classes.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from frugal._typing import F32, I64
from frugal.config import check_types
from frugal.data.graph import Graph
from frugal.store.baselines import BenchTable
from frugal.store.gnn.model import GraphSAGE
from frugal.store.gnn.sampler import NeighborSampler, SampledBatch
from frugal.store.lookahead import Batch, LookaheadLoader

__all__ = ["GnnTrainConfig", "GnnTrainResult", "hot_nodes", "load_rows", "train_gnn"]


@dataclass(frozen=True, kw_only=True, slots=True)
class GnnTrainConfig:
    """Settings of `train_gnn`; the defaults are MLKV's DGL GraphSAGE setup."""

    fanouts: tuple[int, ...] = (5, 5, 5)
    """Neighbours sampled per node at each hop, seeds outwards (PyG's order); one per layer,
    each >= 0."""
    batch_size: int = 1024
    """Seed (training) nodes per batch, >= 1."""
    hidden_channels: int = 256
    """Width of the hidden layers, >= 1."""
    dropout: float = 0.5
    """Dropout between layers, in [0, 1) (DGL's GraphSAGE example: 0.5)."""
    lr: float = 1e-3
    """Adam learning rate of the dense model, > 0 (the embedding table has its own)."""
    num_epochs: int = 1
    """Passes over the training nodes, >= 1."""
    max_steps: int | None = None
    """Stop after this many batches in all, >= 1; None runs every epoch to the end."""
    lookahead: int = 1
    """Batches whose ids are hinted to the tables ahead of use, >= 0 (MLKV: 1)."""
    warmup_steps: int = 1
    """First batches left out of `samples_per_s` (the first pays for lazy set-up), >= 0."""
    use_deterministic_algorithms: bool = True
    """Run torch's deterministic kernels during the call (restored after): with more than
    one thread the gather's backward otherwise sums in a varying order, and systems that
    must end bit-identical would not."""
    max_eval_nodes: int | None = None
    """Evaluate on the first this many test nodes, >= 1; None: all of them."""
    pin_feature_fraction: float = 0.0
    """Fraction of the features table's cache, in [0, 0.5], pinned before training with the
    feature rows of the nodes sampling visits most (`hot_nodes`, GNNLab's presampling), when
    the table can pin (an `EmbeddingStore`), and unpinned when training ends; 0: off. Pinned
    rows leave less room for a batch's rows (and the lookahead's): a batch that no longer
    fits raises `CacheTooSmallError`."""
    presample_batches: int = 16
    """Batches `hot_nodes` samples (with seed + 1, not the training draws) to rank nodes."""
    seed: int = 0
    """Seed of the model's initial weights, dropout, the shuffles and the sampling, >= 0."""

    def __post_init__(self) -> None:
        check_types(self)
        checks = [
            (
                len(self.fanouts) >= 1 and all(f >= 0 for f in self.fanouts),
                f"fanouts={self.fanouts} must be one integer >= 0 per layer, e.g. (5, 5, 5)",
            ),
            (self.batch_size >= 1, f"batch_size={self.batch_size} must be >= 1"),
            (self.hidden_channels >= 1, f"hidden_channels={self.hidden_channels} must be >= 1"),
            (0.0 <= self.dropout < 1.0, f"dropout={self.dropout} must be in [0, 1)"),
            (self.lr > 0, f"lr={self.lr} must be > 0"),
            (self.num_epochs >= 1, f"num_epochs={self.num_epochs} must be >= 1"),
            (
                self.max_steps is None or self.max_steps >= 1,
                f"max_steps={self.max_steps} must be >= 1, or None for whole epochs",
            ),
            (self.lookahead >= 0, f"lookahead={self.lookahead} must be >= 0 (0: off)"),
            (self.warmup_steps >= 0, f"warmup_steps={self.warmup_steps} must be >= 0"),
            (
                self.max_eval_nodes is None or self.max_eval_nodes >= 1,
                f"max_eval_nodes={self.max_eval_nodes} must be >= 1, or None for all",
            ),
            (self.seed >= 0, f"seed={self.seed} must be >= 0"),
            (
                0.0 <= self.pin_feature_fraction <= 0.5,
                f"pin_feature_fraction={self.pin_feature_fraction} must be in [0, 0.5] (at "
                "most half a cache may be pinned)",
            ),
            (
                self.presample_batches >= 1,
                f"presample_batches={self.presample_batches} must be >= 1",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


@dataclass(frozen=True, kw_only=True, slots=True)
class GnnTrainResult:
    """What `train_gnn` measured. Per-batch lists are in step order."""

    losses: tuple[float, ...]
    """Mean cross-entropy of every training batch."""
    num_steps: int
    """Training batches run."""
    num_seeds: int
    """Seed nodes trained on, over all batches."""
    train_s: float
    """Wall time of the training loop (sampling, pulls, compute, updates), seconds."""
    samples_per_s: float
    """Seed nodes per second of wall time after the first `warmup_steps` batches (of all
    batches when there are no more)."""
    sample_ms: tuple[float, ...]
    """Per batch: sampling its blocks (done ahead of use when lookahead > 0)."""
    pull_ms: tuple[float, ...]
    """Per batch: reading its feature rows and getting its embedding rows."""
    forward_backward_ms: tuple[float, ...]
    """Per batch: model forward, loss and backward."""
    update_ms: tuple[float, ...]
    """Per batch: the dense Adam step and the embedding table's `apply_gradients`."""
    test_accuracy: float
    """Accuracy on the evaluated test nodes (same sampler, no dropout)."""
    num_test: int
    """Test nodes evaluated."""
    pinned_rows: int = 0
    """Feature rows this call pinned before training (`pin_feature_fraction`); it unpins
    them when it returns."""
    pin_s: float = 0.0
    """Presampling and pinning, seconds (before training, not in `train_s`)."""

    def median_ms(self) -> dict[str, float]:
        """Median per-batch milliseconds of each phase (`sample_ms`, `pull_ms`, ...)."""
        phases = {
            "sample_ms": self.sample_ms,
            "pull_ms": self.pull_ms,
            "forward_backward_ms": self.forward_backward_ms,
            "update_ms": self.update_ms,
        }
        return {k: statistics.median(v) if v else float("nan") for k, v in phases.items()}


class _Hints:
    """Forwards a lookahead hint to every table."""

    def __init__(self, tables: list[BenchTable]) -> None:
        self.tables = tables

    def lookahead(self, ids: Any, step: int) -> None:
        for table in self.tables:
            table.lookahead(ids, step)


def load_rows(
    table: BenchTable, rows: F32, *, chunk_rows: int | None = None, step: int = 0
) -> None:
    """Write read-only rows (e.g. node features, possibly memory-mapped) into a table.

    Rows go in by `put` in chunks of `chunk_rows`, so a memory-mapped array larger than RAM
    streams through. They are whole rows: create the table with optimizer "none"
    (`RowSpec(F, OptimizerConfig(kind="none"))`), so its width W is F.

    Args:
        table: Any table with `put` (a baseline or an `EmbeddingStore`).
        rows: Row i is the value of id i.
        chunk_rows: Rows per `put`, >= 1 (a `HybridLogTable` needs it below its log size);
            None: a quarter of the table's `cache_rows` when it has one (an
            `EmbeddingStore`), else 65,536.
        step: Step the puts are recorded at.

    Raises:
        ValueError: If `rows` is not 2-D or `chunk_rows` < 1.

    Shapes:
        rows: (N, F).
    """
    if rows.ndim != 2:
        raise ValueError(f"rows must be 2-D (num_rows, width), got shape {rows.shape}")
    if chunk_rows is None:
        cache_rows = getattr(table, "cache_rows", None)
        chunk_rows = max(1, int(cache_rows) // 4) if cache_rows else 65536
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows={chunk_rows} must be >= 1")
    for start in range(0, len(rows), chunk_rows):
        chunk = np.asarray(rows[start : start + chunk_rows], dtype=np.float32)
        ids = np.arange(start, start + len(chunk), dtype=np.int64)
        table.put(ids, np.ascontiguousarray(chunk), step)


def hot_nodes(
    graph: Graph,
    count: int,
    *,
    fanouts: tuple[int, ...],
    batch_size: int,
    num_batches: int,
    seed: int = 1,
) -> I64:
    """The `count` nodes that `num_batches` sampled batches visit most, hottest first.

    Fewer when fewer nodes are visited at all (never-visited nodes are not returned).

    GNNLab's presampling rule for its static feature cache: run the sampler as training
    will (same fanouts and batch size, its own seed), count how often each node lands in a
    batch, keep the most visited; ties go to the lower id.

    References:
        GNNLab: A Factored System for Sample-based GNN Training over GPUs, EuroSys 2022
        (presampling-based caching policy); PaGraph, SoCC 2020 (the degree-based one).

    Raises:
        ValueError: If `count` < 0 or `num_batches` < 1.
    """
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
        raise ValueError(f"count={count!r} must be an integer >= 0")
    if num_batches < 1:
        raise ValueError(f"num_batches={num_batches} must be >= 1")
    sampler = NeighborSampler(graph, fanouts, batch_size, seed=seed, nodes=graph.train_ids)
    visits = np.zeros(graph.num_nodes, dtype=np.int64)
    drawn = 0
    epoch = 0
    while drawn < num_batches:
        sampler.set_epoch(epoch)
        for sampled in sampler:
            visits[sampled.n_id] += 1
            drawn += 1
            if drawn == num_batches:
                break
        epoch += 1
    order = np.lexsort((np.arange(graph.num_nodes), -visits))  # most visits, then lower id
    hot: I64 = order[: min(count, int(np.count_nonzero(visits)))].astype(np.int64)
    return hot


def _batches(
    sampler: NeighborSampler, num_epochs: int, max_steps: int | None, first_step: int
) -> Iterator[Batch]:
    """Sampled batches as `Batch(step, sorted n_id, (batch, order))`, steps counted globally."""
    step = first_step
    for epoch in range(num_epochs):
        sampler.set_epoch(epoch)
        for sampled in sampler:
            if max_steps is not None and step - first_step >= max_steps:
                return
            order = np.argsort(sampled.n_id, kind="stable")
            yield Batch(step=step, ids=sampled.n_id[order], payload=(sampled, order))
            step += 1


def _pull(
    table: BenchTable | None, ids: I64, order: I64, step: int, *, read_only: bool
) -> F32 | None:
    """Rows of n_id from a table (asked in sorted order, returned in n_id order)."""
    if table is None:
        return None
    rows_sorted = table.read(ids, step) if read_only else table.get(ids, step)
    rows: F32 = np.empty(rows_sorted.shape, dtype=np.float32)
    rows[order] = rows_sorted
    return rows


def _inputs(features: F32 | None, embeddings: F32 | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The model input (features, then embeddings) and the embedding leaf (S, D)."""
    emb_SD = torch.from_numpy(
        embeddings if embeddings is not None else np.zeros((0, 0), np.float32)
    )
    emb_SD.requires_grad_(embeddings is not None)
    parts = [torch.from_numpy(features)] if features is not None else []
    if embeddings is not None:
        parts.append(emb_SD)
    return (parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)), emb_SD


def train_gnn(
    graph: Graph,
    *,
    features: BenchTable | None = None,
    embeddings: BenchTable | None = None,
    config: GnnTrainConfig | None = None,
) -> GnnTrainResult:
    """Train GraphSAGE on `graph.train_ids`, then measure accuracy on `graph.test_ids`.

    Args:
        graph: The graph (CSR, labels, splits); its own `features` are not read: they are
            read from the `features` table (load them with `load_rows`).
        features: Read-only table of node features, row v = node v; read with `read`, so an
            `EmbeddingStore` keeps no open reads (its spec: optimizer "none").
        embeddings: Learnable node embeddings, row v = node v; `get` then `apply_gradients`
            each step, at staleness 0 in step order. Either table may be None, not both;
            with both the input is [features | embeddings].
        config: Settings; default `GnnTrainConfig()` (MLKV's setup).

    Returns:
        Losses, throughput, the per-batch time breakdown and test accuracy.

    Raises:
        ValueError: If both tables are None or the graph has no training or test nodes.
    """
    config = config or GnnTrainConfig()
    _check_inputs(graph, features, embeddings)
    hot, pinned_rows, pin_s = _pin_hot_features(graph, features, config)
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic or config.use_deterministic_algorithms)
    try:
        result = _train(graph, features, embeddings, config)
    finally:
        torch.use_deterministic_algorithms(deterministic)
        unpin = getattr(features, "unpin", None)
        if len(hot) and unpin is not None:
            unpin(hot)
    return replace(result, pinned_rows=pinned_rows, pin_s=pin_s)


def _check_inputs(graph: Graph, features: BenchTable | None, embeddings: BenchTable | None) -> None:
    if features is None and embeddings is None:
        raise ValueError(
            "train_gnn needs a features table, an embeddings table or both; pass at least one"
        )
    if len(graph.train_ids) == 0 or len(graph.test_ids) == 0:
        raise ValueError(
            f"the graph has {len(graph.train_ids)} training and {len(graph.test_ids)} test "
            "nodes; both must be > 0 (set train_ids/test_ids)"
        )


def _pin_hot_features(
    graph: Graph, features: BenchTable | None, config: GnnTrainConfig
) -> tuple[I64, int, float]:
    """Pin the hottest nodes' feature rows (`pin_feature_fraction`); (ids, count, seconds)."""
    start = time.perf_counter()
    pin = getattr(features, "pin", None)
    cache_rows = getattr(features, "cache_rows", None)
    if config.pin_feature_fraction == 0 or pin is None or not cache_rows:
        return np.zeros(0, dtype=np.int64), 0, 0.0
    hot = hot_nodes(
        graph, int(config.pin_feature_fraction * cache_rows), fanouts=config.fanouts,
        batch_size=config.batch_size, num_batches=config.presample_batches,
        seed=config.seed + 1,
    )  # fmt: skip
    hot = np.sort(hot)
    before = int(pin(np.zeros(0, dtype=np.int64)))  # rows the caller pinned already
    pinned = int(pin(hot)) - before
    return hot, pinned, time.perf_counter() - start


def _train(
    graph: Graph,
    features: BenchTable | None,
    embeddings: BenchTable | None,
    config: GnnTrainConfig,
) -> GnnTrainResult:
    tables = [t for t in (features, embeddings) if t is not None]
    torch.manual_seed(config.seed)
    labels = graph.labels
    sampler = NeighborSampler(
        graph, config.fanouts, config.batch_size, seed=config.seed, nodes=graph.train_ids
    )
    model: GraphSAGE | None = None
    optimizer: torch.optim.Optimizer | None = None
    losses: list[float] = []
    phases: dict[str, list[float]] = {k: [] for k in ("sample", "pull", "fb", "update")}
    num_seeds = 0
    step = 0
    start = time.perf_counter()
    warm: tuple[float, int] | None = None  # (time, seeds) when warm-up ended
    loader = LookaheadLoader(
        _batches(sampler, config.num_epochs, config.max_steps, 0), _Hints(tables), config.lookahead
    )
    for batch in loader:
        sampled, order = batch.payload
        assert isinstance(sampled, SampledBatch)
        step = batch.step
        t0 = time.perf_counter()
        feat_SF = _pull(features, batch.ids, order, step, read_only=True)
        emb_SD = _pull(embeddings, batch.ids, order, step, read_only=False)
        t1 = time.perf_counter()
        try:
            x_SI, leaf_SD = _inputs(feat_SF, emb_SD)
            if model is None:  # built at the first batch, when the row widths are known
                model = GraphSAGE(
                    x_SI.shape[1],
                    graph.num_classes,
                    config.hidden_channels,
                    len(config.fanouts),
                    config.dropout,
                )
                optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
            assert optimizer is not None
            model.train()
            target_B = torch.from_numpy(np.asarray(labels[sampled.seeds], dtype=np.int64))
            loss = torch.nn.functional.cross_entropy(model(x_SI, sampled.blocks), target_B)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]  # torch stub gap
            t2 = time.perf_counter()
            optimizer.step()
            if embeddings is not None:
                assert leaf_SD.grad is not None
                grad_SD = leaf_SD.grad.numpy()
                embeddings.apply_gradients(batch.ids, np.ascontiguousarray(grad_SD[order]), step)
        except BaseException:
            # a failed step leaves no open read behind: the table accepts the next step's
            release = getattr(embeddings, "release", None)
            if embeddings is not None and release is not None:
                with contextlib.suppress(Exception):  # the step's own error is the one to see
                    release(batch.ids, step)
            raise
        t3 = time.perf_counter()
        losses.append(float(loss.item()))
        num_seeds += len(sampled.seeds)
        if len(losses) == config.warmup_steps:
            warm = (time.perf_counter(), num_seeds)
        phases["sample"].append(1e3 * sampled.sample_s)
        phases["pull"].append(1e3 * (t1 - t0))
        phases["fb"].append(1e3 * (t2 - t1))
        phases["update"].append(1e3 * (t3 - t2))
    end = time.perf_counter()
    train_s = end - start
    if warm is None or len(losses) == config.warmup_steps:
        warm = (start, 0)
    measured_s = end - warm[0]
    assert model is not None
    accuracy, num_test = _evaluate(graph, model, features, embeddings, config, step + 1)
    return GnnTrainResult(
        losses=tuple(losses),
        num_steps=len(losses),
        num_seeds=num_seeds,
        train_s=train_s,
        samples_per_s=(num_seeds - warm[1]) / measured_s if measured_s > 0 else float("nan"),
        sample_ms=tuple(phases["sample"]),
        pull_ms=tuple(phases["pull"]),
        forward_backward_ms=tuple(phases["fb"]),
        update_ms=tuple(phases["update"]),
        test_accuracy=accuracy,
        num_test=num_test,
    )


def _evaluate(
    graph: Graph,
    model: GraphSAGE,
    features: BenchTable | None,
    embeddings: BenchTable | None,
    config: GnnTrainConfig,
    first_step: int,
) -> tuple[float, int]:
    """Accuracy on the test nodes: same fanouts, no dropout, every row read-only."""
    nodes = graph.test_ids[: config.max_eval_nodes]
    sampler = NeighborSampler(
        graph,
        config.fanouts,
        config.batch_size,
        seed=config.seed + 1,
        nodes=nodes,
        shuffle=False,
    )
    tables = [t for t in (features, embeddings) if t is not None]
    loader = LookaheadLoader(
        _batches(sampler, 1, None, first_step), _Hints(tables), config.lookahead
    )
    model.eval()
    correct = 0
    with torch.no_grad():
        for batch in loader:
            sampled, order = batch.payload
            feat_SF = _pull(features, batch.ids, order, batch.step, read_only=True)
            emb_SD = _pull(embeddings, batch.ids, order, batch.step, read_only=True)
            x_SI, _ = _inputs(feat_SF, emb_SD)
            predicted_B = model(x_SI, sampled.blocks).argmax(dim=1).numpy()
            correct += int((predicted_B == np.asarray(graph.labels[sampled.seeds])).sum())
    return correct / len(nodes), len(nodes)
