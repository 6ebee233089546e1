"""DyGFormer: sequences, co-occurrence counts, no leakage, joint scoring, training, registry."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest
import torch

from frugal.data import TemporalEvents, load_events
from frugal.data.synthetic import TemporalStreamConfig, generate_temporal_events
from frugal.tgraph.models import MODELS, DyGFormer, ModelInputs, register_model
from frugal.tgraph.models import dygformer as dygformer_module
from frugal.tgraph.models.dygformer import (
    build_dygformer,
    cooccurrence_counts,
    first_hop_sequences,
)
from frugal.tgraph.neighbors import NeighborFinder
from frugal.tgraph.protocol import ProtocolConfig, build_protocol
from frugal.tgraph.train import run_link_prediction


@pytest.fixture(scope="module")
def stream() -> TemporalEvents:
    return generate_temporal_events(TemporalStreamConfig(num_events=800, num_nodes=30))


def _model(events: TemporalEvents, **options: object) -> DyGFormer:
    torch.manual_seed(0)
    msg = np.zeros((events.num_events, 0), np.float32)
    inputs = ModelInputs(num_nodes=events.num_nodes, msg=msg, embedding_dim=16)
    return build_dygformer(inputs, **{"max_input_sequence_length": 8, **options}).eval()


def test_cooccurrence_counts_match_hand_counts_and_skip_padding() -> None:
    # Pair 0: src sequence [5, 7, 7, 9, pad, pad], dst sequence [7, 5, 3, 7, 0, pad], where
    # the dst's node 0 is real and the padded slots also hold 0: padding must not count.
    src = np.array([[5, 7, 7, 9, 0, 0], [1, 2, 0, 0, 0, 0]])
    src_mask = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0]], bool)
    dst = np.array([[7, 5, 3, 7, 0, 0], [2, 2, 1, 0, 0, 0]])
    dst_mask = np.array([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]], bool)
    src_counts, dst_counts = cooccurrence_counts(src, src_mask, dst, dst_mask)
    # [count in src's sequence, count in dst's sequence] per slot, by hand:
    # src 5: once in src, once in dst; 7: twice, twice; 9: once, never; padding: 0, 0.
    expected_src_0 = [[1, 1], [2, 2], [2, 2], [1, 0], [0, 0], [0, 0]]
    # dst 7: [2, 2]; 5: [1, 1]; 3: [0, 1]; 7: [2, 2]; real 0: not in src (its zeros are
    # padding), once in dst: [0, 1]; padding [0, 0].
    expected_dst_0 = [[2, 2], [1, 1], [0, 1], [2, 2], [0, 1], [0, 0]]
    # Pair 1: src [1, 2], dst [2, 2, 1]: src 1 -> [1, 1], 2 -> [1, 2]; dst 2 -> [1, 2] twice,
    # 1 -> [1, 1].
    expected_src_1 = [[1, 1], [1, 2]] + [[0, 0]] * 4
    expected_dst_1 = [[1, 2], [1, 2], [1, 1]] + [[0, 0]] * 3
    assert src_counts.tolist() == [expected_src_0, expected_src_1]
    assert dst_counts.tolist() == [expected_dst_0, expected_dst_1]


def test_sequences_hold_the_node_then_its_recent_past_right_padded() -> None:
    # Node 0's events: eid 0 (0-1, t 1), 1 (2-0, t 2), 2 (0-3, t 3), 3 (0-1, t 5), 4 (4-0, t 6).
    src = np.array([0, 2, 0, 0, 4])
    dst = np.array([1, 0, 3, 1, 0])
    t = np.array([1, 2, 3, 5, 6])
    finder = NeighborFinder(src, dst, t, num_nodes=5)
    query = np.array([0])
    # At t = 5: only events strictly before 5 (eids 0, 1, 2), oldest first after the node.
    seq = first_hop_sequences(finder, query, np.array([5]), first_eid=10, length=6)
    assert seq.node.tolist() == [[0, 1, 2, 3, 0, 0]]
    assert seq.eid.tolist() == [[0, 0, 1, 2, 0, 0]]
    assert seq.t.tolist() == [[5, 1, 2, 3, 0, 0]]
    assert seq.mask.tolist() == [[True, True, True, True, False, False]]
    # The batch's event-id bound hides eid 2 and later even before t.
    bounded = first_hop_sequences(finder, query, np.array([5]), first_eid=2, length=6)
    assert bounded.node.tolist() == [[0, 1, 2, 0, 0, 0]]
    assert bounded.mask.sum() == 3
    # Longer history than L - 1 slots: the most recent L - 1 (eids 1, 2, 3 at t = 6).
    cut = first_hop_sequences(finder, query, np.array([6]), first_eid=10, length=4)
    assert cut.node.tolist() == [[0, 2, 3, 1]] and cut.eid.tolist() == [[0, 1, 2, 3]]
    # A node with no past: itself, then padding.
    alone = first_hop_sequences(finder, np.array([4]), np.array([6]), first_eid=10, length=3)
    assert alone.node.tolist() == [[4, 0, 0]] and alone.mask.tolist() == [[True, False, False]]


def test_no_event_at_or_after_the_query_changes_a_score(stream: TemporalEvents) -> None:
    model = _model(stream)
    b0 = 500
    full = NeighborFinder(stream.src, stream.dst, stream.t, stream.num_nodes)
    past = NeighborFinder(stream.src[:b0], stream.dst[:b0], stream.t[:b0], stream.num_nodes)
    src, t = stream.src[b0 : b0 + 40], stream.t[b0 : b0 + 40]
    dst = np.stack([stream.dst[b0 : b0 + 40], stream.src[b0 + 50 : b0 + 90]], axis=1)
    with torch.no_grad():
        # The batch bound (frugal): nothing from the batch's first event on.
        with_future = model.score_pairs(src, dst, t, b0, full)
        only_past = model.score_pairs(src, dst, t, b0, past)
        # The time bound only (benchtemp): events at time >= t are invisible to a query at t.
        at_t = np.full(len(src), stream.t[b0])
        head = int(np.searchsorted(stream.t, stream.t[b0]))  # the first event at that time
        before = NeighborFinder(
            stream.src[:head], stream.dst[:head], stream.t[:head], stream.num_nodes
        )  # fmt: skip
        timed_full = model.score_pairs(src, dst, at_t, stream.num_events, full)
        timed_past = model.score_pairs(src, dst, at_t, stream.num_events, before)
    torch.testing.assert_close(with_future, only_past)
    torch.testing.assert_close(timed_full, timed_past)


def test_score_does_not_depend_on_the_batch_or_the_chunking(
    stream: TemporalEvents, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _model(stream)
    finder = NeighborFinder(stream.src, stream.dst, stream.t, stream.num_nodes)
    src, t = stream.src[600:612], stream.t[600:612]
    dst = np.stack([stream.dst[600:612], stream.dst[620:632], stream.src[640:652]], axis=1)
    with torch.no_grad():
        together = model.score_pairs(src, dst, t, 600, finder)
        alone = torch.cat([model.score_pairs(src[i : i + 1], dst[i : i + 1], t[i : i + 1],
                                             600, finder) for i in range(12)])  # fmt: skip
        logits = model.forward_batch(src, list(dst.T), t, 600, finder)[0]
        monkeypatch.setattr(dygformer_module, "_TOKENS_PER_CHUNK", 16)  # one pair per chunk
        chunked = model.score_pairs(src, dst, t, 600, finder)
    assert together.shape == (12, 3)
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.stack(logits, dim=1), together)
    torch.testing.assert_close(chunked, together, rtol=1e-5, atol=1e-5)
    assert model.state() == {}


def test_the_source_side_depends_on_the_destination(stream: TemporalEvents) -> None:
    model = _model(stream)
    finder = NeighborFinder(stream.src, stream.dst, stream.t, stream.num_nodes)
    b0, length = 700, model.length
    u, t = stream.src[b0 : b0 + 1], stream.t[b0 : b0 + 1]
    seq_u = first_hop_sequences(finder, u, t, b0, length)
    # v1: u's most recent neighbour (shares u's history); v2: a node u never met before b0.
    v1 = seq_u.node[:, seq_u.mask.sum() - 1]
    met = set(seq_u.node[0, seq_u.mask[0]].tolist())
    v2 = np.array([next(n for n in range(stream.num_nodes) if n not in met)])
    counts_u = []
    z_u = []
    for v in (v1, v2):
        seq_v = first_hop_sequences(finder, v, t, b0, length)
        counts_u.append(cooccurrence_counts(seq_u.node, seq_u.mask, seq_v.node, seq_v.mask)[0])
        with torch.no_grad():
            z_u.append(model.embed_pairs(seq_u, seq_v, t)[0])
    # u's own counts (channel 0) are v's business not at all; its counts in v's sequence are.
    assert (counts_u[0][..., 0] == counts_u[1][..., 0]).all()
    assert counts_u[0][..., 1].sum() > 0 and counts_u[1][..., 1].sum() == 0
    # So u's representation is a function of the pair, not of u alone.
    assert not torch.allclose(z_u[0], z_u[1])


def _hospital_prefix(num_events: int) -> TemporalEvents:
    full = load_events("sp_hospital")
    return replace(
        full, src=full.src[:num_events], dst=full.dst[:num_events], t=full.t[:num_events]
    )


@pytest.fixture
def short_dygformer() -> Iterator[str]:
    """`dygformer` with 8-slot sequences (DyGLib: 32), registered for the trainer."""
    register_model(
        "dygformer_short",
        lambda inputs: build_dygformer(inputs, max_input_sequence_length=8),
        scoring="pair",
    )
    yield "dygformer_short"
    MODELS.unregister("dygformer_short")


def test_dygformer_learns_on_a_real_prefix(short_dygformer: str) -> None:
    events = _hospital_prefix(2500)
    config = replace(
        ProtocolConfig(), max_epochs=3, learning_rate=3e-3, embedding_dim=16, use_ranking=False,
        patience=3, negative_strategies=("random",),
    )  # fmt: skip
    protocol = build_protocol(events, "sp_hospital_prefix", config)
    frozen = replace(config, max_epochs=1, learning_rate=1e-12)  # one epoch, no learning
    untrained = run_link_prediction(short_dygformer, replace(protocol, config=frozen), 0,
                                    num_threads=1)  # fmt: skip
    result = run_link_prediction(short_dygformer, protocol, 0, num_threads=1)
    head = next(r for r in result.rows if r["view"] == "transductive")
    before = next(r for r in untrained.rows if r["view"] == "transductive")
    print(f"DyGFormer, hospital prefix: test AUC {before['auc']:.3f} untrained, {head['auc']:.3f}")
    # 0.70 trained when written; chance is 0.5.
    assert head["auc"] > 0.6 and head["auc"] > before["auc"], (head, before)


@pytest.mark.parametrize("preset", ["frugal", "benchtemp"])
def test_dygformer_is_registered_and_runs_under_both_protocols(
    preset: str, stream: TemporalEvents
) -> None:
    spec = MODELS.get("dygformer")
    assert spec.scoring == "pair" and spec.native_neighbor_strategy == "recent"
    base = ProtocolConfig() if preset == "frugal" else ProtocolConfig.benchtemp()
    config = replace(base, max_epochs=1, embedding_dim=16, num_ranking_candidates=6)
    protocol = build_protocol(stream, "synthetic", config)
    result = run_link_prediction("dygformer", protocol, 0, num_threads=1)
    model = result.model
    assert isinstance(model, DyGFormer)
    # Benchtemp pads featureless data with 172 zero columns: a constant edge channel.
    assert model.edge_projection is None and model.edge_channel is not None
    assert {row["view"] for row in result.rows} == {
        "transductive", "inductive", "new_old", "new_new"
    }  # fmt: skip
    for row in result.rows:
        assert row["ranking"] == "sampled:6"
        if row["num_events"] == 0:  # benchtemp's masks leave this stream no New-New event
            continue
        assert row["mrr"] == row["sampled_mrr"] and 1 / 7 <= row["mrr"] <= 1
        assert 0 <= row["auc"] <= 1
    assert result.efficiency["params"] > 0


def test_settings_out_of_range_are_refused() -> None:
    msg = np.zeros((3, 0), np.float32)
    with pytest.raises(ValueError, match="multiple of patch_size=3"):
        DyGFormer(4, msg, max_input_sequence_length=32, patch_size=3)
    with pytest.raises(ValueError, match="not divisible by num_heads=3"):
        DyGFormer(4, msg, channel_embedding_dim=50, num_heads=3)
    patched = DyGFormer(4, msg, embedding_dim=8, channel_embedding_dim=4, time_dim=8,
                        max_input_sequence_length=8, patch_size=4)  # fmt: skip
    finder = NeighborFinder(np.array([0, 1]), np.array([1, 2]), np.array([1, 2]), 4)
    with torch.no_grad():
        out = patched.eval().score_pairs(np.array([1]), np.array([[2, 3]]), np.array([3]), 2,
                                         finder)  # fmt: skip
    assert out.shape == (1, 2) and torch.isfinite(out).all()
