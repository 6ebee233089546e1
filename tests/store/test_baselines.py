"""The KV-offload baseline opens its engine from a registry; every engine ends bit-identical."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from frugal.store import OptimizerConfig, RowSpec
from frugal.store.baselines import (
    KV_ENGINES,
    KvEngineArgs,
    KvOffloadTable,
    RamTable,
    register_kv_engine,
)

SPEC = RowSpec(embedding_dim=4, optimizer=OptimizerConfig(kind="adam", lr=1e-2))


class DictEngine:
    """A user's engine: a Python dict (what a KV store does, without the disk)."""

    def __init__(self, args: KvEngineArgs) -> None:
        self.values: dict[bytes, bytes] = {}
        self.row_bytes = args.row_bytes

    def get(self, keys: list[bytes]) -> list[bytes | None]:
        return [self.values.get(k) for k in keys]

    def put(self, items: list[tuple[bytes, bytes]]) -> None:
        assert all(len(v) == self.row_bytes for _, v in items)
        self.values.update(items)

    def close(self) -> None:
        self.values.clear()


@pytest.fixture
def dict_engine() -> Iterator[str]:
    register_kv_engine("dict", DictEngine)
    yield "dict"
    KV_ENGINES.unregister("dict")


def _train(table: KvOffloadTable | RamTable) -> str:
    rng = np.random.default_rng(0)
    for step in range(5):
        ids = np.unique(rng.integers(0, 100, 32)).astype(np.int64)
        table.get(ids, step)
        table.apply_gradients(ids, rng.standard_normal((len(ids), 4)).astype(np.float32), step)
    sha = table.table_sha256()
    table.close()
    return sha


@pytest.mark.parametrize("engine", ["dict", "lmdb", "rocksdb"])
def test_every_engine_ends_with_the_ram_table(
    tmp_path: Path, dict_engine: str, engine: str
) -> None:
    table = KvOffloadTable(tmp_path, 100, SPEC, 3, engine=engine, memory_budget_bytes=1 << 22)
    assert _train(table) == _train(RamTable(100, SPEC, 3))


def test_an_unknown_engine_is_refused_with_the_choices(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"engine='faster' .* choose one of rocksdb, lmdb"):
        KvOffloadTable(tmp_path, 10, SPEC, 0, engine="faster", memory_budget_bytes=1 << 20)
