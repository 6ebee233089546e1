"""Criteo-shaped click streams at full scale, generated batch by batch instead of held in RAM.

- `criteo_kaggle_stream`: the 26 categorical fields of the Criteo Kaggle set at their real
  cardinalities (33,762,577 ids at `stream_scale` 1), ids 0..c-1 per field.
- `criteo_terabyte_stream`: ten times those cardinalities (337.6M ids at scale 1, the
  order of Criteo Terabyte's hashed ids) given as **raw 64-bit feature hashes** (any int64),
  which the trainers hash into the PS key space (`frugal.recsys.ps.hash_raw_ids`).

Per field a sample's id is a truncated-Zipf rank (`zipf_alpha`; Criteo's fields are near
1.05) drawn from a generator seeded by (seed, field, chunk of 65,536 samples), scattered over
the field (Kaggle: an affine bijection of the ranks; Terabyte: splitmix64), so any sample
range is generated alone and every process sees the same stream. Dense features are 13
unit-variance values hashed from (seed, sample); labels come from the planted
factorisation-machine teacher of `criteo_zipf` (`frugal.recsys.datasets`), its id terms scaled
by sqrt(8 / 26) for 26 fields. The training split
is the first `stream_num_samples` samples, read in order (a stream is not shuffled); the test
split the next `stream_test_samples`, held in RAM.

RAM: two chunks of ids (27 MB), whatever the number of samples or ids.

Shape legend: S samples, F fields (26), B samples in a batch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import numpy.typing as npt

from frugal._typing import F32, I64
from frugal.data.synthetic import CRITEO_KAGGLE_CARDINALITIES, truncated_zipf_ranks
from frugal.recsys.batch import KJTBatch, RecsysData
from frugal.store.rows import splitmix64

if TYPE_CHECKING:
    from frugal.recsys.datasets import RecsysDataConfig

__all__ = ["CHUNK_SAMPLES", "TERABYTE_ID_FACTOR", "CriteoStream"]

CHUNK_SAMPLES = 1 << 16
"""Samples per seeded chunk of a stream (part of its identity)."""
TERABYTE_ID_FACTOR = 10
"""Cardinalities of the Terabyte-shaped stream over the Kaggle ones."""
_SCATTER = 2_654_435_761  # a prime above every cardinality: rank -> (rank * p + f) mod c
_SMALL_FIELD_IDS = 1000  # fields below this many ids keep their size at any scale


class CriteoStream:
    """A Criteo-shaped training split generated on demand (see the module docstring).

    Args:
        config: The data settings (`stream_*`, `zipf_alpha`, `seed`).
        terabyte: The Terabyte-shaped stream (raw 64-bit ids, 10x the ids) or Kaggle's.
        first_sample: Global index of this split's first sample.
        num_samples: Samples in this split, >= 1.
    """

    shuffle: ClassVar[bool] = False
    """Batches read samples in order: the stream is already i.i.d."""

    def __init__(
        self, config: RecsysDataConfig, *, terabyte: bool, first_sample: int, num_samples: int
    ) -> None:
        self.config = config
        self.terabyte = terabyte
        self.raw_ids = terabyte
        """Ids are raw 64-bit hashes: the trainers hash them; `num_embeddings` is nominal."""
        factor = TERABYTE_ID_FACTOR if terabyte else 1
        self.cardinalities: tuple[int, ...] = tuple(
            c if c < _SMALL_FIELD_IDS else max(2, math.ceil(c * factor * config.stream_scale))
            for c in CRITEO_KAGGLE_CARDINALITIES
        )
        self.keys: tuple[str, ...] = tuple(f"C{f + 1}" for f in range(len(self.cardinalities)))
        self.num_embeddings: tuple[int, ...] = self.cardinalities
        self.first_sample = first_sample
        self.num_samples = num_samples
        self.dense_dim = 13
        self._chunks: dict[int, I64] = {}  # chunk -> local ids (CHUNK_SAMPLES, F), last two

    @property
    def nbytes(self) -> int:
        """Bytes it holds at most (two chunks of ids)."""
        return 2 * CHUNK_SAMPLES * len(self.keys) * 8

    @property
    def total_ids(self) -> int:
        """Distinct ids the stream can draw, over every field."""
        return sum(self.cardinalities)

    def _chunk(self, chunk: int) -> I64:
        """Local ids (ranks scattered over each field) of one seeded chunk, (CHUNK_SAMPLES, F)."""
        cached = self._chunks.get(chunk)
        if cached is not None:
            return cached
        out = np.empty((CHUNK_SAMPLES, len(self.cardinalities)), dtype=np.int64)
        for f, c in enumerate(self.cardinalities):
            rng = np.random.default_rng([self.config.seed, 17, f, chunk])
            ranks = truncated_zipf_ranks(rng.random(CHUNK_SAMPLES), c, self.config.zipf_alpha)
            out[:, f] = (ranks * _SCATTER + f) % c  # a bijection of [0, c): hot ids scattered
        if len(self._chunks) >= 2:
            self._chunks.pop(min(self._chunks))
        self._chunks[chunk] = out
        return out

    def local_ids(self, samples: I64) -> I64:
        """Per-field ids in [0, c) of global `samples` (sorted or not), (B, F).

        Raises:
            ValueError: If the samples span more than 16 chunks (a stream is read in order).
        """
        chunks = samples // CHUNK_SAMPLES
        wanted = np.unique(chunks)
        if len(wanted) > 16:
            raise ValueError(
                f"samples span {len(wanted)} chunks of {CHUNK_SAMPLES}; a stream is read in "
                "order, in batches of consecutive samples"
            )
        out = np.empty((len(samples), len(self.cardinalities)), dtype=np.int64)
        for chunk in wanted.tolist():
            mine = chunks == chunk
            out[mine] = self._chunk(chunk)[samples[mine] - chunk * CHUNK_SAMPLES]
        return out

    def _raw(self, local_BF: I64) -> I64:
        """Raw 64-bit feature hashes of local ids (Terabyte-shaped): any int64 value."""
        salt = np.uint64(self.config.seed) << np.uint64(48)
        fields = np.arange(local_BF.shape[1], dtype=np.uint64) << np.uint64(40)
        with np.errstate(over="ignore"):
            raw = splitmix64(local_BF.astype(np.uint64) + fields + salt)
        return raw.view(np.int64)

    def _dense_labels(self, samples: I64, local_BF: I64) -> tuple[F32, F32]:
        from frugal.recsys.datasets import _hashed_uniform

        dense = (_hashed_uniform(self.config.seed, 500, samples, 13) * math.sqrt(3.0)).astype(
            np.float32
        )
        logits = self._logits(local_BF, dense)
        draw = (_hashed_uniform(self.config.seed, 501, samples, 1)[:, 0] + 1.0) / 2.0
        labels = (draw < 1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
        return dense, labels

    def _logits(self, local_BF: I64, dense: F32) -> npt.NDArray[np.float64]:
        """Logits of the teacher of `criteo_zipf`, its id terms scaled by sqrt(8 / 26).

        So 26 fields leave labels about as noisy as its 8 do (not near-deterministic).
        """
        from frugal.recsys.datasets import _zipf_logits

        logits: npt.NDArray[np.float64] = -1.0 + (
            _zipf_logits(self.config, local_BF, dense) + 1.0
        ) * math.sqrt(8 / 26)
        return logits

    def teacher_logits(self) -> npt.NDArray[np.float64]:
        """The planted teacher's logits of every sample of the split, (S,).

        Their AUC on the test split is the ceiling a trained model approaches.
        """
        samples = np.arange(self.first_sample, self.first_sample + self.num_samples)
        parts = [samples[i : i + CHUNK_SAMPLES] for i in range(0, len(samples), CHUNK_SAMPLES)]
        local = np.concatenate([self.local_ids(p) for p in parts])
        dense, _ = self._dense_labels(samples, local)
        return self._logits(local, dense)

    def batch(self, rows: I64, batch_id: int) -> KJTBatch:
        """Samples `rows` of this split (in that order) as a KJTBatch: one id per field.

        Raises:
            ValueError: If the rows span more than 16 chunks of consecutive samples.

        Shapes:
            rows: (B,) -> a batch of B samples, F ids each.
        """
        samples = rows.astype(np.int64) + self.first_sample
        local_BF = self.local_ids(samples)
        ids_BF = self._raw(local_BF) if self.raw_ids else local_BF
        dense, labels = self._dense_labels(samples, local_BF)
        return KJTBatch(
            keys=self.keys,
            values=np.ascontiguousarray(ids_BF.T).reshape(-1),  # feature-major
            lengths=np.ones(len(self.keys) * len(rows), dtype=np.int32),
            dense=dense,
            labels=labels,
            batch_id=batch_id,
        )

    def head(self, num_samples: int) -> CriteoStream:
        """The first `num_samples` samples of this split."""
        return CriteoStream(
            self.config,
            terabyte=self.terabyte,
            first_sample=self.first_sample,
            num_samples=min(num_samples, self.num_samples),
        )

    def materialize(self) -> RecsysData:
        """The whole split in RAM (for a test split: a few hundred thousand samples)."""
        samples = np.arange(self.first_sample, self.first_sample + self.num_samples)
        parts = [samples[i : i + CHUNK_SAMPLES] for i in range(0, len(samples), CHUNK_SAMPLES)]
        local = np.concatenate([self.local_ids(p) for p in parts])
        dense, labels = self._dense_labels(samples, local)
        ids = self._raw(local) if self.raw_ids else local
        data = RecsysData.from_columns(self.keys, self.num_embeddings, ids, dense, labels)
        return RecsysData(
            data.keys,
            data.num_embeddings,
            data.values,
            data.offsets,
            data.dense,
            data.labels,
            raw_ids=self.raw_ids,
        )

    def distinct_ids(self) -> int:
        """Distinct (field, id) pairs of the split (reads the whole stream once)."""
        seen: list[npt.NDArray[np.int64]] = [np.empty(0, np.int64) for _ in self.keys]
        start = self.first_sample
        stop = self.first_sample + self.num_samples
        while start < stop:
            end = min(stop, (start // CHUNK_SAMPLES + 1) * CHUNK_SAMPLES)
            local = self.local_ids(np.arange(start, end, dtype=np.int64))
            for f in range(len(self.keys)):
                seen[f] = np.union1d(seen[f], local[:, f])
            start = end
        return sum(len(s) for s in seen)
