"""Criteo-shaped streams generated batch by batch, and raw 64-bit ids hashed into the PS."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from frugal.data.synthetic import CRITEO_KAGGLE_CARDINALITIES
from frugal.recsys.batch import RecsysData
from frugal.recsys.client import EmbeddingClient
from frugal.recsys.config import RecsysTrainConfig
from frugal.recsys.datasets import RecsysDataConfig, load_recsys_data
from frugal.recsys.errors import BadBatchError
from frugal.recsys.loader import BatchSource
from frugal.recsys.ps import ID_BITS, EmbeddingShard, default_owners, hash_raw_ids
from frugal.recsys.streams import CHUNK_SAMPLES, CriteoStream
from frugal.recsys.transport import LocalTransport, ShardServer


def _data(dataset: str, **fields: object) -> RecsysDataConfig:
    base: dict[str, object] = {"stream_num_samples": 200_000, "stream_test_samples": 1_000}
    return RecsysDataConfig(dataset=dataset, **(base | fields))  # type: ignore[arg-type]


def test_the_kaggle_stream_has_criteos_fields_and_cardinalities() -> None:
    train, test = load_recsys_data(_data("criteo_kaggle_stream"))
    assert isinstance(train, CriteoStream) and not train.shuffle and not train.raw_ids
    assert train.num_embeddings == CRITEO_KAGGLE_CARDINALITIES
    assert sum(train.num_embeddings) == 33_762_577 and train.keys[0] == "C1"
    assert isinstance(test, RecsysData) and test.num_samples == 1_000
    batch = train.batch(np.arange(100, 164), batch_id=3)
    batch.validate(train.num_embeddings)  # every id in [0, cardinality)
    assert batch.values.shape == (26 * 64,) and (batch.lengths == 1).all()
    assert batch.dense.shape == (64, 13) and set(np.unique(batch.labels)) <= {0.0, 1.0}
    # A sample is the same however it is reached: in another batch, in another object,
    # or in the test split materialised from the same stream.
    again = load_recsys_data(_data("criteo_kaggle_stream"))[0].batch(np.arange(90, 170), 0)
    mine = again.values.reshape(26, 80)[:, 10:74].reshape(-1)
    np.testing.assert_array_equal(mine, batch.values)
    np.testing.assert_array_equal(again.dense[10:74], batch.dense)
    tail = CriteoStream(_data("criteo_kaggle_stream"), terabyte=False, first_sample=0,
                        num_samples=201_000).batch(np.arange(200_000, 201_000), 0)  # fmt: skip
    np.testing.assert_array_equal(tail.labels, test.labels)
    np.testing.assert_array_equal(tail.values.reshape(26, -1).T, np.stack(test.values, axis=1))
    # Zipf: the hottest id of the largest field is drawn far more often than uniform.
    big = int(np.argmax(CRITEO_KAGGLE_CARDINALITIES))
    ids = train.local_ids(np.arange(CHUNK_SAMPLES))[:, big]
    assert np.bincount(ids).max() > 100 * CHUNK_SAMPLES / CRITEO_KAGGLE_CARDINALITIES[big]
    with pytest.raises(ValueError, match="a stream is read in order"):
        train.local_ids(np.arange(0, 20 * CHUNK_SAMPLES, CHUNK_SAMPLES))
    assert train.head(5).num_samples == 5
    assert load_recsys_data(_data("criteo_kaggle_stream", max_train_samples=7))[0].num_samples == 7


def test_the_terabyte_stream_gives_raw_64_bit_ids_the_client_hashes_into_56_bits() -> None:
    train, test = load_recsys_data(_data("criteo_terabyte_stream", stream_scale=0.5))
    assert train.raw_ids and test.raw_ids
    assert sum(train.num_embeddings) > 150_000_000  # 10x Kaggle's ids at half scale
    batch = train.batch(np.arange(512), 0)
    assert batch.values.min() < 0 < batch.values.max()  # full 64-bit values
    batch.validate(train.num_embeddings, raw_ids=True)  # not range-checked
    with pytest.raises(BadBatchError, match="outside"):
        batch.validate(train.num_embeddings)
    hashed = hash_raw_ids(batch.values)
    assert hashed.min() >= 0 and hashed.max() < 1 << ID_BITS
    # equal raw ids hash equal; the 512 x 26 ids keep their distinct count (no collision)
    assert len(np.unique(hashed)) == len(np.unique(batch.values))
    np.testing.assert_array_equal(hash_raw_ids(batch.values[:5].copy()), hashed[:5])


def test_a_trainer_client_routes_hashed_raw_ids_to_the_shard(tmp_path: Path) -> None:
    shard = EmbeddingShard(tmp_path / "s", (10, 10), EmbeddingShard.Config(embedding_dim=4))
    try:
        client = EmbeddingClient(
            LocalTransport({0: ShardServer(shard, None, 0.0)}), default_owners(1), 2, 4,
            "float32", raw_ids=True,
        )  # fmt: skip
        from frugal.recsys.batch import KJTBatch

        raw = np.array([-5, 2**62 + 3, -5, 7], dtype=np.int64)
        batch = KJTBatch(
            keys=("a", "b"), values=raw, lengths=np.array([1, 2, 1, 0], np.int32),
            dense=np.zeros((2, 0), np.float32), labels=np.zeros(2, np.float32), batch_id=0,
        )  # fmt: skip
        pending = client.route(batch)
        want = np.concatenate([np.unique(hash_raw_ids(raw[:3])), hash_raw_ids(raw[3:])])
        np.testing.assert_array_equal(pending.unique_ids, want)
        result = client.wait(client.lookup(batch))
        pooled = client.pool(result)  # bag 0 of "a": id -5; bag 1: 2^62+3 and -5
        rows = {int(k): v for k, v in zip(want[:2], shard.peek_table(0, want[:2]), strict=True)}
        minus5, big = (rows[int(hash_raw_ids(raw[i : i + 1])[0])] for i in (0, 1))
        torch.testing.assert_close(pooled[0, 0], torch.from_numpy(minus5))
        torch.testing.assert_close(pooled[1, 0], torch.from_numpy(minus5 + big))
    finally:
        shard.close()


def test_a_stream_is_read_in_order_by_the_batch_source() -> None:
    config = RecsysTrainConfig(
        data=_data("criteo_kaggle_stream", stream_num_samples=1_000), batch_size=100, nproc=2
    )
    train, _ = load_recsys_data(config.data)
    source = BatchSource(train, config, rank=1, world_size=2)
    assert source.num_steps == 5
    # step 2 of rank 1: samples 2 * 200 + 100 + [0, 100), the stream's own order
    expected = train.batch(np.arange(500, 600), 0)
    np.testing.assert_array_equal(source.batch(2).values, expected.values)
    assert source.batch(2).batch_id == 5


def test_streams_have_a_planted_teacher_whose_auc_is_the_ceiling() -> None:
    from frugal.recsys.datasets import teacher_auc
    from frugal.recsys.metrics import roc_auc

    config = _data("criteo_kaggle_stream", stream_test_samples=5_000)
    ceiling = teacher_auc(config)
    assert ceiling is not None and 0.75 < ceiling < 0.95
    _, test = load_recsys_data(config)
    # the labels are Bernoulli draws of the teacher's probabilities: a constant scores 0.5
    assert roc_auc(test.labels, np.zeros(test.num_samples)) == 0.5
