"""`frugal plan --scenario NAME | --cluster FILE [--out plan.json]`, bench and validate.

`frugal plan bench` compares methods under the cost models; `frugal plan validate` executes
their plans on emulated links and compares the predictions with the measured runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from frugal.cli.bench import BenchEntry, add_bench
from frugal.cli.options import (
    add_config_arguments,
    add_overwrite_argument,
    config_from_args,
    output_file,
    print_config,
    refuse_earlier_output,
)
from frugal.config import ConfigError

if TYPE_CHECKING:
    from frugal.parallel.plan import Plan
    from frugal.planner.plan import PlannerConfig
    from frugal.planner.topology import Topology

__all__ = ["add_arguments"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of `frugal plan` to its parser."""
    where = parser.add_mutually_exclusive_group()
    from frugal.planner.scenarios import SCENARIOS

    where.add_argument("--scenario", metavar="NAME", help=", ".join(SCENARIOS))
    where.add_argument(
        "--cluster", metavar="FILE", help="a cluster TOML file (sites, hosts, links)"
    )
    parser.add_argument(
        "--out", metavar="FILE", default=None, help="write the plan as JSON (and a PNG beside it)"
    )
    add_overwrite_argument(parser, "the plan file")
    parser.add_argument(
        "--replan",
        metavar="PLAN",
        default=None,
        help="re-plan this running plan after hosts leave (--without) or join (--with): "
        "warm-started, moving as few stages as the cost allows",
    )
    parser.add_argument(
        "--without",
        metavar="HOST",
        action="append",
        default=[],
        help="with --replan: a host that left (repeat for several)",
    )
    parser.add_argument(
        "--with",
        dest="with_hosts",
        metavar="HOST",
        action="append",
        default=[],
        help="with --replan: a host of the cluster that joined (repeat for several)",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=None,
        help="with --replan: accept a plan this fraction slower than the fastest found to "
        "move fewer stages (default 0.05)",
    )
    add_config_arguments(parser)
    parser.set_defaults(handler=_plan)
    children = parser.add_subparsers(dest="plan_command", metavar="[ACTION]")
    add_bench(
        children,
        _bench,
        help="every scenario x model size x method side by side; writes results.json",
        quick_help="every scenario x model cell, search budgets of 300 (about 6 min)",
        out="reports/plan",
        out_help="results folder",
        check=lambda args: _no_cluster_flags(
            args, "bench", "choose scenarios with --set 'scenarios=[\"world\"]'"
        ),
    )
    probe = children.add_parser(
        "probe",
        help="measure delay, bandwidth and speed between the ranks of a torchrun job and "
        "write the cluster file",
        description="Launch --nproc-per-node ranks here (and as many on each of --nnodes "
        "machines running the same command), probe every pair one at a time and write the "
        "cluster TOML that `frugal plan --cluster` reads.",
    )
    probe.add_argument("--out", metavar="FILE", help="the cluster TOML to write (required)")
    probe.add_argument("--nproc-per-node", type=int, default=2, help="ranks on this machine")
    probe.add_argument("--nnodes", type=int, default=1, help="machines in the job")
    probe.add_argument(
        "--rdzv-endpoint",
        default=None,
        help="rendezvous HOST:PORT every machine reaches (with --nnodes > 1)",
    )
    add_overwrite_argument(probe, "the cluster file")
    add_config_arguments(probe)
    probe.set_defaults(handler=_probe)
    add_bench(
        children,
        _validate,
        name="validate",
        help="execute each method's plan on emulated links (torchrun) vs the predictions",
        quick_help="4 ranks, 2 sites, 4 methods, 5 steps each",
        out="reports/plan-validate",
        out_help="results folder",
        check=lambda args: _no_cluster_flags(
            args,
            "validate",
            "it builds its own two-site cluster (--set num_sites=2, --set inter_site_mbps=10, ...)",
        ),
    )


def _plan(args: argparse.Namespace) -> int:
    from frugal.config import load_config
    from frugal.planner.cluster import load_cluster
    from frugal.planner.plan import PlannerConfig, build_plan
    from frugal.planner.scenarios import build_scenario

    out = Path(args.out) if args.out else None
    if out is not None:  # refuse a bad output path before the search, not after it
        if out.is_dir():
            raise ConfigError(f"--out {out} is a folder; give a file name such as plan.json")
        output_file(args.out)
        if out.suffix == ".png":
            raise ConfigError(f"--out {out}: give the .json path; the .png is written beside it")
        if out.with_suffix(".png").is_dir():
            raise ConfigError(
                f"--out {out}: the figure {out.with_suffix('.png')} beside it is a folder; "
                "choose another name"
            )
        refuse_earlier_output(out, args)
    topology: Topology | None
    if args.cluster:
        topology, settings = load_cluster(args.cluster)
        config = load_config(
            PlannerConfig, args.config, args.overrides, base=settings, base_source=args.cluster
        )
    else:
        topology = build_scenario(args.scenario) if args.scenario else None
        config = config_from_args(PlannerConfig, args)
    if print_config(args, config):  # the settings alone need no cluster
        return 0
    if topology is None:
        raise ConfigError("give --scenario NAME or --cluster FILE (or use `frugal plan bench`)")
    if args.replan:
        plan = _replan(args, topology, config)
    else:
        if args.without or args.with_hosts:
            raise ConfigError(
                "--without and --with apply to --replan PLAN; give the plan to change"
            )
        plan = build_plan(topology, config)
    print(plan.table())
    if plan.stop_reason == "time_limit":
        print(
            f"note: the search stopped on its time limit ({config.time_limit_s:g} s) after "
            f"{plan.num_candidates} candidates, so two runs may differ; for a reproducible plan "
            "raise time_limit_s or lower budget until it stops on the budget",
            file=sys.stderr,
        )
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        from frugal.results import write_text_atomically

        write_text_atomically(out, plan.to_json() + "\n")
        from frugal.planner.figure import draw_plan

        draw_plan(plan, out.with_suffix(".png"))
        print(f"wrote {out} and {out.with_suffix('.png')}", file=sys.stderr)
    return 0


def _replan(args: argparse.Namespace, topology: Topology, config: PlannerConfig) -> Plan:
    """`--replan PLAN --without HOST --with HOST`: print the report, return the new plan."""
    from frugal.parallel import plan as plan_format
    from frugal.planner.replan import replan

    path = Path(args.replan)
    if not path.is_file():
        raise ConfigError(
            f"--replan {path}: no such plan file; give the JSON `frugal plan --out` wrote"
        )
    try:
        old = plan_format.Plan.from_json(path.read_text())
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"--replan {path} is not a readable plan: {exc}") from exc
    result = replan(
        old, topology, config, without=args.without, with_hosts=args.with_hosts,
        tolerance=0.05 if args.tolerance is None else args.tolerance,
    )  # fmt: skip
    print(result.table(), file=sys.stderr)
    return result.plan


def _probe(args: argparse.Namespace) -> int:
    from frugal.planner.probe import ProbeConfig, run_probe

    config = config_from_args(ProbeConfig, args)
    if print_config(args, config):
        return 0
    if not args.out:
        raise ConfigError("give --out FILE.toml, the cluster file to write")
    out = Path(args.out)
    if out.suffix != ".toml":
        raise ConfigError(f"--out {out}: give a .toml path (the raw measurements go beside it)")
    if out.is_dir():
        raise ConfigError(f"--out {out} is a folder; give a file name such as cluster.toml")
    output_file(args.out)
    refuse_earlier_output(out, args)
    if args.nproc_per_node < 1 or args.nnodes < 1:
        raise ConfigError(
            f"--nproc-per-node {args.nproc_per_node} and --nnodes {args.nnodes} must be >= 1"
        )
    if args.nproc_per_node * args.nnodes < 2:
        raise ConfigError("a probe needs at least 2 ranks (--nproc-per-node 2 or --nnodes 2)")
    if args.nnodes > 1 and not args.rdzv_endpoint:
        raise ConfigError(
            f"--nnodes {args.nnodes} needs --rdzv-endpoint HOST:PORT, an address every machine "
            "reaches"
        )
    written = run_probe(
        config,
        out,
        nproc=args.nproc_per_node,
        nnodes=args.nnodes,
        rdzv_endpoint=args.rdzv_endpoint,
    )
    if written is None:
        print("this machine's ranks finished; the machine of global rank 0 writes the file")
    else:
        print(written.read_text(), end="")
        print(f"wrote {written} (raw measurements: {written.with_suffix('.json')})",
              file=sys.stderr)  # fmt: skip
    return 0


def _no_cluster_flags(args: argparse.Namespace, action: str, instead: str) -> None:
    """`--scenario`/`--cluster` belong to `frugal plan` itself; refuse them before an action."""
    for flag, value in (("--scenario", args.scenario), ("--cluster", args.cluster)):
        if value is not None:
            raise ConfigError(
                f"{flag} {value} applies to `frugal plan` alone, not to `frugal plan {action}`, "
                f"which would ignore it; {instead}"
            )


def _bench() -> BenchEntry:
    from frugal.bench.planner import PlanBenchConfig, run_plan_bench

    return BenchEntry(config_class=PlanBenchConfig, quick=PlanBenchConfig.quick, run=run_plan_bench)


def _validate() -> BenchEntry:
    from frugal.bench.plan_validation import Config, quick, run_plan_validation

    return BenchEntry(config_class=Config, quick=quick, run=run_plan_validation)
