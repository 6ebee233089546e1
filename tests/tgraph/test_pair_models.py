"""Pair-scoring models: CAWN, the sampled ranking, its labels, the registry and leaderboard."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from frugal.data import TemporalEvents, load_events
from frugal.data.synthetic import TemporalStreamConfig, generate_temporal_events
from frugal.tgraph.leaderboard import render_leaderboard
from frugal.tgraph.models import (
    CAWN,
    MODELS,
    PAIR_MODEL_METHODS,
    ModelInputs,
    ModelProtocolError,
    ModelSpec,
    check_learned_model,
    register_model,
)
from frugal.tgraph.models.cawn import build_cawn
from frugal.tgraph.neighbors import NeighborFinder
from frugal.tgraph.protocol import ProtocolConfig, build_protocol, true_destination_keys
from frugal.tgraph.train import run_link_prediction, run_node_classification
from frugal.tgraph.walks import hitting_counts


@pytest.fixture(scope="module")
def stream() -> TemporalEvents:
    return generate_temporal_events(TemporalStreamConfig(num_events=800, num_nodes=30))


@pytest.fixture
def small_cawn() -> Iterator[str]:
    """`cawn` with 4 walks and 8-wide encodings, registered for the trainer."""
    register_model(
        "cawn_small", lambda inputs: build_cawn(inputs, num_walks=4, pos_dim=8), scoring="pair"
    )
    yield "cawn_small"
    MODELS.unregister("cawn_small")


def _cawn(events: TemporalEvents, **options: object) -> CAWN:
    torch.manual_seed(0)
    msg = np.zeros((events.num_events, 0), np.float32)
    inputs = ModelInputs(num_nodes=events.num_nodes, msg=msg, embedding_dim=8)
    model = build_cawn(inputs, **{"num_walks": 4, "pos_dim": 8, **options})
    return model.eval()


def test_score_pairs_is_seeded_side_effect_free_and_the_trainers_call(
    stream: TemporalEvents,
) -> None:
    model = _cawn(stream)
    finder = NeighborFinder(stream.src, stream.dst, stream.t, stream.num_nodes)
    src, dst, t = stream.src[400:410], stream.dst[400:410], stream.t[400:410]
    other = np.stack([dst, (dst + 1) % stream.num_nodes], axis=1)
    with torch.no_grad():
        first = model.score_pairs(src, other, t, 400, finder, np.random.default_rng(3))
        again = model.score_pairs(src, other, t, 400, finder, np.random.default_rng(3))
        logits = model.forward_batch(src, list(other.T), t, 400, finder, np.random.default_rng(3))
    assert first.shape == (10, 2)
    torch.testing.assert_close(first, again)  # no state read or written between the calls
    torch.testing.assert_close(torch.stack(logits[0], dim=1), first)
    assert model.state() == {}


def test_cawn_sees_no_event_at_or_after_the_batch(stream: TemporalEvents) -> None:
    model = _cawn(stream, num_walks=8)
    b0 = 500
    full = NeighborFinder(stream.src, stream.dst, stream.t, stream.num_nodes)
    past = NeighborFinder(stream.src[:b0], stream.dst[:b0], stream.t[:b0], stream.num_nodes)
    src, dst, t = stream.src[b0 : b0 + 50], stream.dst[b0 : b0 + 50], stream.t[b0 : b0 + 50]
    with torch.no_grad():
        with_future = model.score_pairs(src, dst[:, None], t, b0, full, np.random.default_rng(0))
        only_past = model.score_pairs(src, dst[:, None], t, b0, past, np.random.default_rng(0))
    # The same draws over a finder holding the batch and later events, or only the past.
    torch.testing.assert_close(with_future, only_past)


def test_sampled_candidates_are_fixed_hashed_and_never_a_true_destination(
    stream: TemporalEvents, tmp_path: Path
) -> None:
    config = replace(ProtocolConfig(), num_ranking_candidates=12)
    first = build_protocol(stream, "s", config, tmp_path)
    cached = build_protocol(stream, "s", config, tmp_path)  # reloaded from the .npz
    fresh = build_protocol(stream, "s", config)
    candidates = first.ranking_candidates["test"]
    start, end = first.split.bounds("test")
    assert candidates.shape == (end - start, 12)
    for other in (cached, fresh):
        np.testing.assert_array_equal(other.ranking_candidates["test"], candidates)
        assert other.protocol_hash == first.protocol_hash
    # No candidate is a true destination of its (src, t) (so never the true dst itself).
    keys, group = true_destination_keys(stream, start, end)
    probe = group[:, None] * stream.num_nodes + candidates
    assert not np.isin(probe[candidates >= 0], keys).any()
    assert (candidates != stream.dst[start:end, None]).all()
    assert all(len(set(row[row >= 0])) == (row >= 0).sum() for row in candidates)
    assert (candidates >= 0).all()  # 30 nodes leave >= 12 candidates for every query
    other_n = build_protocol(stream, "s", replace(config, num_ranking_candidates=13))
    assert other_n.protocol_hash != first.protocol_hash
    assert other_n.negative_sha256 != first.negative_sha256
    off = build_protocol(stream, "s", replace(config, num_ranking_candidates=0))
    assert off.ranking_candidates == {} and off.sampled_ranking is None


def test_rows_say_which_ranking_their_mrr_uses(stream: TemporalEvents, small_cawn: str) -> None:
    config = replace(ProtocolConfig(), max_epochs=1, embedding_dim=8, num_ranking_candidates=6)
    protocol = build_protocol(stream, "s", config)
    node_rows = run_link_prediction("recency", protocol, 0, num_threads=1).rows
    pair_rows = run_link_prediction(small_cawn, protocol, 0, num_threads=1).rows
    for row in node_rows:
        assert row["ranking"] == "all"
        # The sampled candidates are a subset of all filtered candidates: ranks can only drop.
        assert row["sampled_mrr"] >= row["mrr"] - 1e-12
    for row in pair_rows:
        assert row["ranking"] == "sampled:6"
        assert row["mrr"] == row["sampled_mrr"] and 1 / 7 <= row["mrr"] <= 1
    off = build_protocol(stream, "s", replace(config, num_ranking_candidates=0))
    unranked = run_link_prediction(small_cawn, off, 0, num_threads=1).rows
    assert all(row["ranking"] is None and "mrr" not in row for row in unranked)
    # The ranking's walks come from a child generator: the event scores are unchanged.
    assert [r["auc"] for r in unranked] == [r["auc"] for r in pair_rows]


def _hospital_prefix(num_events: int) -> TemporalEvents:
    full = load_events("sp_hospital")
    return replace(
        full, src=full.src[:num_events], dst=full.dst[:num_events], t=full.t[:num_events]
    )


def test_cawn_learns_on_a_real_prefix(small_cawn: str) -> None:
    events = _hospital_prefix(2500)
    config = replace(
        ProtocolConfig(), max_epochs=3, learning_rate=3e-3, embedding_dim=16, use_ranking=False,
        patience=3, negative_strategies=("random",),
    )  # fmt: skip
    protocol = build_protocol(events, "sp_hospital_prefix", config)
    frozen = replace(config, max_epochs=1, learning_rate=1e-12)  # one epoch, no learning
    untrained = run_link_prediction(small_cawn, replace(protocol, config=frozen), 0, num_threads=1)
    result = run_link_prediction(small_cawn, protocol, 0, num_threads=1)
    head = next(r for r in result.rows if r["view"] == "transductive")
    before = next(r for r in untrained.rows if r["view"] == "transductive")
    print(f"CAWN, hospital prefix: test AUC {before['auc']:.3f} untrained, {head['auc']:.3f}")
    assert head["auc"] > 0.6 and head["auc"] > before["auc"] + 0.05, (head, before)


def test_check_learned_model_asks_a_pair_model_for_the_pair_calls() -> None:
    class Pair(nn.Module):
        scoring = "pair"

    for name in PAIR_MODEL_METHODS:
        setattr(Pair, name, lambda *args: None)
    check_learned_model(Pair(), "mine", "pair")  # no embed, score_all or peek_memory needed
    with pytest.raises(ModelProtocolError, match="embed"):
        check_learned_model(Pair(), "mine", "node")
    del Pair.score_pairs  # type: ignore[attr-defined]
    with pytest.raises(ModelProtocolError, match="lacks score_pairs"):
        check_learned_model(Pair(), "mine", "pair")
    with pytest.raises(ValueError, match="scoring='pair' with kind='heuristic'"):
        ModelSpec(lambda inputs: None, "heuristic", scoring="pair")  # type: ignore[arg-type, return-value]
    assert MODELS.get("cawn").scoring == "pair" and MODELS.get("tgn").scoring == "node"
    reference = "frugal.tgraph.models.cawn:CAWN"
    try:
        assert MODELS.get(reference).scoring == "pair"  # read from the class attribute
    finally:
        MODELS.unregister(reference)  # resolved references are cached: leave no trace


def test_node_classification_refuses_a_pair_model(stream: TemporalEvents) -> None:
    labelled = replace(stream, node_label=np.arange(stream.num_nodes) % 2, label_names=("a", "b"))
    protocol = build_protocol(labelled, "s", ProtocolConfig())
    with pytest.raises(ValueError, match="scores \\(src, dst\\) pairs only"):
        run_node_classification(_cawn(stream), protocol, 0)  # type: ignore[arg-type]


def _row(model: str, mrr: float, ranking: str | None, **extra: object) -> dict[str, object]:
    row = {
        "system": model, "dataset": "d1", "protocol": "frugal", "protocol_hash": "ab" * 32,
        "setting": "transductive", "negatives": "random", "seed": 0, "auc": 0.8, "mrr": mrr,
        **extra,
    }  # fmt: skip
    if ranking != "legacy":
        row["ranking"] = ranking
    return row


def test_leaderboard_never_puts_all_and_sampled_mrr_in_one_table() -> None:
    rows = [
        _row("tgn", 0.2, "all", sampled_mrr=0.5),
        _row("edgebank", 0.1, "legacy"),  # written before rankings were labelled: 'all'
        _row("cawn", 0.6, "sampled:100", sampled_mrr=0.6),
    ]
    text = render_leaderboard(rows, "mrr")
    tables = text.split("\n## ")[1:]
    assert len(tables) == 2
    (all_table,) = [
        t for t in tables if t.startswith("transductive / random negatives / ranking all ")
    ]
    (sampled_table,) = [t for t in tables if "/ ranking sampled:100 " in t]
    assert "| dataset | tgn | edgebank |" in all_table and "cawn" not in all_table
    assert "| dataset | cawn |" in sampled_table and "tgn" not in sampled_table
    # sampled_mrr: one table, every model on the same candidates.
    sampled = render_leaderboard(rows, "sampled_mrr")
    assert sampled.count("\n## ") == 1
    assert "| d1 | 0.5000 (n=1) | — | 0.6000 (n=1) |" in sampled  # one seed each: no bold
    # AUC does not depend on the ranking: one table.
    assert render_leaderboard(rows, "auc").count("\n## ") == 1


def test_walk_encoder_gives_the_same_numbers_as_without_deduplication(
    stream: TemporalEvents,
) -> None:
    # Real walks and counts (many repeated patterns), encoded once per distinct (walk,
    # pattern) by the encoder and once per pair walk here, module by module.
    model = _cawn(stream, num_walks=6)
    finder = NeighborFinder(stream.src, stream.dst, stream.t, stream.num_nodes)
    src, t = stream.src[600:605], stream.t[600:605]
    dst = np.stack([stream.dst[600:605], stream.dst[610:615], stream.src[620:625]], axis=1)
    rng = np.random.default_rng(0)
    src_walks = model._walks(src, t, 600, finder, rng)
    dst_walks = model._walks(dst.ravel(), np.repeat(t, 3), 600, finder, rng)
    src_rows = np.repeat(np.arange(5), 3)  # each source serves its 3 pairs
    counts, _ = hitting_counts(src_walks.node[src_rows], dst_walks.node)
    steps, length, _ = model._steps(src_walks, np.arange(5))  # CAWN: no time gaps
    walk_pm = src_rows[:, None] * 6 + np.arange(6)
    encoder = model.walk_encoder
    with torch.no_grad():
        fast = encoder(counts, walk_pm, steps, length)
        position = encoder.position_mlp(torch.from_numpy(counts).float() / 6).sum(dim=3)
        flat_walk = torch.from_numpy(walk_pm.reshape(-1))
        lengths = length[flat_walk]
        feature = encoder.feature_encoder(
            torch.cat([steps[flat_walk], position.reshape(90, 3, -1)], dim=2), lengths
        )
        walk = torch.cat(
            [feature, encoder.position_encoder(position.reshape(90, 3, -1), lengths)], 1
        )
        slow = encoder.out_proj(encoder.projector(walk).reshape(15, 6, -1).mean(dim=1))
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-6)
    assert len(np.unique(counts.reshape(90, -1), axis=0)) < 90  # deduplication did something
