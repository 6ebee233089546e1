"""`frugal store bench [--quick] [--workload dlrm|kge|gnn] [--out DIR]`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from frugal.cli.bench import BenchEntry, add_bench

__all__ = ["add_actions"]


def add_actions(children: Any) -> None:
    """Add the actions of `frugal store` to its subparsers."""
    parser = add_bench(
        children,
        _bench,
        help="compare ram, KV offloading, hybrid logs, MLKV and frugal side by side",
        description=(
            "Without --quick this is the full benchmark (Criteo-shaped trace at scale 0.25, "
            "4,000 batches, 4 memory ratios x 4 lookaheads, two real streams, the staleness "
            "study): hours on 2 cores. Finished cells are journaled in OUT/runs.jsonl and "
            "reused by the next run with the same settings. Exit 1 if any cell fails."
        ),
        quick_help="small preset (Criteo scale 0.02, 300 batches)",
        out="reports/store",
        out_help="folder for results.json (default %(default)s)",
        resumes=True,
    )
    parser.add_argument(
        "--workload",
        action="append",
        metavar="NAME",
        help="a workload family (dlrm, kge) or one workload (criteo_zipf, kge_freebase, ...); "
        "repeatable; default: every workload of the preset",
    )


def _bench() -> BenchEntry:
    from frugal.bench.store import StoreBenchConfig, run_store_bench

    return BenchEntry(
        config_class=StoreBenchConfig,
        quick=StoreBenchConfig.quick,
        resolve=_resolve,
        run=run_store_bench,
        exit_code=_failed_cells,
    )


def _resolve(args: argparse.Namespace) -> Any:
    """The preset, `--config` and `--set`, then `--workload` on top."""
    from dataclasses import replace

    from frugal.bench.store import StoreBenchConfig, select_workloads
    from frugal.config import config_to_dict, load_config

    preset = config_to_dict(StoreBenchConfig.quick()) if args.quick else None
    config = load_config(StoreBenchConfig, args.config, args.overrides, base=preset)
    if args.workload:
        config = replace(config, workloads=select_workloads(args.workload))
    return config


def _failed_cells(document: dict[str, Any]) -> int:
    """1 (with one line on stderr) if a bench cell did not finish, else 0."""
    rows: list[dict[str, Any]] = document.get("rows", [])
    failed = [r for r in rows if r.get("status") != "ok"]
    if failed:
        print(
            f"frugal: {len(failed)} of {len(rows)} runs did not finish (status "
            f"{sorted({str(r.get('status')) for r in failed})}); the summary leaves them out. "
            f"First error: {failed[0].get('error', '?')}",
            file=sys.stderr,
        )
        return 1
    return 0
