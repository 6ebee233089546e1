"""The storage-backend interface every `EmbeddingStore` engine implements.

A backend persists fixed-width float32 rows by int64 id. It knows nothing of caching,
staleness or optimizers: `EmbeddingStore` adds those on top of any backend. Rows never written
read as absent, and the store initialises them with `init_rows`, so all backends start from
the same table without writing it first. Shape legend: N rows in a call, W row width.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Protocol

import numpy as np
import numpy.typing as npt

from frugal._typing import F32, I64, Bool

__all__ = [
    "StoreBackend",
    "file_sha256",
    "read_json",
    "save_array_atomic",
    "write_json_atomic",
]

_HASH_CHUNK_BYTES = 1 << 20


class StoreBackend(Protocol):
    """Persistent rows by id, with durable checkpoints.

    Every method is called with sorted, unique, in-range ids; the store validates user input
    before it reaches a backend. Reads and writes of different ids may run concurrently from
    several threads; the store never reads an id while a write of that id is in flight.
    """

    direct_io: bool
    """Whether reads bypass the OS page cache (O_DIRECT), so the memory budget is honest."""
    budget_enforced: bool
    """Whether the backend's own memory use stays within the budget it was given."""

    def read_rows(self, ids: I64, out: F32) -> Bool:
        """Read rows into `out`; return which ids were ever written (others are untouched).

        Raises:
            StoreCorruptionError: If a stored row fails its checks.
            OSError: On an I/O failure.

        Shapes:
            ids: (N,); out: (N, W); returns (N,).
        """
        ...

    def write_rows(self, ids: I64, rows: F32) -> None:
        """Write rows (visible to later reads; durable only after `sync`).

        Raises:
            OSError: On an I/O failure (e.g. a full disk).

        Shapes:
            ids: (N,); rows: (N, W).
        """
        ...

    def sync(self) -> None:
        """Make every completed write durable (fsync)."""
        ...

    def checkpoint(self, epoch: int) -> dict[str, Any]:
        """Persist the current state as checkpoint `epoch`; return facts for the MANIFEST.

        Called after `sync`. Until the MANIFEST naming `epoch` is in place, the previous
        checkpoint must stay recoverable. A `"file_sha256"` entry ({file name in the store
        folder: sha256 hex}) names files the store checks at `open` before the backend reads
        them (an index that maps ids to records should be listed: a flipped byte in it would
        otherwise return a wrong row).
        """
        ...

    def finish_checkpoint(self, epoch: int) -> None:
        """Drop what only earlier checkpoints needed, once the MANIFEST names `epoch`."""
        ...

    def memory_bytes(self) -> int:
        """Bytes of RAM the backend holds (index, bitmaps, engine caches)."""
        ...

    def close(self) -> None:
        """Release files and threads; pending writes are completed first."""
        ...


def _replace_atomically(path: Path, mode: str, write: Callable[[IO[Any]], object]) -> None:
    """Write `path` through `path.tmp`: `write(file)`, fsync, rename; on failure remove it."""
    import os

    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open(mode) as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk: give its space back, leave nothing half-written
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON to `path` through a temporary file, fsync and rename, then fsync the folder.

    Raises:
        OSError: If the write fails; `path` keeps its previous content and no temporary file
            is left.
    """
    import json
    import os

    _replace_atomically(path, "w", lambda fh: json.dump(data, fh, indent=1, sort_keys=True))
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_json(path: Path) -> dict[str, Any]:
    """Read a JSON object from `path`.

    Raises:
        FileNotFoundError: If the file is missing.
        ValueError: If it is not a JSON object.
    """
    import json

    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return data


class _HashingWriter:
    """A binary file that hashes what is written through it (np.save writes in chunks)."""

    def __init__(self, fh: IO[bytes]) -> None:
        self.fh = fh
        self.digest = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return self.fh.write(data)


def save_array_atomic(path: Path, array: npt.NDArray[Any]) -> str:
    """Save a numpy array to `path` (.npy) through a temporary file, fsync and rename.

    Returns:
        The sha256 (hex) of the file's bytes, for the MANIFEST.

    Raises:
        OSError: If the write fails; `path` keeps its previous content and no temporary file
            is left.
    """
    writers: list[_HashingWriter] = []

    def save(fh: IO[Any]) -> None:
        writers.append(_HashingWriter(fh))
        np.save(writers[-1], array)  # a file-like object: np.save writes it in chunks

    _replace_atomically(path, "wb", save)
    return writers[-1].digest.hexdigest()


def file_sha256(path: Path) -> str:
    """The sha256 (hex) of a file's bytes, read in 1 MiB chunks.

    Raises:
        OSError: If the file cannot be read (FileNotFoundError if it is missing).
    """
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()
