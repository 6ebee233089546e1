"""NeurTW: its RK4 integrator, the spatio-temporally biased walks, no leakage, and learning."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest
import torch

from frugal.data import TemporalEvents
from frugal.data.synthetic import TemporalStreamConfig, generate_temporal_events
from frugal.tgraph.models import MODELS, ModelInputs, NeurTW, register_model
from frugal.tgraph.models.neurtw import (
    ContinuousWalkEncoder,
    GRUODEFlow,
    build_neurtw,
    rk4_integrate,
)
from frugal.tgraph.neighbors import NeighborFinder
from frugal.tgraph.protocol import ProtocolConfig, build_protocol
from frugal.tgraph.train import run_link_prediction
from frugal.tgraph.walks import sample_walks, sample_walks_loop


@pytest.fixture(scope="module")
def stream() -> TemporalEvents:
    return generate_temporal_events(TemporalStreamConfig(num_events=800, num_nodes=30))


def _neurtw(events: TemporalEvents, **options: object) -> NeurTW:
    torch.manual_seed(0)
    msg = np.zeros((events.num_events, 0), np.float32)
    inputs = ModelInputs(num_nodes=events.num_nodes, msg=msg, embedding_dim=8)
    return build_neurtw(inputs, **{"num_walks": 4, "pos_dim": 8, **options}).eval()


# -- (a) the RK4 integrator ----------------------------------------------------------------
def test_rk4_on_exponential_decay_has_fourth_order_accuracy() -> None:
    # dh/dt = -h from h(0) = h0: h(T) = exp(-T) h0. One RK4 step of size x multiplies h by
    # R(x) = 1 - x + x^2/2 - x^3/6 + x^4/24 (every 4-stage order-4 Runge-Kutta method, the
    # 3/8 rule included, gives this on a linear ODE), so 8 steps of T/8 give R(T/8)^8 h0.
    # R(x) = exp(-x) (1 + x^5 / 120 + O(x^6)), so the relative error is about 8 (T/8)^5 / 120
    # = T^5 / 491520: 6.4e-8 at T = 0.5, 2.0e-6 at T = 1, 6.5e-5 at T = 2 (the O(x^6) terms
    # add 5-25 %).
    h0 = torch.tensor([[1.0, -2.0], [0.5, 3.0], [4.0, 1.0]], dtype=torch.float64)
    duration = torch.tensor([[0.5], [1.0], [2.0]], dtype=torch.float64)
    out = rk4_integrate(lambda h: -h, h0, duration, step_size=0.125)
    x = duration / 8
    stability = 1 - x + x**2 / 2 - x**3 / 6 + x**4 / 24
    torch.testing.assert_close(out, stability**8 * h0, rtol=1e-13, atol=0)
    exact = torch.exp(-duration) * h0
    error_125 = (out - exact).abs() / exact.abs()
    leading = duration**5 / 491520
    assert ((error_125 > leading) & (error_125 < 1.3 * leading)).all(), error_125 / leading
    # Fourth order: halving the step divides the error by about 2^4 = 16 (16.4-17.8 here:
    # the O(x^6) terms weigh more at the larger steps).
    error_0625 = (rk4_integrate(lambda h: -h, h0, duration, step_size=0.0625) - exact).abs()
    ratio = (error_125 * exact.abs() / error_0625)[:, 0]
    assert ((ratio > 15) & (ratio < 19)).all(), ratio


def test_a_zero_time_gap_leaves_the_state_unchanged() -> None:
    torch.manual_seed(0)
    flow = GRUODEFlow(5)
    h = torch.randn(4, 5)
    gap = torch.tensor([[0.0], [0.7], [0.0], [2.0]])
    out = rk4_integrate(flow, h, gap)
    assert torch.equal(out[[0, 2]], h[[0, 2]])  # exactly: h + 0 * (k1 + ...)
    assert not torch.allclose(out[[1, 3]], h[[1, 3]])  # a real gap moves it
    with pytest.raises(ValueError, match="step_size=0"):
        rk4_integrate(flow, h, gap, step_size=0.0)


def test_the_walk_encoder_by_hand_and_with_repeated_walks() -> None:
    # One walk of 2 positions, gap g: h = GRU(x_0, 0), flowed for g, then GRU(x_1, h).
    # Walks 1 and 2 repeat walk 0 (integrated once, gathered back); walk 3 stops after
    # position 0 (length 1, gap 0): its state is GRU(x_0, 0).
    torch.manual_seed(0)
    encoder = ContinuousWalkEncoder(3, 4, step_size=0.125, dropout=0.0).eval()
    x = torch.randn(1, 2, 3).repeat(4, 1, 1)
    length = torch.tensor([2, 2, 2, 1])
    gap = torch.tensor([[0.3], [0.3], [0.3], [0.0]])
    with torch.no_grad():
        out = encoder(x, length, gap)
        first = encoder.jump(x[:1, 0], torch.zeros(1, 4))
        flowed = rk4_integrate(encoder.flow, first, gap[:1])
        by_hand = encoder.jump(x[:1, 1], flowed)
    torch.testing.assert_close(out[:3], by_hand.expand(3, 4))
    torch.testing.assert_close(out[3:], first)


# -- (b) the spatio-temporally biased sampler ----------------------------------------------
def test_biased_draws_follow_the_hand_computed_mixture() -> None:
    # Events (src, dst, t): (1,2,1) (1,3,2) (0,1,4) (0,2,5) (0,4,6). Node 0 at t = 7 has
    # three earlier events, to 1 at t=4, to 2 at t=5, to 4 at t=6. With alpha = ln 2 the
    # time half weighs them 2^-3 : 2^-2 : 2^-1 = 1/7, 2/7, 4/7. Their neighbours' degrees
    # before those events: node 1 had 2 events (t = 1, 2), node 2 one (t = 1), node 4 none,
    # so with beta = 1 the degree half weighs exp(-1/2.01), exp(-1/1.01), exp(-1/0.01) =
    # 0.6080, 0.3716, 3.7e-44, i.e. 0.6207, 0.3793, 0.0000 normalised. The mixture
    # (time + degree) / 2 = 0.3818, 0.3325, 0.2857.
    finder = NeighborFinder(
        np.array([1, 1, 0, 0, 0]), np.array([2, 3, 1, 2, 4]), np.array([1, 2, 4, 5, 6]),
        num_nodes=5,
    )  # fmt: skip
    w = np.exp(-1 / np.array([2.01, 1.01, 0.01]))
    expected = (np.array([1, 2, 4]) / 7 + w / w.sum()) / 2
    np.testing.assert_allclose(expected, [0.3818, 0.3325, 0.2857], atol=1e-4)
    drawn = finder.sample_time_biased(
        np.array([0]), np.array([5]), 60000, alpha=float(np.log(2)), spatial_bias=1.0,
        rng=np.random.default_rng(4),
    )  # fmt: skip
    share = np.array([(drawn.nbr[0] == v).mean() for v in (1, 2, 4)])
    np.testing.assert_allclose(share, expected, atol=0.01)
    # spatial_bias = 0 is CAW's sampler: the time half alone.
    time_only = finder.sample_time_biased(
        np.array([0]), np.array([5]), 60000, alpha=float(np.log(2)), rng=np.random.default_rng(4)
    )  # fmt: skip
    share = np.array([(time_only.nbr[0] == v).mean() for v in (1, 2, 4)])
    np.testing.assert_allclose(share, np.array([1, 2, 4]) / 7, atol=0.01)


@pytest.mark.parametrize("alpha", [0.0, 1e-3])  # 1e-3: e-fold per 1000 time units (gaps ~80)
def test_biased_walks_equal_the_per_walk_loop_and_go_back_in_time(
    alpha: float, stream: TemporalEvents
) -> None:
    src, dst, t_events = stream.src[:300], stream.dst[:300], stream.t[:300]
    finder = NeighborFinder(src, dst, t_events, stream.num_nodes)
    rng = np.random.default_rng(5)
    node = rng.integers(0, stream.num_nodes, size=20)
    max_eid = rng.integers(50, 300, size=20)
    t = t_events[max_eid - 1] + rng.integers(0, 3, size=20)
    options = {"num_walks": 6, "walk_length": 3, "alpha": alpha, "spatial_bias": 1.5}
    fast = sample_walks(finder, node, t, max_eid, rng=np.random.default_rng(7), **options)  # type: ignore[arg-type]
    slow = sample_walks_loop(
        src, dst, t_events, node, t, max_eid, rng=np.random.default_rng(7), **options  # type: ignore[arg-type]
    )  # fmt: skip
    np.testing.assert_array_equal(fast.node, slow.node)
    np.testing.assert_array_equal(fast.eid, slow.eid)
    np.testing.assert_array_equal(fast.mask, slow.mask)
    step = fast.mask[:, :, 1:]
    assert step.sum() > 200 and fast.mask[:, :, 3].any()  # not vacuous
    # Never forward in time: each step strictly before the previous (t_0 = query time),
    # and never at or past the query's event bound.
    assert (fast.t[:, :, 1:][step] < fast.t[:, :, :-1][step]).all()
    bound = np.broadcast_to(max_eid[:, None, None], step.shape)
    assert (fast.eid[:, :, 1:][step] < bound[step]).all()


# -- (c) no leakage --------------------------------------------------------------------------
def test_scores_do_not_change_when_later_events_change(stream: TemporalEvents) -> None:
    model = _neurtw(stream, num_walks=8)
    b0 = 500
    rng = np.random.default_rng(1)
    later = np.arange(b0, stream.num_events)
    # Rewire every event from the batch on and push their times later: nothing before b0
    # changes, so neither may any walk, degree weight or score of the batch.
    dst = stream.dst.copy()
    dst[later] = (dst[later] + rng.integers(1, stream.num_nodes, size=len(later))) % (
        stream.num_nodes
    )
    keep = dst != stream.src
    dst[~keep] = stream.dst[~keep]
    t = stream.t.copy()
    t[later] += rng.integers(0, 5, size=len(later)).cumsum()
    original = NeighborFinder(stream.src, stream.dst, stream.t, stream.num_nodes)
    perturbed = NeighborFinder(stream.src, dst, t, stream.num_nodes)
    src_b, dst_b, t_b = stream.src[b0 : b0 + 40], stream.dst[b0 : b0 + 40], stream.t[b0 : b0 + 40]
    candidates = np.stack([dst_b, (dst_b + 3) % stream.num_nodes], axis=1)
    with torch.no_grad():
        a = model.score_pairs(src_b, candidates, t_b, b0, original, np.random.default_rng(0))
        b = model.score_pairs(src_b, candidates, t_b, b0, perturbed, np.random.default_rng(0))
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert a.std() > 0  # the scores are not constant


def test_neurtw_is_registered_as_an_optional_pair_model() -> None:
    from frugal.bench.tgraph import TgraphBenchConfig

    spec = MODELS.get("neurtw")
    assert spec.scoring == "pair" and spec.kind == "learned" and "NeurTW" in spec.description
    assert "neurtw" not in TgraphBenchConfig.QUICK["models"]  # optional, not --quick
    model = spec.build(ModelInputs(num_nodes=5, msg=np.zeros((3, 0), np.float32)))
    assert isinstance(model, NeurTW) and model.spatial_bias == 1.0 and model.num_walks == 32
    with pytest.raises(ValueError, match="step_size=2"):
        build_neurtw(ModelInputs(num_nodes=5, msg=np.zeros((3, 0), np.float32)), step_size=2)


# -- (d) it learns -------------------------------------------------------------------------
@pytest.fixture
def small_neurtw() -> Iterator[str]:
    """`neurtw` with 4 walks and 8-wide encodings, registered for the trainer."""
    register_model(
        "neurtw_small", lambda inputs: build_neurtw(inputs, num_walks=4, pos_dim=8), scoring="pair"
    )
    yield "neurtw_small"
    MODELS.unregister("neurtw_small")


def test_neurtw_learns_on_a_generated_graph(small_neurtw: str) -> None:
    # A recurrent stream (90 % of events repeat one of the last 50 edges): a walk from src
    # often meets dst. Batches of 50 give 14 optimizer steps an epoch. Measured: test AUC
    # 0.654 untrained, 0.806 after 2 epochs (seed 0).
    stream_config = TemporalStreamConfig(
        num_events=1000, num_nodes=40, recurrence=0.9, p_within=0.95
    )  # fmt: skip
    events = generate_temporal_events(stream_config)
    config = replace(
        ProtocolConfig(), max_epochs=2, learning_rate=3e-3, embedding_dim=16, use_ranking=False,
        patience=3, negative_strategies=("random",), train_batch_size=50,
    )  # fmt: skip
    protocol = build_protocol(events, "generated", config)
    frozen = replace(config, max_epochs=1, learning_rate=1e-12)  # one epoch, no learning
    untrained = run_link_prediction(
        small_neurtw, replace(protocol, config=frozen), 0, num_threads=1
    )
    result = run_link_prediction(small_neurtw, protocol, 0, num_threads=1)
    head = next(r for r in result.rows if r["view"] == "transductive")
    before = next(r for r in untrained.rows if r["view"] == "transductive")
    print(f"NeurTW, generated graph: test AUC {before['auc']:.3f} untrained, {head['auc']:.3f}")
    assert head["auc"] > 0.75 and head["auc"] > before["auc"] + 0.1, (head, before)
