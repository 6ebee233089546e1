"""`frugal tgraph leaderboard DIR`: Markdown tables (mean and 95 % CI over seeds) and a PNG.

Reads every `results.json` under DIR (at any depth: point it at a folder of several benches'
`--out` folders to merge datasets) written by `frugal tgraph bench`. One table per
(protocol hash, view, negative strategy): rows are datasets, columns models, cells the mean
test metric over seeds with a Student-t 95 % half-width, the best cell in bold; a last row
gives each model's mean rank over the datasets. Tables never mix protocol hashes. Runs with
`--task nc` add one node-classification table per protocol (`nc_auc`, macro AUC for more
than two classes).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["collect_rows", "mean_ci95", "render_leaderboard", "write_leaderboard"]


def collect_rows(results_dir: Path) -> list[dict[str, Any]]:
    """Link-prediction rows of every tgraph `results.json` under `results_dir`.

    Raises:
        FileNotFoundError: If no tgraph results.json is found.
    """
    rows: list[dict[str, Any]] = []
    for path in sorted(results_dir.rglob("results.json")):
        document = json.loads(path.read_text())
        if document.get("benchmark") != "tgraph":
            continue
        rows.extend(r for r in document["rows"] if "protocol_hash" in r and "setting" in r)
    if not rows:
        raise FileNotFoundError(
            f"no tgraph results.json under {results_dir}; run `frugal tgraph bench --out DIR`"
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


def render_leaderboard(rows: list[dict[str, Any]], metric: str = "auc") -> str:
    """Markdown tables of `metric` per (protocol hash, view, negatives).

    `metric="nc_auc"` gives one node-classification table per protocol hash instead (each
    run's rows carry the same `nc_auc`; one row per run is read).
    """
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = defaultdict(list)
    if metric == "nc_auc":
        for row in rows:
            if row.get("nc_auc") is not None and row["setting"] == "transductive":
                key = (row["protocol"], row["protocol_hash"], "node classification", "")
                # one row per (dataset, model, seed): the first negative strategy's
                groups[key].append(row)
        for key, group in groups.items():
            first: dict[tuple[str, str, int], dict[str, Any]] = {}
            for row in group:
                first.setdefault((row["dataset"], row["system"], row["seed"]), row)
            groups[key] = list(first.values())
        title = "# tgraph leaderboard (node classification AUC, test, mean ± 95% CI over seeds)\n"
    else:
        for row in rows:
            key = (row["protocol"], row["protocol_hash"], row["setting"], row["negatives"])
            groups[key].append(row)
        title = f"# tgraph leaderboard ({metric}, test split, mean ± 95% CI over seeds)\n"
    parts = [title]
    for (protocol, digest, view, negatives), group in sorted(groups.items()):
        datasets = sorted({r["dataset"] for r in group})
        models = list(dict.fromkeys(r["system"] for r in group))
        heading = f"{view} / {negatives} negatives" if negatives else view
        parts.append(f"\n## {heading} — protocol `{protocol}` ({digest[:12]})\n")
        parts.append("| dataset | " + " | ".join(models) + " |")
        parts.append("|---" * (len(models) + 1) + "|")
        ranks: dict[str, list[float]] = defaultdict(list)
        for dataset in datasets:
            cells = {}
            for model in models:
                values = [
                    r.get(metric) for r in group if r["dataset"] == dataset and r["system"] == model
                ]
                cells[model] = mean_ci95([v for v in values if v is not None])
            means = {m: c[0] for m, c in cells.items() if math.isfinite(c[0])}
            best = max(means.values(), default=None)
            order = sorted(means, key=lambda m: -means[m])
            for model in order:
                ties = [m for m in order if means[m] == means[model]]
                ranks[model].append(float(np.mean([order.index(m) + 1 for m in ties])))
            text = []
            for model in models:
                mean, half = cells[model]
                if not math.isfinite(mean):
                    text.append("—")
                    continue
                cell = f"{mean:.4f} ± {half:.4f}"
                text.append(f"**{cell}**" if mean == best else cell)
            parts.append(f"| {dataset} | " + " | ".join(text) + " |")
        parts.append(
            "| mean rank | "
            + " | ".join(f"{np.mean(ranks[m]):.2f}" if ranks[m] else "—" for m in models)
            + " |"
        )
    return "\n".join(parts) + "\n"


def write_leaderboard(results_dir: Path, metric: str = "auc") -> Path:
    """Write `leaderboard.md` and `leaderboard.png` (metric vs s_per_epoch) into results_dir.

    Returns:
        The Markdown file's path.

    Raises:
        FileNotFoundError: If no tgraph results are found.
    """
    rows = collect_rows(results_dir)
    markdown = results_dir / "leaderboard.md"
    text = render_leaderboard(rows, metric)
    if metric != "nc_auc" and any(r.get("nc_auc") is not None for r in rows):
        text += "\n" + render_leaderboard(rows, "nc_auc")
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
        if r["setting"] == "transductive" and r["negatives"] == "random" and r.get(metric)
    ]
    figure, axis = plt.subplots(figsize=(6, 4))
    for model in dict.fromkeys(r["system"] for r in head):
        mine = [r for r in head if r["system"] == model]
        axis.scatter(
            [max(r.get("s_per_epoch") or 1e-4, 1e-4) for r in mine],
            [r[metric] for r in mine],
            label=model,
        )
    axis.set_xscale("log")
    axis.set_xlabel("train s per epoch (log)")
    axis.set_ylabel(f"test {metric} (transductive, random negatives)")
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
