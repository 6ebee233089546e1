"""`file` backend: an append-only log of densely packed records, O_DIRECT, coalesced I/O.

Why a log: in training nearly every evicted row is dirty, so a store writes back about as many
rows as it reads. Rewriting rows in place costs one random write each (about 45k IOPS with 8
threads on the reference VM); appending them costs one sequential write per batch. So every
write-back batch is appended at the log's tail and `location[id]` (int32 record address, -1 if
never written) points at the newest record of each row. Reads are random, coalesced where
records share or neighbour a sector.

Layout of `log.<generation>.dat` (format 3): a 4 KiB header, then records of `stride` bytes
packed back to back, with no padding to sectors: stride = row bytes + 16-byte footer, rounded
up to 8 (196 B rows of D=16 Adam: 216 B, where format 2 padded every record to 512 B). A
record is the row, zero padding, then `id int64 | generation uint32 | checksum uint32`.

O_DIRECT moves whole sectors (`align`: 512 B, or 4 KiB where the device needs it), so a read
covers the sectors holding the wanted records and keeps their bytes. An append starts inside
the sector that holds the end of the previous record: appends are serialised, and the bytes of
that partial sector which are already in the file (`_tail_block`, kept in memory) are written
again, unchanged, in front of the new records. No append ever reads or changes a byte of
another record, so concurrent write-backs and readers of the neighbours stay correct; a crash
leaves the old bytes (a torn sector write writes the same bytes back).

Checkpoints (crash safety): records are never overwritten, so the checkpoint of epoch e is
`location` saved as `index.<e>.npy` plus the log length (`tail`) in the MANIFEST. Recovery
loads that index and cuts the log at `tail`. When more than half the log is garbage, a
checkpoint compacts: it copies the live records in address order into a new generation's file,
which becomes current only when the MANIFEST naming it is in place.

Shape legend: N rows in a call, W row width, S stride bytes.
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from frugal._typing import F32, I64, Bool
from frugal.store.backends.base import save_array_atomic
from frugal.store.backends.registry import BackendArgs, register_backend
from frugal.store.errors import StoreCorruptionError
from frugal.store.rows import splitmix64

__all__ = ["FileBackend", "record_bytes"]

HEADER_BYTES = 4096
FOOTER_BYTES = 16
RECORD_ALIGN_BYTES = 8  # records are 8-byte aligned (the footer's int64 id)
SECTOR_BYTES = 512  # O_DIRECT alignment unless the device needs 4 KiB
MAGIC = "frugal-store-log"
FORMAT_VERSION = 3  # 3: records packed densely; 2: each record padded to 512 B
MAX_RUN_ROWS = 64  # records coalesced into one preadv at most
WRITE_CHUNK_BYTES = 4 << 20  # one pwritev per 4 MiB of appended records
MAX_RECORDS = (1 << 31) - 1  # int32 addresses
COMPACT_MIN_RECORDS = 65536  # never compact smaller logs


def _stride(row_bytes: int) -> int:
    return -(-(row_bytes + FOOTER_BYTES) // RECORD_ALIGN_BYTES) * RECORD_ALIGN_BYTES


def record_bytes(row_bytes: int) -> int:
    """Bytes one record of a `row_bytes` row takes in the log (row + footer, 8-aligned)."""
    return _stride(row_bytes)


def _floor(value: int, align: int) -> int:
    return value // align * align


def _ceil(value: int, align: int) -> int:
    return -(-value // align) * align


def _checksum_weights(num_words: int) -> npt.NDArray[np.uint64]:
    # Odd 64-bit multipliers: a change in any single word changes the weighted sum.
    weights: npt.NDArray[np.uint64] = splitmix64(np.arange(num_words, dtype=np.uint64)) | np.uint64(
        1
    )
    return weights


def _row_checksums(
    records_NS: npt.NDArray[np.uint8], weights: npt.NDArray[np.uint64]
) -> npt.NDArray[np.uint32]:
    """Weighted sum of every 32-bit word before the checksum field, folded to 32 bits."""
    stride = records_NS.shape[1]
    words = records_NS[:, : stride - 4].view(np.uint32).astype(np.uint64)
    with np.errstate(over="ignore"):
        total = (words * weights).sum(axis=1, dtype=np.uint64)
    folded: npt.NDArray[np.uint32] = ((total >> np.uint64(32)) ^ total).astype(np.uint32)
    return folded


def _runs(
    offsets: npt.NDArray[np.int64], stride: int, align: int
) -> tuple[list[tuple[int, int, int, int]], npt.NDArray[np.int64], int]:
    """Group sorted record offsets into reads of whole aligned sectors.

    Records whose sectors overlap or touch are read by one call (at most `MAX_RUN_ROWS`
    records each). Returns the runs as (buffer position, file offset, bytes to read, bytes
    that must be there), each record's position in the read buffer, and the buffer's size;
    runs sit back to back in the buffer, each at a multiple of `align`.
    """
    count = len(offsets)
    if count == 0:
        return [], np.zeros(0, dtype=np.int64), 0
    low = offsets // align * align
    high = -(-(offsets + stride) // align) * align
    gap = np.ones(count, dtype=bool)
    gap[1:] = low[1:] > high[:-1]  # high is sorted too: records share a stride
    group_first = np.flatnonzero(gap)
    in_group = np.arange(count) - group_first[np.cumsum(gap) - 1]
    first = gap | (in_group % MAX_RUN_ROWS == 0)
    run_first = np.flatnonzero(first)
    run_last = np.append(run_first[1:], count) - 1
    offset = low[run_first]
    length = high[run_last] - offset
    needed = offsets[run_last] + stride - offset  # the file may end mid-sector
    cursor = np.cumsum(length) - length
    run_of = np.cumsum(first) - 1
    positions: npt.NDArray[np.int64] = cursor[run_of] + offsets - offset[run_of]
    runs = list(
        zip(cursor.tolist(), offset.tolist(), length.tolist(), needed.tolist(), strict=True)
    )
    return runs, positions, int(length.sum())


class FileBackend:
    """Rows as records of an append-only log file; see the module docstring."""

    budget_enforced = True

    def __init__(
        self,
        directory: Path,
        num_rows: int,
        width: int,
        epoch: int | None,
        *,
        io_threads: int = 8,
        use_direct_io: bool = True,
        manifest_info: dict[str, Any] | None = None,
        dtype: str = "float32",
        max_io_bytes: int = 16 << 20,
        align_bytes: int | None = None,
    ) -> None:
        """Create the log (`epoch` None) or recover checkpoint `epoch` from it.

        Args:
            directory: The store folder.
            num_rows: Rows in the table.
            width: Values per row.
            epoch: The checkpoint to recover, or None for a new table.
            io_threads: Threads issuing parallel reads.
            use_direct_io: Whether to bypass the page cache where the file system allows it.
            manifest_info: What `checkpoint` returned for `epoch`.
            dtype: Storage precision of rows.
            max_io_bytes: Bound of one read or write buffer, in bytes.
            align_bytes: Sector size of O_DIRECT I/O, 512 or 4096 (None: 512 where the
                device takes it, else 4096).

        Raises:
            StoreCorruptionError: If the MANIFEST's facts, the index or the log's header and
                length do not match, or the log is of another format version.
            ValueError: If `align_bytes` is not 512 or 4096.
        """
        if align_bytes not in (None, SECTOR_BYTES, HEADER_BYTES):
            raise ValueError(f"align_bytes={align_bytes} must be 512 or 4096 (or None)")
        self.directory = directory
        self.max_io_bytes = max(1, max_io_bytes)
        self.num_rows = num_rows
        self.width = width
        self.dtype = np.dtype(dtype)
        self.row_bytes = self.dtype.itemsize * width
        self.stride = _stride(self.row_bytes)
        self.use_direct_io = use_direct_io
        self._weights = _checksum_weights((self.stride - 4) // 4)
        self._append_lock = threading.Lock()  # appends are serialised (see the docstring)
        self._tail_block = b""  # the log's bytes after its last full sector
        self.align = align_bytes or SECTOR_BYTES
        self.io_threads = max(1, io_threads)
        if epoch is None:
            self.generation = 0
            self.tail = 0
            self._create_log(self._log_path(0))
            self.location = np.full(num_rows, -1, dtype=np.int32)
        else:
            info = manifest_info or {}
            self.generation = int(info.get("generation", -1))
            self.tail = int(info.get("tail", -1))
            if info.get("stride") != self.stride and self._log_path(self.generation).is_file():
                self._check_header(self._log_path(self.generation))  # an older format?
            if self.generation < 0 or self.tail < 0 or info.get("stride") != self.stride:
                raise StoreCorruptionError(
                    f"{directory}: MANIFEST backend_info {info} does not describe a file log "
                    f"with stride {self.stride}"
                )
            self.location = self._load_index(epoch)
        self.fd, self.direct_io = self._open(self._log_path(self.generation))
        try:
            if self.direct_io and align_bytes is None:
                self.align = self._direct_io_alignment()
            self._check_log(recovering=epoch is not None)
            self._tail_block = self._read_tail_block(self.fd, self.tail)
        except BaseException:
            os.close(self.fd)
            raise
        self.pool = ThreadPoolExecutor(self.io_threads, thread_name_prefix="frugal-file-io")

    # --- files -------------------------------------------------------------------------------

    def _log_path(self, generation: int) -> Path:
        return self.directory / f"log.{generation}.dat"

    def _header(self) -> bytes:
        header = {
            "magic": MAGIC,
            "format_version": FORMAT_VERSION,
            "num_rows": self.num_rows,
            "width": self.width,
            "stride": self.stride,
        }
        return json.dumps(header).encode().ljust(HEADER_BYTES, b"\0")

    def _create_log(self, path: Path) -> None:
        with path.open("wb") as fh:
            fh.write(self._header())
            fh.flush()
            os.fsync(fh.fileno())

    def _open(self, path: Path) -> tuple[int, bool]:
        flags = os.O_RDWR | getattr(os, "O_CLOEXEC", 0)
        if self.use_direct_io and hasattr(os, "O_DIRECT"):
            try:
                fd = os.open(path, flags | os.O_DIRECT)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
            else:
                try:  # some file systems accept the flag at open and reject the I/O
                    os.preadv(fd, [mmap.mmap(-1, HEADER_BYTES)], 0)
                    return fd, True
                except OSError as exc:
                    os.close(fd)
                    if exc.errno != errno.EINVAL:
                        raise
        return os.open(path, flags), False

    def _direct_io_alignment(self) -> int:
        """512 if O_DIRECT reads of 512-byte sectors work on this file, else 4096."""
        try:
            os.preadv(self.fd, [memoryview(mmap.mmap(-1, SECTOR_BYTES))], SECTOR_BYTES)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            return HEADER_BYTES  # a 4 KiB-sector device: the header probe at open worked
        return SECTOR_BYTES

    def _read_tail_block(self, fd: int, tail: int) -> bytes:
        """The bytes of the log's last, partial sector (before record `tail`), or b""."""
        end = HEADER_BYTES + tail * self.stride
        start = _floor(end, self.align)
        if start == end:
            return b""
        buf = mmap.mmap(-1, self.align)
        done = os.preadv(fd, [buf], start)
        if done < end - start:
            raise StoreCorruptionError(
                f"{self._log_path(self.generation)}: short read of {done} bytes at offset "
                f"{start}; the log is truncated"
            )
        return bytes(buf[: end - start])

    def _check_header(self, path: Path) -> None:
        """Check the log header's magic, format version and table shape.

        Raises:
            StoreCorruptionError: If the header is unreadable or does not match; for a log of
                another format version, the message says how to move its rows.
        """
        with path.open("rb") as fh:
            raw = fh.read(HEADER_BYTES)
        try:
            header = json.loads(raw.rstrip(b"\0"))
        except ValueError as exc:
            raise StoreCorruptionError(f"{path}: unreadable header") from exc
        if not isinstance(header, dict) or header.get("magic") != MAGIC:
            raise StoreCorruptionError(f"{path}: not a frugal store log (header magic)")
        if header.get("format_version") != FORMAT_VERSION:
            raise StoreCorruptionError(
                f"{path}: log format_version {header.get('format_version')}, but this frugal "
                f"reads version {FORMAT_VERSION} only (version 3 packs records densely; "
                "version 2 padded each to 512 B). To upgrade, open the store with the frugal "
                "that wrote it, read its rows (`peek(np.arange(num_rows), cols='all')`, in "
                "chunks) and `put` them into a store created with this frugal"
            )
        for key, value in (("num_rows", self.num_rows), ("width", self.width)):
            if header.get(key) != value:
                raise StoreCorruptionError(
                    f"{path}: header {key} = {header.get(key)!r}, expected {value!r}"
                )

    def _check_log(self, *, recovering: bool) -> None:
        path = self._log_path(self.generation)
        self._check_header(path)
        size = os.fstat(self.fd).st_size
        needed = HEADER_BYTES + self.tail * self.stride
        if size < needed:
            raise StoreCorruptionError(
                f"{path}: {size} bytes, but checkpoint records reach {needed}; the log is truncated"
            )
        if recovering and size > needed:
            os.truncate(path, needed)  # records after the checkpoint: garbage, drop them

    def _load_index(self, epoch: int) -> npt.NDArray[np.int32]:
        path = self.directory / f"index.{epoch}.npy"
        try:
            index = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise StoreCorruptionError(
                f"{path}: index of checkpoint {epoch} unreadable: {exc}"
            ) from exc
        if index.shape != (self.num_rows,) or index.dtype != np.int32:
            raise StoreCorruptionError(f"{path}: not an index of {self.num_rows} int32 addresses")
        if int(index.max(initial=-1)) >= self.tail:
            raise StoreCorruptionError(f"{path}: addresses beyond the checkpoint's log length")
        result: npt.NDArray[np.int32] = index
        return result

    # --- I/O ---------------------------------------------------------------------------------

    def _parallel(self, runs: list[tuple[int, int, int, int]], action: Any) -> None:
        if len(runs) <= 2 or self.io_threads == 1:
            action(runs)
            return
        groups = [runs[k :: self.io_threads] for k in range(min(self.io_threads, len(runs)))]
        for future in [self.pool.submit(action, group) for group in groups]:
            future.result()

    def _read_records(self, fd: int, addresses: npt.NDArray[np.int64]) -> npt.NDArray[np.uint8]:
        """Read records by address (any order); returns (N, S) bytes in the given order."""
        stride = self.stride
        offsets = HEADER_BYTES + addresses * stride
        order = np.argsort(offsets, kind="stable")
        runs, positions, total = _runs(offsets[order], stride, self.align)
        buf = mmap.mmap(-1, max(1, total))
        view = memoryview(buf)

        def read(group: list[tuple[int, int, int, int]]) -> None:
            for position, offset, length, needed in group:
                done = os.preadv(fd, [view[position : position + length]], offset)
                if done < needed:
                    raise StoreCorruptionError(
                        f"{self._log_path(self.generation)}: short read of {done} bytes at "
                        f"offset {offset}"
                    )

        self._parallel(runs, read)
        result = np.empty((len(addresses), stride), dtype=np.uint8)
        if len(addresses):
            windows = np.lib.stride_tricks.sliding_window_view(
                np.frombuffer(buf, dtype=np.uint8), stride
            )
            result[order] = windows[positions]
        return result

    def _check_records(
        self, records_NS: npt.NDArray[np.uint8], ids: I64, addresses: npt.NDArray[np.int64]
    ) -> None:
        stride = self.stride
        footer_ids = records_NS[:, stride - 16 : stride - 8].copy().view(np.int64).ravel()
        stored = records_NS[:, stride - 4 :].copy().view(np.uint32).ravel()
        bad = (footer_ids != ids) | (stored != _row_checksums(records_NS, self._weights))
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            offset = HEADER_BYTES + int(addresses[k]) * stride
            raise StoreCorruptionError(
                f"{self._log_path(self.generation)}: row id {int(ids[k])} at offset {offset} "
                f"fails its check (footer id {int(footer_ids[k])}); {int(bad.sum())} bad rows "
                "in this read. The store is corrupt; restore it from a copy"
            )

    def read_rows(self, ids: I64, out: F32) -> Bool:
        """Read the newest record of each id; see `StoreBackend.read_rows`.

        Raises:
            StoreCorruptionError: If a record's footer id or checksum does not match.
            OSError: On an I/O failure.
        """
        addresses = self.location[ids].astype(np.int64)
        present: Bool = addresses >= 0
        if not present.any():
            return present
        found = np.flatnonzero(present)
        step = self._rows_per_io()  # record buffers stay within the store's I/O budget
        for start in range(0, len(found), step):
            where = found[start : start + step]
            records = self._read_records(self.fd, addresses[where])
            self._check_records(records, ids[where], addresses[where])
            out[where] = records[:, : self.row_bytes].copy().view(self.dtype)
        return present

    def _rows_per_io(self) -> int:
        """Records per read or write call: max_io_bytes of record buffers, at least one.

        A record read alone costs its sectors: up to `stride` rounded up to a sector, plus
        one more where it straddles a sector boundary.
        """
        return max(1, self.max_io_bytes // (_ceil(self.stride, self.align) + self.align))

    def _encode(self, ids: I64, rows: F32, prefix: bytes) -> mmap.mmap:
        """`prefix`, then the records of `ids`, zero-padded to whole sectors."""
        stride, start = self.stride, len(prefix)
        buf = mmap.mmap(-1, _ceil(start + len(ids) * stride, self.align))
        buf[:start] = prefix
        records = np.frombuffer(buf, dtype=np.uint8)[start : start + len(ids) * stride]
        records = records.reshape(len(ids), stride)
        records[:, : self.row_bytes] = np.ascontiguousarray(rows, dtype=self.dtype).view(np.uint8)
        records[:, stride - 16 : stride - 8] = ids.astype(np.int64).reshape(-1, 1).view(np.uint8)
        generation = np.full((len(ids), 1), self.generation, dtype=np.uint32)
        records[:, stride - 8 : stride - 4] = generation.view(np.uint8)
        records[:, stride - 4 :] = (
            _row_checksums(records, self._weights).reshape(-1, 1).view(np.uint8)
        )
        del records
        return buf

    def _append(self, fd: int, start: int, ids: I64, rows: F32, tail_block: bytes) -> bytes:
        """Write the records of `ids` from record `start` on; return the new tail block.

        The write starts at the sector holding record `start`'s first byte and rewrites that
        sector's earlier bytes (`tail_block`, unchanged), so it never alters another record.
        The caller holds `_append_lock`.
        """
        end = HEADER_BYTES + start * self.stride
        offset = _floor(end, self.align)
        if end - offset != len(tail_block):
            raise AssertionError(f"tail block of {len(tail_block)} bytes at offset {end}")
        buf = self._encode(ids, rows, tail_block)
        view = memoryview(buf)
        chunk = max(self.align, _floor(WRITE_CHUNK_BYTES, self.align))
        for pos in range(0, len(buf), chunk):
            part = view[pos : pos + chunk]
            done = os.pwritev(fd, [part], offset + pos)
            while done < len(part):  # a short write: retry the rest, which raises the cause
                more = os.pwritev(fd, [part[done:]], offset + pos + done)  # (ENOSPC, EFBIG)
                if more <= 0:
                    raise OSError(errno.ENOSPC, f"no space to append at offset {offset + pos}")
                done += more
        new_end = end + len(ids) * self.stride
        block_start = _floor(new_end, self.align) - offset
        block = bytes(view[block_start : new_end - offset])
        del view
        return block

    def write_rows(self, ids: I64, rows: F32) -> None:
        """Append records at the tail, then point `location` at them; see `StoreBackend`.

        Raises:
            OSError: On an I/O failure (e.g. a full disk); earlier records are untouched.
            StoreCorruptionError: If the log would exceed 2^31 - 1 records.
        """
        if len(ids) == 0:
            return
        step = self._rows_per_io()  # the encode buffer stays within the store's I/O budget
        for first in range(0, len(ids), step):
            part_ids, part_rows = ids[first : first + step], rows[first : first + step]
            with self._append_lock:
                start = self.tail
                if start + len(part_ids) > MAX_RECORDS:
                    raise StoreCorruptionError(
                        "the log would exceed 2^31 - 1 records; checkpoint to compact it"
                    )
                self._tail_block = self._append(
                    self.fd, start, part_ids, part_rows, self._tail_block
                )
                self.tail = start + len(part_ids)  # only once written: a failed append is not
            self.location[part_ids] = np.arange(start, start + len(part_ids), dtype=np.int32)
        if not self.direct_io and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)

    # --- durability --------------------------------------------------------------------------

    def sync(self) -> None:
        """Make appended records durable (fdatasync of the log)."""
        os.fdatasync(self.fd)

    def checkpoint(self, epoch: int) -> dict[str, Any]:
        """Save `location` as `index.<epoch>.npy`; compact the log first if mostly garbage.

        Returns:
            The log's generation, length and stride, and the index file's sha256.
        """
        live = int(np.count_nonzero(self.location >= 0))
        if self.tail > max(COMPACT_MIN_RECORDS, 2 * live):
            self._compact(live)
        name = f"index.{epoch}.npy"
        digest = save_array_atomic(self.directory / name, self.location)
        return {
            "generation": self.generation,
            "tail": self.tail,
            "stride": self.stride,
            "file_sha256": {name: digest},
        }

    def _compact(self, live: int) -> None:
        """Copy live records, in address order, into the next generation's log file."""
        ids = np.flatnonzero(self.location >= 0).astype(np.int64)
        addresses = self.location[ids].astype(np.int64)
        order = np.argsort(addresses)
        ids, addresses = ids[order], addresses[order]
        new_generation = self.generation + 1
        path = self._log_path(new_generation)
        self._create_log(path)
        new_fd, _ = self._open(path)
        old_generation = self.generation
        new_tail_block = b""  # the new log's records start at its 4 KiB header's end
        try:
            self.generation = new_generation  # stamped into the copied records' footers
            step = self._rows_per_io()
            for start in range(0, len(ids), step):
                part_ids, part_addresses = (
                    ids[start : start + step],
                    addresses[start : start + step],
                )
                self.generation = old_generation
                records = self._read_records(self.fd, part_addresses)
                self._check_records(records, part_ids, part_addresses)
                self.generation = new_generation
                rows = records[:, : self.row_bytes].copy().view(self.dtype)
                new_tail_block = self._append(new_fd, start, part_ids, rows, new_tail_block)
            os.fdatasync(new_fd)
        except BaseException:
            self.generation = old_generation
            os.close(new_fd)
            with contextlib.suppress(OSError):
                path.unlink()
            raise
        os.close(self.fd)
        self.fd = new_fd
        new_location = np.full(self.num_rows, -1, dtype=np.int32)
        new_location[ids] = np.arange(len(ids), dtype=np.int32)
        self.location = new_location
        self.tail = live
        self._tail_block = new_tail_block

    def finish_checkpoint(self, epoch: int) -> None:
        """Delete older indexes and log generations, which no MANIFEST names any more."""
        for path in self.directory.glob("index.*.npy"):
            if path.name != f"index.{epoch}.npy":
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        for path in self.directory.glob("log.*.dat"):
            if path.name != self._log_path(self.generation).name:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()

    def memory_bytes(self) -> int:
        """The location index."""
        return int(self.location.nbytes)

    def close(self) -> None:
        """Stop the I/O threads and close the log."""
        self.pool.shutdown(wait=True)
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _open_file(args: BackendArgs) -> FileBackend:
    try:
        return FileBackend(
            args.directory,
            args.num_rows,
            args.width,
            args.epoch,
            io_threads=args.io_threads,
            use_direct_io=args.use_direct_io,
            manifest_info=args.info,
            dtype=args.dtype,
            max_io_bytes=args.max_io_bytes,
        )
    except FileNotFoundError as exc:
        raise StoreCorruptionError(
            f"{args.directory}: a file of checkpoint {args.epoch} is missing: {exc.filename}"
        ) from exc


register_backend(
    "file",
    _open_file,
    reserved_memory_bytes=lambda args: 4 * args.num_rows,  # int32 record address per row
    description="append-only record log with O_DIRECT reads (MLKV's own engine; default)",
)
