"""The systems `frugal store bench` compares `EmbeddingStore` with, behind one small interface.

- `RamTable`: the whole table in a numpy array (in-memory frameworks; the upper bound).
- `KvOffloadTable`: every batch does a multi-get and a batched put on a KV engine (RocksDB or
  LMDB, or one added by `register_kv_engine`), with only the engine's own cache (the
  "offload to a KV store" baseline of MLKV's evaluation).
- `HybridLogTable`: a FASTER-like hybrid log: an in-memory circular log whose newest 90% is
  mutable in place, older records read-only, the rest on disk in an append-only O_DIRECT log;
  FIFO eviction, one I/O per disk record, reads not cached (`hlog`); FASTER's log compaction
  copies the live records of the oldest disk part to the tail and frees it (punched holes)
  once the disk log passes 1.5x the rows written. With `mlkv=True` it adds MLKV's changes:
  disk reads are copied to the tail, and `lookahead` copies future keys to the tail in the
  background (`mlkv`).

All start from `init_rows` and use `apply_optimizer`, so at staleness 0 every system must end
with a bit-identical table. Shape legend: N ids in a call, D embedding_dim, W row width.

References:
    FASTER: A Concurrent Key-Value Store with In-Place Updates, SIGMOD 2018 (hybrid log).
    MLKV: Efficiently Scaling up Large Embedding Model Training with Disk-based Key-Value
    Storage, ICDE 2025, arXiv 2504.01506 (copy-to-tail reads, lookahead).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import mmap
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from frugal._typing import F32, I64
from frugal.registry import Registry
from frugal.store.backends.kv import id_items, id_keys, rocksdb_options, rows_from_values
from frugal.store.rows import RowSpec, apply_optimizer, init_rows

__all__ = [
    "KV_ENGINES",
    "BenchTable",
    "HybridLogTable",
    "KvEngine",
    "KvEngineArgs",
    "KvOffloadTable",
    "RamTable",
    "register_kv_engine",
]

_SECTOR = 512
_FALLOC_FL_KEEP_SIZE_PUNCH_HOLE = 0x01 | 0x02
_COMPACTION_BYTES = 256 << 20  # log bytes one compaction step copies out of the way
_COMPACTION_READ_BYTES = 16 << 20  # records read at a time while compacting (bounds its RAM)
_SCAN_ROWS = 1 << 20


@functools.cache
def _fallocate() -> Any:
    """The C library's fallocate, or None where there is none."""
    try:
        fallocate = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True).fallocate
    except (OSError, AttributeError):
        return None
    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    return fallocate


def _punch_hole(fd: int, offset: int, length: int) -> bool:
    """Free the disk blocks of [offset, offset + length) of a file (Linux fallocate).

    Returns False where the platform or file system cannot (the bytes then stay allocated).
    """
    fallocate = _fallocate()
    if fallocate is None:
        return False
    return int(fallocate(fd, _FALLOC_FL_KEEP_SIZE_PUNCH_HOLE, offset, length)) == 0


class BenchTable(Protocol):
    """What the bench loop needs from a system; ids are sorted and unique."""

    def get(self, ids: I64, step: int) -> F32:
        """Vectors of `ids`, (N, D), for an update of the same ids that follows."""
        ...

    def read(self, ids: I64, step: int) -> F32:
        """Vectors of `ids`, (N, D), never updated after (read-only rows, e.g. features)."""
        ...

    def put(self, ids: I64, rows: F32, step: int) -> None:
        """Overwrite whole rows (N, W) (e.g. to load read-only features once)."""
        ...

    def apply_gradients(self, ids: I64, grads: F32, step: int) -> None:
        """One optimizer step on the rows of `ids` with gradients (N, D)."""
        ...

    def lookahead(self, ids: Any, step: int) -> None:
        """Hint of future ids (systems without lookahead ignore it)."""
        ...

    def release(self, ids: I64, step: int) -> None:
        """Forget a `get` of `ids` that no update will follow (a failed training step)."""
        ...

    def table_sha256(self, ids: I64 | None = None) -> str:
        """SHA-256 of all rows in id order (`ids`: of those rows, in that order)."""
        ...

    def stats(self) -> dict[str, Any]:
        """Counters for the results row."""
        ...

    def close(self) -> None:
        """Release files and threads."""
        ...


class KvEngine(Protocol):
    """A key-value engine as the offload baseline uses it: batched gets and puts of raw bytes.

    Keys are 8-byte big-endian ids (`id_keys`); values are whole float32 rows.
    """

    def get(self, keys: list[bytes]) -> list[bytes | None]:
        """The value of every key, None where it was never put (one multi-get)."""
        ...

    def put(self, items: list[tuple[bytes, bytes]]) -> None:
        """Write (key, value) pairs in one batch."""
        ...

    def close(self) -> None:
        """Close the engine."""
        ...


@dataclass(frozen=True, slots=True)
class KvEngineArgs:
    """What `KvOffloadTable` gives an engine when it opens it.

    Attributes:
        directory: Folder the engine keeps its files in (created, empty).
        num_rows: Rows in the table.
        row_bytes: Bytes of one value (a float32 row).
        memory_budget_bytes: The baseline's whole memory budget (the engine's caches).
    """

    directory: Path
    num_rows: int
    row_bytes: int
    memory_budget_bytes: int


KV_ENGINES: Registry[Callable[[KvEngineArgs], KvEngine]] = Registry(
    "KV-offload engine", field="engine"
)
"""Every engine `KvOffloadTable(engine=...)` may name: a function opening it."""


def register_kv_engine(
    name: str, open: Callable[[KvEngineArgs], KvEngine], *, replace: bool = False
) -> None:
    """Make `name` a valid `KvOffloadTable` engine.

    Args:
        name: The engine's name.
        open: Opens the engine (a new, empty one) from its `KvEngineArgs`.
        replace: Whether to replace an engine registered under the same name.

    Raises:
        ValueError: If `name` is taken and `replace` is False.
    """
    KV_ENGINES.register(name, open, replace=replace)


class _RocksDbEngine:
    """RocksDB with the whole budget as block cache + memtables, WAL off (its best case)."""

    def __init__(self, args: KvEngineArgs) -> None:
        import rocksdict

        self.db = rocksdict.Rdict(
            str(args.directory / "db"), rocksdb_options(args.memory_budget_bytes)
        )
        self.write_options = rocksdict.WriteOptions()
        # A property at run time, typed as a method in rocksdict's stub.
        setattr(self.write_options, "disable_wal", True)  # noqa: B010

    def get(self, keys: list[bytes]) -> list[bytes | None]:
        """Multi-get."""
        lookup: Any = keys
        values: list[bytes | None] = self.db.get(lookup) or []
        return values

    def put(self, items: list[tuple[bytes, bytes]]) -> None:
        """One WriteBatch."""
        import rocksdict

        batch = rocksdict.WriteBatch(raw_mode=True)
        for key, value in items:
            batch.put(key, value)
        self.db.write(batch, self.write_options)

    def close(self) -> None:
        """Close the database."""
        self.db.close()


class _LmdbEngine:
    """LMDB, memory-mapped with room for every row three times over, no sync."""

    def __init__(self, args: KvEngineArgs) -> None:
        import lmdb

        self.env = lmdb.open(
            str(args.directory / "db"),
            map_size=max(1 << 24, 3 * args.num_rows * (args.row_bytes + 64)),
            writemap=True,
            sync=False,
        )

    def get(self, keys: list[bytes]) -> list[bytes | None]:
        """`getmulti` in one read transaction."""
        with self.env.begin() as txn:
            found = dict(txn.cursor().getmulti(keys))
        return [found.get(k) for k in keys]

    def put(self, items: list[tuple[bytes, bytes]]) -> None:
        """`putmulti` in one write transaction."""
        with self.env.begin(write=True) as txn:
            txn.cursor().putmulti(items)

    def close(self) -> None:
        """Close the environment."""
        self.env.close()


register_kv_engine("rocksdb", _RocksDbEngine)
register_kv_engine("lmdb", _LmdbEngine)


def _require_float32(spec: RowSpec) -> None:
    """The baselines store float32 rows; a float16 comparison needs float16 baselines."""
    if spec.dtype != "float32":
        raise ValueError(
            f"spec.dtype={spec.dtype!r}: the baselines store float32 rows only; compare "
            "float16 tables with EmbeddingStore on several backends instead"
        )


def _sha_of_reader(
    num_rows: int, spec: RowSpec, read: Any, ids: I64 | None = None, chunk_rows: int = 65536
) -> str:
    digest = hashlib.sha256()
    count = num_rows if ids is None else len(ids)
    for start in range(0, count, chunk_rows):
        if ids is None:
            part = np.arange(start, min(start + chunk_rows, num_rows), dtype=np.int64)
        else:
            part = np.ascontiguousarray(ids[start : start + chunk_rows], dtype=np.int64)
        digest.update(np.ascontiguousarray(read(part), dtype=np.float32).tobytes())
    return digest.hexdigest()


class _RowsOfLastGet:
    """get() reads whole rows once and keeps them for the apply_gradients that follows."""

    spec: RowSpec
    _last: tuple[I64, F32] | None = None

    def _read(self, ids: I64) -> F32:
        raise NotImplementedError

    def _store(self, ids: I64, rows: F32) -> None:
        raise NotImplementedError

    def apply_gradients(self, ids: I64, grads: F32, step: int) -> None:
        """The optimizer on the rows `get` fetched (same ids), then one batched store."""
        rows = self._rows_for_update(ids)
        apply_optimizer(rows, grads, self.spec)
        self._store(ids, rows)

    def put(self, ids: I64, rows: F32, step: int) -> None:
        """Store whole rows (N, W) in one batch."""
        self._store(ids, np.ascontiguousarray(rows, dtype=np.float32))

    def get(self, ids: I64, step: int) -> F32:
        """Vectors of `ids`; the whole rows are kept for the update of the same ids."""
        rows = self._read(ids)
        self._last = (ids, rows)
        vectors: F32 = rows[:, : self.spec.embedding_dim]
        return vectors

    def read(self, ids: I64, step: int) -> F32:
        """Vectors of `ids` for reading only (nothing kept for an update)."""
        vectors: F32 = self._read(ids)[:, : self.spec.embedding_dim]
        return vectors

    def release(self, ids: I64, step: int) -> None:
        """Drop the rows kept by the last `get` (no update follows)."""
        self._last = None

    def _rows_for_update(self, ids: I64) -> F32:
        """The rows `get` just read for these ids, else a fresh read."""
        if self._last is not None and self._last[0] is ids:
            rows = self._last[1]
            self._last = None
            return rows
        return self._read(ids)


class RamTable:
    """All rows in one numpy array."""

    def __init__(self, num_rows: int, spec: RowSpec, seed: int) -> None:
        self.spec = spec
        _require_float32(spec)
        self.table = init_rows(np.arange(num_rows, dtype=np.int64), spec, seed)

    def get(self, ids: I64, step: int) -> F32:
        """Fancy-index copy of the vectors."""
        rows: F32 = self.table[ids, : self.spec.embedding_dim]
        return rows

    def read(self, ids: I64, step: int) -> F32:
        """As `get` (nothing to release)."""
        return self.get(ids, step)

    def put(self, ids: I64, rows: F32, step: int) -> None:
        """Overwrite rows in the array."""
        self.table[ids] = rows

    def apply_gradients(self, ids: I64, grads: F32, step: int) -> None:
        """Update rows in the array."""
        rows = self.table[ids]
        apply_optimizer(rows, grads, self.spec)
        self.table[ids] = rows

    def lookahead(self, ids: Any, step: int) -> None:
        """Nothing to prefetch."""

    def release(self, ids: I64, step: int) -> None:
        """Nothing is held between a get and its update."""

    def table_sha256(self, ids: I64 | None = None) -> str:
        """Hash of the array (`ids`: of those rows, in that order)."""
        if ids is None:
            return hashlib.sha256(self.table.tobytes()).hexdigest()
        return _sha_of_reader(len(self.table), self.spec, lambda part: self.table[part], ids)

    def stats(self) -> dict[str, Any]:
        """Everything is a hit."""
        return {"hit_ratio": 1.0, "bytes_read": 0, "bytes_written": 0, "stall_s": 0.0}

    def close(self) -> None:
        """Nothing to release."""


class KvOffloadTable(_RowsOfLastGet):
    """Naive offloading: a multi-get and a batched put per step on a real KV engine.

    Args:
        directory: Folder of the engine's files.
        num_rows: Rows in the table.
        spec: The row layout (float32 rows only).
        seed: Table seed (rows never written read as `init_rows`).
        engine: A name in `KV_ENGINES` (`rocksdb`, `lmdb`, or one a user registered).
        memory_budget_bytes: The engine's memory budget.

    Raises:
        ValueError: If the engine is not registered or `spec` is not float32.
    """

    def __init__(
        self,
        directory: Path,
        num_rows: int,
        spec: RowSpec,
        seed: int,
        *,
        engine: str,
        memory_budget_bytes: int,
    ) -> None:
        open_engine = KV_ENGINES.get(engine)
        self.spec = spec
        _require_float32(spec)
        self.seed = seed
        self.num_rows = num_rows
        self.engine = engine
        self.bytes_read = 0
        self.bytes_written = 0
        self.found = 0
        self.asked = 0
        directory.mkdir(parents=True, exist_ok=True)
        self.db: KvEngine = open_engine(
            KvEngineArgs(directory, num_rows, spec.row_bytes, memory_budget_bytes)
        )

    def _read(self, ids: I64) -> F32:
        values = self.db.get(id_keys(ids))
        rows = np.empty((len(ids), self.spec.width), dtype=np.float32)
        present = rows_from_values(
            values, rows, self.spec.row_bytes, f"{self.engine} engine", np.dtype(np.float32)
        )
        if not present.all():
            rows[~present] = init_rows(ids[~present], self.spec, self.seed)
        stored = int(np.count_nonzero(present))
        self.found += stored
        self.asked += len(ids)
        self.bytes_read += stored * self.spec.row_bytes
        return rows

    def _store(self, ids: I64, rows: F32) -> None:
        """One batched put of whole rows."""
        self.db.put(id_items(ids, rows, np.dtype(np.float32)))
        self.bytes_written += len(ids) * self.spec.row_bytes

    def lookahead(self, ids: Any, step: int) -> None:
        """A plain KV store has no lookahead."""

    def table_sha256(self, ids: I64 | None = None) -> str:
        """Hash of all rows (`ids`: of those) read back through the engine."""
        return _sha_of_reader(self.num_rows, self.spec, self._read, ids)

    def stats(self) -> dict[str, Any]:
        """Share of lookups found stored (not served by init) stands in for a hit ratio."""
        return {
            "hit_ratio": float("nan"),
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "stall_s": float("nan"),
        }

    def close(self) -> None:
        """Close the engine."""
        self.db.close()


class HybridLogTable(_RowsOfLastGet):
    """A FASTER-like hybrid log (`hlog`), or with MLKV's changes (`mlkv=True`); see the module."""

    def __init__(
        self,
        directory: Path,
        num_rows: int,
        spec: RowSpec,
        seed: int,
        *,
        memory_budget_bytes: int,
        mlkv: bool,
        io_threads: int = 8,
        mutable_fraction: float = 0.9,
        max_space_amplification: float = 1.5,
    ) -> None:
        self.spec = spec
        _require_float32(spec)
        self.seed = seed
        self.num_rows = num_rows
        self.mlkv = mlkv
        self.stride = -(-spec.row_bytes // _SECTOR) * _SECTOR
        index_bytes = 8 * num_rows
        capacity = (memory_budget_bytes - index_bytes) // (spec.row_bytes + 8)
        if capacity < 128:
            raise ValueError(
                f"memory_budget_bytes={memory_budget_bytes} leaves {capacity} log records after "
                f"the {index_bytes}-byte index; the hybrid log needs >= 128"
            )
        self.capacity = int(capacity)
        self.mutable_records = int(mutable_fraction * self.capacity)
        self.ring_rows = np.zeros((self.capacity, spec.width), dtype=np.float32)
        self.ring_ids = np.full(self.capacity, -1, dtype=np.int64)
        self.index = np.full(num_rows, -1, dtype=np.int64)  # address; -1 = never written
        self.head = 0  # lowest address still in memory
        self.tail = 0  # next address to allocate
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "hlog.dat"
        path.touch()
        flags = os.O_RDWR | getattr(os, "O_DIRECT", 0)
        self.fd = os.open(path, flags)
        self.pool = ThreadPoolExecutor(io_threads, thread_name_prefix="hlog-io")
        self.io_threads = io_threads
        self.lock = threading.Lock()
        self.prefetcher = (
            ThreadPoolExecutor(1, thread_name_prefix="mlkv-lookahead") if mlkv else None
        )
        self.disk_reads = 0  # records a get read from disk (misses)
        self.prefetch_reads = 0  # records the lookahead read from disk (not a get's miss)
        self.memory_hits = 0
        self.bytes_read = 0
        self.bytes_written = 0
        self.appends = 0
        # FASTER's log compaction: once the disk part of the log [begin, head) holds more than
        # max_space_amplification x the rows ever written, copy the live records of its
        # oldest 256 MiB to the tail and free those bytes (ShiftBeginAddress).
        self.max_space_amplification = max_space_amplification
        self.begin = 0  # lowest disk address not yet compacted away
        self.live_rows = 0  # rows ever written (index >= 0)
        self.compaction_records = max(1, _COMPACTION_BYTES // self.stride)
        self.compacted_records = 0  # live records copied to the tail by compaction
        self._compacting = False
        self._disk_readers = 0  # reads of disk addresses taken under the lock, in flight
        self._unpunched: list[tuple[int, int]] = []  # freed ranges waiting for those reads

    # --- log mechanics (lock held) -------------------------------------------------------------

    def _read_only_address(self) -> int:
        return self.tail - self.mutable_records

    def _flush_to(self, new_head: int) -> None:
        """Write records [head, new_head) to the disk log (sequential) and drop them from RAM."""
        start = self.head
        while start < new_head:
            pos = start % self.capacity
            count = min(new_head - start, self.capacity - pos)
            buf = mmap.mmap(-1, count * self.stride)
            view = np.frombuffer(buf, dtype=np.uint8).reshape(count, self.stride)
            view[:, : self.spec.row_bytes] = self.ring_rows[pos : pos + count].view(np.uint8)
            os.pwritev(self.fd, [buf], start * self.stride)
            self.bytes_written += count * self.spec.row_bytes
            start += count
        self.head = new_head
        if not self._compacting:
            self._compacting = True
            try:
                while self.head - self.begin > (
                    self.max_space_amplification * self.live_rows + self.compaction_records
                ):
                    self._compact_oldest()
            finally:
                self._compacting = False

    def _compact_oldest(self) -> None:
        """Copy the live records of [begin, begin + compaction_records) to the tail."""
        until = min(self.begin + self.compaction_records, self.head)
        for start in range(0, self.num_rows, _SCAN_ROWS):
            part = self.index[start : start + _SCAN_ROWS]
            ids = start + np.flatnonzero((part >= self.begin) & (part < until))
            step = max(1, min(self.capacity // 2, _COMPACTION_READ_BYTES // self.stride))
            for first in range(0, len(ids), step):
                chunk = ids[first : first + step].astype(np.int64)
                rows = self._disk_read(self.index[chunk])
                self._append(chunk, rows)
                self.compacted_records += len(chunk)
        self._unpunched.append((self.begin * self.stride, (until - self.begin) * self.stride))
        self.begin = until
        self._punch_freed()

    def _punch_freed(self) -> None:
        """Free compacted ranges once no read that may still address them is in flight."""
        if self._disk_readers == 0:
            for offset, length in self._unpunched:
                _punch_hole(self.fd, offset, length)
            self._unpunched = []

    def _append(self, ids: I64, rows: F32) -> None:
        """RCU: give `ids` new records at the tail, evicting the oldest records FIFO."""
        count = len(ids)
        if count > self.capacity:
            raise ValueError(f"{count} records do not fit a log of {self.capacity}")
        while self.tail + count - self.head > self.capacity:  # (compaction may append)
            self._flush_to(self.tail + count - self.capacity)
        addresses = np.arange(self.tail, self.tail + count, dtype=np.int64)
        self.live_rows += int(np.count_nonzero(self.index[ids] < 0))
        positions = addresses % self.capacity
        self.ring_rows[positions] = rows
        self.ring_ids[positions] = ids
        self.index[ids] = addresses
        self.tail += count
        self.appends += count

    def _disk_read(self, addresses: I64) -> F32:
        """One O_DIRECT read per record (no coalescing), spread over the I/O threads."""
        stride = self.stride
        buf = mmap.mmap(-1, max(1, len(addresses)) * stride)
        view = memoryview(buf)

        def read(part: npt.NDArray[np.int64]) -> None:
            for k in part.tolist():
                os.preadv(
                    self.fd, [view[k * stride : (k + 1) * stride]], int(addresses[k]) * stride
                )

        order = np.arange(len(addresses))
        parts = [order[i :: self.io_threads] for i in range(self.io_threads)]
        for future in [self.pool.submit(read, p) for p in parts if len(p)]:
            future.result()
        slots = np.frombuffer(buf, dtype=np.uint8).reshape(-1, stride)[: len(addresses)]
        rows: F32 = slots[:, : self.spec.row_bytes].copy().view(np.float32)
        self.bytes_read += len(addresses) * self.spec.row_bytes
        return rows

    def _read(self, ids: I64, *, copy_to_tail: bool = True) -> F32:
        """Whole rows of `ids`, from memory, disk or the initializer."""
        rows = np.empty((len(ids), self.spec.width), dtype=np.float32)
        with self.lock:
            addresses = self.index[ids]
            in_memory = addresses >= self.head
            rows[in_memory] = self.ring_rows[addresses[in_memory] % self.capacity]
            never = addresses < 0
            on_disk = ~in_memory & ~never
            disk_addresses = addresses[on_disk]
            reading = bool(on_disk.any())
            self._disk_readers += reading
        self.memory_hits += int(in_memory.sum())
        if never.any():
            rows[never] = init_rows(ids[never], self.spec, self.seed)
        if reading:
            disk_rows = self._disk_read_once(disk_addresses)
            self.disk_reads += len(disk_addresses)
            rows[on_disk] = disk_rows
            if self.mlkv and copy_to_tail:  # MLKV: a read from disk copies it to the tail
                with self.lock:
                    still = self.index[ids[on_disk]] == disk_addresses  # not updated meanwhile
                    self._append(ids[on_disk][still], disk_rows[still])
        return rows

    def _disk_read_once(self, addresses: I64) -> F32:
        """`_disk_read` for a caller that counted itself in `_disk_readers` under the lock.

        The count is dropped, and holes freed meanwhile punched, whatever the read does.
        """
        try:
            return self._disk_read(addresses)
        finally:
            with self.lock:
                self._disk_readers -= 1
                self._punch_freed()

    # --- BenchTable ----------------------------------------------------------------------------

    def _store(self, ids: I64, rows: F32) -> None:
        """Upsert whole rows: in place in the mutable region, else append (RCU)."""
        with self.lock:
            addresses = self.index[ids]
            mutable = addresses >= max(self.head, self._read_only_address())
            self.ring_rows[addresses[mutable] % self.capacity] = rows[mutable]
            self._append(ids[~mutable], rows[~mutable])

    def lookahead(self, ids: Any, step: int) -> None:
        """MLKV: copy future keys that are on disk to the tail in the background."""
        if self.prefetcher is None:
            return
        unique = np.unique(np.asarray(ids, dtype=np.int64))
        self.prefetcher.submit(self._prefetch, unique)

    def _prefetch(self, ids: I64) -> None:
        with self.lock:
            addresses = self.index[ids]
            on_disk = (addresses >= 0) & (addresses < self.head)
            ids, addresses = ids[on_disk], addresses[on_disk]
            if len(ids) == 0:
                return
            self._disk_readers += 1
        rows = self._disk_read_once(addresses)
        self.prefetch_reads += len(addresses)
        with self.lock:
            still = self.index[ids] == addresses
            self._append(ids[still], rows[still])

    def table_sha256(self, ids: I64 | None = None) -> str:
        """Hash of all rows (`ids`: of those) read back through the log."""
        if self.prefetcher is not None:
            self.prefetcher.shutdown(wait=True)
            self.prefetcher = None
        return _sha_of_reader(
            self.num_rows, self.spec, lambda part: self._read(part, copy_to_tail=False), ids
        )

    def stats(self) -> dict[str, Any]:
        """Memory hits among the records gets found (prefetch reads are not misses), bytes moved."""
        looked = self.memory_hits + self.disk_reads
        return {
            "hit_ratio": self.memory_hits / looked if looked else 1.0,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "stall_s": float("nan"),
            "appends": self.appends,
            "prefetch_reads": self.prefetch_reads,
            "compacted_records": self.compacted_records,
            "disk_log_bytes": (self.head - self.begin) * self.stride,
        }

    def close(self) -> None:
        """Stop threads and close the log file."""
        if self.prefetcher is not None:
            self.prefetcher.shutdown(wait=True)
        self.pool.shutdown(wait=True)
        os.close(self.fd)
