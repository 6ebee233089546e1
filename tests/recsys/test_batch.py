"""KJTBatch layout, validation and the jagged gather of RecsysData."""

from __future__ import annotations

import numpy as np
import pytest

from frugal.recsys.batch import KJTBatch, RecsysData
from frugal.recsys.errors import BadBatchError


def _data() -> RecsysData:
    # 3 samples; feature u single-valued, feature g multi-hot: [1, 2], [], [0, 1, 2]
    return RecsysData.from_columns(
        ("u",),
        (5, 3),
        np.array([[4], [0], [2]], np.int64),
        np.arange(6, dtype=np.float32).reshape(3, 2),
        np.array([1, 0, 1], np.float32),
        multi_hot={"g": (np.array([1, 2, 0, 1, 2], np.int64), np.array([0, 2, 2, 5], np.int64))},
    )


def test_batch_cuts_jagged_features_in_sample_order() -> None:
    batch = _data().batch(np.array([2, 0, 1], np.int64), batch_id=7)
    assert batch.keys == ("u", "g")
    assert batch.lengths.tolist() == [1, 1, 1, 3, 2, 0]  # feature-major
    assert batch.values.tolist() == [2, 4, 0, 0, 1, 2, 1, 2]
    assert [v.tolist() for v in batch.feature_values()] == [[2, 4, 0], [0, 1, 2, 1, 2]]
    assert batch.labels.tolist() == [1, 1, 0]
    assert batch.dense[0].tolist() == [4.0, 5.0]
    assert batch.batch_id == 7 and batch.batch_size == 3
    batch.validate((5, 3))


def test_validate_names_the_bad_value() -> None:
    data = _data()
    batch = data.batch(np.array([0, 1], np.int64), batch_id=3)
    with pytest.raises(BadBatchError, match=r"batch 3: feature 'u' .* \[0, 4\), first 4"):
        batch.validate((4, 3))
    with pytest.raises(BadBatchError, match=r"2 features .* 1 tables"):
        batch.validate((5,))
    bad_label = KJTBatch(
        batch.keys, batch.values, batch.lengths, batch.dense, np.array([np.nan, 0], np.float32), 3
    )
    with pytest.raises(BadBatchError, match="labels"):
        bad_label.validate((5, 3))
    bad_dense = KJTBatch(
        batch.keys, batch.values, batch.lengths, np.full_like(batch.dense, np.inf), batch.labels, 3
    )
    with pytest.raises(BadBatchError, match="NaN or inf"):
        bad_dense.validate((5, 3))
    bad_lengths = KJTBatch(
        batch.keys, batch.values[:-1], batch.lengths, batch.dense, batch.labels, 3
    )
    with pytest.raises(BadBatchError, match="sum\\(lengths\\)"):
        bad_lengths.validate((5, 3))


def test_empty_batch_is_legal() -> None:
    batch = _data().batch(np.array([1], np.int64), batch_id=0)
    assert batch.lengths.tolist() == [1, 0]
    batch.validate((5, 3))
