"""`frugal plan --scenario NAME [--out plan.json]`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from frugal.cli.options import add_config_arguments, config_from_args

__all__ = ["register"]


def register(commands: Any) -> None:
    """Add the `plan` subcommand to the top-level subparsers."""
    parser = commands.add_parser(
        "plan",
        help="place pipeline x data-parallel training on a (geo-distributed) cluster",
        description=(
            "Search a placement (DT-FM scheduler's cost model) and print it; settings such as "
            "num_stages, num_replicas, method, budget and seed go through --set."
        ),
    )
    parser.add_argument(
        "--scenario",
        required=True,
        metavar="NAME",
        help="datacenter, spot, two_sites, regional, world or fluidstack_3region",
    )
    parser.add_argument("--out", metavar="FILE", default=None, help="write the plan as JSON")
    add_config_arguments(parser)
    parser.set_defaults(handler=_plan)


def _plan(args: argparse.Namespace) -> int:
    from frugal.planner.plan import PlannerConfig, build_plan
    from frugal.planner.scenarios import build_scenario

    config = config_from_args(PlannerConfig, args)
    topology = build_scenario(args.scenario)
    plan = build_plan(topology, config)
    print(plan.table())
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(plan.to_json() + "\n")
        print(f"wrote {out}", file=sys.stderr)
    return 0
