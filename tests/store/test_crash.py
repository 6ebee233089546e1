"""kill -9 a real writer process at random moments; reopening yields exactly a checkpoint."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from frugal.store import EmbeddingStore, apply_optimizer, init_rows

sys.path.insert(0, str(Path(__file__).parent))
import crash_child  # the child's step function is the reference's too


def _reference_sha(steps: int) -> str:
    table = init_rows(np.arange(crash_child.NUM_ROWS, dtype=np.int64), crash_child.SPEC, seed=5)
    for step in range(steps):
        ids, grads = crash_child.step_batch(step)
        unique, inverse = np.unique(ids, return_inverse=True)
        summed = np.zeros((len(unique), crash_child.SPEC.embedding_dim), dtype=np.float32)
        np.add.at(summed, inverse, grads)
        rows = table[unique]
        apply_optimizer(rows, summed, crash_child.SPEC)
        table[unique] = rows
    return hashlib.sha256(table.tobytes()).hexdigest()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["file", "rocksdb"])
def test_sigkill_at_random_moments_recovers_the_last_checkpoint(
    backend: str, tmp_path: Path
) -> None:
    directory = tmp_path / "store"
    rng = random.Random(1234)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    last_step = -1
    for _ in range(4):
        child = subprocess.Popen(
            [sys.executable, str(Path(crash_child.__file__)), str(directory), backend],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        # Wait until the child has made progress past its starting point, then kill it at a
        # random moment (mid write-back, mid checkpoint, between bitmap and MANIFEST, ...).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and child.poll() is None:
            manifest = directory / "MANIFEST"
            if manifest.exists():
                try:
                    if json.loads(manifest.read_text())["step"] > last_step:
                        break
                except (ValueError, KeyError):
                    pass  # caught mid-rename: read again
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.4))
        if child.poll() is not None:
            _, err = child.communicate(timeout=10)
            pytest.fail(f"child exited early with {child.returncode}: {err.decode()[-2000:]}")
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        with EmbeddingStore.open(
            directory, EmbeddingStore.Config(memory_budget_bytes=2 << 20)
        ) as store:
            assert store.step % crash_child.CHECKPOINT_EVERY == 0
            assert store.step >= last_step
            assert store.table_sha256() == _reference_sha(store.step), (
                f"reopened table differs from the reference at checkpoint step {store.step}"
            )
            last_step = store.step
            store.close(checkpoint=False)
    assert last_step > 0


def test_killed_during_create_reports_an_incomplete_store(tmp_path: Path) -> None:
    # A create that died before its MANIFEST leaves files but no MANIFEST.
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "rows.dat").write_bytes(b"\0" * 4096)
    from frugal.store import StoreError

    with pytest.raises(StoreError, match="incomplete store, no MANIFEST"):
        EmbeddingStore.open(tmp_path / "s")


def test_full_disk_raises_a_clear_error_and_keeps_the_checkpoint(tmp_path: Path) -> None:
    # RLIMIT_FSIZE makes appends fail with EFBIG, as a full disk fails them with ENOSPC.
    from frugal.store import OptimizerConfig, RowSpec

    spec = RowSpec(embedding_dim=8, optimizer=OptimizerConfig(kind="sgd"))
    directory = tmp_path / "store"
    with EmbeddingStore.create(directory, num_rows=2000, spec=spec) as store:
        store.put(np.arange(2000), np.full((2000, 8), 7.0, np.float32))  # checkpointed on close
    log_bytes = (directory / "log.0.dat").stat().st_size
    child = subprocess.run(
        [sys.executable, str(Path(__file__).parent / "fsize_child.py"), str(directory),
         str(log_bytes + 512 * 3000)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr[-2000:]
    assert "error: StoreError: a background read or write-back failed" in child.stdout
    assert "File too large" in child.stdout
    with EmbeddingStore.open(directory) as store:
        assert np.all(store.peek(np.arange(2000)) == 7.0)  # the checkpoint is intact
