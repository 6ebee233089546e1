"""AQ-SGD buffer backends are a registry: a user's backend plugs in, unknown names list them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from frugal.comm.buffers import ActivationBuffer, MemmapBuffer, MemoryBuffer
from frugal.pipeline.buffers import (
    BUFFER_BACKENDS,
    BufferSet,
    StoreBuffer,
    register_buffer_backend,
)
from frugal.pipeline.train import PipelineTrainConfig


class CountingBuffer(MemoryBuffer):
    """RAM rows that count their writes (what a user's backend might add)."""

    def __init__(self, row_shape: tuple[int, ...]) -> None:
        super().__init__(row_shape)
        self.num_writes = 0

    def write(self, ids: torch.Tensor, rows: torch.Tensor, step: int) -> None:
        self.num_writes += 1
        super().write(ids, rows, step)


def _counting(buffers: BufferSet, name: str, row_shape: tuple[int, ...]) -> ActivationBuffer:
    return CountingBuffer(row_shape)


@pytest.fixture
def counting() -> Iterator[str]:
    register_buffer_backend("counting", _counting, uses_directory=False)
    try:
        yield "counting"
    finally:
        BUFFER_BACKENDS.unregister("counting")


def test_the_built_in_backends_and_their_buffers(tmp_path: Path) -> None:
    assert BUFFER_BACKENDS.names() == ("memory", "memmap", "store")
    kinds = {"memory": MemoryBuffer, "memmap": MemmapBuffer, "store": StoreBuffer}
    for name, kind in kinds.items():
        buffers = BufferSet(name, 8, str(tmp_path / name))
        try:
            assert (buffers.directory is None) == (name == "memory")
            assert type(buffers.factory("link0-1.send")((2, 3))) is kind
        finally:
            buffers.close()
    assert not (tmp_path / "memory").exists()  # a RAM backend makes no folder


def test_a_registered_backend_is_used_and_configurable(counting: str) -> None:
    buffers = BufferSet(counting, 8)
    buffer = buffers.factory("link0-1.send")((2,))
    assert isinstance(buffer, CountingBuffer) and buffers.buffers == [buffer]
    buffer.write(torch.tensor([3]), torch.ones(1, 2), 0)
    assert buffer.num_writes == 1 and torch.equal(buffer.peek(torch.tensor([3])), torch.ones(1, 2))
    buffers.close()
    assert PipelineTrainConfig(buffer_backend=counting).buffer_backend == counting
    with pytest.raises(RuntimeError, match="has no folder"):
        buffers.folder()


def test_an_unknown_backend_lists_every_registered_one() -> None:
    message = (
        "buffer_backend='disk' is not a registered buffer backend; choose one of memory, "
        "memmap, store"
    )
    with pytest.raises(ValueError, match=message):
        BufferSet("disk", 8)
    with pytest.raises(ValueError, match=message):
        PipelineTrainConfig(buffer_backend="disk")
