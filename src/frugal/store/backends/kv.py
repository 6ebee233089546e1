"""Key-value engine backends: RocksDB (rocksdict) and LMDB.

Keys are 8-byte big-endian ids (so the engine's order is the id order); values are the raw
float32 row bytes. These are real engines: the same ones the KV-offload baselines use.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from frugal._typing import F32, I64, Bool
from frugal.disk import disk_filled_error, guard_write, mentions_disk_full
from frugal.store.backends.registry import BackendArgs, register_backend
from frugal.store.errors import StoreCorruptionError

__all__ = ["LmdbBackend", "RocksDbBackend", "id_items", "id_keys", "rows_from_values"]

_MIN_BLOCK_CACHE_BYTES = 1 << 20
_RESTORE_FIX = "restore the store folder from a backup (frugal never repairs a store)"
_FULL_DISK_FIX = "free space there, then close or checkpoint the store again"


def id_keys(ids: I64) -> list[bytes]:
    """Return the 8-byte big-endian key of every id (0.3 us/key: one tobytes, then slices)."""
    blob = ids.astype(">u8").tobytes()
    return [blob[k : k + 8] for k in range(0, len(blob), 8)]


def id_items(ids: I64, rows: F32, dtype: np.dtype[Any]) -> list[tuple[bytes, bytes]]:
    """Return the (key, value) pairs of a batch put: `id_keys` and each row's bytes in `dtype`.

    Shapes:
        ids: (N,); rows: (N, W); returns N pairs, each value W x dtype.itemsize bytes.
    """
    blob = np.ascontiguousarray(rows, dtype=dtype).tobytes()
    row_bytes = dtype.itemsize * rows.shape[1]
    return [(key, blob[k * row_bytes : (k + 1) * row_bytes]) for k, key in enumerate(id_keys(ids))]


def rows_from_values(
    values: list[bytes | None], out: F32, row_bytes: int, where: str, dtype: np.dtype[Any]
) -> Bool:
    """Decode a multi-get's values into `out`; return which ids had one (others untouched).

    Args:
        values: One stored value per id, or None where the id was never written.
        out: Rows to fill, float32.
        row_bytes: Size of one stored value (W x dtype.itemsize).
        where: What to name in an error (the store folder, the engine).
        dtype: Precision the values are stored in.

    Raises:
        StoreCorruptionError: If a stored value is not `row_bytes` long.

    Shapes:
        values: N items; out: (N, W); returns (N,).
    """
    present = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
    found = [v for v in values if v is not None]
    if found:
        if any(len(v) != row_bytes for v in found):
            raise StoreCorruptionError(f"{where}: a stored value is not {row_bytes} bytes")
        out[present] = np.frombuffer(b"".join(found), dtype=dtype).reshape(len(found), -1)
    return present


class _SnapshotFolders:
    """Checkpoints of a KV engine as whole folders: `<name>.ckpt.<epoch>` beside `<name>`.

    The live engine works in `directory / name`; checkpoint e is a complete copy of it in
    `directory / "<name>.ckpt.<e>"`, made by the engine itself. Recovery replaces the live
    folder with that copy, since the live one may hold writes made after the checkpoint.

    Args:
        directory: The store folder.
        name: The live folder's name ("rocksdb", "lmdb").
        immutable_suffixes: Files the engine never changes once written (RocksDB's `.sst`
            and `.blob`): recovery hard-links them instead of copying, so it needs free space
            only for the small mutable files, as RocksDB's own checkpoints do.
    """

    def __init__(
        self, directory: Path, name: str, immutable_suffixes: tuple[str, ...] = ()
    ) -> None:
        self.directory = directory
        self.name = name
        self.live = directory / name
        self.immutable_suffixes = immutable_suffixes

    def folder(self, epoch: int) -> Path:
        """The folder of checkpoint `epoch`."""
        return self.directory / f"{self.name}.ckpt.{epoch}"

    def restore(self, epoch: int, marker: str = "") -> None:
        """Replace the live folder by checkpoint `epoch`'s copy (the checkpoint is untouched).

        Args:
            epoch: The checkpoint to recover.
            marker: A file that every complete copy holds ("" = the folder itself suffices).

        Raises:
            StoreCorruptionError: If the copy (or its marker file) is missing.
            DiskFullError: If the copy does not fit on the disk (checked after the live folder
                is removed, and raised if the copy fails on a full disk anyway); the
                checkpoint stays whole and opening again with more space recovers.
        """
        snapshot = self.folder(epoch)
        if not ((snapshot / marker).is_file() if marker else snapshot.is_dir()):
            raise StoreCorruptionError(f"{snapshot}: checkpoint {epoch} is missing")
        shutil.rmtree(self.live, ignore_errors=True)
        files = [p for p in sorted(snapshot.rglob("*")) if p.is_file()]
        copied = {p for p in files if p.suffix not in self.immutable_suffixes}
        with guard_write(
            self.live,
            what=f"recovering {self.live} from checkpoint {epoch}",
            needed_bytes=sum(p.stat().st_size for p in copied),
            kept=f"the checkpoint {snapshot} is intact",
            fix="free space there, then open the store again",
            partial=[self.live],
        ):
            self.live.mkdir()
            for source in files:
                target = self.live / source.relative_to(snapshot)
                target.parent.mkdir(parents=True, exist_ok=True)
                if source in copied or not _hard_link(source, target):
                    shutil.copy2(source, target)

    def fresh(self, epoch: int) -> Path:
        """Return checkpoint `epoch`'s folder, removing a partial one left by a crash."""
        target = self.folder(epoch)
        shutil.rmtree(target, ignore_errors=True)
        return target

    def drop_older(self, epoch: int) -> None:
        """Delete every checkpoint folder but `epoch`'s."""
        for path in self.directory.glob(f"{self.name}.ckpt.*"):
            if path != self.folder(epoch):
                shutil.rmtree(path, ignore_errors=True)


def _hard_link(source: Path, target: Path) -> bool:
    """Hard-link `target` to `source`; False where the file system cannot (then copy)."""
    try:
        os.link(source, target)
    except OSError as exc:
        if exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            return False
        raise
    return True


def rocksdb_options(budget_bytes: int, *, use_direct_io: bool = True, use_wal: bool = True) -> Any:
    """RocksDB options for point lookups of fixed rows within a memory budget.

    No compression, a 10-bit bloom filter, index and filter blocks in a block cache of half
    the budget, two memtables of a quarter each (so caches + memtables <= budget), direct
    reads and direct flush/compaction I/O (store.md, section 2.5).
    """
    import rocksdict

    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_compression_type(rocksdict.DBCompressionType.none())
    table = rocksdict.BlockBasedOptions()
    table.set_block_cache(rocksdict.Cache(max(_MIN_BLOCK_CACHE_BYTES, budget_bytes // 2)))
    table.set_bloom_filter(10, False)
    table.set_cache_index_and_filter_blocks(True)
    options.set_block_based_table_factory(table)
    options.set_write_buffer_size(max(_MIN_BLOCK_CACHE_BYTES, budget_bytes // 8))
    options.set_max_write_buffer_number(2)
    options.set_db_write_buffer_size(max(2 * _MIN_BLOCK_CACHE_BYTES, budget_bytes // 4))
    options.optimize_for_point_lookup(max(1, budget_bytes // 2 // (1 << 20)))
    if use_direct_io:
        options.set_use_direct_reads(True)
        options.set_use_direct_io_for_flush_and_compaction(True)
    del use_wal  # the WAL is chosen per write (WriteOptions), see RocksDbBackend
    return options


class RocksDbBackend:
    """Rows in RocksDB through rocksdict; checkpoints are RocksDB checkpoints (hard links)."""

    direct_io = True
    budget_enforced = True

    def __init__(
        self,
        directory: Path,
        num_rows: int,
        width: int,
        epoch: int | None,
        budget_bytes: int,
        *,
        dtype: str = "float32",
    ) -> None:
        """Create the database (`epoch` None) or recover checkpoint `epoch` into the live one.

        Raises:
            StoreCorruptionError: If the checkpoint's CURRENT file is missing, or RocksDB finds
                corruption while opening (a table or its MANIFEST fails its checksum).
            DiskFullError: If the disk fills up during recovery; the checkpoint stays intact.
        """
        import rocksdict

        self.directory = directory
        self.dtype = np.dtype(dtype)
        self.row_bytes = self.dtype.itemsize * width
        self.budget_bytes = budget_bytes
        self.snapshots = _SnapshotFolders(directory, "rocksdb", (".sst", ".blob"))
        options = rocksdb_options(budget_bytes)
        if epoch is not None:
            current = self.snapshots.folder(epoch) / "CURRENT"
            if self.snapshots.folder(epoch).is_dir() and not current.is_file():
                # Without CURRENT, RocksDB cannot find its tables and would start an empty
                # database: every row would read as its initial value.
                raise StoreCorruptionError(
                    f"{current} is missing (RocksDB's pointer to its MANIFEST, which lists the "
                    f"tables of checkpoint {epoch}); {_RESTORE_FIX}"
                )
            self.snapshots.restore(epoch)
            options.create_if_missing(False)  # a recovered database must exist
        what = "creating" if epoch is None else f"recovering checkpoint {epoch} of"
        try:
            self.db = rocksdict.Rdict(str(self.snapshots.live), options)
        except Exception as exc:  # rocksdict raises plain Exception with RocksDB's status
            raise self._engine_error(
                exc,
                f"{what} {self.snapshots.live}",
                kept=""
                if epoch is None
                else f"the checkpoint {self.snapshots.folder(epoch)} is intact",
                fix="free space there, then open the store again",
            ) from exc
        self.write_options = rocksdict.WriteOptions()

    def _engine_error(self, exc: Exception, what: str, *, kept: str, fix: str) -> Exception:
        """RocksDB's error as a typed store error: corruption or a full disk; else itself.

        RocksDB's status text names the file it failed on (`Corruption: block checksum
        mismatch ... in <folder>/000009.sst`), so it is kept in the message.
        """
        text = str(exc)
        if text.startswith("Corruption") or "Corruption:" in text:
            return StoreCorruptionError(
                f"{self.snapshots.live}: RocksDB found corruption while {what} [{text}]; "
                f"{_RESTORE_FIX}"
            )
        if mentions_disk_full(text):
            return disk_filled_error(
                self.snapshots.live, what=what, written_bytes=0, detail=text, kept=kept, fix=fix
            )
        return exc

    def read_rows(self, ids: I64, out: F32) -> Bool:
        """Multi-get; see `StoreBackend.read_rows`.

        Raises:
            StoreCorruptionError: If RocksDB finds a block that fails its checksum, or a value
                is not one row long.
        """
        keys: Any = id_keys(ids)  # rocksdict's stub wants list[str | int | ... | bytes]
        try:
            values: list[bytes | None] = self.db.get(keys) or []
        except Exception as exc:  # rocksdict raises plain Exception with RocksDB's status
            raise self._engine_error(exc, "reading rows", kept="", fix="") from exc
        return rows_from_values(values, out, self.row_bytes, str(self.directory), self.dtype)

    def write_rows(self, ids: I64, rows: F32) -> None:
        """One WriteBatch; see `StoreBackend.write_rows`.

        Raises:
            DiskFullError: If the disk is full (the last checkpoint is intact).
            StoreCorruptionError: If RocksDB reports corruption.
        """
        import rocksdict

        batch = rocksdict.WriteBatch(raw_mode=True)
        for key, value in id_items(ids, rows, self.dtype):
            batch.put(key, value)
        self._run(lambda: self.db.write(batch, self.write_options), "writing rows")

    def _run(self, action: Any, what: str) -> None:
        """Run a RocksDB call that writes, turning its errors into typed ones."""
        try:
            action()
        except Exception as exc:  # rocksdict raises plain Exception with RocksDB's status
            raise self._engine_error(
                exc, what, kept="the last checkpoint is intact", fix=_FULL_DISK_FIX
            ) from exc

    def sync(self) -> None:
        """Flush memtables and the WAL to disk.

        Raises:
            DiskFullError: If the disk is full (the last checkpoint is intact).
            StoreCorruptionError: If RocksDB reports corruption.
        """
        self._run(lambda: self.db.flush(wait=True), "flushing memtables")
        self._run(lambda: self.db.flush_wal(sync=True), "syncing the write-ahead log")

    def checkpoint(self, epoch: int) -> dict[str, Any]:
        """Create `rocksdb.ckpt.<epoch>` with RocksDB's checkpoint (hard-linked SST files).

        Raises:
            DiskFullError: If the disk is full (the previous checkpoint is intact).
            StoreCorruptionError: If RocksDB reports corruption.
        """
        import rocksdict

        target = self.snapshots.fresh(epoch)
        try:
            rocksdict.Checkpoint(self.db).create_checkpoint(str(target))
        except Exception as exc:  # rocksdict raises plain Exception with RocksDB's status
            shutil.rmtree(target, ignore_errors=True)  # a partial copy: give its space back
            raise self._engine_error(
                exc,
                f"RocksDB checkpoint {epoch} of {self.directory}",
                kept="the previous checkpoint is intact",
                fix=_FULL_DISK_FIX,
            ) from exc
        return {}

    def finish_checkpoint(self, epoch: int) -> None:
        """Delete older checkpoint folders."""
        self.snapshots.drop_older(epoch)

    def memory_bytes(self) -> int:
        """The configured block cache and memtables (RocksDB's own accounting)."""
        return self.budget_bytes

    def close(self) -> None:
        """Close the database."""
        with contextlib.suppress(Exception):  # rocksdict raises DbClosedError if closed twice
            self.db.close()


class LmdbBackend:
    """Rows in LMDB (memory-mapped B+tree); the OS page cache holds it, so no budget."""

    direct_io = False
    budget_enforced = False

    def __init__(
        self,
        directory: Path,
        num_rows: int,
        width: int,
        epoch: int | None,
        *,
        dtype: str = "float32",
    ) -> None:
        import lmdb

        self.directory = directory
        self.dtype = np.dtype(dtype)
        self.row_bytes = self.dtype.itemsize * width
        self.snapshots = _SnapshotFolders(directory, "lmdb")
        if epoch is not None:
            self.snapshots.restore(epoch, marker="data.mdb")
        self.snapshots.live.mkdir(exist_ok=True)
        # Room for every row twice over plus B+tree overhead; the map is sparse on disk. Pages
        # are written with write(2), not through a writable map (writemap): on a full disk a
        # store through the map is a SIGBUS that kills the process without a word, a write
        # is an error the store reports.
        map_size = max(1 << 24, 3 * num_rows * (self.row_bytes + 64))
        self.env = lmdb.open(
            str(self.snapshots.live), map_size=map_size, writemap=False, sync=False
        )

    def read_rows(self, ids: I64, out: F32) -> Bool:
        """`getmulti` in one read transaction; see `StoreBackend.read_rows`."""
        keys = id_keys(ids)
        with self.env.begin() as txn:
            found = dict(txn.cursor().getmulti(keys))
        return rows_from_values(
            [found.get(k) for k in keys], out, self.row_bytes, str(self.directory), self.dtype
        )

    def write_rows(self, ids: I64, rows: F32) -> None:
        """`putmulti` in one write transaction; see `StoreBackend.write_rows`."""
        items = id_items(ids, rows, self.dtype)
        with self.env.begin(write=True) as txn:
            txn.cursor().putmulti(items)

    def sync(self) -> None:
        """Force the memory map to disk."""
        self.env.sync(True)

    def checkpoint(self, epoch: int) -> dict[str, Any]:
        """Copy the environment to `lmdb.ckpt.<epoch>` (`env.copy`, a consistent snapshot).

        Raises:
            DiskFullError: If the copy (its used pages) does not fit; nothing of it is left
                and the previous checkpoint is intact.
        """
        import lmdb

        target = self.snapshots.fresh(epoch)
        needed = (self.env.info()["last_pgno"] + 1) * self.env.stat()["psize"]
        with guard_write(
            target,
            what=f"LMDB checkpoint {epoch} of {self.directory}",
            needed_bytes=needed,
            kept="the previous checkpoint is intact",
            fix="free space there, then close or checkpoint the store again",
            partial=[target],
        ):
            target.mkdir()
            try:
                self.env.copy(str(target))
            except lmdb.Error as exc:  # LMDB's own error type wraps the OS error's text
                if not mentions_disk_full(str(exc)):
                    raise
                raise OSError(errno.ENOSPC, str(exc), str(target)) from exc
        return {}

    def finish_checkpoint(self, epoch: int) -> None:
        """Delete older checkpoint folders."""
        self.snapshots.drop_older(epoch)

    def memory_bytes(self) -> int:
        """Unknown: LMDB lives in the OS page cache."""
        return 0

    def close(self) -> None:
        """Close the environment."""
        self.env.close()


def _open_rocksdb(a: BackendArgs) -> RocksDbBackend:
    return RocksDbBackend(
        a.directory, a.num_rows, a.width, a.epoch, a.budget_bytes // 4, dtype=a.dtype
    )


register_backend(
    "rocksdb",
    _open_rocksdb,
    reserved_memory_bytes=lambda args: args.budget_bytes // 4,  # block cache + memtables
    description="RocksDB (rocksdict): LSM tree, block cache and memtables in a quarter of the "
    "budget",
)
register_backend(
    "lmdb",
    lambda a: LmdbBackend(a.directory, a.num_rows, a.width, a.epoch, dtype=a.dtype),
    description="LMDB: memory-mapped B+ tree; the OS page cache is not counted in the budget",
)
