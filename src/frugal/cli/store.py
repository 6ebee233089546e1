"""`frugal store bench [--quick] [--out DIR]`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from frugal.cli.options import add_config_arguments, output_folder

__all__ = ["register"]


def register(commands: Any) -> None:
    """Add the `store` subcommand and its children to the top-level subparsers."""
    parser = commands.add_parser(
        "store",
        help="disk-backed embedding storage (MLKV): benchmark",
        description="frugal.store: embedding tables on disk behind a lookahead cache.",
    )
    children = parser.add_subparsers(dest="store_command", metavar="ACTION")
    children.required = True
    bench = children.add_parser(
        "bench",
        help="compare ram, KV offloading, hybrid logs, MLKV and frugal side by side",
        description=(
            "Without --quick this is the full benchmark (Criteo-shaped trace at scale 0.25, "
            "4,000 batches, 4 memory ratios x 4 lookaheads, two real streams, the staleness "
            "study): hours on 2 cores. Finished cells are journaled in OUT/runs.jsonl and "
            "reused by the next run with the same settings. Exit 1 if any cell fails."
        ),
    )
    bench.add_argument(
        "--quick", action="store_true", help="small preset (Criteo scale 0.02, 300 batches)"
    )
    bench.add_argument(
        "--out",
        default="reports/store",
        metavar="DIR",
        help="folder for results.json (default %(default)s)",
    )
    add_config_arguments(bench)
    bench.set_defaults(handler=_bench)


def _bench(args: argparse.Namespace) -> int:
    from frugal.bench.store import StoreBenchConfig, run_store_bench
    from frugal.config import config_to_dict, load_config

    preset = config_to_dict(StoreBenchConfig.quick()) if args.quick else None
    config = load_config(StoreBenchConfig, args.config, args.overrides, base=preset)
    out = output_folder(args.out)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    document = run_store_bench(config, out, progress=progress).document
    print(json.dumps(document["summary"], indent=1))
    print(f"wrote {out / 'results.json'}", file=sys.stderr)
    failed = [r for r in document["rows"] if r.get("status") != "ok"]
    if failed:
        print(
            f"frugal: {len(failed)} of {len(document['rows'])} runs did not finish (status "
            f"{sorted({str(r.get('status')) for r in failed})}); the summary leaves them out. "
            f"First error: {failed[0].get('error', '?')}",
            file=sys.stderr,
        )
        return 1
    return 0
