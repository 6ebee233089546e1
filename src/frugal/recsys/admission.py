"""Admission of new embedding rows: a count-min sketch of how often each id was pushed.

Recommendation streams are long-tailed: most ids appear once or a few times, and a row for
each would fill a shard with rows that never train. A frequency filter admits an id only once
it has been seen `admit_after` times; until then lookups read its initial value and its
gradients are dropped (Monolith, arXiv 2209.07663, section 2.2.2; TorchRec's and Persia's
feature admission work the same way). The counts are estimated in fixed memory with a
count-min sketch with conservative update (Cormode & Muthukrishnan, J. Algorithms 2005;
Estan & Varghese, SIGCOMM 2002): an estimate is never below the true count, and above it
only when all `depth` counters of an id are shared with heavier ids.

Shape legend: N keys in a call.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from frugal._typing import I64
from frugal.store.rows import splitmix64

__all__ = ["CountMinSketch"]

_MAX_COUNT = np.iinfo(np.uint16).max  # counters saturate here


class CountMinSketch:
    """Approximate counts of int64 keys in `depth` x `width` saturating uint16 counters.

    Args:
        width: Counters per row, a power of two >= 16 (memory: 2 x depth x width bytes).
        depth: Rows (independent hashes), in [1, 8].
        seed: Seed of the hashes.

    Raises:
        ValueError: If `width` is not a power of two >= 16 or `depth` is outside [1, 8].
    """

    def __init__(self, width: int, depth: int = 4, seed: int = 0) -> None:
        if width < 16 or width & (width - 1):
            raise ValueError(f"width={width} must be a power of two >= 16 (e.g. {1 << 20})")
        if not 1 <= depth <= 8:
            raise ValueError(f"depth={depth} must be in [1, 8]")
        self.width, self.depth = int(width), int(depth)
        self.counts = np.zeros((depth, width), dtype=np.uint16)
        self._salts = splitmix64(np.arange(1, depth + 1, dtype=np.uint64) + np.uint64(seed) * 97)

    @property
    def memory_bytes(self) -> int:
        """Bytes the counters take."""
        return int(self.counts.nbytes)

    def _columns(self, keys: I64) -> npt.NDArray[np.int64]:
        """(depth, N) counter index of each key in each row."""
        hashed = splitmix64(keys.astype(np.uint64)[None, :] ^ self._salts[:, None])
        columns: npt.NDArray[np.int64] = (hashed & np.uint64(self.width - 1)).astype(np.int64)
        return columns

    def estimate(self, keys: I64) -> npt.NDArray[np.int64]:
        """Estimated counts (never below the true ones), int64 (N,)."""
        if len(keys) == 0:
            return np.zeros(0, dtype=np.int64)
        columns = self._columns(keys)
        rows = np.arange(self.depth)[:, None]
        estimate: npt.NDArray[np.int64] = self.counts[rows, columns].min(axis=0).astype(np.int64)
        return estimate

    def add(self, keys: I64) -> npt.NDArray[np.int64]:
        """Count one occurrence of each key; return the estimated counts after the call.

        A key repeated in `keys` counts once per occurrence. Returns int64 (N,).
        Conservative update: a key raises only the counters below its new estimate, which
        keeps the estimates of light keys from growing with heavy keys' collisions.
        """
        if len(keys) == 0:
            return np.zeros(0, dtype=np.int64)
        unique, inverse, occurrences = np.unique(keys, return_inverse=True, return_counts=True)
        columns = self._columns(unique)
        rows = np.arange(self.depth)[:, None]
        current = self.counts[rows, columns].astype(np.int64)  # (depth, U)
        target = np.minimum(current.min(axis=0) + occurrences, _MAX_COUNT)  # (U,)
        raised = np.maximum(current, target[None, :])
        # Two keys sharing a counter: keep the larger of their targets (np.maximum.at).
        index = (np.broadcast_to(rows, columns.shape), columns)
        np.maximum.at(self.counts, index, raised.astype(np.uint16))
        estimate: npt.NDArray[np.int64] = self.estimate(unique)[inverse]
        return estimate
