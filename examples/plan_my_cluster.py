"""Plan your own cluster: a cluster TOML -> a placement -> a table and plan.json.

Reads a strict cluster file (sites, hosts, links; see `frugal.planner.cluster`), searches
where each (pipeline stage, data-parallel replica) runs, prints the plan as a table with its
predicted seconds per iteration, compares it with Megatron's default rank order priced by the
same cost model, and writes the plan as JSON (what `frugal pipeline train --plan` reads).

    python examples/plan_my_cluster.py                         # examples/two_sites.toml
    python examples/plan_my_cluster.py --cluster my.toml --out plan.json
    python examples/plan_my_cluster.py --tiny                  # small search budget (the test)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

from frugal.config import config_from_dict
from frugal.planner.cluster import load_cluster
from frugal.planner.plan import Plan, PlannerConfig, build_plan

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> dict[str, object]:
    """Run the example; return the plans it made."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", type=Path, default=HERE / "two_sites.toml")
    parser.add_argument("--out", type=Path, default=None, help="write the plan JSON here")
    parser.add_argument(
        "--tiny", action="store_true", default=os.environ.get("FRUGAL_TINY", "") not in ("", "0")
    )
    args = parser.parse_args(argv)

    topology, settings = load_cluster(args.cluster)  # settings: the file's planner/model tables
    config = config_from_dict(PlannerConfig, settings, source=str(args.cluster))
    if args.tiny:
        config = dataclasses.replace(config, budget=20, time_limit_s=10.0)
    ours = build_plan(topology, config)
    megatron = build_plan(topology, dataclasses.replace(config, method="megatron_default"))

    print(ours.table())
    speedup = megatron.predicted_cost_s / ours.predicted_cost_s
    print(
        f"\nours {ours.predicted_cost_s:.2f} s/iteration, Megatron's default order "
        f"{megatron.predicted_cost_s:.2f} s/iteration ({speedup:.2f}x; predictions of the "
        f"{config.objective!r} cost model)"
    )
    text = ours.to_json()
    if Plan.from_json(text) != ours:  # a plan is data: it round-trips through JSON
        raise RuntimeError("the plan did not round-trip through JSON")
    if args.out is not None:
        args.out.write_text(text)
        print(f"wrote {args.out}")
    return {"plan": ours, "megatron": megatron, "json": text}


if __name__ == "__main__":
    main()
