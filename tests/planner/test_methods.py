"""The search-method registry: built-ins by name, a user's method through build_plan, errors."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from frugal.parallel.plan import Plan
from frugal.planner.methods import METHODS, SearchOutcome, SearchRequest, register_method
from frugal.planner.plan import PlannerConfig, PlannerError, build_plan
from frugal.planner.scenarios import build_scenario


def test_the_built_in_methods_are_registered_in_order() -> None:
    assert METHODS.names() == (
        "ours", "swap", "megatron_default", "megatron_random", "random", "dtfm_ga", "dtfm",
    )  # fmt: skip
    assert METHODS.get("ours").balance_microbatches
    assert not METHODS.get("megatron_default").balance_microbatches


@pytest.fixture
def reversed_megatron() -> Iterator[list[SearchRequest]]:
    seen: list[SearchRequest] = []

    def search(request: SearchRequest) -> SearchOutcome:
        seen.append(request)
        n = request.topology.num_devices
        return SearchOutcome(np.arange(n)[::-1].reshape(request.num_replicas, request.num_stages))

    register_method("reversed", search, description="ranks in reverse order")
    yield seen
    METHODS.unregister("reversed")


def test_a_registered_method_is_planned_and_priced_like_a_built_in(
    reversed_megatron: list[SearchRequest],
) -> None:
    topology = build_scenario("datacenter")
    config = PlannerConfig(num_stages=8, num_replicas=8, method="reversed", budget=7, seed=5)
    plan = build_plan(topology, config)
    (request,) = reversed_megatron
    assert (request.num_stages, request.num_replicas, request.budget, request.seed) == (8, 8, 7, 5)
    assert plan.mesh[0] == tuple(range(63, 55, -1)) and plan.method == "reversed"
    assert Plan.from_json(plan.to_json()) == plan
    plan.validate(topology)
    assert plan.predicted_cost_s > 0


def test_unknown_methods_and_bad_meshes_are_named() -> None:
    with pytest.raises(ValueError, match=r"method='annealing' is not a registered .*ours, swap"):
        PlannerConfig(method="annealing")

    register_method("broken", lambda r: SearchOutcome(np.arange(4).reshape(2, 2)))
    try:
        with pytest.raises(PlannerError, match=r"shape \(2, 2\); expected .* \(8, 8\)"):
            build_plan(build_scenario("datacenter"),
                       PlannerConfig(num_stages=8, num_replicas=8, method="broken"))  # fmt: skip
    finally:
        METHODS.unregister("broken")
