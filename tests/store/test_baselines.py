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


@pytest.mark.parametrize("mlkv", [False, True])
def test_the_hybrid_log_compacts_its_disk_part_and_keeps_every_row(
    tmp_path: Path, mlkv: bool
) -> None:
    # 2,000 rows (Adam D=4: 52 B, records padded to 512 B), a 256-record memory ring,
    # compaction steps of 64 records: 120 steps of updates on ~120 random rows write ~14,000
    # records; compaction keeps the disk part within 1.5 x 2,000 + 64 records, and every
    # row ends equal to the in-RAM table's.
    from frugal.store import baselines
    from frugal.store.baselines import HybridLogTable

    rng = np.random.default_rng(0)
    ram = RamTable(2000, SPEC, 0)
    budget = 8 * 2000 + 256 * (SPEC.row_bytes + 8)
    log = HybridLogTable(tmp_path, 2000, SPEC, 0, memory_budget_bytes=budget, mlkv=mlkv)
    log.compaction_records = 64
    try:
        for step in range(120):
            ids = np.unique(rng.integers(0, 2000, 120)).astype(np.int64)
            grads = rng.standard_normal((len(ids), 4)).astype(np.float32)
            for table in (ram, log):
                if mlkv and table is log:
                    log.lookahead(ids, step)
                table.get(ids, step)
                table.apply_gradients(ids, grads, step)
            assert log.head - log.begin <= 1.5 * log.live_rows + 64
        assert log.compacted_records > 0 and log.begin > 0
        assert log.table_sha256() == ram.table_sha256()
        # The freed range takes no disk blocks any more (where hole punching works).
        if baselines._punch_hole(log.fd, 0, 512):
            blocks = (tmp_path / "hlog.dat").stat().st_blocks * 512
            assert blocks <= (log.head - log.begin + 256) * log.stride + 4096
    finally:
        log.close()
