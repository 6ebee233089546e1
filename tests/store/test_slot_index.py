"""id -> cache slot maps: the hash table against a dict, and the choice between the two."""

from __future__ import annotations

import numpy as np
import pytest

from frugal.store.slot_index import (
    DenseSlotIndex,
    HashSlotIndex,
    choose_slot_index,
    hash_table_cells,
)


def test_hash_table_cells_are_a_power_of_two_of_at_least_four_per_slot() -> None:
    assert hash_table_cells(1) == 16  # the floor
    assert hash_table_cells(4) == 16
    assert hash_table_cells(5) == 32
    assert hash_table_cells(138_000) == 1 << 20  # 552,000 -> 1,048,576
    assert HashSlotIndex.memory_bytes_for(5) == 128
    assert DenseSlotIndex.memory_bytes_for(1000) == 4000


def test_hash_index_agrees_with_a_dict_through_churn_and_rebuilds() -> None:
    """Random inserts and removals, as a cache's misses and evictions make them."""
    capacity = 500
    rng = np.random.default_rng(7)
    slot_ids = np.full(capacity, -1, dtype=np.int64)
    index = HashSlotIndex(capacity, slot_ids)
    reference: dict[int, int] = {}
    free = list(range(capacity))
    # Sparse ids and a dense block: the dense block's homes collide in runs.
    universe = np.concatenate([rng.choice(1 << 40, 3000, replace=False), np.arange(2000)])
    for _ in range(300):
        if reference and rng.random() < 0.5:  # evict a random batch
            victims = rng.choice(list(reference), min(len(reference), int(rng.integers(1, 60))),
                                 replace=False)  # fmt: skip
            slots = np.array([reference[v] for v in victims], dtype=np.int64)
            index.remove(victims.astype(np.int64), slots)
            slot_ids[slots] = -1
            for v in victims.tolist():
                free.append(reference.pop(v))
        else:  # a batch of misses into free slots
            absent = np.setdiff1d(universe, np.fromiter(reference, np.int64, len(reference)))
            count = min(len(free), int(rng.integers(1, 80)))
            ids = rng.choice(absent, count, replace=False).astype(np.int64)
            slots = np.array([free.pop() for _ in range(count)], dtype=np.int64)
            slot_ids[slots] = ids
            index.insert(ids, slots)
            reference.update(zip(ids.tolist(), slots.tolist(), strict=True))
        probe = rng.choice(universe, 400).astype(np.int64)
        expected = np.array([reference.get(i, -1) for i in probe.tolist()])
        assert np.array_equal(index.lookup(probe), expected)
        assert index.live == len(reference)
        assert index.used <= len(index.table) // 2
    assert index.rebuilds > 0  # tombstones piled up and were cleared at least once


def test_hash_index_refuses_overfill_and_unknown_removals() -> None:
    slot_ids = np.array([10, 11, -1], dtype=np.int64)
    index = HashSlotIndex(3, slot_ids)
    index.insert(np.array([10, 11]), np.array([0, 1]))
    with pytest.raises(ValueError, match="would pass its capacity 3"):
        index.insert(np.array([1, 2]), np.array([2, 2]))
    with pytest.raises(KeyError, match=r"id 12 \(slot 2\) is not in the map"):
        index.remove(np.array([12]), np.array([2]))
    assert index.lookup(np.array([10, 11, 12])).tolist() == [0, 1, -1]  # nothing was lost
    with pytest.raises(ValueError, match="slot_ids has 3 entries, expected 4"):
        HashSlotIndex(4, slot_ids)


def test_choose_slot_index_takes_the_map_that_caches_more_rows() -> None:
    # The store bench's Criteo table: 8,441,945 rows of 196 B, 52 B of metadata per slot.
    rows, per_slot = 8_441_945, 248
    table_bytes = rows * 196
    # Ratio 0.05 after the file backend's addresses (4 B/row) and a 10.3 MB I/O buffer:
    available = int(0.05 * table_bytes) - 4 * rows - int(0.05 * table_bytes) // 8
    kind, capacity = choose_slot_index("auto", num_rows=rows, available_bytes=available,
                                       bytes_per_slot=per_slot)  # fmt: skip
    dense = (available - 4 * rows) // per_slot
    first = available // (per_slot + 16)
    assert kind == "hash" and capacity == (available - 4 * hash_table_cells(first)) // per_slot
    assert capacity > 6 * dense  # ~139k slots against ~20k
    # Ratio 1.0: the dense map costs 2% of the budget; the hash table would not buy 1/16 more.
    available = table_bytes - 4 * rows - (16 << 20)
    kind, capacity = choose_slot_index("auto", num_rows=rows, available_bytes=available,
                                       bytes_per_slot=per_slot)  # fmt: skip
    assert (kind, capacity) == ("dense", (available - 4 * rows) // per_slot)
    # Forced kinds are obeyed.
    assert choose_slot_index("dense", num_rows=rows, available_bytes=10**6,
                             bytes_per_slot=per_slot)[0] == "dense"  # fmt: skip
    assert choose_slot_index("hash", num_rows=10, available_bytes=10**6,
                             bytes_per_slot=per_slot)[0] == "hash"  # fmt: skip
