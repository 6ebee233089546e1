"""`frugal plan --scenario NAME | --cluster FILE [--out plan.json]`, bench and validate.

`frugal plan bench` compares methods under the cost models; `frugal plan validate` executes
their plans on emulated links and compares the predictions with the measured runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from frugal.cli.options import add_config_arguments, config_from_args, output_file, output_folder

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
    where = parser.add_mutually_exclusive_group()
    from frugal.planner.scenarios import SCENARIOS

    where.add_argument("--scenario", metavar="NAME", help=", ".join(SCENARIOS))
    where.add_argument(
        "--cluster", metavar="FILE", help="a cluster TOML file (sites, hosts, links)"
    )
    parser.add_argument(
        "--out", metavar="FILE", default=None, help="write the plan as JSON (and a PNG beside it)"
    )
    add_config_arguments(parser)
    parser.set_defaults(handler=_plan)
    children = parser.add_subparsers(dest="plan_command", metavar="[ACTION]")
    bench = children.add_parser(
        "bench", help="every scenario x model size x method side by side; writes results.json"
    )
    bench.add_argument(
        "--quick",
        action="store_true",
        help="every scenario x model cell, search budgets of 300 (about 6 min)",
    )
    bench.add_argument("--out", default="reports/plan", metavar="DIR", help="results folder")
    add_config_arguments(bench)
    bench.set_defaults(handler=_bench)
    validate = children.add_parser(
        "validate",
        help="execute each method's plan on emulated links (torchrun) vs the predictions",
    )
    validate.add_argument(
        "--quick", action="store_true", help="4 ranks, 2 sites, 4 methods, 5 steps each"
    )
    validate.add_argument(
        "--out", default="reports/plan-validate", metavar="DIR", help="results folder"
    )
    add_config_arguments(validate)
    validate.set_defaults(handler=_validate)


def _plan(args: argparse.Namespace) -> int:
    from frugal.config import load_config
    from frugal.planner.cluster import load_cluster
    from frugal.planner.plan import PlannerConfig, build_plan
    from frugal.planner.scenarios import build_scenario

    out = Path(args.out) if args.out else None
    if out is not None:  # refuse a bad output path before the search, not after it
        if out.is_dir():
            raise ValueError(f"--out {out} is a folder; give a file name such as plan.json")
        output_file(args.out)
        if out.suffix == ".png":
            raise ValueError(f"--out {out}: give the .json path; the .png is written beside it")
    if args.cluster:
        topology, settings = load_cluster(args.cluster)
        config = load_config(
            PlannerConfig, args.config, args.overrides, base=settings, base_source=args.cluster
        )
    elif args.scenario:
        topology = build_scenario(args.scenario)
        config = config_from_args(PlannerConfig, args)
    else:
        raise ValueError("give --scenario NAME or --cluster FILE (or use `frugal plan bench`)")
    plan = build_plan(topology, config)
    print(plan.table())
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(plan.to_json() + "\n")
        from frugal.planner.figure import draw_plan

        draw_plan(plan, out.with_suffix(".png"))
        print(f"wrote {out} and {out.with_suffix('.png')}", file=sys.stderr)
    return 0


def _no_cluster_flags(args: argparse.Namespace, action: str, instead: str) -> None:
    """`--scenario`/`--cluster` belong to `frugal plan` itself; refuse them before an action."""
    for flag, value in (("--scenario", args.scenario), ("--cluster", args.cluster)):
        if value is not None:
            raise ValueError(
                f"{flag} {value} applies to `frugal plan` alone, not to `frugal plan {action}`, "
                f"which would ignore it; {instead}"
            )


def _bench(args: argparse.Namespace) -> int:
    import json

    from frugal.bench.planner import PlanBenchConfig, run_plan_bench
    from frugal.config import config_to_dict, load_config

    _no_cluster_flags(args, "bench", "choose scenarios with --set 'scenarios=[\"world\"]'")
    preset = config_to_dict(PlanBenchConfig.quick()) if args.quick else None
    config = load_config(PlanBenchConfig, args.config, args.overrides, base=preset)
    out = output_folder(args.out)
    result = run_plan_bench(config, out, progress=lambda line: print(line, file=sys.stderr))
    print(json.dumps(result.document["summary"], indent=1))
    print(f"wrote {out / 'results.json'}", file=sys.stderr)
    return 0


def _validate(args: argparse.Namespace) -> int:
    import json

    from frugal.bench.plan_validation import Config, quick, run_plan_validation
    from frugal.config import config_to_dict, load_config

    _no_cluster_flags(
        args,
        "validate",
        "it builds its own two-site cluster (--set num_sites=2, --set inter_site_mbps=10, ...)",
    )
    preset = config_to_dict(quick()) if args.quick else None
    config = load_config(Config, args.config, args.overrides, base=preset)
    out = output_folder(args.out)
    result = run_plan_validation(config, out, progress=lambda line: print(line, file=sys.stderr))
    print(json.dumps(result.document["summary"], indent=1))
    print(f"wrote {out / 'results.json'}", file=sys.stderr)
    return 0
