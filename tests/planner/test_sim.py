"""The event simulator: hand-computed schedules, agreement with the analytic model, NICs."""

from __future__ import annotations

import functools
import math
from dataclasses import replace

import numpy as np
import pytest

from frugal.parallel.schedule import SCHEDULES, register_schedule
from frugal.planner.iteration import WorkloadConfig, iteration_cost
from frugal.planner.plan import PlannerConfig, build_plan
from frugal.planner.scenarios import build_scenario
from frugal.planner.sim import simulate_iteration, simulate_pipelines, simulate_step
from frugal.planner.topology import Device, Topology


def _two_stage(schedule: str, microbatches: int = 2) -> tuple[np.ndarray, np.ndarray]:
    # f = 1 s, g = 3 s per stage; a message takes 0.5 s (1 byte at 2 B/s), no delay.
    return simulate_pipelines(
        np.array([[1.0, 1.0]]),
        np.array([[3.0, 3.0]]),
        np.array([[0, 1]]),
        1.0,
        delay_s_NN=np.zeros((2, 2)),
        bandwidth_bytes_per_s_NN=np.full((2, 2), 2.0),
        host_N=np.array([0, 1]),
        nic_bytes_per_s_N=np.full(2, np.inf),
        microbatches_J=np.array([microbatches]),
        schedule=schedule,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_two_stages_two_microbatches_by_hand(schedule: str) -> None:
    # Stage 1 runs F0 1.5-2.5 and F1 2.5-3.5 (GPipe) or F0, B0 2.5-5.5, F1 5.5-6.5 (1F1B);
    # either way stage 0's last backward ends at 13 s = fill 9 s + one more (f + g) of 4 s.
    end, last_bwd = _two_stage(schedule)
    assert end.tolist() == pytest.approx([13.0])
    assert last_bwd.tolist() == [pytest.approx([13.0, 9.5])]


@pytest.mark.parametrize("scenario", ["datacenter", "world", "spot"])
@pytest.mark.parametrize("method", ["ours", "megatron_default"])
def test_gpipe_simulation_agrees_with_the_analytic_model(scenario: str, method: str) -> None:
    topology = build_scenario(scenario)
    config = PlannerConfig(num_stages=8, num_replicas=8, method=method, budget=50)  # type: ignore[arg-type]
    plan = build_plan(topology, config)
    mesh = np.array(plan.mesh, dtype=np.int64)
    analytic = iteration_cost(topology, mesh, plan.num_layers_per_stage, config.workload)
    simulated = simulate_iteration(topology, mesh, plan.num_layers_per_stage, config.workload)
    assert simulated.total_s == pytest.approx(analytic.total_s, rel=0.01)
    assert simulated.collective == analytic.collective
    assert all(0 < b <= 1 for b in simulated.busy_fraction)


def test_a_shared_nic_serialises_cross_host_messages() -> None:
    # Two pipelines, stage 0 of both on host A, stage 1 on host B; 1 GB messages over 10 Gbps
    # links (0.8 s each). A 10 Gbps NIC carries one at a time: the second pipeline's
    # activation arrives at 1.6 s and its gradient (queued behind the first's on B's NIC out)
    # at 2.4 s.
    args = {
        "delay_s_NN": np.zeros((4, 4)),
        "bandwidth_bytes_per_s_NN": np.full((4, 4), 1.25e9),
        "host_N": np.array([0, 0, 1, 1]),
        "microbatches_J": np.array([1, 1]),
    }
    zeros = np.zeros((2, 2))
    mesh = np.array([[0, 2], [1, 3]])
    free, _ = simulate_pipelines(zeros, zeros, mesh, 1e9, nic_bytes_per_s_N=np.full(4, np.inf),
                                 **args)  # fmt: skip
    shared, _ = simulate_pipelines(zeros, zeros, mesh, 1e9, nic_bytes_per_s_N=np.full(4, 1.25e9),
                                   **args)  # fmt: skip
    assert free.tolist() == pytest.approx([1.6, 1.6])
    assert shared.tolist() == pytest.approx([1.6, 2.4])


def test_the_analytic_model_shares_a_host_nic_between_its_pipelines() -> None:
    def topology(nic_gbps: float) -> Topology:
        devices = tuple(
            Device(name=f"d{k}", host=f"h{k // 2}", site="s", nic_gbps=nic_gbps) for k in range(4)
        )
        return Topology(devices=devices, delay_ms=np.zeros((4, 4)),
                        bandwidth_gbps=np.full((4, 4), 10.0))  # fmt: skip

    workload = WorkloadConfig(num_layers=2, global_batch_size=128, tau_ref_s=1e-6)
    mesh = np.array([[0, 2], [1, 3]])
    free = iteration_cost(topology(math.inf), mesh, (1, 1), workload)
    shared = iteration_cost(topology(10.0), mesh, (1, 1), workload)
    message_s = workload.activation_bytes * 8 / 10e9
    # Communication-bound: per micro-batch one forward and one backward message, at 10 Gbps
    # alone and at 5 Gbps when the two pipelines share the NIC.
    assert free.pipeline_s == pytest.approx(64 * 2 * message_s, rel=0.01)  # A = 1 step of 64
    assert shared.pipeline_s == pytest.approx(2 * free.pipeline_s, rel=0.01)


def test_devices_reject_a_non_positive_nic() -> None:
    device = Device(name="a", host="h", site="s")
    with pytest.raises(ValueError, match="nic_gbps=0"):
        Topology(devices=(replace(device, nic_gbps=0.0),), delay_ms=np.zeros((1, 1)),
                 bandwidth_gbps=np.ones((1, 1)))  # fmt: skip


def test_simulate_iteration_rejects_layers_that_do_not_sum() -> None:
    topology = build_scenario("datacenter")
    mesh = np.arange(64, dtype=np.int64).reshape(8, 8)
    with pytest.raises(ValueError, match="summing to num_layers=24"):
        simulate_iteration(topology, mesh, (3,) * 7 + (2,), WorkloadConfig())


@pytest.mark.parametrize(("holds", "expected_s"), [(False, 5.2), (True, 9.2)])
def test_message_delay_overlaps_the_next_transfer_as_in_the_link_shaper(
    holds: bool, expected_s: float
) -> None:
    # 2 stages, f = 0.1 s, g = 0 s, 3 micro-batches; a message is 0.5 s of transfer + 1 s delay.
    # Overlapped (frugal.comm.link: the link is free again after 8 L / B, the message arrives one
    # delay later): forward messages leave at 0.1, 0.6, 1.1 and arrive at 1.6, 2.1, 2.6; stage 1
    # ends its forwards at 2.7, its backward messages leave at 2.7, 3.2, 3.7 and the last
    # arrives at 3.7 + 1.5 = 5.2. Held (stop-and-wait): forwards arrive at 1.6, 3.1, 4.6; the
    # backwards leave at 4.7, 6.2, 7.7 and the last arrives at 9.2.
    end, _ = simulate_pipelines(
        np.array([[0.1, 0.1]]),
        np.zeros((1, 2)),
        np.array([[0, 1]]),
        1.0,
        delay_s_NN=np.ones((2, 2)),
        bandwidth_bytes_per_s_NN=np.full((2, 2), 2.0),
        host_N=np.array([0, 1]),
        nic_bytes_per_s_N=np.full(2, np.inf),
        microbatches_J=np.array([3]),
        latency_holds_link=holds,
    )
    assert end.tolist() == pytest.approx([expected_s])


def test_step_simulator_by_hand() -> None:
    # 2 stages, 2 micro-batches, GPipe; F = 1 s, B = 2 s; 1,000-byte messages at 8 kbit/s
    # (1 s each). Stage 0: F0 [0,1], F1 [1,2]; link 0->1: act0 [1,2], act1 [2,3].
    # Stage 1: F0 [2,3], F1 [3,4], B0 [4,6], B1 [6,8]; grads back: g0 [6,7], g1 [8,9].
    # Stage 0: B0 [7,9], B1 [9,11] -> step 11 s.
    result = simulate_step(
        schedule="gpipe",
        num_microbatches=2,
        forward_s=[1.0, 1.0],
        backward_s=[2.0, 2.0],
        activation_bytes=[[1_000, 1_000]],
        gradient_bytes=[[1_000, 1_000]],
        bandwidth_bits_per_s=8_000.0,
    )
    assert result.step_time_s == pytest.approx(11.0)
    unshaped = simulate_step(
        schedule="1f1b",
        num_microbatches=4,
        forward_s=[1.0] * 4,
        backward_s=[2.0] * 4,
        activation_bytes=[[1] * 4] * 3,
        gradient_bytes=[[1] * 4] * 3,
        bandwidth_bits_per_s=math.inf,
    )
    assert unshaped.step_time_s == pytest.approx((4 + 4 - 1) * 3.0)  # (m + p - 1)(F + B)


def test_step_simulator_shares_cores_between_co_located_stages() -> None:
    # 2 stages, m = 2, GPipe, F = 1 s, B = 2 s, free links. Two cores: s0 F0 [0,1], F1 [1,2];
    # s1 F0 [1,2], F1 [2,3], B0 [3,5], B1 [5,7]; s0 B0 [5,7], B1 [7,9] -> 9 s. One core runs
    # the 12 s of compute back to back (it is never idle) -> 12 s.
    sim = functools.partial(
        simulate_step, schedule="gpipe", num_microbatches=2, forward_s=[1.0, 1.0],
        backward_s=[2.0, 2.0], activation_bytes=[[0, 0]], gradient_bytes=[[0, 0]],
        bandwidth_bits_per_s=math.inf,
    )  # fmt: skip
    assert sim().step_time_s == pytest.approx(9.0)
    assert sim(num_cores=1).step_time_s == pytest.approx(12.0)
    assert sim(num_cores=2).step_time_s == pytest.approx(9.0)
    # 1.25 cores: a quarter of the way from one core (12 s) to two (9 s).
    assert sim(num_cores=1.25).step_time_s == pytest.approx(11.25)
    with pytest.raises(ValueError, match=r"num_cores=0.5 must be >= 1"):
        sim(num_cores=0.5)


def test_step_simulator_adds_latency_and_the_optimizer_after_the_last_send() -> None:
    # 2 stages, m = 1, GPipe, F = 1 s, B = 2 s, 1,000-byte messages at 8 kbit/s (1 s) landing
    # 0.5 s later. s0 F0 [0,1]; act lands 2.5; s1 F0 [2.5,3.5], B0 [3.5,5.5]; grad lands 7;
    # s0 B0 [7,9]. Optimizer: s0 steps at 9 for 1 s -> 10; s1 after its send landed (7) for
    # 4 s -> 11. The busiest link transferred 1 s.
    step = simulate_step(
        schedule="gpipe", num_microbatches=1, forward_s=[1.0, 1.0], backward_s=[2.0, 2.0],
        activation_bytes=[[1_000]], gradient_bytes=[[1_000]], bandwidth_bits_per_s=8_000.0,
        latency_s=0.5, optimizer_s=[1.0, 4.0],
    )  # fmt: skip
    assert step.step_time_s == pytest.approx(11.0)
    assert step.stage_busy_s == (3.0, 3.0)
    assert step.link_busy_s == pytest.approx(1.0)


def test_a_schedule_that_deadlocks_is_refused_by_name() -> None:
    # Stage 0 waits for B0's gradient before it sends F1; stage 1 wants F1 first.
    def crossed(num_stages: int, stage: int, m: int) -> list[tuple[str, int]]:
        if stage == 0:
            return [("F", 0), ("B", 0), ("F", 1), ("B", 1)]
        return [("F", 1), ("F", 0), ("B", 0), ("B", 1)]

    register_schedule("crossed", crossed)  # type: ignore[arg-type]
    try:
        with pytest.raises(ValueError, match=r"schedule 'crossed' deadlocks at"):
            simulate_step(
                schedule="crossed", num_microbatches=2, forward_s=[1.0, 1.0],
                backward_s=[1.0, 1.0], activation_bytes=[[0, 0]], gradient_bytes=[[0, 0]],
                bandwidth_bits_per_s=math.inf,
            )  # fmt: skip
    finally:
        SCHEDULES.unregister("crossed")


def test_gpipe_simulation_agrees_with_the_analytic_model_under_a_tcp_window() -> None:
    # world: 8 cities, 40-240 ms RTT; a 6 MiB window limits the 0.79-1.16 Gbps links.
    topology = build_scenario("world")
    workload = WorkloadConfig(tcp_window_bytes=6 * 2**20)
    config = PlannerConfig(num_stages=8, num_replicas=8, method="megatron_default",
                           workload=workload)  # fmt: skip
    plan = build_plan(topology, config)
    mesh = np.array(plan.mesh, dtype=np.int64)
    analytic = iteration_cost(topology, mesh, plan.num_layers_per_stage, workload)
    simulated = simulate_iteration(topology, mesh, plan.num_layers_per_stage, workload)
    assert simulated.total_s == pytest.approx(analytic.total_s, rel=0.01)
    free = iteration_cost(topology, mesh, plan.num_layers_per_stage, WorkloadConfig())
    assert analytic.total_s > free.total_s


def test_a_nic_slower_than_the_link_caps_one_message_too() -> None:
    # One 1 GB message over a 10 Gbps link between hosts whose NIC carries 5 Gbps: 1.6 s, as
    # the analytic beta_eff = min(beta, NIC / 1).
    end, _ = simulate_pipelines(
        np.zeros((1, 2)),
        np.zeros((1, 2)),
        np.array([[0, 1]]),
        1e9,
        delay_s_NN=np.zeros((2, 2)),
        bandwidth_bytes_per_s_NN=np.full((2, 2), 1.25e9),
        host_N=np.array([0, 1]),
        nic_bytes_per_s_N=np.full(2, 0.625e9),
        microbatches_J=np.array([1]),
        backward_message_bytes=0.0,
    )
    assert end.tolist() == pytest.approx([1.6])
