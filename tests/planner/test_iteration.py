"""The iteration objective on hand-computed cases, and the search under it."""

from __future__ import annotations

import numpy as np
import pytest

from frugal.planner import build_scenario
from frugal.planner.iteration import WorkloadConfig, iteration_cost
from frugal.planner.plan import PlannerConfig, build_plan
from frugal.planner.topology import Device, Topology


def _pair(delay_ms: float, bandwidth_gbps: float, n: int = 2) -> Topology:
    devices = tuple(Device(name=f"d{i}", host=f"h{i}", site="s") for i in range(n))
    delay = np.full((n, n), delay_ms)
    bandwidth = np.full((n, n), bandwidth_gbps)
    return Topology(devices=devices, delay_ms=delay, bandwidth_gbps=bandwidth)


def test_two_stage_gpipe_by_hand() -> None:
    # 1 replica x 2 stages, 1 layer each, tau = 0.04 s -> f = 0.01, g = 0.03 per stage.
    # Activation: 1 x 1 x 1000 values x 2 B = 16,000 bits at 0.0016 Gbps = 0.01 s, + 10 ms
    # delay -> x0 = 0.02 s (the last stage sends nothing). M = 4, A = 1.
    # T_fwd = (0.01 + 0.02) + (0.01 + 0) + 3 * max(0.02, 0.01) = 0.10
    # T_bwd = (0.03 + 0.02) + (0.03 + 0) + 3 * 0.03 = 0.17 -> 0.27 s; no DP with 1 replica.
    workload = WorkloadConfig(
        num_layers=2, hidden_size=1000, seq_len=1, global_batch_size=4,
        microbatches_per_step=4, tau_ref_s=0.04,
    )  # fmt: skip
    cost = iteration_cost(_pair(10.0, 0.0016), np.array([[0, 1]]), (1, 1), workload)
    assert cost.pipeline_s == pytest.approx(0.27)
    assert cost.dp_exposed_s == pytest.approx(0.0)
    assert cost.total_s == pytest.approx(0.27)


def test_exposed_dp_time_is_what_the_backward_pass_cannot_hide() -> None:
    # 2 replicas x 1 stage: no pipeline slack, so the whole all-reduce is exposed.
    # Gradient: 1 layer x 12 h^2 (h = 100) x 2 B = 240,000 B. Ring of 2 at 1 Gbps, 0 delay:
    # 2 (K-1) (size/K * 8 / 1e9) = 2 * 1 * (120,000 * 8 / 1e9) = 0.00192 s.
    workload = WorkloadConfig(
        num_layers=1, hidden_size=100, seq_len=1, global_batch_size=2,
        microbatches_per_step=1, tau_ref_s=0.004,
    )  # fmt: skip
    cost = iteration_cost(_pair(0.0, 1.0), np.array([[0], [1]]), (1,), workload)
    assert cost.dp_exposed_s == pytest.approx(0.00192)
    assert cost.pipeline_s == pytest.approx(0.004)  # f + g of one micro-batch
    assert cost.collective in (("ring",), ("seq_peer",))  # equal for two members


def test_batch_that_does_not_split_is_refused() -> None:
    with pytest.raises(ValueError, match="must split into 3 replicas"):
        iteration_cost(_pair(0, 1, n=3), np.array([[0], [1], [2]]), (24,), WorkloadConfig())


def test_world_plan_beats_megatron_orders() -> None:
    top = build_scenario("world")
    ours = build_plan(top, PlannerConfig(budget=20, seed=0))
    default = build_plan(top, PlannerConfig(method="megatron_default"))
    shuffled = build_plan(top, PlannerConfig(method="megatron_random", seed=2022))
    assert ours.predicted_cost_s < default.predicted_cost_s
    assert ours.predicted_cost_s < shuffled.predicted_cost_s
    assert shuffled.mesh[0][0] == 0  # Megatron's random order keeps rank 0
    # A valid lower bound, the same for every method on one grid.
    assert {p.lower_bound_s for p in (ours, default, shuffled)} == {ours.lower_bound_s}
    assert all(p.gap >= 0 for p in (ours, default, shuffled))


def test_microbatch_balancing_by_hand() -> None:
    from frugal.planner.iteration import _balance

    # fill = [1, 1], slope = [1, 2], 6 micro-batches: (4, 2) finishes both by 4 s, which is
    # optimal ((3, 3) -> 5 s, (5, 1) -> 5 s).
    assert _balance(np.array([1.0, 1.0]), np.array([1.0, 2.0]), 6).tolist() == [4, 2]


def test_balancing_helps_an_uneven_cluster() -> None:
    top = build_scenario("world_uneven")
    ours = build_plan(top, PlannerConfig(num_stages=8, num_replicas=8, budget=30))
    assert sum(ours.num_microbatches_per_replica) == 8 * 64
    assert len(set(ours.num_microbatches_per_replica)) > 1  # slower pipelines take fewer
    default = build_plan(
        top, PlannerConfig(num_stages=8, num_replicas=8, method="megatron_default")
    )
    assert default.num_microbatches_per_replica == (64,) * 8
    assert ours.predicted_cost_s < default.predicted_cost_s


def test_backward_messages_use_the_reverse_link() -> None:
    # Same forward link, backward link 10x slower: the prediction must grow.
    workload = WorkloadConfig(
        num_layers=2, hidden_size=1000, seq_len=1, global_batch_size=4,
        microbatches_per_step=4, tau_ref_s=0.04,
    )  # fmt: skip
    fast = _pair(10.0, 0.0016)
    slow_back = _pair(10.0, 0.0016)
    slow_back.bandwidth_gbps[1, 0] = 0.00016
    a = iteration_cost(fast, np.array([[0, 1]]), (1, 1), workload).total_s
    b = iteration_cost(slow_back, np.array([[0, 1]]), (1, 1), workload).total_s
    # Backward message 0.01 + 0.1 = 0.11 s: T_bwd = (0.03 + 0.11) + 0.03 + 3 * 0.11 = 0.50.
    assert a == pytest.approx(0.27)
    assert b == pytest.approx(0.10 + 0.50)


def test_the_codec_wire_size_prices_pipeline_messages() -> None:
    # A 2-bit codec sends 2048 x (8 + 512) bytes per micro-batch instead of 2048 x 4096 (fp16),
    # so a communication-bound placement gets faster; compute is unchanged. On the slowest
    # hop (238 ms, 0.342 Gbps) a message takes 0.238 + 67.1 Mbit / 0.342 Gbps = 0.434 s in fp16
    # and 0.238 + 8.5 / 342 = 0.263 s in 2 bits (0.61x): the delay does not shrink.
    top = build_scenario("world")
    fp16 = build_plan(top, PlannerConfig(num_stages=8, num_replicas=8, method="megatron_random",
                                         seed=2022))  # fmt: skip
    q2 = build_plan(top, PlannerConfig(num_stages=8, num_replicas=8, method="megatron_random",
                                       seed=2022, workload=WorkloadConfig(codec="q2")))  # fmt: skip
    assert WorkloadConfig(codec="q2").activation_bytes == 2048 * (8 + 512)
    assert WorkloadConfig().activation_bytes == 2048 * 2048 * 2
    assert q2.predicted_cost_s < 0.7 * fp16.predicted_cost_s
    with pytest.raises(ValueError, match="choose one of"):
        WorkloadConfig(codec="q9")  # type: ignore[arg-type]
