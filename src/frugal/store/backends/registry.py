"""The store-backend registry: each engine registers how to open it and the RAM it holds.

`EmbeddingStore` looks its backend up here by the name in its MANIFEST (`file`, `rocksdb`,
`lmdb`, `memory`, or one a user registered). Adding an engine is one module with a class
implementing `StoreBackend` plus one `register_backend` call; nothing in the store changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from frugal.registry import Registry
from frugal.store.backends.base import StoreBackend

__all__ = ["BACKENDS", "BackendArgs", "BackendType", "backend_names", "register_backend"]


@dataclass(frozen=True, slots=True)
class BackendArgs:
    """What the store gives a backend when it opens it.

    Attributes:
        directory: The store's folder (the backend keeps its files here).
        num_rows: Rows in the table.
        width: Floats per row W (embedding plus optimizer state).
        epoch: The checkpoint to recover, or None for a new table.
        budget_bytes: The store's whole memory budget (a backend takes its share of it).
        dtype: Storage precision of rows, "float32" or "float16".
        io_threads: Threads a backend may use for parallel reads and writes.
        use_direct_io: Whether to bypass the page cache where the file system allows it.
        max_io_bytes: Bound of one read or write buffer, in bytes.
        info: What the backend returned from `manifest_info()` at the last checkpoint.
        max_space_amplification: Disk bytes per live byte a log-structured backend may
            reach before it cleans (the `file` backend), > 1.
    """

    directory: Path
    num_rows: int
    width: int
    epoch: int | None
    budget_bytes: int
    dtype: str = "float32"
    io_threads: int = 8
    use_direct_io: bool = True
    max_io_bytes: int = 16 << 20
    info: dict[str, Any] = field(default_factory=dict)
    max_space_amplification: float = 1.5

    @property
    def stored_row_bytes(self) -> int:
        """Bytes of one row as stored (W x the dtype's size)."""
        return self.width * np.dtype(self.dtype).itemsize


@dataclass(frozen=True, slots=True)
class BackendType:
    """One registered engine.

    Attributes:
        open: Opens (or creates, when `args.epoch` is None) the backend.
        reserved_memory_bytes: RAM the backend will hold, known before it is opened; the
            store takes it from the budget before sizing its cache.
        description: One line for `--help` and the docs.
    """

    open: Callable[[BackendArgs], StoreBackend]
    reserved_memory_bytes: Callable[[BackendArgs], int]
    description: str


BACKENDS: Registry[BackendType] = Registry("store backend", field="backend")
"""Every engine `EmbeddingStore.Config.backend` may name."""


def register_backend(
    name: str,
    open: Callable[[BackendArgs], StoreBackend],
    *,
    reserved_memory_bytes: Callable[[BackendArgs], int] = lambda args: 0,
    description: str = "",
    replace: bool = False,
) -> None:
    """Make `name` a valid `EmbeddingStore.Config.backend`.

    Args:
        name: The engine's name, as users write it in a config.
        open: Opens the backend from the store's `BackendArgs`.
        reserved_memory_bytes: RAM the backend holds (default 0: not counted).
        description: One line saying what the engine is.
        replace: Whether to replace an engine registered under the same name.

    Raises:
        ValueError: If `name` is taken and `replace` is False.
    """
    BACKENDS.register(name, BackendType(open, reserved_memory_bytes, description), replace=replace)


def backend_names() -> tuple[str, ...]:
    """The registered engines' names, built-in ones first."""
    return BACKENDS.names()
