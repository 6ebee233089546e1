"""`frugal store bench`: every system on the same trace, side by side, in one run.

Each (system, workload, memory ratio, lookahead, staleness bound) runs in a fresh child process
(so peak RSS is its own) on the same pre-generated trace, the same initial table, the same
gradient and optimizer code. Step: unique ids -> get -> planted-teacher logistic gradient ->
`apply_gradients` -> `compute_ms` of sleep (the dense model's compute, during which background
I/O may run). Step times are medians after `warmup_batches`.

`criteo_dlrm` trains a real DLRM (`frugal.store.dlrm`: dot interactions and a top MLP with
Adam) on the same trace instead of the planted gradient and the sleep. The KGE workload
(`kge_freebase`, `frugal.store.kge`) trains DistMult on a Freebase86m-shaped
triple stream instead: entity rows (vector + row-wise Adagrad accumulator) in the compared
system, relation rows in RAM, real forward and backward passes (no sleep), and a sampled MRR on
held-out triples of the stream next to its triples/s. `--workload dlrm|kge` picks a family.

Results follow ARCHITECTURE.md: `results.json` with `rows` and a `summary` of
`speedup_vs_rocksdb_offload` and `fraction_of_ram` for `frugal` per memory ratio (lookahead 4,
staleness 0), plus the checks (bit-identical tables at staleness 0).

References:
    MLKV: Efficiently Scaling up Large Embedding Model Training with Disk-based Key-Value
    Storage, ICDE 2025, arXiv 2504.01506 (workload and baselines, section on evaluation).
"""

from __future__ import annotations

import datetime
import os
import queue
import resource
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

import numpy as np
import numpy.typing as npt

from frugal._libc import fixed_mmap_threshold
from frugal.bench.harness import (
    Bench,
    BenchConfig,
    BenchResult,
    BenchSpec,
    Progress,
    Summary,
    median_after_warmup,
    median_item,
    run_cell,
    write_bench_results,
)
from frugal.config import check_types
from frugal.disk import (
    check_free_space,
    disk_filled_error,
    guard_write,
    human_bytes,
    mentions_disk_full,
)
from frugal.registry import Registry
from frugal.store.errors import CacheTooSmallError
from frugal.store.lookahead import Batch, LookaheadLoader
from frugal.store.rows import OptimizerConfig, RowSpec, splitmix64

__all__ = [
    "STORE_BENCH",
    "WORKLOAD_FAMILIES",
    "StoreBenchConfig",
    "StoreGNNConfig",
    "StoreKGEConfig",
    "StoreStalenessPoint",
    "StoreSummary",
    "StoreWorkloadSummary",
    "run_store_bench",
    "select_workloads",
]

SystemName = Literal["ram", "rocksdb_offload", "lmdb_offload", "hlog", "mlkv", "frugal"]
WorkloadName = Literal[
    "criteo_zipf", "criteo_dlrm", "movielens100k", "collegemsg", "kge_freebase", "gnn_papers"
]
WORKLOAD_FAMILIES: dict[str, tuple[WorkloadName, ...]] = {
    "dlrm": ("criteo_zipf", "criteo_dlrm", "movielens100k", "collegemsg"),
    "kge": ("kge_freebase",),
    "gnn": ("gnn_papers",),
}
"""What `frugal store bench --workload FAMILY` runs: MLKV's workload families (the DLRM family
also holds the two real embedding access streams)."""


def select_workloads(names: list[str] | tuple[str, ...]) -> tuple[WorkloadName, ...]:
    """The workloads of `names`, each a family of `WORKLOAD_FAMILIES` or a workload name.

    Raises:
        ConfigError: If a name is neither (the message lists both kinds).
    """
    from frugal.config import ConfigError

    chosen: list[WorkloadName] = []
    known = get_args(WorkloadName)
    for name in names:
        if name in WORKLOAD_FAMILIES:
            chosen.extend(WORKLOAD_FAMILIES[name])
        elif name in known:
            chosen.append(name)  # type: ignore[arg-type]  # checked against the Literal
        else:
            raise ConfigError(
                f"--workload {name!r} is neither a family ({', '.join(WORKLOAD_FAMILIES)}) nor "
                f"a workload ({', '.join(known)})"
            )
    return tuple(dict.fromkeys(chosen))


_MIB = 1 << 20


@dataclass(frozen=True, kw_only=True, slots=True)
class StoreKGEConfig:
    """The KGE workload of `frugal store bench` (`kge_freebase`).

    DGL-KE DistMult as MLKV runs it on Freebase86m (dimension 100), on a `FreebaseLikeStream`.
    """

    model: str = "distmult"
    """Score function, a name in `frugal.store.kge.KGE_MODELS`."""
    num_entities: int = 4_000_000
    """Entities E of the stream (rows of the table), >= 1000; Freebase86m has 86,054,151."""
    num_relations: int = 14_824
    """Relations R (kept in RAM), >= 1; Freebase86m's count."""
    embedding_dim: int = 100
    """D; a row is D + 1 floats (row-wise Adagrad): 404 B at D = 100."""
    batch_size: int = 1024
    """Positive triples per step (DGL-KE and MLKV: 1024)."""
    neg_sample_size: int = 256
    """Negatives shared by each chunk of 256 positives (DGL-KE: 256)."""
    lr: float = 0.1
    """Row-wise Adagrad learning rate."""
    num_steps: int = 1500
    """Steps per run, warm-up included."""
    warmup_steps: int = 300
    """Steps left out of the step-time median."""
    memory_ratios: tuple[float, ...] = (0.25, 0.10)
    """Memory budgets as fractions of the entity table's bytes."""
    lookaheads: tuple[int, ...] = (0, 4, 16)
    """Lookahead windows W of mlkv and frugal (MLKV's KGE path runs 16 batches ahead)."""
    eval_triples: int = 2000
    """Held-out stream triples ranked after training (head and tail)."""
    eval_candidates: int = 1000
    """Entities each held-out triple is ranked against (sampled, unfiltered)."""

    def __post_init__(self) -> None:
        check_types(self)
        if self.num_entities < 1000 or self.num_relations < 1:
            raise ValueError(
                f"num_entities={self.num_entities} must be >= 1000 and num_relations="
                f"{self.num_relations} >= 1"
            )
        if self.num_steps <= self.warmup_steps:
            raise ValueError(
                f"num_steps={self.num_steps} must exceed warmup_steps={self.warmup_steps}"
            )
        if not self.memory_ratios or any(not 0 < r <= 1 for r in self.memory_ratios):
            raise ValueError(f"memory_ratios={self.memory_ratios} must be values in (0, 1]")
        if not self.lookaheads or any(w < 0 for w in self.lookaheads):
            raise ValueError(f"lookaheads={self.lookaheads} must be values >= 0")
        if not 1 <= self.eval_candidates < self.num_entities or self.eval_triples < 1:
            raise ValueError(
                f"eval_candidates={self.eval_candidates} must be in [1, num_entities) and "
                f"eval_triples={self.eval_triples} >= 1"
            )
        if self.batch_size > 256 and self.batch_size % 256:
            raise ValueError(
                f"kge.batch_size={self.batch_size}: above 256 it must be a multiple of 256 "
                f"(chunks of 256 positives share negatives); e.g. "
                f"{self.batch_size // 256 * 256 or 256}"
            )
        try:  # the model's own checks (model name, lr, sizes), named by their bench keys
            _kge_config(self, 0)
        except ValueError as exc:
            raise ValueError(f"kge: {exc}") from None


@dataclass(frozen=True, kw_only=True, slots=True)
class StoreGNNConfig:
    """The GNN workload of `frugal store bench` (`gnn_papers`).

    DGL GraphSAGE as MLKV runs it on ogbn-papers100M (mean aggregator, fanout 5,5,5, batch
    1024, Adam 1e-3), on a `frugal.data.papers_like` graph: 128-dim node features in a
    read-only table and learnable node embeddings in a second one, both in the compared
    system, each with `memory_ratio` of its own bytes.
    """

    num_nodes: int = 2_000_000
    """Nodes of the generated graph (ogbn-papers100M: 111M), >= 1000."""
    embedding_dim: int = 32
    """D of the learnable node embeddings (Adam: 3D + 1 floats per row)."""
    fanouts: tuple[int, ...] = (5, 5, 5)
    """Neighbours sampled per hop (MLKV/DGL: 5, 5, 5)."""
    batch_size: int = 1024
    """Seed nodes per batch (MLKV/DGL: 1024)."""
    hidden_channels: int = 256
    """GraphSAGE hidden width (MLKV/DGL: 256)."""
    train_fraction: float = 0.05
    """Share of the nodes labelled for training (papers100M: 0.011; more here, so that a
    small graph's batches do not cycle over a few thousand seeds)."""
    num_steps: int = 60
    """Batches per run, warm-up included."""
    warmup_steps: int = 10
    """Batches left out of the throughput."""
    memory_ratios: tuple[float, ...] = (0.25, 0.10)
    """Memory budgets as fractions of each table's bytes."""
    lookaheads: tuple[int, ...] = (0, 1)
    """Batches hinted ahead by mlkv and frugal (MLKV's GNN path: 1)."""
    max_eval_nodes: int = 2000
    """Test nodes evaluated after training."""
    pin_feature_fraction: float = 0.0
    """Share of frugal's feature cache pinned with the hottest nodes' rows before training
    (`GnnTrainConfig.pin_feature_fraction`; the other systems cannot pin), in [0, 0.5]."""

    def __post_init__(self) -> None:
        check_types(self)
        if self.num_nodes < 1000 or self.embedding_dim < 1 or self.batch_size < 1:
            raise ValueError(
                f"num_nodes={self.num_nodes} must be >= 1000, embedding_dim="
                f"{self.embedding_dim} and batch_size={self.batch_size} >= 1"
            )
        if self.num_steps <= self.warmup_steps:
            raise ValueError(
                f"num_steps={self.num_steps} must exceed warmup_steps={self.warmup_steps}"
            )
        if not 0 < self.train_fraction <= 0.9:
            raise ValueError(f"train_fraction={self.train_fraction} must be in (0, 0.9]")
        if not self.memory_ratios or any(not 0 < r <= 1 for r in self.memory_ratios):
            raise ValueError(f"memory_ratios={self.memory_ratios} must be values in (0, 1]")
        if not self.lookaheads or any(w < 0 for w in self.lookaheads):
            raise ValueError(f"lookaheads={self.lookaheads} must be values >= 0")
        try:  # the trainer's own checks (fanouts, widths), named by their bench keys
            _gnn_settings(self, 0)
        except ValueError as exc:
            raise ValueError(f"gnn: {exc}") from None


@dataclass(frozen=True, kw_only=True, slots=True)
class StoreBenchConfig(BenchConfig):
    """What `frugal store bench` runs; `quick()` is the small preset."""

    systems: tuple[SystemName, ...] = (
        "ram",
        "rocksdb_offload",
        "lmdb_offload",
        "hlog",
        "mlkv",
        "frugal",
    )
    """Systems compared (see `frugal.store.baselines`)."""
    workloads: tuple[WorkloadName, ...] = (
        "criteo_zipf",
        "criteo_dlrm",
        "movielens100k",
        "collegemsg",
        "kge_freebase",
        "gnn_papers",
    )
    """Workloads: the Criteo-shaped Zipf stream with the planted teacher's gradient and with
    a real DLRM (`criteo_dlrm`), two real streams (the DLRM family, `WORKLOAD_FAMILIES`) and
    the KGE and GNN workloads."""
    scale: float = 0.25
    """Criteo cardinality scale (0.25 -> 8,441,945 rows; 0.02 -> 676,951), in (0, 1]."""
    alpha: float = 1.05
    """Zipf exponent of the Criteo trace."""
    batch_size: int = 1024
    """Samples per Criteo batch (x 26 ids); see `stream_events_per_batch` for the real streams."""
    num_batches: int = 4000
    """Criteo batches per run, including warm-up (the real streams replay every event)."""
    warmup_batches: int = 500
    """Batches excluded from the step-time medians."""
    embedding_dim: int = 16
    """D of the Criteo table (with Adam: 3D + 1 floats = 196 B per row at D = 16)."""
    memory_ratios: tuple[float, ...] = (1.0, 0.25, 0.10, 0.05)
    """Criteo memory budgets as fractions of the table's bytes."""
    lookaheads: tuple[int, ...] = (0, 1, 4, 8)
    """Criteo lookahead windows W for the systems that use hints (mlkv, frugal); others W = 0."""
    stream_memory_ratios: tuple[float, ...] = (0.25, 0.10)
    """Memory ratios of the real streams (MovieLens-100k, CollegeMsg; small tables, store.md)."""
    stream_lookaheads: tuple[int, ...] = (0, 4)
    """Lookahead windows of the real streams for mlkv and frugal."""
    stream_events_per_batch: int = 64
    """Events per batch of the real streams; each run replays the whole stream in time order."""
    stream_warmup_batches: int = 10
    """Real-stream batches excluded from the step-time medians."""
    staleness_bounds: tuple[int, ...] = (0, 1, 4, 16, -1)
    """Staleness study for frugal at ratio 0.10 and W = 4 (or the nearest in the grid);
    -1 = unbounded (a reader thread 8 batches ahead)."""
    compute_ms: float = 10.0
    """Sleep per step standing in for the dense network's compute, >= 0."""
    repeats: int = 1
    """Runs per cell; the row reports the median samples/s."""
    seed: int = 0
    """Seed of the trace, the teacher and the initial table."""
    run_timeout_s: float = 1800.0
    """Wall-clock limit of one child run."""
    kge: StoreKGEConfig = field(default_factory=StoreKGEConfig)
    """The KGE workload's model, sizes and grid (`kge_freebase`)."""
    gnn: StoreGNNConfig = field(default_factory=StoreGNNConfig)
    """The GNN workload's graph, model and grid (`gnn_papers`)."""

    def __post_init__(self) -> None:
        check_types(self)
        for name in (
            "systems",
            "workloads",
            "memory_ratios",
            "lookaheads",
            "stream_memory_ratios",
            "stream_lookaheads",
            "staleness_bounds",
        ):
            if not getattr(self, name):
                raise ValueError(f"{name} is empty; list at least one value")
        if any(b < -1 for b in self.staleness_bounds):
            raise ValueError(
                f"staleness_bounds={self.staleness_bounds} must be >= 0, or -1 for unbounded"
            )
        if not 0 < self.scale <= 1:
            raise ValueError(f"scale={self.scale} must be in (0, 1]")
        if self.num_batches <= self.warmup_batches:
            raise ValueError(
                f"num_batches={self.num_batches} must exceed warmup_batches={self.warmup_batches}"
            )
        for name in ("memory_ratios", "stream_memory_ratios"):
            if any(not 0 < r <= 1 for r in getattr(self, name)):
                raise ValueError(f"{name}={getattr(self, name)} must lie in (0, 1]")
        for name in ("lookaheads", "stream_lookaheads"):
            if any(w < 0 for w in getattr(self, name)):
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
        if self.stream_events_per_batch < 1 or self.stream_warmup_batches < 0:
            raise ValueError(
                f"stream_events_per_batch={self.stream_events_per_batch} must be >= 1 and "
                f"stream_warmup_batches={self.stream_warmup_batches} >= 0"
            )
        if self.run_timeout_s <= 0:
            raise ValueError(f"run_timeout_s={self.run_timeout_s} must be > 0 seconds")
        if self.compute_ms < 0 or self.repeats < 1 or self.batch_size < 1:
            raise ValueError("compute_ms must be >= 0, repeats and batch_size >= 1")
        if self.seed < 0:
            raise ValueError(f"seed={self.seed} must be >= 0")

    QUICK: ClassVar = {
        "systems": ("ram", "rocksdb_offload", "hlog", "mlkv", "frugal"),
        "workloads": ("criteo_zipf", "criteo_dlrm", "kge_freebase", "gnn_papers"),
        "scale": 0.02,
        "num_batches": 300,
        "warmup_batches": 50,
        "memory_ratios": (1.0, 0.10),
        "lookaheads": (0, 4),
        "staleness_bounds": (0, 4, -1),
        "kge": {
            "num_entities": 400_000,
            "num_steps": 160,
            "warmup_steps": 40,
            "memory_ratios": (0.10,),
            "lookaheads": (0, 4),
            "eval_triples": 500,
        },
        "gnn": {
            "num_nodes": 200_000,
            "embedding_dim": 16,
            "fanouts": (5, 5),
            "batch_size": 256,
            "hidden_channels": 64,
            "num_steps": 30,
            "warmup_steps": 5,
            "memory_ratios": (0.10,),
            "lookaheads": (1,),
            "max_eval_nodes": 500,
        },
    }
    """`--quick`: Criteo at scale 0.02, 300 batches, ratios 1.0/0.10, W 0/4; KGE on 400k
    entities (162 MB of rows), 160 steps at ratio 0.10.

    About 4 minutes on 2 cores; the real streams run in the full bench only."""
    PRESETS: ClassVar = {
        "quick": {
            "systems": ("ram", "rocksdb_offload", "mlkv", "frugal"),
            "memory_ratios": (0.25, 0.10),
            "num_batches": 120,
            "warmup_batches": 30,
            "staleness_bounds": (0,),
            "lookaheads": (4,),
            "workloads": ("criteo_zipf", "kge_freebase", "gnn_papers"),
            "kge": {"num_steps": 70, "warmup_steps": 20, "lookaheads": (4,)},
            "gnn": {"num_steps": 14, "warmup_steps": 4},
        },
        "smoke": {
            "scale": 0.001,
            "batch_size": 64,
            "num_batches": 24,
            "warmup_batches": 8,
            "memory_ratios": (0.10,),
            "compute_ms": 1.0,
            "workloads": ("criteo_zipf", "kge_freebase", "gnn_papers"),
            "gnn": {
                "num_nodes": 5000,
                "embedding_dim": 8,
                "batch_size": 32,
                "hidden_channels": 16,
                "num_steps": 6,
                "warmup_steps": 2,
                "memory_ratios": (0.5,),
                "max_eval_nodes": 50,
            },
            "kge": {
                "num_entities": 20_000,
                "num_relations": 100,
                "embedding_dim": 16,
                "batch_size": 256,
                "neg_sample_size": 64,
                "num_steps": 16,
                "warmup_steps": 4,
                "memory_ratios": (0.25,),
                "lookaheads": (0, 4),
                "eval_triples": 64,
                "eval_candidates": 100,
            },
        },
    }
    """`quick`: `quick()` on ram, rocksdb_offload, mlkv and frugal at ratios 0.25/0.10, 120
    batches, W = 4 only, staleness 0 only, KGE 70 steps, GNN 14 batches; `smoke`: that at
    scale 0.001, 24 batches of 64, ratio 0.10, KGE on 20k entities, GNN on 5k nodes."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StoreStalenessPoint(Summary):
    """One run of the staleness study (frugal, Criteo trace, lookahead 4)."""

    staleness_bound: int | str
    """The bound in steps, or "unbounded"."""
    samples_per_s: float
    final_loss: float
    """Mean training loss over the last tenth of the batches."""
    staleness_max: int
    """The largest staleness the store saw, steps."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StoreWorkloadSummary(Summary):
    """One workload's ratios (maps keyed by the memory ratio as a string, e.g. "0.1")."""

    lookahead: int
    """frugal's and mlkv's lookahead window W in the ratios (4, or the largest in the grid)."""
    speedup_vs_rocksdb_offload: dict[str, float]
    """frugal samples/s over rocksdb_offload's (W = 0)."""
    speedup_vs_mlkv: dict[str, float]
    """frugal over mlkv at the same W."""
    fraction_of_ram: dict[str, float]
    """frugal over the all-in-RAM table."""
    quality_metric: str
    """What `quality` holds: `final_loss` (DLRM traces) or `sampled_mrr` (KGE)."""
    quality: dict[str, dict[str, float]]
    """Per memory ratio, per system (at its summary W): the quality metric."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StoreSummary(Summary):
    """The headline ratios of `frugal store bench` (the `"summary"` of its `results.json`).

    Ratio maps are keyed by the memory ratio as a string (`"0.1"`); a ratio whose runs did not
    finish is absent from them.
    """

    speedup_vs_rocksdb_offload: dict[str, float]
    """frugal (lookahead `lookahead`) samples/s over rocksdb_offload's, per memory ratio."""
    speedup_vs_mlkv: dict[str, float]
    """frugal over mlkv at the same lookahead, per memory ratio."""
    fraction_of_ram: dict[str, float]
    """frugal over the all-in-RAM table, per memory ratio."""
    bit_identical_at_staleness_0: dict[str, bool | None]
    """Per workload: every staleness-0 run ended with one hash of the rows its steps touched
    (`table_sha256(ids)`; untouched rows keep their seeded initial values) (None: < 2 systems
    ran)."""
    staleness_study: list[StoreStalenessPoint]
    budget_violations: list[str]
    """Runs whose anonymous memory grew past 1.1 x budget + 32 MiB."""
    lookahead: int
    """The lookahead window W of frugal and mlkv in the ratios."""
    median_note: str
    reference_hit_ratios: dict[str, dict[str, dict[str, float]]]
    """Per workload and memory ratio: offline LRU and Belady hit ratios beside frugal's."""
    workloads: dict[str, StoreWorkloadSummary]
    """Per workload (`criteo_zipf`, `kge_freebase`, ...): its speed-ups and quality; the
    top-level maps above are `criteo_zipf`'s (MLKV's DLRM case)."""


@dataclass(frozen=True, slots=True)
class _Workload:
    name: str
    num_rows: int
    spec: RowSpec
    trace_path: str  # (num_batches, ids_per_batch) int64 .npy; "" for kge
    labels_path: str  # (num_batches, samples_per_batch) float32 .npy; "" for kge
    fields: int  # ids per sample
    main_grid: bool = False
    """Runs on the main grid (memory_ratios, lookaheads, warmup_batches) and carries the
    staleness study; else on the stream_* grid (or the kge grid for a KGE workload)."""
    kge: StoreKGEConfig | None = None
    """Set for a KGE workload: the child trains `frugal.store.kge` instead of the trace."""
    dlrm: bool = False
    """Train `frugal.store.dlrm.DLRM` on the trace (real forward and backward, no sleep)
    instead of the planted teacher's closed-form gradient."""
    gnn: StoreGNNConfig | None = None
    """Set for the GNN workload: `trace_path` is the graph's folder, `spec` the embedding
    table's rows, `num_rows` the nodes; the child trains `frugal.store.gnn.train_gnn`."""
    seed: int = 0
    """The KGE stream's and sampler's seed."""

    def ratios(self, config: StoreBenchConfig) -> tuple[float, ...]:
        """The memory:data ratios this workload runs at."""
        if self.kge is not None:
            return self.kge.memory_ratios
        if self.gnn is not None:
            return self.gnn.memory_ratios
        return config.memory_ratios if self.main_grid else config.stream_memory_ratios

    def lookaheads(self, config: StoreBenchConfig) -> tuple[int, ...]:
        """The lookahead windows W its lookahead systems run with."""
        if self.kge is not None:
            return self.kge.lookaheads
        if self.gnn is not None:
            return self.gnn.lookaheads
        return config.lookaheads if self.main_grid else config.stream_lookaheads

    def warmup_batches(self, config: StoreBenchConfig) -> int:
        """Batches before the timed ones."""
        if self.kge is not None:
            return self.kge.warmup_steps
        if self.gnn is not None:
            return self.gnn.warmup_steps
        return config.warmup_batches if self.main_grid else config.stream_warmup_batches

    def steps_and_ids_per_step(self) -> tuple[int, int]:
        """Steps of a run and the most row ids one step can touch (for the disk estimate)."""
        if self.kge is not None:
            k = self.kge
            chunks = max(1, k.batch_size // min(256, k.batch_size))
            return k.num_steps, 2 * k.batch_size + chunks * k.neg_sample_size
        if self.gnn is not None:  # seeds x (1 + f1 + f1 f2 + ...) sampled nodes
            g = self.gnn
            per_seed = sum(int(np.prod(g.fanouts[:k])) for k in range(len(g.fanouts) + 1))
            return g.num_steps, g.batch_size * per_seed
        shape = np.load(self.trace_path, mmap_mode="r").shape
        return int(shape[0]), int(np.prod(shape[1:]))

    def touched_ids(self) -> npt.NDArray[np.int64]:
        """Every row id a run's training steps touch, sorted (the rows the bench hashes)."""
        batches = self.unique_batches()
        if not batches:
            return np.zeros(0, dtype=np.int64)
        touched: npt.NDArray[np.int64] = np.unique(np.concatenate(batches)).astype(np.int64)
        return touched

    def unique_batches(self) -> list[npt.NDArray[np.int64]]:
        """Each batch's unique row ids, in step order (for the offline reference caches)."""
        if self.kge is not None:
            sampler = _kge_sampler(self.kge, self.seed)
            return [sampler.batch(t).ids for t in range(self.kge.num_steps)]
        if self.gnn is not None:
            return [batch.ids for batch in _gnn_batches(self)]
        trace = np.load(self.trace_path, mmap_mode="r")
        return [np.unique(np.asarray(trace[t])) for t in range(len(trace))]


@dataclass(frozen=True, slots=True)
class _Run:
    system: SystemName
    workload: _Workload
    memory_ratio: float
    lookahead: int
    staleness_bound: int | None
    compute_ms: float
    warmup_batches: int
    seed: int
    work_dir: str
    io_threads: int = 8
    extra: dict[str, Any] = field(default_factory=dict)


# --- traces --------------------------------------------------------------------------------


_DISK_FULL_FIX = "free space there or give --out a folder on a larger disk (its tables go there)"


def _save_trace(
    trace_path: Path, ids: npt.NDArray[Any], labels_path: Path, labels: npt.NDArray[Any]
) -> None:
    """Write a workload's id trace and labels (.npy), or raise `DiskFullError` naming them."""
    with guard_write(
        trace_path.parent, what=f"the store bench's {trace_path.stem} files",
        needed_bytes=int(ids.nbytes + labels.nbytes), fix=_DISK_FULL_FIX,
        partial=[trace_path, labels_path],
    ):  # fmt: skip
        np.save(trace_path, ids)
        np.save(labels_path, labels)


def _teacher_labels(ids_BF: npt.NDArray[np.int64], seed: int) -> npt.NDArray[np.float32]:
    """Planted teacher: y = 1[sum_f w*(id_f) > 0], w* = +-1 from splitmix64(seed, id)."""
    keys = ids_BF.astype(np.uint64) ^ np.uint64(seed * 0x9E3779B97F4A7C15 % (1 << 64))
    signs = np.where((splitmix64(keys) >> np.uint64(63)) == 1, 1.0, -1.0)
    labels: npt.NDArray[np.float32] = (signs.sum(axis=1) > 0).astype(np.float32)
    return labels


def _criteo_workload(config: StoreBenchConfig, folder: Path) -> _Workload:
    from frugal.data.synthetic import CriteoZipfStream

    stream = CriteoZipfStream(
        CriteoZipfStream.Config(scale=config.scale, alpha=config.alpha, seed=config.seed)
    )
    trace_path, labels_path = folder / "criteo_trace.npy", folder / "criteo_labels.npy"
    if not trace_path.exists():  # criteo_dlrm reads the same files
        ids = stream.ids(0, config.num_batches * config.batch_size)
        labels = _teacher_labels(ids, config.seed).reshape(config.num_batches, config.batch_size)
        _save_trace(trace_path, ids.reshape(config.num_batches, -1), labels_path, labels)
    spec = RowSpec(
        embedding_dim=config.embedding_dim, optimizer=OptimizerConfig(kind="adam", lr=1e-3)
    )
    return _Workload(
        "criteo_zipf", stream.num_embeddings, spec, str(trace_path), str(labels_path), 26,
        main_grid=True,
    )  # fmt: skip


def _criteo_dlrm_workload(config: StoreBenchConfig, folder: Path) -> _Workload:
    """The trace and labels of `criteo_zipf` (written once), trained by a real DLRM."""
    return replace(_criteo_workload(config, folder), name="criteo_dlrm", dlrm=True)


def _events_workload(name: WorkloadName, folder: Path, events_per_batch: int = 64) -> _Workload:
    """A real stream: ids = (src, dst) of each event (user, item for MovieLens), in time order.

    MovieLens-100k: D = 64 + Adam, label rating >= 4. CollegeMsg: a 172-float node memory with
    SGD (lr 1) toward a target, i.e. get -> new memory -> put through the same update path.
    """
    from frugal.data import load_events

    events = load_events(name)
    num_batches = events.num_events // events_per_batch
    if num_batches < 2:
        raise ValueError(
            f"stream_events_per_batch={events_per_batch} leaves {num_batches} batches of "
            f"{name}'s {events.num_events:,} events; use at most {events.num_events // 2}"
        )
    used = num_batches * events_per_batch
    ids = np.stack([events.src[:used], events.dst[:used]], axis=1)
    if events.msg is not None:  # MovieLens ratings
        labels = (events.msg[:used, 0] >= 4).astype(np.float32)
        spec = RowSpec(embedding_dim=64, optimizer=OptimizerConfig(kind="adam", lr=1e-3))
    else:
        labels = (ids[:, 0] % 2).astype(np.float32)
        spec = RowSpec(embedding_dim=172, optimizer=OptimizerConfig(kind="sgd", lr=1.0))
    trace_path, labels_path = folder / f"{name}_trace.npy", folder / f"{name}_labels.npy"
    _save_trace(
        trace_path, ids.reshape(num_batches, -1), labels_path, labels.reshape(num_batches, -1)
    )
    return _Workload(name, events.num_nodes, spec, str(trace_path), str(labels_path), 2)


def _kge_config(kge: StoreKGEConfig, seed: int) -> Any:
    from frugal.store.kge import KGEConfig

    return KGEConfig(
        model=kge.model, embedding_dim=kge.embedding_dim, batch_size=kge.batch_size,
        neg_sample_size=kge.neg_sample_size, neg_chunk_size=min(256, kge.batch_size),
        lr=kge.lr, seed=seed,
    )  # fmt: skip


def _kge_stream(kge: StoreKGEConfig, seed: int) -> Any:
    from frugal.data.triples import FreebaseLikeStream

    return FreebaseLikeStream(
        FreebaseLikeStream.Config(
            num_entities=kge.num_entities,
            num_relations=kge.num_relations,
            num_communities=min(1024, kge.num_entities),
            seed=seed,
        )
    )


def _kge_sampler(kge: StoreKGEConfig, seed: int) -> Any:
    from frugal.store.kge import KGESampler

    return KGESampler(_kge_stream(kge, seed), _kge_config(kge, seed))


def _kge_workload(config: StoreBenchConfig, folder: Path) -> _Workload:
    """DistMult on a Freebase-shaped stream; the entity table is the compared system's."""
    from frugal.store.kge import kge_row_spec

    spec = kge_row_spec(_kge_config(config.kge, config.seed))
    return _Workload(
        "kge_freebase", config.kge.num_entities, spec, "", "", 2, kge=config.kge,
        seed=config.seed,
    )  # fmt: skip


def _gnn_settings(g: StoreGNNConfig, seed: int) -> Any:
    from frugal.store.gnn import GnnTrainConfig

    return GnnTrainConfig(
        fanouts=g.fanouts, batch_size=g.batch_size, hidden_channels=g.hidden_channels,
        num_epochs=10**6, max_steps=g.num_steps, warmup_steps=g.warmup_steps,
        max_eval_nodes=g.max_eval_nodes, seed=seed,
        pin_feature_fraction=g.pin_feature_fraction,
    )  # fmt: skip


def _gnn_batches(w: _Workload) -> Iterator[Batch]:
    """The sampled batches a GNN run trains on (as `train_gnn` makes them), for references."""
    from frugal.data.graph import Graph
    from frugal.store.gnn.sampler import NeighborSampler

    assert w.gnn is not None
    graph = Graph.load(w.trace_path)
    settings = _gnn_settings(w.gnn, w.seed)
    sampler = NeighborSampler(
        graph, settings.fanouts, settings.batch_size, seed=settings.seed, nodes=graph.train_ids
    )
    step = 0
    for epoch in range(settings.num_epochs):
        sampler.set_epoch(epoch)
        for sampled in sampler:
            if step >= w.gnn.num_steps:
                return
            yield Batch(step=step, ids=np.sort(sampled.n_id))
            step += 1


def _gnn_workload(config: StoreBenchConfig, folder: Path) -> _Workload:
    """GraphSAGE on a `papers_like` graph generated into `folder` (features + embeddings)."""
    from frugal.data.papers_like import PapersLikeConfig, papers_like

    g = config.gnn
    graph_config = PapersLikeConfig(
        num_nodes=g.num_nodes, seed=config.seed, split=(g.train_fraction, 0.01, 0.02)
    )
    graph_folder = folder / "gnn_papers"
    with guard_write(
        folder, what="the store bench's papers_like graph",
        needed_bytes=graph_config.expected_disk_bytes(), fix=_DISK_FULL_FIX,
        partial=[graph_folder],
    ):  # fmt: skip
        papers_like(graph_folder, graph_config)
    spec = RowSpec(embedding_dim=g.embedding_dim, optimizer=OptimizerConfig(kind="adam", lr=1e-3))
    return _Workload(
        "gnn_papers", g.num_nodes, spec, str(graph_folder), "", 1, gnn=g, seed=config.seed
    )


HEADLINE_WORKLOAD = "criteo_zipf"
"""The workload the summary's speed-ups are measured on (MLKV's DLRM case)."""

_WORKLOADS: Registry[Callable[[StoreBenchConfig, Path], _Workload]] = Registry(
    "store bench workload", field="workloads"
)
"""How the bench builds each workload `StoreBenchConfig.workloads` names: its trace and labels
written into the given folder."""


def _stream_workload(name: WorkloadName) -> Callable[[StoreBenchConfig, Path], _Workload]:
    """The builder of the bundled event stream `name` (`_events_workload`)."""

    def build(config: StoreBenchConfig, folder: Path) -> _Workload:
        return _events_workload(name, folder, config.stream_events_per_batch)

    return build


_WORKLOADS.register("criteo_zipf", _criteo_workload)
_WORKLOADS.register("movielens100k", _stream_workload("movielens100k"))
_WORKLOADS.register("collegemsg", _stream_workload("collegemsg"))
_WORKLOADS.register("kge_freebase", _kge_workload)
_WORKLOADS.register("criteo_dlrm", _criteo_dlrm_workload)
_WORKLOADS.register("gnn_papers", _gnn_workload)


# --- one run (in a child process) --------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class _System:
    """How the bench opens one compared system, and what it measures about it."""

    build: Callable[[_Run, int], Any]
    """Opens the system's table for a run at a memory budget in bytes; raises ValueError if
    the budget cannot hold the system's fixed structures."""
    uses_lookahead: bool = False
    """Whether the system takes lookahead hints (its runs sweep the lookahead windows W)."""
    budget_enforced: bool = True
    """Whether the memory budget binds (lmdb lives in the OS page cache, ram holds all)."""


_SYSTEMS: Registry[_System] = Registry("store bench system", field="systems")
"""The systems `StoreBenchConfig.systems` names; `<engine>_offload` is `KvOffloadTable` on the
`KV_ENGINES` entry `<engine>`."""


def _ram(run: _Run, budget_bytes: int) -> Any:
    from frugal.store.baselines import RamTable

    return RamTable(run.workload.num_rows, run.workload.spec, run.seed)


def _on_disk(table: str, *, threaded: bool = False, **options: Any) -> Callable[[_Run, int], Any]:
    """Opens the `frugal.store.baselines` table class `table` in the run's folder.

    Args:
        table: `KvOffloadTable` or `HybridLogTable`.
        threaded: Pass the run's `io_threads` on.
        options: The class's other keyword arguments (`engine`, `mlkv`).
    """

    def build(run: _Run, budget_bytes: int) -> Any:
        from frugal.store import baselines

        w = run.workload
        threads = {"io_threads": run.io_threads} if threaded else {}
        return getattr(baselines, table)(
            Path(run.work_dir), w.num_rows, w.spec, run.seed, memory_budget_bytes=budget_bytes,
            **options, **threads,
        )  # fmt: skip

    return build


def _frugal(run: _Run, budget_bytes: int) -> Any:
    from frugal.store.store import EmbeddingStore

    config = EmbeddingStore.Config(
        backend="file",
        memory_budget_bytes=budget_bytes,
        staleness_bound=run.staleness_bound,
        io_threads=run.io_threads,
        timeout_s=120.0,
    )
    w = run.workload
    store = EmbeddingStore.create(
        Path(run.work_dir) / "store", num_rows=w.num_rows, spec=w.spec, config=config, seed=run.seed
    )
    return _StoreAdapter(store)


_SYSTEMS.register("ram", _System(build=_ram, budget_enforced=False))
_SYSTEMS.register("rocksdb_offload", _System(build=_on_disk("KvOffloadTable", engine="rocksdb")))
_SYSTEMS.register(
    "lmdb_offload", _System(build=_on_disk("KvOffloadTable", engine="lmdb"), budget_enforced=False)
)
_SYSTEMS.register("hlog", _System(build=_on_disk("HybridLogTable", threaded=True, mlkv=False)))
_SYSTEMS.register(
    "mlkv",
    _System(build=_on_disk("HybridLogTable", threaded=True, mlkv=True), uses_lookahead=True),
)
_SYSTEMS.register("frugal", _System(build=_frugal, uses_lookahead=True))


class _StoreAdapter:
    """EmbeddingStore behind the bench interface (ids already unique and sorted)."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def get(self, ids: npt.NDArray[np.int64], step: int) -> npt.NDArray[np.float32]:
        rows: npt.NDArray[np.float32] = self.store.get(ids, step=step)
        return rows

    def read(self, ids: npt.NDArray[np.int64], step: int) -> npt.NDArray[np.float32]:
        rows: npt.NDArray[np.float32] = self.store.read(ids, step=step)
        return rows

    def put(self, ids: npt.NDArray[np.int64], rows: npt.NDArray[np.float32], step: int) -> None:
        self.store.put(ids, rows, step=step)

    def release(self, ids: npt.NDArray[np.int64], step: int) -> None:
        self.store.release(ids, step=step)

    def apply_gradients(
        self, ids: npt.NDArray[np.int64], grads: npt.NDArray[np.float32], step: int
    ) -> None:
        self.store.apply_gradients(ids, grads, step=step)

    def lookahead(self, ids: Any, step: int) -> None:
        self.store.lookahead(ids, step)

    def pin(self, ids: npt.NDArray[np.int64], step: int = 0) -> int:
        return int(self.store.pin(ids, step))

    def unpin(self, ids: npt.NDArray[np.int64] | None = None) -> int:
        return int(self.store.unpin(ids))

    @property
    def cache_rows(self) -> int:
        return int(self.store.cache_rows)

    def table_sha256(self, ids: npt.NDArray[np.int64] | None = None) -> str:
        sha: str = self.store.table_sha256(ids=ids)
        return sha

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = self.store.stats()
        return stats

    def close(self) -> None:
        self.store.close(checkpoint=False)


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _anon_rss_mib() -> float:
    """Anonymous resident memory (heap, slabs, RocksDB caches), MiB; 0 where /proc is absent.

    Unlike ru_maxrss it leaves out file-backed pages such as the memory-mapped trace, which
    would otherwise count against every system's budget.
    """
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def _row_head(run: _Run, budget: int) -> dict[str, Any]:
    """The knobs of a run's row."""
    w = run.workload
    return {
        "system": run.system,
        "workload": w.name,
        "memory_ratio": run.memory_ratio,
        "lookahead": run.lookahead,
        "staleness_bound": "unbounded" if run.staleness_bound is None else run.staleness_bound,
        "compute_ms": run.compute_ms,
        "num_rows": w.num_rows,
        "row_bytes": w.spec.row_bytes,
        "memory_budget_bytes": budget,
        "budget_enforced": _SYSTEMS.get(run.system).budget_enforced,
    }


def _too_small(
    exc: CacheTooSmallError, run: _Run, ratio_key: str, batch_key: str
) -> dict[str, Any]:
    """An infeasible row: one batch needs more rows than the run's cache holds."""
    needed = run.memory_ratio * exc.wanted_rows / exc.capacity_rows
    return {
        "status": "infeasible",
        "error": (
            f"a batch needs {exc.wanted_rows:,} rows at once but {run.system}'s cache holds "
            f"{exc.capacity_rows:,} at memory ratio {run.memory_ratio}; use {ratio_key} of "
            f"about {needed:.2g} or more, a larger graph or table, or a smaller {batch_key}"
        ),
    }


def _memory_fields(row: dict[str, Any], budget: int, anon_growth_mib: float) -> dict[str, Any]:
    """Peak RSS, anonymous-memory growth and whether it broke the budget.

    store.md: more than 1.1 x budget + 32 MiB of new anonymous memory breaks it.
    """
    return {
        "peak_rss_mib": _rss_mib(),
        "anon_rss_growth_mib": anon_growth_mib,
        "budget_violated": bool(
            row["budget_enforced"] and anon_growth_mib > 1.1 * budget / _MIB + 32.0
        ),
    }


def _disk_log_stats(stats: dict[str, Any]) -> dict[str, int]:
    """What a log-structured system's log held at the end and what its cleaner copied.

    frugal's file backend: records on disk and live, segments cleaned and deleted; hlog and
    mlkv: the disk log's bytes and the records compaction copied ({} for the others).
    """
    keys = ("disk_records", "live_records", "cleaned_records", "deleted_segments",
            "disk_log_bytes", "compacted_records")  # fmt: skip
    merged = {**stats, **stats.get("backend", {})}
    return {k: int(merged[k]) for k in keys if k in merged}


def _read_vectors(system: Any) -> Callable[[npt.NDArray[np.int64]], Any]:
    """Reads of vectors that change no row (for evaluation after training).

    The store peeks (a peek streams more rows than its cache holds); the others `read`.
    """
    if isinstance(system, _StoreAdapter):
        return lambda ids: system.store.peek(ids, cols="emb")
    return lambda ids: system.read(np.ascontiguousarray(ids, dtype=np.int64), 0)


def _execute_kge(run: _Run) -> dict[str, Any]:
    """One KGE run (`frugal.store.kge.train_kge`); executed in a fresh child process."""
    import torch

    from frugal.store.baselines import RamTable
    from frugal.store.kge import KGE_MODELS, evaluate_kge, train_kge

    torch.set_num_threads(1)
    w = run.workload
    assert w.kge is not None
    kge = w.kge
    budget = int(run.memory_ratio * w.num_rows * w.spec.row_bytes)
    row = _row_head(run, budget)
    anon_before = _anon_rss_mib()
    try:
        system = _SYSTEMS.get(run.system).build(run, budget)
    except ValueError as exc:
        return row | {"status": "infeasible", "error": str(exc)}
    sampler = _kge_sampler(kge, run.seed)
    relations = RamTable(kge.num_relations, w.spec, run.seed + 1)
    wall_start = time.perf_counter()
    try:
        result = train_kge(
            sampler, system, relations, num_steps=kge.num_steps, lookahead=run.lookahead,
            warmup_steps=kge.warmup_steps,
        )  # fmt: skip
    except CacheTooSmallError as exc:
        return row | _too_small(exc, run, "kge.memory_ratios", "kge.batch_size")
    wall_s = time.perf_counter() - wall_start
    anon_peak = _anon_rss_mib()
    stats = system.stats()
    held_out = sampler.source.triples(10**12, 10**12 + kge.eval_triples)
    quality = evaluate_kge(
        KGE_MODELS.get(kge.model)(sampler.config),
        _read_vectors(system),
        lambda ids: relations.table[ids, : kge.embedding_dim],
        held_out, num_entities=kge.num_entities, num_relations=kge.num_relations,
        num_candidates=kge.eval_candidates, seed=run.seed,
    )  # fmt: skip
    sha = system.table_sha256(w.touched_ids())
    system.close()
    step_s = np.array(result.step_s[kge.warmup_steps :])
    anon_growth_mib = max(anon_peak, _anon_rss_mib()) - anon_before
    tail = max(1, len(result.losses) // 10)
    return row | {
        "status": "ok",
        "samples_per_s": result.triples_per_s,
        # the whole run, sampling and lookahead included (the median step leaves them out)
        "samples_per_s_wall": kge.batch_size * kge.num_steps / wall_s,
        "samples": "positive triples",
        "stall_fraction": result.read_s / wall_s,
        "hit_ratio": stats.get("hit_ratio", float("nan")),
        "read_bytes_per_batch": stats.get("bytes_read", 0) / kge.num_steps,
        "written_bytes_per_batch": stats.get("bytes_written", 0) / kge.num_steps,
        "p50_step_ms": 1000 * float(np.median(step_s)),
        "p99_step_ms": 1000 * float(np.percentile(step_s, 99)),
        **_memory_fields(row, budget, anon_growth_mib),
        "staleness_max": stats.get("staleness_max", 0),
        "disk_log": _disk_log_stats(stats),
        "final_loss": float(np.mean(result.losses[-tail:])),
        "quality_metric": "sampled_mrr",
        "quality": quality["mrr"],
        "hits_at_10": quality["hits@10"],
        "table_sha256": sha,
        "wall_s": wall_s,
    }


class _RamRows:
    """Read-only rows of an array (a memory-mapped feature matrix) as a table."""

    def __init__(self, rows: Any) -> None:
        self.rows = rows

    def read(self, ids: npt.NDArray[np.int64], step: int) -> npt.NDArray[np.float32]:
        out: npt.NDArray[np.float32] = np.asarray(self.rows[ids], dtype=np.float32)
        return out

    def lookahead(self, ids: Any, step: int) -> None:
        """Nothing to prefetch."""


def _execute_gnn(run: _Run) -> dict[str, Any]:
    """One GNN run (`frugal.store.gnn.train_gnn`); executed in a fresh child process.

    Two tables of the run's system: the graph's node features (read-only, optimizer "none")
    and learnable node embeddings (Adam), each with `memory_ratio` of its own bytes.
    """
    import torch

    from frugal.data.graph import Graph
    from frugal.store.gnn import load_rows, train_gnn

    torch.set_num_threads(1)
    w = run.workload
    assert w.gnn is not None
    graph = Graph.load(w.trace_path)
    assert graph.features is not None
    feature_spec = RowSpec(embedding_dim=graph.num_features, optimizer=OptimizerConfig(kind="none"))
    tables_bytes = w.num_rows * (w.spec.row_bytes + feature_spec.row_bytes)
    budget = int(run.memory_ratio * tables_bytes)
    row = _row_head(run, budget)
    row["row_bytes"] = w.spec.row_bytes + feature_spec.row_bytes
    # Two throwaway steps on RAM tables first: torch's allocator and autograd warm up
    # outside the measured growth, which then holds what the compared tables keep.
    from frugal.store.baselines import RamTable

    warm = replace(_gnn_settings(w.gnn, run.seed), max_steps=2, warmup_steps=0, max_eval_nodes=1)
    train_gnn(
        graph,
        features=_RamRows(graph.features),  # type: ignore[arg-type]  # reads only
        embeddings=RamTable(w.num_rows, w.spec, run.seed),
        config=warm,
    )
    anon_before = _anon_rss_mib()
    system = _SYSTEMS.get(run.system)
    try:
        emb_budget = int(run.memory_ratio * w.num_rows * w.spec.row_bytes)
        embeddings = system.build(
            replace(run, work_dir=str(Path(run.work_dir) / "emb")), emb_budget
        )
        feature_run = replace(
            run,
            workload=replace(w, spec=feature_spec),
            work_dir=str(Path(run.work_dir) / "features"),
        )
        features = system.build(feature_run, budget - emb_budget)
    except ValueError as exc:
        return row | {"status": "infeasible", "error": str(exc)}
    # in chunks of a quarter of the budget's rows, so a put streams through any cache
    chunk_rows = max(64, (budget - emb_budget) // (4 * feature_spec.row_bytes))
    load_rows(features, graph.features, chunk_rows=chunk_rows)
    settings = replace(_gnn_settings(w.gnn, run.seed), lookahead=run.lookahead)
    try:
        result = train_gnn(graph, features=features, embeddings=embeddings, config=settings)
    except CacheTooSmallError as exc:  # one batch's rows do not fit the cache
        return row | _too_small(exc, run, "gnn.memory_ratios", "gnn.batch_size")
    anon_peak = _anon_rss_mib()
    stats = embeddings.stats()
    feature_stats = features.stats()
    sha = embeddings.table_sha256(w.touched_ids())
    embeddings.close()
    features.close()
    anon_growth_mib = max(anon_peak, _anon_rss_mib()) - anon_before
    tail = max(1, len(result.losses) // 10)
    phases = result.median_ms()
    pull_s = sum(result.pull_ms) / 1000.0
    return row | {
        "status": "ok",
        "samples_per_s": result.samples_per_s,
        "samples": "seed nodes",
        "stall_fraction": pull_s / result.train_s,
        "hit_ratio": stats.get("hit_ratio", float("nan")),
        "feature_hit_ratio": feature_stats.get("hit_ratio", float("nan")),
        "pinned_feature_rows": result.pinned_rows,
        "read_bytes_per_batch": (stats.get("bytes_read", 0) + feature_stats.get("bytes_read", 0))
        / result.num_steps,
        "written_bytes_per_batch": stats.get("bytes_written", 0) / result.num_steps,
        "p50_step_ms": sum(phases.values()),
        "p99_step_ms": float("nan"),
        **{f"p50_{name}": value for name, value in phases.items()},
        **_memory_fields(row, budget, anon_growth_mib),
        "staleness_max": stats.get("staleness_max", 0),
        "disk_log": _disk_log_stats(stats),
        "final_loss": float(np.mean(result.losses[-tail:])),
        "quality_metric": "test_accuracy",
        "quality": result.test_accuracy,
        "table_sha256": sha,
        "wall_s": result.train_s,
    }


def _execute(run: _Run) -> dict[str, Any]:
    """One measured run; executed in a fresh child process."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    w = run.workload
    if w.kge is not None:
        return _execute_kge(run)
    if w.gnn is not None:
        return _execute_gnn(run)
    trace = np.load(w.trace_path, mmap_mode="r")
    labels = np.load(w.labels_path, mmap_mode="r")
    num_batches, samples = labels.shape
    table_bytes = w.num_rows * w.spec.row_bytes
    budget = int(run.memory_ratio * table_bytes)
    row = _row_head(run, budget)
    d = w.spec.embedding_dim
    model = optimizer = None
    if w.dlrm:
        import torch

        from frugal.store.dlrm import DLRM, dlrm_update

        torch.set_num_threads(1)
        model = DLRM(w.fields, d, seed=run.seed)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        # A throwaway step on a throwaway copy: torch's allocator and autograd warm up
        # outside the measured memory growth, which then holds what the table keeps.
        spare = DLRM(w.fields, d, seed=run.seed)
        dlrm_update(
            spare, torch.optim.Adam(spare.parameters(), lr=1e-3),
            np.zeros((samples * w.fields, d), dtype=np.float32),
            np.arange(samples * w.fields).reshape(samples, w.fields),
            np.zeros(samples, dtype=np.float32),
        )  # fmt: skip
        del spare
    anon_before = anon_peak = _anon_rss_mib()
    try:
        system = _SYSTEMS.get(run.system).build(run, budget)
    except ValueError as exc:  # the budget cannot hold the system's fixed structures
        return row | {"status": "infeasible", "error": str(exc)}
    u_scale = np.float32(1.0 / np.sqrt(d))
    step_s: list[float] = []
    get_s = 0.0
    losses: list[float] = []
    batches = (Batch(step=t, ids=np.asarray(trace[t])) for t in range(num_batches))
    source: Iterator[Batch] = iter(LookaheadLoader(batches, system, run.lookahead))
    reads: Iterator[tuple[Batch, Any, Any, float]]
    if run.staleness_bound != 0:  # staleness study: reads run ahead in a thread
        # Unbounded: 8 batches ahead (store.md's 32 pins 32 batches of rows, more than a
        # 10% cache holds).
        ahead = 8 if run.staleness_bound is None else run.staleness_bound
        reads = _reader_thread(source, system, ahead=ahead)
    else:
        reads = _inline_reads(source, system)
    wall_start = time.perf_counter()
    for batch, unique, (inverse, emb), read_s in reads:
        t0 = time.perf_counter() - read_s
        get_s += read_s
        y = labels[batch.step]
        if model is not None and optimizer is not None:  # a real DLRM: forward and backward
            loss, row_grads = dlrm_update(
                model, optimizer, emb, inverse.reshape(samples, -1), np.asarray(y)
            )
            losses.append(loss)
            system.apply_gradients(unique, row_grads, batch.step)
            optimizer.step()
            step_s.append(time.perf_counter() - t0)
            continue
        # logit_b = sum_f <e_f, u> with u = 1/sqrt(D) in every coordinate.
        logit = emb.sum(axis=1)[inverse].reshape(samples, -1).sum(axis=1) * u_scale
        p = 1.0 / (1.0 + np.exp(-logit))
        eps = 1e-7
        losses.append(float(-np.mean(y * np.log(p + eps) + (1 - y) * np.log(1 - p + eps))))
        dlogit = ((p - y) / samples).astype(np.float32)
        per_id = np.bincount(inverse, weights=np.repeat(dlogit, w.fields), minlength=len(unique))
        grads = np.repeat((per_id.astype(np.float32) * u_scale)[:, None], d, axis=1)
        system.apply_gradients(unique, np.ascontiguousarray(grads, dtype=np.float32), batch.step)
        if run.compute_ms:
            time.sleep(run.compute_ms / 1000.0)
        step_s.append(time.perf_counter() - t0)
        if batch.step % 16 == 0:  # outside the timed step
            anon_peak = max(anon_peak, _anon_rss_mib())
    wall_s = time.perf_counter() - wall_start
    stats = system.stats()
    sha = system.table_sha256(w.touched_ids())
    system.close()
    measured = (
        np.array(step_s[run.warmup_batches :])
        if len(step_s) > run.warmup_batches
        else np.array(step_s)
    )
    median_s = median_after_warmup(step_s, run.warmup_batches)
    anon_growth_mib = max(anon_peak, _anon_rss_mib()) - anon_before
    tail = max(1, len(losses) // 10)
    return row | {
        "status": "ok",
        "samples_per_s": samples / median_s,
        "stall_fraction": get_s / wall_s,
        "hit_ratio": stats.get("hit_ratio", float("nan")),
        "read_bytes_per_batch": stats.get("bytes_read", 0) / num_batches,
        "written_bytes_per_batch": stats.get("bytes_written", 0) / num_batches,
        "p50_step_ms": 1000 * median_s,
        "p99_step_ms": 1000 * float(np.percentile(measured, 99)),
        **_memory_fields(row, budget, anon_growth_mib),
        "staleness_max": stats.get("staleness_max", 0),
        "disk_log": _disk_log_stats(stats),
        "final_loss": float(np.mean(losses[-tail:])),
        "quality_metric": "final_loss",
        "quality": float(np.mean(losses[-tail:])),
        "table_sha256": sha,
        "wall_s": wall_s,
    }


def _inline_reads(source: Iterator[Batch], system: Any) -> Iterator[tuple[Batch, Any, Any, float]]:
    for batch in source:
        t0 = time.perf_counter()
        unique, inverse = np.unique(batch.ids, return_inverse=True)
        emb = system.get(unique, batch.step)
        yield batch, unique, (inverse, emb), time.perf_counter() - t0


def _reader_thread(
    source: Iterator[Batch], system: Any, ahead: int
) -> Iterator[tuple[Batch, Any, Any, float]]:
    """Reads run in a thread up to `ahead` batches before the trainer (staleness study)."""
    out: queue.Queue[Any] = queue.Queue(maxsize=max(1, ahead))
    done = object()

    def work() -> None:
        try:
            for item in _inline_reads(source, system):
                out.put(item)
        except BaseException as exc:  # handed to the trainer
            out.put(exc)
        out.put(done)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    while True:
        t0 = time.perf_counter()
        item = out.get(timeout=300)
        waited = time.perf_counter() - t0
        if item is done:
            break
        if isinstance(item, BaseException):
            raise item
        batch, unique, payload, _ = item
        yield batch, unique, payload, waited
    thread.join(timeout=60)


# --- the whole bench -----------------------------------------------------------------------


def _plan(config: StoreBenchConfig, workloads: list[_Workload], work_dir: Path) -> list[_Run]:
    runs: list[_Run] = []
    for workload in workloads:
        for ratio in workload.ratios(config):
            for system in config.systems:
                grid = workload.lookaheads(config)
                windows = grid if _SYSTEMS.get(system).uses_lookahead else (0,)
                for window in windows:
                    real_model = (
                        workload.kge is not None or workload.gnn is not None or workload.dlrm
                    )
                    compute_ms = 0.0 if real_model else config.compute_ms
                    runs.append(
                        _Run(system, workload, ratio, window, 0, compute_ms,
                             workload.warmup_batches(config), config.seed, "")
                    )  # fmt: skip
        if workload.main_grid and not workload.dlrm and "frugal" in config.systems:
            ratio = 0.10 if 0.10 in config.memory_ratios else min(config.memory_ratios)
            study_window = 4 if 4 in config.lookaheads else max(config.lookaheads)
            for bound in config.staleness_bounds:
                if bound == 0:
                    continue  # the grid above has it
                runs.append(
                    _Run("frugal", workload, ratio, study_window, None if bound < 0 else bound,
                         config.compute_ms, config.warmup_batches, config.seed, "")
                )  # fmt: skip
    return [replace(run, work_dir=str(work_dir / f"run{i}")) for i, run in enumerate(runs)]


def disk_bytes_needed(run: _Run, *, lower: bool = False) -> int:
    """An upper bound of the disk one run's tables take, in bytes (`lower`: a lower bound).

    The lower bound is every row the run may touch, stored once: what any system must hold
    (the bench refuses a disk with less free space before any run). The upper bound:

    Log-structured tables (`frugal`'s file backend, `hlog`, `mlkv`) append every written-back
    row (at most every id of every step, twice for mlkv's copies to the tail) and clean or
    compact once the log passes 1.5x the rows written, at the record size (frugal: row +
    16-byte footer, 8-aligned, plus three segments; hlog and mlkv: rounded up to 512 bytes,
    plus one compaction step of 256 MiB). KV tables hold each touched row once (plus the key
    and per-entry overhead, about 64 bytes), doubled for compaction. `ram` writes nothing.
    """
    from frugal.store.backends.file import record_bytes, segment_shift_for

    w = run.workload
    steps, ids_per_step = w.steps_and_ids_per_step()
    writes = steps * ids_per_step
    touched = min(w.num_rows, writes)
    if run.system == "ram":
        return 0
    if lower:
        return touched * w.spec.row_bytes
    if run.system.endswith("_offload"):
        return 2 * touched * (w.spec.row_bytes + 64)
    if run.system == "frugal":
        stride = record_bytes(w.spec.row_bytes)
        slack = 3 * (1 << segment_shift_for(stride)) * stride
    else:
        stride = -(-w.spec.row_bytes // 512) * 512
        writes *= 2 if run.system == "mlkv" else 1
        slack = 256 << 20
    return min(writes * stride, int(1.5 * touched * stride) + slack) + (64 << 20)


def run_store_bench(
    config: StoreBenchConfig,
    out_dir: Path,
    *,
    progress: Progress | None = None,
) -> BenchResult[StoreSummary]:
    """Run every cell of `config` side by side; write `results.json` and return the result.

    Each finished cell is appended to `out_dir/runs.jsonl`; a later call with the same config
    reuses those rows (marked `resumed`) and measures only the rest, so a long full bench
    survives interruption. The journal is keyed on the config and on the source of
    `frugal.store`, so a folder kept across sessions resumes only unchanged code. Use a new
    `out_dir` to measure everything again.

    Args:
        config: The grid and sizes.
        out_dir: Folder for `results.json` (created).
        progress: Called with one line per finished run.

    Returns:
        The typed summary, the rows and the results document (ARCHITECTURE.md format).

    Raises:
        OSError: If the output or scratch folder cannot be written.
        DiskFullError: Before any run, if the folder's disk has less free space than the
            largest run's tables may take (`disk_bytes_needed`); the message names both.
    """
    from frugal.results import BenchJournal

    out_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_scratch(out_dir)
    scratch = Path(tempfile.mkdtemp(prefix=f"{_SCRATCH_PREFIX}{os.getpid()}-", dir=out_dir))
    try:
        traces = scratch / "traces"
        traces.mkdir()
        workloads = [_WORKLOADS.get(name)(config, traces) for name in config.workloads]
        runs = _plan(config, workloads, scratch)
        most = max((disk_bytes_needed(run) for run in runs), default=0)
        least = max((disk_bytes_needed(run, lower=True) for run in runs), default=0)
        check_free_space(
            scratch, least, what="the store bench's tables (one run's at a time)",
            fix="free space there, give --out a folder on a larger disk, or lower the sizes "
            "(num_batches, kge.num_steps)",
        )  # fmt: skip
        if progress is not None:
            progress(
                f"{len(runs)} runs; each needs {human_bytes(least)} to at most "
                f"{human_bytes(most)} of disk"
            )
        rows: list[dict[str, Any]] = []
        # Keyed on the store's code too: a journal kept across sessions (benchmarks/store/)
        # resumes only while frugal.store is unchanged, so one table never mixes versions.
        journal = BenchJournal(out_dir / "runs.jsonl", config, code=(Path(__file__).parent,))
        for index, run in enumerate(runs):
            cell = _cell(run)
            if (earlier := journal.get(cell)) is not None:  # an interrupted invocation's
                row = earlier | {"resumed": True}
            else:
                repeats = []
                for _ in range(config.repeats):
                    Path(run.work_dir).mkdir(parents=True, exist_ok=True)
                    repeats.append(_run_in_child(run, config.run_timeout_s))
                    _stop_if_the_disk_filled(repeats[-1], run, cell, journal.path)
                    shutil.rmtree(run.work_dir, ignore_errors=True)
                ok = [r for r in repeats if r.get("status") == "ok"]
                row = dict(repeats[0])
                if ok:
                    row = dict(median_item(ok, key=lambda r: float(r["samples_per_s"])))
                    row["samples_per_s_runs"] = [r["samples_per_s"] for r in ok]
                row["measured_at"] = datetime.datetime.now(datetime.UTC).isoformat(
                    timespec="seconds"
                )
                if row.get("status") == "ok":  # failed cells run again on resume
                    journal.record(cell, row)
            rows.append(row)
            if progress is not None:
                progress(_describe(index, len(runs), row))
        summary = _summary(
            rows,
            4 if 4 in config.lookaheads else max(config.lookaheads),
            _reference_hit_ratios(config, workloads, rows),
        )
        return write_bench_results("store", config, rows, summary, out_dir / "results.json")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


_SCRATCH_PREFIX = "frugal-store-bench-"


def _remove_stale_scratch(out_dir: Path) -> None:
    """Delete the scratch folders (tables, traces) that killed benches left in `out_dir`.

    A scratch folder is `frugal-store-bench-<pid>-<random>`; it is stale when no process
    with that pid is alive (a bench that was `kill -9`ed or lost power). A live pid's folder
    may be another bench sharing the folder and is kept.
    """
    for folder in out_dir.glob(f"{_SCRATCH_PREFIX}*"):
        pid_text = folder.name[len(_SCRATCH_PREFIX) :].split("-", 1)[0]
        if not (folder.is_dir() and pid_text.isdigit()) or _alive(int(pid_text)):
            continue
        shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _reference_hit_ratios(
    config: StoreBenchConfig, workloads: list[_Workload], rows: list[dict[str, Any]]
) -> dict[str, dict[str, dict[str, float]]]:
    """Offline LRU and Belady demand hit ratios beside frugal's, per workload and ratio.

    The reference caches hold budget / row_bytes rows (no index or buffers: more than any
    system gets), so Belady bounds every demand-fetching policy; frugal's hit ratio at W > 0
    also counts rows its prefetch brought in early, so it may exceed Belady's.
    """
    from frugal.store.reference import belady_hit_ratio, lru_hit_ratio

    out: dict[str, dict[str, dict[str, float]]] = {}
    for w in workloads:
        batches = w.unique_batches()
        for ratio in w.ratios(config):
            capacity = max(1, int(ratio * w.num_rows * w.spec.row_bytes) // w.spec.row_bytes)
            cell = {
                "capacity_rows": float(capacity),
                "lru_demand": lru_hit_ratio(batches, w.num_rows, capacity),
                "belady_demand": belady_hit_ratio(batches, w.num_rows, capacity),
            }
            for r in rows:
                if (
                    r.get("status") == "ok"
                    and r["system"] == "frugal"
                    and r["workload"] == w.name
                    and r["memory_ratio"] == ratio
                    and r["staleness_bound"] == 0
                ):
                    cell[f"frugal_W{r['lookahead']}"] = r["hit_ratio"]
            out.setdefault(w.name, {})[str(ratio)] = cell
    return out


def _cell(run: _Run) -> str:
    return (
        f"{run.workload.name}/{run.system}/ratio={run.memory_ratio}/W={run.lookahead}/"
        f"s={run.staleness_bound}"
    )


def _run_in_child(run: _Run, timeout_s: float) -> dict[str, Any]:
    """Run one cell in a fresh process (`run_cell`); a failed cell is a row with its status."""
    outcome = run_cell(_execute, run, timeout_s=timeout_s, setup=fixed_mmap_threshold)
    if outcome.status == "ok" and outcome.value is not None:
        return outcome.value
    if outcome.value is not None:  # answered, then exited non-zero
        return outcome.value | {"status": outcome.status}
    return _failed(run, outcome.status, outcome.error or "")


def _stop_if_the_disk_filled(row: dict[str, Any], run: _Run, cell: str, journal: Path) -> None:
    """Raise `DiskFullError` if this cell failed on a full disk (its work folder is removed).

    Every later cell would fail the same way, so the bench stops with its journal whole
    instead of filling its table with failed cells; the cell is not journaled and a rerun on
    a larger disk resumes from it. A cell's disk use cannot be known before it runs (the
    log-structured tables grow with write-backs until compaction), so the message gives what
    it had written when the disk filled up as a lower bound of the space it needs.
    """
    error = str(row.get("error", ""))
    if row.get("status") == "ok" or not mentions_disk_full(error):
        return
    work_dir = Path(run.work_dir)
    written = sum(p.stat().st_blocks * 512 for p in work_dir.rglob("*") if p.is_file())
    shutil.rmtree(work_dir, ignore_errors=True)
    raise disk_filled_error(
        journal.parent, what=f"the store bench cell {cell}", written_bytes=written,
        detail=error.splitlines()[0] if error else "", fix=_DISK_FULL_FIX,
        kept=f"finished cells are journaled in {journal}; a rerun resumes",
    )  # fmt: skip


def _failed(run: _Run, status: str, error: str) -> dict[str, Any]:
    return {
        "system": run.system,
        "workload": run.workload.name,
        "memory_ratio": run.memory_ratio,
        "lookahead": run.lookahead,
        "staleness_bound": "unbounded" if run.staleness_bound is None else run.staleness_bound,
        "status": status,
        "error": error,
    }


def _describe(index: int, total: int, row: dict[str, Any]) -> str:
    head = (
        f"[{index + 1}/{total}] {row.get('workload')} {row.get('system')} "
        f"ratio={row.get('memory_ratio')} W={row.get('lookahead')} s={row.get('staleness_bound')}"
    )
    if row.get("status") != "ok":
        return f"{head}: {row.get('status')} {row.get('error', '')}"
    return (
        f"{head}: {_number(row.get('samples_per_s'), '.0f')} samples/s, "
        f"hit {_number(row.get('hit_ratio'), '.2f')}, "
        f"stall {_number(row.get('stall_fraction'), '.2f')}"
    )


def _number(value: Any, spec: str) -> str:
    """`value` formatted, or 'n/a' (a journaled row stores NaN as null)."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "n/a"
    return format(value, spec)


def _summary(
    rows: list[dict[str, Any]],
    window: int,
    reference_hit_ratios: dict[str, dict[str, dict[str, float]]] | None = None,
) -> StoreSummary:
    """Headline ratios of frugal at lookahead `window` (4 unless the grid lacks it)."""
    ok = [r for r in rows if r.get("status") == "ok"]

    def pick(system: str, workload: str, ratio: float, lookahead: int) -> dict[str, Any] | None:
        for r in ok:
            if (
                r["system"] == system
                and r["workload"] == workload
                and r["memory_ratio"] == ratio
                and r["lookahead"] == lookahead
                and r["staleness_bound"] == 0
            ):
                return r
        return None

    def ratio_maps_of(workload: str, window: int) -> dict[str, dict[str, float]]:
        maps: dict[str, dict[str, float]] = {
            "speedup_vs_rocksdb_offload": {},
            "speedup_vs_mlkv": {},
            "fraction_of_ram": {},
        }
        ratios = sorted({r["memory_ratio"] for r in ok if r["workload"] == workload}, reverse=True)
        for ratio in ratios:
            ours = pick("frugal", workload, ratio, window)
            if ours is None:
                continue
            for key, system, other_window in (
                ("speedup_vs_rocksdb_offload", "rocksdb_offload", 0),
                ("speedup_vs_mlkv", "mlkv", window),
                ("fraction_of_ram", "ram", 0),
            ):
                other = pick(system, workload, ratio, other_window)
                if other is not None:
                    maps[key][str(ratio)] = ours["samples_per_s"] / other["samples_per_s"]
        return maps

    ratio_maps = ratio_maps_of(HEADLINE_WORKLOAD, window)
    per_workload: dict[str, StoreWorkloadSummary] = {}
    for name in dict.fromkeys(r["workload"] for r in ok):
        windows = {r["lookahead"] for r in ok if r["workload"] == name}
        w_window = 4 if 4 in windows else max(windows)
        maps = ratio_maps_of(name, w_window)
        quality: dict[str, dict[str, float]] = {}
        metric = ""
        for r in ok:
            if r["workload"] != name or r["staleness_bound"] != 0 or "quality" not in r:
                continue
            uses_lookahead = _SYSTEMS.get(r["system"]).uses_lookahead
            if r["lookahead"] != (w_window if uses_lookahead else 0):
                continue
            metric = r["quality_metric"]
            quality.setdefault(str(r["memory_ratio"]), {})[r["system"]] = r["quality"]
        per_workload[name] = StoreWorkloadSummary(
            lookahead=w_window,
            speedup_vs_rocksdb_offload=maps["speedup_vs_rocksdb_offload"],
            speedup_vs_mlkv=maps["speedup_vs_mlkv"],
            fraction_of_ram=maps["fraction_of_ram"],
            quality_metric=metric,
            quality=quality,
        )
    # Per workload: True when every finished staleness-0 run of at least two systems ended
    # with one table hash, False on any difference, None (not measured) with fewer than two.
    hashes: dict[str, set[str]] = {}
    systems: dict[str, set[str]] = {}
    for r in ok:
        if r["staleness_bound"] == 0:
            hashes.setdefault(r["workload"], set()).add(r["table_sha256"])
            systems.setdefault(r["workload"], set()).add(r["system"])
    identical: dict[str, bool | None] = {
        k: (len(v) == 1) if len(systems[k]) >= 2 else None for k, v in hashes.items()
    }
    staleness = [
        StoreStalenessPoint(
            staleness_bound=r["staleness_bound"],
            samples_per_s=r["samples_per_s"],
            final_loss=r["final_loss"],
            staleness_max=r["staleness_max"],
        )
        for r in ok
        if r["system"] == "frugal"
        and r["workload"] == HEADLINE_WORKLOAD
        and r["lookahead"] == 4
        and r["memory_ratio"]
        == (0.10 if any(x["memory_ratio"] == 0.10 for x in ok) else r["memory_ratio"])
    ]
    violations = [
        f"{r['system']}/{r['workload']}/ratio={r['memory_ratio']}/W={r['lookahead']}: "
        f"{r['anon_rss_growth_mib']:.0f} MiB for a {r['memory_budget_bytes'] / _MIB:.0f} MiB budget"
        for r in ok
        if r.get("budget_violated")
    ]
    return StoreSummary(
        speedup_vs_rocksdb_offload=ratio_maps["speedup_vs_rocksdb_offload"],
        speedup_vs_mlkv=ratio_maps["speedup_vs_mlkv"],
        fraction_of_ram=ratio_maps["fraction_of_ram"],
        bit_identical_at_staleness_0=identical,
        staleness_study=staleness,
        budget_violations=violations,
        lookahead=window,
        median_note="samples_per_s = batch samples / median step time after warm-up",
        reference_hit_ratios={} if reference_hit_ratios is None else reference_hit_ratios,
        workloads=per_workload,
    )


STORE_BENCH: Bench[StoreBenchConfig, StoreSummary] = BenchSpec(
    name="store", summary_type=StoreSummary, preset=StoreBenchConfig.preset, run=run_store_bench
)
"""The store bench, as `frugal reproduce` runs it."""
