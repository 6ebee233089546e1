"""`frugal plan probe`: the cluster file from measurements, and a real probe of emulated links."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from frugal.cli.main import main
from frugal.planner.cluster import load_cluster
from frugal.planner.probe import ProbeConfig, ProbeResult, cluster_toml, sites_of


def _result() -> ProbeResult:
    """5 ranks: host x (ranks 0, 1) and host y (rank 2) 1 ms apart, host z (3, 4) 30 ms away."""
    hosts = ("x", "x", "y", "z", "z")
    delay = np.zeros((5, 5))
    bandwidth = np.zeros((5, 5))
    for a in range(5):
        for b in range(5):
            if a == b:
                continue
            if hosts[a] == hosts[b]:
                delay[a, b], bandwidth[a, b] = 0.01, 50.0
            elif "z" in (hosts[a], hosts[b]):
                # z -> others at 0.2 Gbit/s, others -> z at 0.1 (asymmetric); 30 ms, or 32 ms
                # from rank 2
                delay[a, b] = 32.0 if 2 in (a, b) else 30.0
                bandwidth[a, b] = 0.2 if hosts[a] == "z" else 0.1
            else:
                delay[a, b], bandwidth[a, b] = 1.0 + 0.5 * (a == 1 or b == 1), 2.0
    return ProbeResult(
        hosts=hosts,
        devices=("cpu",) * 5,
        memory_gib=(8.0, 8.0, 4.0, 8.0, 8.0),
        tflops=(1.0, 0.5, 1.0, 2.0, 2.0),
        delay_ms=delay.tolist(),
        bandwidth_gbps=bandwidth.tolist(),
    )


def test_hosts_within_the_site_delay_share_a_site() -> None:
    assert sites_of(_result(), 5.0) == {"x": "site-x", "y": "site-x", "z": "site-z"}
    assert sites_of(_result(), 0.5) == {"x": "site-x", "y": "site-y", "z": "site-z"}
    assert set(sites_of(_result(), 40.0).values()) == {"site-x"}


def test_the_cluster_file_holds_the_medians_and_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(cluster_toml(_result(), ProbeConfig(site_delay_ms=5.0)))
    topology, _ = load_cluster(path)
    names = [d.name for d in topology.devices]
    assert names == ["x-0", "x-1", "y", "z-0", "z-1"]  # devices in rank order
    d, g = topology.delay_ms, topology.bandwidth_gbps
    # Inside host x: its intra link; x and y: the site's link = median of the 4 cross-host
    # pairs each way (1.5, 1.5, 1.0, 1.0 ms -> 1.25 ms).
    assert (d[0, 1], g[0, 1]) == (0.01, 50.0)
    assert d[0, 2] == pytest.approx(1.25) and g[0, 2] == 2.0
    # Between the sites: delays 30 and 32 ms (median of 12 pairs: 30); the bandwidths differ
    # by direction (0.1 vs 0.2 Gbit/s), so each direction is its own entry.
    assert d[0, 3] == 30.0 and d[3, 0] == 30.0
    assert g[0, 3] == pytest.approx(0.1) and g[3, 0] == pytest.approx(0.2)
    # speed relative to the fastest rank (2 TFLOP/s); a host takes its slowest rank's speed
    # and smallest memory.
    speeds = [dev.speed for dev in topology.devices]
    assert speeds == [0.25, 0.25, 0.5, 1.0, 1.0]
    assert [dev.memory_gib for dev in topology.devices] == [8.0, 8.0, 4.0, 8.0, 8.0]


def test_bad_probe_requests_exit_2_before_launching(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    emu = tmp_path / "emu.toml"
    emu.write_text('sites = [{name = "A"}]\nhosts = [{name = "a", site = "A", num_gpus = 3}]\n')
    cases = [
        (["--out", str(tmp_path / "c.json")], "give a .toml path"),
        (["--out", str(tmp_path / "c.toml"), "--nproc-per-node", "1"], "at least 2 ranks"),
        (["--out", str(tmp_path / "c.toml"), "--nnodes", "2"], "needs --rdzv-endpoint"),
        (["--out", str(tmp_path / "c.toml"), "--set", "pings=0"], "pings=0 must be >= 1"),
        (
            ["--out", str(tmp_path / "c.toml"), "--nproc-per-node", "2", "--set",
             f"emulate={emu}"],
            "has 3 devices but --nproc-per-node 2 x --nnodes 1 = 2 ranks",
        ),
    ]  # fmt: skip
    for argv, fragment in cases:
        assert main(["plan", "probe", *argv]) == 2, argv
        assert fragment in capsys.readouterr().err, argv
    assert not list(tmp_path.glob("c*"))  # nothing launched, nothing written


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_a_probe_of_emulated_links_measures_them_and_plans(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    emu = tmp_path / "emu.toml"
    emu.write_text(
        'sites = [{name = "A", delay_ms = 1, bandwidth_gbps = 1},'
        ' {name = "B", delay_ms = 1, bandwidth_gbps = 1}]\n'
        'hosts = [{name = "a0", site = "A"}, {name = "a1", site = "A"},'
        ' {name = "b0", site = "B"}, {name = "b1", site = "B"}]\n'
        'links = [{a = "A", b = "B", delay_ms = 20, bandwidth_gbps = 0.05}]\n'
    )
    out = tmp_path / "measured.toml"
    argv = ["plan", "probe", "--nproc-per-node", "4", "--out", str(out),
            "--set", f"emulate={emu}", "--set", "message_bytes=262144"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    topology, _ = load_cluster(out)
    assert [d.site for d in topology.devices] == ["A", "A", "B", "B"]
    d, g = topology.delay_ms, topology.bandwidth_gbps
    # Real processes, real sleeps: the emulated 20 ms / 50 Mbit/s and 1 ms / 1 Gbit/s come
    # back within 15 % (gloo's own loopback time adds a little to each).
    assert d[0, 2] == pytest.approx(20.0, rel=0.15) and g[0, 2] == pytest.approx(0.05, rel=0.15)
    assert d[0, 1] == pytest.approx(1.0, rel=0.5) and g[0, 1] == pytest.approx(1.0, rel=0.15)
    assert (out.with_suffix(".json")).is_file()
    capsys.readouterr()
    assert main(["plan", "--cluster", str(out), "--set", "workload.num_layers=4",
                 "--set", "workload.global_batch_size=128"]) == 0  # fmt: skip
    assert "iteration cost" in capsys.readouterr().out
    assert main(argv) == 2  # an earlier probe's file is not replaced without --overwrite
    assert "--overwrite" in capsys.readouterr().err
