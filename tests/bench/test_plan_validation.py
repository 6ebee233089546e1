"""`frugal.bench.plan_validation`: topology, link table, calibration, an end-to-end run."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from frugal.bench.plan_validation import (
    Config,
    build_topology,
    link_rows,
    measure_tau_s,
    ranking_agrees,
    run_plan_validation,
    workload_for,
    worst_plan,
)
from frugal.comm.link import LinkSpec
from frugal.pipeline.models import TinyGPT, TinyGPTConfig, build_stages
from frugal.pipeline.runtime import ring_allreduce_s
from frugal.pipeline.train import RunSpec, rank_links, ring_bottleneck
from frugal.planner.plan import Plan, PlannerConfig, build_plan

_FOUR = Config(ranks_per_site=2, num_stages=2)  # 4 ranks: 2 stages x 2 replicas on 2 sites


def test_default_is_eight_processes_and_quick_four() -> None:
    from frugal.bench.plan_validation import quick

    config = Config()
    assert (config.world_size, config.num_stages, config.num_replicas) == (8, 4, 2)
    assert [d.site for d in build_topology(config).devices] == ["site0"] * 4 + ["site1"] * 4
    assert (quick().world_size, quick().num_stages) == (4, 2)


def test_topology_has_fast_sites_and_slow_links_between_them() -> None:
    config = Config(ranks_per_site=2, num_stages=2, intra_site_mbps=200.0, inter_site_mbps=10.0,
                    inter_site_latency_ms=20.0)  # fmt: skip
    topology = build_topology(config)
    assert [d.site for d in topology.devices] == ["site0", "site0", "site1", "site1"]
    assert len({d.host for d in topology.devices}) == 4
    assert topology.bandwidth_gbps[0, 1] == pytest.approx(0.2)  # 200 Mbit/s
    assert topology.bandwidth_gbps[1, 2] == pytest.approx(0.01)  # 10 Mbit/s
    assert topology.delay_ms[3, 0] == 20.0 and topology.delay_ms[2, 3] == 1.0
    assert topology.is_symmetric()


def test_link_rows_map_every_pair_to_the_runtime_link_table() -> None:
    topology = build_topology(_FOUR)
    rows = link_rows(topology)
    assert len(rows) == 12  # 4 x 3 directed pairs
    by_pair = {(a, b): (mbps, ms) for a, b, mbps, ms in rows}
    assert by_pair[(0, 1)] == pytest.approx((200.0, 1.0))
    assert by_pair[(2, 0)] == pytest.approx((10.0, 20.0))
    run = RunSpec(label="x", codec="fp32", steps=1, links=rows)
    table = rank_links(run, 4, math.inf)
    assert table[(0, 2)] == LinkSpec(bandwidth_bits_per_s=10e6, latency_s=0.02)
    assert table[(3, 2)] == LinkSpec(bandwidth_bits_per_s=200e6, latency_s=0.001)
    # a pair missing from the rows keeps the run's default link
    partial = RunSpec(label="x", codec="fp32", steps=1, latency_ms=5.0, links=rows[:1])
    assert rank_links(partial, 4, 1e9)[(3, 1)] == LinkSpec(
        bandwidth_bits_per_s=1e9, latency_s=0.005
    )
    with pytest.raises(ValueError, match="distinct ranks"):
        rank_links(RunSpec(label="x", codec="fp32", steps=1, links=((0, 9, 1.0, 0.0),)), 4, 1e9)


def test_dp_ring_is_priced_on_its_slowest_link() -> None:
    table = rank_links(RunSpec(label="x", codec="fp32", steps=1, links=link_rows(
        build_topology(_FOUR))), 4, math.inf)  # fmt: skip
    link = ring_bottleneck([0, 2], table)
    assert link == LinkSpec(bandwidth_bits_per_s=10e6, latency_s=0.02)
    assert ring_bottleneck([1, 0], table) == LinkSpec(bandwidth_bits_per_s=200e6, latency_s=0.001)
    assert ring_bottleneck([3], table) is None
    # 2 (K-1) (8 S / (K B) + latency) = 2 (8 * 1.75e6 / (2 * 1e7) + 0.02) = 1.44 s
    assert ring_allreduce_s(1_750_000, 2, link) == pytest.approx(1.44)
    # K = 4 on a 100 Mbit/s, 1 ms ring: 6 (8e6 / 4e8 + 0.001) = 0.126 s
    slow = LinkSpec(bandwidth_bits_per_s=1e8, latency_s=0.001)
    assert ring_allreduce_s(1_000_000, 4, slow) == pytest.approx(0.126)
    assert ring_allreduce_s(1_000_000, 1, slow) == 0.0


def test_workload_describes_the_tiny_gpt_job() -> None:
    config = Config(ranks_per_site=2, num_stages=2, micro_batch_size=8, num_microbatches=4)
    workload = workload_for(config, tau_ref_s=0.01)
    gpt = config.gpt
    assert (workload.num_layers, workload.hidden_size, workload.seq_len) == (4, 128, 64)
    assert workload.global_batch_size == 2 * 4 * 8  # 2 replicas x M x b
    assert workload.activation_bytes == 8 * 64 * 128 * 4 + 128  # b x T x H fp32 + header
    # The planner's per-stage gradient bytes add up to what the runtime all-reduces.
    model = TinyGPT(gpt, seed=0)
    stage_bytes = [
        4 * sum(p.numel() for p in stage.parameters()) for stage in build_stages(model, (2, 2))
    ]
    planned = 2 * workload.params_per_layer * workload.gradient_bytes_per_value
    assert 2 * planned == pytest.approx(sum(stage_bytes))
    assert max(abs(planned - b) / b for b in stage_bytes) < 0.05


def test_tau_is_positive_and_leaves_the_thread_count_alone() -> None:
    threads = torch.get_num_threads()
    tau = measure_tau_s(TinyGPTConfig(context=8, hidden=16, num_heads=2, num_layers=2), 2, 3)
    assert 0 < tau < 1.0
    assert torch.get_num_threads() == threads


def test_worst_plan_crosses_sites_in_pipelines_and_dp_groups() -> None:
    config = _FOUR
    topology = build_topology(config)
    workload = workload_for(config, tau_ref_s=0.02)
    reference = build_plan(
        topology,
        PlannerConfig(num_stages=2, num_replicas=2, workload=workload, method="megatron_default"),
    )
    worst = worst_plan(topology, reference, workload)
    site = [d.site for d in topology.devices]
    (a, b), (c, d) = worst.mesh
    assert site[a] != site[b] and site[c] != site[d]  # both pipelines cross the slow link
    assert site[a] != site[c] and site[b] != site[d]  # and so do both DP groups
    assert worst.predicted_cost_s > reference.predicted_cost_s
    Plan.from_json(worst.to_json()).validate(topology)


def test_ranking_agreement_ignores_near_ties_only() -> None:
    predicted = {"a": 1.0, "b": 1.02, "c": 2.0}
    assert ranking_agrees(predicted, {"a": 1.5, "b": 1.4, "c": 3.0})  # a ~ b: a tie
    assert not ranking_agrees(predicted, {"a": 1.5, "b": 1.4, "c": 1.45})
    assert not ranking_agrees({"a": 1.0, "b": 1.5}, {"a": 2.0, "b": 1.9})


def test_config_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="num_sites=1"):
        Config(num_sites=1)
    with pytest.raises(ValueError, match="at most 8"):
        Config(num_sites=3, ranks_per_site=3)
    with pytest.raises(ValueError, match="num_stages=3"):
        Config(num_stages=3)
    with pytest.raises(ValueError, match="steps=2"):
        Config(steps=2, warmup_steps=2)
    with pytest.raises(ValueError, match="at most 16"):
        Config(num_sites=3, ranks_per_site=6, methods=("ours", "megatron_default"))
    with pytest.raises(ValueError, match="ranks_per_host=3"):
        Config(ranks_per_host=3)
    with pytest.raises(ValueError, match="nic_mbps=-1"):
        Config(nic_mbps=-1.0)


def test_sixteen_rank_clusters_share_host_nics_and_scale_the_world_links() -> None:
    from frugal.bench.plan_validation import host_rows, sixteen_ranks

    two = sixteen_ranks("uniform")
    assert (two.world_size, two.num_stages, two.num_replicas) == (16, 4, 4)
    assert "worst" not in two.methods
    topology = build_topology(two)
    hosts = [d.host for d in topology.devices]
    assert hosts[:4] == ["site0-h0", "site0-h0", "site0-h1", "site0-h1"] and len(set(hosts)) == 8
    assert host_rows(topology)[8] == ("site1-h0", 20.0)
    assert workload_for(two, 0.01).tcp_window_bytes == 22_000.0
    world = build_topology(sixteen_ranks("world"))
    assert sorted({d.site for d in world.devices}) == ["site0", "site1", "site2", "site3"]
    # Oregon, Virginia, Tokyo, Frankfurt: the fastest pair (Virginia-Frankfurt, 1.02 Gbps) gets
    # 20 Mbit/s, the longest delay (Tokyo-Frankfurt, 223 ms) 40 ms; Oregon-Virginia 0.79 Gbps
    # and 67 ms -> 20 x 0.79 / 1.02 = 15.49 Mbit/s and 40 x 67 / 223 = 12.02 ms.
    assert world.bandwidth_gbps[4, 12] * 1000 == pytest.approx(20.0)
    assert world.delay_ms[8, 12] == pytest.approx(40.0)
    assert world.bandwidth_gbps[0, 4] * 1000 == pytest.approx(20 * 0.79 / 1.02)
    assert world.delay_ms[4, 0] == pytest.approx(40 * 67 / 223)
    assert world.bandwidth_gbps[0, 1] == pytest.approx(0.2) and world.is_symmetric()


@pytest.mark.slow
@pytest.mark.distributed
def test_validation_runs_each_plan_as_planned(tmp_path: Path) -> None:
    config = Config(
        ranks_per_site=2,
        num_stages=2,
        gpt=TinyGPTConfig(context=32, hidden=64, num_heads=2, num_layers=2),
        micro_batch_size=4,
        num_microbatches=2,
        inter_site_mbps=20.0,
        methods=("megatron_default", "worst"),
        steps=3,
        warmup_steps=1,
        rounds=1,
        calibrate_repeats=3,
        timeout_s=120.0,
    )
    lines: list[str] = []
    document = run_plan_validation(config, tmp_path, progress=lines.append).document
    rows = document["rows"]
    assert [r["method"] for r in rows] == ["megatron_default", "worst"]
    stored = json.loads((tmp_path / "results.json").read_text())
    assert stored["summary"] == document["summary"]
    for row in rows:
        assert row["measured_iteration_s"] > 0 and row["simulated_iteration_s"] > 0
        assert row["executed_as_planned"]
        plan_text = (tmp_path / "plans" / f"{row['method']}.json").read_text().strip()
        assert row["plan_sha256"] == hashlib.sha256(plan_text.encode()).hexdigest()
        ranks = [
            json.loads((tmp_path / "runs" / row["method"] / "round0" / f"rank{r}.json").read_text())
            for r in range(4)
        ]
        plan = Plan.from_json(plan_text)
        assert all(plan.mesh[x["replica"]][x["stage"]] == x["rank"] for x in ranks)
        assert row["mesh"] == [list(m) for m in plan.mesh]
    assert rows[0]["mesh"] == [[0, 2], [1, 3]]  # Megatron's default order
    assert document["summary"]["all_executed_as_planned"] is True
    assert np.isfinite(document["summary"]["sim_vs_measured_max_error"])


def test_cli_rejects_a_bad_setting_before_any_launch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from frugal.cli.main import main

    out = tmp_path / "out"
    assert main(["plan", "validate", "--quick", "--out", str(out), "--set", "num_sites=1"]) == 2
    assert "num_sites=1" in capsys.readouterr().err
    assert not out.exists()
