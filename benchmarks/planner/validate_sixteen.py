"""`frugal plan validate` on 16 emulated ranks: two sites and a world-shaped cluster.

Runs `frugal.bench.plan_validation.sixteen_ranks` for each cluster (16 torchrun processes,
2 ranks per emulated host sharing its NIC, TCP window limit on every link between hosts),
writes `OUT/CLUSTER/results.json` and prints, per cluster, each method's predicted and
measured seconds per iteration, the rankings and the speed-ups of ours over Megatron's
orders (the markdown of benchmarks/planner/RESULTS.md). About 10 minutes on 2 cores.

    OMP_NUM_THREADS=1 python benchmarks/planner/validate_sixteen.py --out reports/validate16
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Literal, get_args

from frugal.bench.plan_validation import run_plan_validation, sixteen_ranks

Cluster = Literal["uniform", "world"]


def main() -> None:
    """Run the clusters named on the command line and print their tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="results folder")
    parser.add_argument(
        "--clusters", nargs="+", choices=get_args(Cluster), default=list(get_args(Cluster))
    )
    args = parser.parse_args()
    for cluster in args.clusters:
        t0 = time.monotonic()
        result = run_plan_validation(
            sixteen_ranks(cluster), args.out / cluster, progress=lambda m: print(m, flush=True)
        )
        s = result.summary
        print(f"\n{cluster}: 16 ranks, {time.monotonic() - t0:.0f} s wall")
        print("| method | simulated s | analytic s | replayed s | measured s | sim error |")
        print("| --- | --- | --- | --- | --- | --- |")
        for r in result.rows:
            print(
                f"| {r['method']} | {r['simulated_iteration_s']:.3f} | "
                f"{r['predicted_iteration_s']:.3f} | {r['replay_simulated_s']:.3f} | "
                f"{r['measured_iteration_s']:.3f} | {100 * r['sim_rel_error']:+.1f} % |"
            )
        print(f"ranking predicted {s.predicted_ranking}, measured {s.measured_ranking}")
        print(f"speed-up predicted {s.speedup_predicted}, measured {s.speedup_measured}, "
              f"replayed {s.speedup_replayed}")  # fmt: skip
        print(s.to_dict(), flush=True)


if __name__ == "__main__":
    main()
