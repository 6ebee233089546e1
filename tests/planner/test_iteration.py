"""The iteration objective on hand-computed cases, and the search under it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from frugal.planner import build_scenario
from frugal.planner.iteration import WorkloadConfig, iteration_cost
from frugal.planner.plan import PlannerConfig, build_plan
from frugal.planner.sim import simulate_iteration
from frugal.planner.topology import Device, Topology


def _pair(delay_ms: float, bandwidth_gbps: float, n: int = 2) -> Topology:
    devices = tuple(Device(name=f"d{i}", host=f"h{i}", site="s") for i in range(n))
    delay = np.full((n, n), delay_ms)
    bandwidth = np.full((n, n), bandwidth_gbps)
    return Topology(devices=devices, delay_ms=delay, bandwidth_gbps=bandwidth)


@pytest.mark.parametrize(
    ("message_latency", "expected_s"), [("serialised", 0.27), ("overlapped", 0.24)]
)
def test_two_stage_gpipe_by_hand(message_latency: str, expected_s: float) -> None:
    # 1 replica x 2 stages, 1 layer each, tau = 0.04 s -> f = 0.01, g = 0.03 per stage.
    # Activation: 1 x 1 x 936 values x 2 B + the 128 B header = 2000 B = 16,000 bits at
    # 0.0016 Gbps = 0.01 s, + 10 ms
    # delay -> x0 = 0.02 s (the last stage sends nothing). M = 4, A = 1.
    # serialised (the link is held for the delay too, o0 = x0 = 0.02):
    #   T_fwd = (0.01 + 0.02) + (0.01 + 0) + 3 * max(0.02, 0.01) = 0.10
    #   T_bwd = (0.03 + 0.02) + (0.03 + 0) + 3 * 0.03 = 0.17 -> 0.27 s.
    # overlapped (the link is busy for the 0.01 s transfer only, o0 = 0.01):
    #   T_fwd = 0.04 + 3 * max(0.01, 0.01) = 0.07; T_bwd = 0.17 -> 0.24 s. No DP (1 replica).
    workload = WorkloadConfig(
        num_layers=2, hidden_size=936, seq_len=1, global_batch_size=4,
        microbatches_per_step=4, tau_ref_s=0.04, message_latency=message_latency,  # type: ignore[arg-type]
    )  # fmt: skip
    cost = iteration_cost(_pair(10.0, 0.0016), np.array([[0, 1]]), (1, 1), workload)
    assert cost.pipeline_s == pytest.approx(expected_s)
    assert cost.dp_exposed_s == pytest.approx(0.0)
    assert cost.total_s == pytest.approx(expected_s)
    sim = simulate_iteration(_pair(10.0, 0.0016), np.array([[0, 1]]), (1, 1), workload)
    assert sim.total_s == pytest.approx(expected_s)  # the event simulator agrees exactly


def test_activation_memory_gpipe_vs_1f1b_by_hand() -> None:
    # h = 1024, seq 1024, micro-batch 1, fp16: one activation = 1024 * 1024 * 2 B = 2 MiB; four
    # buffers per micro-batch in flight = 8 MiB. 2 layers of 12 h^2 params at 4 B = 96 MiB.
    # M = 16: GPipe holds 16 in flight on every stage -> 96 + 128 = 224 MiB = 0.21875 GiB.
    # 1F1B with 4 stages holds min(4 - i, 16) = 4, 3, 2, 1 -> 128, 120, 112, 104 MiB.
    from frugal.planner.iteration import microbatches_in_flight, stage_memory_gib

    base = {"num_layers": 8, "hidden_size": 1024, "seq_len": 1024, "global_batch_size": 16,
            "microbatches_per_step": 16}  # fmt: skip
    gpipe = WorkloadConfig(**base)  # type: ignore[arg-type]
    one_f = WorkloadConfig(**base, schedule="1f1b")  # type: ignore[arg-type]
    assert [microbatches_in_flight(gpipe, i, 4) for i in range(4)] == [16] * 4
    assert [microbatches_in_flight(one_f, i, 4) for i in range(4)] == [4, 3, 2, 1]
    assert stage_memory_gib(gpipe, 2, 0, 4) == pytest.approx(224 / 1024)
    mib = [stage_memory_gib(one_f, 2, i, 4) * 1024 for i in range(4)]
    assert mib == pytest.approx([128, 120, 112, 104])
    short = WorkloadConfig(**{**base, "microbatches_per_step": 2}, schedule="1f1b")  # type: ignore[arg-type]
    assert microbatches_in_flight(short, 0, 4) == 2  # never more than M
    with pytest.raises(ValueError, match="stage=4"):
        microbatches_in_flight(gpipe, 4, 4)


def test_a_plan_that_fits_only_under_1f1b_is_rejected_under_gpipe() -> None:
    # 4 devices of 0.2 GiB, 4 stages x 1 replica, 2 layers each: GPipe needs 0.219 GiB on every
    # stage (rejected, naming the stage and the schedule); 1F1B needs at most 0.125 GiB.
    from frugal.planner.plan import InfeasiblePlanError

    devices = tuple(Device(name=f"d{i}", host=f"h{i}", site="s", memory_gib=0.2) for i in range(4))
    top = Topology(devices=devices, delay_ms=np.zeros((4, 4)), bandwidth_gbps=np.full((4, 4), 1.0))
    base = {"num_layers": 8, "hidden_size": 1024, "seq_len": 1024, "global_batch_size": 16,
            "microbatches_per_step": 16}  # fmt: skip
    config = PlannerConfig(num_stages=4, num_replicas=1, budget=5,
                           workload=WorkloadConfig(**base))  # type: ignore[arg-type]  # fmt: skip
    with pytest.raises(InfeasiblePlanError, match=r"stage 0 \(2 layers, gpipe\) needs 0.22 GiB"):
        build_plan(top, config)
    plan = build_plan(top, PlannerConfig(num_stages=4, num_replicas=1, budget=5,
                                         workload=WorkloadConfig(**base, schedule="1f1b")))  # type: ignore[arg-type]  # fmt: skip
    assert plan.num_layers_per_stage == (2, 2, 2, 2)
    # The 1F1B plan is priced by the simulator: one replica, 16 micro-batches, free links.
    sim = simulate_iteration(top, np.array(plan.mesh), (2, 2, 2, 2),
                             WorkloadConfig(**base, schedule="1f1b"), schedule="1f1b")  # type: ignore[arg-type]  # fmt: skip
    assert plan.predicted_cost_s == pytest.approx(sim.total_s)


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


def test_dp_collectives_restricts_the_exchange_the_planner_chooses() -> None:
    # Same pair as above. A central server on one member: the other's 240,000 B go up and
    # come back over the 1 Gbps link, 2 x 240,000 * 8 / 1e9 = 0.00384 s, all exposed.
    base = WorkloadConfig(
        num_layers=1, hidden_size=100, seq_len=1, global_batch_size=2,
        microbatches_per_step=1, tau_ref_s=0.004,
    )  # fmt: skip
    for allowed, name, seconds in (
        ("central_ps", "central_ps", 0.00384),
        ("ring", "ring", 0.00192),
    ):
        workload = dataclasses.replace(base, dp_collectives=(allowed,))
        cost = iteration_cost(_pair(0.0, 1.0), np.array([[0], [1]]), (1,), workload)
        assert cost.collective == (name,)
        assert cost.dp_exposed_s == pytest.approx(seconds)
    with pytest.raises(ValueError, match=r"dp_collectives=\['allreduce'\]: give one or more of"):
        WorkloadConfig(dp_collectives=("allreduce",))
    with pytest.raises(ValueError, match=r"dp_collectives=\[\]"):
        WorkloadConfig(dp_collectives=())


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
    # Same forward link, backward link 10x slower: the prediction must grow (936 fp16 values
    # + the 128 B header = 2000 B per message, as in the test above).
    workload = WorkloadConfig(
        num_layers=2, hidden_size=936, seq_len=1, global_batch_size=4,
        microbatches_per_step=4, tau_ref_s=0.04,
    )  # fmt: skip
    fast = _pair(10.0, 0.0016)
    slow_back = _pair(10.0, 0.0016)
    slow_back.bandwidth_gbps[1, 0] = 0.00016
    a = iteration_cost(fast, np.array([[0, 1]]), (1, 1), workload).total_s
    b = iteration_cost(slow_back, np.array([[0, 1]]), (1, 1), workload).total_s
    # Backward message 0.01 + 0.1 = 0.11 s (serialised, the default: the link is held for it):
    # T_bwd = (0.03 + 0.11) + 0.03 + 3 * 0.11 = 0.50; T_fwd = 0.10 (test above).
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
    assert WorkloadConfig(codec="q2").activation_bytes == 128 + 2048 * (8 + 512)  # header + rows
    assert WorkloadConfig().activation_bytes == 128 + 2048 * 2048 * 2
    # aqsgd:fw2,bw4 prices each direction at its own bits (channel scales: 2 x 2048 bytes);
    # its steady-state forward (every example seen before) is the 2-bit delta.
    aq = WorkloadConfig(codec="aqsgd:fw2,bw4", num_epochs=10**9)
    assert aq.activation_bytes == pytest.approx(128 + 2 * 2048 + 2048 * 2048 * 2 // 8)
    assert aq.gradient_bytes == 128 + 2 * 2048 + 2048 * 2048 * 4 // 8
    assert q2.predicted_cost_s < 0.7 * fp16.predicted_cost_s
    with pytest.raises(ValueError, match="codec 'q9'"):
        WorkloadConfig(codec="q9")


def test_best_ring_equals_brute_force() -> None:
    import itertools

    from frugal.planner.iteration import _ring_seconds

    rng = np.random.default_rng(7)
    n = 6
    delay, bandwidth = rng.uniform(1, 50, (n, n)), rng.uniform(0.1, 2.0, (n, n))
    devices = tuple(Device(name=f"d{i}", host=f"h{i}", site="s") for i in range(n))
    top = Topology(devices=devices, delay_ms=delay, bandwidth_gbps=bandwidth)
    members = np.array([5, 0, 3, 1, 4])
    size = 1e8
    brute = min(
        2 * 4 * (size / 5 * 8 / (min(bandwidth[r[i], r[(i + 1) % 5]] for i in range(5)) * 1e9)
                 + max(delay[r[i], r[(i + 1) % 5]] for i in range(5)) / 1000)
        for r in itertools.permutations(members.tolist())
    )  # fmt: skip
    assert _ring_seconds(members, top, size) == pytest.approx(brute)


def test_aqsgd_first_visits_and_warmup_are_spread_over_the_epochs_by_hand() -> None:
    # h = 64, seq 8, micro-batch 2: a message holds 2 x 8 x 64 = 1024 float32 values, rows =
    # 16, columns = 64. aqsgd:fw2,bw4 (channel scales, fp16 abs-max per column = 128 B):
    #   first visit (both examples new, fp32): 128 + 4 x 1024        = 4224 B
    #   steady (2-bit deltas):                 128 + 128 + 1024 / 4  =  512 B
    #   gradient (4-bit DirectQ):              128 + 128 + 1024 / 2  =  768 B
    #   warm-up (fp32 both ways):              128 + 4 x 1024        = 4224 B
    base = {"hidden_size": 64, "seq_len": 8, "microbatch_size": 2, "global_batch_size": 8,
            "codec": "aqsgd:fw2,bw4"}  # fmt: skip
    one = WorkloadConfig(**base)  # type: ignore[arg-type]
    assert one.message_fractions == (1.0, 0.0)
    assert one.activation_bytes == 4224  # one epoch: every forward is a first visit
    assert one.gradient_bytes == 768
    # 4 epochs: 1/4 first visits -> (4224 + 3 x 512) / 4 = 1440 B; the gradient is unchanged.
    four = WorkloadConfig(**base, num_epochs=4)  # type: ignore[arg-type]
    assert four.activation_bytes == pytest.approx(1440.0)
    assert four.gradient_bytes == 768
    # 4 epochs of 80 samples = 10 iterations each (N = 40), 2 warm-up iterations: 2/40 warm-up
    # messages, 8/40 first visits (the warm-up filled the buffers), 30/40 steady.
    # forward: (2 x 4224 + 8 x 4224 + 30 x 512) / 40 = 1440 B (warm-up forwards are first
    # visits anyway); backward: (2 x 4224 + 38 x 768) / 40 = 940.8 B.
    warm = WorkloadConfig(**base, num_epochs=4, warmup_iterations=2,  # type: ignore[arg-type]
                          num_train_samples=80)  # fmt: skip
    assert warm.message_fractions == pytest.approx((8 / 40, 2 / 40))
    assert warm.activation_bytes == pytest.approx(1440.0)
    assert warm.gradient_bytes == pytest.approx(940.8)
    # fp16 has no first visits: 128 + 2 x 1024 = 2176 B, warm-up only in fp32.
    fp16 = WorkloadConfig(**{**base, "codec": "fp16"}, num_epochs=4)  # type: ignore[arg-type]
    assert fp16.activation_bytes == fp16.gradient_bytes == 2176
    with pytest.raises(ValueError, match=r"warmup_iterations=2 needs .* num_train_samples"):
        WorkloadConfig(**base, warmup_iterations=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match='codec = "auto" has no wire size'):
        _ = WorkloadConfig(codec="auto").activation_bytes


@pytest.mark.parametrize(
    ("message_latency", "expected_s"), [("serialised", 0.27), ("overlapped", 0.24)]
)
def test_a_tcp_window_limits_cross_host_links_in_both_models(
    message_latency: str, expected_s: float
) -> None:
    # The case above on a 3.2 Mbit/s link whose window is 4,000 B: RTT = 2 x 10 ms, so the
    # connection moves 8 x 4,000 / 0.02 = 1.6 Mbit/s, the bandwidth of the case above, and both
    # models give its 0.27 / 0.24 s. Without the window the message would take 0.005 s.
    workload = WorkloadConfig(
        num_layers=2, hidden_size=936, seq_len=1, global_batch_size=4, microbatches_per_step=4,
        tau_ref_s=0.04, message_latency=message_latency, tcp_window_bytes=4_000.0,  # type: ignore[arg-type]
    )  # fmt: skip
    topology, mesh = _pair(10.0, 0.0032), np.array([[0, 1]])
    assert iteration_cost(topology, mesh, (1, 1), workload).total_s == pytest.approx(expected_s)
    assert simulate_iteration(topology, mesh, (1, 1), workload).total_s == pytest.approx(expected_s)
    unlimited = dataclasses.replace(workload, tcp_window_bytes=0.0)
    assert iteration_cost(topology, mesh, (1, 1), unlimited).total_s < expected_s


def test_window_limited_keeps_links_inside_a_host() -> None:
    from frugal.planner.iteration import window_limited

    # d0, d1 on host h0, d2 on h1; 1 Gbit/s, 50 ms one way: 6 MiB over RTT 0.1 s = 0.5033 Gbps.
    devices = tuple(Device(name=f"d{i}", host=f"h{i // 2}", site="s") for i in range(3))
    topology = Topology(devices=devices, delay_ms=np.full((3, 3), 50.0),
                        bandwidth_gbps=np.ones((3, 3)))  # fmt: skip
    limited = window_limited(topology, 6 * 2**20)
    assert limited.bandwidth_gbps[0, 1] == 1.0  # same host
    assert limited.bandwidth_gbps[0, 2] == pytest.approx(0.503316480)
    assert limited.bandwidth_gbps[2, 1] == pytest.approx(0.503316480)
    assert window_limited(topology, 6 * 2**20) is limited  # cached per topology
    assert window_limited(topology, 0.0) is topology
    with pytest.raises(ValueError, match="tcp_window_bytes=-1"):
        WorkloadConfig(tcp_window_bytes=-1.0)


def test_a_window_limit_agrees_between_model_and_simulator_on_two_hosts() -> None:
    # Two hosts of two devices, 2 pipelines across them, 5 ms one way, 0.1 Gbps links and a
    # 25 kB window (8 x 25,000 / 0.01 = 0.02 Gbps per connection): every message is
    # window-limited; both models price the limited links alike.
    devices = tuple(Device(name=f"d{i}", host=f"h{i // 2}", site="s") for i in range(4))
    topology = Topology(devices=devices, delay_ms=np.full((4, 4), 5.0),
                        bandwidth_gbps=np.full((4, 4), 0.1))  # fmt: skip
    workload = WorkloadConfig(num_layers=2, hidden_size=256, seq_len=64, global_batch_size=16,
                              microbatches_per_step=8, tau_ref_s=0.002,
                              message_latency="overlapped", tcp_window_bytes=25_000.0)  # fmt: skip
    mesh = np.array([[0, 2], [1, 3]])
    analytic = iteration_cost(topology, mesh, (1, 1), workload)
    simulated = simulate_iteration(topology, mesh, (1, 1), workload)
    assert simulated.total_s == pytest.approx(analytic.total_s, rel=1e-9)
    unlimited = iteration_cost(topology, mesh, (1, 1), dataclasses.replace(workload,
                               tcp_window_bytes=0.0))  # fmt: skip
    assert analytic.total_s > 1.2 * unlimited.total_s
