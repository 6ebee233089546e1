"""`frugal reproduce [--smoke | --quick | --full] [--only PARTS] [--out DIR]`: the main job."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from frugal.cli.options import add_print_config_argument, output_folder, with_config

if TYPE_CHECKING:
    from frugal.reproduce import ReproduceConfig

__all__ = ["add_arguments"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of `frugal reproduce` to its parser."""
    from frugal.reproduce.parts import PART_NAMES

    mode = parser.add_mutually_exclusive_group()
    for name, help_text in (
        ("quick", "small presets, about 13 minutes on 2 cores (the default)"),
        ("full", "the real benchmarks (hours; resumable)"),
        ("smoke", "tiny settings that only check the job runs end to end (CI)"),
    ):
        mode.add_argument(
            f"--{name}", dest="mode", action="store_const", const=name, help=help_text
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
    add_print_config_argument(parser, takes_config=False)
    parser.set_defaults(handler=_reproduce)


def _config(args: argparse.Namespace) -> ReproduceConfig:
    from frugal.config import config_from_dict
    from frugal.reproduce import ReproduceConfig

    only = [name.strip() for name in args.only.split(",") if name.strip()]
    return config_from_dict(
        ReproduceConfig, {"mode": args.mode, "only": only}, source="command line"
    )


@with_config(_config)
def _reproduce(args: argparse.Namespace, config: ReproduceConfig) -> int:
    from frugal.reproduce import run_reproduce

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
