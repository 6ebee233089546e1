"""float16 tables: half the bytes in every backend, the same bits whatever caches them."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from frugal.store import (
    EmbeddingStore,
    NonFiniteError,
    OptimizerConfig,
    RowSpec,
    apply_optimizer,
    init_rows,
)
from frugal.store.baselines import RamTable
from frugal.store.rows import round_rows

SPEC16 = RowSpec(embedding_dim=8, optimizer=OptimizerConfig(kind="adam", lr=0.05), dtype="float16")
MIB = 1 << 20


def _is_half_exact(rows: np.ndarray) -> bool:
    return bool(np.array_equal(rows, rows.astype(np.float16).astype(np.float32)))


def _reference_step(table: np.ndarray, ids: np.ndarray, grads: np.ndarray) -> None:
    unique, inverse = np.unique(ids, return_inverse=True)
    summed = np.zeros((len(unique), SPEC16.embedding_dim), dtype=np.float32)
    np.add.at(summed, inverse, grads)
    rows = table[unique]
    apply_optimizer(rows, summed, SPEC16)
    round_rows(rows, SPEC16)  # the store keeps float16 values: round after every update
    table[unique] = rows


def test_initial_rows_are_float16_values_and_close_to_float32() -> None:
    ids = np.arange(1000, dtype=np.int64)
    half = init_rows(ids, SPEC16, seed=1)
    full = init_rows(ids, RowSpec(embedding_dim=8, optimizer=SPEC16.optimizer), seed=1)
    assert _is_half_exact(half)
    assert np.abs(half - full).max() <= np.abs(full).max() * 2**-11  # half an fp16 ulp
    assert SPEC16.stored_row_bytes * 2 == SPEC16.row_bytes == 4 * SPEC16.width


@pytest.mark.parametrize("backend", ["file", "memory", "rocksdb", "lmdb"])
def test_float16_training_matches_a_rounded_reference_bit_for_bit(
    backend: str, tmp_path: Path
) -> None:
    num_rows = 20_000
    table = init_rows(np.arange(num_rows, dtype=np.int64), SPEC16, seed=2)
    budget = (8 if backend == "memory" else 1) * MIB  # 1 MiB: rows are evicted and reread
    config = EmbeddingStore.Config(backend=backend, memory_budget_bytes=budget)  # type: ignore[arg-type]
    path = tmp_path / "s"
    with EmbeddingStore.create(path, num_rows=num_rows, spec=SPEC16, config=config, seed=2) as s:
        if backend != "memory":
            assert s.backend.row_bytes == 2 * SPEC16.width  # type: ignore[attr-defined]
        for step in range(15):
            rng = np.random.default_rng(step)
            ids = rng.integers(0, num_rows, 500)
            got = s.get(ids, step=step)
            assert np.array_equal(got, table[ids, :8]), f"step {step}"
            grads = (0.1 * got + rng.standard_normal(got.shape)).astype(np.float32)
            s.apply_gradients(ids, grads, step=step)
            _reference_step(table, ids, grads)
        assert _is_half_exact(table)
        expected = hashlib.sha256(table.tobytes()).hexdigest()
        assert s.table_sha256() == expected
        if backend in ("file", "rocksdb"):  # budgets that count the backend: rows churn
            assert s.stats()["evictions"] > 0
    with EmbeddingStore.open(path, config) as s:
        assert s.table_sha256() == expected


def test_file_backend_writes_half_the_bytes_of_float32(tmp_path: Path) -> None:
    # D = 200 without optimizer state: 800 B fp32 / 400 B fp16 rows plus a 16 B footer, packed
    # densely (stride rounded up to 8 B): 816 vs 416 B per record after a 4 KiB header.
    sizes = {}
    for dtype in ("float32", "float16"):
        spec = RowSpec(embedding_dim=200, dtype=dtype)  # type: ignore[arg-type]
        with EmbeddingStore.create(tmp_path / dtype, num_rows=4096, spec=spec) as store:
            store.put(np.arange(4096), np.ones((4096, spec.width), dtype=np.float32))
            store.flush()
            logs = list((tmp_path / dtype).glob("log.*.dat"))
            assert logs, "the file backend's log is missing"
            sizes[dtype] = sum(p.stat().st_size for p in logs)
    # Both logs end on a 512 B sector boundary: 4096 x 816 and 4096 x 416 are multiples of it.
    assert sizes == {"float32": 4096 + 4096 * 816, "float16": 4096 + 4096 * 416}


def test_a_value_beyond_the_float16_range_is_refused_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    spec = RowSpec(embedding_dim=4, dtype="float16")
    with EmbeddingStore.create(tmp_path / "s", num_rows=10, spec=spec) as store:
        before = store.peek(np.arange(10))
        rows = np.zeros((2, 4), dtype=np.float32)
        rows[1, 2] = 1e5
        with pytest.raises(NonFiniteError, match=r"id 5 exceeds the float16 range"):
            store.put(np.array([3, 5]), rows)
        assert np.array_equal(store.peek(np.arange(10)), before)
        store.put(np.array([3]), np.full((1, 4), 0.1, dtype=np.float32))
        assert store.peek(np.array([3]))[0, 0] == np.float32(np.float16(0.1))


def test_baselines_refuse_float16_specs() -> None:
    with pytest.raises(ValueError, match="float32 rows only"):
        RamTable(10, SPEC16, seed=0)
