"""A disk that fills up: one clear line naming the path and the space, the last good state intact.

Each test runs a real command with its output (or checkpoints) on a small tmpfs, so the disk
really fills (ENOSPC from the kernel, not a mock). It checks the exit code, that stderr ends
in one `frugal:` line naming the full disk and the space needed, with no traceback, that
nothing half-written is left, then grows the disk and runs the command again: the result
equals an uninterrupted run's. Mounting a tmpfs needs root (CAP_SYS_ADMIN); elsewhere the
tests are skipped.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from frugal.recsys.checkpoint import read_latest
from tests.faults._harness import frugal, full_tier, record, run
from tests.faults.test_kill_resume import (
    _bench_rows,
    _recsys_result,
    _reproduce_rows,
    _store,
    _store_rows,
    _tgraph,
)

pytestmark = [pytest.mark.faults, pytest.mark.timeout(900)]


class SmallDisk:
    """A tmpfs of a given size mounted at `path`, which `resize` grows or shrinks."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def mount(self, size: str) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(self.path)],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")

    def resize(self, size: str) -> None:
        subprocess.run(
            ["mount", "-o", f"remount,size={size}", str(self.path)], check=True, timeout=30
        )

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True, timeout=30)


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    small = SmallDisk(tmp_path / "small-disk")
    try:
        yield small
    finally:
        small.unmount()


def _one_line(stderr: str, *needles: str) -> str:
    """The last stderr line: a `frugal:` line holding every needle, and no traceback."""
    assert "Traceback" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("frugal: "), last
    for needle in needles:
        assert needle in last, f"{needle!r} not in {last!r}"
    return last


def _no_temporaries(folder: Path) -> None:
    left = [p for p in folder.rglob("*") if ".tmp" in p.name or p.name.endswith(".part")]
    assert left == [], f"half-written files left after the full disk: {left}"


def _recsys(out: Path, checkpoints: Path) -> list[str]:
    return frugal(
        "recsys", "train", "--mode", "sync", "--nproc", "2", "--out", str(out),
        "--set", f"checkpoint_dir='{checkpoints}'", "--set", "checkpoint_every_steps=40",
        "--set", "resume=true", "--set", "store_backend='file'",
    )  # fmt: skip


@full_tier  # about 40 s: CI keeps the store's full-disk tests
def test_recsys_checkpoint_on_a_full_disk_keeps_the_last_one_and_resumes(
    tmp_path: Path, disk: SmallDisk
) -> None:
    reference = run(_recsys(tmp_path / "reference", tmp_path / "reference-ck"), tmp_path)
    assert reference.returncode == 0, reference.stderr[-3000:]
    expected = _recsys_result(tmp_path / "reference")
    disk.mount("300k")  # the first checkpoint (about 90 KiB) fits, the second does not
    checkpoints = disk.path / "ck"
    failed = run(_recsys(tmp_path / "out", checkpoints), tmp_path)
    assert failed.returncode == 1
    line = _one_line(failed.stderr, "DiskFullError", f"the disk holding {checkpoints} is full")
    assert "needed" in line and "is intact (resume=true continues from it)" in line
    _no_temporaries(checkpoints)
    found = read_latest(checkpoints)  # verifies every file's sha256
    assert found is not None, "no checkpoint survived"
    disk.resize("8m")
    resumed = run(_recsys(tmp_path / "out", checkpoints), tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _recsys_result(tmp_path / "out") == expected
    record(
        "recsys train",
        "checkpoint_dir on a 300 KiB tmpfs (full at the 2nd checkpoint)",
        f"exit 1, one line naming the path and space; {found[0].name} intact; resumed equal",
    )


@full_tier
def test_tgraph_bench_on_a_full_disk_keeps_its_journal_and_resumes(
    tmp_path: Path, disk: SmallDisk
) -> None:
    reference = run(_tgraph(tmp_path / "reference"), tmp_path)
    assert reference.returncode == 0, reference.stderr[-3000:]
    expected = _bench_rows(tmp_path / "reference")
    disk.mount("400k")  # negatives and the journal fit, results.json does not
    out = disk.path / "bench"
    failed = run(_tgraph(out), tmp_path)
    assert failed.returncode == 1
    _one_line(failed.stderr, f"the disk holding {out}", "is full (about", "needed")
    _no_temporaries(out)
    lines = (out / "runs.jsonl").read_text().splitlines()
    assert lines and all(json.loads(line)["value"] for line in lines)  # every line whole
    disk.resize("8m")
    resumed = run(_tgraph(out), tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _bench_rows(out) == expected
    record(
        "tgraph bench",
        "--out on a 400 KiB tmpfs (full at results.json)",
        f"exit 1, one line naming the path and space; {len(lines)} journal lines whole; "
        "resumed equal",
    )


@full_tier
def test_store_bench_refuses_a_cell_that_cannot_fit_and_resumes(
    tmp_path: Path, disk: SmallDisk
) -> None:
    reference = run(_store(tmp_path / "reference"), tmp_path)
    assert reference.returncode == 0, reference.stderr[-3000:]
    expected = _store_rows(tmp_path / "reference")
    disk.mount("24m")  # the 16.6 MiB traces fit; the frugal cell's table (about 75 MiB) does not
    out = disk.path / "bench"
    failed = run(_store(out), tmp_path)
    assert failed.returncode == 1
    # refused before any run (fewer free bytes than the rows it touches) or in the cell
    line = _one_line(failed.stderr, "the store bench", "is full (")
    assert "No space left on device" in line  # the engine's own words, in brackets
    _no_temporaries(out)
    assert [p.name for p in out.iterdir()] in ([], ["runs.jsonl"])  # scratch removed
    disk.resize("160m")  # the largest cell's peak is about 96 MiB with the traces
    resumed = run(_store(out), tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _store_rows(out) == expected
    record(
        "store bench",
        "--out on a 24 MiB tmpfs (full in the frugal cell's child)",
        "exit 1, one line naming the cell, path and space; cell not journaled; resumed equal",
    )


def _pipeline(out: Path, *extra: str) -> list[str]:
    return frugal("pipeline", "train", "--steps", "8", "--out", str(out), *extra)


def _losses(out: Path) -> list[Any]:
    return list(json.loads((out / "train.json").read_text())["losses"])


@full_tier
def test_pipeline_train_on_a_full_disk_writes_nothing_half_and_reruns(
    tmp_path: Path, disk: SmallDisk
) -> None:
    reference = run(_pipeline(tmp_path / "reference"), tmp_path)
    assert reference.returncode == 0, reference.stderr[-3000:]
    disk.mount("24k")  # the rank files fit, the loss curve (written before train.json) does not
    out = disk.path / "train"
    failed = run(_pipeline(out), tmp_path)
    assert failed.returncode == 1
    _one_line(failed.stderr, "writing loss_curve.png", f"the disk holding {out}")
    assert not (out / "train.json").exists() and not (out / "loss_curve.png").exists()
    _no_temporaries(out)
    disk.resize("4m")
    rerun = run(_pipeline(out), tmp_path)  # no train.json was written: no --overwrite needed
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert _losses(out) == _losses(tmp_path / "reference")
    record(
        "pipeline train",
        "--out on a 24 KiB tmpfs (full at the loss curve)",
        "exit 1, one line naming the path and space; no train.json, no curve; rerun equal",
    )


def _fill(folder: Path, leave_bytes: int) -> Path:
    """Write a file that leaves about `leave_bytes` free on the disk holding `folder`."""
    from frugal.disk import free_bytes

    junk = folder / "junk"
    with open(junk, "wb") as handle:
        handle.truncate(0)
        size = max(0, free_bytes(folder) - leave_bytes)
        handle.write(b"\1" * size)  # written, not sparse: tmpfs counts it
    return junk


@pytest.mark.parametrize("backend", ["rocksdb", "lmdb"])
def test_store_recovery_on_a_full_disk_is_a_clear_error_and_the_checkpoint_survives(
    disk: SmallDisk, backend: str
) -> None:
    import numpy as np

    from frugal.disk import DiskFullError
    from frugal.store import EmbeddingStore, OptimizerConfig, RowSpec

    disk.mount("16m")
    spec = RowSpec(embedding_dim=64, optimizer=OptimizerConfig(kind="sgd"))
    config = EmbeddingStore.Config(backend=backend, memory_budget_bytes=4 << 20)
    directory = disk.path / "store"
    with EmbeddingStore.create(directory, num_rows=20_000, spec=spec, config=config) as store:
        store.put(np.arange(5000), np.full((5000, 64), 7.0, np.float32))  # 2.4 MiB, checkpointed
    # A recovery cut short (the live folder is gone), then another program fills the disk:
    # recovering must not need a second copy of the tables.
    shutil.rmtree(directory / backend)
    junk = _fill(disk.path, leave_bytes=256 << 10)
    if backend == "rocksdb":  # before: shutil.Error (copytree of the whole checkpoint)
        with EmbeddingStore.open(directory, config) as store:
            assert np.all(store.peek(np.arange(5000), cols="emb") == 7.0)
        outcome = "reopened: tables hard-linked from the checkpoint, rows equal"
    else:  # LMDB changes data.mdb in place: a copy is needed, and refused with the numbers
        with pytest.raises(DiskFullError) as info:
            EmbeddingStore.open(directory, config)
        message = str(info.value)
        assert f"recovering {directory / 'lmdb'} from checkpoint" in message
        assert "is full (about" in message and "needed" in message
        assert "lmdb.ckpt." in message and "is intact" in message
        assert not (directory / "lmdb").exists()  # no half copy left
        junk.unlink()
        with EmbeddingStore.open(directory, config) as store:
            assert np.all(store.peek(np.arange(5000), cols="emb") == 7.0)
        outcome = "DiskFullError naming the path and space; after freeing space, rows equal"
    record(
        f"store open ({backend})", "live folder lost, disk full at recovery (256 KiB free)", outcome
    )


def test_rocksdb_opening_its_recovered_copy_on_a_full_disk_is_a_disk_full_error(
    disk: SmallDisk,
) -> None:
    import numpy as np

    from frugal.disk import DiskFullError
    from frugal.store import EmbeddingStore, OptimizerConfig, RowSpec

    disk.mount("16m")
    spec = RowSpec(embedding_dim=64, optimizer=OptimizerConfig(kind="sgd"))
    config = EmbeddingStore.Config(backend="rocksdb", memory_budget_bytes=4 << 20)
    directory = disk.path / "store"
    with EmbeddingStore.create(directory, num_rows=20_000, spec=spec, config=config) as store:
        store.put(np.arange(5000), np.full((5000, 64), 7.0, np.float32))  # checkpointed
    (checkpoint,) = directory.glob("rocksdb.ckpt.*")
    copied = [p for p in checkpoint.iterdir() if p.suffix != ".sst"]  # CURRENT, OPTIONS...
    page = 4096  # tmpfs charges whole pages
    copied_bytes = sum(-(-p.stat().st_size // page) * page for p in copied)
    # A recovery cut short (the live folder is gone), then the disk fills: the copies of the
    # mutable files fit exactly, RocksDB's own writes at open (a new OPTIONS file) do not.
    # Before: a plain Exception("IO error: ... No space left on device").
    shutil.rmtree(directory / "rocksdb")
    junk = _fill(disk.path, leave_bytes=copied_bytes)
    with pytest.raises(DiskFullError) as info:
        EmbeddingStore.open(directory, config)
    message = str(info.value)
    assert f"recovering checkpoint 1 of {directory / 'rocksdb'}" in message
    assert "is full" in message and "No space left on device" in message
    assert f"the checkpoint {checkpoint} is intact" in message
    junk.unlink()
    with EmbeddingStore.open(directory, config) as store:
        assert np.all(store.peek(np.arange(5000), cols="emb") == 7.0)
    record(
        "store open (rocksdb)",
        "disk full while RocksDB opens the recovered copy",
        "DiskFullError naming the folder; after freeing space, rows equal",
    )


@full_tier
def test_reproduce_on_a_full_disk_stops_with_one_line_and_resumes(
    tmp_path: Path, disk: SmallDisk
) -> None:
    def command(out: Path) -> list[str]:
        return frugal("reproduce", "--smoke", "--only", "planner,store", "--out", str(out))

    reference = run(command(tmp_path / "reference"), tmp_path)
    assert reference.returncode == 0, reference.stderr[-3000:]
    disk.mount("3m")  # the planner part fits, the store part's tables do not
    out = disk.path / "report"
    failed = run(command(out), tmp_path)
    assert failed.returncode == 1
    _one_line(failed.stderr, "reproduce part store:", "is full (more than", "rerun resumes")
    _no_temporaries(out)
    assert (out / "parts" / "planner" / "part.json").is_file()  # the finished part is kept
    disk.resize("96m")
    resumed = run(command(out), tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "[planner] ok" in resumed.stderr and "(resumed)" in resumed.stderr
    assert _reproduce_rows(out) == _reproduce_rows(tmp_path / "reference")
    record(
        "reproduce --smoke",
        "--out on a 3 MiB tmpfs (full in the store part)",
        "exit 1, one line naming the part, path and space; finished part kept; resumed equal",
    )


def test_an_lmdb_store_on_a_full_disk_raises_instead_of_dying_of_sigbus(disk: SmallDisk) -> None:
    import numpy as np

    from frugal.disk import DiskFullError
    from frugal.store import EmbeddingStore, OptimizerConfig, RowSpec
    from frugal.store.errors import StoreError

    disk.mount("8m")
    spec = RowSpec(embedding_dim=32, optimizer=OptimizerConfig(kind="sgd"))
    config = EmbeddingStore.Config(backend="lmdb", memory_budget_bytes=4 << 20)
    directory = disk.path / "store"
    with EmbeddingStore.create(directory, num_rows=50_000, spec=spec, config=config) as store:
        store.put(np.arange(2000), np.full((2000, 32), 7.0, np.float32))  # checkpointed
    # 1. Closing (a checkpoint) with too little space: refused up front, nothing half-copied.
    store = EmbeddingStore.open(directory, config)
    store.put(np.arange(2000, 3000), np.full((1000, 32), 8.0, np.float32), step=1)
    store.flush()  # the rows are in LMDB: only the checkpoint's copy is left to write
    junk = _fill(disk.path, leave_bytes=64 << 10)
    with pytest.raises(DiskFullError, match=r"LMDB checkpoint 2 of .* is full \(about .* needed"):
        store.close()
    assert not (directory / "lmdb.ckpt.2").exists()
    junk.unlink()
    # 2. Writes that fill the disk: a StoreError naming the full disk (before: SIGBUS, exit 135).
    store = EmbeddingStore.open(directory, config)
    assert np.all(store.peek(np.arange(2000), cols="emb") == 7.0)  # checkpoint 1 was intact

    def write_until_full() -> None:
        for step in range(2, 200):
            ids = np.arange(step * 250, (step + 1) * 250) % 50_000
            store.put(ids, np.full((len(ids), 32), 9.0, np.float32), step=step)
            store.flush()

    junk = _fill(disk.path, leave_bytes=1 << 20)  # room for a third of the table
    with pytest.raises(StoreError, match=r"the disk holding .* is full"):
        write_until_full()
    junk.unlink()
    store.close(checkpoint=False)
    disk.resize("64m")
    with EmbeddingStore.open(directory, config) as store:
        assert np.all(store.peek(np.arange(2000), cols="emb") == 7.0)
    record(
        "store (lmdb)",
        "disk full at a checkpoint, then during writes (8 MiB tmpfs)",
        "DiskFullError, no partial checkpoint; StoreError naming the disk (was SIGBUS); "
        "reopened equal",
    )
