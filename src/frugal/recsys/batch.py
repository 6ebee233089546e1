"""KeyedJagged-style batches and the recommender datasets they are cut from.

A `KJTBatch` holds, for F features (one embedding table each) and B samples, the ids of every
(feature, sample) bag as one flat `values` array with feature-major `lengths` (TorchRec's
KeyedJaggedTensor layout, without its fbgemm dependency), plus dense features and labels.

Shape legend: B samples, F features, N ids in a batch, D dense features.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np

from frugal._typing import F32, I32, I64
from frugal.recsys.errors import BadBatchError

__all__ = ["KJTBatch", "RecsysData", "RecsysSplit"]


@dataclass(frozen=True, slots=True)
class KJTBatch:
    """One batch: jagged ids per (feature, sample), dense features and labels.

    Attributes:
        keys: Feature (table) names, length F.
        values: All ids, int64, feature-major then sample order; shape (N,).
        lengths: Ids per (feature, sample), int32, feature-major; shape (F * B,).
        dense: Dense features, float32; shape (B, D) (D may be 0).
        labels: Click labels in [0, 1], float32; shape (B,).
        batch_id: Global batch number (the step * world_size + rank of the producer).
    """

    keys: tuple[str, ...]
    values: I64
    lengths: I32
    dense: F32
    labels: F32
    batch_id: int

    @property
    def batch_size(self) -> int:
        """Number of samples B."""
        return int(self.labels.shape[0])

    def feature_values(self) -> list[I64]:
        """The ids of each feature, one flat array per feature (F arrays)."""
        per_feature = self.lengths.reshape(len(self.keys), self.batch_size).sum(axis=1)
        bounds = np.concatenate([[0], np.cumsum(per_feature)])
        return [self.values[bounds[f] : bounds[f + 1]] for f in range(len(self.keys))]

    def validate(self, num_embeddings: tuple[int, ...], *, raw_ids: bool = False) -> None:
        """Check ids, lengths, labels and dense values; raise before anything is applied.

        Args:
            num_embeddings: Rows of each feature's table; ids must lie in [0, rows).
            raw_ids: Ids are raw 64-bit hashes (any int64), not range-checked.

        Raises:
            BadBatchError: Naming the batch, the feature and the first bad value.
        """
        num_features, size = len(self.keys), self.batch_size
        where = f"batch {self.batch_id}"
        if len(num_embeddings) != num_features:
            raise BadBatchError(
                f"{where}: {num_features} features {self.keys} but {len(num_embeddings)} "
                "tables; the model's feature list must match the data"
            )
        if self.lengths.shape != (num_features * size,):
            raise BadBatchError(
                f"{where}: lengths has shape {self.lengths.shape}, expected "
                f"({num_features} * {size},) feature-major"
            )
        if (self.lengths < 0).any() or int(self.lengths.sum()) != len(self.values):
            raise BadBatchError(
                f"{where}: sum(lengths)={int(self.lengths.sum())} != len(values)="
                f"{len(self.values)} (or a negative length)"
            )
        for f, ids in enumerate([] if raw_ids else self.feature_values()):
            bad = (ids < 0) | (ids >= num_embeddings[f])
            if bad.any():
                raise BadBatchError(
                    f"{where}: feature {self.keys[f]!r} has {int(bad.sum())} ids outside "
                    f"[0, {num_embeddings[f]}), first {int(ids[bad][0])}; re-index the ids or "
                    "declare more rows for that table"
                )
        if not np.isfinite(self.dense).all():
            raise BadBatchError(f"{where}: dense features hold NaN or inf; clean the input")
        if not np.isfinite(self.labels).all() or ((self.labels < 0) | (self.labels > 1)).any():
            raise BadBatchError(f"{where}: labels must be finite and in [0, 1]")


class RecsysSplit(Protocol):
    """What a trainer reads a split through: `RecsysData` (in RAM) or a generated stream."""

    shuffle: ClassVar[bool]
    """Batches read shuffled samples (a seeded permutation per epoch), else in order."""

    @property
    def keys(self) -> tuple[str, ...]:
        """Feature (table) names, length F."""
        ...

    @property
    def num_embeddings(self) -> tuple[int, ...]:
        """Rows of each feature's table (nominal where `raw_ids`), length F."""
        ...

    @property
    def raw_ids(self) -> bool:
        """Ids are raw 64-bit hashes that the trainers hash into the PS key space."""
        ...

    @property
    def num_samples(self) -> int:
        """Number of samples S."""
        ...

    @property
    def dense_dim(self) -> int:
        """Number of dense features D."""
        ...

    @property
    def nbytes(self) -> int:
        """Bytes the split holds in RAM."""
        ...

    def batch(self, rows: I64, batch_id: int) -> KJTBatch:
        """Cut the samples `rows` (in that order) into a KJTBatch."""
        ...


@dataclass(frozen=True, slots=True)
class RecsysData:
    """A split of a recommender dataset held as per-feature jagged columns.

    Attributes:
        keys: Feature names, length F.
        num_embeddings: Rows of each feature's table, length F.
        values: Per feature, all ids of all samples in sample order (F arrays).
        offsets: Per feature, int64 offsets of each sample's ids, shape (S + 1,) (F arrays).
        dense: Dense features, float32 (S, D).
        labels: Labels, float32 (S,).
        raw_ids: Ids are raw 64-bit hashes (any int64, e.g. a feature pipeline's hashes of
            strings): the trainers hash them into the PS key space
            (`frugal.recsys.ps.hash_raw_ids`), and `num_embeddings` only sizes the shards.
    """

    shuffle: ClassVar[bool] = True

    keys: tuple[str, ...]
    num_embeddings: tuple[int, ...]
    values: tuple[I64, ...]
    offsets: tuple[I64, ...]
    dense: F32
    labels: F32
    raw_ids: bool = False

    def __post_init__(self) -> None:
        num = len(self.labels)
        if not (len(self.keys) == len(self.num_embeddings) == len(self.values)):
            raise ValueError("keys, num_embeddings and values must have one entry per feature")
        for f, offsets in enumerate(self.offsets):
            if offsets.shape != (num + 1,) or int(offsets[-1]) != len(self.values[f]):
                raise ValueError(f"feature {self.keys[f]!r}: offsets do not match its values")
        if self.dense.shape[0] != num:
            raise ValueError(f"dense has {self.dense.shape[0]} rows for {num} labels")

    @property
    def num_samples(self) -> int:
        """Number of samples S."""
        return len(self.labels)

    @property
    def dense_dim(self) -> int:
        """Number of dense features D."""
        return int(self.dense.shape[1])

    @property
    def nbytes(self) -> int:
        """Bytes of its arrays (ids, offsets, dense features, labels)."""
        ids = sum(int(v.nbytes) for v in self.values) + sum(int(o.nbytes) for o in self.offsets)
        return ids + int(self.dense.nbytes) + int(self.labels.nbytes)

    @classmethod
    def from_columns(
        cls,
        keys: tuple[str, ...],
        num_embeddings: tuple[int, ...],
        ids_SF: I64,
        dense: F32,
        labels: F32,
        multi_hot: dict[str, tuple[I64, I64]] | None = None,
    ) -> RecsysData:
        """Build from one id per (sample, feature) plus optional multi-hot features.

        Args:
            keys: Names of the single-id features (columns of `ids_SF`).
            num_embeddings: Rows of each table: single-id features, then multi-hot ones.
            ids_SF: int64 ids, shape (S, F1).
            dense: float32 (S, D).
            labels: float32 (S,).
            multi_hot: name -> (values, offsets (S + 1,)) of jagged features, appended.

        Returns:
            The dataset.
        """
        num = ids_SF.shape[0]
        values = [np.ascontiguousarray(ids_SF[:, f]) for f in range(ids_SF.shape[1])]
        offsets = [np.arange(num + 1, dtype=np.int64) for _ in range(ids_SF.shape[1])]
        names = list(keys)
        for name, (vals, offs) in (multi_hot or {}).items():
            names.append(name)
            values.append(vals.astype(np.int64))
            offsets.append(offs.astype(np.int64))
        return cls(
            tuple(names),
            tuple(num_embeddings),
            tuple(values),
            tuple(offsets),
            dense.astype(np.float32),
            labels.astype(np.float32),
        )

    def batch(self, rows: I64, batch_id: int) -> KJTBatch:
        """Cut the samples `rows` (in that order) into a KJTBatch.

        Args:
            rows: Sample indices, int64 (B,).
            batch_id: The batch's global number.

        Returns:
            The batch.
        """
        lengths = []
        values = []
        for f in range(len(self.keys)):
            starts = self.offsets[f][rows]
            ends = self.offsets[f][rows + 1]
            counts = ends - starts
            lengths.append(counts)
            if len(counts) and (counts == 1).all():
                values.append(self.values[f][starts])
            else:
                # jagged gather without a Python loop: position of each id in the flat array
                total = int(counts.sum())
                base = np.repeat(starts - np.cumsum(counts) + counts, counts)
                values.append(self.values[f][base + np.arange(total, dtype=np.int64)])
        return KJTBatch(
            keys=self.keys,
            values=np.concatenate(values) if values else np.empty(0, np.int64),
            lengths=np.concatenate(lengths).astype(np.int32),
            dense=self.dense[rows],
            labels=self.labels[rows],
            batch_id=batch_id,
        )
