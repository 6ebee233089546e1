"""Maps from row id to cache slot: a dense array, or a hash table sized to the cache.

The cache must find the slot of each id of a batch. A dense int32 array over the table's rows
answers with one gather, but costs 4 bytes per *row of the table*: at memory:data 0.05 and
196-byte rows that is 41% of the budget, the difference between ~20k and ~140k cached rows.
`HashSlotIndex` costs 16-32 bytes per *cache slot* instead: an open-addressing table of int32
slot numbers (no keys: a cell's key is read through the cache's own `slot_ids`, which it keeps
anyway), at most a quarter full of live entries, probed triangularly (h, h+1, h+3, h+6, ...,
which visits every cell of a power-of-two table) from a Fibonacci hash. Deleted entries leave
tombstones that later inserts reuse; when live entries and tombstones pass half the table it
is rebuilt from the live entries, which happens at most once per `capacity` deletions, so the
O(capacity) rebuild costs O(1) per eviction. Every operation is a numpy pass over the batch per
probe distance, never a Python loop per id.

`choose_slot_index` picks the map that leaves more room for cached rows.

Shape legend: N ids in a call, C cache slots.
"""

from __future__ import annotations

from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt

from frugal._typing import I64

__all__ = [
    "DenseSlotIndex",
    "HashSlotIndex",
    "SlotIndex",
    "SlotIndexKind",
    "choose_slot_index",
    "first_of_each",
    "hash_table_cells",
]

SlotIndexKind = Literal["auto", "dense", "hash"]
_FIBONACCI = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio
_EMPTY = np.int32(-1)
_DELETED = np.int32(-2)


class SlotIndex(Protocol):
    """id -> slot map of a row cache (the cache's lock guards every call)."""

    kind: str

    def lookup(self, ids: I64) -> I64:
        """Slots of `ids`, -1 where an id is not cached. Shapes: (N,) -> (N,) int64."""
        ...

    def insert(self, ids: I64, slots: I64) -> None:
        """Add distinct ids that are not in the map; `slot_ids[slots]` must already be ids."""
        ...

    def remove(self, ids: I64, slots: I64) -> None:
        """Drop ids that are in the map at `slots` (before the cache clears `slot_ids`)."""
        ...

    def memory_bytes(self) -> int:
        """Bytes the map holds."""
        ...


class DenseSlotIndex:
    """One int32 per table row (4 * num_rows bytes); lookups are a single gather."""

    kind = "dense"

    def __init__(self, num_rows: int) -> None:
        self.slots = np.full(num_rows, -1, dtype=np.int32)

    @staticmethod
    def memory_bytes_for(num_rows: int) -> int:
        """Bytes of the map for a table of `num_rows` rows."""
        return 4 * num_rows

    def lookup(self, ids: I64) -> I64:
        """Slots of `ids`, -1 where not cached. Shapes: (N,) -> (N,) int64."""
        return self.slots[ids].astype(np.int64)

    def insert(self, ids: I64, slots: I64) -> None:
        """Map distinct absent `ids` to `slots`. Shapes: (N,), (N,)."""
        self.slots[ids] = slots

    def remove(self, ids: I64, slots: I64) -> None:
        """Unmap `ids` (their `slots` are not needed here). Shapes: (N,), (N,)."""
        del slots
        self.slots[ids] = -1

    def memory_bytes(self) -> int:
        """Bytes the map holds."""
        return int(self.slots.nbytes)


def first_of_each(cells: I64) -> npt.NDArray[np.bool_]:
    """True at the first occurrence of each value of `cells` (one claimant per probed cell).

    Shapes:
        cells: (N,) int64 -> (N,) bool.
    """
    order = np.argsort(cells, kind="stable")
    sorted_cells = cells[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = sorted_cells[1:] != sorted_cells[:-1]
    out = np.zeros(len(cells), dtype=bool)
    out[order[first]] = True
    return out


def hash_table_cells(capacity: int) -> int:
    """Cells of a `HashSlotIndex` for `capacity` slots: the power of two >= 4 * capacity."""
    return 1 << max(4, int(4 * capacity - 1).bit_length())


class HashSlotIndex:
    """Open-addressing map of cached ids to slots; see the module docstring.

    Args:
        capacity: Cache slots C, >= 1 (at most C ids are in the map at once).
        slot_ids: The cache's (C,) int64 array of the id held by each slot (-1 = none); read,
            never written.

    Raises:
        ValueError: If capacity < 1 or slot_ids does not have C entries.
    """

    kind = "hash"

    def __init__(self, capacity: int, slot_ids: I64) -> None:
        if capacity < 1:
            raise ValueError(f"capacity={capacity} must be >= 1 slot")
        if len(slot_ids) != capacity:
            raise ValueError(f"slot_ids has {len(slot_ids)} entries, expected {capacity}")
        self.capacity = int(capacity)
        self.slot_ids = slot_ids
        cells = hash_table_cells(capacity)
        self._shift = np.uint64(64 - (cells.bit_length() - 1))
        self._mask = np.int64(cells - 1)
        self.table = np.full(cells, _EMPTY, dtype=np.int32)
        self.live = 0  # ids in the map
        self.used = 0  # cells not empty: live entries plus tombstones
        self.rebuilds = 0

    @staticmethod
    def memory_bytes_for(capacity: int) -> int:
        """Bytes of the map for a cache of `capacity` slots (known before it is built)."""
        return 4 * hash_table_cells(capacity)

    def memory_bytes(self) -> int:
        """Bytes the map holds."""
        return int(self.table.nbytes)

    def _home(self, ids: I64) -> I64:
        with np.errstate(over="ignore"):
            hashed = (ids.astype(np.uint64) * _FIBONACCI) >> self._shift
        return hashed.astype(np.int64)

    def lookup(self, ids: I64) -> I64:
        """Slots of `ids`, -1 where not cached. Shapes: (N,) -> (N,) int64."""
        out = np.full(len(ids), -1, dtype=np.int64)
        if self.live == 0 or len(ids) == 0:
            return out
        pending = np.arange(len(ids))
        cells = self._home(ids)
        distance = 0
        while len(pending):
            found = self.table[cells].astype(np.int64)
            hit = found >= 0
            hit[hit] = self.slot_ids[found[hit]] == ids[pending[hit]]
            out[pending[hit]] = found[hit]
            alive = ~hit & (found != _EMPTY)  # an empty cell ends the probe: not present
            distance += 1
            pending, cells = pending[alive], (cells[alive] + distance) & self._mask
        return out

    def insert(self, ids: I64, slots: I64) -> None:
        """Map distinct absent `ids` to `slots` (`slot_ids[slots]` holds them).

        Raises:
            ValueError: If the map would hold more than `capacity` ids.

        Shapes:
            ids, slots: (N,) int64.
        """
        if len(ids) == 0:
            return
        if self.live + len(ids) > self.capacity:
            raise ValueError(
                f"inserting {len(ids)} ids into a map of {self.live} would pass its capacity "
                f"{self.capacity}"
            )
        if self.used + len(ids) > len(self.table) // 2:
            self._rebuild()
        self._place(ids, slots)
        self.live += len(ids)

    def _place(self, ids: I64, slots: I64) -> None:
        """Per probe round, one id claims each free (empty or deleted) probed cell."""
        pending = np.arange(len(ids))
        cells = self._home(ids)
        distance = 0
        while len(pending):
            found = self.table[cells]
            free = found < 0
            # Among ids probing the same free cell, the first claims it; the rest move on.
            winner = first_of_each(cells) & free
            self.used += int(np.count_nonzero(found[winner] == _EMPTY))
            self.table[cells[winner]] = slots[pending[winner]].astype(np.int32)
            distance += 1
            pending, cells = pending[~winner], (cells[~winner] + distance) & self._mask

    def remove(self, ids: I64, slots: I64) -> None:
        """Unmap `ids`, which the map holds at `slots`; deleted cells become tombstones.

        Raises:
            KeyError: If an id is not in the map at its slot (a cache bookkeeping bug).

        Shapes:
            ids, slots: (N,) int64.
        """
        if len(ids) == 0:
            return
        pending = np.arange(len(ids))
        cells = self._home(ids)
        distance = 0
        while len(pending):
            found = self.table[cells]
            hit = found == slots[pending]
            if (found[~hit] == _EMPTY).any():
                k = int(pending[~hit][found[~hit] == _EMPTY][0])
                raise KeyError(f"id {int(ids[k])} (slot {int(slots[k])}) is not in the map")
            self.table[cells[hit]] = _DELETED
            distance += 1
            pending, cells = pending[~hit], (cells[~hit] + distance) & self._mask
        self.live -= len(ids)

    def _rebuild(self) -> None:
        """Re-place the live entries in an empty table (drops every tombstone)."""
        slots = self.table[self.table >= 0].astype(np.int64)
        self.table.fill(_EMPTY)
        self.used = 0
        self.rebuilds += 1
        self._place(self.slot_ids[slots], slots)


def choose_slot_index(
    kind: SlotIndexKind, *, num_rows: int, available_bytes: int, bytes_per_slot: int
) -> tuple[Literal["dense", "hash"], int]:
    """Pick the id -> slot map and the cache capacity it leaves.

    `auto` takes the hash table when it leaves at least 1/16 more slots than the dense array
    (small tables and large ratios keep the one-gather dense map).

    Args:
        kind: "auto", "dense" or "hash".
        num_rows: Rows of the table.
        available_bytes: Budget left for the map and the cache slots, bytes.
        bytes_per_slot: Row bytes plus per-slot metadata.

    Returns:
        (kind, capacity in slots); capacity may be < 1 when the budget is too small.
    """
    dense = (available_bytes - DenseSlotIndex.memory_bytes_for(num_rows)) // bytes_per_slot
    first = max(available_bytes // (bytes_per_slot + 16), 1)
    hashed = (available_bytes - HashSlotIndex.memory_bytes_for(first)) // bytes_per_slot
    hashed = min(hashed, first)
    if kind == "dense" or (kind == "auto" and hashed * 16 < dense * 17):
        return "dense", int(dense)
    return "hash", int(hashed)
