"""TemporalEvents and node re-indexing."""

from __future__ import annotations

import numpy as np
import pytest

from frugal.data import TemporalEvents, factorize_nodes


def _ints(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def test_factorize_sources_first_then_destinations() -> None:
    # rows (src, dst): (10, 30), (20, 10), (30, 40)
    # sources in row order: 10 -> 0, 20 -> 1, 30 -> 2; then destinations: 40 -> 3.
    src, dst, node_ids, num_src = factorize_nodes([10, 20, 30], [30, 10, 40])
    assert src.tolist() == [0, 1, 2]
    assert dst.tolist() == [2, 0, 3]
    assert node_ids.tolist() == [10, 20, 30, 40]
    assert num_src == 4


def test_factorize_bipartite_shifts_items_after_users() -> None:
    # users 7, 5 -> 0, 1; items 5, 9 -> 0, 1, shifted by 2 users -> 2, 3 (5 is both a user
    # and an item: separate nodes in a bipartite graph).
    src, dst, node_ids, num_users = factorize_nodes([7, 5, 7], [5, 9, 9], bipartite=True)
    assert src.tolist() == [0, 1, 0]
    assert dst.tolist() == [2, 3, 3]
    assert node_ids.tolist() == [7, 5, 5, 9]
    assert num_users == 2


def test_factorize_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="both must be 1-D and equal"):
        factorize_nodes([1, 2], [3])


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"t": _ints(5, 3, 9)}, r"t\[1\] = 3 < t\[0\] = 5"),
        ({"dst": _ints(1, 2, 3)}, r"dst\[2\] = 3 is outside \[0, num_nodes=3\)"),
        ({"src": _ints(0, -1, 0)}, r"src\[1\] = -1 is outside"),
        ({"src": np.array([0, 1, 2], dtype=np.int32)}, "int64"),
        ({"msg": np.array([[0.0], [np.nan], [1.0]], dtype=np.float32)}, "msg row 1"),
        ({"msg": np.zeros((2, 1), np.float32)}, r"msg must have shape \(E=3, D\)"),
        ({"label": _ints(0, 1)}, r"label must be int64 of shape \(3,\)"),
        ({"label": np.zeros(3)}, r"label must be int64"),
        ({"msg": np.zeros((3, 1))}, "msg must be a float32"),
        (
            {"t": np.array([0, 5, np.iinfo(np.int64).min])},
            r"t\[2\] = -9223372036854775808 < t\[1\]",
        ),
    ],
)
def test_invalid_events_are_rejected(kwargs: dict[str, np.ndarray], fragment: str) -> None:
    base = {"src": _ints(0, 1, 2), "dst": _ints(1, 2, 0), "t": _ints(1, 1, 2)}
    with pytest.raises(ValueError, match=fragment):
        TemporalEvents(**(base | kwargs), num_nodes=3)  # type: ignore[arg-type]


def test_bipartite_events_check_both_sides() -> None:
    with pytest.raises(ValueError, match="bipartite graph needs src in"):
        TemporalEvents(
            src=_ints(0, 2), dst=_ints(2, 3), t=_ints(0, 1), num_nodes=4, bipartite=True,
            num_src_nodes=2,
        )  # fmt: skip


@pytest.mark.slow  # importing torch_geometric takes about 2 s
def test_round_trip_through_pyg_temporal_data() -> None:
    pytest.importorskip("torch_geometric")
    events = TemporalEvents(
        src=_ints(0, 1, 2),
        dst=_ints(1, 2, 0),
        t=_ints(1, 1, 4),
        num_nodes=3,
        msg=np.arange(6, dtype=np.float32).reshape(3, 2),
        label=_ints(0, 1, 0),
    )
    data = events.to_temporal_data()
    assert data.src.tolist() == [0, 1, 2] and data.t.tolist() == [1, 1, 4]
    assert tuple(data.msg.shape) == (3, 2) and data.y.tolist() == [0, 1, 0]
    back = TemporalEvents.from_temporal_data(data)
    assert back.num_nodes == 3
    assert np.array_equal(back.dst, events.dst)
    assert back.msg is not None and np.array_equal(back.msg, events.msg)
    assert back.label is not None and back.label.tolist() == [0, 1, 0]
