"""EmbeddingStore: round trips, reference training, durability, bad input, every backend."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from frugal.store import (
    CacheTooSmallError,
    EmbeddingStore,
    NonFiniteError,
    OptimizerConfig,
    RowSpec,
    StalenessTimeoutError,
    StoreCorruptionError,
    StoreError,
    StoreLockedError,
    apply_optimizer,
    init_rows,
)
from frugal.store.lookahead import Batch, LookaheadLoader

BACKENDS = ["file", "memory", "rocksdb", "lmdb"]
SPEC = RowSpec(embedding_dim=8, optimizer=OptimizerConfig(kind="adam", lr=0.05))
MIB = 1 << 20


def _config(backend: str, budget_mib: int = 5, **kwargs: object) -> EmbeddingStore.Config:
    return EmbeddingStore.Config(backend=backend, memory_budget_bytes=budget_mib * MIB, **kwargs)  # type: ignore[arg-type]


def _train(
    store: EmbeddingStore | None,
    table: np.ndarray,
    steps: range,
    *,
    batch: int = 300,
    spec: RowSpec = SPEC,
) -> None:
    """Deterministic steps: get, gradient = 0.1 * row + step-seeded noise, apply.

    The numpy `table` is updated the same way as the reference.
    """
    num_rows = len(table)
    for step in steps:
        rng = np.random.default_rng(step)
        ids = rng.integers(0, num_rows, batch)
        d = spec.embedding_dim
        unique, inverse = np.unique(ids, return_inverse=True)
        expected = table[ids, :d]
        if store is not None:
            got = store.get(ids, step=step)
            assert np.array_equal(got, expected), f"step {step}: read differs from reference"
        grads = (0.1 * expected + rng.standard_normal((batch, d))).astype(np.float32)
        if store is not None:
            store.apply_gradients(ids, grads, step=step)
        summed = np.zeros((len(unique), d), dtype=np.float32)
        np.add.at(summed, inverse, grads)
        rows = table[unique]
        apply_optimizer(rows, summed, spec)
        table[unique] = rows


def _sha(table: np.ndarray) -> str:
    return hashlib.sha256(table.tobytes()).hexdigest()


@pytest.mark.parametrize("backend", BACKENDS)
def test_training_matches_a_numpy_reference_bit_for_bit(backend: str, tmp_path: Path) -> None:
    # 30,000 rows x 100 B = 3 MB; 1 MiB minus the id map (120 kB), slot maps (60 kB) and I/O
    # buffers (128 kB) caches about 5,700 rows, and 20 steps x 500 ids touch about 8,500:
    # rows are evicted, written back and read again.
    num_rows = 30_000
    table = init_rows(np.arange(num_rows, dtype=np.int64), SPEC, seed=3)
    budget = 8 if backend == "memory" else 1  # the memory backend counts the whole table
    with EmbeddingStore.create(
        tmp_path / "s", num_rows=num_rows, spec=SPEC, config=_config(backend, budget), seed=3
    ) as store:
        _train(store, table, range(20), batch=500)
        assert store.table_sha256() == _sha(table)
        stats = store.stats()
        assert stats["staleness_max"] == 0
        if backend != "memory":
            assert stats["evictions"] > 0 and stats["misses"] > 0
    with EmbeddingStore.open(tmp_path / "s", _config(backend, budget)) as store:
        assert store.table_sha256() == _sha(table)


@pytest.mark.parametrize("backend", ["file", "rocksdb"])
def test_hash_slot_index_trains_like_the_reference_bit_for_bit(
    backend: str, tmp_path: Path
) -> None:
    # The run above, longer, with the id -> slot map as a hash table over the cache slots:
    # evictions, write-backs, re-reads and tombstone rebuilds, the same table at the end.
    num_rows = 30_000
    table = init_rows(np.arange(num_rows, dtype=np.int64), SPEC, seed=3)
    config = _config(backend, 1, slot_index="hash")
    with EmbeddingStore.create(
        tmp_path / "s", num_rows=num_rows, spec=SPEC, config=config, seed=3
    ) as store:
        _train(store, table, range(60), batch=500)
        assert store.table_sha256() == _sha(table)
        stats = store.stats()
        assert stats["slot_index"] == "hash" and stats["evictions"] > 0
        assert store.cache.index.rebuilds > 0  # type: ignore[attr-defined]
    with EmbeddingStore.open(tmp_path / "s", _config(backend, 1, slot_index="dense")) as store:
        assert store.table_sha256() == _sha(table)  # the map is not part of the files


def test_auto_slot_index_caches_more_rows_of_a_large_table(tmp_path: Path) -> None:
    # 1M rows of 48 B at a 4 MiB budget: the dense map alone would take 4 MB of it.
    spec = RowSpec(embedding_dim=4, optimizer=OptimizerConfig(kind="adagrad"))
    budget = 4 * MIB + 2 * (1 << 20)  # 4 MiB for the file backend's addresses, 2 MiB left
    capacities = {}
    for kind in ("dense", "auto"):
        config = EmbeddingStore.Config(memory_budget_bytes=budget, slot_index=kind)  # type: ignore[arg-type]
        if kind == "dense":
            with pytest.raises(ValueError, match="after the dense slot index"):
                EmbeddingStore.create(tmp_path / kind, num_rows=1 << 20, spec=spec, config=config)
            continue
        with EmbeddingStore.create(
            tmp_path / kind, num_rows=1 << 20, spec=spec, config=config
        ) as store:
            capacities[kind] = store.stats()["capacity_rows"]
            assert store.stats()["slot_index"] == "hash"
            ids = np.arange(0, 1 << 20, 997, dtype=np.int64)
            assert np.array_equal(store.peek(ids), init_rows(ids, spec, 0))
    # 6 MiB - 4 MiB of addresses - 4 KiB of segment counts - 768 KiB of I/O buffer =
    # 1,306,624 B; 92 B per slot (32 B row + 60 B metadata); 12,098 slots at 108 B would want
    # 65,536 cells (256 KiB), which leaves (1,306,624 - 262,144) // 92 = 11,353 slots.
    assert capacities["auto"] == 11_353


@pytest.mark.parametrize("backend", BACKENDS)
def test_reopen_without_checkpoint_returns_the_last_checkpoint(
    backend: str, tmp_path: Path
) -> None:
    num_rows = 5_000
    table = init_rows(np.arange(num_rows, dtype=np.int64), SPEC, seed=0)
    store = EmbeddingStore.create(
        tmp_path / "s", num_rows=num_rows, spec=SPEC, config=_config(backend, 8)
    )
    _train(store, table, range(5))
    assert store.checkpoint(meta={"cursor": 5}, step=5) == 1
    at_checkpoint = table.copy()
    _train(store, table, range(5, 10))  # lost: no checkpoint after these
    store.close(checkpoint=False)
    with EmbeddingStore.open(tmp_path / "s", _config(backend, 8)) as store:
        assert store.table_sha256() == _sha(at_checkpoint)
        assert (store.epoch, store.step, store.meta) == (1, 5, {"cursor": 5})


@pytest.mark.parametrize("backend", ["file", "memory"])
def test_rollback_returns_the_same_object_to_the_last_checkpoint(
    backend: str, tmp_path: Path
) -> None:
    num_rows = 2_000
    table = init_rows(np.arange(num_rows, dtype=np.int64), SPEC, seed=0)
    with EmbeddingStore.create(
        tmp_path / "s", num_rows=num_rows, spec=SPEC, config=_config(backend, 2)
    ) as store:
        _train(store, table, range(3))
        store.checkpoint(meta={"cursor": 3}, step=3)
        at_checkpoint = table.copy()
        _train(store, table, range(3, 6))  # with evictions: a 2 MiB cache, 300-id batches
        store.get(np.array([7, 8]), step=6)  # an open read, dropped with the changes
        store.rollback()
        assert store.table_sha256() == _sha(at_checkpoint)
        assert (store.epoch, store.step, store.meta) == (1, 3, {"cursor": 3})
        assert store.cache.readers.sum() == 0
        _train(store, at_checkpoint, range(3, 5))  # still usable: trains like the reference
    with EmbeddingStore.open(tmp_path / "s", _config(backend, 2)) as store:  # one lock held
        assert store.table_sha256() == _sha(at_checkpoint)


def test_a_checkpoint_without_changes_keeps_its_rows_epoch(tmp_path: Path) -> None:
    with EmbeddingStore.create(tmp_path / "s", num_rows=50, spec=SPEC) as store:
        assert (store.epoch, store.rows_epoch) == (0, 0)
        store.lookahead(np.array([1, 2]), step=3)
        store.peek(np.array([1, 2]))
        store.checkpoint()  # a hint and a peek: nothing new in the rows
        assert (store.epoch, store.rows_epoch) == (1, 0)
        store.get(np.array([1, 2]), step=3)
        store.apply_gradients(np.array([1, 2]), np.ones((2, 8), dtype=np.float32), step=3)
        store.checkpoint()
        assert (store.epoch, store.rows_epoch) == (2, 2)
        store.put(np.array([4]), np.zeros((1, SPEC.width), dtype=np.float32))
        store.checkpoint(meta={"cursor": 1})
        store.checkpoint(meta={"cursor": 2})
        assert (store.epoch, store.rows_epoch) == (4, 3)
    with EmbeddingStore.open(tmp_path / "s") as store:  # close() changed nothing either
        assert (store.epoch, store.rows_epoch) == (5, 3)
    with EmbeddingStore.create(tmp_path / "h", num_rows=50, spec=SPEC, key_space="hashed") as s:
        s.lookahead(np.array([10**12]), step=0)  # a new key enters the checkpointed key map
        s.checkpoint()
        assert (s.epoch, s.rows_epoch) == (1, 1)


def test_put_and_get_round_trip_whole_rows(tmp_path: Path) -> None:
    spec = RowSpec(embedding_dim=4, optimizer=OptimizerConfig(kind="rowwise_adagrad"))
    rows = np.arange(3 * 5, dtype=np.float32).reshape(3, 5)  # width 4 + 1 accumulator
    config = EmbeddingStore.Config(timeout_s=2.0)
    with EmbeddingStore.create(tmp_path / "s", num_rows=10, spec=spec, config=config) as store:
        store.put(np.array([7, 2, 9]), rows)
        got = store.get(np.array([[2, 7], [9, 2]]), cols="all")
        assert got.shape == (2, 2, 5)
        assert np.array_equal(got[0, 0], rows[1]) and np.array_equal(got[1, 1], rows[1])
        assert np.array_equal(got[0, 1], rows[0]) and np.array_equal(got[1, 0], rows[2])
        assert np.array_equal(store.peek(np.array([9]), cols="emb")[0], rows[2, :4])
        untouched = store.peek(np.array([0]), cols="all")
        assert np.array_equal(untouched, init_rows(np.array([0]), spec, 0))
        with pytest.raises(StalenessTimeoutError, match="row 2 already has 1 open read"):
            store.get(np.array([2]))  # bound 0: the first get was never closed by a put
        with pytest.raises(StoreError, match="open reads from this thread"):
            store.checkpoint()
        store.put(np.array([2, 7, 9]), rows[[1, 0, 2]])  # closes the open reads
        store.get(np.array([2]))
        store.put(np.array([2]), rows[[1]])


def test_lookahead_prefetches_without_changing_values(tmp_path: Path) -> None:
    num_rows = 20_000
    table = init_rows(np.arange(num_rows, dtype=np.int64), SPEC, seed=1)
    batches = [
        Batch(step=s, ids=np.random.default_rng(s).integers(0, num_rows, 300)) for s in range(30)
    ]
    with EmbeddingStore.create(
        tmp_path / "s", num_rows=num_rows, spec=SPEC, config=_config("file"), seed=1
    ) as store:
        for batch in LookaheadLoader(batches, store, window=4):
            _train(store, table, range(batch.step, batch.step + 1))
        stats = store.stats()
        assert stats["prefetched"] > 0
        assert store.table_sha256() == _sha(table)


def test_lookahead_loader_hints_w_batches_ahead() -> None:
    hinted: list[tuple[int, int]] = []  # (step hinted, step being yielded when hinted)

    class Recorder:
        current = -1

        def lookahead(self, ids: object, step: int) -> None:
            hinted.append((step, self.current))

    recorder = Recorder()
    batches = [Batch(step=s, ids=np.array([s])) for s in range(6)]
    seen = []
    for batch in LookaheadLoader(batches, recorder, window=2):
        recorder.current = batch.step
        seen.append(batch.step)
        assert {s for s, _ in hinted} >= {s for s in (batch.step + 1, batch.step + 2) if s < 6}
    assert seen == list(range(6))
    assert [s for s, _ in hinted] == list(range(6))  # each batch hinted once, in order
    with pytest.raises(ValueError, match="window=-1"):
        LookaheadLoader(batches, recorder, window=-1)


# --- bad input: clear errors, nothing modified ----------------------------------------------


@pytest.fixture
def small_store(tmp_path: Path) -> EmbeddingStore:
    store = EmbeddingStore.create(tmp_path / "s", num_rows=100, spec=SPEC)
    store.put(np.arange(10), init_rows(np.arange(10), SPEC, 0) + np.float32(1))
    return store


@pytest.mark.parametrize(
    ("call", "error", "fragment"),
    [
        (lambda s: s.get(np.array([1.0, 2.0])), TypeError, "ids must be integers"),
        (
            lambda s: s.get(np.array([5, 100, -1])),
            IndexError,
            r"2 ids are outside \[0, num_rows=100\)",
        ),
        (
            lambda s: s.put(np.array([3, 3]), np.zeros((2, 25), np.float32)),
            ValueError,
            "id 3 more than once",
        ),
        (lambda s: s.put(np.array([3]), np.zeros((1, 25))), TypeError, "must be float32"),
        (
            lambda s: s.put(np.array([3]), np.zeros((1, 24), np.float32)),
            ValueError,
            r"shape \(1, 25\)",
        ),
        (
            lambda s: s.put(np.array([3, 4]), np.zeros((25, 2), np.float32).T),
            ValueError,
            "C-contiguous",
        ),
        (
            lambda s: s.put(np.array([3]), np.full((1, 25), np.nan, np.float32)),
            NonFiniteError,
            "row 0",
        ),
        (
            lambda s: s.apply_gradients(np.array([3]), np.full((1, 8), np.inf, np.float32)),
            NonFiniteError,
            "grads",
        ),
        (lambda s: s.get(np.array([1]), cols="rows"), ValueError, "cols='rows'"),
    ],
)
def test_bad_input_raises_and_changes_nothing(
    small_store: EmbeddingStore, call: object, error: type[Exception], fragment: str
) -> None:
    before = small_store.table_sha256()
    with pytest.raises(error, match=fragment):
        call(small_store)  # type: ignore[operator]
    assert small_store.table_sha256() == before
    small_store.close()


def test_bad_configs() -> None:
    with pytest.raises(ValueError, match="staleness_bound=-1"):
        EmbeddingStore.Config(staleness_bound=-1)
    with pytest.raises(ValueError, match=r"memory_budget_bytes=0 must be >= 1 \(the store names"):
        EmbeddingStore.Config(memory_budget_bytes=0)
    with pytest.raises(ValueError, match=r"momentum=0\.5 applies to kind='sgd' only"):
        OptimizerConfig(kind="adam", momentum=0.5)


def test_budget_too_small_for_the_id_map_names_the_minimum(tmp_path: Path) -> None:
    # 4 bytes of id map per row: 10M rows need 40 MB before any cached row.
    with pytest.raises(ValueError, match="set it to at least"):
        EmbeddingStore.create(
            tmp_path / "s", num_rows=10_000_000, spec=SPEC, config=_config("file", 8)
        )


def test_create_names_impossible_sizes_paths_and_config_types(tmp_path: Path) -> None:
    # 2^62 rows: the id map alone (4 B per row) needs 16 EiB, beyond any machine.
    with pytest.raises(ValueError, match=r"num_rows=4,611,686,018,427,387,904 needs .* GiB"):
        EmbeddingStore.create(tmp_path / "s", num_rows=2**62, spec=SPEC)
    afile = tmp_path / "afile"
    afile.write_text("keep")
    with pytest.raises(ValueError, match=r"store folder .*: cannot create the folder"):
        EmbeddingStore.create(afile / "s", num_rows=10, spec=SPEC)
    with pytest.raises(ValueError, match=r"the store folder .*afile is a file; give a folder"):
        EmbeddingStore.create(afile, num_rows=10, spec=SPEC)
    assert afile.read_text() == "keep"
    with pytest.raises(TypeError, match=r"config must be an EmbeddingStore.Config, got dict"):
        EmbeddingStore.create(
            tmp_path / "t",
            num_rows=10,
            spec=SPEC,
            config={"memory_budget_bytes": 5},  # type: ignore[arg-type]
        )
    with pytest.raises(TypeError, match=r"config must be an EmbeddingStore.Config, got dict"):
        EmbeddingStore.open(tmp_path / "t", config={"memory_budget_bytes": 5})  # type: ignore[arg-type]
    assert afile.read_text() == "keep"


def test_create_refuses_a_non_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="is not empty"):
        EmbeddingStore.create(tmp_path / "s", num_rows=10, spec=SPEC)
    assert (tmp_path / "s" / "notes.txt").read_text() == "mine"


def test_second_writer_is_refused(small_store: EmbeddingStore) -> None:
    with pytest.raises(StoreLockedError, match="already open in this process"):
        EmbeddingStore.open(small_store.directory)
    code = (
        "import sys; from frugal.store import EmbeddingStore, StoreLockedError\n"
        "try:\n    EmbeddingStore.open(sys.argv[1])\n"
        "except StoreLockedError as exc:\n    print(exc)\n"
    )
    other = subprocess.run(
        [sys.executable, "-c", code, str(small_store.directory)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert f"open for writing by process {os.getpid()}" in other.stdout
    small_store.close()
    EmbeddingStore.open(small_store.directory).close()  # the lock is released on close


def test_more_bad_input_is_refused_before_anything_changes(small_store: EmbeddingStore) -> None:
    before = small_store.table_sha256()
    with pytest.raises(TypeError, match="step='x' must be an integer"):
        small_store.checkpoint(step="x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="meta must be JSON-serialisable"):
        small_store.checkpoint(meta={"cursor": object()})
    with pytest.raises(TypeError, match="meta must be JSON-serialisable"):
        small_store.checkpoint(meta={"loss": float("nan")})
    with pytest.raises(TypeError, match="meta must be a dict with str keys, got str"):
        small_store.checkpoint(meta="abc")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="meta must be a dict with str keys"):
        small_store.checkpoint(meta={1: "a"})  # type: ignore[dict-item]
    assert not list(small_store.directory.glob("*.tmp"))
    with pytest.raises(TypeError, match="step=-1"):
        small_store.get(np.array([1]), step=-1)
    with pytest.raises(IndexError, match="ids reach"):
        small_store.get(np.array([2**63 + 5], dtype=np.uint64))
    assert small_store.table_sha256() == before
    small_store.close()
    with pytest.raises(StoreError, match="closed"):
        small_store.stats()


def test_non_finite_optimizer_output_writes_nothing(tmp_path: Path) -> None:
    spec = RowSpec(embedding_dim=2, optimizer=OptimizerConfig(kind="adagrad"))
    with EmbeddingStore.create(tmp_path / "s", num_rows=4, spec=spec) as store:
        before = store.peek(np.array([1]))
        store.get(np.array([1]))
        with pytest.raises(NonFiniteError, match="update of id 1 is not finite"):
            store.apply_gradients(np.array([1]), np.full((1, 2), 3e38, np.float32))
        assert np.array_equal(store.peek(np.array([1])), before)
        store.put(np.array([1]), before)  # close the read


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda: EmbeddingStore.Config(backend="bad"), "choose one of file, rocksdb"),
        (lambda: EmbeddingStore.Config(staleness_bound=1.5), "staleness_bound = 1.5"),  # type: ignore[arg-type]
        (lambda: EmbeddingStore.Config(memory_budget_bytes=4e6), "must be an integer"),  # type: ignore[arg-type]
        (lambda: EmbeddingStore.Config(timeout_s=float("inf")), "must be finite"),
        (lambda: OptimizerConfig(lr=float("nan")), "must be finite"),
        (lambda: OptimizerConfig(kind="rmsprop"), "choose one of"),  # type: ignore[arg-type]
    ],
)
def test_configs_check_their_types(make: object, fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        make()  # type: ignore[operator]


def test_peek_streams_more_rows_than_the_cache_holds(tmp_path: Path) -> None:
    spec = RowSpec(embedding_dim=8)
    config = _config("file", 1)
    with EmbeddingStore.create(tmp_path / "s", num_rows=50_000, spec=spec, config=config) as store:
        assert store.cache.capacity < 50_000
        rows = store.peek(np.arange(50_000), cols="emb")
        assert np.array_equal(rows, init_rows(np.arange(50_000), spec, 0))


def test_flipped_byte_on_disk_is_detected(tmp_path: Path) -> None:
    store = EmbeddingStore.create(tmp_path / "s", num_rows=100, spec=SPEC)
    store.put(np.array([42]), np.ones((1, 25), np.float32))
    store.close()
    log = tmp_path / "s" / "log.0.dat"
    blob = bytearray(log.read_bytes())
    address = int(np.load(tmp_path / "s" / "index.1.npy")[42])
    offset = 4096 + address * 120  # header, then records of stride roundup(100 + 16, 8)
    blob[offset + 5] ^= 0x01
    log.write_bytes(bytes(blob))
    with EmbeddingStore.open(tmp_path / "s") as reopened:
        with pytest.raises(StoreCorruptionError, match="row id 42 at offset"):
            reopened.get(np.array([42]))
        reopened.close(checkpoint=False)


def test_truncated_file_and_foreign_manifest_are_refused(tmp_path: Path) -> None:
    store = EmbeddingStore.create(tmp_path / "s", num_rows=100, spec=SPEC)
    store.put(np.arange(10), np.ones((10, 25), np.float32))
    store.close()
    log = tmp_path / "s" / "log.0.dat"
    full = log.read_bytes()
    log.write_bytes(full[:-512])
    with pytest.raises(StoreCorruptionError, match="truncated"):
        EmbeddingStore.open(tmp_path / "s")
    log.write_bytes(full)
    manifest = json.loads((tmp_path / "s" / "MANIFEST").read_text())
    unsigned = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    (tmp_path / "s" / "MANIFEST").write_text(json.dumps(unsigned | {"format_version": 99}))
    with pytest.raises(StoreError, match="format_version 99"):
        EmbeddingStore.open(tmp_path / "s")
    (tmp_path / "s" / "MANIFEST").write_text(json.dumps(manifest))
    log.unlink()
    with pytest.raises(StoreCorruptionError, match="is missing"):
        EmbeddingStore.open(tmp_path / "s")
    (tmp_path / "s" / "MANIFEST").unlink()
    with pytest.raises(StoreError, match="incomplete store, no MANIFEST"):
        EmbeddingStore.open(tmp_path / "s")


def test_update_after_get_reuses_the_read_only_while_nothing_was_written(
    tmp_path: Path,
) -> None:
    # SGD, lr 1: a gradient g turns row w into w - g. The update reuses the rows its get
    # read; a put between them (here to one of the read rows) must make it read them again.
    spec = RowSpec(embedding_dim=2, optimizer=OptimizerConfig(kind="sgd", lr=1.0))
    with EmbeddingStore.create(
        tmp_path / "s", num_rows=10, spec=spec, config=_config("file")
    ) as store:
        ids = np.array([3, 5])
        start = store.get(ids)
        ones = np.ones((2, 2), dtype=np.float32)
        store.apply_gradients(ids, ones)
        np.testing.assert_array_equal(store.peek(ids, cols="emb"), start - 1)
        store.get(ids)
        store.put(np.array([3]), np.array([[10.0, 20.0]], dtype=np.float32))
        store.apply_gradients(ids, ones)
        np.testing.assert_array_equal(store.peek(ids, cols="emb"), [[9, 19], start[1] - 2])
        # The row a get returns is the caller's copy: editing it changes nothing stored.
        rows = store.get(ids)
        rows[:] = 1e6
        store.apply_gradients(ids, ones)
        np.testing.assert_array_equal(store.peek(ids, cols="emb"), [[8, 18], start[1] - 3])


def test_an_id_buffer_refilled_between_get_and_update_updates_the_new_rows(
    tmp_path: Path,
) -> None:
    spec = RowSpec(embedding_dim=2, optimizer=OptimizerConfig(kind="sgd", lr=1.0))
    store = EmbeddingStore.create(
        tmp_path / "s", num_rows=10, spec=spec, config=_config("file", staleness_bound=None)
    )
    try:
        start = store.peek(np.arange(10), cols="emb")
        ids = np.array([1, 2])
        store.get(ids)
        ids[:] = [7, 8]  # the caller reuses its buffer for the next rows
        store.apply_gradients(ids, np.ones((2, 2), dtype=np.float32))
        after = store.peek(np.arange(10), cols="emb")
        np.testing.assert_array_equal(after[[7, 8]], start[[7, 8]] - 1)
        np.testing.assert_array_equal(after[[1, 2]], start[[1, 2]])
    finally:
        store.close(checkpoint=False)  # rows 1 and 2 keep their open reads


def test_table_sha256_of_some_rows_hashes_those_rows_in_that_order(tmp_path: Path) -> None:
    from frugal.store.baselines import RamTable

    ram = RamTable(50, SPEC, 0)
    ids = np.array([7, 3, 41], dtype=np.int64)
    with EmbeddingStore.create(tmp_path / "s", num_rows=50, spec=SPEC) as store:
        store.put(ids[:2], np.full((2, SPEC.width), 2.5, np.float32))
        ram.put(ids[:2], np.full((2, SPEC.width), 2.5, np.float32), 0)
        rows = store.peek(ids, cols="all")
        expected = hashlib.sha256(rows.astype(np.float32).tobytes()).hexdigest()
        assert store.table_sha256(ids=ids) == expected == ram.table_sha256(ids)
        assert store.table_sha256() == ram.table_sha256() != expected
        with pytest.raises(IndexError, match="outside"):
            store.table_sha256(ids=[50])
    hashed = EmbeddingStore.create(tmp_path / "h", num_rows=50, spec=SPEC, key_space="hashed")
    with hashed, pytest.raises(ValueError, match="needs a dense key space"):
        hashed.table_sha256(ids=[1])


def test_pinned_rows_stay_resident_and_cost_no_reads(tmp_path: Path) -> None:
    # A cache of about a thousand rows; rows 0-99 pinned. A stream of gets over rows 100-4999
    # (many times the cache) evicts everything else, yet the pinned rows are still hits,
    # and their updates survive a reopen.
    spec = RowSpec(embedding_dim=8, optimizer=OptimizerConfig(kind="sgd", lr=1.0))
    config = EmbeddingStore.Config(memory_budget_bytes=160 << 10)
    hot = np.arange(100)
    with EmbeddingStore.create(tmp_path / "s", num_rows=5000, spec=spec, config=config) as store:
        capacity = store.cache_rows
        assert 200 < capacity < 2000
        assert store.pin(hot) == 100 and store.stats()["pinned_rows"] == 100
        rng = np.random.default_rng(0)
        for step in range(150):
            ids = np.unique(rng.integers(100, 5000, 40))
            store.get(ids, step=step)
            store.apply_gradients(ids, np.ones((len(ids), 8), np.float32), step=step)
        assert store.stats()["evictions"] > 3 * capacity
        misses = store.stats()["misses"]
        store.get(hot, step=150)
        assert store.stats()["misses"] == misses  # all 100 pinned rows were resident
        store.apply_gradients(hot, np.full((100, 8), 0.5, np.float32), step=150)
        expected = init_rows(hot, spec, 0)[:, :8] - 0.5
        # At most half the cache may be pinned; the number the error names is accepted.
        more = capacity // 2 - 100
        with pytest.raises(ValueError, match=rf"pin at most {more} more"):
            store.pin(np.arange(1000, 1000 + more + 1))
        assert store.pin(np.arange(1000, 1000 + more)) == capacity // 2
        # A batch larger than the unpinned slots says the pinned rows are in the way.
        with pytest.raises(CacheTooSmallError, match=r"of them pinned, so \d+ are left for it"):
            store.get(np.arange(2000, 2000 + capacity - capacity // 2 + 5), step=151)
        assert store.unpin(np.arange(1000, 1000 + more)) == 100
        assert store.unpin() == 0
    with EmbeddingStore.open(tmp_path / "s") as store:
        np.testing.assert_array_equal(store.peek(hot, cols="emb"), expected)


def test_small_bad_inputs_of_the_store_api_get_clear_answers(tmp_path: Path) -> None:
    import copy
    import pickle

    with EmbeddingStore.create(tmp_path / "s", num_rows=20, spec=SPEC) as store:
        # An empty Python list is no ids (numpy calls it float64), not a dtype error.
        assert store.get([]).shape == (0, SPEC.embedding_dim)
        assert store.pin([]) == 0 and store.unpin([]) == 0
        assert store.table_sha256(ids=[]) == hashlib.sha256(b"").hexdigest()
        for bad in (0, -5, 1.5, True):
            with pytest.raises(ValueError, match=r"chunk_rows=.* must be an integer >= 1"):
                store.table_sha256(chunk_rows=bad)
        for attempt in (lambda: pickle.dumps(store), lambda: copy.deepcopy(store)):
            with pytest.raises(TypeError, match="EmbeddingStore cannot be pickled or copied"):
                attempt()


def test_a_budget_below_the_floor_names_a_minimum_that_is_accepted(tmp_path: Path) -> None:
    # One error, one value: the floor (128 KiB) and the table's own needs are named together.
    spec = RowSpec(embedding_dim=8)
    with pytest.raises(ValueError, match=r"set it to at least (\d+)") as info:
        EmbeddingStore.create(
            tmp_path / "a", num_rows=100, spec=spec,
            config=EmbeddingStore.Config(memory_budget_bytes=1000),
        )  # fmt: skip
    minimum = int(str(info.value).rsplit(" ", 1)[1])
    assert minimum == 128 << 10  # a 100-row table needs no more than the floor
    config = EmbeddingStore.Config(memory_budget_bytes=minimum)
    EmbeddingStore.create(tmp_path / "b", num_rows=100, spec=spec, config=config).close()
