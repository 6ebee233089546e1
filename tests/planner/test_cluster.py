"""Cluster TOML files: topology built as described, strict errors naming file, key and rule."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from frugal.cli.main import main
from frugal.config import ConfigError
from frugal.planner.cluster import load_cluster
from frugal.planner.plan import Plan

GOOD = """
planner = {num_stages = 2, num_replicas = 3, budget = 5}
model = {num_layers = 4, global_batch_size = 192}
sites = [{name = "Oregon", delay_ms = 5, bandwidth_gbps = 2},
         {name = "Virginia", delay_ms = 5, bandwidth_gbps = 2}]
hosts = [{name = "or0", site = "Oregon", num_gpus = 4, intra_gbps = 100},
         {name = "va0", site = "Virginia", speed = 0.5, memory_gib = 8},
         {name = "va1", site = "Virginia"}]
links = [{a = "Oregon", b = "Virginia", delay_ms = 67, bandwidth_gbps = 0.79}]
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    return path


def test_cluster_file_builds_the_described_topology(tmp_path: Path) -> None:
    topology, settings = load_cluster(_write(tmp_path, GOOD))
    names = [d.name for d in topology.devices]
    assert names == ["or0-0", "or0-1", "or0-2", "or0-3", "va0", "va1"]
    assert topology.bandwidth_gbps[0, 1] == 100.0  # same host
    assert topology.bandwidth_gbps[4, 5] == 2.0  # same site
    assert (topology.delay_ms[0, 4], topology.bandwidth_gbps[4, 0]) == (67.0, 0.79)
    assert topology.devices[4].speed == 0.5
    assert topology.devices[4].memory_gib == 8
    assert settings == {
        "num_stages": 2, "num_replicas": 3, "budget": 5,
        "workload": {"num_layers": 4, "global_batch_size": 192},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (GOOD + "\nextra = 1\n", "unknown key extra"),
        (
            GOOD.replace('site = "Oregon", num_gpus', 'site = "Ohio", num_gpus'),
            "unknown site 'Ohio'",
        ),
        (
            GOOD.replace("bandwidth_gbps = 0.79", "bandwidth_gbps = 0"),
            "bandwidth_gbps = 0.0 must lie in [1e-06, 1e+06]",
        ),
        (
            GOOD.replace("links = [", "links_ = [").split("links_")[0],
            "no link for Oregon->Virginia",
        ),
        (
            GOOD.replace('{name = "va1", site = "Virginia"}', '{name = "va0", site = "Virginia"}'),
            "host 'va0' appears twice",
        ),
        (
            GOOD.replace('{name = "Virginia", delay_ms', '{name = "Oregon", delay_ms'),
            "site 'Oregon' appears twice in sites; rename one",
        ),
        (GOOD.replace("num_gpus = 4,", "num_gpus = 4, colour = 1,"), "unknown key hosts[0].colour"),
        (GOOD.replace("num_layers = 4", "num_layer = 4"), "unknown key model.num_layer"),
        ("sites = [", "not valid TOML"),
        (
            GOOD.replace(
                "links = [",
                'links = [{a = "Oregon", b = "Oregon", delay_ms = 1, bandwidth_gbps = 1}, ',
            ),
            "joins a site to itself",
        ),
        (
            GOOD.replace(
                "links = [",
                'links = [{a = "Virginia", b = "Oregon", delay_ms = 1, bandwidth_gbps = 1}, ',
            ),
            "gives Oregon->Virginia again",
        ),
        (GOOD.replace("speed = 0.5", "speed = 1e-300"), "speed = 1e-300 must lie in"),
        (GOOD.replace("num_gpus = 4,", "num_gpus = 100000000,"), "num_gpus = 100000000 must lie"),
        (GOOD.replace("bandwidth_gbps = 0.79", "bandwidth_gbps = inf"), "must be finite"),
    ],
)
def test_bad_cluster_files(tmp_path: Path, text: str, fragment: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match=re.escape(fragment)) as error:
        load_cluster(path)
    assert str(path) in str(error.value)


def test_cli_plans_a_cluster_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    assert main(["plan", "--cluster", str(_write(tmp_path, GOOD)), "--out", str(out)]) == 0
    plan = Plan.from_json(out.read_text())
    assert (plan.world_size, plan.num_stages, plan.num_replicas) == (6, 2, 3)
    # va0 runs at half speed: its stage gets 1 layer (cost 1 x 2 = 2), the other 3 (3 x 1 = 3),
    # better than 2 + 2 (slowest stage 2 x 2 = 4).
    slow_stage = next(
        i for i in range(2) if any(plan.devices[row[i]][0] == "va0" for row in plan.mesh)
    )
    assert plan.num_layers_per_stage[slow_stage] == 1
    assert sum(plan.num_layers_per_stage) == 4
    assert main(["plan", "--cluster", str(tmp_path / "none.toml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["plan"]) == 2


MIXED = """
model = {num_layers = 5, global_batch_size = 128}
planner = {num_stages = 2, num_replicas = 2, budget = 50}
sites = [{name = "s"}]
hosts = [{name = "small0", site = "s", memory_gib = 2.45},
         {name = "small1", site = "s", memory_gib = 2.45},
         {name = "big0", site = "s", memory_gib = 16},
         {name = "big1", site = "s", memory_gib = 16}]
"""


def test_stages_go_where_they_fit(tmp_path: Path) -> None:
    # 5 layers -> stages of 3 and 2. Stage memory (GiB) = l * 12 * 2048^2 * 4 B / 2^30 + 64
    # micro-batches * 4 buffers * 8 MiB / 2^30: 3 layers 2.5625, 2 layers 2.375. The small
    # devices (2.45 GiB) can only host stage 1.
    out = tmp_path / "plan.json"
    assert main(["plan", "--cluster", str(_write(tmp_path, MIXED)), "--out", str(out)]) == 0
    plan = Plan.from_json(out.read_text())
    assert plan.num_layers_per_stage == (3, 2)
    assert sorted(plan.devices[row[0]][0] for row in plan.mesh) == ["big0", "big1"]


def test_nothing_fits_is_an_infeasible_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny = MIXED.replace("memory_gib = 16", "memory_gib = 1")
    assert main(["plan", "--cluster", str(_write(tmp_path, tiny))]) == 1
    err = capsys.readouterr().err
    assert "needs 2.56 GiB but device" in err


@pytest.mark.parametrize("objective", ["iteration", "paper"])
def test_a_one_gpu_cluster_gets_the_trivial_plan(tmp_path: Path, objective: str) -> None:
    one = 'model = {num_layers = 4, global_batch_size = 128}\nsites = [{name = "A"}]\n'
    one += 'hosts = [{name = "a0", site = "A", num_gpus = 1}]\n'
    for method in (
        "ours",
        "swap",
        "dtfm_ga",
        "dtfm",
        "random",
        "megatron_default",
        "megatron_random",
    ):
        out = tmp_path / f"{method}.json"
        args = ["plan", "--cluster", str(_write(tmp_path, one)), "--out", str(out)]
        assert main([*args, "--set", f"method={method}", "--set", f"objective={objective}"]) == 0
        plan = Plan.from_json(out.read_text())
        assert plan.mesh == ((0,),) and plan.num_layers_per_stage == (4,)
        assert plan.gap == 0.0  # one device: the plan is the lower bound
