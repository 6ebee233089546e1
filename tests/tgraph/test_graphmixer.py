"""GraphMixer: fixed time encoding, neighbour tokens by hand, no leakage, training, registry."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from frugal.data import TemporalEvents, load_events
from frugal.data.synthetic import TemporalStreamConfig, generate_temporal_events
from frugal.tgraph.models import MODELS, MixerEmbedding, ModelInputs, TemporalGNN, TimeEncoder
from frugal.tgraph.models.graphmixer import build_graphmixer
from frugal.tgraph.neighbors import NeighborFinder
from frugal.tgraph.protocol import ProtocolConfig, build_protocol
from frugal.tgraph.train import run_link_prediction, run_node_classification

# A hand-made graph: event id, (src, dst), time, edge features [eid + 1, 10 * (eid + 1)].
SRC = np.array([0, 0, 1, 0, 2, 0])
DST = np.array([1, 2, 0, 3, 0, 1])
T = np.array([1, 3, 4, 6, 6, 9])
MSG = np.stack([np.arange(1, 7), 10 * np.arange(1, 7)], axis=1).astype(np.float32)


def _phi(dt: float, width: int) -> list[float]:
    """GraphMixer's fixed encoding by hand: cos(dt * alpha^(-(i-1)/beta)), i = 1..T.

    DyGLib's frequencies 10^(-linspace(0, 9, T)) are alpha = 10, beta = (T - 1) / 9.
    """
    alpha, beta = 10.0, (width - 1) / 9
    return [float(np.cos(dt * alpha ** (-(i - 1) / beta))) for i in range(1, width + 1)]


def _mixer(k: int, time_dim: int = 4, edge_dim: int = 2, dedup: bool = True) -> MixerEmbedding:
    torch.manual_seed(0)
    return MixerEmbedding(
        8, edge_dim, TimeEncoder(time_dim, learnable=False), num_neighbors=k, num_channels=8,
        use_dedup=dedup,
    ).eval()  # fmt: skip


def test_time_encoding_is_fixed_and_equals_the_formula() -> None:
    inputs = ModelInputs(num_nodes=3, msg=np.zeros((2, 0), np.float32), embedding_dim=16)
    model = build_graphmixer(inputs)
    embedding = model.embedding
    assert isinstance(embedding, MixerEmbedding)
    encoder = embedding.time_encoder
    assert encoder.out_channels == 100  # DyGLib's time_feat_dim, independent of D = 16
    # Phases up to 600 rad: float32 holds them to ~6e-5 (larger dt lose digits, as in DyGLib).
    dt = torch.tensor([0.0, 1.0, 37.0, 600.0])
    expected = torch.tensor([_phi(float(x), 100) for x in dt])
    torch.testing.assert_close(encoder(dt), expected, rtol=0, atol=2e-4)
    assert not any(p.requires_grad for p in encoder.parameters())
    # The rest of the model trains: a backward pass reaches the projection, not the encoder.
    finder = NeighborFinder(SRC, DST, T, num_nodes=4)
    tiny = build_graphmixer(ModelInputs(num_nodes=4, msg=MSG, embedding_dim=16))
    memory, last = tiny.peek_memory()
    node = np.array([0, 1, 2])
    z = tiny.embed(node, np.full(3, 10), np.full(3, 6), finder, memory, last)
    z.square().sum().backward()
    mixer = tiny.embedding
    assert isinstance(mixer, MixerEmbedding)
    assert mixer.projection.weight.grad is not None
    assert mixer.projection.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in mixer.time_encoder.parameters())


def test_tokens_are_the_k_most_recent_events_strictly_before_t() -> None:
    finder = NeighborFinder(SRC, DST, T, num_nodes=4)
    mixer = _mixer(k=4, dedup=False)
    # Node 0 at t 6: its events before 6 are ids 0 (t 1), 1 (t 3), 2 (t 4); ids 3 and 4 are
    # at t 6 itself and hidden. Node 0 at t 10: its 4 most recent are ids 2..5. Node 3 at
    # t 6 has none (its only event is at t 6). Node 1 at t 10: ids 0, 2, 5.
    node, t = np.array([0, 0, 3, 1]), np.array([6, 10, 6, 10])
    big = np.full(4, 100)
    prepared = mixer.prepare(node, t, big, finder, None)
    e, phi = mixer.tokens(prepared, torch.from_numpy(MSG))
    assert e is not None
    slots = [  # event id of each slot, oldest first, None = padding (left)
        [None, 0, 1, 2],
        [2, 3, 4, 5],
        [None, None, None, None],
        [None, 0, 2, 5],
    ]
    expected_e = torch.zeros(4, 4, 2)
    expected_phi = torch.zeros(4, 4, 4)
    for b, row in enumerate(slots):
        for k, eid in enumerate(row):
            if eid is not None:
                expected_e[b, k] = torch.from_numpy(MSG[eid])
                expected_phi[b, k] = torch.tensor(_phi(float(t[b] - T[eid]), 4))
    torch.testing.assert_close(e, expected_e)
    torch.testing.assert_close(phi, expected_phi, rtol=1e-6, atol=1e-6)
    # The event-id bound hides a batch's own events too: node 0 at t 10, ids < 4 only.
    bounded = mixer.prepare(np.array([0]), np.array([10]), np.array([4]), finder, None)
    e_bounded, _ = mixer.tokens(bounded, torch.from_numpy(MSG))
    assert e_bounded is not None
    torch.testing.assert_close(e_bounded[0, :, 0], torch.tensor([1.0, 2.0, 3.0, 4.0]))
    # All-zero edge features (None) give the same embeddings as passing the zeros.
    zeros = torch.zeros_like(torch.from_numpy(MSG))
    memory = torch.zeros(4, 8)
    last = torch.zeros(4, dtype=torch.long)
    with torch.no_grad():
        skipped = mixer(prepared, node, t, memory, last, None)
        explicit = mixer(prepared, node, t, memory, last, zeros)
    torch.testing.assert_close(skipped, explicit)


def test_deduplicated_queries_give_the_same_embeddings() -> None:
    finder = NeighborFinder(SRC, DST, T, num_nodes=4)
    node, t = np.array([0, 1, 0, 0, 2]), np.array([7, 7, 7, 10, 7])
    bound = np.full(5, 100)
    out = []
    for dedup in (True, False):
        mixer = _mixer(k=3, dedup=dedup)
        prepared = mixer.prepare(node, t, bound, finder, None)
        with torch.no_grad():
            out.append(mixer(prepared, node, t, torch.zeros(4, 8), torch.zeros(4), None))
    torch.testing.assert_close(out[0], out[1])
    assert not torch.allclose(out[0][0], out[0][3])  # t 7 and t 10 see different tokens


def test_embedding_ignores_events_at_or_after_the_query_time() -> None:
    stream = generate_temporal_events(TemporalStreamConfig(num_events=600, num_nodes=30))
    torch.manual_seed(0)
    msg = np.random.default_rng(0).random((stream.num_events, 3)).astype(np.float32)
    inputs = ModelInputs(num_nodes=stream.num_nodes, msg=msg, embedding_dim=16, num_neighbors=4)
    model = build_graphmixer(inputs).eval()
    t_query = int(stream.t[400])
    cut = int(np.searchsorted(stream.t, t_query))  # first event at time >= t_query
    assert stream.t[cut] == t_query  # events at the query time itself exist
    past = NeighborFinder(stream.src[:cut], stream.dst[:cut], stream.t[:cut], stream.num_nodes)
    full = NeighborFinder(stream.src, stream.dst, stream.t, stream.num_nodes)
    nodes = np.arange(stream.num_nodes)
    times = np.full(len(nodes), t_query)
    bound = np.full(len(nodes), stream.num_events)  # time is the only bound here
    memory, last = model.peek_memory()
    with torch.no_grad():
        z_past = model.embed(nodes, times, bound, past, memory, last)
        z_full = model.embed(nodes, times, bound, full, memory, last)
        z_later = model.embed(nodes, times + 50, bound, full, memory, last)
    torch.testing.assert_close(z_full, z_past)
    assert not torch.allclose(z_later, z_past)  # later queries do read those events


def _hospital_prefix(num_events: int = 3000) -> TemporalEvents:
    full = load_events("sp_hospital")
    return replace(
        full, src=full.src[:num_events], dst=full.dst[:num_events], t=full.t[:num_events]
    )


def test_short_training_learns_on_real_data() -> None:
    config = replace(
        ProtocolConfig(), max_epochs=3, learning_rate=3e-3, embedding_dim=16, num_neighbors=5,
        train_batch_size=50, use_ranking=False,
    )  # fmt: skip
    protocol = build_protocol(_hospital_prefix(), "sp_hospital_prefix", config)
    result = run_link_prediction("graphmixer", protocol, 0, num_threads=1)
    losses = [h["loss"] for h in result.history]
    assert losses[-1] < losses[0]
    head = next(
        r for r in result.rows if r["view"] == "transductive" and r["negatives"] == "random"
    )
    assert head["auc"] > 0.75  # 0.90 when written; chance is 0.5


@pytest.mark.parametrize("preset", ["frugal", "benchtemp"])
def test_graphmixer_is_registered_and_runs_under_both_protocols(preset: str) -> None:
    assert "graphmixer" in MODELS
    assert MODELS.get("graphmixer").native_neighbor_strategy == "recent"
    stream = generate_temporal_events(TemporalStreamConfig(num_events=800, num_nodes=30))
    base = ProtocolConfig() if preset == "frugal" else ProtocolConfig.benchtemp()
    config = replace(base, max_epochs=1, embedding_dim=16, num_neighbors=3)
    protocol = build_protocol(stream, "synthetic", config)
    result = run_link_prediction("graphmixer", protocol, 0, num_threads=1)
    model = result.model
    assert isinstance(model, TemporalGNN) and isinstance(model.embedding, MixerEmbedding)
    assert model.updater is None and model.neighbor_strategy == "recent"
    assert model.embedding.num_neighbors == 6  # 2 K, as TGAT
    # Benchtemp pads featureless data with 172 zero columns: in the projection's shape.
    edge_dim = 172 if preset == "benchtemp" else 0
    assert model.embedding.projection.in_features == edge_dim + 100
    head = next(r for r in result.rows if r["view"] == "transductive")
    assert 0 <= float(head["auc"]) <= 1
    assert 0 < float(head["mrr"]) <= 1  # all-candidate ranking
    assert result.efficiency["params"] > 0
    nc = run_node_classification(model, protocol, 0, max_steps=20)
    assert 0 <= nc["nc_auc"] <= 1
