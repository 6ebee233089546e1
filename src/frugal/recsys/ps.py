"""Embedding parameter-server shards on `frugal.store`, with per-row version clocks.

Rows are keyed by (table, id). An id's virtual shard is `splitmix64(id ^ table * GOLDEN) &
(V - 1)` with V = 1024; an `owners` table maps virtual shards to PS shards (default vshard mod
P), so a new shard count is a new owner table, not a rehash. Each PS shard keeps one
`EmbeddingStore` per table (rows = vector + sparse-optimizer state, the optimizer math of
`frugal.store.rows`), a version clock per row (updates applied) and a histogram of the lag
`version_now - version_read` of every pushed row: the real staleness of that read.

`DenseShard` holds a chunk of the flattened dense parameters for the `async` mode.

References:
    Persia: An Open, Hybrid System Scaling Deep Learning-based Recommenders up to 100
    Trillion Parameters, KDD 2022, arXiv 2111.05897 (section 4: embedding PS, sharding by
    hashed id; section 3: bounded staleness of the embedding reads).

Shape legend: U unique ids in a call, E embedding_dim, T tables, C dense chunk size.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor

from frugal.config import check_types
from frugal.store import EmbeddingStore, OptimizerConfig, RowSpec
from frugal.store.rows import splitmix64

__all__ = [
    "LAG_HISTOGRAM_BINS",
    "NUM_VIRTUAL_SHARDS",
    "DenseShard",
    "EmbeddingShard",
    "default_owners",
    "virtual_shard",
]

I64 = npt.NDArray[np.int64]
NUM_VIRTUAL_SHARDS = 1024
LAG_HISTOGRAM_BINS = 257  # lags 0..255, then one overflow bin
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def virtual_shard(table: int, ids: I64) -> I64:
    """Virtual shard of each (table, id): splitmix64(id ^ table * GOLDEN) & (V - 1).

    Shapes:
        ids: (N,) -> (N,).
    """
    with np.errstate(over="ignore"):
        key = ids.astype(np.uint64) ^ (np.uint64(table) * _GOLDEN)
    vshard: I64 = (splitmix64(key) & np.uint64(NUM_VIRTUAL_SHARDS - 1)).astype(np.int64)
    return vshard


def _budget_for_all_rows(num_rows: int, row_bytes: int) -> int:
    """A store budget whose cache holds every row of a table (the PS keeps tables in RAM).

    Mirrors `EmbeddingStore`'s accounting: id map 4 B/row, memory backend row_bytes + 1 per
    row, cache slot row_bytes + 30 B, I/O buffers budget / 8 (at least 16 KiB).
    """
    needed = 4 * num_rows + num_rows * (row_bytes + 1) + (num_rows + 64) * (row_bytes + 30)
    return max(needed * 8 // 7 + (1 << 20), 1 << 20)


def default_owners(num_shards: int) -> I64:
    """Owner PS shard of each virtual shard: vshard mod num_shards.

    Raises:
        ValueError: If `num_shards` is not in [1, 1024].
    """
    if not 1 <= num_shards <= NUM_VIRTUAL_SHARDS:
        raise ValueError(f"num_shards={num_shards} must be in [1, {NUM_VIRTUAL_SHARDS}]")
    return np.arange(NUM_VIRTUAL_SHARDS, dtype=np.int64) % num_shards


class _LagLog:
    """Histogram of per-row lags (0..255 + overflow) and the largest lag seen."""

    def __init__(self) -> None:
        self.hist = np.zeros(LAG_HISTOGRAM_BINS, dtype=np.int64)
        self.maximum = 0
        self.lock = threading.Lock()

    def record(self, lag: I64) -> int:
        """Add lags to the histogram; return their max (0 if none)."""
        if len(lag) == 0:
            return 0
        counts = np.bincount(np.minimum(lag, LAG_HISTOGRAM_BINS - 1), minlength=LAG_HISTOGRAM_BINS)
        top = int(lag.max())
        with self.lock:
            self.hist += counts
            self.maximum = max(self.maximum, top)
        return top


class EmbeddingShard:
    """One PS shard: a `frugal.store` store and a version clock per table.

    Reads are untracked (`EmbeddingStore.peek`): the PS bounds staleness with permits and
    measures it with version clocks, not with the store's read counting. A mutex per table
    makes every read see a push wholly or not at all.
    """

    @dataclass(frozen=True, kw_only=True, slots=True)
    class Config:
        """Settings of a PS shard."""

        embedding_dim: int = 8
        """Length E of every embedding row, >= 1."""
        optimizer: OptimizerConfig = field(
            default_factory=lambda: OptimizerConfig(kind="rowwise_adagrad", lr=0.05, eps=1e-10)
        )
        """Sparse optimizer applied by the shard (state kept in the row)."""
        backend: Literal["memory", "file"] = "memory"
        """`frugal.store` backend holding the rows."""
        seed: int = 0
        """Seed of the initial rows (table t uses seed + t, the same on every shard)."""

        def __post_init__(self) -> None:
            check_types(self)
            if self.embedding_dim < 1:
                raise ValueError(f"embedding_dim={self.embedding_dim} must be >= 1")

    def __init__(self, directory: Path, num_embeddings: tuple[int, ...], config: Config) -> None:
        """Create empty stores (one per table) under `directory`.

        Args:
            directory: A new or empty folder for this shard.
            num_embeddings: Rows of each table (ids lie in [0, rows)).
            config: Shard settings.
        """
        self.config = config
        spec = RowSpec(embedding_dim=config.embedding_dim, optimizer=config.optimizer)
        self.stores: list[EmbeddingStore] = []
        for t, rows in enumerate(num_embeddings):
            budget = _budget_for_all_rows(rows, spec.row_bytes)
            store_config = EmbeddingStore.Config(
                backend=config.backend,
                memory_budget_bytes=budget,
                staleness_bound=None,
                use_direct_io=False,
            )
            self.stores.append(
                EmbeddingStore.create(
                    directory / f"table{t}",
                    num_rows=rows,
                    spec=spec,
                    config=store_config,
                    seed=config.seed + t,
                )
            )
        self.versions = [np.zeros(rows, dtype=np.int64) for rows in num_embeddings]
        self.locks = [threading.Lock() for _ in num_embeddings]
        self.lags = _LagLog()

    def _split(self, counts: Tensor) -> list[tuple[int, int, int]]:
        bounds = np.concatenate([[0], np.cumsum(counts.numpy())])
        return [
            (t, int(bounds[t]), int(bounds[t + 1]))
            for t in range(len(self.stores))
            if bounds[t + 1] > bounds[t]
        ]

    def lookup(
        self, ids: Tensor, counts: Tensor, wire_dtype: torch.dtype = torch.float16
    ) -> tuple[Tensor, Tensor]:
        """Read rows and their versions.

        Args:
            ids: int64 ids grouped by table in table order, shape (U,).
            counts: int64 number of ids of each table, shape (T,).
            wire_dtype: Precision the rows travel in (float16, bfloat16 or float32).

        Returns:
            (rows (U, E) in `wire_dtype`, versions int64 (U,)).
        """
        ids_np = ids.numpy()
        rows_UE = np.empty((len(ids_np), self.config.embedding_dim), dtype=np.float32)
        versions = np.empty(len(ids_np), dtype=np.int64)
        for t, lo, hi in self._split(counts):
            with self.locks[t]:
                rows_UE[lo:hi] = self.stores[t].peek(ids_np[lo:hi], cols="emb")
                versions[lo:hi] = self.versions[t][ids_np[lo:hi]]
        return torch.from_numpy(rows_UE).to(wire_dtype), torch.from_numpy(versions)

    def push(
        self,
        ids: Tensor,
        counts: Tensor,
        grads: Tensor,
        versions_read: Tensor,
        scale: float,
        step: int,
    ) -> int:
        """Apply summed row gradients with the shard's optimizer; return the largest lag.

        Args:
            ids: int64 unique ids per table, grouped in table order, shape (U,).
            counts: int64 ids per table, shape (T,).
            grads: Gradients times `scale` (float16, bfloat16 or float32), shape (U, E).
            versions_read: The versions the rows had when they were read, int64 (U,).
            scale: Wire scale the gradients were multiplied by (divided out here, in fp32).
            step: Global batch id (store recency hint).

        Returns:
            max(version_now - version_read) over the pushed rows.

        Raises:
            NonFiniteError: If a gradient or update is not finite (nothing of that table is
                applied).
        """
        ids_np = ids.numpy()
        grads_UE = (grads.to(torch.float32) / scale).numpy()
        read = versions_read.numpy()
        top = 0
        for t, lo, hi in self._split(counts):
            with self.locks[t]:
                rows = ids_np[lo:hi]
                lag = self.versions[t][rows] - read[lo:hi]
                self.stores[t].apply_gradients(rows, np.ascontiguousarray(grads_UE[lo:hi]), step)
                self.versions[t][rows] += 1
            top = max(top, self.lags.record(lag))
        return top

    def peek_table(self, table: int, ids: I64) -> npt.NDArray[np.float32]:
        """Current vectors of `ids` in `table` (float32, (N, E)), for tests and export."""
        with self.locks[table]:
            return self.stores[table].peek(ids, cols="emb")

    def stats(self) -> dict[str, Any]:
        """The lag histogram (list, 257 bins), its max, and updates applied per table."""
        return {
            "lag_hist": self.lags.hist.tolist(),
            "lag_max": self.lags.maximum,
            "updates_applied": [int(v.sum()) for v in self.versions],
        }

    def close(self) -> None:
        """Close every store without a checkpoint (training state lives in checkpoints)."""
        for store in self.stores:
            store.close(checkpoint=False)


class DenseShard:
    """A chunk of the flattened dense parameters, updated by SGD pushes (async mode).

    Stale-synchronous rule: `pull` reports how many pushes every rank has had applied, so a
    client computes step t only once each rank's step t - K + 1 push is applied.
    """

    def __init__(self, params: Tensor, lr: float, world_size: int) -> None:
        """Hold `params` (float32 (C,)), applying `params -= lr * grad` per push."""
        self.params = params.detach().clone()
        self.lr = lr
        self.version = 0
        self.applied = [0] * world_size
        self.lock = threading.Lock()
        self.lags = _LagLog()

    def pull(self) -> tuple[Tensor, int, int]:
        """Return (params (C,), version, min pushes applied over ranks)."""
        with self.lock:
            return self.params.clone(), self.version, min(self.applied)

    def push(self, grad: Tensor, version_read: int, rank: int) -> int:
        """Apply one rank's gradient chunk (already divided by world_size); return its lag."""
        with self.lock:
            lag = self.version - version_read
            self.params.add_(grad.to(torch.float32), alpha=-self.lr)
            self.version += 1
            self.applied[rank] += 1
        self.lags.record(np.array([lag], dtype=np.int64))
        return lag
