"""The plan collectives (`frugal.comm.collectives`): links, network seconds, 3 gloo ranks."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from frugal.comm.collectives import COLLECTIVES, bottleneck_link
from frugal.comm.link import LinkSpec
from frugal.launch import TorchrunJob, run_torchrun
from frugal.parallel.plan import DP_COLLECTIVES

WORKER = Path(__file__).with_name("_collectives_worker.py")


def test_every_plan_collective_has_a_runtime() -> None:
    assert set(COLLECTIVES) == set(DP_COLLECTIVES)


def test_edges_of_each_collective() -> None:
    ring, central, seq = (COLLECTIVES.get(n) for n in ("ring", "central_ps", "seq_peer"))
    assert ring.edges([4, 1, 7]) == [(4, 1), (1, 7), (7, 4)]
    assert ring.edges([3]) == []
    # The server is the lowest rank (torch's new_group sorts, so it is group rank 0).
    assert central.edges([4, 1, 7]) == [(4, 1), (1, 4), (7, 1), (1, 7)]
    assert seq.edges([0, 2]) == [(0, 2), (2, 0)]
    assert len(seq.edges([0, 1, 2])) == 6


def test_network_seconds_by_hand() -> None:
    # 1,000,000 bytes, 10 Mbit/s, 5 ms: one full message is 0.8 s.
    link = LinkSpec(bandwidth_bits_per_s=10e6, latency_s=0.005)
    ring, central, seq = (COLLECTIVES.get(n) for n in ("ring", "central_ps", "seq_peer"))
    # K = 4: 2 x 3 steps of 0.2 s + 5 ms = 1.23 s (ring and seq_peer alike on one link).
    assert ring.network_s(1_000_000, 4, link) == pytest.approx(1.23)
    assert seq.network_s(1_000_000, 4, link) == pytest.approx(1.23)
    # Server: up and down, each max(0.8 + 0.005, 3 x 0.8) = 2.4 s: 4.8 s.
    assert central.network_s(1_000_000, 4, link) == pytest.approx(4.8)
    # K = 2: max(0.805, 0.8) twice = 1.61 s.
    assert central.network_s(1_000_000, 2, link) == pytest.approx(1.61)
    for spec in (ring, central, seq):
        assert spec.network_s(1_000_000, 1, link) == 0.0
        assert spec.network_s(1_000_000, 4, LinkSpec()) == 0.0
        with pytest.raises(ValueError, match="num_bytes=-1"):
            spec.network_s(-1, 2, link)


def test_bottleneck_link_is_the_slowest_bandwidth_and_largest_latency() -> None:
    table = {
        (0, 1): LinkSpec(bandwidth_bits_per_s=1e9, latency_s=0.01),
        (1, 0): LinkSpec(bandwidth_bits_per_s=1e8, latency_s=0.001),
    }
    assert bottleneck_link([(0, 1), (1, 0)], table) == LinkSpec(
        bandwidth_bits_per_s=1e8, latency_s=0.01
    )
    assert bottleneck_link([], table) is None


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_three_gloo_ranks_sum_alike_by_every_collective(tmp_path: Path) -> None:
    result = run_torchrun(
        TorchrunJob([str(WORKER), str(tmp_path)], nproc=3, timeout_s=200, module=False)
    )
    assert result.ok, result.format()
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    values = [1.0, -2, 3, -4, 5, -6, 7]
    for r in ranks:
        for name in COLLECTIVES:
            # (1 + 2 + 3) / 8 = 0.75 over all; (2 + 3) / 8 = 0.625 over {1, 2}: dyadic, exact.
            assert r["sums"]["all"][name] == [0.75 * v for v in values], name
            if r["rank"] > 0:
                assert r["sums"]["upper"][name] == [0.625 * v for v in values], name
    for name in COLLECTIVES:
        for step in range(2):
            rows = [r["syncs"][f"{m}/{name}"][step] for r in ranks for m in ("none", "fp32-copy")]
            # A user-registered copy of none: the same gradients and bytes on every rank.
            assert all(row == rows[0] for row in rows), (name, step)
            assert rows[0]["bytes"] == rows[0]["analytic"] == 4 * (5 * 3 + 3)
            ring = ranks[0]["syncs"]["none/ring"][step]["grads"]
            # Three summands in another order: equal up to float32 rounding.
            torch.testing.assert_close(torch.tensor(rows[0]["grads"]), torch.tensor(ring))

    # Shaped: the same exact sums, and each member sent what its exchange sends (7 floats,
    # K = 3: ring and seq_peer move 2 (K - 1) chunks of ceil(7 / 3) = 3 floats; central_ps's
    # server sends the sum to the 2 others, each other sends it its vector once).
    sent = {"ring": [48, 48, 48], "seq_peer": [48, 48, 48], "central_ps": [56, 28, 28]}
    for r in ranks:
        for name in COLLECTIVES:
            assert r["shaped_sums"]["all"][name]["sum"] == [0.75 * v for v in values], name
            assert r["shaped_sums"]["all"][name]["sent"] == sent[name][r["rank"]], name
            if r["rank"] > 0:
                assert r["shaped_sums"]["upper"][name]["sum"] == [0.625 * v for v in values]
    # Every DP method agrees shaped and unshaped, up to float rounding (the warm-up step's
    # float32 sum runs as a ring of messages against gloo's all-reduce: another order).
    for r in ranks:
        for method, modes in r["shaped_syncs"].items():
            torch.testing.assert_close(
                torch.tensor(modes["shaped"]), torch.tensor(modes["plain"]),
                rtol=1e-3, atol=1e-4, msg=method,
            )  # fmt: skip
    for method, modes in ranks[0]["shaped_syncs"].items():  # the replicas agree exactly
        assert all(r["shaped_syncs"][method]["shaped"] == modes["shaped"] for r in ranks), method


def test_the_shaped_ring_runs_the_ring_the_planner_prices() -> None:
    from frugal.comm.link import link_table
    from frugal.comm.shaped import best_ring

    # 4 ranks, 10 Mbit/s and 1 ms everywhere except 0 <-> 2 (1 Mbit/s) and 1 <-> 3 (20 ms):
    # the group order 0 -> 1 -> 2 -> 3 -> 0 crosses neither, 0 -> 2 -> ... both. With
    # 10,000-byte chunks: order 0, 1, 2, 3 scores 8 ms + 1 ms; the best ring keeps it.
    fast = LinkSpec(bandwidth_bits_per_s=10e6, latency_s=0.001)
    slow = {(0, 2): LinkSpec(bandwidth_bits_per_s=1e6, latency_s=0.001),
            (1, 3): LinkSpec(bandwidth_bits_per_s=10e6, latency_s=0.02)}  # fmt: skip
    table = link_table(4, fast, {**slow, **{(b, a): s for (a, b), s in slow.items()}})
    assert best_ring([0, 1, 2, 3], table, 10_000) == [0, 1, 2, 3]
    # Given in the order 0, 2, 1, 3 (the mesh's), the ring is reordered around the slow pairs.
    assert best_ring([0, 2, 1, 3], table, 10_000) == [0, 1, 2, 3]
    assert best_ring([0, 2], table, 10_000) == [0, 2]  # two members: one ring
    # A window of 1,250 B over 2 ms RTT (5 Mbit/s) halves every fast link: same choice.
    windowed = {k: replace(v, window_bytes=1_250.0) for k, v in table.items()}
    assert best_ring([0, 2, 1, 3], windowed, 10_000) == [0, 1, 2, 3]
