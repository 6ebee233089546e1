"""The bench's grid, rows and summary (no training: rows are built by hand)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from frugal.bench.recsys import RecsysBenchConfig, _cells, _summary, distinct_train_ids
from frugal.config import config_to_dict
from frugal.recsys.config import RecsysTrainConfig
from frugal.recsys.datasets import RecsysDataConfig, load_recsys_data


def _row(mode: str, k: int | None, auc: float, tput: float, seed: int = 0) -> dict:
    return {
        "mode": mode, "dataset": "criteo_zipf", "staleness": k, "rtt_ms": 5.0, "seed": seed,
        "test_auc": auc, "samples_per_s": tput, "max_staleness_seen": 3, "staleness_bound": 15,
    }  # fmt: skip


def test_quick_grid_runs_sync_once_and_each_k_for_the_others() -> None:
    config = RecsysBenchConfig.quick()
    cells = _cells(config, "criteo_zipf", 5.0)
    assert cells == [("sync", 1), ("hybrid", 4), ("hybrid", 16), ("async", 16)]
    train = config.train_config("hybrid", "criteo_zipf", 16, 5.0, 0)
    assert isinstance(train, RecsysTrainConfig)
    assert (train.staleness, train.rtt_ms, train.nproc) == (16, 5.0, 2)
    assert train.data.zipf_num_samples == 200_000
    every = _cells(replace(config, async_staleness=None), "criteo_zipf", 5.0)
    assert every[-2:] == [("async", 4), ("async", 16)]
    with pytest.raises(ValueError, match=r"async_staleness=\(\) must be non-empty"):
        replace(config, async_staleness=())


def test_summary_ratios_and_gaps() -> None:
    config = RecsysBenchConfig(
        datasets=("criteo_zipf",), staleness=(4, 16), rtt_ms=(5.0,), seeds=(0,)
    )
    rows = [
        _row("sync", None, 0.70, 100.0),
        _row("hybrid", 4, 0.699, 250.0),
        _row("hybrid", 16, 0.6985, 300.0),
        _row("async", 4, 0.695, 260.0),
        _row("async", 16, 0.690, 310.0),
    ]
    summary = _summary(config, rows)
    entry = summary.datasets["criteo_zipf"]
    assert summary.staleness == 4 and summary.rtt_ms == 5.0
    assert entry.auc_gap_hybrid_vs_sync == pytest.approx(-0.001)
    assert entry.auc_gap_async_vs_sync == pytest.approx(-0.005)
    assert entry.throughput_hybrid_over_sync == pytest.approx(2.5)
    assert entry.max_abs_auc_gap_hybrid_k_le_16 == pytest.approx(0.0015)
    assert entry.max_abs_auc_gap_hybrid_k_le_16_seed_mean == pytest.approx(0.0015)
    # Two seeds: the per-run maximum vs the largest gap of the seed means (sync 0.7005).
    seeds = replace(config, seeds=(0, 1))
    second = [r | {"seed": 1} for r in rows]
    second[0]["test_auc"], second[2]["test_auc"] = 0.701, 0.7005
    two = _summary(seeds, rows + second).datasets["criteo_zipf"]
    assert two.max_abs_auc_gap_hybrid_k_le_16 == pytest.approx(0.002)  # seed 1, K = 4
    assert two.max_abs_auc_gap_hybrid_k_le_16_seed_mean == pytest.approx(0.0015)  # K = 4
    assert entry.mean_auc_gap_hybrid_minus_async_k_ge_16 == pytest.approx(0.0085)
    assert summary.staleness_within_bound is True
    rows[1]["max_staleness_seen"] = 16
    assert _summary(config, rows).staleness_within_bound is False
    # async measured at K = 16 only: its summary entries use that K
    only16 = replace(config, async_staleness=(16,))
    summary = _summary(only16, [r for r in rows if r["staleness"] != 4 or r["mode"] != "async"])
    assert summary.async_staleness == 16
    entry = summary.datasets["criteo_zipf"]
    assert entry.auc_gap_async_vs_sync == pytest.approx(-0.010)
    assert entry.throughput_async_over_sync == pytest.approx(3.1)


def test_bench_config_needs_sync() -> None:
    with pytest.raises(ValueError, match="must include 'sync'"):
        RecsysBenchConfig(modes=("hybrid",))


def test_bench_data_settings_reach_every_run_but_dataset_and_seed_come_per_run() -> None:
    from frugal.recsys.datasets import RecsysDataConfig

    config = RecsysBenchConfig(data=RecsysDataConfig(zipf_alpha=1.1, test_fraction=0.25))
    train = config.train_config("hybrid", "criteo_zipf", 4, 0.0, 2)
    assert train.data == RecsysDataConfig(
        dataset="criteo_zipf", seed=2, zipf_alpha=1.1, test_fraction=0.25
    )
    assert RecsysBenchConfig.quick().data.zipf_num_embeddings == 20_000
    with pytest.raises(ValueError, match="set per run from datasets and seeds"):
        RecsysBenchConfig(data=RecsysDataConfig(dataset="adult"))


def test_out_of_core_cells_are_summarised_apart_from_the_grid() -> None:
    config = RecsysBenchConfig(
        datasets=("criteo_zipf",), staleness=(4, 16), rtt_ms=(5.0,), seeds=(0,),
        out_of_core_ratios=(0.25, 0.1), out_of_core_embedding_dim=64,
    )  # fmt: skip
    cell = config.out_of_core_config("criteo_zipf", 0.1, 0, distinct_ids=80_000)
    assert cell.ps_capacity_rows == 50_000 + 1024  # 80k x 1.25 / 2 shards, plus slack
    assert (cell.mode, cell.staleness, cell.rtt_ms, cell.embedding_dim) == ("hybrid", 4, 5.0, 64)
    assert (cell.store_backend, cell.ps_memory_ratio, cell.ps_lookahead) == ("file", 0.1, 4)
    assert config.out_of_core_config("criteo_zipf", None, 0, 1).ps_memory_ratio is None
    grid = [_row("sync", None, 0.70, 100.0), _row("hybrid", 4, 0.699, 250.0)]
    ooc = [
        _row("hybrid", 4, 0.690, 400.0) | {"ps_memory_ratio": None, "ps_hit_ratio": 1.0},
        _row("hybrid", 4, 0.690, 360.0) | {"ps_memory_ratio": 0.25, "ps_hit_ratio": 0.97},
        _row("hybrid", 4, 0.6895, 300.0) | {"ps_memory_ratio": 0.1, "ps_hit_ratio": 0.9},
    ]
    summary = _summary(config, grid + [r | {"cell": "out_of_core"} for r in ooc])
    # the grid's hybrid ratio ignores the out-of-core hybrid rows
    assert summary.datasets["criteo_zipf"].throughput_hybrid_over_sync == pytest.approx(2.5)
    entry = summary.out_of_core["criteo_zipf"]
    assert entry.throughput_over_in_ram == pytest.approx({"0.25": 0.9, "0.1": 0.75})
    assert entry.auc_gap_vs_in_ram == pytest.approx({"0.25": 0.0, "0.1": -0.0005})
    assert entry.ps_hit_ratio == {"0.25": 0.97, "0.1": 0.9}
    assert _summary(replace(config, out_of_core_ratios=()), grid).out_of_core == {}
    with pytest.raises(ValueError, match=r"ps_memory_ratio=1.5 must be in \(0, 1\]"):
        replace(config, out_of_core_ratios=(1.5,))


def test_bounded_table_cells_size_the_shards_and_compare_with_the_unbounded_run() -> None:
    data = {"zipf_num_samples": 20_000, "zipf_num_embeddings": 5_000}
    config = RecsysBenchConfig(
        datasets=("criteo_zipf",), staleness=(4, 16), rtt_ms=(5.0,), seeds=(0,),
        bounded_id_ratios=(10.0,), bounded_expire_after_steps=50,
        data=RecsysDataConfig(**data),
    )  # fmt: skip
    cell = config.bounded_config("criteo_zipf", 10.0, 0, distinct_ids=40_001)
    assert (cell.mode, cell.staleness, cell.rtt_ms) == ("hybrid", 4, 5.0)
    assert cell.ps_capacity_rows == 2_001  # ceil(40001 / (10 x 2 shards))
    assert (cell.ps_when_full, cell.ps_admit_after, cell.ps_expire_after_steps) == (
        "evict_lru",
        2,
        50,
    )
    train, _ = load_recsys_data(config.train_config("sync", "criteo_zipf", 1, 5.0, 0).data)
    distinct = sum(len(set(values.tolist())) for values in train.values)
    assert (
        distinct_train_ids(config.train_config("sync", "criteo_zipf", 1, 5.0, 0).data) == distinct
    )
    grid = [_row("sync", None, 0.70, 100.0), _row("hybrid", 4, 0.699, 250.0)]
    grid = [r | {"steps": 39} for r in grid]
    bounded = _row("hybrid", 4, 0.690, 200.0) | {
        "cell": "bounded", "id_ratio": 10.0, "steps": 39, "evicted_rows": 7.0,
        "expired_rows": 3.0, "rejected_updates": 11.0,
    }  # fmt: skip
    summary = _summary(config, [*grid, bounded]).bounded["criteo_zipf"]
    assert summary.distinct_ids == distinct
    assert summary.capacity_rows == {"10": -(-distinct // 20)}
    assert summary.completed == {"10": True}
    assert summary.auc_cost_vs_unbounded == pytest.approx({"10": 0.009})
    assert summary.throughput_over_unbounded == pytest.approx({"10": 0.8})
    assert (summary.evicted_rows, summary.expired_rows) == ({"10": 7.0}, {"10": 3.0})
    short = _summary(config, [*grid, bounded | {"steps": 20}]).bounded["criteo_zipf"]
    assert short.completed == {"10": False}
    # the grid's hybrid figures ignore the bounded row
    assert (
        _summary(config, [*grid, bounded]).datasets["criteo_zipf"].throughput_hybrid_over_sync
        == 2.5
    )
    with pytest.raises(ValueError, match=r"bounded_id_ratios=\(1.0,\) must each be > 1"):
        replace(config, bounded_id_ratios=(1.0,))
    with pytest.raises(ValueError, match="out_of_core_embedding_dim=0 must be >= 1"):
        replace(config, out_of_core_embedding_dim=0)  # was taken as unset


def _fake_result(config: RecsysTrainConfig) -> dict[str, Any]:
    """What a run's result.json holds, as far as the rows and the summary read it."""
    return {
        "mode": config.mode, "dataset": config.data.dataset, "staleness": config.staleness,
        "rtt_ms": config.rtt_ms, "seed": config.seed, "test_auc": 0.7, "test_logloss": 0.6,
        "samples_per_s": 100.0, "max_staleness_seen": 1, "staleness_bound": 15, "steps": 10,
        "ps_hit_ratio": 0.9, "evicted_rows": 5, "expired_rows": 0, "rejected_updates": 2,
        "config": config_to_dict(config),
    }  # fmt: skip


def test_an_infeasible_cell_is_a_row_and_the_rest_of_the_grid_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import frugal.bench.recsys as bench
    from frugal.bench.harness import load_bench_result
    from frugal.reproduce import parts

    launched: list[RecsysTrainConfig] = []

    def launch_runs(
        runs: list[tuple[RecsysTrainConfig, Path]], job_dir: Path, *, timeout_s: float
    ) -> list[dict[str, Any]]:
        launched.extend(c for c, _ in runs)  # torchrun is not started: results by hand
        return [_fake_result(c) for c, _ in runs]

    monkeypatch.setattr(bench, "launch_runs", launch_runs)
    config = RecsysBenchConfig(
        datasets=("criteo_zipf",), modes=("sync", "hybrid"), staleness=(4,), rtt_ms=(0.0,),
        seeds=(0,), batch_size=8, data=RecsysDataConfig(zipf_num_samples=2000,
        zipf_num_embeddings=50), out_of_core_ratios=(0.5, 0.01), out_of_core_embedding_dim=512,
        bounded_id_ratios=(2.0, 1000.0),
    )  # fmt: skip
    result = bench.run_recsys_bench(config, tmp_path)
    rows = {(r["cell"], r.get("id_ratio") or r["ps_memory_ratio"]): r for r in result.rows}
    # Rows of 512-wide embeddings: a shard of ~1,270 rows holds ~2.6 MB, so 0.5 of it is a
    # workable budget and 0.01 (26 kB) is below the store's 128 KiB at least.
    ooc = rows[("out_of_core", 0.01)]
    assert ooc["status"] == "infeasible" and ooc["test_auc"] is None
    assert "ps_memory_ratio=0.01 gives" in ooc["error"] and "store needs" in ooc["error"]
    # 1,000 ids per row of capacity leaves 1 row a shard, below a batch's (8 of 8 features)
    bounded = rows[("bounded", 1000.0)]
    assert bounded["status"] == "infeasible" and bounded["ps_capacity_rows"] == 1
    assert "ps_capacity_rows=1 is below the" in bounded["error"]
    assert "distinct ids one trainer's batch brings to one PS shard" in bounded["error"]
    for key in [("grid", None), ("out_of_core", None), ("out_of_core", 0.5), ("bounded", 2.0)]:
        assert rows[key]["status"] == "ok"
    # the other cells ran (2 grid, 2 out-of-core, 1 bounded), the infeasible ones did not
    assert len(result.rows) == 7 and len(launched) == 5
    assert {c.ps_memory_ratio for c in launched} == {None, 0.5}
    assert 1 not in {c.ps_capacity_rows for c in launched}
    # the summary and the reproduce verdicts count them as not measured
    summary = load_bench_result(tmp_path / "results.json", bench.RecsysSummary).summary
    assert summary.out_of_core["criteo_zipf"].throughput_over_in_ram == {"0.5": 1.0, "0.01": None}
    assert summary.bounded["criteo_zipf"].completed == {"2": True, "1000": None}
    verdicts = {v.claim: v.value for v in parts._recsys_verdicts(result)}
    assert [value for claim, value in verdicts.items() if "1/1000 " in claim] == [None]
    assert [value for claim, value in verdicts.items() if "1/2 " in claim] == [1.0]
    assert [value for claim, value in verdicts.items() if "memory:data 0.01" in claim] == [None] * 2
