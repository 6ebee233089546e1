"""The store bench at its smallest setting: every system runs and the results file is complete."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from frugal.bench.store import StoreBenchConfig, run_store_bench

ROW_KEYS = {
    "system", "workload", "memory_ratio", "lookahead", "staleness_bound", "samples_per_s",
    "stall_fraction", "hit_ratio", "read_bytes_per_batch", "p50_step_ms", "p99_step_ms",
    "peak_rss_mib", "table_sha256", "final_loss", "status", "anon_rss_growth_mib",
    "budget_violated",
}  # fmt: skip


@pytest.mark.slow
def test_smallest_bench_writes_complete_results(tmp_path: Path) -> None:
    config = StoreBenchConfig(
        systems=("ram", "rocksdb_offload", "lmdb_offload", "hlog", "mlkv", "frugal"),
        workloads=("criteo_zipf",),
        scale=0.001,
        batch_size=64,
        num_batches=12,
        warmup_batches=2,
        memory_ratios=(0.25,),
        lookaheads=(0, 2),
        staleness_bounds=(0, 2),
        compute_ms=0.0,
    )
    document = run_store_bench(config, tmp_path).document
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["benchmark"] == "store"
    assert {"created", "frugal_version", "git_commit", "env", "config", "rows", "summary"} <= set(
        saved
    )
    assert saved["config"]["scale"] == 0.001
    rows = document["rows"]
    # ram, rocksdb, lmdb, hlog: W 0; mlkv, frugal: W 0 and 2; frugal at staleness 2.
    assert len(rows) == 4 + 2 * 2 + 1
    assert all(r["status"] == "ok" for r in rows), [r.get("error") for r in rows]
    assert all(set(r) >= ROW_KEYS for r in rows)
    # Same trace, same init, same optimizer: every staleness-0 run ends bit-identical.
    assert document["summary"]["bit_identical_at_staleness_0"] == {"criteo_zipf": True}
    stale = [r for r in rows if r["staleness_bound"] == 2]
    assert stale and stale[0]["staleness_max"] <= 2
    assert set(document["summary"]["speedup_vs_rocksdb_offload"]) == {"0.25"}
    assert not list(tmp_path.glob("frugal-store-bench-*"))  # scratch removed
    # Budgets of ~40 KiB: new anonymous memory stays within budget + 32 MiB for each system.
    assert document["summary"]["budget_violations"] == []
    reference = document["summary"]["reference_hit_ratios"]["criteo_zipf"]["0.25"]
    assert 0 < reference["lru_demand"] <= reference["belady_demand"] <= 1
    assert {"frugal_W0", "frugal_W2"} <= set(reference)
    assert all(-16 < r["anon_rss_growth_mib"] < 64 for r in rows)


@pytest.mark.slow
def test_a_second_invocation_resumes_finished_cells(tmp_path: Path) -> None:
    config = StoreBenchConfig(
        systems=("ram", "frugal"),
        workloads=("criteo_zipf",),
        scale=0.001,
        batch_size=32,
        num_batches=6,
        warmup_batches=1,
        memory_ratios=(0.5,),
        lookaheads=(1,),
        staleness_bounds=(0,),
        compute_ms=0.0,
    )
    first = run_store_bench(config, tmp_path).document
    second = run_store_bench(config, tmp_path).document
    assert [r.get("resumed") for r in first["rows"]] == [None, None]
    assert [r.get("resumed") for r in second["rows"]] == [True, True]
    assert [r["table_sha256"] for r in second["rows"]] == [r["table_sha256"] for r in first["rows"]]
    assert len((tmp_path / "runs.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"staleness_bounds": (-2,)}, "staleness_bounds=(-2,)"),
        ({"systems": ()}, "systems is empty"),
        ({"memory_ratios": (0.0,)}, "memory_ratios=(0.0,)"),
        ({"systems": ("fast",)}, "choose one of"),
        ({"stream_memory_ratios": (1.5,)}, "stream_memory_ratios=(1.5,)"),
        ({"stream_lookaheads": (-1,)}, "stream_lookaheads=(-1,)"),
        ({"stream_events_per_batch": 0}, "stream_events_per_batch=0"),
    ],
)
def test_bad_bench_configs(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        StoreBenchConfig(**kwargs)  # type: ignore[arg-type]


def test_real_streams_follow_their_own_grid(tmp_path: Path) -> None:
    from frugal.bench.store import _plan, _Workload
    from frugal.store.rows import RowSpec

    config = StoreBenchConfig(
        systems=("ram", "frugal"),
        workloads=("criteo_zipf", "movielens100k"),
        memory_ratios=(1.0,),
        lookaheads=(8,),
        stream_memory_ratios=(0.5, 0.2),
        stream_lookaheads=(0, 2),
        stream_warmup_batches=3,
        staleness_bounds=(0,),
    )
    spec = RowSpec(embedding_dim=4)
    criteo = _Workload("criteo_zipf", 100, spec, "t.npy", "l.npy", 26, main_grid=True)
    stream = _Workload("movielens100k", 50, spec, "t.npy", "l.npy", 2)
    runs = _plan(config, [criteo, stream], tmp_path)
    cells = {(r.workload.name, r.system, r.memory_ratio, r.lookahead) for r in runs}
    assert cells == {
        ("criteo_zipf", "ram", 1.0, 0),
        ("criteo_zipf", "frugal", 1.0, 8),
        *{("movielens100k", "ram", ratio, 0) for ratio in (0.5, 0.2)},
        *{("movielens100k", "frugal", ratio, w) for ratio in (0.5, 0.2) for w in (0, 2)},
    }
    assert {r.warmup_batches for r in runs if r.workload.name == "movielens100k"} == {3}


def test_bit_identity_needs_two_finished_systems() -> None:
    from frugal.bench.store import _summary

    def row(system: str, workload: str, sha: str, status: str = "ok") -> dict[str, object]:
        return {"system": system, "workload": workload, "memory_ratio": 0.1, "lookahead": 0,
                "staleness_bound": 0, "status": status, "table_sha256": sha,
                "samples_per_s": 1.0, "final_loss": 0.5}  # fmt: skip

    rows = [
        row("ram", "criteo_zipf", "a"),
        row("frugal", "criteo_zipf", "", status="error"),  # failed: nothing to compare
        row("ram", "collegemsg", "b"),
        row("frugal", "collegemsg", "b"),
        row("ram", "movielens100k", "c"),
        row("frugal", "movielens100k", "d"),
    ]
    identical = _summary(rows, 4).bit_identical_at_staleness_0
    assert identical == {"criteo_zipf": None, "collegemsg": True, "movielens100k": False}


def test_progress_line_of_a_resumed_row_without_hit_ratio() -> None:
    from frugal.bench.store import _describe

    # A journaled rocksdb_offload row comes back with hit_ratio null (NaN in the run).
    row = {"workload": "criteo_zipf", "system": "rocksdb_offload", "memory_ratio": 1.0,
           "lookahead": 0, "staleness_bound": 0, "status": "ok", "samples_per_s": 6933.4,
           "hit_ratio": None, "stall_fraction": 0.68}  # fmt: skip
    assert _describe(1, 84, row) == (
        "[2/84] criteo_zipf rocksdb_offload ratio=1.0 W=0 s=0: 6933 samples/s, hit n/a, stall 0.68"
    )
    assert "hit nan" not in _describe(1, 84, row | {"hit_ratio": float("nan")})


def test_mlkv_lookahead_reads_are_not_counted_as_misses(tmp_path: Path) -> None:
    import time

    import numpy as np

    from frugal.store.baselines import HybridLogTable
    from frugal.store.rows import OptimizerConfig, RowSpec

    spec = RowSpec(embedding_dim=4, optimizer=OptimizerConfig(kind="sgd", lr=1.0))
    num_rows = 1000  # index 8 kB; 200 records of 24 B in memory
    table = HybridLogTable(
        tmp_path, num_rows, spec, 0, memory_budget_bytes=8 * num_rows + 200 * 24, mlkv=True
    )
    try:
        for first in range(0, num_rows, 100):
            ids = np.arange(first, first + 100)
            table.get(ids, 0)
            table.apply_gradients(ids, np.ones((100, 4), np.float32), 0)
        assert table.head > 0  # the first rows went to disk
        on_disk = np.arange(50)
        table.lookahead(on_disk, 1)
        deadline = time.monotonic() + 10
        while table.stats()["prefetch_reads"] < 50 and time.monotonic() < deadline:
            time.sleep(0.01)
        before = table.stats()
        assert before["prefetch_reads"] == 50
        table.get(on_disk, 1)  # all copied to the tail by the lookahead: 50 memory hits
        after = table.stats()
        assert after["hit_ratio"] == pytest.approx(before["hit_ratio"])
        assert table.memory_hits == 50 and table.disk_reads == 0
    finally:
        table.close()


def test_every_system_name_has_a_registered_system() -> None:
    from typing import get_args

    from frugal.bench.store import _SYSTEMS, SystemName

    assert _SYSTEMS.names() == get_args(SystemName)
    assert [n for n in _SYSTEMS.names() if _SYSTEMS.get(n).uses_lookahead] == ["mlkv", "frugal"]
    # lmdb lives in the OS page cache and ram holds everything: their budget does not bind
    unbound = [n for n in _SYSTEMS.names() if not _SYSTEMS.get(n).budget_enforced]
    assert unbound == ["ram", "lmdb_offload"]


def test_a_killed_benchs_scratch_folder_is_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from frugal.bench.store import _remove_stale_scratch

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True, timeout=60)  # fmt: skip
    stale = tmp_path / f"frugal-store-bench-{dead.stdout.strip()}-abc"
    live = tmp_path / f"frugal-store-bench-{os.getpid()}-def"
    unknown = tmp_path / "frugal-store-bench-xyz"  # an older frugal's name: not ours to judge
    for folder in (stale, live, unknown):
        (folder / "run1").mkdir(parents=True)
    _remove_stale_scratch(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, unknown.name])


@pytest.mark.slow
def test_kge_workload_trains_every_system_to_one_table_and_one_mrr(tmp_path: Path) -> None:
    from frugal.bench.store import StoreKGEConfig

    config = StoreBenchConfig(
        systems=("ram", "rocksdb_offload", "mlkv", "frugal"),
        workloads=("kge_freebase",),
        kge=StoreKGEConfig(
            num_entities=20_000, num_relations=50, embedding_dim=8, batch_size=256,
            neg_sample_size=32, num_steps=8, warmup_steps=2, memory_ratios=(0.5,),
            lookaheads=(2,), eval_triples=32, eval_candidates=50,
        ),
    )  # fmt: skip
    document = run_store_bench(config, tmp_path).document
    rows = document["rows"]
    assert [(r["system"], r["lookahead"]) for r in rows] == [
        ("ram", 0), ("rocksdb_offload", 0), ("mlkv", 2), ("frugal", 2),
    ]  # fmt: skip
    assert all(r["status"] == "ok" for r in rows), [r.get("error") for r in rows]
    assert all(set(r) >= ROW_KEYS | {"quality", "quality_metric"} for r in rows)
    assert rows[0]["row_bytes"] == (8 + 1) * 4  # vector + row-wise Adagrad accumulator
    assert rows[0]["compute_ms"] == 0.0  # the forward and backward are real
    summary = document["summary"]
    assert summary["bit_identical_at_staleness_0"] == {"kge_freebase": True}
    kge = summary["workloads"]["kge_freebase"]
    assert kge["quality_metric"] == "sampled_mrr" and kge["lookahead"] == 2
    mrr = kge["quality"]["0.5"]
    assert set(mrr) == {"ram", "rocksdb_offload", "mlkv", "frugal"}
    assert len(set(mrr.values())) == 1 and 0 < mrr["ram"] <= 1
    assert set(kge["speedup_vs_rocksdb_offload"]) == {"0.5"}


def test_workload_families_expand_and_unknown_names_list_both_kinds() -> None:
    from frugal.bench.store import WORKLOAD_FAMILIES, select_workloads

    assert select_workloads(["kge"]) == ("kge_freebase",)
    assert select_workloads(["dlrm", "criteo_zipf"]) == WORKLOAD_FAMILIES["dlrm"]
    with pytest.raises(ValueError, match=r"'gnm' is neither a family \(dlrm, kge"):
        select_workloads(["gnm"])
    from frugal.bench.store import StoreKGEConfig

    with pytest.raises(ValueError, match="num_steps=5 must exceed warmup_steps=300"):
        StoreKGEConfig(num_steps=5)


def test_a_bench_that_cannot_fit_on_the_disk_is_refused_before_any_run(tmp_path: Path) -> None:
    from frugal.bench.store import StoreKGEConfig
    from frugal.disk import DiskFullError, free_bytes

    entities = max(10**9, free_bytes(tmp_path) // 404 + 10**6)  # beyond any disk's free space
    kge = StoreKGEConfig(num_entities=entities, num_steps=10**9, memory_ratios=(0.1,))
    config = StoreBenchConfig(systems=("ram", "frugal"), workloads=("kge_freebase",), kge=kge)
    # at least every entity's 404-byte row once (at most: the log cleaned at 1.5 x the rows
    # written, of 424-byte records, plus three segments of 2^19 records), more than this
    # test's disk has free
    with pytest.raises(DiskFullError, match=r"the store bench's tables .* needed") as caught:
        run_store_bench(config, tmp_path)
    assert caught.value.needed_bytes == entities * 404
    from frugal.bench.store import _WORKLOADS, _plan, disk_bytes_needed

    (run,) = [r for r in _plan(config, [_WORKLOADS.get("kge_freebase")(config, tmp_path)],
                               tmp_path) if r.system == "frugal" and r.lookahead == 0]  # fmt: skip
    assert disk_bytes_needed(run) == int(1.5 * entities * 424) + 3 * 2**19 * 424 + (64 << 20)
    assert not (tmp_path / "runs.jsonl").exists() or not (tmp_path / "runs.jsonl").read_text()
    assert not list(tmp_path.glob("frugal-store-bench-*"))  # scratch removed


@pytest.mark.slow
def test_criteo_dlrm_trains_a_real_model_on_the_shared_trace(tmp_path: Path) -> None:
    config = StoreBenchConfig(
        systems=("ram", "frugal"),
        workloads=("criteo_zipf", "criteo_dlrm"),
        scale=0.001,
        batch_size=64,
        num_batches=12,
        warmup_batches=2,
        memory_ratios=(0.25,),
        lookaheads=(2,),
        staleness_bounds=(0,),
        compute_ms=3.0,
    )
    rows = run_store_bench(config, tmp_path).document["rows"]
    assert all(r["status"] == "ok" for r in rows), [r.get("error") for r in rows]
    dlrm = [r for r in rows if r["workload"] == "criteo_dlrm"]
    planted = [r for r in rows if r["workload"] == "criteo_zipf"]
    assert [r["system"] for r in dlrm] == ["ram", "frugal"]
    assert {r["compute_ms"] for r in dlrm} == {0.0} and {r["compute_ms"] for r in planted} == {3.0}
    assert dlrm[0]["table_sha256"] == dlrm[1]["table_sha256"]  # same run through both tables
    assert dlrm[0]["final_loss"] == dlrm[1]["final_loss"]
    # the model moves the rows differently from the planted teacher's closed-form gradient
    assert dlrm[0]["table_sha256"] != planted[0]["table_sha256"]


@pytest.mark.slow
def test_gnn_workload_trains_features_and_embeddings_through_every_system(
    tmp_path: Path,
) -> None:
    from frugal.bench.store import StoreGNNConfig

    config = StoreBenchConfig(
        systems=("ram", "rocksdb_offload", "frugal"),
        workloads=("gnn_papers",),
        gnn=StoreGNNConfig(
            num_nodes=6000, embedding_dim=4, fanouts=(3, 3), batch_size=16, hidden_channels=8,
            num_steps=4, warmup_steps=1, memory_ratios=(0.5,), lookaheads=(1,),
            max_eval_nodes=20,
        ),
    )  # fmt: skip
    document = run_store_bench(config, tmp_path).document
    rows = document["rows"]
    assert [(r["system"], r["lookahead"]) for r in rows] == [
        ("ram", 0), ("rocksdb_offload", 0), ("frugal", 1),
    ]  # fmt: skip
    assert all(r["status"] == "ok" for r in rows), [r.get("error") for r in rows]
    # two tables: 128 feature floats (read-only) + 4-dim Adam embeddings (3 x 4 + 1 floats)
    assert rows[0]["row_bytes"] == 128 * 4 + 13 * 4
    assert rows[0]["feature_hit_ratio"] == 1.0  # ram
    assert 0 < rows[2]["feature_hit_ratio"] <= 1  # frugal's feature table (rocksdb: no cache)
    assert {r["compute_ms"] for r in rows} == {0.0}
    assert document["summary"]["bit_identical_at_staleness_0"] == {"gnn_papers": True}
    gnn = document["summary"]["workloads"]["gnn_papers"]
    assert gnn["quality_metric"] == "test_accuracy"
    assert len(set(gnn["quality"]["0.5"].values())) == 1  # one model, whatever the system
