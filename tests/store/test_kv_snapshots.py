"""The checkpoint folders shared by the RocksDB and LMDB backends."""

from __future__ import annotations

from pathlib import Path

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
