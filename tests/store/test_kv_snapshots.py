"""What the RocksDB and LMDB backends share: checkpoint folders, keys and values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from frugal.store.backends.kv import _SnapshotFolders
from frugal.store.errors import StoreCorruptionError


def test_restore_copies_the_snapshot_over_the_live_folder(tmp_path: Path) -> None:
    folders = _SnapshotFolders(tmp_path, "lmdb")
    assert folders.live == tmp_path / "lmdb"
    assert folders.folder(3) == tmp_path / "lmdb.ckpt.3"
    folders.live.mkdir()
    (folders.live / "data.mdb").write_text("after the checkpoint")
    (folders.live / "extra").write_text("only live")
    folders.folder(3).mkdir()
    (folders.folder(3) / "data.mdb").write_text("at the checkpoint")
    folders.restore(3, marker="data.mdb")
    assert sorted(p.name for p in folders.live.iterdir()) == ["data.mdb"]
    assert (folders.live / "data.mdb").read_text() == "at the checkpoint"
    assert (folders.folder(3) / "data.mdb").read_text() == "at the checkpoint"  # kept


def test_restore_links_immutable_files_and_copies_the_rest(tmp_path: Path) -> None:
    folders = _SnapshotFolders(tmp_path, "rocksdb", (".sst",))
    snapshot = folders.folder(1)
    (snapshot / "sub").mkdir(parents=True)
    (snapshot / "000012.sst").write_text("table")
    (snapshot / "sub" / "000013.sst").write_text("nested table")
    (snapshot / "MANIFEST-000009").write_text("manifest")
    folders.restore(1)
    for name in ("000012.sst", "sub/000013.sst"):  # the same file: no space taken
        assert (folders.live / name).stat().st_ino == (snapshot / name).stat().st_ino
    manifest = folders.live / "MANIFEST-000009"
    assert manifest.stat().st_ino != (snapshot / "MANIFEST-000009").stat().st_ino  # a copy
    manifest.write_text("changed by the live engine")
    assert (snapshot / "MANIFEST-000009").read_text() == "manifest"  # the checkpoint is not


def test_restore_refuses_a_missing_or_incomplete_snapshot(tmp_path: Path) -> None:
    folders = _SnapshotFolders(tmp_path, "rocksdb")
    with pytest.raises(StoreCorruptionError, match=r"rocksdb\.ckpt\.2: checkpoint 2 is missing"):
        folders.restore(2)
    folders.folder(2).mkdir()  # a folder without the marker file: an interrupted copy
    with pytest.raises(StoreCorruptionError, match="checkpoint 2 is missing"):
        folders.restore(2, marker="data.mdb")
    folders.restore(2)  # without a marker, the folder suffices
    assert folders.live.is_dir()


def test_fresh_clears_a_partial_copy_and_drop_older_keeps_one(tmp_path: Path) -> None:
    folders = _SnapshotFolders(tmp_path, "rocksdb")
    for epoch in (1, 2, 3):
        folders.folder(epoch).mkdir()
    (folders.folder(3) / "partial").write_text("x")
    target = folders.fresh(3)
    assert target == tmp_path / "rocksdb.ckpt.3" and not target.exists()
    target.mkdir()
    (tmp_path / "rocksdb").mkdir()  # the live folder is never a checkpoint
    folders.drop_older(3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rocksdb", "rocksdb.ckpt.3"]


def test_id_items_and_rows_from_values_round_trip_float16_rows() -> None:
    from frugal.store.backends.kv import id_items, rows_from_values

    ids = np.array([3, 258], dtype=np.int64)
    rows = np.array([[1.0, -2.0], [0.5, 65504.0]], dtype=np.float32)
    items = id_items(ids, rows, np.dtype(np.float16))
    # Keys: 8-byte big-endian ids; values: 2 float16 = 4 bytes per row.
    assert [key for key, _ in items] == [b"\0" * 7 + b"\x03", b"\0" * 6 + b"\x01\x02"]
    assert [len(value) for _, value in items] == [4, 4]
    out = np.full((3, 2), 7.0, dtype=np.float32)
    values = [items[0][1], None, items[1][1]]
    present = rows_from_values(values, out, 4, "here", np.dtype(np.float16))
    assert present.tolist() == [True, False, True]
    assert out.tolist() == [[1.0, -2.0], [7.0, 7.0], [0.5, 65504.0]]  # the gap is untouched
    with pytest.raises(StoreCorruptionError, match="here: a stored value is not 8 bytes"):
        rows_from_values(values, out, 8, "here", np.dtype(np.float32))


@pytest.mark.parametrize("backend", ["rocksdb", "lmdb"])
def test_a_reopened_store_is_its_checkpoint_whatever_was_written_after(
    tmp_path: Path, backend: str
) -> None:
    from frugal.store import EmbeddingStore, OptimizerConfig, RowSpec

    spec = RowSpec(embedding_dim=4, optimizer=OptimizerConfig(kind="sgd"))
    config = EmbeddingStore.Config(backend=backend, memory_budget_bytes=1 << 20)
    directory = tmp_path / "store"
    with EmbeddingStore.create(directory, num_rows=3000, spec=spec, config=config) as store:
        store.put(np.arange(2000), np.full((2000, 4), 7.0, np.float32))  # checkpointed on close
    store = EmbeddingStore.open(directory, config)
    store.put(np.arange(1000, 3000), np.full((2000, 4), 9.0, np.float32), step=1)
    store.flush()
    store.close(checkpoint=False)  # as if killed: the live folder is past its checkpoint
    with EmbeddingStore.open(directory, config) as reopened:
        rows = reopened.peek(np.arange(2000), cols="emb")
        assert np.all(rows == 7.0)
        if backend == "rocksdb":  # its tables were linked back from the checkpoint, not copied
            (checkpoint,) = directory.glob("rocksdb.ckpt.*")
            linked = {t.stat().st_ino for t in checkpoint.glob("*.sst")}
            live = {t.stat().st_ino for t in (directory / "rocksdb").glob("*.sst")}
            assert linked & live  # (a compaction may have replaced some since)


@pytest.mark.parametrize("kind", ["json", "npy"])
def test_an_atomic_write_that_fails_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    import errno
    import os

    from frugal.store.backends.base import save_array_atomic, write_json_atomic

    path = tmp_path / f"index.{kind}"
    write = (
        (lambda value: write_json_atomic(path, {"v": value}))
        if kind == "json"
        else (lambda value: save_array_atomic(path, np.array([value])))
    )
    write(1)
    before = path.read_bytes()

    def full(fd: int) -> None:  # the disk fills up as the new file is synced
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        write(2)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no .tmp holds the space


@pytest.mark.parametrize(("free", "named"), [(0, True), (64 << 20, False)])
def test_a_background_failure_names_a_full_disk_only_when_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, free: int, named: bool
) -> None:
    # LMDB reports a short write on a full disk as an I/O error: the free space says why.
    import frugal.disk
    from frugal.store.backends.memory import MemoryBackend
    from frugal.store.cache import RowCache
    from frugal.store.errors import StoreError

    backend = MemoryBackend(tmp_path, 10, 2, None)  # it has a directory (its checkpoints)
    cache = RowCache(
        backend, num_rows=10, width=2, capacity=4, initializer=lambda ids: np.zeros((len(ids), 2)),
        staleness_bound=0,
    )  # fmt: skip
    monkeypatch.setattr(frugal.disk, "free_bytes", lambda path: free)
    cache.error = OSError("mdb_txn_commit: Input/output error")
    with pytest.raises(StoreError) as info, cache.cond:
        cache._check()
    message = str(info.value)
    assert "mdb_txn_commit: Input/output error" in message
    assert (f"the disk holding {tmp_path} is full (0 B free)" in message) is named


def _rocksdb_store(directory: Path) -> Path:
    """A closed RocksDB store of 3000 rows of 7.0; returns its checkpoint folder."""
    from frugal.store import EmbeddingStore, OptimizerConfig, RowSpec

    spec = RowSpec(embedding_dim=4, optimizer=OptimizerConfig(kind="sgd"))
    config = EmbeddingStore.Config(backend="rocksdb", memory_budget_bytes=1 << 20)
    with EmbeddingStore.create(directory, num_rows=3000, spec=spec, config=config) as store:
        store.put(np.arange(3000), np.full((3000, 4), 7.0, np.float32))  # checkpointed on close
    (checkpoint,) = directory.glob("rocksdb.ckpt.*")
    return checkpoint


def _flip_in_place(path: Path, position: int) -> None:
    """Flip one bit of `path` (its hard links, such as the live folder's, see it too)."""
    with path.open("r+b") as fh:
        fh.seek(position)
        byte = fh.read(1)[0]
        fh.seek(position)
        fh.write(bytes([byte ^ 0x01]))


def _read_all(directory: Path) -> np.ndarray:
    from frugal.store import EmbeddingStore

    with EmbeddingStore.open(directory) as store:
        rows: np.ndarray = store.peek(np.arange(3000), cols="emb")
        store.close(checkpoint=False)
    return rows


def test_a_rocksdb_checkpoint_without_current_is_refused_not_started_empty(
    tmp_path: Path,
) -> None:
    # Before: RocksDB (create_if_missing) could start an empty database over the tables, so
    # every row read as its initial value instead of 7.0.
    checkpoint = _rocksdb_store(tmp_path / "s")
    (checkpoint / "CURRENT").unlink()
    with pytest.raises(StoreCorruptionError, match=r"ckpt\.1/CURRENT is missing.*from a backup"):
        _read_all(tmp_path / "s")


def test_a_flipped_byte_in_a_rocksdb_table_is_a_store_corruption_error(tmp_path: Path) -> None:
    checkpoint = _rocksdb_store(tmp_path / "s")
    (table,) = checkpoint.glob("*.sst")
    _flip_in_place(table, 200)  # inside the first data block (rows 0...)
    with pytest.raises(StoreCorruptionError) as info:
        _read_all(tmp_path / "s")
    message = str(info.value)
    assert "RocksDB found corruption" in message and "checksum mismatch" in message
    assert table.name in message and "restore the store folder from a backup" in message


def test_a_flipped_byte_in_rocksdb_manifest_is_a_store_corruption_error(tmp_path: Path) -> None:
    checkpoint = _rocksdb_store(tmp_path / "s")
    (manifest,) = checkpoint.glob("MANIFEST-*")
    _flip_in_place(manifest, 20)
    with pytest.raises(StoreCorruptionError, match=rf"recovering checkpoint 1 .*{manifest.name}"):
        _read_all(tmp_path / "s")
