"""Store backends come from a registry: a user's engine plugs in with one call."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from frugal.store import (
    BackendArgs,
    EmbeddingStore,
    OptimizerConfig,
    RowSpec,
    backend_names,
    register_backend,
)
from frugal.store.backends import BACKENDS, MemoryBackend

SPEC = RowSpec(embedding_dim=8, optimizer=OptimizerConfig(kind="adagrad", lr=0.1))


class CountingBackend(MemoryBackend):
    """The in-RAM engine, counting the rows it is asked to write (a user's engine)."""

    written_rows = 0

    def write_rows(self, ids, rows):  # type: ignore[no-untyped-def]
        CountingBackend.written_rows += len(ids)
        super().write_rows(ids, rows)


@pytest.fixture
def counting() -> Iterator[str]:
    opened: list[BackendArgs] = []

    def open_counting(args: BackendArgs) -> CountingBackend:
        opened.append(args)
        return CountingBackend(args.directory, args.num_rows, args.width, args.epoch)

    register_backend("counting", open_counting, reserved_memory_bytes=lambda a: 1 << 10)
    CountingBackend.written_rows = 0
    yield "counting"
    BACKENDS.unregister("counting")


def test_the_built_in_engines_are_registered() -> None:
    assert backend_names()[:4] == ("file", "rocksdb", "lmdb", "memory")


def test_a_registered_engine_stores_the_same_table_as_a_built_in(
    tmp_path: Path, counting: str
) -> None:
    ids = np.arange(0, 300, 3)
    grads = np.random.default_rng(0).standard_normal((len(ids), 8)).astype(np.float32)
    hashes = {}
    for backend in ("memory", counting):
        config = EmbeddingStore.Config(backend=backend, memory_budget_bytes=1 << 20)
        store = EmbeddingStore.create(tmp_path / backend, num_rows=1000, spec=SPEC, config=config)
        with store:
            store.apply_gradients(ids, grads, step=0)
            store.checkpoint()
        with EmbeddingStore.open(tmp_path / backend) as store:  # the MANIFEST names the engine
            assert store.backend_name == backend
            hashes[backend] = store.table_sha256()
    assert hashes["memory"] == hashes[counting]
    assert CountingBackend.written_rows >= len(ids)  # rows went through the user's engine


def test_an_unknown_engine_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match=r"backend='redis' is not a registered store backend; "
                       r"choose one of file, rocksdb, lmdb, memory"):  # fmt: skip
        EmbeddingStore.Config(backend="redis")
