"""Hashed key spaces: the vectorised map against a dict, and a store keyed by raw 63-bit ids."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from frugal.store import EmbeddingStore, KeySpaceFullError, OptimizerConfig, RowSpec, init_rows
from frugal.store.errors import StoreError
from frugal.store.keys import HashedKeys

SPEC = RowSpec(embedding_dim=4, optimizer=OptimizerConfig(kind="sgd", lr=0.5))


def test_map_agrees_with_a_dict_in_first_use_order() -> None:
    rng = np.random.default_rng(0)
    keys_map = HashedKeys(5000)
    reference: dict[int, int] = {}
    for _ in range(20):
        # Huge keys, repeats inside a batch, and keys that share a home slot (multiples of 2^52).
        batch = np.concatenate(
            [
                rng.integers(0, 2**63 - 1, 100, dtype=np.int64),
                rng.integers(0, 50, 60, dtype=np.int64) << np.int64(52),
                rng.integers(0, 300, 80, dtype=np.int64),
            ]
        )
        rng.shuffle(batch)
        for key in batch.tolist():
            reference.setdefault(key, len(reference))
        rows = keys_map.lookup_or_insert(batch)
        assert rows.tolist() == [reference[k] for k in batch.tolist()]
    assert keys_map.num_keys == len(reference)
    absent = np.array([2**62 + 12345, 7 << 52], dtype=np.int64)
    expected = [reference.get(int(k), -1) for k in absent]
    assert keys_map.lookup(absent).tolist() == expected
    everything = np.array(list(reference), dtype=np.int64)
    assert keys_map.keys_by_row[keys_map.lookup(everything)].tolist() == everything.tolist()

    rebuilt = HashedKeys(5000)
    rebuilt.restore(keys_map.keys_by_row[: keys_map.num_keys])
    assert rebuilt.lookup(everything).tolist() == keys_map.lookup(everything).tolist()


def test_a_full_map_refuses_new_keys_and_keeps_its_state() -> None:
    keys_map = HashedKeys(3)
    assert keys_map.lookup_or_insert(np.array([10, 20, 10])).tolist() == [0, 1, 0]
    with pytest.raises(KeySpaceFullError, match="2 new keys do not fit: 2 of 3 rows"):
        keys_map.lookup_or_insert(np.array([30, 40, 20]))
    assert keys_map.num_keys == 2
    assert keys_map.lookup(np.array([30, 40])).tolist() == [-1, -1]
    assert keys_map.lookup_or_insert(np.array([30])).tolist() == [2]


def test_store_keyed_by_raw_ids_trains_checkpoints_and_reopens(tmp_path: Path) -> None:
    keys = np.array([2**63 - 1, 5, 2**40 + 3, 987654321987], dtype=np.int64)
    path = tmp_path / "s"
    with EmbeddingStore.create(path, num_rows=16, spec=SPEC, key_space="hashed", seed=4) as store:
        first = store.get(keys)
        # A row starts at the initial value of its key, whatever row it lands in.
        assert np.array_equal(first, init_rows(keys, SPEC, seed=4))
        store.apply_gradients(keys, np.ones((4, 4), dtype=np.float32))
        assert np.allclose(store.peek(keys, cols="emb"), first - 0.5)
        assert store.stats()["num_keys"] == 4
        store.checkpoint()
        store.get(np.array([77]))
        store.put(np.array([77]), np.zeros((1, 4), dtype=np.float32))
        sha_before_close = store.table_sha256()
        store.close(checkpoint=False)  # key 77 is lost with the update
    with EmbeddingStore.open(path) as store:
        assert store.stats()["num_keys"] == 4
        assert np.allclose(store.peek(keys, cols="emb"), first - 0.5)
        # An unseen key peeks as its initial value and is not inserted.
        assert np.array_equal(store.peek(np.array([77])), init_rows(np.array([77]), SPEC, 4))
        assert store.stats()["num_keys"] == 4
        assert store.table_sha256() != sha_before_close


def test_table_hash_does_not_depend_on_the_order_keys_arrived(tmp_path: Path) -> None:
    keys = np.array([9, 2**50, 3, 2**33 + 1], dtype=np.int64)
    hashes = []
    for name, order in (("a", [0, 1, 2, 3]), ("b", [3, 1, 0, 2])):
        with EmbeddingStore.create(
            tmp_path / name, num_rows=8, spec=SPEC, key_space="hashed"
        ) as store:
            for k in order:  # one key at a time: different rows in the two stores
                store.get(keys[k : k + 1])
                store.apply_gradients(keys[k : k + 1], np.full((1, 4), k, dtype=np.float32))
            hashes.append(store.table_sha256())
            # ...nor on the chunking (it follows the memory budget): each key is hashed with
            # its row, not a chunk's keys then its rows.
            assert store.table_sha256(chunk_rows=3) == hashes[-1]
    assert hashes[0] == hashes[1]


def test_hashed_store_rejects_negative_keys_and_overflow(tmp_path: Path) -> None:
    with EmbeddingStore.create(tmp_path / "s", num_rows=2, spec=SPEC, key_space="hashed") as store:
        with pytest.raises(IndexError, match=r"ids must be >= 0 in a hashed key space"):
            store.get(np.array([-3]))
        with pytest.raises(IndexError, match=r"outside \[0, 2\^63\)"):
            store.get(np.array([2**63], dtype=np.uint64))
        store.get(np.array([1, 2]))
        store.apply_gradients(np.array([1, 2]), np.zeros((2, 4), dtype=np.float32))
        with pytest.raises(KeySpaceFullError, match="larger num_rows"):
            store.get(np.array([3]))
    with pytest.raises(ValueError, match="key_space='sparse'"):
        EmbeddingStore.create(tmp_path / "t", num_rows=2, spec=SPEC, key_space="sparse")  # type: ignore[arg-type]


def test_errors_in_a_hashed_store_name_the_users_ids(tmp_path: Path) -> None:
    from frugal.store import NonFiniteError

    spec = RowSpec(embedding_dim=2, dtype="float16")
    with EmbeddingStore.create(tmp_path / "s", num_rows=8, spec=spec, key_space="hashed") as s:
        s.peek(np.array([50]))
        s.put(np.array([9, 10]), np.zeros((2, 2), dtype=np.float32))  # rows 0, 1
        rows = np.zeros((1, 2), dtype=np.float32)
        rows[0, 1] = 1e6
        with pytest.raises(NonFiniteError, match="row of id 123456789 exceeds"):
            s.put(np.array([123456789]), rows)


def test_a_non_finite_update_in_a_hashed_store_names_the_users_id(tmp_path: Path) -> None:
    from frugal.store import NonFiniteError

    spec = RowSpec(embedding_dim=2, optimizer=OptimizerConfig(kind="adagrad"))
    with EmbeddingStore.create(tmp_path / "s", num_rows=8, spec=spec, key_space="hashed") as s:
        keys = np.array([7 << 52, 42], dtype=np.int64)  # rows 0 and 1, in first-use order
        s.get(keys, step=2)
        before = s.peek(keys)
        grads = np.zeros((2, 2), dtype=np.float32)
        grads[1, 0] = 3e38  # its square overflows float32: only key 42's update is not finite
        with pytest.raises(NonFiniteError, match="adagrad update of id 42 is not finite"):
            s.apply_gradients(keys, grads, step=2)
        assert np.array_equal(s.peek(keys), before)  # nothing was written
        s.put(keys, before)  # close the reads


def test_checkpoint_records_the_last_step_used(tmp_path: Path) -> None:
    with EmbeddingStore.create(tmp_path / "s", num_rows=4, spec=SPEC) as store:
        store.get(np.array([1]), step=3)
        store.apply_gradients(np.array([1]), np.ones((1, 4), dtype=np.float32), step=3)
        store.checkpoint()
        assert store.step == 3


def test_deletes_and_reinserts_agree_with_a_dict_and_reuse_freed_rows() -> None:
    """Random inserts and deletes (through tombstone rebuilds) against a dict reference."""
    rng = np.random.default_rng(1)
    capacity = 600
    keys_map = HashedKeys(capacity)
    reference: dict[int, int] = {}
    free: list[int] = []  # the map's free stack, top last
    used = 0
    rebuilds_seen = 0
    for _ in range(60):
        batch = rng.integers(0, 2000, 50, dtype=np.int64) << np.int64(rng.integers(0, 40))
        new = [k for k in dict.fromkeys(batch.tolist()) if k not in reference]
        room = capacity - len(reference)
        if len(new) > room:  # delete enough of the oldest keys first
            in_batch = set(batch.tolist())
            oldest = [k for k in reference if k not in in_batch]
            victims = np.array(oldest[: len(new) - room + 10], dtype=np.int64)
            freed = keys_map.delete(np.concatenate([victims, victims[:3]]))  # repeats ignored
            expected_rows = [reference.pop(k) for k in sorted(victims.tolist())]
            assert freed.tolist() == expected_rows  # rows in key order
            free.extend(expected_rows)
            rebuilds_seen += keys_map._tombstones == 0
        before_free = list(free)
        for key in new:  # recycled rows first (stack top first), then fresh rows
            if free:
                reference[key] = free.pop()
            else:
                reference[key] = used
                used += 1
        rows = keys_map.lookup_or_insert(batch)
        assert rows.tolist() == [reference[k] for k in batch.tolist()]
        recycled = keys_map.take_recycled()
        assert recycled.tolist() == sorted(set(before_free) - set(free))
        assert keys_map.num_keys == len(reference)
    assert rebuilds_seen > 0  # the tombstones forced at least one rebuild
    live = keys_map.live_rows()
    assert sorted(live.tolist()) == sorted(reference.values())
    absent = np.array([k for k in range(2000) if k not in reference][:50], dtype=np.int64)
    assert (keys_map.lookup(absent) == -1).all()

    rebuilt = HashedKeys(capacity)  # a checkpoint with holes restores the same map
    rebuilt.restore(keys_map.keys_by_row[: keys_map.rows_used])
    everything = np.array(list(reference), dtype=np.int64)
    assert rebuilt.lookup(everything).tolist() == keys_map.lookup(everything).tolist()
    assert rebuilt.num_keys == len(reference)
    holes = np.flatnonzero(keys_map.keys_by_row[: keys_map.rows_used] < 0)
    got = rebuilt.lookup_or_insert(np.array([2**61 + 1], dtype=np.int64))
    assert got.tolist() == ([int(holes.min())] if len(holes) else [keys_map.rows_used])


def test_a_full_map_takes_new_keys_after_a_delete() -> None:
    keys_map = HashedKeys(3)
    keys_map.lookup_or_insert(np.array([10, 20, 30]))
    with pytest.raises(KeySpaceFullError):
        keys_map.lookup_or_insert(np.array([40]))
    assert keys_map.delete(np.array([20, 99])).tolist() == [1]
    assert keys_map.lookup(np.array([20])).tolist() == [-1]
    assert keys_map.lookup_or_insert(np.array([40, 10])).tolist() == [1, 0]
    assert keys_map.take_recycled().tolist() == [1]
    assert keys_map.take_recycled().tolist() == []
    with pytest.raises(ValueError, match="distinct and >= 0"):
        HashedKeys(4).restore(np.array([5, -2], dtype=np.int64))


@pytest.mark.parametrize("backend", ["memory", "file"])
def test_a_deleted_key_reads_its_initial_value_and_its_row_is_reset_for_the_next(
    tmp_path: Path, backend: str
) -> None:
    """A new key that takes a deleted key's row reads its own initial value.

    Also where the old key's trained row reached the disk (a small cache evicts it).
    """
    spec = RowSpec(embedding_dim=64, optimizer=OptimizerConfig(kind="sgd", lr=0.5))
    budget = 600_000 if backend == "memory" else 1 << 18  # the memory backend holds every row
    config = EmbeddingStore.Config(backend=backend, memory_budget_bytes=budget)
    path = tmp_path / "s"
    with EmbeddingStore.create(
        path, num_rows=1200, spec=spec, key_space="hashed", seed=3, config=config
    ) as store:
        assert store.cache_rows < 800  # a third of the trained rows or more are evicted
        keys = np.arange(1000, 2200, dtype=np.int64)
        for chunk in np.array_split(keys, 8):  # train every key once: rows on disk
            store.get(chunk)
            store.apply_gradients(chunk, np.ones((len(chunk), 64), dtype=np.float32))
        store.flush()
        trained = store.peek(keys)
        assert not np.array_equal(trained, init_rows(keys, spec, 3))
        with pytest.raises(KeySpaceFullError):
            store.get(np.array([5]))
        store.get(keys[:2])
        with pytest.raises(StoreError, match="key 1000 has an open read"):
            store.delete(keys[:4])
        assert store.stats()["num_keys"] == 1200  # nothing deleted
        store.release(keys[:2])
        assert store.delete(np.concatenate([keys[:50], [7]])) == 50
        assert store.stats()["num_keys"] == 1150
        assert np.array_equal(store.peek(keys[:50]), init_rows(keys[:50], spec, 3))
        newcomers = np.arange(5, 55, dtype=np.int64)  # take the 50 freed rows
        got = store.get(newcomers, cols="all")
        assert np.array_equal(got, init_rows(newcomers, spec, 3))
        store.apply_gradients(newcomers, np.ones((50, 64), dtype=np.float32))
        assert np.array_equal(store.peek(keys[50:]), trained[50:])  # the others untouched
        after = store.peek(newcomers)
        sha = store.table_sha256()
    with EmbeddingStore.open(path) as store:  # the key map with its holes reopens
        assert store.stats()["num_keys"] == 1200
        assert np.array_equal(store.peek(newcomers), after)
        assert np.array_equal(store.peek(keys[:50]), init_rows(keys[:50], spec, 3))
        assert store.table_sha256() == sha
        with pytest.raises(ValueError, match="needs a hashed key space"):
            EmbeddingStore.create(tmp_path / "d", num_rows=4, spec=spec).delete([1])


def test_deleting_a_pinned_key_unpins_its_row(tmp_path: Path) -> None:
    with EmbeddingStore.create(tmp_path / "s", num_rows=8, spec=SPEC, key_space="hashed") as s:
        assert s.pin(np.array([11, 12])) == 2
        assert s.delete(np.array([11])) == 1
        assert s.stats()["pinned_rows"] == 1  # only key 12's row stays pinned
        s.get(np.array([13]))  # takes key 11's freed row
        s.release(np.array([13]))
        assert s.stats()["pinned_rows"] == 1
