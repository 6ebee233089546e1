"""`frugal plan bench`: every scenario x model size x method, side by side, in one run.

Rows: `scenario, num_layers, global_batch, method, seed, num_stages, num_replicas,
predicted_iteration_s, best_schedule_s, gap, simulated_gpipe_s, simulated_1f1b_s,
lower_bound_s, paper_cost_s, search_s`. The prediction is the analytic `iteration` model
(GPipe), except for `deepspeed_pp` (Megatron's layout, uniform layers, 1F1B), which the event
simulator (`frugal.planner.sim`) scores; every row also carries both simulated schedules and
`best_schedule_s`, the faster of them. Methods: ours (memetic search), swap (its swap local
search alone at the same budget), ours_grid (ours choosing D_pp x D_dp), and the baselines.
Summary: `world_speedup_vs_megatron_random` (mean over the random seeds, first world cell),
`world_speedup_vs_megatron_default`, the same per world cell and with both sides on their
faster schedule (`*_best_schedule_by_cell`), `search_s_world`, per cell the speed-up of ours
over each baseline, memetic vs swap (iteration table and the paper-cost convergence study at
equal candidates scored), the lower-bound gap of ours under the paper cost, and ours against
the DT-FM paper's scheduler under both cost models (`ours_vs_dtfm_ga_iteration_min`: its GA
plan priced by the iteration model; `ours_vs_dtfm_ga_paper_min`: the convergence study's
paper cost; `ours_vs_dtfm_*`: the same against the scheduler as released, `dtfm`; >= 1 =
never slower). The validation
against measured emulated runs is `frugal plan validate` (`sim_vs_measured_max_error` is null
here; `frugal reproduce` fills it).

References:
    Decentralized Training of Foundation Models in Heterogeneous Environments, NeurIPS 2022,
    arXiv 2206.01288 (section 4: scenarios, GPT3-XL at 24/32/40 layers, batch 1024-4096).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

import numpy as np

from frugal.bench.harness import (
    Bench,
    BenchConfig,
    BenchResult,
    BenchSpec,
    Progress,
    Summary,
    write_bench_results,
)
from frugal.config import check_types
from frugal.parallel.partition import split_layers
from frugal.planner.cost import paper_cost
from frugal.planner.iteration import WorkloadConfig
from frugal.planner.plan import PlannerConfig, build_plan
from frugal.planner.scenarios import build_scenario
from frugal.planner.sim import simulate_iteration

__all__ = [
    "PLAN_BENCH",
    "PlanBenchConfig",
    "PlanValidationSummary",
    "PlannerSummary",
    "run_plan_bench",
]

Method = Literal[
    "ours",
    "swap",
    "ours_grid",
    "megatron_default",
    "megatron_random",
    "deepspeed_pp",
    "random",
    "dtfm_ga",
    "dtfm",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class _Arm:
    """One compared system: a registered planner method and how the bench runs it."""

    method: str
    """The registered planner method (`frugal.planner.methods`) that places the devices."""
    search_shape: bool = False
    """The method also chooses D_pp x D_dp (num_stages = num_replicas = 0)."""
    deepspeed: bool = False
    """DeepSpeed's pipeline engine: uniform layers, priced by its 1F1B simulation."""
    every_random_seed: bool = False
    """One row per `random_seeds` entry instead of one at `seed`."""
    ablation: bool = False
    """Runs in `ablation_scenarios` only."""


_ARMS: dict[Method, _Arm] = {
    "ours": _Arm(method="ours"),
    "swap": _Arm(method="swap", ablation=True),
    "ours_grid": _Arm(method="ours", search_shape=True, ablation=True),
    "megatron_default": _Arm(method="megatron_default"),
    "megatron_random": _Arm(method="megatron_random", every_random_seed=True),
    "deepspeed_pp": _Arm(method="megatron_default", deepspeed=True),
    "random": _Arm(method="random"),
    "dtfm_ga": _Arm(method="dtfm_ga", ablation=True),
    "dtfm": _Arm(method="dtfm", ablation=True),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanBenchConfig(BenchConfig):
    """What `frugal plan bench` runs; `quick()` is the small preset."""

    scenarios: tuple[str, ...] = ("datacenter", "spot", "two_sites", "regional", "world")
    """Scenario presets (see `frugal.planner.scenarios`)."""
    num_layers: tuple[int, ...] = (24, 32, 40)
    """Model depths (GPT3-XL shape)."""
    global_batches: tuple[int, ...] = (1024, 2048, 4096)
    """Sequences per iteration."""
    methods: tuple[Method, ...] = get_args(Method)
    """Placement methods compared: ours (memetic search), swap (its swap local search alone, same
    budget), ours_grid (ours choosing D_pp x D_dp among the factor pairs that split the batch,
    the budget shared), Megatron's default and random rank orders, DeepSpeed's pipeline
    (Megatron's layout, 1F1B, uniform layers), the best of `budget` random placements and the
    DT-FM paper's scheduler twice: dtfm_ga (its genetic algorithm with pair-swap
    Kernighan-Lin, under its own cost, `budget` candidates, whose plan the iteration model
    then prices) and dtfm (the scheduler as released, cyclic Kernighan-Lin, minimising the
    iteration model itself at `budget` candidates)."""
    ablation_scenarios: tuple[str, ...] = (
        "datacenter",
        "spot",
        "two_sites",
        "regional",
        "world",
    )
    """Scenarios where the ablation rows (swap, ours_grid) and the paper's scheduler (dtfm_ga,
    dtfm) run; the others skip them."""
    convergence_scenarios: tuple[str, ...] = (
        "datacenter",
        "spot",
        "two_sites",
        "regional",
        "world",
        "world_uneven",
    )
    """Scenarios of the paper-cost convergence study (symmetric, 64 devices, 8 x 8 grid);
    world_uneven is the case where the structured seeds are not already a local optimum."""
    random_seeds: tuple[int, ...] = (2022, 2023, 2024)
    """Seeds of `megatron_random` (the paper's)."""
    budget: int = 2000
    """Candidates scored by ours and by random, >= 1."""
    convergence_budget: int = 5000
    """Candidates per search in the convergence study under the paper's cost (the paper's GA
    scores 5,000), >= 1."""
    seed: int = 0
    """Seed of ours and of random."""

    def __post_init__(self) -> None:
        check_types(self)
        for name in ("scenarios", "num_layers", "global_batches", "methods", "random_seeds"):
            if not getattr(self, name):
                raise ValueError(f"{name} is empty; list at least one value")
        for name in self.scenarios + self.convergence_scenarios:
            build_scenario(name)  # unknown names fail here, before any work
        if self.budget < 1 or self.convergence_budget < 1:
            raise ValueError(
                f"budget={self.budget} and convergence_budget={self.convergence_budget} must "
                "be >= 1"
            )
        if self.seed < 0 or min(self.random_seeds) < 0:
            raise ValueError(f"seed={self.seed} and random_seeds={self.random_seeds} must be >= 0")

    QUICK: ClassVar = {"budget": 300, "convergence_budget": 300, "ablation_scenarios": ("world",)}
    """`--quick`: every scenario x model cell of the full bench, with search budgets of 300;
    the ablation rows (swap, ours_grid), dtfm_ga and dtfm run in the world scenario only."""
    PRESETS: ClassVar = {
        "quick": {"num_layers": (24,), "global_batches": (1024,)},
        "smoke": {
            "scenarios": ("datacenter", "world"),
            "random_seeds": (2022,),
            "budget": 40,
            "convergence_budget": 40,
        },
    }
    """`quick`: `quick()` on the headline cell only (GPT3-XL 24 layers, batch 1024); `smoke`:
    that cell in the datacenter and world scenarios, one random seed, budgets of 40."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanValidationSummary(Summary):
    """The `"summary"` of `frugal plan validate`'s `results.json`.

    Errors are relative, `|predicted - measured| / measured`, the max over the methods.
    """

    tau_ref_s: float
    """The reference device's forward+backward seconds per block."""
    compute_share: float
    compute_sharing: str
    sim_vs_measured_max_error: float
    analytic_vs_measured_max_error: float
    unshared_sim_vs_measured_max_error: float
    replay_sim_vs_measured_max_error: float
    replay_analytic_vs_measured_max_error: float
    predicted_ranking: list[str]
    """Methods from fastest to slowest by the simulator."""
    analytic_ranking: list[str]
    measured_ranking: list[str]
    ranking_matches: bool
    """The measured times order every pair the simulator separates by > 5%."""
    analytic_ranking_matches: bool
    all_executed_as_planned: bool
    world_size: int | None = None
    """Ranks of the emulated cluster."""
    rel_error_by_method: dict[str, float] = field(default_factory=dict)
    """(simulated - measured) / measured per method."""
    speedup_predicted: dict[str, float] = field(default_factory=dict)
    """`vs_megatron_default` / `vs_megatron_random`: the baseline's simulated seconds per
    iteration over ours (> 1: ours faster), from the a-priori calibration."""
    speedup_measured: dict[str, float] = field(default_factory=dict)
    """The same ratio of the emulated runs' measured seconds."""
    speedup_replayed: dict[str, float] = field(default_factory=dict)
    """The same ratio of the replayed predictions (each rank at its measured pace)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PlannerSummary(Summary):
    """The `"summary"` of `frugal plan bench`'s `results.json`.

    Speed-ups are the baseline's predicted seconds per iteration over ours (> 1: ours faster),
    means over the random seeds. Cell keys read `SCENARIO/L{layers}/B{batch}`; a value whose
    cells were not run is None.
    """

    speedup_of_ours: dict[str, float]
    """Per `SCENARIO/L{layers}/B{batch}/vs_{baseline}`."""
    world_speedup_vs_megatron_random: float | None = None
    """In the world scenario's first cell."""
    world_speedup_vs_megatron_default: float | None = None
    world_speedup_vs_deepspeed_pp: float | None = None
    search_s_world: float | None = None
    """The longest search of ours in the world scenario, s."""
    world_speedup_vs_megatron_random_by_cell: dict[str, float] | None = None
    world_speedup_vs_megatron_random_best_schedule_by_cell: dict[str, float] | None = None
    """Both sides on their faster schedule (GPipe or 1F1B, event simulator)."""
    world_speedup_vs_megatron_default_by_cell: dict[str, float] | None = None
    world_speedup_vs_megatron_default_best_schedule_by_cell: dict[str, float] | None = None
    memetic_vs_swap_iteration_min: float | None = None
    memetic_vs_swap_iteration_max: float | None = None
    ours_vs_dtfm_ga_iteration_min: float | None = None
    """>= 1: never slower than the paper's GA scheduler under the iteration model."""
    ours_vs_dtfm_iteration_min: float | None = None
    """>= 1: never slower than the released DT-FM scheduler (`dtfm`) at equal candidates
    under the iteration model."""
    ours_grid_vs_8x8: dict[str, float] | None = None
    sim_vs_measured_max_error: float | None = None
    """From the emulated validation runs (`validation`); None without them."""
    objective: str
    convergence_paper_cost: dict[str, float]
    """Per `SCENARIO/METHOD`: the paper cost at the equal convergence budget, s."""
    convergence_memetic_vs_swap: dict[str, float]
    convergence_gap_of_ours: dict[str, float]
    """Per scenario: ours over the lower bound of the paper cost, minus 1."""
    ours_vs_dtfm_ga_paper_min: float | None = None
    ours_vs_dtfm_paper_min: float | None = None
    """>= 1: never above the released DT-FM scheduler's paper cost at equal candidates."""
    validation: PlanValidationSummary | None = None
    """`frugal.bench.plan_validation`'s summary where `frugal reproduce` ran it."""


def run_plan_bench(
    config: PlanBenchConfig,
    out_dir: Path,
    *,
    progress: Progress | None = None,
) -> BenchResult[PlannerSummary]:
    """Plan every cell, score it under both objectives, write `results.json`, return the result.

    Returns:
        The typed summary, the rows and the results document.

    Raises:
        OSError: If `out_dir` cannot be written.
    """
    rows: list[dict[str, Any]] = []
    for scenario in config.scenarios:
        topology = build_scenario(scenario)
        for layers in config.num_layers:
            for batch in config.global_batches:
                workload = WorkloadConfig(num_layers=layers, global_batch_size=batch)
                base = PlannerConfig(num_stages=8, num_replicas=8, workload=workload,
                                     budget=config.budget, seed=config.seed)  # fmt: skip
                for method in config.methods:
                    arm = _ARMS[method]
                    if arm.ablation and scenario not in config.ablation_scenarios:
                        continue
                    seeds = config.random_seeds if arm.every_random_seed else (config.seed,)
                    for seed in seeds:
                        start = time.perf_counter()
                        plan_config = replace(base, seed=seed, method=arm.method)
                        if arm.search_shape:
                            plan_config = replace(plan_config, num_stages=0, num_replicas=0)
                        plan = build_plan(topology, plan_config)
                        search_s = time.perf_counter() - start
                        mesh = np.array(plan.mesh, dtype=np.int64)
                        layers_per_stage = plan.num_layers_per_stage
                        if arm.deepspeed:
                            layers_per_stage = split_layers(layers, plan.num_stages)
                        sim_gpipe = simulate_iteration(topology, mesh, layers_per_stage, workload,
                                                       schedule="gpipe")  # fmt: skip
                        sim_1f1b = simulate_iteration(topology, mesh, layers_per_stage, workload,
                                                      schedule="1f1b")  # fmt: skip
                        predicted = sim_1f1b.total_s if arm.deepspeed else plan.predicted_cost_s
                        paper = (
                            paper_cost(topology, np.ascontiguousarray(mesh.T)).total_s
                            if topology.is_symmetric()
                            else None
                        )
                        row = {
                            "scenario": scenario,
                            "num_layers": layers,
                            "global_batch": batch,
                            "method": method,
                            "seed": seed,
                            "num_stages": plan.num_stages,
                            "num_replicas": plan.num_replicas,
                            "predicted_iteration_s": predicted,
                            "best_schedule_s": min(predicted, sim_gpipe.total_s, sim_1f1b.total_s),
                            "gap": predicted / plan.lower_bound_s - 1.0,
                            "simulated_gpipe_s": sim_gpipe.total_s,
                            "simulated_1f1b_s": sim_1f1b.total_s,
                            "lower_bound_s": plan.lower_bound_s,
                            "paper_cost_s": paper,
                            "search_s": search_s,
                            "plan_sha256": plan.sha256,
                        }
                        rows.append(row)
                        if progress is not None:
                            progress(
                                f"{scenario} L={layers} B={batch} {method} seed={seed}: "
                                f"{predicted:.2f} s/iter ({search_s:.1f} s search)"
                            )
    curves = _convergence(config, progress)
    rows.extend(curves)
    summary = _summary(rows)
    summary["convergence_paper_cost"] = {
        f"{r['scenario']}/{r['method']}": r["paper_cost_s"] for r in curves
    }
    costs = {(r["scenario"], r["method"]): r["paper_cost_s"] for r in curves}
    summary["convergence_memetic_vs_swap"] = {  # > 1: ours (memetic) lower at equal budget
        s: costs[(s, "swap")] / costs[(s, "ours")] for s, m in costs if m == "ours"
    }
    summary["convergence_gap_of_ours"] = {r["scenario"]: r["gap"] for r in curves
                                          if r["method"] == "ours"}  # fmt: skip
    for ga in ("dtfm_ga", "dtfm"):
        ga_over_ours = [costs[(s, ga)] / costs[(s, "ours")] for s, m in costs if m == "ours"
                        if (s, ga) in costs]  # fmt: skip
        if ga_over_ours:  # >= 1 everywhere: never slower than the paper's GA under its cost
            summary[f"ours_vs_{ga}_paper_min"] = min(ga_over_ours)
    out_dir.mkdir(parents=True, exist_ok=True)
    _plot_convergence(curves, out_dir / "convergence.png")
    typed = PlannerSummary(**summary)  # a key no field names is a TypeError here
    return write_bench_results("plan", config, rows, typed, out_dir / "results.json")


PLAN_BENCH: Bench[PlanBenchConfig, PlannerSummary] = BenchSpec(
    name="planner", summary_type=PlannerSummary, preset=PlanBenchConfig.preset, run=run_plan_bench
)
"""The planner bench, as `frugal reproduce` runs it."""


def _convergence(
    config: PlanBenchConfig, progress: Callable[[str], None] | None
) -> list[dict[str, Any]]:
    """Best paper cost vs candidates scored for random, the DT-FM GA and ours, per scenario."""
    from frugal.planner.cost import paper_lower_bound
    from frugal.planner.dtfm import dtfm_scheduler
    from frugal.planner.search import (
        SearchResult,
        dtfm_ga,
        memetic_search,
        random_search,
        swap_search,
    )

    rows = []
    for scenario in config.convergence_scenarios:
        topology = build_scenario(scenario)
        if not topology.is_symmetric():
            continue  # the paper's cost needs symmetric links
        if topology.num_devices != 64:
            continue  # the study uses the paper's 8 x 8 grid
        searches: dict[str, Callable[..., SearchResult]] = {
            "random": random_search,
            "dtfm_ga": dtfm_ga,
            "dtfm": dtfm_scheduler,
            "swap": swap_search,
            "ours": memetic_search,
        }
        bound = paper_lower_bound(topology, 8, 8)
        for method, search in searches.items():
            result = search(topology, 8, 8, budget=config.convergence_budget, seed=config.seed)
            rows.append(
                {
                    "scenario": scenario,
                    "method": method,
                    "objective": "paper",
                    "paper_cost_s": result.cost.total_s,
                    "lower_bound_s": bound,
                    "gap": result.cost.total_s / bound - 1.0,
                    "search_s": result.search_s,
                    "candidates": result.candidates,
                    "curve": [list(point) for point in result.history],
                }
            )
            if progress is not None:
                progress(
                    f"convergence {scenario} {method}: paper cost {result.cost.total_s:.2f} s "
                    f"after {result.candidates} candidates ({result.search_s:.1f} s)"
                )
    return rows


def _plot_convergence(curves: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = sorted({r["scenario"] for r in curves})
    if not scenarios:
        return
    fig, axes = plt.subplots(1, len(scenarios), figsize=(4 * len(scenarios), 3.2), squeeze=False)
    for ax, scenario in zip(axes[0], scenarios, strict=True):
        for r in curves:
            if r["scenario"] != scenario:
                continue
            xs = [c for c, _ in r["curve"]] + [r["candidates"]]
            ys = [v for _, v in r["curve"]] + [r["curve"][-1][1]]
            ax.step(xs, ys, where="post", label=r["method"])
        ax.set_title(scenario)
        ax.set_xlabel("candidates scored")
        ax.set_ylabel("best paper cost (s)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _summary(all_rows: list[dict[str, Any]]) -> dict[str, Any]:
    rows = [r for r in all_rows if r.get("objective") != "paper"]  # the iteration table only

    def mean_time(
        scenario: str, method: str, layers: int, batch: int, key: str = "predicted_iteration_s"
    ) -> float | None:
        times = [
            r[key]
            for r in rows
            if (r["scenario"], r["method"], r["num_layers"], r["global_batch"])
            == (scenario, method, layers, batch)
        ]
        return float(np.mean(times)) if times else None

    summary: dict[str, Any] = {"speedup_of_ours": {}}
    cells = sorted(
        {(r["scenario"], r["num_layers"], r["global_batch"]) for r in rows if "num_layers" in r}
    )

    def ratio_by_cell(slower: str, faster: str) -> dict[str, float]:
        """`slower`'s mean time over `faster`'s per cell where both have a non-zero time."""
        ratios = {}
        for scenario, layers, batch in cells:
            slow = mean_time(scenario, slower, layers, batch)
            fast = mean_time(scenario, faster, layers, batch)
            if slow and fast:
                ratios[f"{scenario}/L{layers}/B{batch}"] = slow / fast
        return ratios

    for scenario, layers, batch in cells:
        ours = mean_time(scenario, "ours", layers, batch)
        if ours is None:
            continue
        for baseline in ("swap", "ours_grid", "megatron_default", "megatron_random",
                         "deepspeed_pp", "random", "dtfm_ga", "dtfm"):  # fmt: skip
            other = mean_time(scenario, baseline, layers, batch)
            if other is not None:
                key = f"{scenario}/L{layers}/B{batch}/vs_{baseline}"
                summary["speedup_of_ours"][key] = other / ours
    first = [c for c in cells if c[0] == "world"]
    if first:
        _, layers, batch = first[0]
        ours = mean_time("world", "ours", layers, batch)
        for baseline in ("megatron_random", "megatron_default", "deepspeed_pp"):
            other = mean_time("world", baseline, layers, batch)
            if ours and other:
                summary[f"world_speedup_vs_{baseline}"] = other / ours
        summary["search_s_world"] = max(
            r["search_s"] for r in rows if r["scenario"] == "world" and r["method"] == "ours"
        )
    world_cells = [c for c in cells if c[0] == "world"]
    for baseline in ("megatron_random", "megatron_default"):
        by_cell: dict[str, float] = {}
        best_schedule: dict[str, float] = {}
        for _, layers, batch in world_cells:
            ours = mean_time("world", "ours", layers, batch)
            other = mean_time("world", baseline, layers, batch)
            ours_best = mean_time("world", "ours", layers, batch, "best_schedule_s")
            other_best = mean_time("world", baseline, layers, batch, "best_schedule_s")
            if ours and other:
                by_cell[f"L{layers}/B{batch}"] = other / ours
            if ours_best and other_best:
                best_schedule[f"L{layers}/B{batch}"] = other_best / ours_best
        if by_cell:
            summary[f"world_speedup_vs_{baseline}_by_cell"] = by_cell
            # Both sides on their faster schedule (GPipe or 1F1B, event simulator): Megatron's
            # own schedule is 1F1B, which helps communication-bound placements.
            summary[f"world_speedup_vs_{baseline}_best_schedule_by_cell"] = best_schedule
    memetic_vs_swap = ratio_by_cell("swap", "ours")
    if memetic_vs_swap:
        summary["memetic_vs_swap_iteration_min"] = min(memetic_vs_swap.values())
        summary["memetic_vs_swap_iteration_max"] = max(memetic_vs_swap.values())
    for ga in ("dtfm_ga", "dtfm"):
        vs_paper = [
            v for k, v in summary["speedup_of_ours"].items() if k.endswith(f"/vs_{ga}")
        ]  # >= 1 everywhere: ours is never slower than the paper's scheduler (iteration model)
        if vs_paper:
            summary[f"ours_vs_{ga}_iteration_min"] = min(vs_paper)
    grid = ratio_by_cell("ours", "ours_grid")
    if grid:
        summary["ours_grid_vs_8x8"] = grid
    summary["sim_vs_measured_max_error"] = None  # needs frugal.pipeline (emulated runs)
    summary["objective"] = "iteration (analytic GPipe model; see frugal.planner.iteration)"
    return summary
