"""The count-min sketch and the PS shard's admission of new rows (hand-computed traces)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from frugal.recsys.admission import CountMinSketch
from frugal.recsys.config import RecsysTrainConfig
from frugal.recsys.ps import EmbeddingShard
from frugal.store import OptimizerConfig


def test_a_wide_sketch_counts_a_few_keys_exactly() -> None:
    sketch = CountMinSketch(1 << 16)
    assert sketch.add(np.array([7, 7, 9], dtype=np.int64)).tolist() == [2, 2, 1]
    assert sketch.add(np.array([9, 11], dtype=np.int64)).tolist() == [2, 1]
    assert sketch.estimate(np.array([7, 9, 11, 12], dtype=np.int64)).tolist() == [2, 2, 1, 0]
    assert sketch.memory_bytes == 4 * (1 << 16) * 2


def test_a_narrow_sketch_never_undercounts_and_conservative_update_helps() -> None:
    # 5,000 Zipf-ish keys into 4 x 64 counters: many collisions. Every estimate must be at
    # least the true count; conservative update keeps light keys closer than plain CM.
    rng = np.random.default_rng(0)
    stream = (rng.zipf(1.3, size=20_000) % 5000).astype(np.int64)
    sketch = CountMinSketch(64)
    for part in np.array_split(stream, 40):
        sketch.add(part)
    keys, true = np.unique(stream, return_counts=True)
    estimate = sketch.estimate(keys)
    assert (estimate >= true).all()
    plain = np.zeros((4, 64), dtype=np.int64)  # the same hashes without conservative update
    columns = sketch._columns(stream)
    for row in range(4):
        np.add.at(plain[row], columns[row], 1)
    plain_estimate = plain[np.arange(4)[:, None], sketch._columns(keys)].min(axis=0)
    assert (estimate <= plain_estimate).all() and (estimate < plain_estimate).any()


def test_counters_saturate_instead_of_wrapping() -> None:
    sketch = CountMinSketch(16, depth=1)
    sketch.add(np.full(70_000, 3, dtype=np.int64))
    assert sketch.estimate(np.array([3], dtype=np.int64)).tolist() == [65_535]


def test_bad_sketch_settings_are_refused() -> None:
    with pytest.raises(ValueError, match=r"width=100 must be a power of two >= 16"):
        CountMinSketch(100)
    with pytest.raises(ValueError, match=r"depth=9 must be in \[1, 8\]"):
        CountMinSketch(64, depth=9)
    with pytest.raises(ValueError, match=r"admission_sketch_width=3 must be a power of two"):
        EmbeddingShard.Config(admit_after=2, admission_sketch_width=3)
    with pytest.raises(ValueError, match=r"admit_after=0 must be >= 1"):
        EmbeddingShard.Config(admit_after=0)
    with pytest.raises(ValueError, match=r"ps_admit_after=0 must be >= 1"):
        RecsysTrainConfig(ps_admit_after=0)


def test_an_id_takes_a_row_on_its_third_push_and_not_before(tmp_path: Path) -> None:
    # admit_after=3, SGD lr 1: id 5 is pushed three times with gradient 1; only the third
    # push updates its row (initial - 1). Id 9, pushed once, keeps its initial value. Three
    # updates are dropped: two of id 5, one of id 9.
    config = EmbeddingShard.Config(
        embedding_dim=2, optimizer=OptimizerConfig(kind="sgd", lr=1.0), admit_after=3,
        admission_sketch_width=1 << 12,
    )  # fmt: skip
    shard = EmbeddingShard(tmp_path / "s", (100,), config)
    counts = torch.tensor([1])
    ones = torch.ones(1, 2)
    try:
        initial5, _ = shard.lookup(torch.tensor([5]), counts, torch.float32)
        initial9, _ = shard.lookup(torch.tensor([9]), counts, torch.float32)
        for push in range(1, 4):
            shard.push(torch.tensor([5]), counts, ones, torch.tensor([0]), 1.0, push)
            rows, versions = shard.lookup(torch.tensor([5]), counts, torch.float32, step=push)
            if push < 3:
                torch.testing.assert_close(rows, initial5, rtol=0, atol=0)
                assert versions.tolist() == [0]
        torch.testing.assert_close(rows, initial5 - 1.0, rtol=0, atol=0)
        assert versions.tolist() == [1]
        shard.push(torch.tensor([9]), counts, ones, torch.tensor([0]), 1.0, 4)
        rows9, versions9 = shard.lookup(torch.tensor([9]), counts, torch.float32)
        torch.testing.assert_close(rows9, initial9, rtol=0, atol=0)
        assert versions9.tolist() == [0]
        stats = shard.stats()
        assert stats["rejected_updates"] == 3 and stats["updates_applied"] == [1]
        # An admitted id keeps its row: its next push updates it again.
        shard.push(torch.tensor([5]), counts, ones, torch.tensor([1]), 1.0, 5)
        rows, _ = shard.lookup(torch.tensor([5]), counts, torch.float32)
        torch.testing.assert_close(rows, initial5 - 2.0, rtol=0, atol=0)
    finally:
        shard.close()
