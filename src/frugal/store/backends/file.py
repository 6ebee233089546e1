"""`file` backend: a segmented append-only log of densely packed records, cleaned online.

Why a log: in training nearly every evicted row is dirty, so a store writes back about as many
rows as it reads. Rewriting rows in place costs one random write each (about 45k IOPS with 8
threads on the reference VM); appending them costs one sequential write per batch. So every
write-back batch is appended at the log's tail and `location[id]` (int32 record address, -1 if
never written) points at the newest record of each row. Reads are random, coalesced where
records share or neighbour a sector.

Segments (format 4): the log is a set of segment files `log.<slot>.dat`, each a 4 KiB header
and then 2^shift records (about 256 MiB). An address is `slot << shift | index`, so int32
addresses name 2^31 records whatever has been written before. Appends fill the tail segment;
a full one is followed by a new segment in the lowest free slot.

Records: `stride` bytes packed back to back, with no padding to sectors: stride = row bytes +
16-byte footer, rounded up to 8 (196 B rows of D=16 Adam: 216 B). A record is the row, zero
padding, then `id int64 | sequence uint32 | checksum uint32`; `sequence` numbers the segment
file (a reused slot gets a new one), so a stale address is caught, not read as a row.

O_DIRECT moves whole sectors (`align`: 512 B, or 4 KiB where the device needs it), so a read
covers the sectors holding the wanted records and keeps their bytes. An append starts inside
the sector that holds the end of the previous record: appends are serialised, and the bytes of
that partial sector which are already in the file (`_tail_block`, kept in memory) are written
again, unchanged, in front of the new records. No append ever reads or changes a byte of
another record, so concurrent write-backs and readers of the neighbours stay correct; a crash
leaves the old bytes (a torn sector write writes the same bytes back).

Online cleaning (bounded disk without checkpoints): every rewrite of a row leaves its older
record as garbage. When the segments hold more than `max_space_amplification` x the live
records plus two segments, the cleaner copies the live records of the segment with the
fewest of them to the tail and deletes it (greedy cleaning, as in log-structured file systems,
Rosenblum & Ousterhout, SOSP 1991; FASTER, SIGMOD 2018, compacts its hybrid log the same way).
The cleaner is a thread of its own, so write-backs go on while it copies: it reads a chunk of
live records without the append lock, then appends, under the lock, only the rows whose
address has not changed meanwhile (a compare-and-set: a row rewritten since is not copied
back over its newer record). A write waits for the cleaner only when the log passes its bound
by two more segments. Segments holding only garbage are deleted at once, with no copy.
Readers keep the segment files they started with open until they finish.

Checkpoints (crash safety): records are never overwritten, so the checkpoint of epoch e is
`location` saved as `index.<e>.npy` plus the tail address and the segments the index points
into, in the MANIFEST. Those segments are pinned: a cleaned pinned segment stays on disk until
the next checkpoint no longer needs it (so between checkpoints the log may hold up to the
bound plus the segments emptied since the last one). Recovery loads the index, cuts the tail
segment at the checkpoint's tail (or begins it anew if it was empty) and deletes segments
written after the checkpoint.

Shape legend: N rows in a call, W row width, S stride bytes.
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from frugal._typing import F32, I64, Bool
from frugal.store.backends.base import save_array_atomic
from frugal.store.backends.registry import BackendArgs, register_backend
from frugal.store.errors import StoreCorruptionError, StoreError
from frugal.store.rows import splitmix64

__all__ = ["FileBackend", "record_bytes", "segment_shift_for"]

HEADER_BYTES = 4096
FOOTER_BYTES = 16
RECORD_ALIGN_BYTES = 8  # records are 8-byte aligned (the footer's int64 id)
SECTOR_BYTES = 512  # O_DIRECT alignment unless the device needs 4 KiB
MAGIC = "frugal-store-log"
FORMAT_VERSION = 4  # 4: segment files, online cleaning; 3: one log file; 2: 512 B records
MAX_RUN_ROWS = 64  # records coalesced into one preadv at most
WRITE_CHUNK_BYTES = 4 << 20  # one pwritev per 4 MiB of appended records
ADDRESS_BITS = 31  # int32 addresses
SEGMENT_TARGET_BYTES = 256 << 20  # records per segment: the largest power of two within it
MIN_SEGMENT_SHIFT = 12
CLEAN_MIN_RECORDS = 65536  # never clean a log smaller than this
WAIT_SLACK_SEGMENTS = 2  # a write waits for the cleaner this many segments past the bound
CLEAN_WAIT_S = 600.0  # the longest a write waits for the cleaner
CLEANER_POLL_S = 1.0
SCAN_ROWS = 1 << 20  # rows of `location` scanned at a time (bounds temporary memory)
_UINT32 = 0xFFFFFFFF


def _stride(row_bytes: int) -> int:
    return -(-(row_bytes + FOOTER_BYTES) // RECORD_ALIGN_BYTES) * RECORD_ALIGN_BYTES


def record_bytes(row_bytes: int) -> int:
    """Bytes one record of a `row_bytes` row takes in the log (row + footer, 8-aligned)."""
    return _stride(row_bytes)


def segment_shift_for(stride: int) -> int:
    """log2 of the records per segment for records of `stride` bytes (128-256 MiB segments)."""
    records = max(1, SEGMENT_TARGET_BYTES // stride)
    return max(MIN_SEGMENT_SHIFT, min(ADDRESS_BITS - 1, records.bit_length() - 1))


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
    """Group sorted record offsets (of one file) into reads of whole aligned sectors.

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


@dataclass(frozen=True, slots=True)
class _Segment:
    """One open segment file: its descriptor and the sequence number in its records."""

    fd: int
    sequence: int


class FileBackend:
    """Rows as records of a segmented append-only log; see the module docstring."""

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
        max_space_amplification: float = 1.5,
        segment_shift: int | None = None,
        clean_min_records: int = CLEAN_MIN_RECORDS,
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
            max_space_amplification: Records on disk per live record above which the
                cleaner runs, > 1 (1.5: the log takes at most about 1.5x the live rows'
                bytes, plus two segments).
            segment_shift: log2 of the records per segment for a new log (None: segments of
                about 256 MiB); a recovered log keeps its own.
            clean_min_records: Records on disk below which the log is never cleaned.

        Raises:
            StoreCorruptionError: If the MANIFEST's facts, the index or a segment's header
                and length do not match, or the log is of another format version.
            ValueError: If `align_bytes` is not 512 or 4096, `max_space_amplification` is
                not > 1 or `segment_shift` is outside [0, 30].
        """
        if align_bytes not in (None, SECTOR_BYTES, HEADER_BYTES):
            raise ValueError(f"align_bytes={align_bytes} must be 512 or 4096 (or None)")
        if not max_space_amplification > 1:
            raise ValueError(
                f"max_space_amplification={max_space_amplification} must be > 1 (disk bytes "
                "per live byte the log may reach before it is cleaned; 1.5 is the default)"
            )
        if segment_shift is not None and not 0 <= segment_shift < ADDRESS_BITS:
            raise ValueError(f"segment_shift={segment_shift} must be in [0, {ADDRESS_BITS - 1}]")
        self.directory = directory
        self.max_io_bytes = max(1, max_io_bytes)
        self.num_rows = num_rows
        self.width = width
        self.dtype = np.dtype(dtype)
        self.row_bytes = self.dtype.itemsize * width
        self.stride = _stride(self.row_bytes)
        self.use_direct_io = use_direct_io
        self.max_space_amplification = float(max_space_amplification)
        self.clean_min_records = int(clean_min_records)
        self._weights = _checksum_weights((self.stride - 4) // 4)
        self._append_lock = threading.Lock()  # appends and cleaning (see the docstring)
        self._segments_lock = threading.Lock()  # `_segments`, `_epoch`, `_readers`, `_closing`
        # Deleted segments' fds are closed once every read that began before the deletion
        # has ended (epoch-based reclamation): each deletion starts a new epoch, each read
        # counts under the epoch it began in.
        self._epoch = 0
        self._readers: dict[int, int] = {}  # epoch -> reads begun in it and still running
        self._closing: list[tuple[int, int]] = []  # (epoch of the deletion, fd)
        self._tail_block = b""  # the tail segment's bytes after its last full sector
        self._unsynced: set[int] = set()  # slots appended to since the last sync
        self.align = align_bytes or SECTOR_BYTES
        self.io_threads = max(1, io_threads)
        self.cleaned_segments = 0
        """Segments the cleaner has emptied since open."""
        self.cleaned_records = 0
        """Live records the cleaner has copied to the tail since open."""
        self.deleted_segments = 0
        """Segment files deleted since open (cleaned or all garbage)."""
        self._segments: dict[int, _Segment] = {}  # replaced, never mutated (readers keep one)
        self._retired: set[int] = set()  # cleaned, but pinned: deleted after a checkpoint
        # The cleaner thread: woken by writes past the bound; writes wait on it past the
        # bound plus WAIT_SLACK_SEGMENTS. Both share the append lock.
        self._clean_wake = threading.Condition(self._append_lock)
        self._cleaning: int | None = None  # the slot being copied (nobody else deletes it)
        self._cleaner_error: BaseException | None = None
        self._stopping = False
        self.live_per_slot = np.zeros(0, dtype=np.int64)  # live records per segment slot
        try:
            if epoch is None:
                self.shift = (
                    segment_shift_for(self.stride) if segment_shift is None else segment_shift
                )
                self._init_geometry()
                self.location = np.full(num_rows, -1, dtype=np.int32)
                self.next_sequence = 0
                self.tail = 0
                self._pinned: frozenset[int] = frozenset()
                self._new_segment(0)
            else:
                self._recover(epoch, manifest_info or {})
            if self.direct_io and align_bytes is None:
                self.align = self._direct_io_alignment()
            self._tail_block = self._read_tail_block()
        except BaseException:
            for segment in self._segments.values():
                with contextlib.suppress(OSError):
                    os.close(segment.fd)
            raise
        self._count_live()
        self._next_pinned = self._pinned
        self.pool = ThreadPoolExecutor(self.io_threads, thread_name_prefix="frugal-file-io")
        self._cleaner = threading.Thread(
            target=self._cleaner_main, name="frugal-file-cleaner", daemon=True
        )
        self._cleaner.start()

    def _init_geometry(self) -> None:
        self.segment_records = 1 << self.shift
        self.num_slots = 1 << (ADDRESS_BITS - self.shift)
        self.direct_io = False

    def _slots_of(self, addresses: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
        return (addresses.astype(np.int64) >> self.shift).astype(np.int64)

    def _count_live(self) -> set[int]:
        """Recount live records per slot from `location` (in chunks); return the slots used."""
        counts = np.zeros(max(self._segments, default=0) + 1, dtype=np.int64)
        for start in range(0, self.num_rows, SCAN_ROWS):
            part = self.location[start : start + SCAN_ROWS]
            slots = self._slots_of(part[part >= 0])
            if len(slots):
                found = np.bincount(slots)
                if len(found) > len(counts):
                    counts = np.pad(counts, (0, len(found) - len(counts)))
                counts[: len(found)] += found
        self.live_per_slot = counts
        return set(np.flatnonzero(counts).tolist())

    # --- files -------------------------------------------------------------------------------

    def _log_path(self, slot: int) -> Path:
        return self.directory / f"log.{slot}.dat"

    def _header(self, slot: int, sequence: int) -> bytes:
        header = {
            "magic": MAGIC,
            "format_version": FORMAT_VERSION,
            "num_rows": self.num_rows,
            "width": self.width,
            "stride": self.stride,
            "segment_shift": self.shift,
            "slot": slot,
            "sequence": sequence,
        }
        return json.dumps(header).encode().ljust(HEADER_BYTES, b"\0")

    def _new_segment(self, slot: int) -> None:
        """Create segment `slot` (its header fsynced) and make it the tail's."""
        sequence = self.next_sequence
        path = self._log_path(slot)
        with path.open("wb") as fh:
            fh.write(self._header(slot, sequence))
            fh.flush()
            os.fsync(fh.fileno())
        fd, direct = self._open(path)
        self.direct_io = direct
        self.next_sequence = sequence + 1
        if slot >= len(self.live_per_slot):
            self.live_per_slot = np.pad(self.live_per_slot, (0, slot + 1 - len(self.live_per_slot)))
        with self._segments_lock:
            self._segments = self._segments | {slot: _Segment(fd, sequence)}
        self._unsynced.add(slot)

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
        fd = self._segments[self.tail >> self.shift].fd
        try:
            os.preadv(fd, [memoryview(mmap.mmap(-1, SECTOR_BYTES))], SECTOR_BYTES)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            return HEADER_BYTES  # a 4 KiB-sector device: the header probe at open worked
        return SECTOR_BYTES

    def _tail_end_bytes(self) -> int:
        """File offset just past the tail segment's last record."""
        return HEADER_BYTES + (self.tail & (self.segment_records - 1)) * self.stride

    def _read_tail_block(self) -> bytes:
        """The bytes of the tail segment's last, partial sector, or b""."""
        end = self._tail_end_bytes()
        start = _floor(end, self.align)
        if start == end:
            return b""
        buf = mmap.mmap(-1, self.align)
        slot = self.tail >> self.shift
        done = os.preadv(self._segments[slot].fd, [buf], start)
        if done < end - start:
            raise StoreCorruptionError(
                f"{self._log_path(slot)}: short read of {done} bytes at offset {start}; the "
                "segment is truncated"
            )
        return bytes(buf[: end - start])

    def _check_header(self, path: Path, expected: dict[str, Any]) -> None:
        """Check a segment header's magic, format version, table shape and `expected` facts.

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
                f"reads version {FORMAT_VERSION} only (version 4 keeps the log in segments "
                "and cleans it online; 3 kept one file; 2 padded each record to 512 B). To "
                "upgrade, open the store with the frugal that wrote it, read its rows "
                "(`peek(np.arange(num_rows), cols='all')`, in chunks) and `put` them into a "
                "store created with this frugal"
            )
        facts = {"num_rows": self.num_rows, "width": self.width, "stride": self.stride}
        for key, value in (facts | expected).items():
            if header.get(key) != value:
                raise StoreCorruptionError(
                    f"{path}: header {key} = {header.get(key)!r}, expected {value!r}"
                )

    def _recover(self, epoch: int, info: dict[str, Any]) -> None:
        """Open checkpoint `epoch`'s segments, cut the tail one, drop later segments."""
        segments = info.get("segments")
        if (
            "segment_shift" not in info
            or not isinstance(segments, dict)
            or info.get("stride") != self.stride
        ):
            older = sorted(self.directory.glob("log.*.dat"))
            if older:  # a log of an older format says so (and how to upgrade)
                self._check_header(older[0], {})
            raise StoreCorruptionError(
                f"{self.directory}: MANIFEST backend_info {info} does not describe a "
                f"segmented file log of stride {self.stride}"
            )
        try:
            self.shift = int(info["segment_shift"])
            self.tail = int(info["tail"])
            self.next_sequence = int(info["next_sequence"])
            wanted = {int(slot): int(sequence) for slot, sequence in segments.items()}
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreCorruptionError(
                f"{self.directory}: MANIFEST backend_info {info} is malformed ({exc})"
            ) from exc
        if info.get("stride") != self.stride or not 0 <= self.shift < ADDRESS_BITS:
            raise StoreCorruptionError(
                f"{self.directory}: MANIFEST backend_info {info} does not describe a file log "
                f"with stride {self.stride}"
            )
        self._init_geometry()
        tail_slot = self.tail >> self.shift
        tail_index = self.tail & (self.segment_records - 1)
        if not 0 <= self.tail < 1 << ADDRESS_BITS or (tail_slot not in wanted and tail_index):
            raise StoreCorruptionError(
                f"{self.directory}: MANIFEST tail {self.tail} is outside its segments "
                f"{sorted(wanted)}"
            )
        self.location = self._load_index(epoch, wanted)
        for path in self.directory.glob("log.*.dat"):  # segments begun after the checkpoint
            stem = path.name[len("log.") : -len(".dat")]
            if not stem.isdigit() or int(stem) not in wanted:
                path.unlink()
        opened: dict[int, _Segment] = {}
        self._segments = opened
        for slot, sequence in sorted(wanted.items()):
            path = self._log_path(slot)
            self._check_header(path, {"slot": slot, "sequence": sequence})
            fd, direct = self._open(path)
            opened[slot] = _Segment(fd, sequence)
            self.direct_io = self.direct_io or direct
            size = os.fstat(fd).st_size
            needed = (
                self._tail_end_bytes()
                if slot == tail_slot
                else HEADER_BYTES + self.segment_records * self.stride
            )
            if size < needed:
                raise StoreCorruptionError(
                    f"{path}: {size} bytes, but checkpoint records reach {needed}; the "
                    "segment is truncated"
                )
            if slot == tail_slot and size > needed:
                os.truncate(path, needed)  # records after the checkpoint: garbage
        if tail_slot not in opened:  # the checkpoint's tail segment was empty: begin it anew
            self._new_segment(tail_slot)
        self._pinned = frozenset(wanted)

    def _load_index(self, epoch: int, segments: dict[int, int]) -> npt.NDArray[np.int32]:
        path = self.directory / f"index.{epoch}.npy"
        try:
            index = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise StoreCorruptionError(
                f"{path}: index of checkpoint {epoch} unreadable: {exc}"
            ) from exc
        if index.shape != (self.num_rows,) or index.dtype != np.int32:
            raise StoreCorruptionError(f"{path}: not an index of {self.num_rows} int32 addresses")
        tail_slot = self.tail >> self.shift
        for start in range(0, self.num_rows, SCAN_ROWS):
            part = index[start : start + SCAN_ROWS]
            part = part[part >= 0]
            slots = part >> self.shift
            bad = ~np.isin(slots, list(segments)) | ((slots == tail_slot) & (part >= self.tail))
            if bad.any():
                raise StoreCorruptionError(
                    f"{path}: address {int(part[np.argmax(bad)])} is beyond the checkpoint's "
                    "segments and tail"
                )
        result: npt.NDArray[np.int32] = index
        return result

    # --- I/O ---------------------------------------------------------------------------------

    def _parallel(self, runs: list[tuple[int, int, int, int, int]], action: Any) -> None:
        if len(runs) <= 2 or self.io_threads == 1:
            action(runs)
            return
        groups = [runs[k :: self.io_threads] for k in range(min(self.io_threads, len(runs)))]
        for future in [self.pool.submit(action, group) for group in groups]:
            future.result()

    @contextlib.contextmanager
    def _reading(self) -> Iterator[dict[int, _Segment]]:
        """Yield the segment map; segments deleted meanwhile stay open until the read ends."""
        with self._segments_lock:
            epoch = self._epoch
            self._readers[epoch] = self._readers.get(epoch, 0) + 1
            segments = self._segments
        try:
            yield segments
        finally:
            with self._segments_lock:
                self._readers[epoch] -= 1
                if not self._readers[epoch]:
                    del self._readers[epoch]
                closing = self._closable()
            for fd in closing:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _closable(self) -> list[int]:
        """Take the deleted segments' fds no running read can hold (`_segments_lock` held)."""
        oldest = min(self._readers, default=self._epoch + 1)
        closing = [fd for epoch, fd in self._closing if epoch <= oldest]
        if closing:
            self._closing = [(epoch, fd) for epoch, fd in self._closing if epoch > oldest]
        return closing

    def _read_records(
        self,
        segments: dict[int, _Segment],
        addresses: npt.NDArray[np.int64],
        *,
        missing_ok: bool = False,
    ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint32]]:
        """Read records by address (any order).

        Segments missing from `segments` (begun after the caller took it) are looked up in
        the current map. Returns the (N, S) record bytes in the given order and the sequence
        number of the segment each was read from. A segment in neither map raises
        `StoreCorruptionError`, or with `missing_ok` reads as zero bytes that fail their
        check (the caller retries from the current `location`).
        """
        stride = self.stride
        order = np.argsort(addresses, kind="stable")
        ordered = addresses[order]
        slots = ordered >> self.shift
        cuts = np.flatnonzero(np.diff(slots)) + 1
        runs: list[tuple[int, int, int, int, int]] = []
        positions = np.empty(len(addresses), dtype=np.int64)
        sequences = np.empty(len(addresses), dtype=np.uint32)
        total = 0
        for first, last in zip(
            np.concatenate(([0], cuts)).tolist(),
            np.concatenate((cuts, [len(ordered)])).tolist(),
            strict=True,
        ):
            if first == last:
                continue
            slot = int(slots[first])
            segment = segments.get(slot) or self._segments.get(slot)
            if segment is None and missing_ok:  # deleted since the address was read
                sequences[order[first:last]] = _UINT32  # never a segment's sequence
                positions[first:last] = -1
                continue
            if segment is None:
                raise StoreCorruptionError(
                    f"{self.directory}: address {int(ordered[first])} is in segment {slot}, "
                    "which does not exist; the store is corrupt; restore it from a copy"
                )
            offsets = HEADER_BYTES + (ordered[first:last] & (self.segment_records - 1)) * stride
            group_runs, group_positions, group_total = _runs(offsets, stride, self.align)
            runs += [(total + p, segment.fd, o, n, m) for p, o, n, m in group_runs]
            positions[first:last] = total + group_positions
            sequences[order[first:last]] = segment.sequence & _UINT32
            total += group_total
        buf = mmap.mmap(-1, max(1, total))
        view = memoryview(buf)

        def read(group: list[tuple[int, int, int, int, int]]) -> None:
            for position, fd, offset, length, needed in group:
                done = os.preadv(fd, [view[position : position + length]], offset)
                if done < needed:
                    raise StoreCorruptionError(
                        f"{self.directory}: short read of {done} bytes at offset {offset} of "
                        "a log segment; the segment is truncated"
                    )

        self._parallel(runs, read)
        result = np.zeros((len(addresses), stride), dtype=np.uint8)
        found = positions >= 0
        if found.any():
            windows = np.lib.stride_tricks.sliding_window_view(
                np.frombuffer(buf, dtype=np.uint8), stride
            )
            result[order[found]] = windows[positions[found]]
        return result, sequences

    def _bad_records(
        self, records_NS: npt.NDArray[np.uint8], ids: I64, expected: npt.NDArray[np.uint32]
    ) -> Bool:
        """Records whose footer id, segment sequence or checksum does not match."""
        stride = self.stride
        footer_ids = records_NS[:, stride - 16 : stride - 8].copy().view(np.int64).ravel()
        sequences = records_NS[:, stride - 8 : stride - 4].copy().view(np.uint32).ravel()
        stored = records_NS[:, stride - 4 :].copy().view(np.uint32).ravel()
        bad: Bool = (
            (footer_ids != ids)
            | (sequences != expected)
            | (stored != _row_checksums(records_NS, self._weights))
        )
        return bad

    def _check_records(
        self,
        records_NS: npt.NDArray[np.uint8],
        ids: I64,
        addresses: npt.NDArray[np.int64],
        expected: npt.NDArray[np.uint32],
    ) -> None:
        """Raise `StoreCorruptionError` naming the first record that fails its check."""
        stride = self.stride
        bad = self._bad_records(records_NS, ids, expected)
        if bad.any():
            footer_ids = records_NS[:, stride - 16 : stride - 8].copy().view(np.int64).ravel()
            sequences = records_NS[:, stride - 8 : stride - 4].copy().view(np.uint32).ravel()
            k = int(np.flatnonzero(bad)[0])
            slot = int(addresses[k]) >> self.shift
            offset = HEADER_BYTES + (int(addresses[k]) & (self.segment_records - 1)) * stride
            raise StoreCorruptionError(
                f"{self._log_path(slot)}: row id {int(ids[k])} at offset {offset} fails its "
                f"check (footer id {int(footer_ids[k])}, sequence {int(sequences[k])}); "
                f"{int(bad.sum())} bad rows in this read. The store is corrupt; restore it "
                "from a copy"
            )

    def read_rows(self, ids: I64, out: F32) -> Bool:
        """Read the newest record of each id; see `StoreBackend.read_rows`.

        Raises:
            StoreCorruptionError: If a record's footer id, sequence or checksum does not
                match, or its segment is missing.
            OSError: On an I/O failure.
        """
        # `location` before the segment map: every segment an address names was begun before
        # the map was taken, so it is in the map, or was deleted (a retry reads the row's
        # new address); read the other way round, a slot deleted and reused in between
        # would be read from its old file, maybe an older record of the same row.
        addresses = self.location[ids].astype(np.int64)
        with self._reading() as segments:
            present: Bool = addresses >= 0
            if not present.any():
                return present
            found = np.flatnonzero(present)
            step = self._rows_per_io()  # record buffers stay within the store's I/O budget
            for start in range(0, len(found), step):
                where = found[start : start + step]
                part = addresses[where]
                for _ in range(3):
                    records, expected = self._read_records(segments, part, missing_ok=True)
                    bad = self._bad_records(records, ids[where], expected)
                    if not bad.any():
                        break
                    # The cleaner or a write-back moved the row since its address was read
                    # (its old segment deleted, maybe its slot reused): read again where
                    # its address changed, from the current map.
                    fresh = self.location[ids[where]].astype(np.int64)
                    if np.array_equal(fresh[bad], part[bad]):
                        break
                    part, segments = fresh, self._segments
                self._check_records(records, ids[where], part, expected)
                out[where] = records[:, : self.row_bytes].copy().view(self.dtype)
        return present

    def _rows_per_io(self) -> int:
        """Records per read or write call: max_io_bytes of record buffers, at least one.

        A record read alone costs its sectors: up to `stride` rounded up to a sector, plus
        one more where it straddles a sector boundary.
        """
        return max(1, self.max_io_bytes // (_ceil(self.stride, self.align) + self.align))

    def _encode(self, ids: I64, rows: F32, prefix: bytes, sequence: int) -> mmap.mmap:
        """`prefix`, then the records of `ids`, zero-padded to whole sectors."""
        stride, start = self.stride, len(prefix)
        buf = mmap.mmap(-1, _ceil(start + len(ids) * stride, self.align))
        buf[:start] = prefix
        records = np.frombuffer(buf, dtype=np.uint8)[start : start + len(ids) * stride]
        records = records.reshape(len(ids), stride)
        records[:, : self.row_bytes] = np.ascontiguousarray(rows, dtype=self.dtype).view(np.uint8)
        records[:, stride - 16 : stride - 8] = ids.astype(np.int64).reshape(-1, 1).view(np.uint8)
        stamp = np.full((len(ids), 1), sequence & _UINT32, dtype=np.uint32)
        records[:, stride - 8 : stride - 4] = stamp.view(np.uint8)
        records[:, stride - 4 :] = (
            _row_checksums(records, self._weights).reshape(-1, 1).view(np.uint8)
        )
        del records
        return buf

    def _append(self, segment: _Segment, index: int, ids: I64, rows: F32, block: bytes) -> bytes:
        """Write the records of `ids` from record `index` of `segment`; return its new tail block.

        The write starts at the sector holding record `index`'s first byte and rewrites that
        sector's earlier bytes (`block`, unchanged), so it never alters another record. The
        caller holds `_append_lock`.
        """
        end = HEADER_BYTES + index * self.stride
        offset = _floor(end, self.align)
        if end - offset != len(block):
            raise AssertionError(f"tail block of {len(block)} bytes at offset {end}")
        buf = self._encode(ids, rows, block, segment.sequence)
        view = memoryview(buf)
        chunk = max(self.align, _floor(WRITE_CHUNK_BYTES, self.align))
        for pos in range(0, len(buf), chunk):
            part = view[pos : pos + chunk]
            done = os.pwritev(segment.fd, [part], offset + pos)
            while done < len(part):  # a short write: retry the rest, which raises the cause
                more = os.pwritev(segment.fd, [part[done:]], offset + pos + done)
                if more <= 0:  # (ENOSPC, EFBIG)
                    raise OSError(errno.ENOSPC, f"no space to append at offset {offset + pos}")
                done += more
        new_end = end + len(ids) * self.stride
        block_start = _floor(new_end, self.align) - offset
        new_block = bytes(view[block_start : new_end - offset])
        del view
        return new_block

    def _free_slot(self, besides: int) -> int:
        """The lowest slot with no segment file, other than `besides` (the next tail's)."""
        taken = set(self._segments) | {besides}
        for slot in range(self.num_slots):
            if slot not in taken:
                return slot
        raise StoreCorruptionError(
            f"{self.directory}: all {self.num_slots} log segments are in use (2^31 records); "
            "take a checkpoint so pinned segments can be deleted, or lower "
            "max_space_amplification"
        )

    def _append_locked(self, ids: I64, rows: F32) -> None:
        """Append records at the tail and point `location` at them; holds `_append_lock`."""
        step = self._rows_per_io()  # the encode buffer stays within the store's I/O budget
        first = 0
        while first < len(ids):
            index = self.tail & (self.segment_records - 1)
            slot = self.tail >> self.shift
            if index == 0 and slot not in self._segments:  # the previous segment is full
                self._new_segment(slot)
            count = min(step, len(ids) - first, self.segment_records - index)
            fills = index + count == self.segment_records
            next_tail = self._free_slot(besides=slot) << self.shift if fills else -1
            part_ids, part_rows = ids[first : first + count], rows[first : first + count]
            segment = self._segments[slot]
            self._tail_block = self._append(segment, index, part_ids, part_rows, self._tail_block)
            self._unsynced.add(slot)
            old = self.location[part_ids]
            old = old[old >= 0]
            np.subtract.at(self.live_per_slot, self._slots_of(old), 1)
            self.live_per_slot[slot] += count
            self.location[part_ids] = np.arange(self.tail, self.tail + count, dtype=np.int32)
            first += count
            if fills:  # the next append opens a new segment (chosen before this write)
                self.tail = next_tail
                self._tail_block = b""
            else:
                self.tail += count
            if not self.direct_io and hasattr(os, "posix_fadvise"):
                os.posix_fadvise(segment.fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def write_rows(self, ids: I64, rows: F32) -> None:
        """Append records at the tail; wake the cleaner if the log grew past its bound.

        See `StoreBackend.write_rows`; ids are unique. The write waits for the cleaner only
        while the log is more than two segments past its bound (and the cleaner can act).

        Raises:
            OSError: On an I/O failure (e.g. a full disk); earlier records are untouched.
            StoreCorruptionError: If all 2^31 record addresses are in use, or the cleaner
                found a corrupt record.
            StoreError: If the cleaner did not bring the log back within its bound in
                `CLEAN_WAIT_S` seconds.
        """
        if len(ids) == 0:
            return
        with self._append_lock:
            self._raise_cleaner_error()
            self._append_locked(ids, rows)
            self._drop_garbage_segments()
            if self._over_bound(0):
                self._clean_wake.notify_all()
                self._wait_for_cleaner(WAIT_SLACK_SEGMENTS, CLEAN_WAIT_S)

    # --- cleaning ----------------------------------------------------------------------------

    def disk_records(self) -> int:
        """Records the segment files hold (live and garbage), retired segments included."""
        tail_slot = self.tail >> self.shift
        full = sum(1 for slot in self._segments if slot != tail_slot)
        in_tail = self.tail & (self.segment_records - 1) if tail_slot in self._segments else 0
        return full * self.segment_records + in_tail

    def live_records(self) -> int:
        """Records `location` points at (one per written row)."""
        return int(self.live_per_slot.sum())

    def wait_for_cleaning(self, timeout_s: float = CLEAN_WAIT_S) -> None:
        """Block until the log is within its space bound, or the cleaner can free no more.

        Args:
            timeout_s: The longest to wait, in seconds.

        Raises:
            StoreError: If the cleaner is still working after `timeout_s`.
            StoreCorruptionError: If the cleaner found a corrupt record.
        """
        with self._append_lock:
            self._raise_cleaner_error()
            self._drop_garbage_segments()
            if self._over_bound(0):
                self._clean_wake.notify_all()
            self._wait_for_cleaner(0, timeout_s)

    def _raise_cleaner_error(self) -> None:
        if self._cleaner_error is not None:
            raise self._cleaner_error

    def _wait_for_cleaner(self, slack_segments: int, timeout_s: float) -> None:
        """Wait (lock held) while the log is past its bound plus `slack_segments`.

        Only while the cleaner is copying or has a segment to copy: a log it cannot clean
        (every segment pinned by a checkpoint) does not block writes.
        """
        deadline = time.monotonic() + timeout_s
        while self._over_bound(slack_segments) and (
            self._cleaning is not None or self._victim() is not None
        ):
            self._raise_cleaner_error()
            if not self._cleaner.is_alive():
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise StoreError(
                    f"{self.directory}: the log's cleaner did not bring its "
                    f"{self.disk_records()} records back within the bound for "
                    f"{self.live_records()} live rows in {timeout_s:.0f} s; the disk is too "
                    "slow for this write rate: raise max_space_amplification"
                )
            self._clean_wake.wait(min(remaining, CLEANER_POLL_S))
        self._raise_cleaner_error()

    def _over_bound(self, slack_segments: int) -> bool:
        """Whether the log holds more records than its bound allows (lock held).

        Retired segments are not counted: the next checkpoint deletes them.
        """
        on_disk = self.disk_records() - len(self._retired) * self.segment_records
        bound = (
            self.max_space_amplification * self.live_records()
            + (2 + slack_segments) * self.segment_records
        )
        return on_disk > max(self.clean_min_records, bound)

    def _victim(self) -> int | None:
        """The full segment with the fewest live records, if the log is past its bound.

        Over the bound, the segments average under 1/max_space_amplification live records, so
        the emptiest one costs at most that fraction of a segment to copy (lock held).
        """
        if not self._over_bound(0):
            return None
        tail_slot = self.tail >> self.shift
        candidates = [
            s
            for s in self._segments
            if s not in (tail_slot, self._cleaning) and s not in self._retired
        ]
        if not candidates:
            return None
        return min(candidates, key=lambda s: (int(self.live_per_slot[s]), s))

    def _drop_garbage_segments(self) -> None:
        """Delete (or retire) the full segments no live row points into (lock held)."""
        tail_slot = self.tail >> self.shift
        for slot in list(self._segments):
            if (
                slot not in (tail_slot, self._cleaning)
                and slot not in self._retired
                and self.live_per_slot[slot] == 0
            ):
                self._drop_empty(slot)

    def _cleaner_main(self) -> None:
        """The cleaner thread: copy the emptiest segment whenever the log is past its bound."""
        slot: int | None = None
        try:
            while True:
                with self._append_lock:
                    if slot is not None:  # the copy of `slot` is done
                        self._cleaning = None
                        if self.live_per_slot[slot] == 0:
                            self.cleaned_segments += 1
                            self._drop_empty(slot)
                        self._clean_wake.notify_all()
                    slot = None
                    while not self._stopping:
                        self._drop_garbage_segments()
                        slot = self._victim()
                        if slot is not None:
                            break
                        self._clean_wake.wait(CLEANER_POLL_S)
                    if slot is None:
                        return
                    self._cleaning = slot
                self._copy_live(slot)
        except BaseException as exc:  # raised again by the next write
            with self._append_lock:
                self._cleaner_error = exc
                self._cleaning = None
                self._clean_wake.notify_all()

    def _copy_live(self, slot: int) -> None:
        """Copy segment `slot`'s live records to the tail, reading the segment in order.

        Each chunk (half the I/O buffer) is read sequentially without the append lock; a
        record is live if `location` of its footer's id still holds its address. Live records
        are checked, then appended under the lock only where that address is unchanged (a
        row rewritten meanwhile has a newer record). No row moves into `slot` (only the tail
        receives records), so one pass finds them all, unless a footer is damaged: then the
        rows still counted in `slot` are found through the index and their check fails.
        """
        stride, base = self.stride, slot << self.shift
        chunk = max(1, (self.max_io_bytes // 2) // stride)
        for first in range(0, self.segment_records, chunk):
            if self._stopping:
                return
            count = min(chunk, self.segment_records - first)
            with self._reading() as segments:
                records = self._read_sequential(segments[slot], first, count)
            ids = records[:, stride - 16 : stride - 8].copy().view(np.int64).ravel()
            addresses = base + first + np.arange(count, dtype=np.int64)
            known = (ids >= 0) & (ids < self.num_rows)
            live = known.copy()
            live[known] = self.location[ids[known]] == addresses[known]
            self._copy_records(records[live], ids[live], addresses[live], segments[slot])
        with self._append_lock:
            left = int(self.live_per_slot[slot])
        if left:
            self._copy_live_by_index(slot)

    def _read_sequential(self, segment: _Segment, first: int, count: int) -> npt.NDArray[np.uint8]:
        """The (count, S) records `first`.. of a full segment, in one sequential read."""
        start = HEADER_BYTES + first * self.stride
        offset = _floor(start, self.align)
        length = _ceil(start + count * self.stride, self.align) - offset
        buf = mmap.mmap(-1, length)
        done = os.preadv(segment.fd, [buf], offset)
        if done < start + count * self.stride - offset:
            raise StoreCorruptionError(
                f"{self.directory}: short read of {done} bytes at offset {offset} of a full "
                "log segment; the segment is truncated. Restore the store from a copy"
            )
        flat = np.frombuffer(buf, dtype=np.uint8)[
            start - offset : start - offset + count * self.stride
        ]
        return flat.reshape(count, self.stride)  # (a view that keeps `buf` alive)

    def _copy_records(
        self,
        records_NS: npt.NDArray[np.uint8],
        ids: I64,
        addresses: npt.NDArray[np.int64],
        segment: _Segment,
    ) -> None:
        """Check records read for cleaning; append those whose row has not moved since."""
        if len(ids) == 0:
            return
        expected = np.full(len(ids), segment.sequence & _UINT32, dtype=np.uint32)
        self._check_records(records_NS, ids, addresses, expected)
        rows = records_NS[:, : self.row_bytes].copy().view(self.dtype)
        with self._append_lock:
            unchanged = self.location[ids] == addresses
            if unchanged.any():
                self._append_locked(ids[unchanged], rows[unchanged])
                self.cleaned_records += int(np.count_nonzero(unchanged))

    def _copy_live_by_index(self, slot: int) -> None:
        """Copy the rows `location` still points into `slot` (a scan of the index in chunks)."""
        low, high = slot << self.shift, (slot + 1) << self.shift
        step = max(1, self._rows_per_io() // 2)
        for start in range(0, self.num_rows, SCAN_ROWS):
            part = self.location[start : start + SCAN_ROWS].copy()
            found = np.flatnonzero((part >= low) & (part < high))
            for first in range(0, len(found), step):
                if self._stopping:
                    return
                ids = (start + found[first : first + step]).astype(np.int64)
                with self._reading() as segments:
                    addresses = self.location[ids].astype(np.int64)
                    still = (addresses >= low) & (addresses < high)
                    ids, addresses = ids[still], addresses[still]
                    if len(ids) == 0:
                        continue
                    records, _ = self._read_records(segments, addresses)
                self._copy_records(records, ids, addresses, segments[slot])

    def _drop_empty(self, slot: int) -> None:
        """Delete segment `slot`, which no live row points into.

        A segment that a checkpoint (taken, or being taken) points into is retired instead.
        """
        if slot in self._pinned or slot in self._next_pinned:
            self._retired.add(slot)  # the last checkpoint reads it: keep it until the next
        else:
            self._delete_segment(slot)

    def _delete_segment(self, slot: int) -> None:
        with self._segments_lock:
            segment = self._segments[slot]
            self._segments = {s: g for s, g in self._segments.items() if s != slot}
            self._epoch += 1  # reads begun before now may still use the segment's fd
            self._closing.append((self._epoch, segment.fd))
            closing = self._closable()
        self._unsynced.discard(slot)
        self.deleted_segments += 1
        with contextlib.suppress(FileNotFoundError):
            self._log_path(slot).unlink()
        for fd in closing:
            with contextlib.suppress(OSError):
                os.close(fd)

    # --- durability --------------------------------------------------------------------------

    def sync(self) -> None:
        """Make appended records durable (fdatasync of the segments written to)."""
        with self._append_lock:
            for slot in sorted(self._unsynced):
                os.fdatasync(self._segments[slot].fd)
            self._unsynced.clear()

    def checkpoint(self, epoch: int) -> dict[str, Any]:
        """Save `location` as `index.<epoch>.npy`, with the segments it points into.

        Returns:
            The segment geometry, the tail address, the segments (slot -> sequence) the
            checkpoint needs, and the index file's sha256.
        """
        with self._append_lock:
            # The cleaner may have appended since the store's sync: the index must point at
            # durable records only.
            for slot in sorted(self._unsynced):
                os.fdatasync(self._segments[slot].fd)
            self._unsynced.clear()
            name = f"index.{epoch}.npy"
            digest = save_array_atomic(self.directory / name, self.location)
            tail_slot = self.tail >> self.shift
            if tail_slot not in self._segments:  # the tail segment is full: begin the next
                self._new_segment(tail_slot)
            # Every slot the index points into, and the tail's if it holds records (recovery
            # appends after them); an empty tail segment is begun anew by recovery.
            needed = self._count_live()
            if self.tail & (self.segment_records - 1):
                needed.add(tail_slot)
            self._next_pinned = frozenset(needed)
            return {
                "segment_shift": self.shift,
                "tail": self.tail,
                "next_sequence": self.next_sequence,
                "stride": self.stride,
                "segments": {str(s): self._segments[s].sequence for s in sorted(needed)},
                "file_sha256": {name: digest},
            }

    def finish_checkpoint(self, epoch: int) -> None:
        """Delete older indexes and the segments only earlier checkpoints needed."""
        with self._append_lock:
            self._pinned = self._next_pinned
            tail_slot = self.tail >> self.shift
            unneeded = [
                s
                for s in self._segments
                if s not in self._pinned and s not in (tail_slot, self._cleaning)
            ]
            for slot in sorted(unneeded):
                if slot in self._retired or self.live_per_slot[slot] == 0:
                    self._delete_segment(slot)
            self._retired &= self._pinned
        for path in self.directory.glob("index.*.npy"):
            if path.name != f"index.{epoch}.npy":
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()

    def memory_bytes(self) -> int:
        """The location index (and the per-segment live counts)."""
        return int(self.location.nbytes + self.live_per_slot.nbytes)

    def stats(self) -> dict[str, Any]:
        """Segments, records on disk and live, and what the cleaner did."""
        return {
            "segments": len(self._segments),
            "disk_records": self.disk_records(),
            "live_records": self.live_records(),
            "cleaned_segments": self.cleaned_segments,
            "cleaned_records": self.cleaned_records,
            "deleted_segments": self.deleted_segments,
        }

    def close(self) -> None:
        """Stop the cleaner (between two chunks) and the I/O threads; close the segments."""
        with self._append_lock:
            self._stopping = True
            self._clean_wake.notify_all()
        self._cleaner.join(timeout=CLEAN_WAIT_S)  # it stops after its current chunk
        self.pool.shutdown(wait=True)
        with self._segments_lock:
            fds = [segment.fd for segment in self._segments.values()]
            fds += [fd for _, fd in self._closing]
            self._segments, self._closing = {}, []
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


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
            max_space_amplification=args.max_space_amplification,
        )
    except FileNotFoundError as exc:
        raise StoreCorruptionError(
            f"{args.directory}: a file of checkpoint {args.epoch} is missing: {exc.filename}"
        ) from exc


register_backend(
    "file",
    _open_file,
    # int32 record address per row, plus the per-segment live counts
    reserved_memory_bytes=lambda args: 4 * args.num_rows + 4096,
    description="segmented record log with O_DIRECT reads, cleaned online (MLKV's own "
    "engine; default)",
)
