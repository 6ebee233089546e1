"""Offline reference caches for a batched access trace: LRU and Belady's optimal policy.

They bracket an eviction policy: on demand fetching, LRU <= a good policy <= Belady (MIN),
which evicts the row whose next use is farthest (Belady, "A study of replacement algorithms
for a virtual-storage computer", IBM Systems Journal 1966). Accesses come in batches: a batch
is served as a whole (its unique rows are looked up, then all become resident), and eviction
happens after the batch, so the cache never drops a row the current batch needs.

Both run vectorised per batch (numpy over resident rows), not per access: O(num_batches x
capacity) element operations. Hit ratio = resident unique rows at lookup / unique rows looked
up, summed over batches, matching `EmbeddingStore.stats()["hit_ratio"]` without prefetching.
"""

from __future__ import annotations

import numpy as np

from frugal._typing import I64

__all__ = ["belady_hit_ratio", "lru_hit_ratio", "next_use"]

_NEVER = np.iinfo(np.int64).max


def next_use(batches: list[I64]) -> list[I64]:
    """For each batch's unique ids, the index of the next batch that uses the id again.

    Args:
        batches: Unique ids per batch, in order.

    Returns:
        One int64 array per batch, aligned with it; int64 max where the id is not used again.
    """
    if not batches:
        return []
    lengths = np.array([len(b) for b in batches])
    ids = np.concatenate(batches).astype(np.int64)
    when = np.repeat(np.arange(len(batches), dtype=np.int64), lengths)
    order = np.lexsort((when, ids))
    following = np.full(len(ids), _NEVER, dtype=np.int64)
    same = ids[order[1:]] == ids[order[:-1]]
    following[order[:-1][same]] = when[order[1:][same]]
    return list(np.split(following, np.cumsum(lengths)[:-1]))


def _simulate(batches: list[I64], num_rows: int, capacity: int, belady: bool) -> float:
    if capacity < 1:
        raise ValueError(f"capacity={capacity} rows must be >= 1")
    resident = np.zeros(num_rows, dtype=bool)
    priority = np.zeros(num_rows, dtype=np.int64)  # evict the largest first
    hits = looked_up = 0
    count = 0
    nexts = next_use(batches) if belady else [np.empty(0, np.int64)] * len(batches)
    for t, ids in enumerate(batches):
        hit = resident[ids]
        hits += int(hit.sum())
        looked_up += len(ids)
        count += len(ids) - int(hit.sum())
        resident[ids] = True
        # Belady: farthest next use first; LRU: least recently used first (-t is largest).
        priority[ids] = nexts[t] if belady else -t
        if count > capacity:
            rows = np.flatnonzero(resident)
            excess = count - capacity
            victims = rows[np.argpartition(-priority[rows], excess - 1)[:excess]]
            resident[victims] = False
            count = capacity
    return hits / looked_up if looked_up else 1.0


def belady_hit_ratio(batches: list[I64], num_rows: int, capacity: int) -> float:
    """Hit ratio of Belady's optimal demand cache of `capacity` rows over `batches`.

    Args:
        batches: Unique row ids per batch (each in [0, num_rows)), in order.
        num_rows: Rows of the table.
        capacity: Rows the cache holds, >= 1.

    Raises:
        ValueError: If capacity < 1.
    """
    return _simulate(batches, num_rows, capacity, belady=True)


def lru_hit_ratio(batches: list[I64], num_rows: int, capacity: int) -> float:
    """Hit ratio of an LRU demand cache of `capacity` rows over `batches` (see belady_hit_ratio).

    Raises:
        ValueError: If capacity < 1.
    """
    return _simulate(batches, num_rows, capacity, belady=False)
