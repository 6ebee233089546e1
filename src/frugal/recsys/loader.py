"""A trainer's batches: a sample cursor over seeded per-epoch permutations."""

from __future__ import annotations

from typing import Any

import numpy as np

from frugal.recsys.batch import KJTBatch, RecsysSplit
from frugal.recsys.config import RecsysTrainConfig

__all__ = ["BatchSource", "count_total_samples"]


def count_total_samples(config: RecsysTrainConfig, num_samples: int, world_size: int) -> int:
    """Samples a fresh job consumes: whole steps of batch_size * world_size over all epochs."""
    step_samples = config.batch_size * world_size
    if num_samples < step_samples:
        raise ValueError(
            f"{num_samples} training samples < batch_size {config.batch_size} x world_size "
            f"{world_size}; lower batch_size or nproc"
        )
    total = config.epochs * num_samples // step_samples * step_samples
    if config.max_steps is not None:
        total = min(total, config.max_steps * step_samples)
    return total


class BatchSource:
    """This rank's batches from a sample cursor over seeded per-epoch permutations.

    Global sample g is `perm(g // S)[g % S]` (`g % S` for a split that is not shuffled, e.g.
    a generated stream); step s of rank r takes samples `start + (s * W + r) * B + [0, B)`.
    The cursor (samples consumed) is what a checkpoint stores, so a job resumes on any world
    size.
    """

    def __init__(
        self,
        data: RecsysSplit,
        config: RecsysTrainConfig,
        rank: int,
        world_size: int,
        start_sample: int = 0,
        total_samples: int | None = None,
    ):
        self.data, self.config, self.rank, self.world_size = data, config, rank, world_size
        self.step_samples = config.batch_size * world_size
        self.total_samples = (
            count_total_samples(config, data.num_samples, world_size)
            if total_samples is None
            else total_samples
        )
        self.start_sample = start_sample
        self.num_steps = max(0, (self.total_samples - start_sample) // self.step_samples)
        self._perms: dict[int, np.ndarray[Any, np.dtype[np.int64]]] = {}

    def _perm(self, epoch: int) -> np.ndarray[Any, np.dtype[np.int64]]:
        if epoch not in self._perms:
            if len(self._perms) >= 2:
                self._perms.pop(min(self._perms))
            rng = np.random.default_rng([self.config.seed, 7, epoch])
            self._perms[epoch] = rng.permutation(self.data.num_samples).astype(np.int64)
        return self._perms[epoch]

    def samples_done(self, steps: int) -> int:
        """The cursor after `steps` steps of this run."""
        return self.start_sample + steps * self.step_samples

    def batch(self, step: int) -> KJTBatch:
        """This rank's validated batch of `step` (counted from this run's start).

        Raises:
            BadBatchError: If the batch fails validation.
        """
        size = self.config.batch_size
        first = self.start_sample + step * self.step_samples + self.rank * size
        index = first + np.arange(size, dtype=np.int64)
        epoch = index // self.data.num_samples
        within = index % self.data.num_samples
        rows = np.empty(size, dtype=np.int64)
        if not self.data.shuffle:
            rows = within
        for e in np.unique(epoch) if self.data.shuffle else ():  # at most two epochs per batch
            mask = epoch == e
            rows[mask] = self._perm(int(e))[within[mask]]
        batch = self.data.batch(rows, batch_id=first // size)
        batch.validate(self.data.num_embeddings, raw_ids=self.data.raw_ids)
        return batch
