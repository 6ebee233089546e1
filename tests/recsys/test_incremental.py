"""Incremental checkpoints (full + deltas), their retention and errors, exports and serving."""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from frugal.cli.main import main
from frugal.config import ConfigError, config_to_dict
from frugal.recsys.batch import KJTBatch
from frugal.recsys.checkpoint import (
    commit_checkpoint,
    export_shard_rows,
    export_tables,
    import_chain,
    import_shard_rows,
    read_chain,
    read_checkpoint,
)
from frugal.recsys.client import EmbeddingClient
from frugal.recsys.errors import RecsysError
from frugal.recsys.models import build_model
from frugal.recsys.ps import EmbeddingShard, default_owners
from frugal.recsys.serving import Snapshot
from frugal.recsys.transport import LocalTransport, ShardServer

TABLES = (50, 30)
# Row-wise Adagrad rows are 4 floats wide; a row unpushed for more than 4 steps expires and a
# full shard (32 rows, fewer than the ~45 ids a few steps bring) evicts its oldest rows.
CONFIG = EmbeddingShard.Config(embedding_dim=3, expire_after_steps=4, when_full="evict_lru")
COMPAT: dict[str, Any] = {
    "data": {"dataset": "toy"},
    "model": "mlp",
    "hidden": [4],
    "embedding_dim": 3,
    "embedding_optimizer": config_to_dict(CONFIG.optimizer),
    "seed": 0,
}


def _train(shard: EmbeddingShard, steps: range, seed: int = 0) -> None:
    """Push random gradients for a few random ids of each table at each step."""
    rng = np.random.default_rng(seed + steps.start)
    for step in steps:
        a, b = np.unique(rng.integers(0, 50, 6)), np.unique(rng.integers(0, 30, 4))
        ids = np.concatenate([a, b])
        grads = rng.standard_normal((len(ids), 3)).astype(np.float32)
        shard.push(
            torch.from_numpy(ids), torch.tensor([len(a), len(b)]), torch.from_numpy(grads),
            torch.zeros(len(ids), dtype=torch.int64), 1.0, step,
        )  # fmt: skip


RUN = "a1" * 16  # the run id the trainer records in every checkpoint of one training run


def _checkpoint(
    shard: EmbeddingShard, directory: Path, step: int, base: Path | None, **extra: Any
) -> Path:
    """What the trainer does with one shard: its file (all rows, or the changes), then seal."""
    tmp = directory / f"step-{step}.tmp"
    tmp.mkdir(parents=True)
    export_shard_rows(shard, tmp / "shard0.npz", incremental=base is not None)
    manifest = {"samples_done": step, "world_size": 1, "compat": COMPAT, "run_id": RUN, **extra}
    final = commit_checkpoint(directory, tmp, manifest, base=base)
    shard.clear_changes()
    return final


def _state(shards: list[EmbeddingShard], table: int) -> dict[int, tuple[Any, ...]]:
    """Map id -> (row with optimizer state, version, last push) over every shard."""
    state = {}
    for shard in shards:
        ids, versions, last_push = shard.row_clocks()[table]
        rows = shard.peek_table(table, ids, cols="all")
        for i, row, version, last in zip(ids, rows, versions, last_push, strict=True):
            state[int(i)] = (row.tolist(), int(version), int(last))
    return state


def _files(directory: Path) -> dict[str, str]:
    """Every file under `directory` with its sha256 (to show nothing changed)."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def chain(tmp_path: Path) -> tuple[Path, EmbeddingShard]:
    """A full checkpoint after 5 steps, deltas after 10 and 15; the shard after step 15."""
    shard = EmbeddingShard(tmp_path / "live", TABLES, CONFIG, capacity_rows=32)
    directory = tmp_path / "ckpt"
    _train(shard, range(5))
    full = _checkpoint(shard, directory, 5, None)
    _train(shard, range(5, 10))
    delta = _checkpoint(shard, directory, 10, full)
    _train(shard, range(10, 15))
    _checkpoint(shard, directory, 15, delta)
    return directory, shard


def test_a_chain_restores_exactly_what_a_full_checkpoint_of_the_same_state_does(
    tmp_path: Path, chain: tuple[Path, EmbeddingShard]
) -> None:
    directory, live = chain
    stats = live.stats()
    assert stats["expired_rows"] > 0 and stats["evicted_rows"] > 0  # rows were deleted
    reference = tmp_path / "full.npz"  # the same state, written in full
    export_shard_rows(live, reference)
    folders = read_chain(directory / "step-15")
    assert [f.name for f, _ in folders] == ["step-5", "step-10", "step-15"]
    assert [m["kind"] for _, m in folders] == ["full", "delta", "delta"]
    with np.load(directory / "step-5" / "shard0.npz") as base:
        base_ids = set(base["ids0"].tolist())
    deleted: set[int] = set()
    for name in ("step-10", "step-15"):
        with np.load(directory / name / "shard0.npz") as delta:
            assert len(delta["ids0"]) < stats["live_rows"]  # only the changed rows
            deleted |= set(delta["deleted0"].tolist())
    want = [_state([live], t) for t in range(2)]
    # ids the base holds, deltas deleted and the end state lacks: replaying the rows alone
    # would bring them back
    assert (base_ids - set(want[0])) & deleted
    for count in (1, 2, 3):
        restored = [
            EmbeddingShard(tmp_path / f"r{count}-{p}", TABLES, CONFIG, capacity_rows=32)
            for p in range(count)
        ]
        full = [
            EmbeddingShard(tmp_path / f"f{count}-{p}", TABLES, CONFIG, capacity_rows=32)
            for p in range(count)
        ]
        for p in range(count):
            import_chain(restored[p], default_owners(count), p, folders)
            import_shard_rows(full[p], default_owners(count), p, [reference])
        for t in range(2):
            got = _state(restored, t)
            assert got == _state(full, t) == want[t]  # rows, versions, last pushes; bit for bit
        # a restored shard's next delta builds on the chain: nothing is pending
        assert all(
            len(ids) == 0 for shard in restored for ids, _, _ in shard.row_clocks(changed_only=True)
        )
        assert all(len(d) == 0 for shard in restored for d in shard.deleted_ids())
        for shard in restored + full:
            shard.close()
    live.close()


def test_retention_keeps_the_chains_of_the_two_newest_checkpoints(tmp_path: Path) -> None:
    def commit(step: int, base: int | None) -> set[str]:
        tmp = tmp_path / f"step-{step}.tmp"
        tmp.mkdir()
        (tmp / "dense.pt").write_bytes(str(step).encode())
        commit_checkpoint(
            tmp_path, tmp, {"samples_done": step},
            base=None if base is None else tmp_path / f"step-{base}",
        )  # fmt: skip
        return {p.name for p in tmp_path.glob("step-*")}

    assert commit(1, None) == {"step-1"}
    assert commit(2, 1) == {"step-1", "step-2"}
    assert commit(3, 2) == {"step-1", "step-2", "step-3"}
    # a new full one: the previous LATEST (step-3) stays with its whole chain
    assert commit(4, None) == {"step-1", "step-2", "step-3", "step-4"}
    # a delta on step-4: step-3's chain is two checkpoints old now
    assert commit(5, 4) == {"step-4", "step-5"}
    manifest = read_checkpoint(tmp_path / "step-5")
    assert manifest["format_version"] == 2 and manifest["chain"] == ["step-4"]
    assert commit(6, None) == {"step-4", "step-5", "step-6"}
    assert commit(7, None) == {"step-6", "step-7"}  # full only: format 1's "keep two"
    assert commit(8, 7) == {"step-7", "step-8"}
    # step-8 again (a finished job resumed: nothing trained since), full: its base stays
    assert commit(8, None) == {"step-7", "step-8"}
    with pytest.raises(ValueError, match="another checkpoint"):
        commit_checkpoint(tmp_path, tmp_path / "x.tmp", {}, base=tmp_path / "x")


def test_a_missing_or_altered_base_is_a_clear_error_and_nothing_is_lost(
    tmp_path: Path, chain: tuple[Path, EmbeddingShard]
) -> None:
    directory, live = chain
    live.close()
    out = tmp_path / "tables.npz"
    out.write_bytes(b"an earlier export")
    before = _files(directory)
    moved = tmp_path / "moved"
    shutil.move(directory / "step-5", moved)
    with pytest.raises(RecsysError, match=r"on top of .*step-5, which is missing.*restore step-5"):
        read_chain(directory / "step-15")
    with pytest.raises(RecsysError, match="which is missing"):
        export_tables(directory, out)
    with pytest.raises(RecsysError, match="which is missing"):
        Snapshot.open(directory)
    assert out.read_bytes() == b"an earlier export"  # not overwritten by the failed export
    assert not (tmp_path / "tables.npz.part").exists()
    # step-5 comes back rewritten (valid, every file intact): its sha256 is not the recorded one
    shutil.move(moved, directory / "step-5")
    manifest = json.loads((directory / "step-5" / "MANIFEST.json").read_text())
    recorded = json.loads((directory / "step-10" / "MANIFEST.json").read_text())["base"]
    (directory / "step-5" / "MANIFEST.json").write_text(json.dumps(manifest | {"note": 1}))
    with pytest.raises(RecsysError, match=recorded["manifest_sha256"]) as error:
        read_chain(directory / "step-15")
    assert "replaced or altered" in str(error.value)
    assert main(["recsys", "export", str(directory), "--out", str(out), "--overwrite"]) == 1
    assert out.read_bytes() == b"an earlier export"
    after = _files(directory)
    assert after.pop("step-5/MANIFEST.json") != before.pop("step-5/MANIFEST.json")
    assert after == before  # every other file as it was: nothing saved was lost


def test_exports_materialise_the_chain_and_write_the_changes_since_a_step(
    tmp_path: Path, chain: tuple[Path, EmbeddingShard]
) -> None:
    directory, live = chain
    full5, full15, changes = tmp_path / "5.npz", tmp_path / "15.npz", tmp_path / "changes.npz"
    export_tables(directory / "step-5", full5)
    counts = export_tables(directory, full15)
    assert main(["recsys", "export", str(directory), "--out", str(changes),
                 "--incremental-since", str(directory / "step-5")]) == 0  # fmt: skip
    with np.load(full5) as old, np.load(full15) as new, np.load(changes) as delta:
        assert json.loads(delta["meta"].item())["kind"] == "incremental"
        for t in range(2):
            ids, _, _ = live.row_clocks()[t]
            assert counts[f"table{t}"] == len(ids)
            np.testing.assert_array_equal(new[f"ids{t}"], ids)
            np.testing.assert_array_equal(new[f"vectors{t}"], live.peek_table(t, ids))
            # step-5's rows, less the deleted and changed ids, plus the changes = step-15's
            stay = ~np.isin(
                old[f"ids{t}"], np.concatenate([delta[f"deleted{t}"], delta[f"ids{t}"]])
            )
            ids_after = np.concatenate([old[f"ids{t}"][stay], delta[f"ids{t}"]])
            vectors_after = np.concatenate([old[f"vectors{t}"][stay], delta[f"vectors{t}"]])
            order = np.argsort(ids_after)
            np.testing.assert_array_equal(ids_after[order], new[f"ids{t}"])
            np.testing.assert_array_equal(vectors_after[order], new[f"vectors{t}"])
            assert not np.isin(delta[f"deleted{t}"], new[f"ids{t}"]).any()
        assert len(delta["deleted0"]) > 0
    with pytest.raises(ConfigError, match=r"not an earlier checkpoint of the chain of"):
        export_tables(directory, tmp_path / "x.npz", since=tmp_path / "step-5")
    live.close()


@pytest.mark.parametrize("since", ["elsewhere/step-5", "ckpt/step-7", "ckpt", "ckpt/step-15"])
def test_an_incremental_export_since_a_folder_off_the_chain_exits_2_naming_the_valid_ones(
    tmp_path: Path,
    chain: tuple[Path, EmbeddingShard],
    capsys: pytest.CaptureFixture[str],
    since: str,
) -> None:
    directory, live = chain
    live.close()
    (tmp_path / "elsewhere" / "step-5").mkdir(parents=True)  # the right name, another folder
    out = tmp_path / "x.npz"
    args = ["recsys", "export", str(directory / "step-10"), "--out", str(out)]
    assert main([*args, "--incremental-since", str(tmp_path / since)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--incremental-since {tmp_path / since}" in err[0]
    assert "is not an earlier checkpoint" in err[0]
    # step-10's chain is step-5 (full) -> step-10: only step-5 is an earlier checkpoint of it
    assert f"give one of {directory / 'step-5'} (the changes since it)" in err[0]
    assert "step-15" not in err[0].split("give one of")[1]
    assert not out.exists()
    # a full checkpoint has no earlier checkpoint in its chain
    args = ["recsys", "export", str(directory / "step-5"), "--out", str(out)]
    assert main([*args, "--incremental-since", str(directory / "step-10")]) == 2
    assert "step-5 is a full checkpoint, the first of its chain" in capsys.readouterr().err
    # the checkpoint itself: no changes since itself (it wrote an empty export before)
    args = ["recsys", "export", str(directory / "step-10"), "--out", str(out)]
    assert main([*args, "--incremental-since", str(tmp_path / "nowhere")]) == 2
    assert "nowhere does not exist, so it is not an earlier" in capsys.readouterr().err
    assert main([*args, "--incremental-since", str(directory / "step-10")]) == 2
    err_text = capsys.readouterr().err
    assert "is the checkpoint being exported" in err_text and str(directory / "step-5") in err_text
    assert not out.exists()


def test_a_format_1_checkpoint_reads_as_a_full_one_and_a_newer_format_is_refused(
    tmp_path: Path, chain: tuple[Path, EmbeddingShard]
) -> None:
    directory, live = chain
    live.close()
    folder = directory / "step-5"
    manifest = json.loads((folder / "MANIFEST.json").read_text())
    for key in ("kind", "base", "chain"):
        del manifest[key]
    (folder / "MANIFEST.json").write_text(json.dumps(manifest | {"format_version": 1}))
    assert [f.name for f, _ in read_chain(folder)] == ["step-5"]
    assert export_tables(folder, tmp_path / "t.npz")["table0"] > 0
    (folder / "MANIFEST.json").write_text(json.dumps(manifest | {"format_version": 3}))
    with pytest.raises(RecsysError, match=r"format_version=3.*upgrade frugal"):
        read_chain(folder)
    # a job resumed from a format-1 checkpoint writes its first delta on top of it
    old = tmp_path / "old"
    shard = EmbeddingShard(tmp_path / "s", TABLES, CONFIG, capacity_rows=32)
    _train(shard, range(3))
    first = _checkpoint(shard, old, 3, None)
    written = json.loads((first / "MANIFEST.json").read_text())
    version_1 = {k: v for k, v in written.items() if k not in ("kind", "base", "chain")}
    (first / "MANIFEST.json").write_text(json.dumps(version_1 | {"format_version": 1}))
    _train(shard, range(3, 9))
    _checkpoint(shard, old, 9, first)
    assert [m.get("kind") for _, m in read_chain(old / "step-9")] == [None, "delta"]
    restored = EmbeddingShard(tmp_path / "r", TABLES, CONFIG, capacity_rows=32)
    import_chain(restored, default_owners(1), 0, read_chain(old / "step-9"))
    assert _state([restored], 0) == _state([shard], 0)
    restored.close()
    shard.close()


def test_a_snapshot_serves_the_chain_and_refuses_another_models_tables(
    tmp_path: Path, chain: tuple[Path, EmbeddingShard]
) -> None:
    directory, live = chain
    ids = np.arange(60, dtype=np.int64)  # every trained id, untrained and deleted ones, and more
    snapshot = Snapshot.open(directory)
    assert snapshot.source.endswith("step-15") and snapshot.num_tables == 2
    for t in range(2):  # the PS's own reads: trained rows, else the seeded initial values
        np.testing.assert_array_equal(snapshot.lookup(t, ids), live.peek_table(t, ids))
    export_tables(directory, tmp_path / "tables.npz")
    exported = Snapshot.open(tmp_path / "tables.npz")
    np.testing.assert_array_equal(exported.lookup(0, ids), snapshot.lookup(0, ids))
    # mapped from disk (tables larger than RAM): the same answers, nothing read up front
    mapped = Snapshot.open(tmp_path / "tables.npz", mmap=True)
    assert mapped.memory_mapped and not exported.memory_mapped
    for t in range(2):
        np.testing.assert_array_equal(mapped.lookup(t, ids), snapshot.lookup(t, ids))
    with pytest.raises(ConfigError, match="mmap=True maps an export file"):
        Snapshot.open(directory, mmap=True)
    packed = tmp_path / "packed.npz"  # a compressed copy cannot be mapped
    with (
        zipfile.ZipFile(tmp_path / "tables.npz") as source,
        zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as target,
    ):
        for name in source.namelist():
            target.writestr(name, source.read(name))
    with pytest.raises(RecsysError, match="ids0 is compressed, so it cannot be memory-mapped"):
        Snapshot.open(packed, mmap=True)
    np.testing.assert_array_equal(Snapshot.open(packed).lookup(1, ids), snapshot.lookup(1, ids))
    with pytest.raises(RecsysError, match="dense=CHECKPOINT"):
        exported.predict(_batch())
    with pytest.raises(ValueError, match=r"table=2, but .* has 2 tables"):
        snapshot.lookup(2, ids)
    # the dense model of a model with wider embeddings cannot use these tables
    other = tmp_path / "other"
    wide = COMPAT | {"embedding_dim": 5}
    tmp = other / "step-1.tmp"
    tmp.mkdir(parents=True)
    (tmp / "shard0.npz").write_bytes((directory / "step-5" / "shard0.npz").read_bytes())
    torch.save({"model": {}}, tmp / "dense.pt")
    commit_checkpoint(other, tmp, {"world_size": 1, "compat": wide, "features": ["a", "b"],
                                   "dense_dim": 2})  # fmt: skip
    with pytest.raises(
        RecsysError, match=r"embedding_dim=3, the dense model of .* embedding_dim=5"
    ):
        Snapshot.open(tmp_path / "tables.npz", dense=other)
    # the same settings trained again: another run, whose dense model these tables never met
    rerun = tmp_path / "rerun"
    tmp = rerun / "step-15.tmp"
    tmp.mkdir(parents=True)
    (tmp / "shard0.npz").write_bytes((directory / "step-5" / "shard0.npz").read_bytes())
    torch.save({"model": {}}, tmp / "dense.pt")
    commit_checkpoint(rerun, tmp, {"world_size": 1, "compat": COMPAT, "features": ["a", "b"],
                                   "dense_dim": 2, "run_id": "b2" * 16})  # fmt: skip
    with np.load(tmp_path / "tables.npz") as export:
        assert json.loads(export["meta"].item())["run_id"] == RUN  # the export names its run
    with pytest.raises(RecsysError, match=r"from training run a1a1a1a1a1a1, the dense model .* "
                       r"from run b2b2b2b2b2b2"):  # fmt: skip
        Snapshot.open(tmp_path / "tables.npz", dense=rerun)
    export_tables(directory, tmp_path / "changes.npz", since=directory / "step-10")
    with pytest.raises(RecsysError, match="incremental export"):
        Snapshot.open(tmp_path / "changes.npz")
    live.close()


def _batch() -> KJTBatch:
    # feature a: bags [3, 3, 7], [], [49]; feature b: bags [3], [5, 29], [0]
    return KJTBatch(
        keys=("a", "b"),
        values=np.array([3, 3, 7, 49, 3, 5, 29, 0], np.int64),
        lengths=np.array([3, 0, 1, 1, 2, 1], np.int32),
        dense=np.array([[0.5, -1.0], [0.0, 2.0], [1.0, 1.0]], np.float32),
        labels=np.zeros(3, np.float32),
        batch_id=0,
    )


def test_predict_equals_the_trainers_evaluation_path_on_the_live_shard(
    tmp_path: Path, chain: tuple[Path, EmbeddingShard]
) -> None:
    directory, live = chain
    torch.manual_seed(0)
    model = build_model("mlp", 2, 3, 2, (4,))
    torch.save({"model": model.state_dict(), "optimizer": {}}, tmp_path / "dense.pt")
    config = {"wire_dtype": "float16"}
    tmp = directory / "step-20.tmp"
    tmp.mkdir()
    shutil.copy(tmp_path / "dense.pt", tmp / "dense.pt")
    export_shard_rows(live, tmp / "shard0.npz", incremental=True)
    commit_checkpoint(
        directory, tmp,
        {"world_size": 1, "compat": COMPAT, "features": ["a", "b"], "dense_dim": 2,
         "config": config},
        base=directory / "step-15",
    )  # fmt: skip
    snapshot = Snapshot.open(directory)
    # the trainer's evaluation: fp16 rows from the shard, pooled by the client, then the model
    transport = LocalTransport([ShardServer(live, None, 0.0)], timeout_s=5)
    client = EmbeddingClient(transport, default_owners(1), 2, 3, "float16")
    batch = _batch()
    model.eval()
    with torch.no_grad():
        pooled = client.pool(client.wait(client.lookup(batch)))
        want = torch.sigmoid(model(pooled, torch.from_numpy(batch.dense))).numpy()
    transport.close()
    np.testing.assert_array_equal(snapshot.predict(batch), want)
    with pytest.raises(ValueError, match=r"features \['b', 'a'\], the model \['a', 'b'\]"):
        snapshot.predict(
            KJTBatch(("b", "a"), batch.values, batch.lengths, batch.dense, batch.labels, 0)
        )
    with pytest.raises(ValueError, match=r"takes \(B, 2\)"):
        snapshot.predict(
            KJTBatch(batch.keys, batch.values, batch.lengths, batch.dense[:, :1], batch.labels, 0)
        )
    empty = KJTBatch(
        batch.keys,
        batch.values[:0],
        batch.lengths[:0],
        batch.dense[:0],
        batch.labels[:0],
        0,
    )
    assert snapshot.predict(empty).shape == (0,)  # no samples: no probabilities
    live.close()


def test_a_snapshot_opening_while_training_prunes_its_chain_starts_over(
    tmp_path: Path, chain: tuple[Path, EmbeddingShard], monkeypatch: pytest.MonkeyPatch
) -> None:
    import frugal.recsys.serving as serving

    directory, live = chain
    replay = serving.replay_table
    meanwhile: list[Any] = []  # what happens before the first table is read
    calls = []

    def replay_while_training(*args: Any) -> Any:
        while meanwhile:
            meanwhile.pop(0)()
        calls.append(args)
        return replay(*args)

    def newer_full_checkpoint_prunes_the_chain() -> None:
        _train(live, range(15, 18))
        _checkpoint(live, directory, 18, None)
        for name in ("step-5", "step-10", "step-15"):  # as two more commits would
            shutil.rmtree(directory / name)

    monkeypatch.setattr(serving, "replay_table", replay_while_training)
    meanwhile.append(newer_full_checkpoint_prunes_the_chain)
    snapshot = Snapshot.open(directory)
    assert snapshot.samples_done == 18 and len(calls) == 3  # 1 failed table read + 2 tables
    ids = np.arange(60, dtype=np.int64)
    np.testing.assert_array_equal(snapshot.lookup(1, ids), live.peek_table(1, ids))
    # a step folder given by name and deleted meanwhile: the error says what to open
    _train(live, range(18, 20))
    _checkpoint(live, directory, 20, directory / "step-18")
    meanwhile.append(lambda: shutil.rmtree(directory / "step-20"))
    with pytest.raises(RecsysError, match=r"step-20 was deleted while it was being read"):
        Snapshot.open(directory / "step-20")
    with pytest.raises(ConfigError, match="does not exist"):
        Snapshot.open(tmp_path / "nothing")
    live.close()


def test_a_snapshot_of_a_raw_id_model_hashes_ids_and_refuses_non_integers() -> None:
    from frugal.config import config_to_dict
    from frugal.recsys.ps import hash_raw_ids
    from frugal.recsys.serving import Snapshot, _Tables
    from frugal.store import OptimizerConfig

    raw = np.array([-5, 2**62 + 1], dtype=np.int64)
    hashed = np.sort(hash_raw_ids(raw))
    compat = {
        "embedding_dim": 2, "seed": 0,
        "embedding_optimizer": config_to_dict(OptimizerConfig(kind="sgd", lr=0.1)),
    }  # fmt: skip
    vectors = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    info = {"compat": compat, "raw_ids": True}
    snapshot = Snapshot(_Tables([hashed], [vectors], info, "mem"), None, {})
    got = snapshot.lookup(0, raw)
    want = vectors[np.searchsorted(hashed, hash_raw_ids(raw))]
    np.testing.assert_array_equal(got, want)  # the trained rows, found by hashed id
    with pytest.raises(ValueError, match="ids must be a 1-d list or array of integers"):
        snapshot.lookup(0, [1.7])


def test_an_export_streams_its_vectors_in_chunks_across_the_chains_files(
    tmp_path: Path, chain: tuple[Path, EmbeddingShard], monkeypatch: pytest.MonkeyPatch
) -> None:
    import frugal.recsys.checkpoint as checkpoint

    # 7-row chunks: each chunk gathers rows from several shard files of the chain's
    # checkpoints (full and deltas), read through memory maps, never a whole table
    monkeypatch.setattr(checkpoint, "CHUNK_ROWS", 7)
    directory, live = chain
    counts = export_tables(directory, tmp_path / "tables.npz")
    ids = np.arange(60, dtype=np.int64)
    mapped = Snapshot.open(tmp_path / "tables.npz", mmap=True)
    for t in range(2):
        assert counts[f"table{t}"] > 7
        np.testing.assert_array_equal(mapped.lookup(t, ids), live.peek_table(t, ids))
    live.close()
