"""`frugal recsys bench`: sync, hybrid and async side by side on the same data and seeds.

Each rtt_ms is one torchrun job of `nproc` trainers that runs every (dataset, seed, mode,
staleness K) cell in turn on the same process group, with the same model, optimizers, seeds
and thread count; sync runs once per seed (K does not apply to it). Throughput
(`samples_per_s`) is batch_size x world_size / the median step time after the warm-up steps,
median over ranks (`samples_per_s_mean`: steps / elapsed time, sensitive to load spikes).
AUC and log loss are on the test split after one pass.

Summary (per dataset, at the largest rtt_ms and the K nearest 4 of each mode, averaged over
seeds):
`auc_gap_hybrid_vs_sync`, `auc_gap_async_vs_sync`, `throughput_hybrid_over_sync`,
`throughput_async_over_sync`; plus the worst |AUC(hybrid, K <= 16) - AUC(sync)|, the
AUC(hybrid) - AUC(async) gap at K >= 16, and whether every measured staleness stayed within
its bound.

References:
    Persia: An Open, Hybrid System Scaling Deep Learning-based Recommenders up to 100
    Trillion Parameters, KDD 2022, arXiv 2111.05897 (section 5: evaluation).
"""

from __future__ import annotations

import functools
import math
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from frugal.bench.harness import (
    Bench,
    BenchConfig,
    BenchResult,
    BenchSpec,
    Progress,
    Summary,
    write_bench_results,
)
from frugal.config import ConfigError, check_types
from frugal.recsys.batch import RecsysData
from frugal.recsys.config import Mode, RecsysTrainConfig
from frugal.recsys.datasets import (
    RECSYS_TEACHERS,
    DatasetName,
    RecsysDataConfig,
    load_recsys_data,
    teacher_auc,
)
from frugal.recsys.launch import check_run, launch_runs
from frugal.recsys.models import ModelName

__all__ = [
    "RECSYS_BENCH",
    "RecsysBenchConfig",
    "RecsysDatasetSummary",
    "RecsysOutOfCoreSummary",
    "RecsysSummary",
    "run_recsys_bench",
]

_ROW_KEYS = (
    "mode", "dataset", "staleness", "rtt_ms", "seed", "test_auc", "logloss", "samples_per_s",
    "samples_per_s_mean",
    "max_staleness_seen", "mean_staleness", "staleness_p99", "staleness_bound",
    "lookup_wait_ms", "allreduce_ms", "permit_wait_ms", "compute_ms", "push_enqueue_ms",
    "push_wait_ms", "step_ms", "cpu_ms_per_step", "train_loss_first", "train_loss_last",
    "steps", "world_size", "alpha_max", "staleness_hist",
    "ps_hit_ratio", "ps_bytes_read_per_step", "ps_stall_s",
    "rejected_updates", "expired_rows", "evicted_rows", "live_rows",
)  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class RecsysBenchConfig(BenchConfig):
    """What `frugal recsys bench` runs; `quick()` is the small preset."""

    datasets: tuple[DatasetName, ...] = ("movielens100k", "criteo_zipf")
    """Datasets, each run with every mode."""
    modes: tuple[Mode, ...] = ("sync", "hybrid", "async")
    """Training modes compared."""
    staleness: tuple[int, ...] = (1, 4, 16, 64)
    """K values of hybrid and async, each >= 1."""
    async_staleness: tuple[int, ...] | None = None
    """K values of async if they differ from `staleness` (None: the same), each >= 1."""
    rtt_ms: tuple[float, ...] = (0.0, 2.0, 5.0)
    """Simulated PS round trips, each >= 0."""
    prefetch_depth: int | None = 1
    """hybrid: lookups started ahead of the step computed (None = K, Persia's run-ahead)."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """Seeds (model, rows, shuffling, Zipf stream), each >= 0."""
    nproc: int = 2
    """Trainer processes, in [1, 64]."""
    model: ModelName = "dlrm"
    """Dense model."""
    batch_size: int = 128
    """Samples per trainer per step, >= 1."""
    embedding_dim: int = 8
    """Embedding width, >= 1."""
    epochs: int = 1
    """Passes over the training split, >= 1."""
    max_steps: int | None = None
    """Cap on steps per run (None = full epochs), >= 1."""
    warmup_steps: int = 10
    """Steps excluded from throughput and timing medians, >= 0."""
    data: RecsysDataConfig = field(default_factory=RecsysDataConfig)
    """The data of every run: criteo_zipf's samples, ids per feature, features and Zipf
    exponent, the test split. Its `dataset` and `seed` come from `datasets` and `seeds`, so
    leave them unset."""
    out_of_core_ratios: tuple[float, ...] = ()
    """PS memory budgets (`ps_memory_ratio`: fractions of each shard's row bytes, in
    (0, 1]) of the out-of-core cells: hybrid at the summary's K and the largest rtt on each
    dataset and seed, once with every row cached on the file backend (the reference) and
    once per ratio, with `out_of_core_lookahead` hints. () runs none."""
    out_of_core_lookahead: int = 4
    """`ps_lookahead` of the out-of-core cells, >= 0."""
    out_of_core_embedding_dim: int | None = None
    """Embedding width of the out-of-core cells (None: `embedding_dim`). A hashed shard pays
    20-28 B of RAM per row for its key map and record addresses, so small rows leave a
    small budget no cache: give rows several times wider than that."""
    bounded_id_ratios: tuple[float, ...] = ()
    """Distinct ids of the training split per row the PS shards hold, each > 1 (10: the
    shards hold a tenth of the ids the stream brings), of the bounded-table cells: hybrid at
    the summary's K and the largest rtt on each dataset and seed, with LRU eviction
    (`ps_when_full="evict_lru"`), `bounded_admit_after` and `bounded_expire_after_steps`,
    against the grid's unbounded hybrid run. () runs none."""
    bounded_admit_after: int = 2
    """`ps_admit_after` of the bounded-table cells, >= 1."""
    bounded_expire_after_steps: int | None = None
    """`ps_expire_after_steps` of the bounded-table cells, >= 1 or None."""
    timeout_s: float = 120.0
    """Per-call timeout inside a run (RPC, collective, permit), > 0."""
    job_timeout_s: float = 7200.0
    """Wall-clock limit of one torchrun job (every dataset at one rtt), > 0."""

    def __post_init__(self) -> None:
        check_types(self)
        if not self.datasets or not self.modes or not self.seeds or not self.rtt_ms:
            raise ValueError("datasets, modes, seeds and rtt_ms must each be non-empty")
        if "sync" not in self.modes:
            raise ValueError(f"modes={self.modes} must include 'sync' (the baseline of the ratios)")
        if any(k < 1 for k in self.staleness) or not self.staleness:
            raise ValueError(f"staleness={self.staleness} must be non-empty values >= 1")
        if self.async_staleness is not None and (
            not self.async_staleness or min(self.async_staleness) < 1
        ):
            raise ValueError(
                f"async_staleness={self.async_staleness} must be non-empty values >= 1 or None"
            )
        if any(r < 0 for r in self.rtt_ms):
            raise ValueError(f"rtt_ms={self.rtt_ms} must be >= 0")
        if self.job_timeout_s <= 0 or self.timeout_s <= 0:
            raise ValueError("timeout_s and job_timeout_s must be > 0")
        unset = RecsysDataConfig()
        if (self.data.dataset, self.data.seed) != (unset.dataset, unset.seed):
            raise ValueError(
                f"data.dataset={self.data.dataset!r} and data.seed={self.data.seed} are set per "
                "run from datasets and seeds; leave them unset and list the runs' datasets and "
                "seeds there (e.g. --set 'datasets=[\"criteo_zipf\"]' --set 'seeds=[0, 1]')"
            )
        dim = self.out_of_core_embedding_dim
        if dim is not None and dim < 1:
            raise ValueError(
                f"out_of_core_embedding_dim={dim} must be >= 1 (or unset: embedding_dim)"
            )
        if any(ratio <= 1 for ratio in self.bounded_id_ratios):
            raise ValueError(
                f"bounded_id_ratios={self.bounded_id_ratios} must each be > 1 (distinct ids per "
                "row of PS capacity; 10 holds a tenth of them)"
            )
        # the train Config validates the remaining fields, and each dataset's id
        for dataset in self.datasets:
            self.train_config("sync", dataset, 1, self.rtt_ms[0], self.seeds[0])
            for ratio in self.out_of_core_ratios:
                self.out_of_core_config(dataset, ratio, self.seeds[0], 1)
            if self.bounded_id_ratios:
                self.bounded_config(dataset, self.bounded_id_ratios[0], self.seeds[0], 1)

    QUICK: ClassVar = {
        "staleness": (4, 16),
        "async_staleness": (16,),
        "rtt_ms": (5.0,),
        "seeds": (0,),
        "data": {"zipf_num_samples": 200_000, "zipf_num_embeddings": 20_000},
    }
    """`--quick`: both datasets, one seed, rtt 5 ms, hybrid K in {4, 16}, async K 16.

    8 runs in 2 torchrun jobs. Zipf: 200k samples (625 steps of 2 x 128: far fewer and the
    AUC is still climbing fast, where any staleness costs several 0.001 of AUC; a 40k-sample
    test split), 8 x 20k ids."""
    PRESETS: ClassVar = {
        "smoke": {
            "datasets": ("movielens100k",),
            "staleness": (4,),
            "max_steps": 24,
            "warmup_steps": 4,
        }
    }
    """`quick` is `quick()`; `smoke`: that on MovieLens-100k only, hybrid K 4, 24 steps (4 of
    warm-up)."""

    def train_config(
        self, mode: Mode, dataset: DatasetName, staleness: int, rtt_ms: float, seed: int
    ) -> RecsysTrainConfig:
        """The training run of one cell."""
        return RecsysTrainConfig(
            data=replace(self.data, dataset=dataset, seed=seed),
            mode=mode,
            staleness=staleness,
            prefetch_depth=self.prefetch_depth,
            nproc=self.nproc,
            rtt_ms=rtt_ms,
            model=self.model,
            batch_size=self.batch_size,
            embedding_dim=self.embedding_dim,
            epochs=self.epochs,
            max_steps=self.max_steps,
            warmup_steps=self.warmup_steps,
            timeout_s=self.timeout_s,
            seed=seed,
        )

    def out_of_core_config(
        self, dataset: DatasetName, ratio: float | None, seed: int, distinct_ids: int
    ) -> RecsysTrainConfig:
        """An out-of-core cell: hybrid on the file backend, `ratio` None for the reference.

        Each shard holds the rows the stream brings (`distinct_ids`, split over the shards,
        25 % + 1024 rows of slack for the hashed split), not the tables' declared sizes, so
        `ratio` is memory over the rows the shard really holds (a Criteo-sized declaration
        with a short stream would otherwise leave every touched row in the cache).
        """
        base = self.train_config("hybrid", dataset, _out_of_core_k(self), max(self.rtt_ms), seed)
        capacity = math.ceil(distinct_ids * 1.25 / self.nproc) + 1024
        return replace(
            base,
            ps_capacity_rows=capacity,
            store_backend="file",
            ps_memory_ratio=ratio,
            ps_lookahead=self.out_of_core_lookahead,
            embedding_dim=self.out_of_core_embedding_dim or self.embedding_dim,
        )

    def distinct_ids(self, dataset: DatasetName, seed: int) -> int:
        """Distinct (table, id) pairs of the training split a run of `dataset`, `seed` reads."""
        return distinct_train_ids(self.train_config("sync", dataset, 1, 0.0, seed).data)

    def bounded_config(
        self, dataset: DatasetName, ratio: float, seed: int, distinct_ids: int
    ) -> RecsysTrainConfig:
        """A bounded-table cell: each shard holds distinct_ids / (ratio x nproc) rows."""
        base = self.train_config("hybrid", dataset, _out_of_core_k(self), max(self.rtt_ms), seed)
        return replace(
            base,
            ps_capacity_rows=max(1, math.ceil(distinct_ids / (ratio * self.nproc))),
            ps_when_full="evict_lru",
            ps_admit_after=self.bounded_admit_after,
            ps_expire_after_steps=self.bounded_expire_after_steps,
        )


@functools.lru_cache(maxsize=4)
def distinct_train_ids(data: RecsysDataConfig) -> int:
    """Distinct (table, id) pairs in the training split of `data`."""
    train, _ = load_recsys_data(data)
    if isinstance(train, RecsysData):
        return sum(len(np.unique(values)) for values in train.values)
    distinct = getattr(train, "distinct_ids", None)
    if distinct is None:
        raise ValueError(
            f"{data.dataset}: its training split has no distinct_ids(); the bounded-table "
            "cells need it to size the shards"
        )
    return int(distinct())


def _out_of_core_k(config: RecsysBenchConfig) -> int:
    """Hybrid's K in the summary (and the out-of-core cells): the K nearest 4."""
    return min(config.staleness, key=lambda v: (abs(v - 4), v))


def _cells(
    config: RecsysBenchConfig, dataset: DatasetName, rtt_ms: float
) -> list[tuple[Mode, int]]:
    cells: list[tuple[Mode, int]] = []
    for mode in config.modes:
        if mode == "sync":
            cells.insert(0, ("sync", 1))
        else:
            ks = config.staleness
            if mode == "async" and config.async_staleness is not None:
                ks = config.async_staleness
            cells += [(mode, k) for k in ks]
    return cells


def _launch_feasible(
    runs: list[tuple[RecsysTrainConfig, Path]], job_dir: Path, timeout_s: float
) -> list[dict[str, Any] | ConfigError]:
    """Run the runs that pass `check_run` in one torchrun job; an infeasible run gets its error.

    A setting the trainers would fail on (a PS budget below the store's minimum, a shard
    smaller than one batch's ids) is found before launch, so one such cell does not fail the
    job of the others.

    Returns:
        Per run, in order: its `result.json` content, or the `ConfigError` that refused it.
    """
    refused: dict[int, ConfigError] = {}
    for index, (run_config, _) in enumerate(runs):
        try:
            check_run(run_config)
        except ConfigError as exc:
            refused[index] = exc
    feasible = [run for index, run in enumerate(runs) if index not in refused]
    results = iter(launch_runs(feasible, job_dir, timeout_s=timeout_s) if feasible else [])
    return [refused[index] if index in refused else next(results) for index in range(len(runs))]


def _infeasible_row(config: RecsysTrainConfig, error: ConfigError, cell: str) -> dict[str, Any]:
    """The row of a run refused before launch: its cell, `status` "infeasible" and why."""
    row: dict[str, Any] = dict.fromkeys(_ROW_KEYS)
    row |= {
        "mode": config.mode,
        "dataset": config.data.dataset,
        "staleness": None if config.mode == "sync" else config.staleness,
        "rtt_ms": config.rtt_ms,
        "seed": config.seed,
        "world_size": config.nproc,
        "cell": cell,
        "ps_memory_ratio": config.ps_memory_ratio,
        "ps_capacity_rows": config.ps_capacity_rows,
        "status": "infeasible",
        "error": str(error),
    }
    return row


def _rows_of(
    runs: list[tuple[RecsysTrainConfig, Path]],
    outcomes: list[dict[str, Any] | ConfigError],
    cell: str = "grid",
) -> list[dict[str, Any]]:
    """One row per run: measured (`status` "ok") or refused ("infeasible")."""
    return [
        _infeasible_row(run_config, outcome, cell)
        if isinstance(outcome, ConfigError)
        else _row(outcome, cell)
        for (run_config, _), outcome in zip(runs, outcomes, strict=True)
    ]


def _done(what: str, rows: list[dict[str, Any]]) -> str:
    """A progress line: runs done, and the infeasible ones."""
    refused = sum(r["status"] == "infeasible" for r in rows)
    return f"{what}: {len(rows) - refused} runs done" + (
        f", {refused} infeasible (refused before launch; see their rows' error)" if refused else ""
    )


def _row(result: dict[str, Any], cell: str = "grid") -> dict[str, Any]:
    row = {key: result.get(key) for key in _ROW_KEYS}
    row["cell"] = cell
    row["status"] = "ok"
    row["ps_memory_ratio"] = result["config"].get("ps_memory_ratio")
    row["ps_capacity_rows"] = result["config"].get("ps_capacity_rows")
    row["logloss"] = result["test_logloss"]
    if row["mode"] == "sync":
        row["staleness"] = None  # K does not apply: every read sees every earlier step
    if "dense_max_staleness_seen" in result:
        row["dense_max_staleness_seen"] = result["dense_max_staleness_seen"]
    return row


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return float(np.mean(values)) if values else None


@dataclass(frozen=True, kw_only=True, slots=True)
class RecsysDatasetSummary(Summary):
    """One dataset at the largest rtt (hybrid and async at the staleness K nearest 4).

    Gaps are test AUC differences; None where a side did not run.
    """

    auc_gap_hybrid_vs_sync: float | None
    throughput_hybrid_over_sync: float | None
    """Hybrid samples/s over sync's (means over the seeds)."""
    auc_gap_async_vs_sync: float | None
    throughput_async_over_sync: float | None
    max_abs_auc_gap_hybrid_k_le_16: float | None
    """The worst |AUC(hybrid) - AUC(sync)| over every (rtt, seed, K <= 16)."""
    max_abs_auc_gap_hybrid_k_le_16_seed_mean: float | None
    """The same over (rtt, K <= 16) cells with each side averaged over the seeds first."""
    mean_auc_gap_hybrid_minus_async_k_ge_16: float | None
    """Mean AUC(hybrid) - AUC(async) over the (rtt, seed, K >= 16) cells both ran."""
    sync_test_auc: float | None
    teacher_test_auc: float | None
    """The planted teacher's AUC (the ceiling) on criteo_zipf; None on real data."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RecsysOutOfCoreSummary(Summary):
    """One dataset's out-of-core cells against the reference with every row cached.

    Keys are the PS memory ratios (as text); values are means over the seeds, None where a
    side did not run.
    """

    throughput_over_in_ram: dict[str, float | None]
    """samples/s at the ratio over the reference's."""
    auc_gap_vs_in_ram: dict[str, float | None]
    """Test AUC at the ratio minus the reference's."""
    ps_hit_ratio: dict[str, float | None]
    """The shards' cache hit ratio (lookups served from RAM)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RecsysBoundedSummary(Summary):
    """One dataset's bounded-table cells against the grid's unbounded hybrid run.

    Keys are the id ratios (as text); values are means over the seeds, None where a side did
    not run.
    """

    distinct_ids: int
    """Distinct (table, id) pairs of the training split (the first seed's)."""
    capacity_rows: dict[str, int]
    """Rows of each PS shard."""
    completed: dict[str, bool | None]
    """Every seed's run trained all its steps (no full shard stopped it); None where no run
    of the ratio was measured (refused before launch as infeasible)."""
    auc_cost_vs_unbounded: dict[str, float | None]
    """Test AUC of the unbounded run minus the bounded one's (> 0: the bound costs AUC)."""
    throughput_over_unbounded: dict[str, float | None]
    """samples/s of the bounded run over the unbounded one's."""
    evicted_rows: dict[str, float | None]
    expired_rows: dict[str, float | None]
    rejected_updates: dict[str, float | None]
    """Updates dropped by admission (ids not pushed `bounded_admit_after` times yet)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RecsysSummary(Summary):
    """The `"summary"` of `frugal recsys bench`'s `results.json`."""

    rtt_ms: float
    """The rtt the per-dataset ratios are taken at (the largest of the grid)."""
    staleness: int
    """Hybrid's K in the per-dataset ratios."""
    async_staleness: int
    """Async's K in the per-dataset ratios."""
    datasets: dict[str, RecsysDatasetSummary]
    staleness_within_bound: bool
    """Every run's measured staleness stayed within its bound."""
    max_staleness_seen: int
    out_of_core: dict[str, RecsysOutOfCoreSummary] = field(default_factory=dict)
    """Per dataset, the out-of-core cells (empty when `out_of_core_ratios` is ())."""
    bounded: dict[str, RecsysBoundedSummary] = field(default_factory=dict)
    """Per dataset, the bounded-table cells (empty when `bounded_id_ratios` is ())."""


def _summary(
    config: RecsysBenchConfig,
    rows: list[dict[str, Any]],
    teacher_test_auc: dict[str, float | None] | None = None,
) -> RecsysSummary:
    rtt = max(config.rtt_ms)
    k = _out_of_core_k(config)
    k_async = min(config.async_staleness or config.staleness, key=lambda v: (abs(v - 4), v))
    rows = [r for r in rows if r.get("status", "ok") == "ok"]  # infeasible: not measured
    every_row, rows = rows, [r for r in rows if r.get("cell", "grid") == "grid"]
    datasets: dict[str, RecsysDatasetSummary] = {}
    for dataset in config.datasets:
        at = [r for r in rows if r["dataset"] == dataset and r["rtt_ms"] == rtt]
        sync = [r for r in at if r["mode"] == "sync"]
        entry: dict[str, Any] = {}
        sync_auc, sync_tput = _mean(sync, "test_auc"), _mean(sync, "samples_per_s")
        for mode, mode_k in (("hybrid", k), ("async", k_async)):
            runs = [r for r in at if r["mode"] == mode and r["staleness"] == mode_k]
            auc, tput = _mean(runs, "test_auc"), _mean(runs, "samples_per_s")
            entry[f"auc_gap_{mode}_vs_sync"] = (
                auc - sync_auc if auc is not None and sync_auc is not None else None
            )
            entry[f"throughput_{mode}_over_sync"] = (
                tput / sync_tput if tput is not None and sync_tput else None
            )
        all_sync = {
            (r["rtt_ms"], r["seed"]): r["test_auc"]
            for r in rows
            if r["dataset"] == dataset and r["mode"] == "sync"
        }
        gaps = [
            abs(r["test_auc"] - all_sync[(r["rtt_ms"], r["seed"])])
            for r in rows
            if r["dataset"] == dataset
            and r["mode"] == "hybrid"
            and r["staleness"] <= 16
            and (r["rtt_ms"], r["seed"]) in all_sync
        ]
        entry["max_abs_auc_gap_hybrid_k_le_16"] = max(gaps) if gaps else None
        # The same over (rtt, K) cells with each side averaged over the seeds first.
        cells = {
            (r["rtt_ms"], r["staleness"])
            for r in rows
            if r["dataset"] == dataset and r["mode"] == "hybrid" and r["staleness"] <= 16
        }
        cell_gaps = []
        for cell_rtt, cell_k in cells:
            hybrid = [
                r
                for r in rows
                if r["dataset"] == dataset
                and r["mode"] == "hybrid"
                and (r["rtt_ms"], r["staleness"]) == (cell_rtt, cell_k)
            ]
            base = [
                r
                for r in rows
                if r["dataset"] == dataset and r["mode"] == "sync" and r["rtt_ms"] == cell_rtt
            ]
            h, b = _mean(hybrid, "test_auc"), _mean(base, "test_auc")
            if h is not None and b is not None:
                cell_gaps.append(abs(h - b))
        entry["max_abs_auc_gap_hybrid_k_le_16_seed_mean"] = max(cell_gaps) if cell_gaps else None
        hybrid_auc = {
            (r["rtt_ms"], r["seed"], r["staleness"]): r["test_auc"]
            for r in rows
            if r["dataset"] == dataset and r["mode"] == "hybrid"
        }
        async_gaps = [
            hybrid_auc[(r["rtt_ms"], r["seed"], r["staleness"])] - r["test_auc"]
            for r in rows
            if r["dataset"] == dataset
            and r["mode"] == "async"
            and r["staleness"] >= 16
            and (r["rtt_ms"], r["seed"], r["staleness"]) in hybrid_auc
        ]
        entry["mean_auc_gap_hybrid_minus_async_k_ge_16"] = (
            float(np.mean(async_gaps)) if async_gaps else None
        )
        entry["sync_test_auc"] = sync_auc
        entry["teacher_test_auc"] = (teacher_test_auc or {}).get(dataset)
        datasets[dataset] = RecsysDatasetSummary(**entry)
    return RecsysSummary(
        rtt_ms=rtt,
        staleness=k,
        async_staleness=k_async,
        datasets=datasets,
        staleness_within_bound=all(
            r["max_staleness_seen"] <= r["staleness_bound"] for r in every_row
        ),
        max_staleness_seen=max((r["max_staleness_seen"] for r in every_row), default=0),
        bounded={
            dataset: _bounded_summary(
                config, dataset, [r for r in every_row if r["dataset"] == dataset]
            )
            for dataset in config.datasets
            if config.bounded_id_ratios
        },
        out_of_core={
            dataset: _out_of_core_summary(config, [r for r in every_row if r["dataset"] == dataset])
            for dataset in config.datasets
            if config.out_of_core_ratios
        },
    )


def _bounded_summary(
    config: RecsysBenchConfig, dataset: DatasetName, rows: list[dict[str, Any]]
) -> RecsysBoundedSummary:
    k, rtt = _out_of_core_k(config), max(config.rtt_ms)
    reference = [
        r
        for r in rows
        if r.get("cell", "grid") == "grid"
        and (r["mode"], r["staleness"], r["rtt_ms"]) == ("hybrid", k, rtt)
    ]
    ref_tput, ref_auc = _mean(reference, "samples_per_s"), _mean(reference, "test_auc")
    cells = [r for r in rows if r.get("cell") == "bounded"]
    seed = config.seeds[0]  # the first seed's stream sizes the reported capacity
    distinct = config.distinct_ids(dataset, seed)
    fields: dict[str, dict[str, Any]] = {
        name: {}
        for name in (
            "capacity_rows", "completed", "auc_cost_vs_unbounded", "throughput_over_unbounded",
            "evicted_rows", "expired_rows", "rejected_updates",
        )
    }  # fmt: skip
    for ratio in config.bounded_id_ratios:
        key = f"{ratio:g}"
        at = [r for r in cells if r["id_ratio"] == ratio]
        t, a = _mean(at, "samples_per_s"), _mean(at, "test_auc")
        fields["capacity_rows"][key] = config.bounded_config(
            dataset, ratio, seed, distinct
        ).ps_capacity_rows
        steps = {r["seed"]: r["steps"] for r in reference}
        fields["completed"][key] = (
            all(r["steps"] == steps.get(r["seed"]) for r in at) if at else None
        )
        fields["auc_cost_vs_unbounded"][key] = (
            ref_auc - a if a is not None and ref_auc is not None else None
        )
        fields["throughput_over_unbounded"][key] = (
            t / ref_tput if t is not None and ref_tput else None
        )
        for name in ("evicted_rows", "expired_rows", "rejected_updates"):
            fields[name][key] = _mean(at, name)
    return RecsysBoundedSummary(distinct_ids=distinct, **fields)


def _out_of_core_summary(
    config: RecsysBenchConfig, rows: list[dict[str, Any]]
) -> RecsysOutOfCoreSummary:
    cells = [r for r in rows if r.get("cell") == "out_of_core"]
    reference = [r for r in cells if r["ps_memory_ratio"] is None]
    ref_tput, ref_auc = _mean(reference, "samples_per_s"), _mean(reference, "test_auc")
    tput: dict[str, float | None] = {}
    gap: dict[str, float | None] = {}
    hits: dict[str, float | None] = {}
    for ratio in config.out_of_core_ratios:
        at = [r for r in cells if r["ps_memory_ratio"] == ratio]
        t, a = _mean(at, "samples_per_s"), _mean(at, "test_auc")
        tput[f"{ratio:g}"] = t / ref_tput if t is not None and ref_tput else None
        gap[f"{ratio:g}"] = a - ref_auc if a is not None and ref_auc is not None else None
        hits[f"{ratio:g}"] = _mean(at, "ps_hit_ratio")
    return RecsysOutOfCoreSummary(
        throughput_over_in_ram=tput, auc_gap_vs_in_ram=gap, ps_hit_ratio=hits
    )


def run_recsys_bench(
    config: RecsysBenchConfig,
    out_dir: Path,
    *,
    progress: Progress | None = None,
) -> BenchResult[RecsysSummary]:
    """Run every cell of `config` side by side; write `results.json` and return the result.

    A cell whose settings the trainers would fail on (`frugal.recsys.launch.check_run`: e.g.
    an out-of-core ratio whose budget is below the store's minimum) is not launched: its row
    has `status` "infeasible" and the `error`, the other cells run, and the summary counts
    it as not measured. Measured rows have `status` "ok".

    Args:
        config: The grid and sizes.
        out_dir: Folder for `results.json` (created); run folders go under `out_dir/runs`.
        progress: Called with one line per finished job.

    Returns:
        The typed summary, the rows and the results document (ARCHITECTURE.md format).

    Raises:
        RecsysError: If a torchrun job fails or times out.
        OSError: If the output folder cannot be written.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    runs_dir = out_dir / "runs"
    rows: list[dict[str, Any]] = []
    for rtt in config.rtt_ms:  # one torchrun job per rtt: both datasets share its start-up
        runs = [
            (
                config.train_config(mode, dataset, k, rtt, seed),
                runs_dir / f"{dataset}-rtt{rtt:g}-seed{seed}-{mode}-k{k}",
            )
            for dataset in config.datasets
            for seed in config.seeds
            for mode, k in _cells(config, dataset, rtt)
        ]
        job_dir = runs_dir / f"rtt{rtt:g}"
        done = _rows_of(runs, _launch_feasible(runs, job_dir, config.job_timeout_s))
        rows += done
        if progress is not None:
            progress(_done(f"rtt {rtt:g} ms", done))
    if config.out_of_core_ratios:
        runs = [
            (
                config.out_of_core_config(dataset, ratio, seed, config.distinct_ids(dataset, seed)),
                runs_dir / f"{dataset}-seed{seed}-ooc-{'ram' if ratio is None else f'{ratio:g}'}",
            )
            for dataset in config.datasets
            for seed in config.seeds
            for ratio in (None, *config.out_of_core_ratios)
        ]
        outcomes = _launch_feasible(runs, runs_dir / "out_of_core", config.job_timeout_s)
        done = _rows_of(runs, outcomes, "out_of_core")
        rows += done
        if progress is not None:
            progress(_done("out of core", done))
    if config.bounded_id_ratios:
        cells = [
            (dataset, seed, ratio)
            for dataset in config.datasets
            for seed in config.seeds
            for ratio in config.bounded_id_ratios
        ]
        runs = [
            (
                config.bounded_config(dataset, ratio, seed, config.distinct_ids(dataset, seed)),
                runs_dir / f"{dataset}-seed{seed}-bounded-{ratio:g}",
            )
            for dataset, seed, ratio in cells
        ]
        outcomes = _launch_feasible(runs, runs_dir / "bounded", config.job_timeout_s)
        done = [
            row | {"id_ratio": ratio}
            for (_, _, ratio), row in zip(cells, _rows_of(runs, outcomes, "bounded"), strict=True)
        ]
        rows += done
        if progress is not None:
            progress(_done("bounded tables", done))
    teacher: dict[str, float | None] = {
        dataset: teacher_auc(config.train_config("sync", dataset, 1, 0.0, config.seeds[0]).data)
        for dataset in config.datasets
        if dataset in RECSYS_TEACHERS
    }
    summary = _summary(config, rows, teacher)
    result = write_bench_results("recsys", config, rows, summary, out_dir / "results.json")
    shutil.rmtree(runs_dir / "ps", ignore_errors=True)
    return result


RECSYS_BENCH: Bench[RecsysBenchConfig, RecsysSummary] = BenchSpec(
    name="recsys", summary_type=RecsysSummary, preset=RecsysBenchConfig.preset, run=run_recsys_bench
)
"""The recsys bench, as `frugal reproduce` runs it."""
