"""Temporal walks (CAW): the vectorised sampler against the per-walk loop, no leakage, counts."""

from __future__ import annotations

import numpy as np
import pytest

from frugal.data.synthetic import TemporalStreamConfig, generate_temporal_events
from frugal.tgraph.neighbors import NeighborFinder
from frugal.tgraph.walks import hitting_counts, sample_walks, sample_walks_loop

# A hand-made graph: event id = position, (src, dst, t); times tie at 3.
SRC = np.array([0, 1, 0, 2, 0, 1, 3, 2])
DST = np.array([1, 2, 2, 3, 3, 3, 0, 0])
T = np.array([1, 2, 3, 3, 5, 6, 8, 9])


@pytest.mark.parametrize("alpha", [0.0, 0.4, 3.0])
def test_vectorised_walks_equal_the_per_walk_loop(alpha: float) -> None:
    finder = NeighborFinder(SRC, DST, T, num_nodes=4)
    node = np.array([0, 3, 2, 1, 0, 2])
    t = np.array([10, 9, 3, 10, 6, 1])  # node 2 at t=3 sees only event 1; t=1: nothing
    max_eid = np.array([8, 8, 8, 5, 8, 8])  # query 3 may not use events 5, 6, 7
    options = {"num_walks": 6, "walk_length": 3, "alpha": alpha}
    fast = sample_walks(finder, node, t, max_eid, rng=np.random.default_rng(7), **options)  # type: ignore[arg-type]
    slow = sample_walks_loop(
        SRC, DST, T, node, t, max_eid, rng=np.random.default_rng(7), **options  # type: ignore[arg-type]
    )  # fmt: skip
    # The same uniform numbers invert the same weights: identical walks, step for step.
    np.testing.assert_array_equal(fast.node, slow.node)
    np.testing.assert_array_equal(fast.eid, slow.eid)
    np.testing.assert_array_equal(fast.t, slow.t)
    np.testing.assert_array_equal(fast.mask, slow.mask)
    assert fast.mask[:, :, 1].any() and not fast.mask[5, :, 1].any()  # t=1: no earlier event
    assert fast.mask[:, :, 3].any()  # some walks go the full 3 steps


def test_walks_never_use_an_event_at_or_after_t_or_the_batch_bound() -> None:
    events = generate_temporal_events(TemporalStreamConfig(num_events=600, num_nodes=20))
    finder = NeighborFinder(events.src, events.dst, events.t, events.num_nodes)
    rng = np.random.default_rng(0)
    first = rng.integers(50, 600, size=64)  # each query's batch starts at this event
    node = np.where(rng.random(64) < 0.5, events.src[first], events.dst[first])
    t = events.t[first] + rng.integers(0, 3, size=64)  # at or a bit after the batch start
    walks = sample_walks(finder, node, t, first, num_walks=16, walk_length=3, alpha=1e-2, rng=rng)
    step = walks.mask[:, :, 1:]
    assert step.sum() > 1000  # the check below is not vacuous
    prev_t = walks.t[:, :, :-1]
    assert (walks.t[:, :, 1:][step] < prev_t[step]).all()  # strictly back in time (t_0 = t)
    assert (
        walks.eid[:, :, 1:][step] < np.broadcast_to(first[:, None, None], step.shape)[step]
    ).all()
    # Each step's event joins the previous node and this one.
    eid, here, before = (
        walks.eid[:, :, 1:][step],
        walks.node[:, :, 1:][step],
        walks.node[:, :, :-1][step],
    )
    ends = {(int(a), int(b)) for a, b in zip(events.src[eid], events.dst[eid], strict=True)}
    assert all((p, q) in ends or (q, p) in ends for p, q in zip(before, here, strict=True))
    assert (walks.t[:, :, 1:][step] == events.t[eid]).all()
    # A walk stops for good: no real step after a null one.
    assert not (~walks.mask[:, :, 1:-1] & walks.mask[:, :, 2:]).any()


def test_time_biased_draws_follow_exp_alpha_dt() -> None:
    # Node 0's events at t = 0, 1, 2, 3; a query at t = 4 with alpha = ln 2 weighs them
    # 2^-4 : 2^-3 : 2^-2 : 2^-1, i.e. 1 : 2 : 4 : 8 / 15.
    finder = NeighborFinder(np.zeros(4, np.int64), np.arange(1, 5), np.arange(4), num_nodes=5)
    drawn = finder.sample_time_biased(
        np.array([0]), np.array([4]), 60000, alpha=float(np.log(2)), rng=np.random.default_rng(1)
    )  # fmt: skip
    share = np.bincount(drawn.nbr[0], minlength=5)[1:] / 60000
    np.testing.assert_allclose(share, np.array([1, 2, 4, 8]) / 15, atol=0.01)


def test_time_biased_draws_hold_at_any_time_scale() -> None:
    # Events at t = 0 and 100, a query at t = 1e10, alpha = 0.01: exp(alpha dt) underflows to
    # 0 for both (dt ~ 1e10), but their ratio is e^-1 : 1, so P(recent) = 1 / (1 + e^-1).
    finder = NeighborFinder(np.array([0, 0]), np.array([1, 2]), np.array([0, 100]), num_nodes=3)
    drawn = finder.sample_time_biased(
        np.array([0]), np.array([2]), 40000, alpha=0.01, rng=np.random.default_rng(2)
    )  # fmt: skip
    assert abs((drawn.nbr[0] == 2).mean() - 1 / (1 + np.exp(-1.0))) < 0.01


def test_hitting_counts_by_hand() -> None:
    # Pair 0: S = {[0,1,2], [0,3,1]}, D = {[4,1,null], [4,0,5]} (M = 2, L = 2).
    # I(w; S) per position: 0 -> [2,0,0]; 1 -> [0,1,1]; 2 -> [0,0,1]; 3 -> [0,1,0].
    # I(w; D): 4 -> [2,0,0]; 1 -> [0,1,0]; 0 -> [0,1,0]; 5 -> [0,0,1].
    # Pair 1: the same S, D = {[4,null,null], [4,null,null]}: 0 is not in D there.
    s = np.array([[[0, 1, 2], [0, 3, 1]], [[0, 1, 2], [0, 3, 1]]])
    d = np.array([[[4, 1, -1], [4, 0, 5]], [[4, -1, -1], [4, -1, -1]]])
    src_counts, dst_counts = hitting_counts(s, d)
    i_s = {0: [2, 0, 0], 1: [0, 1, 1], 2: [0, 0, 1], 3: [0, 1, 0], 4: [0, 0, 0], 5: [0, 0, 0]}
    i_d = {4: [2, 0, 0], 1: [0, 1, 0], 0: [0, 1, 0], 5: [0, 0, 1], 2: [0, 0, 0], 3: [0, 0, 0]}
    z = [0, 0, 0]
    expected_src0 = [[[i_s[w], i_d[w]] for w in walk] for walk in s[0]]
    expected_dst0 = [
        [[i_s[w], i_d[w]] if w >= 0 else [z, z] for w in walk] for walk in d[0]
    ]  # fmt: skip
    np.testing.assert_array_equal(src_counts[0], expected_src0)
    np.testing.assert_array_equal(dst_counts[0], expected_dst0)
    i_d1 = {4: [2, 0, 0]}
    expected_src1 = [[[i_s[w], i_d1.get(w, z)] for w in walk] for walk in s[1]]
    np.testing.assert_array_equal(src_counts[1], expected_src1)
    np.testing.assert_array_equal(dst_counts[1][:, 0], [[z, [2, 0, 0]], [z, [2, 0, 0]]])
    assert (dst_counts[1][:, 1:] == 0).all()  # null positions count nothing
