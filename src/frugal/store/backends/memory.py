"""`memory` backend: a numpy table; checkpoints are `np.save` files."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np

from frugal._typing import F32, I64, Bool
from frugal.store.backends.base import save_array_atomic
from frugal.store.backends.registry import register_backend
from frugal.store.errors import StoreCorruptionError

__all__ = ["MemoryBackend"]


class MemoryBackend:
    """All rows in one array (of the spec's dtype); `written` marks rows that hold stored values."""

    direct_io = False  # no disk I/O at all
    budget_enforced = False  # the whole table lives in RAM by definition

    def __init__(
        self,
        directory: Path,
        num_rows: int,
        width: int,
        epoch: int | None,
        *,
        dtype: str = "float32",
    ) -> None:
        self.directory = directory
        self.table = np.zeros((num_rows, width), dtype=np.dtype(dtype))
        self.written = np.zeros(num_rows, dtype=bool)
        if epoch is not None:
            table_path = directory / f"table.{epoch}.npy"
            written_path = directory / f"written.{epoch}.npy"
            try:
                table = np.load(table_path, allow_pickle=False)
                written = np.load(written_path, allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise StoreCorruptionError(
                    f"{directory}: checkpoint {epoch} unreadable: {exc}"
                ) from exc
            if (
                table.shape != self.table.shape
                or table.dtype != self.table.dtype
                or written.shape != self.written.shape
            ):
                raise StoreCorruptionError(
                    f"{table_path}: {table.dtype} {table.shape} does not match the MANIFEST's "
                    f"{self.table.dtype} ({num_rows}, {width})"
                )
            self.table, self.written = table, written

    def read_rows(self, ids: I64, out: F32) -> Bool:
        """Copy rows out; see `StoreBackend.read_rows`."""
        present: Bool = self.written[ids]
        out[present] = self.table[ids[present]]
        return present

    def write_rows(self, ids: I64, rows: F32) -> None:
        """Store rows; see `StoreBackend.write_rows`."""
        self.table[ids] = rows
        self.written[ids] = True

    def sync(self) -> None:
        """Nothing to do: the table is in memory."""

    def checkpoint(self, epoch: int) -> dict[str, Any]:
        """Save the table and the written mask for `epoch`; return their sha256."""
        digests = {}
        for name, array in (
            (f"table.{epoch}.npy", self.table),
            (f"written.{epoch}.npy", self.written),
        ):
            digests[name] = save_array_atomic(self.directory / name, array)
        return {"file_sha256": digests}

    def finish_checkpoint(self, epoch: int) -> None:
        """Delete the files of earlier epochs."""
        for pattern in ("table.*.npy", "written.*.npy"):
            for path in self.directory.glob(pattern):
                if path.name.split(".")[1] != str(epoch):
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()

    def memory_bytes(self) -> int:
        """The whole table plus the mask."""
        return int(self.table.nbytes + self.written.nbytes)

    def close(self) -> None:
        """Nothing to release."""


register_backend(
    "memory",
    lambda a: MemoryBackend(a.directory, a.num_rows, a.width, a.epoch, dtype=a.dtype),
    reserved_memory_bytes=lambda args: args.num_rows * (args.stored_row_bytes + 1),
    description="the whole table in RAM (the all-in-memory reference)",
)
