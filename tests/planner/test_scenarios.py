"""Scenario presets against the bundled measurement tables, and the search on them."""

from __future__ import annotations

import csv
import importlib.resources

import numpy as np
import pytest

from frugal.planner import SCENARIOS, build_scenario
from frugal.planner.cost import paper_cost
from frugal.planner.search import (
    check_grid,
    megatron_default_groups,
    random_search,
    site_transversal_groups,
    swap_search,
)


def _csv(name: str) -> list[dict[str, str]]:
    text = importlib.resources.files("frugal.planner").joinpath("data", name).read_text()
    return list(csv.DictReader(text.splitlines()))


def test_tables_ship_with_the_package() -> None:
    assert len(_csv("city_pairs.csv")) == 45  # 10 cities, all pairs
    assert len(_csv("case4_regional_pairs.csv")) == 6


@pytest.mark.parametrize("name", ["datacenter", "spot", "two_sites", "regional", "world"])
def test_paper_scenarios_have_64_devices_and_symmetric_links(name: str) -> None:
    top = build_scenario(name)
    assert top.num_devices == 64
    assert top.is_symmetric()


def test_world_links_match_the_city_table() -> None:
    top = build_scenario("world")
    index = {d.site: i for i, d in reversed(list(enumerate(top.devices)))}  # first device per city
    used = [r for r in _csv("city_pairs.csv") if r["in_case5_worldwide"] == "1"]
    assert len(used) == 28  # 8 cities
    for r in used:
        a, b = index[r["city_a"]], index[r["city_b"]]
        assert top.delay_ms[a, b] == float(r["delay_ms"])
        assert top.bandwidth_gbps[a, b] == float(r["bandwidth_gbps"])
    oregon = [i for i, d in enumerate(top.devices) if d.site == "Oregon"]
    assert top.delay_ms[oregon[0], oregon[1]] == 5.0  # the scheduler's intra-region value
    assert top.bandwidth_gbps[oregon[0], oregon[1]] == 2.0


def test_regional_and_two_sites_values() -> None:
    regional = build_scenario("regional")
    sites = [d.site for d in regional.devices]
    assert sites[:16] == ["Virginia"] * 16
    a, b = sites.index("Virginia"), sites.index("Oregon")
    assert (regional.delay_ms[a, b], regional.bandwidth_gbps[a, b]) == (67.0, 1.15)
    two = build_scenario("two_sites")
    assert (two.delay_ms[0, 40], two.bandwidth_gbps[0, 40]) == (11.0, 1.12)
    assert (two.delay_ms[0, 1], two.bandwidth_gbps[0, 1]) == (1.0, 5.0)


def test_fluidstack_is_asymmetric_as_measured() -> None:
    top = build_scenario("fluidstack_3region")
    sites = [d.site for d in top.devices]
    east, west = sites.index("East"), sites.index("West")
    # bandwidth West(recv) <- East(send) = 0.15 Gbps; East(recv) <- West(send) = 1.17 Gbps
    assert top.bandwidth_gbps[east, west] == 0.15
    assert top.bandwidth_gbps[west, east] == 1.17
    assert not top.is_symmetric()


def test_unknown_scenario_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown scenario 'moon'; choose one of datacenter"):
        build_scenario("moon")
    assert "world" in SCENARIOS


def test_grid_must_match_the_world_size() -> None:
    with pytest.raises(ValueError, match=r"7\*9 = 63 but world_size = 64"):
        check_grid(build_scenario("world"), 7, 9)


def test_spot_scores_every_placement_alike_under_the_paper_cost() -> None:
    # Every cross-instance link is 1.25 Gbps and intra links do not bound the max terms.
    top = build_scenario("spot")
    rng = np.random.default_rng(0)
    costs = {round(paper_cost(top, rng.permutation(64).reshape(8, 8)).total_s, 9) for _ in range(3)}
    assert len(costs) == 1


def test_world_search_beats_megatron_and_random_and_is_deterministic() -> None:
    top = build_scenario("world")
    ours = swap_search(top, 8, 8, budget=40, seed=1)
    again = swap_search(top, 8, 8, budget=40, seed=1)
    assert np.array_equal(ours.groups, again.groups)
    default = paper_cost(top, megatron_default_groups(8, 8))
    rand = random_search(top, 8, 8, budget=20, seed=1)
    assert ours.cost.total_s < default.total_s
    assert ours.cost.total_s < rand.cost.total_s
    # Pipelines inside cities: every activation hop of the chosen mesh stays in one site.
    sites = [d.site for d in top.devices]
    assert all(len({sites[d] for d in pipeline}) == 1 for pipeline in ours.cost.mesh)
    assert site_transversal_groups(top, 8, 8).shape == (8, 8)


def test_dtfm_ga_is_seeded_and_keeps_its_best() -> None:
    from frugal.planner.search import _crossover, dtfm_ga

    rng = np.random.default_rng(0)
    p1, p2 = rng.permutation(16).reshape(4, 4), rng.permutation(16).reshape(4, 4)
    child = _crossover(p1, p2, rng)
    assert sorted(child.ravel().tolist()) == list(range(16))  # still a partition
    top = build_scenario("two_sites")
    first = dtfm_ga(top, 8, 8, budget=40, population=20, seed=5)
    again = dtfm_ga(top, 8, 8, budget=40, population=20, seed=5)
    assert np.array_equal(first.groups, again.groups)  # the released code was unseeded
    initial_best = first.history[0][1]
    assert first.cost.total_s <= initial_best
    assert [c for c, _ in first.history] == sorted(c for c, _ in first.history)


def test_generated_clusters() -> None:
    from frugal.planner.scenarios import city_cluster, mixed_generations

    uneven = build_scenario("world_uneven")
    counts = {}
    for d in uneven.devices:
        counts[d.site] = counts.get(d.site, 0) + 1
    assert counts == {"London": 13, "Oregon": 13, "Ohio": 9, "Virginia": 7, "Tokyo": 7,
                      "Frankfurt": 6, "Seoul": 5, "Ireland": 4}  # fmt: skip
    mixed = mixed_generations(build_scenario("world"), fraction_slow=0.5, factor=0.5, seed=1)
    assert sorted({d.speed for d in mixed.devices}) == [0.5, 1.0]
    assert sum(d.speed == 0.5 for d in mixed.devices) == 32
    assert all(d.memory_gib == 8.0 for d in mixed.devices if d.speed == 0.5)
    with pytest.raises(ValueError, match="unknown city 'Paris'"):
        city_cluster({"Paris": 2})
    two = city_cluster({"Tokyo": 1, "Seoul": 1})
    assert (two.delay_ms[0, 1], two.bandwidth_gbps[0, 1]) == (34.0, 1.1)


def test_kl_pass_regroups_close_devices_and_keeps_a_good_partition() -> None:
    from frugal.planner.search import _kl_pass

    # Devices 0,1 are 1 ms apart, 2,3 too; across the pairs 100 ms.
    hop = np.full((4, 4), 0.1)
    hop[0, 1] = hop[1, 0] = hop[2, 3] = hop[3, 2] = 0.001
    np.fill_diagonal(hop, 0.0)
    mixed = np.array([[0, 2], [1, 3]])
    refined = _kl_pass(mixed, hop)
    assert {frozenset(row.tolist()) for row in refined} == {frozenset({0, 1}), frozenset({2, 3})}
    assert sorted(refined.ravel().tolist()) == [0, 1, 2, 3]  # still a partition of equal groups
    good = np.array([[0, 1], [2, 3]])
    assert np.array_equal(_kl_pass(good, hop), good)
