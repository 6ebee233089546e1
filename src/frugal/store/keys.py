"""`HashedKeys`: a vectorised open-addressing map from sparse int64 keys to dense row ids.

A store with `key_space="hashed"` accepts any id in [0, 2^63) (raw feature hashes, user ids)
and gives each new key a free row on first use, up to a fixed capacity. The map is a
power-of-two table of rows at load factor <= 1/2, probed linearly from a Fibonacci hash; a
slot holds only the row (int32), whose key is read back from the row -> key array that
checkpoints need anyway. Lookups, inserts and deletes are numpy operations over the whole
batch (one vectorised round per probe distance), never a Python loop per key.

Deleting a key (expiry, eviction) leaves a tombstone in its slot, which lookups probe past
and inserts reuse, and puts its row on a free list that the next new keys take first. When
tombstones fill a quarter of the table it is rebuilt from the live keys, so probes stay as
short as at load 1/2.

Memory: 4 bytes per table slot (an int32 row) at 2-4 slots per row, plus 8 bytes per row
for the row -> key array: 16-24 bytes a row. A map that deletes keys also holds 4 bytes per
freed row not yet handed out again (at most 4 bytes a row; nothing for a map that never
deletes).
"""

from __future__ import annotations

import numpy as np

from frugal._typing import I64
from frugal.store.errors import StoreError
from frugal.store.slot_index import first_of_each

__all__ = ["HashedKeys", "KeySpaceFullError"]

_FIBONACCI = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio
_EMPTY = np.int64(-1)  # a never-used row's key; an empty slot
_TOMBSTONE = -2  # a deleted key's slot: probes go on past it, inserts may take it


class KeySpaceFullError(StoreError):
    """More distinct keys than the store has rows."""


class HashedKeys:
    """Map keys in [0, 2^63) to rows 0..capacity-1; deleted keys give their rows back.

    New keys take rows in order of first appearance: first the rows of deleted keys (the
    most recently freed first), then rows never used, in increasing order. `keys_by_row`
    holds each row's key, -1 for a row never used or freed; rows >= `rows_used` were never
    handed out.

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
        self._size = size
        self._shift = np.uint64(64 - (size.bit_length() - 1))
        self._mask = np.int64(size - 1)
        self._rows = np.full(size, -1, dtype=np.int32)  # slot -> row; -1 empty, -2 tombstone
        self.keys_by_row = np.full(self.capacity, _EMPTY, dtype=np.int64)
        self.num_keys = 0
        """Keys present now."""
        self.rows_used = 0
        """Rows handed out at least once: rows >= it were never used."""
        self._free_rows = np.empty(0, dtype=np.int32)  # stack, top at _num_free - 1; grows
        self._num_free = 0
        self._tombstones = 0
        self._recycled: list[I64] = []  # rows freed and handed out again, until taken

    @staticmethod
    def memory_bytes_for(capacity: int) -> int:
        """Bytes a map of this capacity holds (known before it is built)."""
        size = 1 << max(4, int(2 * capacity - 1).bit_length())
        return 4 * size + 8 * capacity

    def _home(self, keys: I64) -> I64:
        with np.errstate(over="ignore"):
            hashed = (keys.astype(np.uint64) * _FIBONACCI) >> self._shift
        return hashed.astype(np.int64)

    def _slots_of(self, keys: I64) -> I64:
        """Table slot of each key, -1 where a key is absent."""
        found_slots = np.full(len(keys), -1, dtype=np.int64)
        pending = np.arange(len(keys))
        slots = self._home(keys)
        while len(pending):
            row = self._rows[slots]
            hit = self.keys_by_row[np.maximum(row, 0)] == keys[pending]
            hit &= row >= 0
            found_slots[pending[hit]] = slots[hit]
            alive = ~hit & (row != -1)  # an empty slot ends the probe: not present
            pending, slots = pending[alive], (slots[alive] + 1) & self._mask
        return found_slots

    def lookup(self, keys: I64) -> I64:
        """Rows of `keys`, -1 where a key is absent (never inserted, or deleted).

        Shapes:
            keys: (N,) int64, each in [0, 2^63) -> (N,) int64.
        """
        slots = self._slots_of(keys)
        rows: I64 = np.where(slots >= 0, self._rows[np.maximum(slots, 0)], -1).astype(np.int64)
        return rows

    def lookup_or_insert(self, keys: I64) -> I64:
        """Rows of `keys`, giving absent keys free rows (in order of first appearance).

        Rows freed by `delete` are handed out first; `take_recycled` returns them.

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
                "are taken; create the store with a larger num_rows (or delete keys first)"
            )
        reused = min(len(new_keys), self._num_free)
        top = self._num_free
        recycled = self._free_rows[top - reused : top][::-1].astype(np.int64)  # top first
        self._num_free -= reused
        fresh = np.arange(self.rows_used, self.rows_used + len(new_keys) - reused, dtype=np.int64)
        self.rows_used += len(fresh)
        new_rows = np.concatenate([recycled, fresh])
        if reused:
            self._recycled.append(recycled)
        self._insert(new_keys, new_rows)
        self.keys_by_row[new_rows] = new_keys
        self.num_keys += len(new_keys)
        rows[missing] = self.lookup(keys[missing])
        return rows

    def take_recycled(self) -> I64:
        """Rows of deleted keys handed to new keys since the last call (sorted, int64).

        Their data still belongs to the deleted keys: the store overwrites them with the new
        keys' initial values before anything reads them.
        """
        if not self._recycled:
            return np.empty(0, dtype=np.int64)
        rows = np.sort(np.concatenate(self._recycled))
        self._recycled.clear()
        return rows

    def delete(self, keys: I64) -> I64:
        """Remove `keys` (absent ones are ignored); return the rows they held, in key order.

        The rows go on the free list. Linear probing cannot empty a slot (a later key's probe
        may pass through it), so the slot becomes a tombstone; once tombstones fill a quarter
        of the table it is rebuilt from the live keys.

        Shapes:
            keys: (N,) int64 -> (M,) int64, M <= N.
        """
        slots = self._slots_of(np.unique(keys))
        slots = slots[slots >= 0]
        rows = self._rows[slots].astype(np.int64)
        self._rows[slots] = _TOMBSTONE
        self.keys_by_row[rows] = _EMPTY
        self._reserve_free(self._num_free + len(rows))
        self._free_rows[self._num_free : self._num_free + len(rows)] = rows
        self._num_free += len(rows)
        self.num_keys -= len(rows)
        self._tombstones += len(rows)
        if self._tombstones * 4 > self._size:
            self._rebuild()
        return rows

    def _reserve_free(self, count: int) -> None:
        """Grow the free-row stack (doubling, up to the capacity) to hold `count` rows."""
        if count > len(self._free_rows):
            grown = np.empty(min(self.capacity, max(count, 2 * len(self._free_rows))), np.int32)
            grown[: self._num_free] = self._free_rows[: self._num_free]
            self._free_rows = grown

    def live_rows(self) -> I64:
        """Rows that hold a key now, in increasing order (int64)."""
        rows: I64 = np.flatnonzero(self.keys_by_row[: self.rows_used] >= 0).astype(np.int64)
        return rows

    def _rebuild(self) -> None:
        """Re-place every live key in an empty table (drops tombstones); rows keep their keys."""
        live = self.live_rows()
        self._rows.fill(-1)
        self._tombstones = 0
        self._insert(self.keys_by_row[live], live)

    def _insert(self, keys: I64, rows: I64) -> None:
        """Place distinct, absent keys: per round, one key claims each free probed slot.

        A free slot is empty or a tombstone (the keys are known to be absent, so the first
        such slot on a key's probe is where it belongs).
        """
        pending = np.arange(len(keys))
        slots = self._home(keys)
        while len(pending):
            free = self._rows[slots] < 0
            # Among keys probing the same free slot, the first claims it; the rest move on.
            winner = first_of_each(slots) & free
            claimed = slots[winner]
            self._tombstones -= int(np.count_nonzero(self._rows[claimed] == _TOMBSTONE))
            self._rows[claimed] = rows[pending[winner]].astype(np.int32)
            pending, slots = pending[~winner], (slots[~winner] + 1) & self._mask

    def restore(self, keys_by_row: I64) -> None:
        """Rebuild the map from a checkpointed row -> key array (rows 0..len-1; -1: free row).

        Free rows go back on the free list, the lowest handed out first.

        Raises:
            ValueError: If it is longer than the capacity, or holds a key below -1 or a
                repeated key.
        """
        n = len(keys_by_row)
        if n > self.capacity:
            raise ValueError(f"{n} checkpointed keys exceed the capacity {self.capacity}")
        live = np.flatnonzero(keys_by_row >= 0)
        present = keys_by_row[live]
        if n and (keys_by_row.min() < -1 or len(np.unique(present)) != len(present)):
            raise ValueError("checkpointed keys must be distinct and >= 0 (-1 for a free row)")
        self._rows.fill(-1)
        self.keys_by_row.fill(_EMPTY)
        self._tombstones = 0
        self._recycled.clear()
        self._insert(present.astype(np.int64), live.astype(np.int64))
        self.keys_by_row[:n] = keys_by_row
        self.num_keys = len(live)
        self.rows_used = n
        free = np.flatnonzero(keys_by_row < 0)[::-1]  # the lowest free row on top
        self._free_rows = free.astype(np.int32)
        self._num_free = len(free)
