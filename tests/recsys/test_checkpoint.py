"""Checkpoint files: shard rows survive export/import onto 1, 2 or 3 shards; manifest checks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from frugal.recsys.batch import KJTBatch
from frugal.recsys.checkpoint import (
    commit_checkpoint,
    export_shard_rows,
    export_tables,
    import_shard_rows,
    read_latest,
)
from frugal.recsys.client import EmbeddingClient
from frugal.recsys.errors import RecsysError
from frugal.recsys.ps import EmbeddingShard, default_owners, virtual_shard
from frugal.recsys.transport import LocalTransport, ShardServer

TABLES = (50, 30)
CONFIG = EmbeddingShard.Config(embedding_dim=3)  # row-wise Adagrad: rows are 4 floats wide


def _shards(root: Path, count: int) -> list[EmbeddingShard]:
    return [EmbeddingShard(root / f"s{p}", TABLES, CONFIG) for p in range(count)]


def _table(shards: list[EmbeddingShard], table: int) -> tuple[np.ndarray, np.ndarray]:
    """Whole table (vector + optimizer state) and versions, gathered from its owners."""
    owners = default_owners(len(shards))
    ids = np.arange(TABLES[table], dtype=np.int64)
    owner = owners[virtual_shard(table, ids)]
    rows = np.empty((len(ids), 4), np.float32)
    versions = np.empty(len(ids), np.int64)
    for p, shard in enumerate(shards):
        mine = ids[owner == p]
        rows[mine] = shard.peek_table(table, mine, cols="all")
        versions[mine] = shard.row_versions(table, mine)
    return rows, versions


def test_rows_reload_onto_another_shard_count(tmp_path: Path) -> None:
    old = _shards(tmp_path / "old", 2)
    transport = LocalTransport([ShardServer(s, None, 0.0) for s in old], timeout_s=5)
    client = EmbeddingClient(transport, default_owners(2), 2, 3, "float32")
    rng = np.random.default_rng(0)
    for step in range(5):  # train a few steps so rows, Adagrad state and versions move
        values = np.concatenate([rng.integers(0, 20, 8), rng.integers(0, 30, 8)]).astype(np.int64)
        batch = KJTBatch(("a", "b"), values, np.ones(16, np.int32), np.zeros((8, 0), np.float32),
                         np.zeros(8, np.float32), step)  # fmt: skip
        result = client.wait(client.lookup(batch))
        client.pool(result).sum().backward()
        for handle in client.push(result, step, world_size=1):
            handle.wait()
    transport.close()
    sealed = tmp_path / "ckpt" / "step-80.tmp"
    sealed.mkdir(parents=True)
    files = []
    for p, shard in enumerate(old):
        files.append(sealed / f"shard{p}.npz")
        export_shard_rows(shard, files[-1])
    want = [_table(old, t) for t in range(2)]
    assert want[0][1].sum() > 0 and (want[0][1][20:] == 0).all()  # rows 20.. never touched
    for count in (1, 3):
        new = _shards(tmp_path / f"new{count}", count)
        loaded = sum(
            import_shard_rows(shard, default_owners(count), p, files) for p, shard in enumerate(new)
        )
        assert loaded == sum(int((v > 0).sum()) for _, v in want)
        for t in range(2):
            rows, versions = _table(new, t)
            np.testing.assert_array_equal(rows, want[t][0])  # bit-identical, untouched included
            np.testing.assert_array_equal(versions, want[t][1])
        for shard in new:
            shard.close()
    for shard in old:
        shard.close()
    # the shard-free export: every trained row's vector, by table, ids sorted
    final = commit_checkpoint(
        tmp_path / "ckpt", sealed, {"world_size": 2, "compat": {"embedding_dim": 3}}
    )
    assert final.name == "step-80"
    counts = export_tables(tmp_path / "ckpt", tmp_path / "tables.npz")
    with np.load(tmp_path / "tables.npz") as exported:
        for t in range(2):
            trained = np.flatnonzero(want[t][1] > 0)
            assert counts[f"table{t}"] == len(trained)
            np.testing.assert_array_equal(exported[f"ids{t}"], trained)
            np.testing.assert_array_equal(exported[f"vectors{t}"], want[t][0][trained, :3])


def test_commit_seals_keeps_two_and_detects_corruption(tmp_path: Path) -> None:
    for samples in (100, 200, 300):
        tmp = tmp_path / f"step-{samples}.tmp"
        tmp.mkdir()
        (tmp / "dense.pt").write_bytes(str(samples).encode())
        commit_checkpoint(tmp_path, tmp, {"samples_done": samples})
    crashed = tmp_path / "step-400.tmp"  # a crash mid-checkpoint: no manifest, ignored
    crashed.mkdir()
    found = read_latest(tmp_path)
    assert found is not None
    folder, manifest = found
    assert folder.name == "step-300" and manifest["samples_done"] == 300
    assert sorted(p.name for p in tmp_path.glob("step-*")) == [
        "step-200",
        "step-300",
        "step-400.tmp",
    ]
    (folder / "dense.pt").write_bytes(b"flipped")
    with pytest.raises(RecsysError, match="sha256 mismatch"):
        read_latest(tmp_path)
    (folder / "dense.pt").unlink()
    with pytest.raises(RecsysError, match=r"dense.pt is missing: .*MANIFEST.json lists it"):
        read_latest(tmp_path)
    assert read_latest(tmp_path / "nothing-here") is None
    assert (
        json.loads((folder / "MANIFEST.json").read_text())["format"] == "frugal-recsys-checkpoint"
    )


def test_a_checkpoint_too_large_for_the_new_capacity_names_the_rows_it_needs(
    tmp_path: Path,
) -> None:
    from frugal.recsys.shard_files import write_shard_file

    config = EmbeddingShard.Config(embedding_dim=2)
    full = EmbeddingShard(tmp_path / "full", (1000,), config)
    try:
        ids = torch.arange(300)
        full.push(
            ids,
            torch.tensor([300]),
            torch.ones(300, 2),
            torch.zeros(300, dtype=torch.int64),
            1.0,
            0,
        )
        path = tmp_path / "shard0.npz"
        write_shard_file(full, path, full.row_clocks())
    finally:
        full.close()
    small = EmbeddingShard(tmp_path / "small", (1000,), config, capacity_rows=100)
    try:
        with pytest.raises(RecsysError, match=r"gives PS shard 0 of 1 at least 300 rows, more "
                           r"than the 100 it can hold.*ps_capacity_rows >= 300"):  # fmt: skip
            import_shard_rows(small, default_owners(1), 0, [path])
    finally:
        small.close()
    fits = EmbeddingShard(tmp_path / "fits", (1000,), config, capacity_rows=300)
    try:
        assert import_shard_rows(fits, default_owners(1), 0, [path]) == 300  # the named value
    finally:
        fits.close()
