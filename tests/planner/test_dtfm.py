"""The DT-FM scheduler as released (`frugal.planner.dtfm`) and what a plan says of its search."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from frugal.cli.main import main
from frugal.parallel.plan import Plan
from frugal.planner.cost import paper_cost
from frugal.planner.dtfm import KLMove, cyclic_kl_pass, dtfm_crossover, dtfm_scheduler
from frugal.planner.plan import PlannerConfig, build_plan
from frugal.planner.scenarios import build_scenario
from frugal.planner.search import site_transversal_groups


def _three_groups_hop() -> np.ndarray:
    """Hops of 6 devices in groups A = {0, 1}, B = {2, 3}, C = {4, 5}.

    1 inside a group, 3 across, except 0-2 = 0-3 = 6 and 2-4 = 2-5 = 5.
    """
    hop = np.full((6, 6), 3.0)
    for a, b, value in [
        (0, 1, 1),
        (2, 3, 1),
        (4, 5, 1),
        (0, 2, 6),
        (0, 3, 6),
        (2, 4, 5),
        (2, 5, 5),
    ]:
        hop[a, b] = hop[b, a] = value
    np.fill_diagonal(hop, 0.0)
    return hop


def test_a_cyclic_move_among_three_groups_gains_the_hand_computed_amount() -> None:
    # Gain of moving v from home H to group T = mean hop(v, T) - cheapest hop(v, H \ v); each
    # group offers its least attached unlocked device (ties: lowest id).
    # Start: A offers 0: to B (6+6)/2 - 1 = 5, to C 3 - 1 = 2; B offers 2: to A (6+3)/2 - 1 =
    # 3.5, to C (5+5)/2 - 1 = 4; C offers 4: 2 (A), (5+3)/2 - 1 = 3 (B). Best: 0 -> B, 5.
    # Then A = {1} has no movable device; B = {0 locked, 2, 3} offers 2 (home min(6, 1) = 1):
    # to A 3 - 1 = 2, to C 5 - 1 = 4: 2 -> C, 4 (tau, its gain to A: 2).
    # Then C = {2 locked, 4, 5} offers 4 (home 1): to A 3 - 1 = 2, to B (3+3)/2 - 1 = 2 (tie:
    # A, the first): 4 -> A closes the cycle. Prefixes: 5 + tau 2 = 7; 5 + 4 + tau 2 = 11.
    # The cycle 0 -> B, 2 -> C, 4 -> A is kept with gain 11; every group was a target, so the
    # pass ends after this one cycle.
    labels = np.array([0, 0, 1, 1, 2, 2])
    refined, cycles = cyclic_kl_pass(labels, _three_groups_hop(), 3)
    assert refined.tolist() == [1, 0, 2, 1, 0, 2]
    assert cycles == (KLMove(moves=((0, 0, 1), (2, 1, 2), (4, 2, 0)), gain=11.0),)
    assert np.bincount(refined).tolist() == [2, 2, 2]
    # The release's choice of cycles never reaches the last one: with one cycle, no change.
    kept, none = cyclic_kl_pass(labels, _three_groups_hop(), 3, use_released_defects=True)
    assert kept.tolist() == labels.tolist() and none == ()


def test_the_released_crossover_moves_the_lowest_ids_of_overfull_groups() -> None:
    class FivePoints:  # the five devices 0..4 take their parent-1 label
        def permutation(self, n: int) -> np.ndarray:
            return np.arange(n)

    parent1 = np.array([1, 1, 1, 1, 1, 0, 0, 0, 0, 0])
    parent2 = np.array([0, 0, 0, 0, 0, 1, 1, 1, 1, 1])
    child = dtfm_crossover(parent1, parent2, 2, FivePoints())  # type: ignore[arg-type]
    # After the points: group 1 holds all 10; scanning by id, devices 0..4 move to group 0.
    assert child.tolist() == parent2.tolist()


def test_the_scheduler_reaches_the_best_known_two_sites_cost_with_its_first_children() -> None:
    top = build_scenario("two_sites")
    best_known = paper_cost(top, site_transversal_groups(top, 8, 8)).total_s  # 16.087 s
    # A population of 10 random partitions, then 20 children (crossover + one cyclic pass).
    found = dtfm_scheduler(top, 8, 8, budget=30, population=10, seed=0)
    assert found.cost.total_s == pytest.approx(best_known, rel=1e-9)
    first = next(c for c, cost in found.history if cost <= best_known * (1 + 1e-9))
    assert 10 < first <= 30  # a child, well under 100 candidates
    assert found.history[0][1] > 1.3 * best_known  # the random start was far from it


def test_the_scheduler_is_seeded_and_its_plan_is_valid() -> None:
    top = build_scenario("regional")
    first = dtfm_scheduler(top, 8, 8, budget=25, population=10, seed=3)
    again = dtfm_scheduler(top, 8, 8, budget=25, population=10, seed=3)
    assert np.array_equal(first.groups, again.groups) and first.history == again.history
    other = dtfm_scheduler(top, 8, 8, budget=25, population=10, seed=4)
    assert other.history != first.history
    assert first.groups.shape == (8, 8)
    assert sorted(first.groups.ravel().tolist()) == list(range(64))  # every device once
    plan = build_plan(
        top,
        PlannerConfig(num_stages=8, num_replicas=8, method="dtfm", objective="paper", budget=25,
                      seed=3),
    )  # fmt: skip
    assert sorted(r for row in plan.mesh for r in row) == list(range(64))
    assert len(plan.mesh) == 8 and all(len(row) == 8 for row in plan.mesh)
    # The method runs the release's population of 100: 25 candidates are all random.
    alone = dtfm_scheduler(top, 8, 8, budget=25, seed=3)
    assert plan.predicted_cost_s == pytest.approx(alone.cost.total_s)
    assert (plan.num_candidates, plan.stop_reason) == (25, "budget")
    assert Plan.from_json(plan.to_json()) == plan


def test_the_scheduler_minimises_the_iteration_model_under_that_objective() -> None:
    top = build_scenario("two_sites")
    config = PlannerConfig(num_stages=8, num_replicas=8, method="dtfm", budget=12, seed=0)
    plan = build_plan(top, config)
    assert plan.objective == "iteration" and (plan.num_candidates, plan.stop_reason) == (
        12,
        "budget",
    )


@pytest.mark.parametrize("method", ["dtfm", "ours", "random", "dtfm_ga"])
def test_a_plan_records_its_candidates_and_a_budget_stop(method: str) -> None:
    top = build_scenario("two_sites")
    config = PlannerConfig(num_stages=8, num_replicas=8, method=method, objective="paper",
                           budget=7, time_limit_s=600.0)  # fmt: skip
    plan = build_plan(top, config)
    assert (plan.num_candidates, plan.stop_reason) == (7, "budget")
    assert "search: 7 candidates, stopped on its candidate budget" in plan.table()


@pytest.mark.parametrize("method", ["dtfm", "ours", "random"])
def test_a_plan_records_a_time_stop(method: str) -> None:
    top = build_scenario("two_sites")
    # 1 ns: the first candidate is always scored (a search returns a placement), then the
    # clock has run out.
    config = PlannerConfig(num_stages=8, num_replicas=8, method=method, objective="paper",
                           budget=1000, time_limit_s=1e-9)  # fmt: skip
    plan = build_plan(top, config)
    assert plan.stop_reason == "time_limit" and 1 <= plan.num_candidates < 1000
    assert "time limit (two runs may differ)" in plan.table()


def test_a_fixed_placement_records_that_nothing_was_searched() -> None:
    top = build_scenario("two_sites")
    plan = build_plan(top, PlannerConfig(num_stages=8, num_replicas=8, method="megatron_default"))
    assert (plan.num_candidates, plan.stop_reason) == (0, "none")


def test_a_plan_written_before_the_search_record_still_loads() -> None:
    import json

    top = build_scenario("two_sites")
    plan = build_plan(top, PlannerConfig(num_stages=8, num_replicas=8, method="megatron_default"))
    data = json.loads(plan.to_json())
    del data["num_candidates"], data["stop_reason"]
    old = Plan.from_json(json.dumps(data))
    assert (old.num_candidates, old.stop_reason) == (0, "")
    assert "search:" not in old.table()
    with pytest.raises(ValueError, match="stop_reason='tired' must be one of"):
        Plan.from_json(json.dumps(data | {"stop_reason": "tired"}))


def test_the_cli_says_a_time_limited_plan_may_differ(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--scenario", "two_sites", "--set", "num_stages=8", "--set",
            "num_replicas=8", "--set", "time_limit_s=1e-9", "--set", "method=random"]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "stopped on its time limit (1e-09 s)" in err and "two runs may differ" in err


@pytest.fixture
def no_search(monkeypatch: pytest.MonkeyPatch) -> None:
    import frugal.planner.plan

    def search(*args: object, **kwargs: object) -> None:
        raise AssertionError("the search ran before the output was checked")

    monkeypatch.setattr(frugal.planner.plan, "build_plan", search)


@pytest.mark.usefixtures("no_search")
def test_an_unwritable_out_is_refused_before_the_search(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    under_a_file = tmp_path / "a_file"
    under_a_file.write_text("")
    assert main(["plan", "--scenario", "world", "--out", str(under_a_file / "plan.json")]) == 2
    assert "is a file" in capsys.readouterr().err
    (tmp_path / "plan.png").mkdir()  # the figure written beside the plan cannot be
    assert main(["plan", "--scenario", "world", "--out", str(tmp_path / "plan.json")]) == 2
    assert "plan.png beside it is a folder" in capsys.readouterr().err


@pytest.mark.usefixtures("no_search")
@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes anywhere")
def test_a_read_only_out_folder_is_refused_before_the_search(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        assert main(["plan", "--scenario", "world", "--out", str(folder / "plan.json")]) == 2
    finally:
        folder.chmod(0o700)
    assert "cannot write into the folder" in capsys.readouterr().err


def test_a_search_with_nothing_left_to_try_says_it_converged() -> None:
    from frugal.planner.search import swap_search

    # One stage: no two groups to swap between, so the search ends after its 4 seeds.
    found = swap_search(build_scenario("two_sites"), 1, 64, budget=100, time_limit_s=600.0)
    assert (found.candidates, found.stop) == (4, "converged")
