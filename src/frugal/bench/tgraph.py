"""`frugal tgraph bench`: every model under one protocol, side by side, in one run.

For each dataset the `Protocol` (split, masked nodes, negatives) is built once in the parent
and its negatives written to `OUT/negatives/`; every (model, seed) run then executes in its own
child process (so `peak_rss_mib` is per run), reloads those negatives, verifies their SHA-256
and writes one row per (view, negative strategy) of the test split. Rows carry the
`protocol_hash`. Optionally PyG's reference TGN loop runs on the same data with the same
widths and batch size, and its training events/s are recorded next to ours.

References:
    BenchTemp: A General Benchmark for Evaluating Temporal Graph Neural Networks, ICDE 2024,
    arXiv 2308.16385.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Literal, cast

import numpy as np

from frugal import FrugalError
from frugal._libc import keep_freed_memory
from frugal.bench.harness import (
    Bench,
    BenchConfig,
    BenchResult,
    BenchSpec,
    Progress,
    Summary,
    run_cell,
    write_bench_results,
)
from frugal.config import ConfigError, check_types, config_to_dict
from frugal.data import DATASETS, TemporalEvents, get_dataset_info, load_events
from frugal.data.event_files import is_event_file, read_event_file
from frugal.results import BenchJournal, write_text_atomically
from frugal.tgraph.models import (
    MODELS,
    check_model_builds,
    default_model_names,
    heuristic_names,
    model_source_sha256,
)
from frugal.tgraph.protocol import Protocol, ProtocolConfig, build_protocol, protocol_preset
from frugal.tgraph.reference import WARMUP_BATCHES, compare_with_pyg_tgn

__all__ = [
    "TGRAPH_BENCH",
    "TgraphBenchConfig",
    "TgraphDatasetSummary",
    "TgraphModelSummary",
    "TgraphReferenceSummary",
    "TgraphSummary",
    "run_tgraph_bench",
]


MAX_SEED = 2**32 - 1
"""The largest run seed (it seeds torch and numpy; a bigger one overflows them)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TgraphBenchConfig(BenchConfig):
    """What `frugal tgraph bench` runs; `quick()` is the small preset."""

    datasets: tuple[str, ...] = ("collegemsg",)
    """Dataset ids (temporal datasets of `frugal data list`), or paths of your own events
    files: a value with a path separator or ending in `.csv` is a path
    (`frugal.data.event_files`: an `ml_NAME.csv` with its `.npy` files, or a CSV with the
    header `src,dst,t[,label][,feature columns...]`). A file's results are named
    `FILENAME@SHA16` (its SHA-256), so a changed file never reuses earlier runs."""
    models: tuple[str, ...] = field(default_factory=default_model_names)
    """Registered models compared (`frugal.tgraph.models.MODELS`; default every one registered
    with `in_default`: all but cawn, dygformer and neurtw, whose runs take hours on a CPU);
    heuristic floors are always added."""
    task: Literal["lp", "nc"] = "lp"
    """'lp' link prediction, 'nc' link prediction then node classification on frozen
    embeddings (datasets with node labels, TGNNs only)."""
    protocol: ProtocolConfig = field(default_factory=ProtocolConfig)
    """The protocol every model runs under."""
    num_seeds: int = 3
    """Seeds first_seed .. first_seed+num_seeds-1, paired across models (heuristics run once,
    as seed 0)."""
    first_seed: int = 0
    """The first seed; e.g. `first_seed=2, num_seeds=1` runs seed 2 alone, so the seeds of a
    long model can run as separate benches (one core each) into the same `--out`."""
    num_threads: int = 2
    """torch threads per run."""
    use_subprocess: bool = True
    """Run each (model, seed) in its own process (per-run peak RSS)."""
    run_timeout_s: float = 3600.0
    """Wall-clock limit of one run."""
    compare_pyg_reference: bool = True
    """Also time PyG's reference TGN training loop (first dataset, same dims and batch)."""
    pyg_reference_batches: int = 150
    """Training batches timed for the PyG reference loop and for ours (150 = one CollegeMsg
    epoch; early batches have few neighbours, so a short window flatters neither loop)."""

    def __post_init__(self) -> None:
        check_types(self)
        if not self.datasets or not self.models:
            raise ValueError("datasets and models must each list at least one name")
        temporal = [d.name for d in DATASETS if d.kind == "temporal_graph"]
        bad = [d for d in self.datasets if d not in temporal and not is_event_file(d)]
        if bad:
            raise ValueError(
                f"dataset {', '.join(map(repr, bad))} is not a temporal event stream; choose "
                f"from {', '.join(temporal)} (see `frugal data list`), or give the path of "
                "your own events .csv"
            )
        for k, model in enumerate(self.models):
            try:
                MODELS.get(model)
            except ValueError as exc:
                raise ValueError(f"models[{k}] = {model!r} is not allowed: {exc}") from None
        for name in ("num_seeds", "num_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.first_seed < 0:
            raise ValueError(f"first_seed={self.first_seed} must be >= 0")
        if self.first_seed + self.num_seeds > MAX_SEED + 1:
            raise ValueError(
                f"first_seed={self.first_seed} with num_seeds={self.num_seeds} reaches seed "
                f"{self.first_seed + self.num_seeds - 1}; seeds must be <= {MAX_SEED} (2**32 - 1)"
            )
        if self.run_timeout_s <= 0:
            raise ValueError(f"run_timeout_s={self.run_timeout_s} must be > 0 seconds")
        for name in ("datasets", "models"):
            values = getattr(self, name)
            if len(set(values)) != len(values):
                raise ValueError(f"{name}={values} lists a name twice; list each once")
        if self.pyg_reference_batches <= WARMUP_BATCHES:
            raise ValueError(
                f"pyg_reference_batches={self.pyg_reference_batches} must be > {WARMUP_BATCHES}: "
                f"the first {WARMUP_BATCHES} batches of each loop are warm-up and not timed"
            )

    QUICK: ClassVar = {
        "datasets": ("sp_hospital", "collegemsg"),
        "models": ("edgebank", "edgebank_window", "recency", "popularity", "jodie", "tgn"),
        "protocol": {"max_epochs": 2, "learning_rate": 1e-3},
        "num_seeds": 1,
        "num_threads": 1,
        "pyg_reference_batches": 100,
    }
    """`--quick`: sp_hospital + collegemsg; heuristics, JODIE, TGN; 1 seed, 2 epochs.

    Learning rate 1e-3 (the protocol default 1e-4 needs far more than 2 epochs), one torch
    thread per run (the runs are sequential; on a shared 2-core machine a second thread
    mostly spins), PyG's reference loop timed over 100 CollegeMsg batches; about 1.5 minutes
    on 2 busy cores."""
    PRESETS: ClassVar = {
        "smoke": {
            "datasets": ("sp_hospital",),
            "models": ("edgebank", "recency", "tgn"),
            "protocol": {"max_epochs": 1},
            "pyg_reference_batches": 10,
        }
    }
    """`quick` is `quick()`; `smoke`: that on sp_hospital with edgebank, recency and TGN, one
    epoch, the PyG reference over 10 batches."""


NC_FLOOR_MODEL = "popularity"
"""The heuristic whose rows carry the node-classification floor (`nc_auc` of the same
classifier on per-node activity features, `frugal.tgraph.train.degree_features`)."""


@dataclass(frozen=True, slots=True)
class _RunSettings:
    """What one (dataset, model, seed) run's result depends on beyond its cell name.

    The bench journal is keyed on these, not on the whole config: a later invocation with
    more datasets, models or seeds (or another timeout) reuses every run already finished
    under the same protocol, task and threads.
    """

    task: str
    protocol: ProtocolConfig
    num_threads: int
    use_subprocess: bool


@dataclass(frozen=True, slots=True)
class _Source:
    """One entry of `TgraphBenchConfig.datasets`: a bundled id or a user's events file."""

    given: str
    """The value as configured (what `load_events` takes)."""
    name: str
    """The dataset in rows, cells and the negatives file: the id, or `EventFile.key`."""
    sha256: str | None = None
    """A file's digest (`EventFile.sha256`); None for a bundled dataset."""
    provenance: tuple[tuple[str, object], ...] = ()
    """A file's `EventFile.describe()` items, added to its protocol description."""

    @classmethod
    def of(cls, given: str) -> _Source:
        """Resolve `given`; a file is read, checked and hashed here, before any training.

        Raises:
            ConfigError: If a bundled id is not temporal, or the file breaks its layout.
        """
        if not is_event_file(given):
            info = get_dataset_info(given)
            if info.kind != "temporal_graph":
                raise ConfigError(
                    f"dataset {given!r} is {info.kind!r}, not a temporal event stream"
                )
            return cls(given, given)
        file = read_event_file(given)
        return cls(given, file.key, file.sha256, tuple(file.describe().items()))

    def load(self) -> TemporalEvents:
        """The events; a file must still have the digest it had when the bench began.

        Raises:
            FrugalError: If the file changed since (its rows would mix two datasets).
        """
        if self.sha256 is None:
            return load_events(self.given)
        file = read_event_file(self.given)
        if file.sha256 != self.sha256:
            raise FrugalError(
                f"{file.path} changed during the bench (SHA-256 {file.sha256[:16]}, was "
                f"{self.sha256[:16]}); leave the file alone until the bench ends, then rerun"
            )
        return file.events

    def row_fields(self) -> dict[str, object]:
        """What every row of this dataset carries: its name, and a file's path and digest."""
        fields: dict[str, object] = {"dataset": self.name}
        if self.sha256 is not None:
            provenance = dict(self.provenance)
            fields |= {k: provenance[k] for k in ("dataset_path", "dataset_sha256")}
        return fields


@dataclass(frozen=True, slots=True)
class _Run:
    source: _Source
    model: str
    seed: int
    config: TgraphBenchConfig
    cache_dir: str

    @property
    def dataset(self) -> str:
        return self.source.name


def _execute(run: _Run) -> dict[str, Any]:
    """One (dataset, model, seed) run: rows per (view, strategy) and efficiency."""
    from frugal.tgraph.train import (
        node_classification_floor,
        run_link_prediction,
        run_node_classification,
    )

    events = run.source.load()
    protocol = build_protocol(events, run.dataset, run.config.protocol, Path(run.cache_dir))
    result = run_link_prediction(run.model, protocol, run.seed, num_threads=run.config.num_threads)
    extra: dict[str, Any] = {}
    spec = MODELS.get(run.model)
    # A pair-scoring model (CAWN) has no node embedding to classify: its rows carry no nc_*.
    if run.config.task == "nc" and spec.kind != "heuristic" and spec.scoring == "node":
        from frugal.tgraph.models import HeuristicModel, TemporalGNN

        assert not isinstance(result.model, HeuristicModel)
        extra = run_node_classification(cast(TemporalGNN, result.model), protocol, run.seed)
    elif run.config.task == "nc" and run.model == NC_FLOOR_MODEL:
        extra = node_classification_floor(protocol, run.seed)
    return {
        "protocol_hash": protocol.protocol_hash,
        "rows": result.rows,
        "efficiency": result.efficiency,
        "nc": extra,
        "history": result.history,
    }


def _run_in_child(run: _Run, timeout_s: float) -> dict[str, Any]:
    """One run in a fresh process (`run_cell`).

    Raises:
        FrugalError: If the run raised, died or exceeded `timeout_s`.
    """
    outcome = run_cell(_execute, run, timeout_s=timeout_s, setup=keep_freed_memory)
    return outcome.unwrap(f"run {run.dataset}/{run.model}/seed {run.seed}")


def _rows_of(run: _Run, protocol: Protocol, payload: dict[str, Any]) -> list[dict[str, Any]]:
    if payload["protocol_hash"] != protocol.protocol_hash:
        raise FrugalError(
            f"run {run.model} saw protocol {payload['protocol_hash'][:12]} but the bench built "
            f"{protocol.protocol_hash[:12]}: the negatives changed between processes"
        )
    # The settings without the dataset (as the leaderboard derives them from a results.json):
    # journal rows carry it, so partial sweeps group into the same tables.
    settings = hashlib.sha256(
        json.dumps(config_to_dict(run.config.protocol), sort_keys=True).encode()
    ).hexdigest()
    rows = []
    for row in payload["rows"]:
        rows.append(
            {
                "system": run.model,
                **run.source.row_fields(),
                "protocol": protocol.config.name,
                "protocol_hash": protocol.protocol_hash,
                "protocol_settings": settings,
                "task": "lp",
                "seed": run.seed,
                "setting": row["view"],
                "negatives": row["negatives"],
                **{k: v for k, v in row.items() if k not in ("view", "negatives")},
                **payload["efficiency"],
                **(payload["nc"] or {}),  # nc_auc, nc_val_auc, nc_accuracy, nc_steps, ...
            }
        )
    return rows


def run_tgraph_bench(
    config: TgraphBenchConfig, out_dir: Path, *, progress: Progress | None = None
) -> BenchResult[TgraphSummary]:
    """Run the benchmark and write `out_dir/results.json` (and `results.jsonl`).

    Args:
        config: What to run.
        out_dir: Output folder (created).
        progress: Callback for one-line progress messages (the CLI draws bars from them).

    Returns:
        The typed summary (per dataset), the rows and the results document (ARCHITECTURE.md).

    Raises:
        ConfigError: If a dataset is not a temporal dataset, a file of yours breaks its
            layout's rules, or task 'nc' lacks labels (all before any training).
        FrugalError: If a run fails or exceeds its time limit, or a file changes meanwhile.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    cache_dir = out_dir / "negatives"
    journal = BenchJournal(
        out_dir / "runs.jsonl",
        _RunSettings(config.task, config.protocol, config.num_threads, config.use_subprocess),
    )
    rows: list[dict[str, Any]] = []
    protocols: dict[str, dict[str, Any]] = {}
    heuristics = heuristic_names()
    models = tuple(dict.fromkeys(heuristics + tuple(config.models)))
    sources = [_Source.of(d) for d in config.datasets]  # checked before any training
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        twice = sorted({s.given for s in sources if names.count(s.name) > 1})
        raise ConfigError(
            f"datasets {', '.join(twice)} are the same data ({', '.join(sorted(set(names)))}); "
            "list each file once"
        )
    if config.task == "nc":
        labelled = [s.given for s in sources if s.load().node_label is not None]
        for source in sources:
            if source.given not in labelled:
                per_event = (
                    " (its label column is a per-event label, which frugal's node "
                    "classification does not read: it classifies nodes by a class per node, "
                    "as an ml_NAME_node_label.csv beside an ml_ file gives)"
                    if source.load().label is not None
                    else ""
                )
                raise ConfigError(
                    f"--task nc needs node labels, and {source.given} has none{per_event}; use "
                    "--task lp, or run nc on the labelled datasets only "
                    f"({', '.join(labelled) or 'none given'})"
                )
    for index, source in enumerate(sources):
        dataset = source.name
        events = source.load()
        protocol = build_protocol(events, dataset, config.protocol, cache_dir)
        protocols[dataset] = protocol.describe() | dict(source.provenance)
        if index == 0:  # a user's model that the trainer cannot run fails before any run
            from frugal.tgraph.train import model_inputs

            for model in models:
                check_model_builds(model, model_inputs(protocol, MODELS.get(model)))
            sources_sha256 = {model: model_source_sha256(model) for model in models}
        for model in models:
            seeds = (
                range(1)  # deterministic: one run, seed 0, whatever seeds the models get
                if model in heuristics
                else range(config.first_seed, config.first_seed + config.num_seeds)
            )
            for seed in seeds:
                run = _Run(source, model, seed, config, str(cache_dir))
                code = sources_sha256[model]  # a user's model: its module's digest
                cell = f"{dataset}/{model}/{seed}" + (f"@{code[:16]}" if code else "")
                overrides = MODELS.get(model).applied_training(config.protocol)
                if overrides:  # the model's own training settings: a change re-runs it
                    digest = hashlib.sha256(json.dumps(overrides, sort_keys=True).encode())
                    cell += f"~{digest.hexdigest()[:12]}"
                if (earlier := journal.get(cell)) is not None:  # an interrupted bench's
                    rows.extend(row | {"resumed": True} for row in earlier)
                    if progress is not None:
                        progress(f"{dataset} {model} seed {seed}: resumed from {journal.path}")
                    continue
                if progress is not None:
                    progress(f"{dataset} {model} seed {seed}: running")
                began = time.perf_counter()
                # Heuristics take milliseconds: a child process would cost more than the run,
                # so they run here (their peak_rss_mib is then the bench process's).
                isolated = config.use_subprocess and model not in heuristics
                payload = _run_in_child(run, config.run_timeout_s) if isolated else _execute(run)
                new_rows = _rows_of(run, protocol, payload)
                for row in new_rows:
                    row["run_s"] = time.perf_counter() - began
                rows.extend(new_rows)
                if code:
                    for row in new_rows:
                        row["model_source_sha256"] = code
                journal.record(cell, new_rows)
                if progress is not None:
                    head = next(
                        (
                            r
                            for r in new_rows
                            if r["setting"] == "transductive" and r["negatives"] == "random"
                        ),
                        new_rows[0],
                    )
                    auc = head.get("auc", float("nan"))
                    progress(
                        f"{dataset} {model} seed {seed}: done, test AUC {auc:.4f}"
                        f" in {time.perf_counter() - began:.1f} s"
                    )
    reference: dict[str, Any] | None = None
    if config.compare_pyg_reference and "tgn" in config.models:
        # The target names CollegeMsg; other datasets only when it is not benched.
        (reference_source,) = [s for s in sources if s.name == "collegemsg"] or sources[:1]
        reference_dataset = reference_source.name
        # Journaled like a run, so a resumed sweep keeps the first timing instead of re-timing
        # both implementations on a machine that is now busy with other work.
        cell = f"{reference_dataset}/tgn_pyg_reference/{config.pyg_reference_batches}"
        reference = journal.get(cell)
        resumed = reference is not None
        if progress is not None:
            state = f"resumed from {journal.path}" if resumed else "timing"
            progress(f"{reference_dataset} PyG reference TGN: {state}")
        if reference is None:
            reference = compare_with_pyg_tgn(
                reference_source.given,
                config.protocol,
                config.pyg_reference_batches,
                config.num_threads,
            )
            reference["dataset"] = reference_dataset
            journal.record(cell, reference)
        rows.append(
            {"system": "tgn_pyg_reference", **reference, **({"resumed": True} if resumed else {})}
        )
    summary = _summary(rows, protocols, reference)
    result = write_bench_results("tgraph", config, rows, summary, out_dir / "results.json")
    lines = "".join(json.dumps(row) + "\n" for row in result.rows)
    write_text_atomically(out_dir / "results.jsonl", lines)
    return result


def _summary(
    rows: list[dict[str, Any]],
    protocols: dict[str, dict[str, Any]],
    reference: dict[str, Any] | None,
) -> TgraphSummary:
    """Per dataset: mean test AUC/AP (transductive, random negatives) and cost per model."""
    datasets: dict[str, TgraphDatasetSummary] = {}
    for dataset in protocols:
        head = [
            r
            for r in rows
            if r.get("dataset") == dataset
            and r.get("setting") == "transductive"
            and r.get("negatives") == "random"
        ]
        per_model: dict[str, TgraphModelSummary] = {}
        for model in dict.fromkeys(r["system"] for r in head):
            mine = [r for r in head if r["system"] == model]

            def mean(key: str, mine: list[dict[str, Any]] = mine) -> float | None:
                values = [r[key] for r in mine if r.get(key) is not None]
                return float(np.mean(values)) if values else None

            per_model[model] = TgraphModelSummary(
                auc=mean("auc"),
                ap=mean("ap"),
                mrr=mean("mrr"),
                ranking=next((r.get("ranking") for r in mine if r.get("ranking")), None),
                sampled_mrr=mean("sampled_mrr"),
                inductive_auc=_mean_of(rows, dataset, model, "inductive", "auc"),
                historical_auc=_mean_of(rows, dataset, model, "transductive", "auc", "historical"),
                s_per_epoch=mean("s_per_epoch"),
                train_events_per_s=mean("train_events_per_s"),
                num_seeds=len(mine),
            )
        best_heuristic = max(
            (m for m in per_model if m in heuristic_names()),
            key=lambda m: per_model[m].ap or 0.0,
            default=None,
        )
        best_model = max(per_model, key=lambda m: per_model[m].ap or 0.0, default=None)
        datasets[dataset] = TgraphDatasetSummary(
            models=per_model, best_model_by_ap=best_model, best_heuristic_by_ap=best_heuristic
        )
    return TgraphSummary(
        protocols=protocols,
        datasets=datasets,
        tgn_vs_pyg_reference=None
        if reference is None
        else TgraphReferenceSummary(
            dataset=reference.get("dataset"),
            ours_train_events_per_s=reference.get("ours_train_events_per_s"),
            pyg_train_events_per_s=reference.get("pyg_train_events_per_s"),
            speedup=reference.get("speedup"),
            error=reference.get("error"),
        ),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class TgraphModelSummary(Summary):
    """One model on one dataset: means over its seeds (transductive, random negatives)."""

    auc: float | None
    ap: float | None
    mrr: float | None
    """MRR under `ranking`."""
    ranking: str | None
    """What `mrr` ranks against: 'all' candidates, 'sampled:N' (pair-scoring models), or
    None without ranking."""
    sampled_mrr: float | None
    """MRR against the protocol's sampled candidates (every model; None if not sampled)."""
    inductive_auc: float | None
    historical_auc: float | None
    """Test AUC against historical negatives (transductive)."""
    s_per_epoch: float | None
    train_events_per_s: float | None
    """None for the heuristics (no training)."""
    num_seeds: int


@dataclass(frozen=True, kw_only=True, slots=True)
class TgraphDatasetSummary(Summary):
    """Every model on one dataset."""

    models: dict[str, TgraphModelSummary]
    best_model_by_ap: str | None
    best_heuristic_by_ap: str | None
    """The best heuristic floor; None when no heuristic ran."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TgraphReferenceSummary(Summary):
    """Our TGN's training speed against PyG's reference TGN loop on the same data."""

    dataset: str | None
    ours_train_events_per_s: float | None
    pyg_train_events_per_s: float | None
    speedup: float | None
    """Ours over PyG's training events/s."""
    error: str | None
    """Why the reference did not run (e.g. PyG missing); None when it ran."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TgraphSummary(Summary):
    """The `"summary"` of `frugal tgraph bench`'s `results.json`."""

    protocols: dict[str, dict[str, Any]]
    """Per dataset: the protocol's description (`Protocol.describe()`, with its hash)."""
    datasets: dict[str, TgraphDatasetSummary]
    tgn_vs_pyg_reference: TgraphReferenceSummary | None
    """None when the PyG reference was not compared."""


TGRAPH_BENCH: Bench[TgraphBenchConfig, TgraphSummary] = BenchSpec(
    name="tgraph", summary_type=TgraphSummary, preset=TgraphBenchConfig.preset, run=run_tgraph_bench
)
"""The tgraph bench, as `frugal reproduce` runs it."""


def _mean_of(
    rows: list[dict[str, Any]],
    dataset: str,
    model: str,
    setting: str,
    key: str,
    negatives: str = "random",
) -> float | None:
    values = [
        r[key]
        for r in rows
        if r.get("dataset") == dataset
        and r.get("system") == model
        and r.get("setting") == setting
        and r.get("negatives") == negatives
        and r.get(key) is not None
    ]
    return float(np.mean(values)) if values else None


def with_protocol_preset(base: TgraphBenchConfig, name: str) -> TgraphBenchConfig:
    """`base` under the protocol preset `name`, keeping its epoch cap and learning rate.

    The `--quick` preset's 2 epochs need its 1e-3; Benchtemp's own rate is the default 1e-4.

    Raises:
        ValueError: If no preset has that name (the message lists the registered ones).
    """
    return replace(
        base,
        protocol=replace(
            protocol_preset(name),
            max_epochs=base.protocol.max_epochs,
            learning_rate=base.protocol.learning_rate,
        ),
    )


def benchtemp_config(base: TgraphBenchConfig) -> TgraphBenchConfig:
    """`base` under the `benchtemp` preset (`with_protocol_preset(base, "benchtemp")`)."""
    return with_protocol_preset(base, "benchtemp")
