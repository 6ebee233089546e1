"""`HashedKeys`: a vectorised open-addressing map from sparse int64 keys to dense row ids.

A store with `key_space="hashed"` accepts any id in [0, 2^63) (raw feature hashes, user ids)
and gives each new key the next free row on first use, up to a fixed capacity. The map is a
power-of-two table of keys and rows at load factor <= 1/2, probed linearly from a Fibonacci
hash; lookups and inserts are numpy operations over the whole batch (one vectorised round per
probe distance), never a Python loop per key.

Memory: 12 bytes per table slot (int64 key + int32 row) at 2-4 slots per row, plus 8 bytes per
row for the reverse map (row -> key) that checkpoints and initial values use.
"""

from __future__ import annotations

import numpy as np

from frugal._typing import I64
from frugal.store.errors import StoreError
from frugal.store.slot_index import first_of_each

__all__ = ["HashedKeys", "KeySpaceFullError"]

_FIBONACCI = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio
_EMPTY = np.int64(-1)


class KeySpaceFullError(StoreError):
    """More distinct keys than the store has rows."""


class HashedKeys:
    """Map keys in [0, 2^63) to rows 0..capacity-1 in order of first use.

    Args:
        capacity: Rows available (the store's num_rows), >= 1.

    Raises:
        ValueError: If capacity < 1.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity={capacity} must be >= 1")
        self.capacity = int(capacity)
        size = 1 << max(4, int(2 * capacity - 1).bit_length())  # >= 2 x capacity slots
        self._shift = np.uint64(64 - (size.bit_length() - 1))
        self._mask = np.int64(size - 1)
        self._keys = np.full(size, _EMPTY, dtype=np.int64)
        self._rows = np.full(size, -1, dtype=np.int32)
        self.keys_by_row = np.full(self.capacity, _EMPTY, dtype=np.int64)
        self.num_keys = 0

    @staticmethod
    def memory_bytes_for(capacity: int) -> int:
        """Bytes a map of this capacity holds (known before it is built)."""
        size = 1 << max(4, int(2 * capacity - 1).bit_length())
        return 12 * size + 8 * capacity

    def _home(self, keys: I64) -> I64:
        with np.errstate(over="ignore"):
            hashed = (keys.astype(np.uint64) * _FIBONACCI) >> self._shift
        return hashed.astype(np.int64)

    def lookup(self, keys: I64) -> I64:
        """Rows of `keys`, -1 where a key was never inserted.

        Shapes:
            keys: (N,) int64, each in [0, 2^63) -> (N,) int64.
        """
        rows = np.full(len(keys), -1, dtype=np.int64)
        pending = np.arange(len(keys))
        slots = self._home(keys)
        while len(pending):
            found = self._keys[slots]
            hit = found == keys[pending]
            rows[pending[hit]] = self._rows[slots[hit]]
            alive = ~hit & (found != _EMPTY)  # an empty slot ends the probe: not present
            pending, slots = pending[alive], (slots[alive] + 1) & self._mask
        return rows

    def lookup_or_insert(self, keys: I64) -> I64:
        """Rows of `keys`, giving unseen keys the next free rows (in order of first appearance).

        Raises:
            KeySpaceFullError: If the new keys do not fit; nothing is inserted then.

        Shapes:
            keys: (N,) int64 -> (N,) int64.
        """
        rows = self.lookup(keys)
        missing = rows < 0
        if not missing.any():
            return rows
        new_keys, first = np.unique(keys[missing], return_index=True)
        new_keys = new_keys[np.argsort(first, kind="stable")]  # first-use order: deterministic
        if self.num_keys + len(new_keys) > self.capacity:
            raise KeySpaceFullError(
                f"{len(new_keys)} new keys do not fit: {self.num_keys} of {self.capacity} rows "
                "are taken; create the store with a larger num_rows"
            )
        new_rows = np.arange(self.num_keys, self.num_keys + len(new_keys), dtype=np.int64)
        self._insert(new_keys, new_rows)
        self.keys_by_row[new_rows] = new_keys
        self.num_keys += len(new_keys)
        rows[missing] = self.lookup(keys[missing])
        return rows

    def _insert(self, keys: I64, rows: I64) -> None:
        """Place distinct, absent keys: per round, one key claims each free probed slot."""
        pending = np.arange(len(keys))
        slots = self._home(keys)
        while len(pending):
            free = self._keys[slots] == _EMPTY
            # Among keys probing the same free slot, the first claims it; the rest move on.
            winner = first_of_each(slots) & free
            self._keys[slots[winner]] = keys[pending[winner]]
            self._rows[slots[winner]] = rows[pending[winner]].astype(np.int32)
            pending, slots = pending[~winner], (slots[~winner] + 1) & self._mask

    def restore(self, keys_by_row: I64) -> None:
        """Rebuild the map from a checkpointed row -> key array (rows 0..len-1).

        Raises:
            ValueError: If it is longer than the capacity or holds a negative or repeated key.
        """
        n = len(keys_by_row)
        if n > self.capacity:
            raise ValueError(f"{n} checkpointed keys exceed the capacity {self.capacity}")
        if n and (keys_by_row.min() < 0 or len(np.unique(keys_by_row)) != n):
            raise ValueError("checkpointed keys must be distinct and >= 0")
        self._keys.fill(_EMPTY)
        self._rows.fill(-1)
        self.keys_by_row.fill(_EMPTY)
        self._insert(keys_by_row.astype(np.int64), np.arange(n, dtype=np.int64))
        self.keys_by_row[:n] = keys_by_row
        self.num_keys = n
