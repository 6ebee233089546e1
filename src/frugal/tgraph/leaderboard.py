"""`frugal tgraph leaderboard DIR`: Markdown tables (mean and 95 % CI over seeds) and a PNG.

Reads every `results.json` and bench journal (`runs.jsonl`) written by `frugal tgraph bench`
under DIR (at any depth: point it at a folder of several benches' `--out` folders to merge
datasets). One table per (protocol settings, view, negative strategy): rows are datasets,
columns models, cells the mean test metric over seeds with a Student-t 95 % half-width ("n=1"
for a single run). A cell is in bold only when its interval lies above every other model's (a
learned model's single run has no interval and is never bold; a heuristic's single run is
exact). A last row gives each model's mean rank over the datasets. A table holds the datasets
run under the same protocol settings (listing each dataset's protocol hash); a run found twice
counts once. Runs with `--task nc` add one node-classification table per protocol (`nc_auc`,
macro AUC for more than two classes). A last section gives the compute time of the runs (each
run's `run_s`: training, validation, test, node classification).

MRR and Hits@10 are only comparable under one ranking: a row's `mrr` / `hits_at_10` rank
against every candidate (`ranking="all"`, node-scoring models and heuristics) or against
the protocol's sampled candidates (`"sampled:N"`, pair-scoring models such as CAWN). For
those two metrics the tables are split by ranking as well (the heading names it), so an
"all" and a "sampled:N" MRR never share a table; rows written before rankings were
labelled count as "all". `sampled_mrr` / `sampled_hits_at_10` rank every model against the
same sampled candidates: one table compares them all.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from frugal.config import ConfigError
from frugal.tgraph.models import heuristic_names

__all__ = [
    "RANKED_METRICS",
    "collect_rows",
    "mean_ci95",
    "render_compute_time",
    "render_leaderboard",
    "row_ranking",
    "write_leaderboard",
]


_ROW_KEYS = ("protocol_hash", "protocol", "dataset", "system", "seed", "setting", "negatives")
"""Fields every link-prediction row of `frugal tgraph bench` carries (the tables group by them)."""


_STRING_KEYS = ("protocol_hash", "protocol", "dataset", "system", "setting", "negatives")
_NUMBER_KEYS = (
    "auc",
    "ap",
    "auc_per_batch",
    "ap_per_batch",
    "mrr",
    "hits_at_10",
    "sampled_mrr",
    "sampled_hits_at_10",
    "nc_auc",
    "s_per_epoch",
    "train_events_per_s",
    "infer_events_per_s",
    "peak_rss_mib",
    "epochs",
    "run_s",
)
"""Fields the tables and plots compute with: numbers (or null) when present."""


def _check_row(where: str, row: dict[str, Any]) -> None:
    """Raise ValueError naming `where` (file and row) if a field has the wrong type."""
    lacking = [k for k in _ROW_KEYS if k not in row]
    if lacking:
        raise ConfigError(f"{where} lacks {lacking}; re-run its bench or remove the file")
    for key in _STRING_KEYS:
        if not isinstance(row[key], str):
            raise ConfigError(
                f"{where}: {key} must be a string, got {row[key]!r}; re-run its bench or "
                "remove the file"
            )
    if isinstance(row["seed"], bool) or not isinstance(row["seed"], int):
        raise ConfigError(
            f"{where}: seed must be an integer, got {row['seed']!r}; re-run its bench or "
            "remove the file"
        )
    for key in _NUMBER_KEYS:
        value = row.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ConfigError(
                f"{where}: {key} must be a number or null, got {value!r}; re-run its bench or "
                "remove the file"
            )


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path} is not UTF-8 text ({exc}); re-run its bench or remove the file"
        ) from exc


def collect_rows(results_dir: Path) -> list[dict[str, Any]]:
    """Link-prediction rows of every tgraph `results.json` under `results_dir` (any depth).

    Journals (`runs.jsonl`) are read too, so the runs of a bench still running or stopped,
    and of benches that split the seeds of one folder (each `results.json` then holds one
    bench's seeds), all show. Each row gets `protocol_settings`, a hash of its bench's
    protocol settings without the dataset (rows of several datasets under the same settings
    share a table). A run found twice (a copied folder, or a results.json and its journal)
    counts once: rows are unique per (protocol hash, dataset, model, seed, view, negatives),
    the first file in path order wins (results files before journals).

    Raises:
        ValueError: If a results.json is not valid JSON or UTF-8, or its config, rows or a
            row's fields are malformed (naming the file and row).
        FileNotFoundError: If no tgraph results.json or journal is found.
    """
    rows: list[dict[str, Any]] = []
    seen: set[tuple[Any, ...]] = set()

    def accept(where: str, row: Any, settings: str | None) -> None:
        if not (isinstance(row, dict) and "protocol_hash" in row and "setting" in row):
            return
        _check_row(where, row)
        key = tuple(
            row[k] for k in ("protocol_hash", "dataset", "system", "seed", "setting", "negatives")
        )
        if key in seen:
            return
        seen.add(key)
        rows.append({"protocol_settings": settings or row["protocol_hash"], **row})

    files = sorted(results_dir.rglob("results.json"))
    for path in files:
        try:
            document = json.loads(_read_text(path))
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{path} is not valid JSON ({exc}); re-run its bench or remove the file"
            ) from exc
        if not isinstance(document, dict) or document.get("benchmark") != "tgraph":
            continue
        config = document.get("config") or {}
        if not isinstance(config, dict):
            raise ConfigError(
                f"{path}: 'config' must be an object, got {type(config).__name__}; re-run its "
                "bench or remove the file"
            )
        protocol = config.get("protocol")
        settings = (
            hashlib.sha256(json.dumps(protocol, sort_keys=True).encode()).hexdigest()
            if protocol is not None
            else None
        )
        document_rows = document.get("rows", [])
        if not isinstance(document_rows, list):
            raise ConfigError(
                f"{path}: 'rows' must be a list of rows, got {type(document_rows).__name__}; "
                "re-run its bench or remove the file"
            )
        for index, row in enumerate(document_rows):
            accept(f"{path}: row {index}", row, settings)
    journals = sorted(results_dir.rglob("runs.jsonl"))
    for path in journals:  # rows carry their own protocol_settings
        for number, line in enumerate(_read_text(path).splitlines(), start=1):
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line a crash cut short (the bench skips it too)
            value = entry.get("value") if isinstance(entry, dict) else None
            for index, row in enumerate(value if isinstance(value, list) else []):
                accept(f"{path}: line {number}, row {index}", row, None)
    if not rows:
        raise FileNotFoundError(
            f"no rows of `frugal tgraph bench` in the {len(files)} results.json and "
            f"{len(journals)} journals under {results_dir}; run `frugal tgraph bench --out DIR` "
            "and point at DIR (or a folder above several such folders)"
        )
    return rows


def mean_ci95(values: list[float]) -> tuple[float, float]:
    """Mean and Student-t 95 % half-width (0 for one value).

    Returns:
        (mean, half_width); (nan, nan) for no values.
    """
    clean = [v for v in values if v is not None and math.isfinite(v)]
    if not clean:
        return float("nan"), float("nan")
    if len(clean) == 1:
        return clean[0], 0.0
    from scipy import stats

    arr = np.asarray(clean)
    half = float(stats.t.ppf(0.975, len(arr) - 1) * arr.std(ddof=1) / math.sqrt(len(arr)))
    return float(arr.mean()), half


RANKED_METRICS = ("mrr", "hits_at_10")
"""Metrics whose values depend on the row's `ranking` ('all' or 'sampled:N')."""


def row_ranking(row: dict[str, Any]) -> str:
    """What a row's mrr / hits_at_10 rank against: 'all', 'sampled:N' or 'none'.

    Rows without the field predate pair models, when every ranking was over all candidates.

    Raises:
        ConfigError: If the field is neither a string nor null.
    """
    if "ranking" not in row:
        return "all"
    value = row["ranking"]
    if value is None:
        return "none"
    if not isinstance(value, str):
        raise ConfigError(f"ranking must be a string or null, got {value!r}; re-run its bench")
    return value


def _cell(mean: float, half: float, count: int) -> str:
    if count == 1:
        return f"{mean:.4f} (n=1)"
    return f"{mean:.4f} ± {half:.4f}"


def _clear_winner(
    cells: dict[str, tuple[float, float, int]], deterministic: frozenset[str]
) -> str | None:
    """The model whose 95 % interval lies wholly above every other model's, or None.

    Args:
        cells: (mean, half-width, runs) per model; NaN means for models without a value.
        deterministic: Models whose single run is exact (the heuristic floors).
    """
    finite = {m: c for m, c in cells.items() if math.isfinite(c[0])}
    if len(finite) < 2:
        return None
    bounds: dict[str, tuple[float, float] | None] = {
        m: None if count == 1 and m not in deterministic else (mean - half, mean + half)
        for m, (mean, half, count) in finite.items()
    }
    best = max(finite, key=lambda m: finite[m][0])
    low = bounds[best]
    if low is None:
        return None
    for model, interval in bounds.items():
        if model != best and (interval is None or low[0] <= interval[1]):
            return None
    return best


def render_leaderboard(rows: list[dict[str, Any]], metric: str = "auc") -> str:
    """Markdown tables of `metric` per (protocol settings, view, negatives).

    Rows are datasets, so one table ranks the models over every dataset run under the same
    protocol settings; the per-dataset protocol hashes (split, masks, negatives) are listed
    under each table. `metric="nc_auc"` gives one node-classification table per protocol
    instead (each run's rows carry the same `nc_auc`; one row per run is read).

    Raises:
        ValueError: If no row has a value of `metric`.
    """
    if not any(isinstance(r.get(metric), int | float) for r in rows):
        hint = " (run the bench with --task nc and a learned model)" if metric == "nc_auc" else ""
        raise ConfigError(f"no result row has a value of {metric!r}{hint}")
    groups: dict[tuple[str, str, str, str, str], list[dict[str, Any]]] = defaultdict(list)
    if metric == "nc_auc":
        first: dict[tuple[Any, ...], dict[str, Any]] = {}
        for row in rows:
            if row.get("nc_auc") is not None and row["setting"] == "transductive":
                run = (row["protocol_hash"], row["dataset"], row["system"], row["seed"])
                first.setdefault(run, row)  # one row per run: the first negative strategy's
        for row in first.values():
            settings = row.get("protocol_settings", row["protocol_hash"])
            groups[(row["protocol"], settings, "node classification", "", "")].append(row)
        title = "# tgraph leaderboard (node classification AUC, test, mean ± 95% CI over seeds)\n"
    else:
        for row in rows:
            settings = row.get("protocol_settings", row["protocol_hash"])
            ranking = row_ranking(row) if metric in RANKED_METRICS else ""
            if ranking == "none":
                continue
            key = (row["protocol"], settings, row["setting"], row["negatives"], ranking)
            groups[key].append(row)
        title = f"# tgraph leaderboard ({metric}, test split, mean ± 95% CI over seeds)\n"
    parts = [
        title,
        "Bold: the model's 95 % interval lies above every other model's on that dataset (a "
        "learned model run with one seed has no interval, so it is never bold).\n",
    ]
    deterministic = frozenset(heuristic_names())
    for (protocol, settings, view, negatives, ranking), group in sorted(groups.items()):
        hashes = sorted({(r["dataset"], r["protocol_hash"]) for r in group})
        names = [d for d, _ in hashes]
        # a dataset under two protocol hashes (other negatives) is two rows, never merged
        label = {(d, h): d if names.count(d) == 1 else f"{d} ({h[:8]})" for d, h in hashes}
        models = list(dict.fromkeys(r["system"] for r in group))
        heading = f"{view} / {negatives} negatives" if negatives else view
        if ranking:
            heading += f" / ranking {ranking}"
        parts.append(f"\n## {heading} — protocol `{protocol}` (settings {settings[:12]})\n")
        parts.append("| dataset | " + " | ".join(models) + " |")
        parts.append("|---" * (len(models) + 1) + "|")
        ranks: dict[str, list[float]] = defaultdict(list)
        for dataset, digest in hashes:
            cells = {}
            for model in models:
                values = [
                    r.get(metric)
                    for r in group
                    if (r["dataset"], r["protocol_hash"]) == (dataset, digest)
                    and r["system"] == model
                ]
                clean = [v for v in values if v is not None]
                cells[model] = (*mean_ci95(clean), len(clean))
            means = {m: c[0] for m, c in cells.items() if math.isfinite(c[0])}
            winner = _clear_winner(cells, deterministic)
            order = sorted(means, key=lambda m: -means[m])
            for model in order:
                ties = [m for m in order if means[m] == means[model]]
                ranks[model].append(float(np.mean([order.index(m) + 1 for m in ties])))
            text = []
            for model in models:
                mean, half, count = cells[model]
                if not math.isfinite(mean):
                    text.append("—")
                    continue
                cell = _cell(mean, half, count)
                text.append(f"**{cell}**" if model == winner else cell)
            parts.append(f"| {label[(dataset, digest)]} | " + " | ".join(text) + " |")
        parts.append(
            f"| mean rank ({len(hashes)} dataset{'s' if len(hashes) > 1 else ''}) | "
            + " | ".join(f"{np.mean(ranks[m]):.2f}" if ranks[m] else "—" for m in models)
            + " |"
        )
        parts.append(
            "\nProtocol hash per dataset: "
            + ", ".join(f"{label[(d, h)]} `{h[:12]}`" for d, h in hashes)
        )
    return "\n".join(parts) + "\n"


def render_compute_time(rows: list[dict[str, Any]]) -> str:
    """Minutes of compute per (protocol, dataset, model), summed over seeds, with totals.

    Each run counts once (its rows repeat `run_s` for every view and negative strategy);
    runs without `run_s` (older results) count as 0 and are flagged.
    """
    runs: dict[tuple[Any, ...], float | None] = {}
    for row in rows:
        key = (row["protocol"], row["dataset"], row["protocol_hash"], row["system"], row["seed"])
        runs.setdefault(key, row.get("run_s"))
    parts = ["# tgraph compute time (minutes, sum over seeds; one run = train + eval + test)\n"]
    missing = sum(1 for v in runs.values() if v is None)
    for protocol in sorted({k[0] for k in runs}):
        mine = {k: v for k, v in runs.items() if k[0] == protocol}
        models = list(dict.fromkeys(k[3] for k in mine))
        datasets = list(dict.fromkeys((k[1], k[2]) for k in mine))
        parts.append(f"\n## protocol `{protocol}`\n")
        parts.append("| dataset | " + " | ".join(models) + " | total |")
        parts.append("|---" * (len(models) + 2) + "|")
        column_totals = dict.fromkeys(models, 0.0)
        for dataset, digest in datasets:
            cells = []
            total = 0.0
            for model in models:
                values = [
                    v or 0.0
                    for k, v in mine.items()
                    if (k[1], k[2], k[3]) == (dataset, digest, model)
                ]
                minutes = sum(values) / 60.0
                total += minutes
                column_totals[model] += minutes
                cells.append(f"{minutes:.1f}" if values else "—")
            parts.append(f"| {dataset} | " + " | ".join(cells) + f" | {total:.1f} |")
        grand = sum(column_totals.values())
        parts.append(
            "| all | " + " | ".join(f"{column_totals[m]:.1f}" for m in models) + f" | {grand:.1f} |"
        )
    if missing:
        parts.append(f"\n{missing} run(s) have no run_s (older results) and count as 0.")
    return "\n".join(parts) + "\n"


def write_leaderboard(results_dir: Path, metric: str = "auc") -> Path:
    """Write `leaderboard.md` and `leaderboard.png` (metric vs s_per_epoch) into results_dir.

    Returns:
        The Markdown file's path.

    Raises:
        FileNotFoundError: If no tgraph results are found.
        ValueError: If a results.json is corrupt or no row has `metric` (nothing is written).
    """
    rows = collect_rows(results_dir)
    markdown = results_dir / "leaderboard.md"
    text = render_leaderboard(rows, metric)
    if metric != "nc_auc" and any(r.get("nc_auc") is not None for r in rows):
        text += "\n" + render_leaderboard(rows, "nc_auc")
    text += "\n" + render_compute_time(rows)
    markdown.write_text(text)
    _plot(rows, metric, results_dir / "leaderboard.png")
    return markdown


def _plot(rows: list[dict[str, Any]], metric: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    head = [
        r
        for r in rows
        if r["setting"] == "transductive"
        and r["negatives"] == "random"
        and r.get(metric)
        and (metric not in RANKED_METRICS or row_ranking(r) == "all")  # one ranking per axis
    ]
    figure, axis = plt.subplots(figsize=(6, 4))
    for model in dict.fromkeys(r["system"] for r in head):
        mine = [r for r in head if r["system"] == model]
        axis.scatter(
            [max(r.get("s_per_epoch") or 1e-4, 1e-4) for r in mine],
            [r[metric] for r in mine],
            label=model,
        )
    if not head:
        axis.text(0.5, 0.5, f"no transductive rows with {metric}", ha="center")
    axis.set_xscale("log")
    axis.set_xlabel("train s per epoch (log)")
    ranked = ", ranking all" if metric in RANKED_METRICS else ""
    axis.set_ylabel(f"test {metric} (transductive, random negatives{ranked})")
    if head:
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
