"""Row files of recsys checkpoints: one `.npz` per PS shard, written and read a chunk at a time.

A shard file holds, for each table t:

- `ids{t}`: int64 (N,), sorted;
- `rows{t}`: float32 (N, W), the vector and the sparse-optimizer state of each row;
- `versions{t}`, `last_push{t}`: int64 (N,), the row's version clock and the push step of
  its last update;
- in an incremental checkpoint only, `deleted{t}`: int64 ids deleted (expired, evicted) since
  the checkpoint it builds on and absent now;

and, once per file, the shard's policy state (`EmbeddingShard.policy_state`): `expiry_check`
(the push step of its next expiry scan) and, with admission on, `sketch` (the count-min
counters, whole in every file: 8 MiB at the default width).

A full checkpoint's file lists every live row of the shard, an incremental one only the rows
written since the shard's last checkpoint. The archive is a plain uncompressed `.npz`
(`numpy.load` reads it) written member by member: rows are copied from the shard
`CHUNK_ROWS` at a time and read back the same way, so writing or loading a table holds its
ids and clocks (24 B a row) in RAM, never all its rows.

Shape legend: N rows of a table in a file, W row width (embedding_dim + optimizer state),
E embedding_dim.
"""

from __future__ import annotations

import os
import struct
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from frugal._typing import I64
from frugal.recsys.errors import RecsysError
from frugal.recsys.ps import EmbeddingShard, virtual_shard
from frugal.store.keys import KeySpaceFullError

__all__ = [
    "CHUNK_ROWS",
    "RowStream",
    "export_shard_rows",
    "import_shard_rows",
    "map_member",
    "read_array",
    "table_count",
    "write_rows",
    "write_shard_file",
]

CHUNK_ROWS = 1 << 16
"""Rows copied at a time between a shard and its file."""


def _write_array(archive: zipfile.ZipFile, name: str, array: npt.NDArray[Any]) -> None:
    with archive.open(f"{name}.npy", "w", force_zip64=True) as fh:
        np.lib.format.write_array(fh, array, allow_pickle=False)  # C order


def write_rows(
    archive: zipfile.ZipFile,
    name: str,
    shape: tuple[int, int],
    chunks: Iterable[npt.NDArray[np.float32]],
) -> None:
    """Write a float32 (N, W) array given as row chunks, without holding all of it."""
    header = {
        "descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)),
        "fortran_order": False,
        "shape": shape,
    }
    written = 0
    with archive.open(f"{name}.npy", "w", force_zip64=True) as fh:
        np.lib.format.write_array_header_1_0(fh, header)
        for chunk_NW in chunks:
            assert chunk_NW.shape[1:] == shape[1:]  # the shard's row width
            fh.write(np.ascontiguousarray(chunk_NW, dtype=np.float32).tobytes())
            written += len(chunk_NW)
    assert written == shape[0]  # every row of the header was written


def write_shard_file(
    shard: EmbeddingShard,
    path: Path,
    clocks: list[tuple[I64, I64, I64]],
    deleted: list[I64] | None = None,
) -> int:
    """Write the rows `clocks` names (and, for an incremental file, `deleted`) to `path`.

    Written to `path.part`, fsynced, then renamed. Call it while the shard is quiescent (no
    push in flight).

    Args:
        shard: The shard the rows are read from (`peek_table`, `CHUNK_ROWS` at a time).
        path: The `.npz` file.
        clocks: Per table, (ids sorted, versions, last pushes): `shard.row_clocks(...)`.
        deleted: Per table, ids deleted since the last checkpoint (`shard.deleted_ids()`),
            for an incremental file; None for a full one.

    Returns:
        Rows written.

    Raises:
        OSError: If the file cannot be written (the `.part` file may be left).
    """
    tmp = path.with_name(path.name + ".part")
    written = 0
    with tmp.open("wb") as fh:
        with zipfile.ZipFile(fh, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for t, (ids, versions, last_push) in enumerate(clocks):
                _write_array(archive, f"ids{t}", ids)
                chunks = (
                    shard.peek_table(t, ids[lo : lo + CHUNK_ROWS], cols="all")
                    for lo in range(0, len(ids), CHUNK_ROWS)
                )
                write_rows(archive, f"rows{t}", (len(ids), shard.row_widths[t]), chunks)
                _write_array(archive, f"versions{t}", versions)
                _write_array(archive, f"last_push{t}", last_push)
                if deleted is not None:
                    _write_array(archive, f"deleted{t}", deleted[t])
                written += len(ids)
            for name, array in shard.policy_state().items():
                _write_array(archive, name, array)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return written


def export_shard_rows(shard: EmbeddingShard, path: Path, *, incremental: bool = False) -> int:
    """Write the shard's live rows to `path` (.npz), or with `incremental` only its changes.

    Rows never written are not listed: they equal the store's seeded initial value. An
    incremental file holds the rows written since `shard.clear_changes()` and the ids deleted
    since then. Call it only while the shard is quiescent (no push in flight).

    Returns:
        Rows written.

    Raises:
        OSError: If the file cannot be written.
    """
    clocks = shard.row_clocks(changed_only=incremental)
    return write_shard_file(shard, path, clocks, shard.deleted_ids() if incremental else None)


class RowStream:
    """One float32 (N, W) array of a shard file, read `CHUNK_ROWS` rows at a time.

    Attributes:
        shape: (N, W).
    """

    def __init__(self, archive: zipfile.ZipFile, name: str) -> None:
        """Open member `name` (without `.npy`) of an open archive and read its header.

        Raises:
            RecsysError: If the member is not a 2-D float32 C-order array.
        """
        self._name = f"{archive.filename}:{name}"
        self._fh: IO[bytes] = archive.open(f"{name}.npy")
        version = np.lib.format.read_magic(self._fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(self._fh)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(self._fh)
        else:
            self._fh.close()
            raise RecsysError(f"{self._name}: .npy format {version} is not supported")
        if fortran or len(shape) != 2 or dtype != np.float32:
            self._fh.close()
            raise RecsysError(
                f"{self._name}: rows are {dtype} {shape}, fortran={fortran}; expected a "
                "float32 (N, W) array: the file is damaged or not a frugal shard file"
            )
        self.shape: tuple[int, int] = (int(shape[0]), int(shape[1]))

    def chunks(self) -> Iterator[tuple[int, npt.NDArray[np.float32]]]:
        """Yield (first row, rows (n, W)) up to `CHUNK_ROWS` rows at a time, in order.

        Raises:
            RecsysError: If the member ends early.
        """
        num, width = self.shape
        for lo in range(0, num, CHUNK_ROWS):
            count = min(CHUNK_ROWS, num - lo)
            data = self._fh.read(count * width * 4)
            if len(data) != count * width * 4:
                raise RecsysError(f"{self._name}: ends at row {lo}; the file is truncated")
            yield lo, np.frombuffer(data, dtype=np.float32).reshape(count, width)

    def close(self) -> None:
        """Close the member."""
        self._fh.close()

    def __enter__(self) -> RowStream:
        """Return self."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Close the member."""
        self.close()


def read_array(archive: zipfile.ZipFile, name: str) -> npt.NDArray[Any]:
    """Member `name` (without `.npy`) of an open shard file, whole."""
    with archive.open(f"{name}.npy") as fh:
        array: npt.NDArray[Any] = np.lib.format.read_array(fh, allow_pickle=False)
    return array


def map_member(path: Path, archive: zipfile.ZipFile, name: str) -> npt.NDArray[Any]:
    """Member `name` (an uncompressed `.npy`) of the zip at `path`, memory-mapped read-only.

    Shard files and exports store their members uncompressed, so a row can be read without
    reading the ones before it. `archive` is `path` opened (for the member's header offset).

    Raises:
        RecsysError: If the member is compressed (it cannot be mapped).
    """
    info = archive.getinfo(f"{name}.npy")
    if info.compress_type != zipfile.ZIP_STORED:
        raise RecsysError(
            f"{path}: {name} is compressed, so it cannot be memory-mapped; frugal writes its "
            "members uncompressed: use the file frugal wrote (export the checkpoint again), or "
            "open it without mmap"
        )
    with path.open("rb") as fh:
        fh.seek(info.header_offset)
        local = fh.read(30)  # the local file header: its name and extra lengths differ from
        name_bytes, extra_bytes = struct.unpack("<HH", local[26:30])  # the central directory's
        fh.seek(info.header_offset + 30 + name_bytes + extra_bytes)
        version = np.lib.format.read_magic(fh)
        read_header = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        shape, fortran, dtype = read_header(fh)
        offset = fh.tell()
    if fortran:
        raise RecsysError(f"{path}: {name} is stored in Fortran order; export it again")
    if int(np.prod(shape)) == 0:
        return np.empty(shape, dtype=dtype)
    mapped: npt.NDArray[Any] = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)
    return mapped


def _members(archive: zipfile.ZipFile) -> set[str]:
    return {name.removesuffix(".npy") for name in archive.namelist()}


def table_count(path: Path) -> int:
    """Tables a shard file holds (its `ids0`, `ids1`, ... members)."""
    with zipfile.ZipFile(path) as archive:
        members = _members(archive)
    count = 0
    while f"ids{count}" in members:
        count += 1
    return count


def import_shard_rows(
    shard: EmbeddingShard,
    owners: I64,
    rank: int,
    paths: list[Path],
    step: int = 0,
) -> int:
    """Load, from old shard files, the rows whose virtual shard `rank` owns under `owners`.

    Replays one checkpoint onto `shard`: the files' deletions (`deleted{t}`, in an
    incremental checkpoint) delete those ids' rows, then their rows overwrite the shard's.
    Replaying a chain is calling this for each checkpoint, the full one first.

    Args:
        shard: The shard (a fresh one, or one holding the checkpoints before this one).
        owners: The new owner of each virtual shard, int64 (1024,).
        rank: This shard's index in the new owner table.
        paths: Every shard file of the checkpoint (any old shard count).
        step: The push step rows count as last pushed at where a file does not record it
            (files written before expiry existed): expiry then restarts from the resume.

    Returns:
        Rows loaded.

    Raises:
        RecsysError: If a file does not match the shard's tables or row width.
    """
    # Every deletion first: the rows of one file may need the room another file's (or
    # another table's) deletions free (the shard's capacity fits each checkpoint's state).
    for path in paths:
        with zipfile.ZipFile(path) as archive:
            members = _members(archive)
            for t in range(shard.num_tables):
                if f"deleted{t}" in members:
                    gone = read_array(archive, f"deleted{t}")
                    shard.delete_rows(t, gone[owners[virtual_shard(t, gone)] == rank])
    loaded = 0
    for path in paths:
        with zipfile.ZipFile(path) as archive:
            members = _members(archive)
            for t in range(shard.num_tables):
                if f"ids{t}" not in members:
                    raise RecsysError(f"{path}: no table {t}; the checkpoint has other tables")
                ids = read_array(archive, f"ids{t}")
                mine = owners[virtual_shard(t, ids)] == rank
                versions = read_array(archive, f"versions{t}")
                last_push = (
                    read_array(archive, f"last_push{t}")
                    if f"last_push{t}" in members
                    else np.full(len(ids), step, dtype=np.int64)
                )
                with RowStream(archive, f"rows{t}") as rows:
                    if rows.shape[0] != len(ids):
                        raise RecsysError(
                            f"{path}: table {t} has {len(ids)} ids but {rows.shape[0]} rows; "
                            "the file is damaged"
                        )
                    if rows.shape[1] != shard.row_widths[t]:
                        raise RecsysError(
                            f"{path}: table {t} rows are {rows.shape[1]} wide, the shard's "
                            f"{shard.row_widths[t]}; resume with the same embedding_dim(s) and "
                            "optimizer"
                        )
                    if not mine.any():
                        continue
                    for lo, chunk_NW in rows.chunks():
                        hi = lo + len(chunk_NW)
                        take = mine[lo:hi]
                        if not take.any():
                            continue
                        try:
                            shard.load_rows(
                                t,
                                ids[lo:hi][take],
                                chunk_NW[take],
                                versions[lo:hi][take],
                                last_push[lo:hi][take],
                            )
                        except KeySpaceFullError as exc:
                            raise _too_full(shard, owners, rank, paths) from exc
                loaded += int(mine.sum())
    _load_policy_state(shard, owners, rank, paths)
    return loaded


def _too_full(shard: EmbeddingShard, owners: I64, rank: int, paths: list[Path]) -> RecsysError:
    """The error of a checkpoint whose rows for shard `rank` do not fit its capacity."""
    rows = 0
    for path in paths:
        with zipfile.ZipFile(path) as archive:
            for t in range(shard.num_tables):
                ids = read_array(archive, f"ids{t}")
                rows += int(np.count_nonzero(owners[virtual_shard(t, ids)] == rank))
    # a delta's files hold only its changes: the rows loaded before it count too
    rows = max(rows, int(shard.stats()["live_rows"]) + 1)
    world_size = int(owners.max()) + 1
    return RecsysError(
        f"the checkpoint ({paths[0].parent}) gives PS shard {rank} of {world_size} at least "
        f"{rows:,} rows, more than the {shard.capacity_rows:,} it can hold (ps_capacity_rows); "
        f"resume with ps_capacity_rows >= {rows:,} (more, to leave room for new ids) or onto "
        "more processes"
    )


def _load_policy_state(shard: EmbeddingShard, owners: I64, rank: int, paths: list[Path]) -> None:
    """Restore the expiry schedule and admission counters the files record (if they do).

    The same shard count restores this rank's own file's state exactly; another merges all.
    """
    same_layout = len(paths) == int(owners.max()) + 1 and np.array_equal(
        owners, np.arange(len(owners)) % len(paths)
    )
    chosen = [paths[rank]] if same_layout else paths
    states: list[dict[str, npt.NDArray[Any]]] = []
    for path in chosen:
        with zipfile.ZipFile(path) as archive:
            members = _members(archive)
            states.append(
                {  # "sketch", or "dim8.sketch" for one width of several
                    name: read_array(archive, name)
                    for name in sorted(members)
                    if name.rsplit(".", 1)[-1] in ("expiry_check", "sketch")
                }
            )
    shard.load_policy_state(states)
