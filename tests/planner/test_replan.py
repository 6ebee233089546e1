"""Re-planning: warm start from the running plan, fewest moves within the tolerance, bad input."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from frugal.cli.main import main
from frugal.config import ConfigError
from frugal.planner import build_scenario
from frugal.planner.iteration import WorkloadConfig
from frugal.planner.plan import Plan, PlannerConfig, build_plan
from frugal.planner.replan import replan, subset_topology
from frugal.planner.topology import Device, Topology


def _cluster(hosts: list[tuple[str, str, float]]) -> Topology:
    """One GPU per host (name: host + "-0"); 1 ms, 10 Gbps in a site; 20 ms, 1 Gbps across."""
    devices = tuple(
        Device(name=f"{host}-0", host=host, site=site, speed=speed) for host, site, speed in hosts
    )
    sites = np.array([d.site for d in devices])
    same = sites[:, None] == sites[None, :]
    return Topology(
        devices=devices,
        delay_ms=np.where(same, 1.0, 20.0),
        bandwidth_gbps=np.where(same, 10.0, 1.0),
        name="hand",
    )


# 2 stages x 4 replicas of 6 micro-batches a step (24 in all: they split over 1, 2, 3, 4
# replicas), 12 layers, a global batch of 96 (4 steps of 24).
_WORKLOAD = WorkloadConfig(num_layers=12, global_batch_size=96, microbatches_per_step=6)
_CONFIG = PlannerConfig(num_stages=2, num_replicas=4, budget=200, workload=_WORKLOAD)
_HOSTS = [(f"a{i}", "A", 1.0) for i in range(4)] + [(f"b{i}", "B", 1.0) for i in range(4)]


def _old(cluster: Topology) -> Plan:
    return build_plan(cluster, _CONFIG)


def _stage_of(plan: Plan) -> dict[str, int]:
    return {plan.devices[r][0]: i for row in plan.mesh for i, r in enumerate(row)}


def test_subset_topology_keeps_the_links_between_the_chosen_devices() -> None:
    cluster = _cluster(_HOSTS)
    sub = subset_topology(cluster, [5, 0])
    assert [d.name for d in sub.devices] == ["b1-0", "a0-0"]
    assert sub.delay_ms[0, 1] == 20.0 and sub.bandwidth_gbps[0, 1] == 1.0
    with pytest.raises(ValueError, match="distinct"):
        subset_topology(cluster, [1, 1])


def test_a_lost_host_drops_its_pipeline_and_moves_nothing() -> None:
    cluster = _cluster(_HOSTS)
    old = _old(cluster)
    lost = old.devices[old.mesh[1][0]][1]  # replica 1's stage-0 host
    partner = old.devices[old.mesh[1][1]][0]
    result = replan(old, cluster, _CONFIG, without=[lost], tolerance=0.05)
    plan = result.plan
    # 7 devices, 2 stages: 3 replicas of 8 micro-batches (the step's 24 kept, so the job's
    # checkpoint resumes); one device spare.
    assert (plan.world_size, plan.num_replicas, plan.num_stages) == (6, 3, 2)
    assert sum(plan.num_microbatches_per_replica) == sum(old.num_microbatches_per_replica)
    assert plan.global_batch_size == 96
    assert result.removed == (f"{lost}-0",)
    assert result.spare == (partner,)  # the broken pipeline's survivor waits
    assert sorted(r for row in plan.mesh for r in row) == list(range(6))
    assert result.chosen == "warm" and result.moved == ()
    before, after = _stage_of(old), _stage_of(plan)
    assert all(before[name] == stage for name, stage in after.items())  # nobody moved
    assert plan.num_layers_per_stage == old.num_layers_per_stage
    # The new plan's ranks follow the old rank order of its devices.
    order = [name for name, _, _ in old.devices if name in after]
    assert [name for name, _, _ in plan.devices] == order


def test_a_hole_is_filled_by_a_joining_host_which_alone_moves() -> None:
    hosts = _HOSTS[:4]  # a0..a3: 2 stages x 2 replicas
    config = PlannerConfig(num_stages=2, num_replicas=2, budget=100, workload=_WORKLOAD)
    old = build_plan(_cluster(hosts), config)
    lost = old.devices[old.mesh[0][1]][1]  # replica 0 loses its stage-1 host
    cluster = _cluster([*hosts, ("new", "A", 1.0)])
    result = replan(old, cluster, config, without=[lost], with_hosts=["new"], tolerance=10.0)
    assert result.chosen == "warm"  # a huge tolerance: the fewest moves win
    assert result.moved == ("new-0",) and result.added == ("new-0",) and result.spare == ()
    assert _stage_of(result.plan)["new-0"] == 1  # it took the hole at stage 1
    assert result.plan.world_size == 4


def test_the_choice_is_the_fewest_moves_within_the_tolerance() -> None:
    # A slow device in the running plan, two fast hosts join, and the batch (64 = 2 x 4 x 8)
    # still splits into 2 replicas only: keeping the plan moves nothing, while the fastest
    # devices (a slower device swapped out for a joining one) are faster but move.
    hosts = [("a0", "A", 1.0), ("a1", "A", 1.0), ("a2", "A", 0.25), ("a3", "A", 1.0),
             ("a4", "A", 1.0), ("a5", "A", 1.0)]  # fmt: skip
    workload = WorkloadConfig(num_layers=12, global_batch_size=64, microbatches_per_step=8)
    config = PlannerConfig(num_stages=2, num_replicas=2, budget=100, workload=workload)
    cluster = _cluster(hosts)
    for tolerance in (0.0, 0.05, 10.0):
        result = replan(
            build_plan(subset_topology(cluster, [0, 1, 2, 3]), config),
            cluster,
            config,
            with_hosts=["a4", "a5"],
            tolerance=tolerance,
        )
        costs = {name: (moves, s) for name, moves, s in result.candidates}
        assert costs["warm"][0] == 0 and costs["fresh-fastest"][1] < costs["warm"][1]
        best = min(s for _, s in costs.values())
        moves, chosen_s = costs[result.chosen]
        assert chosen_s <= best * (1 + tolerance) + 1e-9
        assert all(m >= moves for m, s in costs.values() if s <= best * (1 + tolerance) + 1e-9)
        assert len(result.moved) == moves
        assert result.plan.predicted_cost_s == pytest.approx(chosen_s, rel=1e-9)
        if tolerance == 0.0:
            assert chosen_s == pytest.approx(best) and "a2-0" in result.spare
        if tolerance == 10.0:
            assert result.chosen == "warm" and result.moved == ()


def test_a_slower_device_offers_a_rebalanced_split_that_moves_every_device() -> None:
    hosts = _HOSTS[:4]
    config = PlannerConfig(num_stages=2, num_replicas=2, budget=100, workload=_WORKLOAD)
    old = build_plan(_cluster(hosts), config)
    lost = old.devices[old.mesh[0][1]][1]
    cluster = _cluster([*hosts, ("slow", "A", 0.5)])
    result = replan(old, cluster, config, without=[lost], with_hosts=["slow"], tolerance=10.0)
    moves = {name: m for name, m, _ in result.candidates}
    # warm: old 6/6 split, only the joining device moves; re-balanced (4/8 or 8/4): all do.
    assert moves["warm"] == 1 and moves["warm-balanced"] == 4
    assert result.chosen == "warm" and result.plan.num_layers_per_stage == (6, 6)
    exact = replan(old, cluster, config, without=[lost], with_hosts=["slow"], tolerance=0.0)
    slow_stage = _stage_of(exact.plan)["slow-0"]
    if exact.plan.num_layers_per_stage != (6, 6):  # a re-balanced split gives it fewer layers
        assert exact.plan.num_layers_per_stage[slow_stage] == 4


@pytest.mark.parametrize(
    ("without", "with_hosts", "fragment"),
    [
        ([], [], "needs --without HOST or --with HOST"),
        (["zz"], [], "no device of the plan runs on host 'zz'; the plan's hosts are a0"),
        ([], ["zz"], "has no host 'zz'; add it to the cluster file"),
        ([], ["a1"], "already in the plan"),
        (["a0"], ["a0"], "given to both"),
        (["a0", "a1", "a2", "a3", "b0", "b1", "b2"], [], "1 devices remain for num_stages=2"),
    ],
)
def test_bad_requests_name_the_value_and_the_fix(
    without: list[str], with_hosts: list[str], fragment: str
) -> None:
    cluster = _cluster(_HOSTS)
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(")):
        replan(_old(cluster), cluster, _CONFIG, without=without, with_hosts=with_hosts)


def test_a_cluster_without_the_plans_devices_is_refused() -> None:
    old = _old(_cluster(_HOSTS))
    other = _cluster([(f"x{i}", "A", 1.0) for i in range(8)])
    with pytest.raises(ConfigError, match=r"the plan's device 'a0-0' .* is not in the cluster"):
        replan(old, other, _CONFIG, without=["a1"])


def test_a_batch_that_does_not_split_keeps_fewer_replicas_and_says_which_batch_would() -> None:
    topology = build_scenario("two_sites")
    config = PlannerConfig(num_stages=8, num_replicas=8, budget=50)  # batch 1024
    old = build_plan(topology, config)
    result = replan(old, topology, config, without=[topology.devices[0].host])
    assert result.plan.num_replicas == 4  # the step's 8 x 64 micro-batches split over 4, not 7
    assert sum(result.plan.num_microbatches_per_replica) == 512  # the step is kept
    assert len(result.spare) == 63 - 32
    assert any("512 micro-batches do not split over 7 replicas" in n for n in result.notes)


def test_the_plans_own_global_batch_and_schedule_are_kept_over_the_settings() -> None:
    cluster = _cluster(_HOSTS)
    config = replace(_CONFIG, workload=replace(_WORKLOAD, schedule="1f1b"))
    old = build_plan(cluster, config)
    assert (old.global_batch_size, old.schedule) == (96, "1f1b")
    # Re-planned with the default settings (batch 1,024, GPipe): the plan's own win.
    plain = PlannerConfig(num_stages=2, budget=100, workload=WorkloadConfig(num_layers=12))
    result = replan(old, cluster, plain, without=[old.devices[old.mesh[0][0]][1]])
    assert (result.plan.global_batch_size, result.plan.schedule) == (96, "1f1b")
    # Candidates are priced as the plan is (1F1B simulated), so the chosen one's price is
    # the plan's prediction.
    chosen = {name: s for name, _, s in result.candidates}[result.chosen]
    assert chosen == pytest.approx(result.plan.predicted_cost_s, rel=1e-9)
    with pytest.raises(ConfigError, match="num_stages=3 but the plan has 2 stages"):
        replan(old, cluster, replace(plain, num_stages=3), without=["a0"])
    odd = replace(old, global_batch_size=0)  # not recorded: the settings' must fit the plan
    bad = replace(plain, workload=replace(plain.workload, global_batch_size=1000))
    with pytest.raises(ConfigError, match=r"does not divide workload\.global_batch_size=1000"):
        replan(odd, cluster, bad, without=["a0"])


def test_cli_replan_writes_the_new_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "c.toml"
    hosts = "\n".join(
        f'  {{name = "{h}", site = "{s}", num_gpus = 1, memory_gib = 16, speed = 1.0}},'
        for h, s, _ in _HOSTS
    )
    cluster.write_text(
        "planner = {num_stages = 2, num_replicas = 4, budget = 100}\n"
        "model = {num_layers = 12, global_batch_size = 96, microbatches_per_step = 6}\n"
        'sites = [{name = "A", delay_ms = 1, bandwidth_gbps = 10},'
        ' {name = "B", delay_ms = 1, bandwidth_gbps = 10}]\n'
        f"hosts = [\n{hosts}\n]\n"
        'links = [{a = "A", b = "B", delay_ms = 20, bandwidth_gbps = 1}]\n'
    )
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    assert main(["plan", "--cluster", str(cluster), "--out", str(old)]) == 0
    assert main(["plan", "--cluster", str(cluster), "--replan", str(old), "--without", "b3",
                 "--out", str(new)]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "re-plan: 1 device(s) removed" in err and "<- chosen" in err
    plan = Plan.from_json(new.read_text())
    assert plan.world_size == 6 and "b3-0" not in [d[0] for d in plan.devices]
    assert main(["plan", "--cluster", str(cluster), "--without", "b3"]) == 2
    assert "apply to --replan PLAN" in capsys.readouterr().err
    missing = tmp_path / "missing.json"
    assert main(["plan", "--cluster", str(cluster), "--replan", str(missing), "--with", "b3"]) == 2
    assert "no such plan file" in capsys.readouterr().err


def test_a_faster_joining_host_replaces_the_slowest_pipeline_moving_only_itself() -> None:
    # 2 stages x 2 replicas: a fast pipeline (f0, f1) and a slow one (s0, s1, speed 0.25); a
    # fast host pair joins, but the step's 16 micro-batches stay on 2 replicas. Putting the
    # joining pipeline in place of the slow one moves only the 2 joining devices.
    hosts = [("f0", "A", 1.0), ("f1", "A", 1.0), ("s0", "A", 0.25), ("s1", "A", 0.25)]
    workload = WorkloadConfig(num_layers=12, global_batch_size=64, microbatches_per_step=8)
    config = PlannerConfig(num_stages=2, num_replicas=2, budget=100, workload=workload)
    old = build_plan(_cluster(hosts), config)
    cluster = _cluster([*hosts, ("n0", "A", 1.0), ("n1", "A", 1.0)])
    result = replan(old, cluster, config, with_hosts=["n0", "n1"], tolerance=0.05)
    costs = {name: (moves, s) for name, moves, s in result.candidates}
    assert costs["warm-joined"][0] == 2 and costs["warm-joined"][1] < 0.7 * costs["warm"][1]
    assert result.chosen == "warm-joined" and set(result.moved) == {"n0-0", "n1-0"}
    assert set(result.spare) == {"s0-0", "s1-0"}
