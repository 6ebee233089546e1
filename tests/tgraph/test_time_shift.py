"""Times are used only as differences: shifting every timestamp changes no score of any model."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from frugal.data import TemporalEvents
from frugal.data.synthetic import TemporalStreamConfig, generate_temporal_events
from frugal.tgraph.models import MODELS, Popularity, Recency
from frugal.tgraph.protocol import ProtocolConfig, build_protocol
from frugal.tgraph.train import run_link_prediction

BUILT_IN = MODELS.names()


@pytest.fixture(scope="module")
def stream() -> TemporalEvents:
    return generate_temporal_events(TemporalStreamConfig(num_events=1200, num_nodes=40))


def _metrics(events: TemporalEvents, model: str) -> list[tuple[object, ...]]:
    # 10 sampled candidates keep the pair models (CAWN) to seconds; node models rank both.
    config = replace(
        ProtocolConfig(), max_epochs=1, embedding_dim=8, num_neighbors=4, num_ranking_candidates=10
    )
    protocol = build_protocol(events, "shifted", config)
    rows = run_link_prediction(model, protocol, 0, num_threads=1).rows
    keys = ("auc", "ap", "auc_per_batch", "ranking", "mrr", "hits_at_10", "sampled_mrr")
    return [(row["view"], row["negatives"], *(row.get(k) for k in keys)) for row in rows]


@pytest.mark.parametrize("model", BUILT_IN)
def test_shifting_every_timestamp_changes_no_score(model: str, stream: TemporalEvents) -> None:
    # Shifted to all-negative times, and far up (float32 cannot hold 1e9 s to the second).
    if MODELS.get(model).scoring == "pair":  # 2 M walks per scored pair: a prefix keeps seconds
        # NeurTW runs 32 GRU-ODE evaluations (8 RK4 steps x 4) per walk step in each of its
        # two encoders: a shorter prefix keeps it to seconds too.
        n = 150 if model == "neurtw" else 400
        stream = replace(stream, src=stream.src[:n], dst=stream.dst[:n], t=stream.t[:n])
    last = int(stream.t[-1])
    reference = _metrics(stream, model)
    assert any(row[2] is not None for row in reference)
    for shift in (-(last + 100), 10**9):
        assert _metrics(replace(stream, t=stream.t + shift), model) == reference, shift


def test_negative_times_are_times_not_never_seen() -> None:
    # Hand-made: (0, 1) seen at t = -100, scored at t = -90. Recency: -(10); popularity of 1:
    # one event 10 time units ago, decay constant 10 -> e^-1. Node 2 was never a destination.
    for model in (Recency(3, window_s=10.0), Popularity(3, window_s=10.0)):
        model.observe(np.array([0]), np.array([1]), np.array([-100]))
        scores = model.score([0, 0], [1, 2], [-90, -90])
        expected = [-10.0, -1e18] if isinstance(model, Recency) else [np.exp(-1.0), 0.0]
        np.testing.assert_allclose(scores, expected, rtol=1e-12)
