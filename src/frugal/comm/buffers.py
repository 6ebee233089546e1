"""Where AQ-SGD's per-example activation buffers live: RAM or a memory-mapped file.

Each side of a pipeline link keeps one buffer row per training example (its last decoded
activation, (T, H) float32 for the tiny GPT). `ActivationBuffer` is what `DeltaCodec` needs:
which ids were seen, read rows, write rows, and a prefetch hint in sample order (the data
loader knows the next step's ids). Backends:

- `MemoryBuffer`: one float32 table, grown by doubling (the default), on the device of the
  activations (RAM, or their GPU).
- `MemmapBuffer`: an [N, T, H] float32 file mapped into memory (as the reference's memmap);
  the OS pages rows in and out, so the buffers may exceed RAM.
- `frugal.pipeline.buffers.StoreBuffer`: rows in `frugal.store` (a disk-backed EmbeddingStore
  keyed by example id, bounded RAM, lookahead prefetch).

Every backend stores float32 and returns exactly what was written, so training is
bit-identical whichever holds the buffers. Which ids were seen is a bitmap in RAM (N bytes).

Shape legend: M examples of one message, N examples (ids in [0, N)), R row shape (T, H).

References:
    Fine-tuning Language Models over Slow Networks using Activation Compression with
    Guarantees, NeurIPS 2022, arXiv 2206.01299 (section 3: the per-example buffers m(xi)).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from frugal._libc import physical_memory_bytes

__all__ = ["ActivationBuffer", "BufferFactory", "MemmapBuffer", "MemoryBuffer"]


class ActivationBuffer(Protocol):
    """Per-example float32 rows keyed by example id (one side of one link)."""

    def seen(self, ids: Tensor) -> Tensor:
        """(M,) bool: whether each id has a row."""
        ...

    def seen_ids(self) -> Tensor:
        """Sorted int64 ids that have a row."""
        ...

    def read(self, ids: Tensor, step: int) -> Tensor:
        """(M, *R) float32 rows of seen ids: a fresh tensor, the caller's to modify.

        For an update, each row is written back after.
        """
        ...

    def peek(self, ids: Tensor) -> Tensor:
        """(M, *R) float32 rows of seen ids, for inspection (no side effects)."""
        ...

    def write(self, ids: Tensor, rows: Tensor, step: int) -> None:
        """Store rows (M, *R) float32 for unique ids; they count as seen."""
        ...

    def prefetch(self, ids: Tensor, step: int) -> None:
        """Hint: these ids will be read at `step` (never blocks, never changes values)."""
        ...

    @property
    def row_bytes(self) -> int:
        """Bytes of one row (0 before the first write)."""
        ...

    def close(self) -> None:
        """Release files and threads."""
        ...


class BufferFactory(Protocol):
    """Makes the buffer of one side of one link once its row shape is known."""

    def __call__(self, row_shape: tuple[int, ...]) -> ActivationBuffer:
        """A new, empty buffer for rows of `row_shape`."""
        ...


def _check_ids(ids: Tensor, limit: int | None) -> tuple[Tensor, list[int]]:
    """(int64 ids, the same ids as a list), checked.

    A message carries one micro-batch of examples (tens): plain Python on a list costs less
    than any array call there.
    """
    ids = ids.long()
    flat: list[int] = ids.reshape(-1).tolist()
    if flat:
        low, high = min(flat), max(flat)
        if low < 0:
            raise ValueError(f"example ids must be >= 0, got {low}")
        if limit is not None and high >= limit:
            raise ValueError(
                f"example id {high} is beyond this buffer's {limit} rows; size it with "
                "num_examples = the largest example id + 1"
            )
    return ids, flat


class _Seen:
    """Flags of ids that have a row (a bytearray grown on demand; ids come a few at a time)."""

    def __init__(self, capacity: int = 0) -> None:
        self.flags = bytearray(capacity)

    def get(self, flat: list[int], shape: torch.Size) -> Tensor:
        flags, size = self.flags, len(self.flags)
        seen = [i < size and flags[i] == 1 for i in flat]
        return torch.tensor(seen, dtype=torch.bool).reshape(shape)

    def set(self, flat: list[int]) -> None:
        need = max(flat) + 1 if flat else 0
        if need > len(self.flags):
            self.flags.extend(bytes(max(need, 2 * len(self.flags)) - len(self.flags)))
        for i in flat:
            self.flags[i] = 1

    def ids(self) -> Tensor:
        flags = np.frombuffer(bytes(self.flags), dtype=np.uint8)
        return torch.from_numpy(np.flatnonzero(flags).astype(np.int64))


class MemoryBuffer:
    """Rows in one (capacity, *R) float32 table, grown by doubling.

    The table lives on the device of the first rows written (RAM, or the GPU of the
    activations: AQ-SGD's buffers then never cross to the host); later rows are moved there.
    """

    def __init__(self, row_shape: tuple[int, ...]) -> None:
        self.row_shape = row_shape
        self.table = torch.zeros((0, *row_shape), dtype=torch.float32)
        self._seen = _Seen()

    @property
    def row_bytes(self) -> int:
        """4 x prod(R)."""
        return 4 * math.prod(self.row_shape)

    def seen(self, ids: Tensor) -> Tensor:
        """(M,) bool."""
        ids, flat = _check_ids(ids, None)
        return self._seen.get(flat, ids.shape)

    def seen_ids(self) -> Tensor:
        """Ids with a row."""
        return self._seen.ids()

    def read(self, ids: Tensor, step: int) -> Tensor:
        """Rows of seen ids (a copy, on the table's device)."""
        return self.table.index_select(0, _check_ids(ids, None)[0].to(self.table.device))

    def peek(self, ids: Tensor) -> Tensor:
        """Rows of seen ids (a copy, on the table's device)."""
        return self.table.index_select(0, _check_ids(ids, None)[0].to(self.table.device))

    def write(self, ids: Tensor, rows: Tensor, step: int) -> None:
        """Store rows (moved to the table's device); the table doubles when an id is beyond it."""
        ids, flat = _check_ids(ids, None)
        if self.table.shape[0] == 0 and rows.device != self.table.device:
            self.table = self.table.to(rows.device)  # the first rows decide where it lives
        need = max(flat) + 1 if flat else 0
        if need > self.table.shape[0] and need * self.row_bytes > physical_memory_bytes():
            raise ValueError(
                f"example id {need - 1} needs a {need * self.row_bytes / 2**30:,.1f} GiB table "
                f"(one {self.row_bytes}-byte row per id up to it), beyond this machine's RAM; "
                "number examples densely from 0, or keep the buffers on disk (memmap, store)"
            )
        if need > self.table.shape[0]:
            grown = torch.zeros(
                (max(need, 2 * self.table.shape[0]), *self.row_shape), device=self.table.device
            )
            grown[: self.table.shape[0]] = self.table
            self.table = grown
        device = self.table.device
        rows = rows.reshape(len(flat), *self.row_shape).to(device, torch.float32)
        self.table.index_copy_(0, ids.to(device), rows)
        self._seen.set(flat)

    def prefetch(self, ids: Tensor, step: int) -> None:
        """Nothing to do: every row is in RAM."""

    def close(self) -> None:
        """Nothing to release."""


class MemmapBuffer:
    """Rows in an [N, *R] float32 file mapped into memory (numpy.memmap).

    Args:
        path: The file (created, or overwritten).
        num_examples: N; ids must be in [0, N).
        row_shape: R.

    Raises:
        ValueError: If num_examples < 1.
        OSError: If the file cannot be created.
    """

    def __init__(self, path: str | Path, num_examples: int, row_shape: tuple[int, ...]) -> None:
        if num_examples < 1:
            raise ValueError(f"num_examples={num_examples} must be >= 1")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.row_shape = row_shape
        self.num_examples = num_examples
        self._array = np.memmap(
            self.path, dtype=np.float32, mode="w+", shape=(num_examples, *row_shape)
        )
        self.table = torch.from_numpy(self._array)  # shares the mapping: writes go to the file
        self._seen = _Seen(num_examples)

    @property
    def row_bytes(self) -> int:
        """4 x prod(R)."""
        return 4 * math.prod(self.row_shape)

    def seen(self, ids: Tensor) -> Tensor:
        """(M,) bool."""
        ids, flat = _check_ids(ids, self.num_examples)
        return self._seen.get(flat, ids.shape)

    def seen_ids(self) -> Tensor:
        """Ids with a row."""
        return self._seen.ids()

    def read(self, ids: Tensor, step: int) -> Tensor:
        """Rows of seen ids (a copy out of the mapping)."""
        return self.table.index_select(0, _check_ids(ids, self.num_examples)[0])

    def peek(self, ids: Tensor) -> Tensor:
        """Rows of seen ids (a copy)."""
        return self.table.index_select(0, _check_ids(ids, self.num_examples)[0])

    def write(self, ids: Tensor, rows: Tensor, step: int) -> None:
        """Store rows into the mapping (the OS writes them back to the file)."""
        ids, flat = _check_ids(ids, self.num_examples)
        self.table.index_copy_(0, ids, rows.reshape(len(flat), *self.row_shape).cpu())
        self._seen.set(flat)

    def prefetch(self, ids: Tensor, step: int) -> None:
        """Nothing to do: the OS pages rows in on access."""

    def close(self) -> None:
        """Flush the mapping to the file and drop it."""
        self._array.flush()
        del self.table
        del self._array
