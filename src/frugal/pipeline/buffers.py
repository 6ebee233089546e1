"""AQ-SGD's per-example activation buffers in `frugal.store`, and the per-link buffer choice.

`StoreBuffer` keeps one side of one link in an `EmbeddingStore` (file backend): row = example
id, width T x H float32, no optimizer. The store holds at most its memory budget in RAM and
reads rows ahead when told which examples come next (`prefetch` -> `EmbeddingStore.lookahead`,
fed in sample order by the training loop, which knows the seeded order). Each update is one
`get` of the seen rows and one `put` of all rows of the message, so the store's staleness bound
0 holds (read, write, read...). Rows are float32, so the values are exactly those of the RAM
and memmap backends (`frugal.comm.buffers`), and training is bit-identical.

`BufferSet` makes the buffers of every (link, side) of a run in one folder and closes them.
The backend is a name in `BUFFER_BACKENDS` (`memory`, `memmap`, `store`, or one added by
`register_buffer_backend`), a registry of `BufferBackendSpec`s.

References:
    Fine-tuning Language Models over Slow Networks using Activation Compression with
    Guarantees, NeurIPS 2022, arXiv 2206.01299 (section 3: per-example buffers).
    MLKV: Efficiently Scaling up Large Embedding Model Training with Disk-based Key-Value
    Storage, ICDE 2025, arXiv 2504.01506 (the store and its lookahead).
"""

from __future__ import annotations

import math
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from frugal.comm.buffers import ActivationBuffer, BufferFactory, MemmapBuffer, MemoryBuffer
from frugal.registry import Registry
from frugal.store import EmbeddingStore, OptimizerConfig, RowSpec

__all__ = [
    "BUFFER_BACKENDS",
    "BufferBackend",
    "BufferBackendSpec",
    "BufferSet",
    "StoreBuffer",
    "register_buffer_backend",
]

BufferBackend = str
"""A buffer backend's name: a key of `BUFFER_BACKENDS` (built in: "memory", "memmap",
"store")."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BufferBackendSpec:
    """One place AQ-SGD's per-example buffers can live.

    Attributes:
        make: `make(buffers, name, row_shape)`: the buffer of one (link, side) `name` (e.g.
            "link1-2.recv") of `buffers` (a `BufferSet`: its `num_examples`, `directory`,
            `store_budget_bytes`, `timeout_s`), rows of shape R = `row_shape`.
        uses_directory: Whether its buffers keep files (`BufferSet.directory` is made).
        description: One line for the docs.
    """

    make: Callable[[BufferSet, str, tuple[int, ...]], ActivationBuffer]
    uses_directory: bool = True
    description: str = ""


BUFFER_BACKENDS: Registry[BufferBackendSpec] = Registry("buffer backend", field="buffer_backend")
"""Every backend `PipelineTrainConfig.buffer_backend` may name, built-in ones first."""


def register_buffer_backend(
    name: str,
    make: Callable[[BufferSet, str, tuple[int, ...]], ActivationBuffer],
    *,
    uses_directory: bool = True,
    description: str = "",
    replace: bool = False,
) -> BufferBackendSpec:
    """Make `name` a valid `buffer_backend` (see `BufferBackendSpec` for the arguments).

    Returns:
        The registered spec.

    Raises:
        ValueError: If `name` is empty or taken and `replace` is False.
    """
    spec = BufferBackendSpec(make=make, uses_directory=uses_directory, description=description)
    return BUFFER_BACKENDS.register(name, spec, replace=replace)


class StoreBuffer:
    """Per-example rows in a disk-backed `EmbeddingStore` keyed by example id.

    Args:
        directory: An empty (or missing) folder for the store.
        num_examples: N; ids in [0, N).
        row_shape: R, e.g. (T, H).
        memory_budget_bytes: All the RAM the store may use (cache, id map, I/O buffers).
        timeout_s: Longest wait for a row.

    Raises:
        ValueError: If the folder is not empty or the budget cannot hold 64 rows.
    """

    def __init__(
        self,
        directory: str | Path,
        num_examples: int,
        row_shape: tuple[int, ...],
        *,
        memory_budget_bytes: int = 64 << 20,
        timeout_s: float = 60.0,
    ) -> None:
        self.row_shape = row_shape
        self.num_examples = num_examples
        spec = RowSpec(embedding_dim=math.prod(row_shape), optimizer=OptimizerConfig(kind="none"))
        config = EmbeddingStore.Config(
            backend="file",
            memory_budget_bytes=memory_budget_bytes,
            staleness_bound=0,
            timeout_s=timeout_s,
        )
        self.store = EmbeddingStore.create(
            directory, num_rows=num_examples, spec=spec, config=config
        )
        self._seen = np.zeros(num_examples, dtype=bool)

    @property
    def row_bytes(self) -> int:
        """4 x prod(R)."""
        return 4 * math.prod(self.row_shape)

    def _ids(self, ids: Tensor) -> np.ndarray:
        flat = ids.long().numpy()
        if flat.size and (flat.min() < 0 or flat.max() >= self.num_examples):
            raise ValueError(
                f"example ids must be in [0, {self.num_examples}), got [{flat.min()}, "
                f"{flat.max()}]; size the buffer with the largest example id + 1"
            )
        return flat

    def seen(self, ids: Tensor) -> Tensor:
        """(M,) bool."""
        return torch.from_numpy(self._seen[self._ids(ids)].copy())

    def seen_ids(self) -> Tensor:
        """Ids with a row."""
        return torch.from_numpy(np.flatnonzero(self._seen).astype(np.int64))

    def read(self, ids: Tensor, step: int) -> Tensor:
        """Rows of seen ids (opens their reads; the update's write closes them)."""
        rows = self.store.get(self._ids(ids), step)
        return torch.from_numpy(rows).reshape(-1, *self.row_shape)

    def peek(self, ids: Tensor) -> Tensor:
        """Rows of seen ids, without opening reads."""
        rows = self.store.peek(self._ids(ids), cols="emb")
        return torch.from_numpy(np.ascontiguousarray(rows)).reshape(-1, *self.row_shape)

    def write(self, ids: Tensor, rows: Tensor, step: int) -> None:
        """Put whole rows (closing their reads)."""
        flat = self._ids(ids)
        self.store.put(flat, rows.reshape(len(flat), -1).contiguous().cpu().numpy(), step)
        self._seen[flat] = True

    def prefetch(self, ids: Tensor, step: int) -> None:
        """Read the rows of these (already seen) ids ahead, in the background."""
        flat = self._ids(ids)
        flat = flat[self._seen[flat]]
        if flat.size:
            self.store.lookahead(flat, step)

    def close(self) -> None:
        """Close the store (no checkpoint: the buffers live as long as the run)."""
        self.store.close(checkpoint=False)


class BufferSet:
    """The buffers of every (link, side) of one run, in one folder.

    Args:
        backend: A name in `BUFFER_BACKENDS` (memory, memmap, store).
        num_examples: N, the largest example id + 1.
        parent: Folder in which a fresh folder for the memmap files / stores is made
            ("" = the system's temporary folder); `close` removes it.
        store_budget_bytes: Memory budget of each store.
        timeout_s: Store read timeout.

    Raises:
        ValueError: If the backend is unknown or num_examples < 1.
    """

    def __init__(
        self,
        backend: str,
        num_examples: int,
        parent: str = "",
        *,
        store_budget_bytes: int = 64 << 20,
        timeout_s: float = 60.0,
    ) -> None:
        self.spec = BUFFER_BACKENDS.get(backend)
        if num_examples < 1:
            raise ValueError(f"num_examples={num_examples} must be >= 1")
        self.backend = backend
        self.num_examples = num_examples
        self.directory: Path | None = None
        self._created: list[Path] = []  # folders this set made, deepest first
        if self.spec.uses_directory:
            if parent:
                folder = Path(parent).absolute()
                while not folder.exists():
                    self._created.append(folder)
                    folder = folder.parent
                Path(parent).mkdir(parents=True, exist_ok=True)
            self.directory = Path(tempfile.mkdtemp(prefix="frugal-buffers-", dir=parent or None))
        self.store_budget_bytes = store_budget_bytes
        self.timeout_s = timeout_s
        self.buffers: list[ActivationBuffer] = []

    def factory(self, name: str) -> BufferFactory:
        """The factory of one (link, side), e.g. "link1-2.recv"; its files go to directory/name."""

        def make(row_shape: tuple[int, ...]) -> ActivationBuffer:
            buffer = self.spec.make(self, name, row_shape)
            self.buffers.append(buffer)
            return buffer

        return make

    def close(self) -> None:
        """Close every buffer; remove their folder and the parents this set made, if empty."""
        for buffer in self.buffers:
            buffer.close()
        self.buffers.clear()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
        for folder in self._created:
            try:
                folder.rmdir()  # only when empty: other ranks may share it
            except OSError:
                break
        self._created.clear()

    def folder(self) -> Path:
        """The set's fresh folder, for backends whose `uses_directory` is True.

        Raises:
            RuntimeError: If the backend keeps no files or the set is closed.
        """
        if self.directory is None:
            raise RuntimeError(
                f"buffer backend {self.backend!r} has no folder (uses_directory=False or closed)"
            )
        return self.directory


def _memmap(buffers: BufferSet, name: str, row_shape: tuple[int, ...]) -> ActivationBuffer:
    return MemmapBuffer(buffers.folder() / f"{name}.f32", buffers.num_examples, row_shape)


def _store(buffers: BufferSet, name: str, row_shape: tuple[int, ...]) -> ActivationBuffer:
    return StoreBuffer(
        buffers.folder() / name,
        buffers.num_examples,
        row_shape,
        memory_budget_bytes=buffers.store_budget_bytes,
        timeout_s=buffers.timeout_s,
    )


register_buffer_backend(
    "memory",
    lambda buffers, name, row_shape: MemoryBuffer(row_shape),
    uses_directory=False,
    description="RAM",
)
register_buffer_backend("memmap", _memmap, description="a memory-mapped float32 file per side")
register_buffer_backend("store", _store, description="a frugal.store EmbeddingStore per side")
