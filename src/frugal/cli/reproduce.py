"""`frugal reproduce [--smoke | --quick | --full] [--only PARTS] [--out DIR]`: the main job."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from frugal.cli.options import add_print_config_argument, output_folder, print_config

__all__ = ["register"]


def register(commands: Any) -> None:
    """Add the `reproduce` subcommand to the top-level subparsers."""
    from frugal.reproduce.parts import PART_NAMES

    parser = commands.add_parser(
        "reproduce",
        help="the main job: every subsystem's headline claim vs its baselines, one report",
        description=(
            "Run each subsystem's bench (store, tgraph, recsys, pipeline, planner) side by side "
            "with its baselines on the bundled real data and write results.json, report.md and "
            "figures. Parts finished earlier in the same folder and mode are not redone."
        ),
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--quick",
        dest="mode",
        action="store_const",
        const="quick",
        help="small presets, about 13 minutes on 2 cores (the default)",
    )
    mode.add_argument(
        "--full",
        dest="mode",
        action="store_const",
        const="full",
        help="the real benchmarks (hours; resumable)",
    )
    mode.add_argument(
        "--smoke",
        dest="mode",
        action="store_const",
        const="smoke",
        help="tiny settings that only check the job runs end to end (CI)",
    )
    parser.set_defaults(mode="quick")
    parser.add_argument(
        "--only",
        metavar="PARTS",
        default=",".join(PART_NAMES),
        help=f"comma-separated parts to run (default: {','.join(PART_NAMES)})",
    )
    parser.add_argument(
        "--out", default="reports/latest", metavar="DIR", help="output folder (default %(default)s)"
    )
    add_print_config_argument(parser)
    parser.set_defaults(handler=_reproduce)


def _reproduce(args: argparse.Namespace) -> int:
    from frugal.config import config_from_dict
    from frugal.reproduce import ReproduceConfig, run_reproduce

    only = [name.strip() for name in args.only.split(",") if name.strip()]
    config = config_from_dict(
        ReproduceConfig, {"mode": args.mode, "only": only}, source="command line"
    )
    if print_config(args, config):
        return 0
    out = output_folder(args.out)
    document, _ = run_reproduce(config, out, show_progress=sys.stderr.isatty())
    summary = document["summary"]
    print(
        f"claims met {summary['claims_met']}, not met {summary['claims_not_met']}, "
        f"not measured {summary['claims_not_measured']}; "
        f"failed parts: {', '.join(summary['parts_failed']) or 'none'}"
    )
    print(f"wrote {out / 'report.md'} and {out / 'results.json'}", file=sys.stderr)
    return 1 if summary["parts_failed"] else 0
