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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor

from frugal._typing import I64
from frugal.config import check_types
from frugal.recsys.admission import CountMinSketch
from frugal.recsys.dense import DenseOptimizer
from frugal.recsys.errors import PSUnavailableError
from frugal.store import EmbeddingStore, OptimizerConfig, RowSpec
from frugal.store.keys import HashedKeys, KeySpaceFullError
from frugal.store.rows import splitmix64
from frugal.store.store import MIN_BUDGET_BYTES

__all__ = [
    "ID_BITS",
    "LAG_HISTOGRAM_BINS",
    "NUM_VIRTUAL_SHARDS",
    "DenseShard",
    "EmbeddingShard",
    "default_owners",
    "hash_raw_ids",
    "shard_capacity",
    "shard_memory_bytes",
    "split_capacity",
    "table_keys",
    "virtual_shard",
]

NUM_VIRTUAL_SHARDS = 1024
LAG_HISTOGRAM_BINS = 257  # lags 0..255, then one overflow bin
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
ID_BITS = 56  # a row key is (table << 56) | id
ID_MASK = np.int64((1 << ID_BITS) - 1)
MAX_TABLES = 128  # keys stay below 2^63


def table_keys(tables: I64, ids: I64) -> I64:
    """Store key of each (table, id): `(table << 56) | id` (ids in [0, 2^56), tables < 128).

    Shapes:
        tables, ids: (N,) -> (N,).
    """
    keys: I64 = (tables.astype(np.int64) << ID_BITS) | ids.astype(np.int64)
    return keys


def hash_raw_ids(ids: I64) -> I64:
    """Map raw 64-bit ids (any int64, e.g. feature hashes) into the PS id space [0, 2^56).

    splitmix64, keeping the top 56 bits: two of n distinct ids collide with probability
    about n^2 / 2^57 (one pair among 10^8 ids has odds of 7 %), as any hashed key space
    (Persia, Monolith) accepts.

    Shapes:
        ids: (N,) -> (N,) int64 in [0, 2^56).
    """
    hashed: I64 = (
        splitmix64(np.ascontiguousarray(ids, dtype=np.int64).view(np.uint64))
        >> np.uint64(64 - ID_BITS)
    ).astype(np.int64)
    return hashed


def shard_capacity(num_embeddings: tuple[int, ...], num_shards: int) -> int:
    """Rows a shard needs for tables of these sizes split over `num_shards` shards.

    Each table's rows spread over the shards by virtual shard (1024 hashed buckets), so a
    shard gets about 1/num_shards of each; 25 % slack plus 1024 rows covers the imbalance
    of small tables and of the bucket counts.

    Raises:
        ValueError: If `num_shards` < 1.
    """
    if num_shards < 1:
        raise ValueError(f"num_shards={num_shards} must be >= 1")
    total = sum(num_embeddings)
    return min(total, total * 5 // (4 * num_shards) + 1024)


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


def shard_memory_bytes(
    capacity_rows: int, row_bytes: int, memory_budget_bytes: int | None = None
) -> int:
    """RAM an `EmbeddingShard` of `capacity_rows` rows holds, bytes.

    Its store's memory budget (`memory_budget_bytes`, or None: sized to cache every row, see
    `_budget_for_all_rows`, plus the store's key map), plus the shard's per-row clocks
    (version and last push step, 16 B a row, indexed by the store's rows) and its
    changed-since-the-last-checkpoint flags (1 B a row).
    """
    store = (
        _budget_for_all_rows(capacity_rows, row_bytes) + HashedKeys.memory_bytes_for(capacity_rows)
        if memory_budget_bytes is None
        else memory_budget_bytes
    )
    return store + 17 * capacity_rows


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


class _DimGroup:
    """The rows of one embedding width in a PS shard: one hashed-key store, clocks, policies.

    `EmbeddingShard` holds one per distinct `embedding_dim` of its tables (one for most
    models) and routes each table's ids to its group; the methods here are the single-width
    shard's. A group's `config` is the shard's with its own `embedding_dim` and budget.
    """

    def __init__(
        self, directory: Path, num_tables: int, config: EmbeddingShard.Config, capacity_rows: int
    ) -> None:
        """An empty group (every row at its seeded initial value) under `directory`.

        Raises:
            ValueError: If the memory budget is below the store's minimum for this capacity
                (the error names the minimum).
        """
        self.config = config
        self.num_tables = num_tables
        self.capacity_rows = capacity_rows
        spec = RowSpec(embedding_dim=config.embedding_dim, optimizer=config.optimizer)
        out_of_core = config.memory_budget_bytes is not None
        budget = (
            config.memory_budget_bytes
            if config.memory_budget_bytes is not None
            else _budget_for_all_rows(capacity_rows, spec.row_bytes)
            + HashedKeys.memory_bytes_for(capacity_rows)
        )
        store_config = EmbeddingStore.Config(
            backend=config.backend,
            memory_budget_bytes=budget,
            staleness_bound=None,
            use_direct_io=out_of_core,
        )
        self.store = EmbeddingStore.create(
            directory,
            num_rows=capacity_rows,
            spec=spec,
            config=store_config,
            seed=config.seed,
            key_space="hashed",
        )
        self.row_width = spec.width
        assert self.store.keys is not None  # a hashed key space
        self._key_map = self.store.keys  # key -> store row; clocks below are per store row
        self._versions = np.zeros(capacity_rows, dtype=np.int64)
        self._last_push = np.zeros(capacity_rows, dtype=np.int64)  # step of the row's last push
        # Change tracking for incremental checkpoints: which store rows were written since
        # `clear_changes`, and the keys deleted since then (a row's flag dies with its key).
        self._changed = np.zeros(capacity_rows, dtype=bool)
        self._deleted_keys: list[I64] = []
        self._next_expiry_check = 0
        self._applied = np.zeros(num_tables, dtype=np.int64)  # row updates per table, ever
        self.lock = threading.Lock()
        self.lags = _LagLog()
        self._turn = 0  # next sequence number a sequenced push may apply
        self._turn_changed = threading.Condition(self.lock)
        self.sketch = (
            CountMinSketch(config.admission_sketch_width, seed=config.seed)
            if config.admit_after > 1
            else None
        )
        self.rejected_updates = 0
        """Row updates dropped because their id was not admitted yet."""
        self.expired_rows = 0
        """Rows deleted because they went unpushed for more than `expire_after_steps`."""
        self.evicted_rows = 0
        """Rows deleted to make room in a full shard (`when_full="evict_lru"`)."""

    def _keys(self, ids: I64, counts: I64) -> I64:
        if len(counts) != self.num_tables:
            raise ValueError(f"counts has {len(counts)} tables, the shard {self.num_tables}")
        if len(ids) and (ids.min() < 0 or ids.max() >= 1 << ID_BITS):
            bad = int(ids[(ids < 0) | (ids >= 1 << ID_BITS)][0])
            raise ValueError(f"id {bad} is outside [0, 2^{ID_BITS}); hash larger ids first")
        tables = np.repeat(np.arange(self.num_tables, dtype=np.int64), counts)
        return table_keys(tables, ids)

    def _versions_of(self, keys: I64) -> I64:
        rows = self._key_map.lookup(keys)
        versions: I64 = np.where(rows >= 0, self._versions[np.maximum(rows, 0)], 0)
        return versions

    def lookup(
        self,
        ids: Tensor,
        counts: Tensor,
        wire_dtype: torch.dtype = torch.float16,
        step: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        """`EmbeddingShard.lookup` for this width's tables."""
        keys = self._keys(ids.numpy(), counts.numpy())
        with self.lock:
            if step is None:
                rows_UE = self.store.peek(keys, cols="emb")
            else:  # rows written before through the cache; the others are initial values
                rows_UE = np.empty((len(keys), self.config.embedding_dim), dtype=np.float32)
                present = self._present(keys)
                rows_UE[present] = self.store.read(keys[present], step, cols="emb")
                rows_UE[~present] = self.store.peek(keys[~present], cols="emb")
            versions = self._versions_of(keys)
        return torch.from_numpy(rows_UE).to(wire_dtype), torch.from_numpy(versions)

    def _present(self, keys: I64) -> npt.NDArray[np.bool_]:
        """Which keys have a row in the store (were written), without inserting any."""
        present: npt.NDArray[np.bool_] = self._key_map.lookup(keys) >= 0
        return present

    def lookahead(self, ids: Tensor, counts: Tensor, step: int) -> None:
        """`EmbeddingShard.lookahead` for this width's tables."""
        keys = self._keys(ids.numpy(), counts.numpy())
        with self.lock:
            present = self._present(keys)
            if present.any():
                self.store.lookahead(keys[present], step)

    def push(
        self,
        ids: Tensor,
        counts: Tensor,
        grads: Tensor,
        versions_read: Tensor,
        scale: float,
        step: int,
        seq: int | None = None,
    ) -> int:
        """`EmbeddingShard.push` for this width's tables."""
        keys = self._keys(ids.numpy(), counts.numpy())
        grads_UE = np.ascontiguousarray((grads.to(torch.float32) / scale).numpy())
        read = versions_read.numpy()
        lag = np.empty(0, dtype=np.int64)
        with self.lock:
            if seq is not None and not self._turn_changed.wait_for(
                lambda: self._turn == seq, timeout=self.config.timeout_s
            ):
                raise PSUnavailableError(
                    f"sequenced push {seq} waited {self.config.timeout_s} s for push "
                    f"{self._turn} (a trainer is stuck or gone)"
                )
            try:
                # One key-map lookup serves the lags, admission and room: expiry and
                # eviction below spare the pushed keys, so their presence holds.
                rows_before = self._key_map.lookup(keys)
                present = rows_before >= 0
                if len(keys):
                    # A row deleted (expired, evicted) since it was read restarts at version
                    # 0: its lag counts as 0, the read value being gone.
                    versions = np.where(present, self._versions[np.maximum(rows_before, 0)], 0)
                    lag = np.maximum(versions - read, 0)
                    admitted = self._admit(keys, present)
                    keys, grads_UE, present = keys[admitted], grads_UE[admitted], present[admitted]
                self._expire(step, keys)
                if len(keys):
                    self._make_room(keys, present)
                    self.store.apply_gradients(keys, grads_UE, step)
                    rows = self._key_map.lookup(keys)
                    self._versions[rows] += 1
                    self._last_push[rows] = step
                    self._changed[rows] = True
                    self._applied += np.bincount(keys >> ID_BITS, minlength=self.num_tables)
            finally:
                if seq is not None:
                    self._turn += 1
                    self._turn_changed.notify_all()
        return self.lags.record(lag)

    def _delete(self, keys: I64) -> int:
        """Delete these present keys' rows from the store and clear their clocks (lock held)."""
        rows = self._key_map.lookup(keys)
        self._versions[rows] = 0
        self._last_push[rows] = 0
        self._changed[rows] = False
        self._deleted_keys.append(keys.copy())
        return self.store.delete(keys)

    def _expire(self, step: int, protect: I64) -> None:
        """Delete rows last pushed more than `expire_after_steps` before `step` (lock held).

        Scans the live rows once every max(1, T // 8) steps; `protect` (the keys being
        pushed now) stay.
        """
        after = self.config.expire_after_steps
        if after is None or step < self._next_expiry_check:
            return
        self._next_expiry_check = step + max(1, after // 8)
        live = self._key_map.live_rows()
        old = live[self._last_push[live] < step - after]
        if len(old) == 0:
            return
        keys = self._key_map.keys_by_row[old]
        keys = keys[~np.isin(keys, protect)]
        self.expired_rows += self._delete(keys)

    def _make_room(self, keys: I64, present: npt.NDArray[np.bool_]) -> None:
        """Before a push: evict least recently pushed rows if its new ids do not fit (lock held).

        `present`: which of `keys` have a row.

        Raises:
            KeySpaceFullError: If `when_full="error"` and the new ids do not fit.
        """
        new = np.unique(keys[~present])
        need = self._key_map.num_keys + len(new) - self.capacity_rows
        if need <= 0:
            return
        if self.config.when_full == "error":
            raise KeySpaceFullError(
                f"{len(new)} new ids do not fit the PS shard: {self._key_map.num_keys} of its "
                f"{self.capacity_rows} rows are taken; raise its capacity, admit fewer ids "
                '(admit_after), or let it evict (when_full="evict_lru", expire_after_steps)'
            )
        live = self._key_map.live_rows()
        live_keys = self._key_map.keys_by_row[live]
        candidates = ~np.isin(live_keys, keys)  # the ids of this push stay
        live, live_keys = live[candidates], live_keys[candidates]
        count = min(len(live), max(need, self.capacity_rows // 64))
        if count < need:
            raise KeySpaceFullError(
                f"a push of {len(new)} new ids needs {need} free rows but only {len(live)} "
                f"rows of the shard's {self.capacity_rows} are not in the push; raise its capacity"
            )
        order = np.lexsort((live_keys, self._last_push[live]))[:count]  # oldest first, by key
        self.evicted_rows += self._delete(live_keys[order])

    def _admit(self, keys: I64, present: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
        """Which pushed keys update a row: those with one, and new ones counted often enough.

        Counts a push of every key without a row (`present` False); the lock is held.
        """
        admitted = np.ones(len(keys), dtype=bool)
        if self.sketch is None:
            return admitted
        new = ~present
        if new.any():
            counts = self.sketch.add(keys[new])
            admitted[new] = counts >= self.config.admit_after
            self.rejected_updates += int(np.count_nonzero(~admitted))
        return admitted

    def peek_table(
        self, table: int, ids: I64, cols: Literal["emb", "all"] = "emb"
    ) -> npt.NDArray[np.float32]:
        """`EmbeddingShard.peek_table` for this width's tables."""
        keys = table_keys(np.full(len(ids), table, dtype=np.int64), ids)
        with self.lock:
            return self.store.peek(keys, cols=cols)

    def row_versions(self, table: int, ids: I64) -> I64:
        """Version clocks (updates applied) of `ids` in `table`, int64 (N,)."""
        keys = table_keys(np.full(len(ids), table, dtype=np.int64), ids)
        with self.lock:
            return self._versions_of(keys)

    def updated_rows(self) -> list[tuple[I64, npt.NDArray[np.float32], I64, I64]]:
        """`EmbeddingShard.updated_rows` for this width's tables."""
        with self.lock:
            live = self._key_map.live_rows()
            keys = self._key_map.keys_by_row[live]
            order = np.argsort(keys, kind="stable")
            keys, live = keys[order], live[order]
            versions, last_push = self._versions[live], self._last_push[live]
            rows = (
                self.store.peek(keys, cols="all")
                if len(keys)
                else np.empty((0, self.row_width), np.float32)
            )
        tables = keys >> ID_BITS
        bounds = np.searchsorted(tables, np.arange(self.num_tables + 1))
        out = []
        for t in range(self.num_tables):
            lo, hi = int(bounds[t]), int(bounds[t + 1])
            out.append((keys[lo:hi] & ID_MASK, rows[lo:hi], versions[lo:hi], last_push[lo:hi]))
        return out

    def row_clocks(self, *, changed_only: bool = False) -> list[tuple[I64, I64, I64]]:
        """`EmbeddingShard.row_clocks` for this width's tables."""
        with self.lock:
            live = self._key_map.live_rows()
            if changed_only:
                live = live[self._changed[live]]
            keys = self._key_map.keys_by_row[live]
            order = np.argsort(keys, kind="stable")
            keys, live = keys[order], live[order]
            versions, last_push = self._versions[live], self._last_push[live]
        bounds = np.searchsorted(keys >> ID_BITS, np.arange(self.num_tables + 1))
        return [
            (keys[lo:hi] & ID_MASK, versions[lo:hi], last_push[lo:hi])
            for lo, hi in pairwise(bounds.tolist())
        ]

    def deleted_ids(self) -> list[I64]:
        """`EmbeddingShard.deleted_ids` for this width's tables."""
        with self.lock:
            keys = (
                np.unique(np.concatenate(self._deleted_keys))
                if self._deleted_keys
                else np.empty(0, dtype=np.int64)
            )
            keys = keys[~self._present(keys)]
        bounds = np.searchsorted(keys >> ID_BITS, np.arange(self.num_tables + 1))
        return [keys[lo:hi] & ID_MASK for lo, hi in pairwise(bounds.tolist())]

    def clear_changes(self) -> None:
        """Forget the changes tracked so far: a checkpoint now holds every row as it is."""
        with self.lock:
            self._changed[:] = False
            self._deleted_keys = []

    def policy_state(self) -> dict[str, npt.NDArray[Any]]:
        """`EmbeddingShard.policy_state` for this width's tables."""
        with self.lock:
            state: dict[str, npt.NDArray[Any]] = {
                "expiry_check": np.array([self._next_expiry_check], dtype=np.int64)
            }
            if self.sketch is not None:
                state["sketch"] = self.sketch.counts.copy()
            return state

    def load_policy_state(self, states: list[dict[str, npt.NDArray[Any]]]) -> None:
        """`EmbeddingShard.load_policy_state` for this width's tables."""
        with self.lock:
            checks = [int(s["expiry_check"][0]) for s in states if "expiry_check" in s]
            if checks:
                self._next_expiry_check = min(checks)
            sketches = [s["sketch"] for s in states if "sketch" in s]
            if self.sketch is None or not sketches:
                return
            for counts in sketches:
                if counts.shape != self.sketch.counts.shape:
                    raise ValueError(
                        f"the checkpoint's admission sketch is {counts.shape}, this shard's "
                        f"{self.sketch.counts.shape}; resume with the same admission_sketch_width"
                    )
            total = np.sum([c.astype(np.int64) for c in sketches], axis=0)
            self.sketch.counts[:] = np.minimum(total, np.iinfo(np.uint16).max)

    def delete_rows(self, table: int, ids: I64) -> int:
        """`EmbeddingShard.delete_rows` for this width's tables."""
        keys = table_keys(np.full(len(ids), table, dtype=np.int64), ids)
        with self.lock:
            keys = keys[self._present(keys)]
            return self._delete(keys) if len(keys) else 0

    def load_rows(
        self,
        table: int,
        ids: I64,
        rows: npt.NDArray[np.float32],
        versions: I64,
        last_push: I64 | int = 0,
    ) -> None:
        """`EmbeddingShard.load_rows` for this width's tables."""
        keys = table_keys(np.full(len(ids), table, dtype=np.int64), ids)
        with self.lock:
            self.store.put(keys, np.ascontiguousarray(rows, dtype=np.float32))
            store_rows = self._key_map.lookup(keys)
            # the updates the rows carry, less those of the rows they overwrite (a replayed
            # checkpoint chain loads a row once per checkpoint that changed it)
            self._applied[table] += int(np.sum(versions)) - int(self._versions[store_rows].sum())
            self._versions[store_rows] = versions
            self._last_push[store_rows] = last_push
            self._changed[store_rows] = True

    def stats(self) -> dict[str, Any]:
        """`EmbeddingShard.stats` for this width's tables."""
        with self.lock:
            applied = self._applied.copy()
            store = self.store.stats()
        return {
            "lag_hist": self.lags.hist.tolist(),
            "lag_max": self.lags.maximum,
            "updates_applied": [int(v) for v in applied],
            "rejected_updates": self.rejected_updates,
            "expired_rows": self.expired_rows,
            "evicted_rows": self.evicted_rows,
            "live_rows": int(self._key_map.num_keys),
            "store": {
                key: store[key]
                for key in (
                    "capacity_rows",
                    "memory_budget_bytes",
                    "direct_io",
                    "hits",
                    "misses",
                    "hit_ratio",
                    "prefetched",
                    "bytes_read",
                    "bytes_written",
                    "stall_s",
                )
            },
        }

    def close(self) -> None:
        """Close the store without a checkpoint (training state lives in checkpoints)."""
        self.store.close(checkpoint=False)


class EmbeddingShard:
    """One PS shard: a hashed-key `frugal.store` store per embedding width, and version clocks.

    A row's key is `(table << 56) | id`, so ids may be any integer in [0, 2^56) (no table size
    needs to be known: the store's `key_space="hashed"` gives each new key a row on first
    write, up to `capacity_rows`). One store and one mutex for all tables of one width (most
    models have one): a lookup or a push is one vectorised store call per width, and a read
    sees a push to a width wholly or not at all. Reads are
    untracked (`EmbeddingStore.peek`, never inserting): the PS bounds staleness with permits and
    measures it with version clocks (updates applied per row, one per store row).

    `push(..., seq=n)` applies pushes in sequence order (push n waits for push n - 1): sync
    trainers number their pushes `step * world_size + rank`, so every run applies them in
    the same order and is bit-reproducible.
    """

    @dataclass(frozen=True, kw_only=True, slots=True)
    class Config:
        """Settings of a PS shard."""

        embedding_dim: int = 8
        """Length E of every embedding row, >= 1 (of every table `table_dims` leaves out)."""
        table_dims: tuple[int, ...] = ()
        """Embedding width of each table, each >= 1, one per table (empty: `embedding_dim`
        for all). Tables of one width share a store; each width has its own."""
        optimizer: OptimizerConfig = field(
            default_factory=lambda: OptimizerConfig(kind="rowwise_adagrad", lr=0.05, eps=1e-10)
        )
        """Sparse optimizer applied by the shard (state kept in the row)."""
        backend: Literal["memory", "file"] = "memory"
        """`frugal.store` backend holding the rows."""
        memory_budget_bytes: int | None = None
        """Memory budget of the shard's store (cache, key map and I/O buffers), bytes; None
        sizes the cache to hold every row. With a budget the rows live on disk (`backend`
        must be "file", read with direct I/O) and the cache holds what fits; lookahead
        hints (`lookahead`) prefetch the rows of coming batches."""
        seed: int = 0
        """Seed of the initial rows (a row's value depends on its (table, id) key only)."""
        admit_after: int = 1
        """Pushes of an id before it takes a row, >= 1 (1: every id on its first push).
        Until then its lookups read the initial value and its gradients are dropped; the
        counts are a count-min sketch's (`frugal.recsys.admission`), so an id may be admitted
        early when all its counters collide, never late."""
        admission_sketch_width: int = 1 << 20
        """Counters per row of the admission sketch (4 rows of uint16: 8 MiB at 2^20), a
        power of two; used when admit_after > 1."""
        expire_after_steps: int | None = None
        """Delete rows not pushed for more than this many push steps (the `step` of `push`:
        a trainer's batch id, world_size per training step), >= 1; None keeps every row. An
        expired id reads its initial value again and its row is free for new ids. Checked
        every max(1, expire_after_steps // 8) steps, so a row lives at most 1.125x that
        long unseen."""
        when_full: Literal["error", "evict_lru"] = "error"
        """What a push of new ids into a full shard does: "error" raises
        `KeySpaceFullError`; "evict_lru" deletes the rows pushed least recently (at least
        1/64 of the capacity at once, to amortise the scan) and goes on."""
        timeout_s: float = 60.0
        """Longest wait of a sequenced push for the one before it, > 0."""

        def __post_init__(self) -> None:
            check_types(self)
            if self.embedding_dim < 1:
                raise ValueError(f"embedding_dim={self.embedding_dim} must be >= 1")
            if any(dim < 1 for dim in self.table_dims):
                raise ValueError(f"table_dims={list(self.table_dims)} must all be >= 1")
            if self.timeout_s <= 0:
                raise ValueError(f"timeout_s={self.timeout_s} must be > 0")
            if self.admit_after < 1:
                raise ValueError(
                    f"admit_after={self.admit_after} must be >= 1 (1 admits every id on its "
                    "first push)"
                )
            if self.expire_after_steps is not None and self.expire_after_steps < 1:
                raise ValueError(
                    f"expire_after_steps={self.expire_after_steps} must be >= 1, or None to "
                    "keep rows however long they go unseen"
                )
            width = self.admission_sketch_width
            if width < 16 or width & (width - 1):
                raise ValueError(
                    f"admission_sketch_width={width} must be a power of two >= 16 (e.g. {1 << 20})"
                )
            if self.memory_budget_bytes is not None:
                if self.memory_budget_bytes < 1:
                    raise ValueError(
                        f"memory_budget_bytes={self.memory_budget_bytes} must be >= 1 (or None "
                        "to hold every row in RAM)"
                    )
                if self.backend != "file":
                    raise ValueError(
                        f"memory_budget_bytes={self.memory_budget_bytes} needs backend='file' "
                        f"(backend={self.backend!r} keeps every row in RAM whatever the budget)"
                    )

    def __init__(
        self,
        directory: Path,
        num_embeddings: tuple[int, ...],
        config: Config,
        *,
        capacity_rows: int | None = None,
    ) -> None:
        """Create an empty shard (every row at its seeded initial value) under `directory`.

        Tables of one embedding width share one store (in `directory`, or in
        `directory/dim{E}` when the tables have several widths), as TorchRec groups tables by
        width; `capacity_rows` and the memory budget split over the widths by their tables'
        declared rows (`split_capacity`) and bytes.

        Args:
            directory: A new or empty folder for this shard.
            num_embeddings: Rows of each table; its length is the table count T, in [1, 128].
                The sizes set the default capacity and its split over widths: ids are not
                range-checked here.
            config: Shard settings.
            capacity_rows: Distinct (table, id) rows the shard can hold, >= 1 (None: the sum
                of `num_embeddings`); a new row beyond a width's share raises
                `KeySpaceFullError` (or evicts, see `Config.when_full`).

        Raises:
            ValueError: If the table count, `table_dims` or `capacity_rows` is out of range,
                or the memory budget is below the store's minimum for this capacity (the
                error names the minimum).
        """
        num_tables = len(num_embeddings)
        if not 1 <= num_tables <= MAX_TABLES:
            raise ValueError(f"num_tables={num_tables} must be in [1, {MAX_TABLES}]")
        if capacity_rows is not None and capacity_rows < 1:
            raise ValueError(f"capacity_rows={capacity_rows} must be >= 1")
        dims = config.table_dims or (config.embedding_dim,) * num_tables
        if len(dims) != num_tables:
            raise ValueError(
                f"table_dims has {len(dims)} widths for {num_tables} tables; give one per table"
            )
        self.config = config
        self.num_tables = num_tables
        self.table_dims: tuple[int, ...] = tuple(dims)
        """Embedding width of each table."""
        capacities = split_capacity(num_embeddings, self.table_dims, capacity_rows)
        widths = {
            dim: RowSpec(embedding_dim=dim, optimizer=config.optimizer).row_bytes
            for dim in capacities
        }
        budgets = _split_budget(
            config.memory_budget_bytes, {dim: capacities[dim] * widths[dim] for dim in capacities}
        )
        self.groups: list[_DimGroup] = []
        self._group_of_table = np.empty(num_tables, dtype=np.int64)
        for g, dim in enumerate(sorted(capacities)):
            budget = budgets[dim]
            group_config = replace(
                config, embedding_dim=dim, table_dims=(), memory_budget_bytes=budget
            )
            where = directory if len(capacities) == 1 else directory / f"dim{dim}"
            try:
                self.groups.append(_DimGroup(where, num_tables, group_config, capacities[dim]))
            except ValueError as exc:
                if len(capacities) == 1:
                    raise
                raise ValueError(
                    f"the tables of embedding_dim {dim} get {budget} of the shard's "
                    f"{config.memory_budget_bytes} budget bytes (their share of the rows' "
                    f"bytes): {exc}"
                ) from exc
            self._group_of_table[[t for t in range(num_tables) if dims[t] == dim]] = g
        self.capacity_rows = sum(group.capacity_rows for group in self.groups)
        """Rows the shard can hold, all widths together."""
        self.row_widths: tuple[int, ...] = tuple(
            self.groups[self._group_of_table[t]].row_width for t in range(num_tables)
        )
        """Floats of each table's rows (vector + optimizer state), as checkpoints hold them."""

    def _group(self, table: int) -> _DimGroup:
        if not 0 <= table < self.num_tables:
            raise ValueError(f"table={table} is outside [0, {self.num_tables})")
        return self.groups[int(self._group_of_table[table])]

    def _split(self, counts: I64) -> list[tuple[npt.NDArray[np.bool_], I64]]:
        """Per group, which of the ids (grouped by table) are its tables', and its counts."""
        if len(counts) != self.num_tables:
            raise ValueError(f"counts has {len(counts)} tables, the shard {self.num_tables}")
        out = []
        for g in range(len(self.groups)):
            mine = self._group_of_table == g
            out.append((np.repeat(mine, counts), np.where(mine, counts, 0)))
        return out

    def lookup(
        self,
        ids: Tensor,
        counts: Tensor,
        wire_dtype: torch.dtype = torch.float16,
        step: int | None = None,
    ) -> tuple[Tensor | list[Tensor], Tensor]:
        """Read rows and their versions (rows never written read as their initial value).

        Args:
            ids: int64 ids grouped by table in table order, shape (U,).
            counts: int64 number of ids of each table, shape (T,).
            wire_dtype: Precision the rows travel in (float16, bfloat16 or float32).
            step: The training step reading them (the step its `lookahead` named): the
                store's cache counts hits and misses and uses up the step's hints. None (an
                evaluation read) touches no hint and counts nothing.

        Returns:
            (rows, versions int64 (U,)). With one width, rows is (U, E) in `wire_dtype`;
            with several, a list whose `rows[g]` (U_g, E_g) holds the rows of the ids whose
            table has the g-th smallest width, in their order in `ids`.
        """
        if len(self.groups) == 1:
            return self.groups[0].lookup(ids, counts, wire_dtype, step)
        versions_U = torch.zeros(len(ids), dtype=torch.int64)
        rows_out = []
        for group, (mask, group_counts) in zip(
            self.groups, self._split(counts.numpy()), strict=True
        ):
            picked = torch.from_numpy(mask)
            rows, versions = group.lookup(
                ids[picked], torch.from_numpy(group_counts), wire_dtype, step
            )
            rows_out.append(rows)
            versions_U[picked] = versions
        return rows_out, versions_U

    def lookahead(self, ids: Tensor, counts: Tensor, step: int) -> None:
        """Hint that the rows of `ids` will be looked up at `step`; the store prefetches them.

        Rows never written have nothing on disk and are skipped. Never changes a value.

        Args:
            ids: int64 ids grouped by table in table order, shape (U,).
            counts: int64 number of ids of each table, shape (T,).
            step: The step whose lookup will read them, >= 0.
        """
        if len(self.groups) == 1:
            self.groups[0].lookahead(ids, counts, step)
            return
        for group, (mask, group_counts) in zip(
            self.groups, self._split(counts.numpy()), strict=True
        ):
            if mask.any():
                group.lookahead(ids[torch.from_numpy(mask)], torch.from_numpy(group_counts), step)

    def push(
        self,
        ids: Tensor,
        counts: Tensor,
        grads: Tensor | Sequence[Tensor],
        versions_read: Tensor,
        scale: float,
        step: int,
        seq: int | None = None,
    ) -> int:
        """Apply summed row gradients with the shard's optimizer; return the largest lag.

        Args:
            ids: int64 unique ids per table, grouped in table order, shape (U,).
            counts: int64 ids per table, shape (T,).
            grads: Gradients times `scale` (float16, bfloat16 or float32), shaped as `lookup`
                returns rows: (U, E) with one width, else one (U_g, E_g) tensor per width.
            versions_read: The versions the rows had when they were read, int64 (U,).
            scale: Wire scale the gradients were multiplied by (divided out here, in fp32).
            step: Global batch id (store recency hint).
            seq: Sequence number (None: apply on arrival). Sequenced pushes are applied in
                the order 0, 1, 2, ...: push n waits for push n - 1 (in every group).

        Returns:
            max(version_now - version_read) over the pushed rows (0 if none).

        Raises:
            ValueError: If `grads` has not one tensor per width group.
            NonFiniteError: If a gradient or update is not finite (nothing is applied).
            PSUnavailableError: If push `seq - 1` does not arrive within the timeout.
        """
        if isinstance(grads, Tensor):
            grads = [grads]
        if len(grads) != len(self.groups):
            raise ValueError(
                f"grads has {len(grads)} tensors for the shard's {len(self.groups)} embedding "
                "widths; send one per width, as lookup returns rows"
            )
        if len(self.groups) == 1:
            return self.groups[0].push(ids, counts, grads[0], versions_read, scale, step, seq)
        lag = 0
        for group, grads_g, (mask, group_counts) in zip(
            self.groups, grads, self._split(counts.numpy()), strict=True
        ):
            picked = torch.from_numpy(mask)
            if seq is None and not mask.any():
                continue
            lag = max(
                lag,
                group.push(
                    ids[picked],
                    torch.from_numpy(group_counts),
                    grads_g,
                    versions_read[picked],
                    scale,
                    step,
                    seq,
                ),
            )
        return lag

    def peek_table(
        self, table: int, ids: I64, cols: Literal["emb", "all"] = "emb"
    ) -> npt.NDArray[np.float32]:
        """Current rows of `ids` in `table` (tests and export).

        Shapes:
            returns: float32 (N, E_table), or (N, W_table) with the optimizer state for
            cols="all".
        """
        return self._group(table).peek_table(table, ids, cols)

    def row_versions(self, table: int, ids: I64) -> I64:
        """Version clocks (updates applied) of `ids` in `table`, int64 (N,)."""
        return self._group(table).row_versions(table, ids)

    def _per_table(self, per_group: list[list[Any]]) -> list[Any]:
        return [per_group[int(self._group_of_table[t])][t] for t in range(self.num_tables)]

    def updated_rows(self) -> list[tuple[I64, npt.NDArray[np.float32], I64, I64]]:
        """Per table, the rows updated at least once and not deleted since.

        Each table's entry is (ids sorted, rows (N, W_table), versions (N,), last push steps
        (N,)). Rows hold the vector and the optimizer state (width `row_widths[table]`).
        Call it while no push is in flight for a consistent snapshot.
        """
        return self._per_table([group.updated_rows() for group in self.groups])

    def row_clocks(self, *, changed_only: bool = False) -> list[tuple[I64, I64, I64]]:
        """Per table, the ids of the live rows with their version clocks and last pushes.

        Read the rows themselves with `peek_table(table, ids, cols="all")`, a chunk at a time
        (a checkpoint streams them this way). Call it while no push is in flight.

        Args:
            changed_only: Only the rows written (pushed or loaded) since `clear_changes`.

        Returns:
            Per table, (ids sorted, versions, last push steps), each int64 (N,).
        """
        return self._per_table(
            [group.row_clocks(changed_only=changed_only) for group in self.groups]
        )

    def deleted_ids(self) -> list[I64]:
        """Per table, the ids deleted (expired, evicted) since `clear_changes` and absent now.

        An id deleted and pushed again since is live, so `row_clocks` lists it instead.

        Returns:
            Per table, sorted unique ids, int64.
        """
        return self._per_table([group.deleted_ids() for group in self.groups])

    def clear_changes(self) -> None:
        """Forget the changes tracked so far: a checkpoint now holds every row as it is."""
        for group in self.groups:
            group.clear_changes()

    def policy_state(self) -> dict[str, npt.NDArray[Any]]:
        """What expiry and admission decide with besides the rows: for checkpoints.

        Keys: `expiry_check` (int64 (1,), the push step of the next expiry scan) and, with
        admission on, `sketch` (uint16 (depth, width), the count-min counters); with several
        widths, each group's keys prefixed by `dim{E}.`.
        """
        if len(self.groups) == 1:
            return self.groups[0].policy_state()
        return {
            f"dim{group.config.embedding_dim}.{key}": value
            for group in self.groups
            for key, value in group.policy_state().items()
        }

    def load_policy_state(self, states: list[dict[str, npt.NDArray[Any]]]) -> None:
        """Restore `policy_state()` from one or several shards' checkpointed states.

        One state (this shard's, same shard count) is taken as it is; several (another shard
        count) merge as the earliest expiry scan and the counters summed, saturating
        (admission may then come earlier, never later).

        Raises:
            ValueError: If a sketch's shape differs from this shard's (another
                `admission_sketch_width`).
        """
        if len(self.groups) == 1:
            self.groups[0].load_policy_state(states)
            return
        for group in self.groups:
            prefix = f"dim{group.config.embedding_dim}."
            group.load_policy_state(
                [
                    {
                        key[len(prefix) :]: value
                        for key, value in state.items()
                        if key.startswith(prefix)
                    }
                    for state in states
                ]
            )

    def delete_rows(self, table: int, ids: I64) -> int:
        """Delete the rows of `ids` in `table` that exist (replaying a checkpoint's deletions).

        Returns:
            Rows deleted (ids without a row are skipped).
        """
        return self._group(table).delete_rows(table, ids)

    def load_rows(
        self,
        table: int,
        ids: I64,
        rows: npt.NDArray[np.float32],
        versions: I64,
        last_push: I64 | int = 0,
    ) -> None:
        """Overwrite rows (vector + optimizer state, (N, W)), version clocks and last pushes.

        Args:
            table: The table of `ids`.
            ids: Unique ids, (N,).
            rows: Vector + optimizer state, float32 (N, W) with W = `row_widths[table]`.
            versions: Updates applied to each row, int64 (N,).
            last_push: Step of each row's last push (for `expire_after_steps`), (N,) or
                one step for all.

        Raises:
            ValueError: If the rows are not `row_widths[table]` wide or ids repeat.
            KeySpaceFullError: If the shard has no free row left.
        """
        self._group(table).load_rows(table, ids, rows, versions, last_push)

    @property
    def rejected_updates(self) -> int:
        """Row updates dropped because their id was not admitted yet."""
        return sum(group.rejected_updates for group in self.groups)

    @property
    def expired_rows(self) -> int:
        """Rows deleted because they went unpushed for more than `expire_after_steps`."""
        return sum(group.expired_rows for group in self.groups)

    @property
    def evicted_rows(self) -> int:
        """Rows deleted to make room in a full shard (`when_full="evict_lru"`)."""
        return sum(group.evicted_rows for group in self.groups)

    def stats(self) -> dict[str, Any]:
        """The lag histogram, its max, updates applied per table, and the store's cache.

        Keys: lag_hist (list, 257 bins), lag_max, updates_applied (per table),
        rejected_updates (of ids not admitted yet, see `Config.admit_after`), expired_rows
        and evicted_rows (deleted by `expire_after_steps` and `when_full`), live_rows, and store:
        capacity_rows, memory_budget_bytes, direct_io, hits, misses, hit_ratio, prefetched
        (rows), bytes_read, bytes_written, stall_s (time lookups waited for disk); with
        several widths, the sums over their stores (hit_ratio of the sums).
        """
        parts = [group.stats() for group in self.groups]
        if len(parts) == 1:
            return parts[0]
        out = dict(parts[0])
        out["lag_hist"] = np.sum([p["lag_hist"] for p in parts], axis=0).tolist()
        out["lag_max"] = max(p["lag_max"] for p in parts)
        out["updates_applied"] = np.sum([p["updates_applied"] for p in parts], axis=0).tolist()
        for key in ("rejected_updates", "expired_rows", "evicted_rows", "live_rows"):
            out[key] = sum(p[key] for p in parts)
        store = {key: sum(p["store"][key] for p in parts) for key in parts[0]["store"]}
        store["direct_io"] = any(p["store"]["direct_io"] for p in parts)
        looked = store["hits"] + store["misses"]
        store["hit_ratio"] = store["hits"] / looked if looked else 1.0
        if any(p["store"]["memory_budget_bytes"] is None for p in parts):
            store["memory_budget_bytes"] = None
        out["store"] = store
        return out

    def close(self) -> None:
        """Close the stores without a checkpoint (training state lives in checkpoints)."""
        for group in self.groups:
            group.close()


def _split_budget(budget: int | None, rows_bytes: dict[int, int]) -> dict[int, int | None]:
    """Each width's part of a shard's memory budget: its share of the rows' bytes.

    Every store needs at least `MIN_BUDGET_BYTES`: a width whose share is smaller gets that
    floor, and the others split what is left by their rows' bytes.

    Raises:
        ValueError: If the budget is below the floors of all widths together (names the
            smallest budget then accepted).
    """
    if budget is None or len(rows_bytes) == 1:
        return dict.fromkeys(rows_bytes, budget)
    floor = MIN_BUDGET_BYTES
    if budget < floor * len(rows_bytes):
        raise ValueError(
            f"memory_budget_bytes={budget} is below the {len(rows_bytes)} embedding widths' "
            f"stores' minimum of {floor} bytes each; set it to at least "
            f"{floor * len(rows_bytes)} (or use fewer widths)"
        )
    floored: dict[int, int | None] = {}
    rest = dict(rows_bytes)
    while rest:  # floor the smallest shares until every share left is above the floor
        left = budget - sum(b for b in floored.values() if b is not None)
        total = sum(rest.values()) or 1
        small = [dim for dim, b in rest.items() if left * b // total < floor]
        if not small:
            floored |= {dim: left * b // total for dim, b in rest.items()}
            break
        for dim in small:
            floored[dim] = floor
            del rest[dim]
    return floored


def split_capacity(
    num_embeddings: tuple[int, ...], table_dims: tuple[int, ...], capacity_rows: int | None
) -> dict[int, int]:
    """Rows of a shard's capacity each embedding width gets: its tables' share of the rows.

    Args:
        num_embeddings: Declared rows of each table (T,).
        table_dims: Embedding width of each table (T,).
        capacity_rows: The shard's capacity, >= 1, or None for the sum of the sizes.

    Returns:
        {embedding_dim: rows}, each >= 1; with one width, that width gets `capacity_rows`.
    """
    declared: dict[int, int] = {}
    for rows, dim in zip(num_embeddings, table_dims, strict=True):
        declared[dim] = declared.get(dim, 0) + max(int(rows), 0)
    if capacity_rows is None:
        return {dim: max(1, rows) for dim, rows in declared.items()}
    if len(declared) == 1:
        return dict.fromkeys(declared, capacity_rows)
    total = sum(declared.values())
    if total == 0:  # no sizes declared: split evenly
        return dict.fromkeys(declared, max(1, capacity_rows // len(declared)))
    return {dim: max(1, capacity_rows * rows // total) for dim, rows in declared.items()}


class DenseShard:
    """A chunk of the flattened dense parameters, stepped by its own optimizer (async mode).

    Every push is one optimizer step on the chunk (as an asynchronous PS applies each worker's
    update): with Adam the chunk keeps its own moments and step count, so it takes
    world_size Adam steps per training step. Stale-synchronous rule: `pull` reports how many
    pushes every rank has had applied, so a client computes step t only once each rank's step
    t - K + 1 push is applied.
    """

    def __init__(
        self,
        params: Tensor,
        world_size: int,
        *,
        optimizer: Callable[[Sequence[Tensor]], DenseOptimizer],
    ) -> None:
        """Hold a copy of `params` (float32 (C,)), stepped per push by `optimizer([params])`.

        Args:
            params: The chunk's initial values, float32 (C,).
            world_size: Ranks that push.
            optimizer: Builds the chunk's optimizer over the one tensor it is given (e.g.
                `functools.partial(build_dense_optimizer, kind="adam", lr=1e-3)`).
        """
        self.params = params.detach().clone()
        self.optimizer = optimizer([self.params])
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
            self.params.grad = grad.to(torch.float32)
            try:
                self.optimizer.step()
            finally:
                self.params.grad = None
            self.version += 1
            self.applied[rank] += 1
        self.lags.record(np.array([lag], dtype=np.int64))
        return lag

    def optimizer_state_dict(self) -> dict[str, Any]:
        """The chunk optimizer's `state_dict()` (call while no push is in flight)."""
        with self.lock:
            return self.optimizer.state_dict()

    def load_optimizer_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the chunk optimizer's state (`frugal.recsys.dense.chunk_state` of a model's)."""
        with self.lock:
            self.optimizer.load_state_dict(state_dict)
