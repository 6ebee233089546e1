"""The three recommender datasets: splits, labels, id ranges, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from frugal.recsys.datasets import RecsysDataConfig, load_recsys_data, teacher_auc


@pytest.mark.slow
def test_movielens_temporal_split_and_click_label() -> None:
    train, test = load_recsys_data(RecsysDataConfig(dataset="movielens100k"))
    assert train.num_samples + test.num_samples == 100_000
    assert 79_000 < train.num_samples < 81_000  # the 80% time quantile, ties go to train
    assert train.keys[:2] == ("user_id", "movie_id") and train.keys[-1] == "genres"
    assert train.num_embeddings[:2] == (943, 1682)
    # click = rating >= 4: 55,375 of the 100k ratings are 4 or 5
    assert int(train.labels.sum() + test.labels.sum()) == 55_375
    genres = train.offsets[-1]
    assert (np.diff(genres) >= 1).all()  # every movie has at least one genre (multi-hot)
    for data in (train, test):
        for f, values in enumerate(data.values):
            assert values.min() >= 0 and values.max() < data.num_embeddings[f]


@pytest.mark.slow
def test_adult_seeded_split() -> None:
    train, test = load_recsys_data(RecsysDataConfig(dataset="adult"))
    assert (train.num_samples, test.num_samples) == (39_074, 9_768)
    assert len(train.keys) == 8 and train.dense_dim == 6
    assert 0.2 < float(train.labels.mean()) < 0.3  # 23.9% earn > 50K
    np.testing.assert_allclose(train.dense.mean(axis=0), 0.0, atol=1e-4)  # train statistics
    again, _ = load_recsys_data(RecsysDataConfig(dataset="adult"))
    np.testing.assert_array_equal(again.labels, train.labels)
    other, _ = load_recsys_data(RecsysDataConfig(dataset="adult", seed=1))
    assert not np.array_equal(other.labels, train.labels)


def test_zipf_stream_is_deterministic_with_a_learnable_teacher() -> None:
    config = RecsysDataConfig(
        dataset="criteo_zipf", zipf_num_samples=4000, zipf_num_embeddings=500, zipf_num_features=4
    )
    train, test = load_recsys_data(config)
    assert (train.num_samples, test.num_samples) == (3200, 800)
    assert train.dense_dim == 13 and train.num_embeddings == (500,) * 4
    again, _ = load_recsys_data(config)
    np.testing.assert_array_equal(again.values[0], train.values[0])
    # Zipf: the most frequent id of a feature is far above uniform (1/500 of the samples)
    counts = np.bincount(train.values[0], minlength=500)
    assert counts.max() > 20 * train.num_samples / 500
    auc = teacher_auc(config)
    assert auc is not None and 0.7 < auc < 1.0
    assert teacher_auc(RecsysDataConfig(dataset="adult")) is None


def test_bad_data_config_is_rejected() -> None:
    with pytest.raises(ValueError, match="zipf_num_features=30"):
        RecsysDataConfig(zipf_num_features=30)
    with pytest.raises(ValueError, match=r"test_fraction=1\.0"):
        RecsysDataConfig(test_fraction=1.0)


def test_datasets_are_a_registry_and_unknown_names_list_the_choices() -> None:
    from frugal.config import ConfigError
    from frugal.recsys.datasets import RECSYS_DATASETS

    assert RECSYS_DATASETS.names()[:3] == ("movielens100k", "adult", "criteo_zipf")
    with pytest.raises(
        ConfigError, match="dataset='nope' is not a registered recsys dataset; choose one of "
        "movielens100k, adult, criteo_zipf",
    ):  # fmt: skip
        RecsysDataConfig(dataset="nope")


def test_a_registered_dataset_loads_through_load_recsys_data() -> None:
    from frugal.recsys.batch import RecsysData
    from frugal.recsys.datasets import RECSYS_DATASETS, RECSYS_TEACHERS

    def tiny(config: RecsysDataConfig) -> tuple[RecsysData, RecsysData]:
        ids = np.arange(10, dtype=np.int64)[:, None] % 3  # 10 samples, one feature of 3 ids
        data = RecsysData.from_columns(
            ("f",),
            (3,),
            ids,
            np.zeros((10, 1), np.float32),
            (ids[:, 0] == config.seed).astype(np.float32),
        )
        return data, data

    RECSYS_DATASETS.register("tiny", tiny)
    try:
        train, test = load_recsys_data(RecsysDataConfig(dataset="tiny", max_train_samples=4))
        assert (train.num_samples, test.num_samples) == (4, 10)  # the cap applies to train only
        assert train.labels.tolist() == [1.0, 0.0, 0.0, 1.0]  # ids 0 1 2 0, label id == seed 0
        with pytest.raises(ValueError, match="'tiny' is already registered"):
            RECSYS_DATASETS.register("tiny", tiny)
        assert teacher_auc(RecsysDataConfig(dataset="tiny")) is None  # no teacher registered
        RECSYS_TEACHERS.register("tiny", lambda config: 0.5 + config.seed / 10)
        assert teacher_auc(RecsysDataConfig(dataset="tiny", seed=2)) == 0.7
    finally:
        RECSYS_DATASETS.unregister("tiny")
        if "tiny" in RECSYS_TEACHERS:
            RECSYS_TEACHERS.unregister("tiny")
