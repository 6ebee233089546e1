"""Candidates to the best known cost: ours vs the DT-FM scheduler (as released and `dtfm_ga`).

Each search runs `budget` candidates per scenario and seed, without a time limit, under the
paper's cost and under frugal's iteration model (GPT3-XL, 24 layers, batch 1,024, 8 x 8).
The best known cost of a scenario is the lowest any run found; a search's candidates to best
is the first candidate count at which its best so far is within `--tolerance` of it. Writes
`results.json` (every curve) and prints the markdown table of benchmarks/planner/RESULTS.md.

    OMP_NUM_THREADS=1 python benchmarks/planner/candidates_to_best.py --out reports/ga
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from frugal.parallel.partition import split_layers
from frugal.planner.cost import PaperCost
from frugal.planner.dtfm import dtfm_scheduler
from frugal.planner.iteration import WorkloadConfig, iteration_cost
from frugal.planner.scenarios import build_scenario
from frugal.planner.search import dtfm_ga, iteration_search, memetic_search
from frugal.planner.topology import Topology

UNLIMITED_S = 1e9


def _paper_runs(top: Topology, budget: int, seed: int) -> dict[str, Any]:
    return {
        "ours": memetic_search(top, 8, 8, budget=budget, seed=seed, time_limit_s=UNLIMITED_S),
        "dtfm": dtfm_scheduler(top, 8, 8, budget=budget, seed=seed),
        "dtfm_released_defects": dtfm_scheduler(
            top, 8, 8, budget=budget, seed=seed, use_released_defects=True
        ),
        "dtfm_population_10": dtfm_scheduler(top, 8, 8, budget=budget, seed=seed, population=10),
        "dtfm_ga": dtfm_ga(top, 8, 8, budget=budget, seed=seed),
    }


def _iteration_runs(top: Topology, budget: int, seed: int) -> dict[str, Any]:
    workload = WorkloadConfig(num_layers=24, global_batch_size=1024)
    layers = split_layers(24, 8)
    cache: dict[tuple[bytes, float], tuple[str, float]] = {}

    def price(mesh: Any) -> float:
        return iteration_cost(top, mesh, layers, workload, balance_microbatches=True,
                              collective_cache=cache).total_s  # fmt: skip

    def fitness(cost: PaperCost) -> float:
        import numpy as np

        return price(np.array(cost.mesh, dtype=np.int64))

    ours = iteration_search(top, 8, 8, layers, workload, budget=budget, seed=seed,
                            time_limit_s=UNLIMITED_S)  # fmt: skip
    dtfm = dtfm_scheduler(top, 8, 8, budget=budget, seed=seed, fitness=fitness)
    ga = dtfm_ga(top, 8, 8, budget=budget, seed=seed)  # searches the paper cost; priced once
    import numpy as np

    ga_s = price(np.array(ga.cost.mesh, dtype=np.int64))
    return {
        "ours": ours,
        "dtfm": dtfm,
        "dtfm_ga": _Final(ga_s, ga.candidates, ga.search_s),
    }


class _Final:
    """A search known only by its final plan's cost (no curve under this model)."""

    def __init__(self, cost_s: float, candidates: int, search_s: float) -> None:
        self.history = ((candidates, cost_s),)
        self.candidates = candidates
        self.search_s = search_s
        self.final_only = True


def _to_best(history: tuple[tuple[int, float], ...], best: float, tolerance: float) -> int | None:
    return next((c for c, v in history if v <= best * (1.0 + tolerance)), None)


def _at(history: tuple[tuple[int, float], ...], candidates: int) -> float | None:
    values = [v for c, v in history if c <= candidates]
    return min(values) if values else None


def main() -> None:
    """Run both studies, write results.json and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="reports/planner-ga", help="results folder")
    parser.add_argument("--paper-budget", type=int, default=2000)
    parser.add_argument("--iteration-budget", type=int, default=600)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--tolerance", type=float, default=1e-6)
    parser.add_argument("--paper-scenarios", nargs="*",
                        default=["two_sites", "regional", "world", "datacenter", "spot",
                                 "world_uneven"])  # fmt: skip
    parser.add_argument("--iteration-scenarios", nargs="*",
                        default=["two_sites", "regional", "world"])  # fmt: skip
    args = parser.parse_args()
    studies: list[tuple[str, list[str], int, Callable[..., dict[str, Any]]]] = [
        ("paper", args.paper_scenarios, args.paper_budget, _paper_runs),
        ("iteration", args.iteration_scenarios, args.iteration_budget, _iteration_runs),
    ]
    rows: list[dict[str, Any]] = []
    for model, scenarios, budget, run in studies:
        for scenario in scenarios:
            top = build_scenario(scenario)
            results: dict[str, list[Any]] = {}
            for seed in args.seeds:
                start = time.perf_counter()
                for method, result in run(top, budget, seed).items():
                    results.setdefault(method, []).append(result)
                print(f"{model} {scenario} seed {seed}: {time.perf_counter() - start:.0f} s",
                      flush=True)  # fmt: skip
            best = min(r.history[-1][1] for runs in results.values() for r in runs)
            for method, runs in results.items():
                rows.append({
                    "model": model, "scenario": scenario, "method": method, "budget": budget,
                    "best_known_s": best, "tolerance": args.tolerance,
                    "final_only": any(getattr(r, "final_only", False) for r in runs),
                    "candidates_to_best": [_to_best(r.history, best, args.tolerance)
                                           for r in runs],
                    "final_s": [r.history[-1][1] for r in runs],
                    "at_100_s": [_at(r.history, 100) for r in runs],
                    "at_500_s": [_at(r.history, 500) for r in runs],
                    "search_s": [r.search_s for r in runs],
                    "curves": [[list(p) for p in r.history] for r in runs],
                })  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in vars(args).items() if k != "out"}
    (out / "results.json").write_text(json.dumps({"config": config, "rows": rows}, indent=1))
    print("| model | scenario | best known (s) | method | candidates to best (per seed) | "
          "best at 100 | best at 500 | final | search s |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")

    def median(values: list[Any]) -> str:
        known = [v for v in values if v is not None]
        return f"{statistics.median(known):.2f}" if known else "-"

    for r in rows:
        hits = ", ".join("-" if c is None else str(c) for c in r["candidates_to_best"])
        if r["final_only"]:
            hits = "(final plan only)" if None in r["candidates_to_best"] else hits
        print(f"| {r['model']} | {r['scenario']} | {r['best_known_s']:.3f} | {r['method']} | "
              f"{hits} | {median(r['at_100_s'])} | {median(r['at_500_s'])} | "
              f"{median(r['final_s'])} | {median(r['search_s'])} |")  # fmt: skip


if __name__ == "__main__":
    main()
