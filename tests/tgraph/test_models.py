"""Models: leakage (no future or same-batch events), state restore, heuristics, smoke training."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from frugal.data import TemporalEvents, load_events
from frugal.data.synthetic import TemporalStreamConfig, generate_temporal_events
from frugal.tgraph.models import (
    MODELS,
    EdgeBank,
    EdgeBankWindow,
    ModelInputs,
    Popularity,
    Recency,
    TemporalAttention,
    TemporalGNN,
)
from frugal.tgraph.neighbors import NeighborFinder
from frugal.tgraph.protocol import ProtocolConfig, build_protocol
from frugal.tgraph.train import evaluate_split, run_link_prediction, run_node_classification


@pytest.fixture(scope="module")
def stream() -> TemporalEvents:
    return generate_temporal_events(TemporalStreamConfig(num_events=1200, num_nodes=40))


def _model(variant: str, events: TemporalEvents, dim: int = 16) -> TemporalGNN:
    torch.manual_seed(0)
    msg = np.zeros((events.num_events, 0), np.float32)
    inputs = ModelInputs(num_nodes=events.num_nodes, msg=msg, embedding_dim=dim, num_neighbors=5)
    model = MODELS.get(variant).build(inputs)
    assert isinstance(model, TemporalGNN)
    model.eval()
    return model


def _step(model: TemporalGNN, events: TemporalEvents, lo: int, hi: int, finder: NeighborFinder):  # type: ignore[no-untyped-def]
    src, dst, t = events.src[lo:hi], events.dst[lo:hi], events.t[lo:hi]
    logits, _, _, other = model.forward_batch(src, [dst], t, lo, finder)
    model.commit_numpy(src, dst, t, np.arange(lo, hi), other)
    return logits[0]


@pytest.mark.parametrize("variant", ["tgn", "jodie", "dyrep", "tgat", "graphmixer"])
def test_no_batch_sees_future_or_its_own_events(variant: str, stream: TemporalEvents) -> None:
    full = NeighborFinder(stream.src, stream.dst, stream.t, stream.num_nodes)
    b0 = 600
    past = NeighborFinder(stream.src[:b0], stream.dst[:b0], stream.t[:b0], stream.num_nodes)
    model = _model(variant, stream)
    with torch.no_grad():
        for lo in range(0, b0, 100):
            _step(model, stream, lo, lo + 100, full)
        state = model.state()
        src, dst, t = stream.src[b0 : b0 + 100], stream.dst[b0 : b0 + 100], stream.t[b0 : b0 + 100]
        with_future = model.forward_batch(src, [dst], t, b0, full)[0][0]
        model.load_state(state)
        only_past = model.forward_batch(src, [dst], t, b0, past)[0][0]
    # A finder that holds the batch's own and later events gives the same scores as one that
    # holds only the past: nothing at or after the batch start is visible.
    torch.testing.assert_close(with_future, only_past)


def test_state_restore_gives_identical_passes(stream: TemporalEvents) -> None:
    protocol = build_protocol(stream, "synthetic", replace(ProtocolConfig(), eval_batch_size=100))
    finder = NeighborFinder(stream.src, stream.dst, stream.t, stream.num_nodes)
    model = _model("tgn", stream)
    with torch.no_grad():
        for lo in range(0, protocol.split.val_start, 100):
            _step(model, stream, lo, min(lo + 100, protocol.split.val_start), finder)
        backup = model.state()
        first = evaluate_split(model, protocol, "val", finder, use_ranking=True)
        assert not torch.equal(model.memory, backup["memory"])  # the pass moved the state
        model.load_state(backup)
        second = evaluate_split(model, protocol, "val", finder, use_ranking=True)
    np.testing.assert_array_equal(first.pos, second.pos)
    assert first.ranks is not None and second.ranks is not None
    np.testing.assert_array_equal(first.ranks, second.ranks)


def test_commit_keeps_each_nodes_last_message() -> None:
    events = TemporalEvents(
        src=np.array([0, 0]), dst=np.array([1, 2]), t=np.array([5, 7]), num_nodes=3
    )
    model = _model("tgn", events)
    tensors = (
        torch.tensor([0, 0]),
        torch.tensor([1, 2]),
        torch.tensor([5, 7]),
        torch.tensor([0, 1]),
    )
    model.commit(*tensors)
    # Node 0's last event is (0 -> 2, t 7, eid 1); nodes 1 and 2 each saw one event from 0.
    assert model.pending.tolist() == [True, True, True]
    assert model.pending_other.tolist() == [2, 0, 0]
    assert model.pending_t.tolist() == [7, 5, 7]
    assert model.pending_eid.tolist() == [1, 0, 1]


def test_commit_keeps_the_latest_event_whichever_side_the_node_was_on() -> None:
    # (0 -> 1, t 5), (1 -> 2, t 7), (3 -> 1, t 8), (1 -> 1, t 9): node 1 is dst, src, dst,
    # then both; each node's stored message must be its latest event.
    events = TemporalEvents(
        src=np.array([0, 1, 3, 1]), dst=np.array([1, 2, 1, 1]), t=np.array([5, 7, 8, 9]),
        num_nodes=4,
    )  # fmt: skip
    model = _model("tgn", events)
    model.commit(
        torch.tensor([0, 1, 3, 1]), torch.tensor([1, 2, 1, 1]), torch.tensor([5, 7, 8, 9]),
        torch.tensor([0, 1, 2, 3]),
    )  # fmt: skip
    assert model.pending_t.tolist() == [5, 9, 7, 8]
    assert model.pending_eid.tolist() == [0, 3, 1, 2]
    assert model.pending_other.tolist() == [1, 1, 1, 1]  # node 1's last event is a self-loop
    model.reset_state()
    # (0 -> 1, t 5), (1 -> 2, t 7): node 1's latest event is the one it sent.
    model.commit(
        torch.tensor([0, 1]), torch.tensor([1, 2]), torch.tensor([5, 7]), torch.tensor([0, 1])
    )
    assert model.pending_t.tolist() == [5, 7, 7, 0]
    assert model.pending_other.tolist() == [1, 2, 1, 0]
    assert model.pending.tolist() == [True, True, True, False]


def test_score_all_matches_pairwise_decoder(stream: TemporalEvents) -> None:
    model = _model("tgn", stream)
    z_src, z_cand = torch.randn(5, 16), torch.randn(7, 16)
    dense = torch.stack([model.score(z_src[i].expand(7, -1), z_cand) for i in range(5)])
    torch.testing.assert_close(model.score_all(z_src, z_cand, chunk_size=2), dense)


def test_heuristics_by_hand() -> None:
    # Seen: (0,1) at t 10, (0,1) at t 20, (2,1) at t 30. Window 15, query at t 40.
    src, dst, t = np.array([0, 0, 2]), np.array([1, 1, 1]), np.array([10, 20, 30])
    query = (np.array([0, 0, 2]), np.array([1, 2, 1]), np.array([40, 40, 40]))
    bank = EdgeBank(3)
    bank.observe(src, dst, t)
    assert bank.score(*query).tolist() == [1.0, 0.0, 1.0]
    window = EdgeBankWindow(3, window_s=15)
    window.observe(src, dst, t)
    assert window.score(*query).tolist() == [0.0, 0.0, 1.0]  # 40-20 > 15, 40-30 <= 15
    recency = Recency(3)
    recency.observe(src, dst, t)
    scores = recency.score(*query)
    assert scores[0] == -20 and scores[2] == -10 and scores[1] < -1e17
    popularity = Popularity(3, window_s=10)
    popularity.observe(src[:2], dst[:2], t[:2])  # node 1 at t 10 and 20 (one batch)
    popularity.observe(src[2:], dst[2:], t[2:])  # node 1 at t 30
    # Batch 1 decays 0 and adds 2 -> 2 at t 20; batch 2: 2 * e^-1 + 1 at t 30; query at 40
    # decays by e^-1 again.
    expected = (2 * np.exp(-1) + 1) * np.exp(-1)
    assert popularity.score(np.array([0]), np.array([1]), np.array([40]))[0] == pytest.approx(
        expected
    )


def test_node_classification_needs_labels(stream: TemporalEvents) -> None:
    unlabelled = replace(stream, node_label=None, label_names=())
    protocol = build_protocol(unlabelled, "synthetic", ProtocolConfig())
    with pytest.raises(ValueError, match="needs node labels"):
        run_node_classification(_model("tgn", stream), protocol, 0)
    with pytest.raises(ValueError, match=r"model='apan' is not a registered tgraph model"):
        run_link_prediction("apan", protocol, 0)


def test_early_stopping_stops_after_patience_epochs_without_gain(
    stream: TemporalEvents, monkeypatch: pytest.MonkeyPatch
) -> None:
    from frugal.tgraph import train

    # Scripted val APs: best at epoch 2; epochs 3-5 bring no gain of more than tolerance,
    # so with patience 3 training stops after epoch 5 (Benchtemp's EarlyStopMonitor).
    scripted = iter([0.50, 0.60, 0.60, 0.55, 0.6000001, 0.9, 0.9])
    monkeypatch.setattr(train, "_primary_val_ap", lambda protocol, scores: next(scripted))
    config = replace(ProtocolConfig(), max_epochs=7, patience=3, tolerance=1e-4)
    protocol = build_protocol(stream, "synthetic", config)
    result = run_link_prediction("jodie", protocol, 0, num_threads=1)
    assert [h["epoch"] for h in result.history] == [1, 2, 3, 4, 5]
    assert result.efficiency["epochs"] == 5 and result.efficiency["epochs_to_best"] == 2


def _tied_stream() -> TemporalEvents:
    # 14 training events at t 1..14 over nodes 0-4, then val: three events at t 20 and
    # test: three at t 30. The pair (5, 6) occurs twice at t 20 and never before.
    src = np.array([0, 1, 2, 3] * 3 + [0, 1] + [5, 5, 7] + [5, 7, 9])
    dst = np.array([1, 2, 3, 4] * 3 + [2, 3] + [6, 6, 8] + [6, 8, 6])
    t = np.array([*range(1, 15), 20, 20, 20, 30, 30, 30])
    return TemporalEvents(src=src, dst=dst, t=t, num_nodes=10)


@pytest.mark.parametrize("hold", [True, False])
def test_no_prediction_reads_an_event_of_its_own_time_through_state(hold: bool) -> None:
    events = _tied_stream()
    config = replace(ProtocolConfig(), use_tie_holdback=hold, mask_fraction=0.0, eval_batch_size=1)
    protocol = build_protocol(events, "tied", config)
    assert (protocol.split.val_start, protocol.split.test_start) == (14, 17)
    bank = EdgeBank(events.num_nodes)
    bank.observe(events.src[:14], events.dst[:14], events.t[:14])
    val = evaluate_split(bank, protocol, "val", _full_finder(events), use_ranking=False)
    # use_tie_holdback (frugal): the second (5, 6) at t 20 must not see the first one (same
    # time, one batch earlier); without it every batch is committed as Benchtemp does.
    expected = [0.0, 0.0, 0.0] if hold else [0.0, 1.0, 0.0]
    assert val.pos.tolist() == expected
    # At the end of the pass every val event is stored: the test pass sees (5, 6).
    test = evaluate_split(bank, protocol, "test", _full_finder(events), use_ranking=False)
    assert test.pos.tolist() == [1.0, 1.0, 0.0]


@pytest.mark.parametrize("variant", ["tgn", "jodie", "dyrep", "tgat", "graphmixer"])
def test_held_back_ties_do_not_depend_on_the_eval_batch_size(variant: str) -> None:
    # Under frugal, a query at time t reads no event at time t: all val events share t 20,
    # so their scores must be the same whether the pass runs them in one batch of 3 or in
    # three batches of 1 (before, the second and third read the first through memory).
    events = _tied_stream()
    scores = []
    for batch in (3, 1):
        config = replace(ProtocolConfig(), mask_fraction=0.0, eval_batch_size=batch)
        protocol = build_protocol(events, "tied", config)
        model = _model(variant, events)
        with torch.no_grad():
            for lo in range(0, 14, 7):
                _step(model, events, lo, lo + 7, _full_finder(events))
            val = evaluate_split(model, protocol, "val", _full_finder(events), use_ranking=False)
        scores.append(val.pos)
    np.testing.assert_allclose(scores[0], scores[1], rtol=1e-5, atol=1e-6)


def test_frugal_evaluation_hides_the_dropped_training_events_of_masked_nodes(
    stream: TemporalEvents,
) -> None:
    from frugal.tgraph.train import _evaluation_finder

    for events_seen, hidden in (("visible", True), ("all", False)):
        config = replace(ProtocolConfig(), eval_neighbor_events=events_seen)
        protocol = build_protocol(stream, "synthetic", config)
        split = protocol.split
        masked = split.masked_nodes
        assert len(masked) > 0
        finder = _evaluation_finder(protocol)
        # Neighbours of every masked node just before the val cut.
        cutoff = finder.cutoff_before(np.full(len(masked), stream.t[split.val_start]))
        found = finder.sample(masked, cutoff, 50).mask.sum()
        in_train_period = np.isin(stream.src[: split.val_start], masked) | np.isin(
            stream.dst[: split.val_start], masked
        )
        assert in_train_period.sum() > 0  # they had events, dropped from training
        assert (found == 0) if hidden else (found > 0)


def test_benchtemp_neighbours_are_bounded_by_time_only(stream: TemporalEvents) -> None:
    from frugal.tgraph.train import _neighbour_bound

    scores = {}
    for name in ("batch", "time"):
        for batch in (1, 400):
            config = replace(ProtocolConfig(), neighbor_bound=name, eval_batch_size=batch)
            protocol = build_protocol(stream, "synthetic", config)
            model = _model("tgat", stream)  # no state: only the neighbour bound matters
            finder = _full_finder(stream)
            with torch.no_grad():
                scores[name, batch] = evaluate_split(
                    model, protocol, "val", finder, use_ranking=False
                ).pos
        assert _neighbour_bound(protocol, 7) == (stream.num_events if name == "time" else 7)
    # 'time' (benchtemp): a query sees its own batch's earlier events, so the batch size is
    # moot.
    np.testing.assert_allclose(scores["time", 1], scores["time", 400], atol=1e-6)
    # 'batch' (frugal): a batch hides its own events; batches of 1 see more than of 400.
    assert not np.allclose(scores["batch", 1], scores["batch", 400], atol=1e-6)
    np.testing.assert_allclose(scores["batch", 1], scores["time", 1], atol=1e-6)


def test_benchtemp_early_stopping_reads_the_per_batch_val_ap(stream: TemporalEvents) -> None:
    from frugal.tgraph.evaluator import link_prediction_metrics, per_batch_metrics
    from frugal.tgraph.train import SplitScores, _primary_val_ap

    for metric in ("ap", "ap_per_batch"):
        config = replace(ProtocolConfig(), early_stopping_metric=metric, eval_batch_size=7)
        protocol = build_protocol(stream, "synthetic", config)
        start, end = protocol.split.bounds("val")
        rng = np.random.default_rng(0)
        key = next(k for k in protocol.negatives if k.startswith("val/") and k.endswith("/random"))
        # Scores that drift over the split, so global and per-batch AP differ.
        drift = np.linspace(0, 3, end - start)
        scores = SplitScores(
            pos=rng.normal(size=end - start) + 1 + drift,
            neg={key: rng.normal(size=end - start) + drift},
            ranks=None,
            seconds=0.0,
        )
        negative = protocol.negatives_for("val", "transductive", "random")
        mask = negative >= 0
        pos, neg = scores.pos[mask], scores.neg[key][mask]
        per_batch = per_batch_metrics(pos, neg, 7)["ap_per_batch"]
        global_ap = link_prediction_metrics(pos, neg)["ap"]
        assert abs(per_batch - global_ap) > 0.01
        expected = per_batch if metric == "ap_per_batch" else global_ap
        assert _primary_val_ap(protocol, scores) == pytest.approx(expected)


def test_node_classifier_standardises_with_training_nodes_only() -> None:
    from frugal.tgraph.train import _node_split, fit_node_classifier

    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(3), 20)
    x = torch.from_numpy(rng.normal(size=(60, 4)) + labels[:, None]).float()
    part = _node_split(labels, np.random.default_rng(5))
    assert np.bincount(part).tolist() == [36, 12, 12]  # 60/20/20 within every class
    shifted = x.clone()
    shifted[torch.from_numpy(part == 2)] = shifted[torch.from_numpy(part == 2)] * 50 + 1000
    kwargs = {"max_steps": 200, "standardize": True}
    a = fit_node_classifier(x, labels, 3, 5, **kwargs)  # type: ignore[arg-type]
    b = fit_node_classifier(shifted, labels, 3, 5, **kwargs)  # type: ignore[arg-type]
    # Test features never reach training or selection: val AUC and the steps are unchanged.
    assert a["nc_val_auc"] == b["nc_val_auc"] and a["nc_steps"] == b["nc_steps"]
    assert a["nc_auc"] > 0.8 and 0 <= a["nc_macro_f1"] <= 1


def test_benchtemp_scores_each_inductive_view_in_a_pass_of_its_own(
    stream: TemporalEvents,
) -> None:
    from frugal.tgraph.train import _view_passes

    def fitted(protocol):  # type: ignore[no-untyped-def]
        model = Popularity(stream.num_nodes, window_s=50.0)
        index = protocol.split.train_index
        model.observe(stream.src[index], stream.dst[index], stream.t[index])
        evaluate_split(model, protocol, "val", _full_finder(stream), use_ranking=False)
        return model

    frugal = build_protocol(stream, "synthetic", ProtocolConfig())
    assert _view_passes(fitted(frugal), frugal, _full_finder(stream), None, lambda: None) == {}
    config = replace(ProtocolConfig.benchtemp(), eval_batch_size=16, use_ranking=False)
    protocol = build_protocol(stream, "synthetic", config)
    model = fitted(protocol)
    state = model.state()
    full = evaluate_split(model, protocol, "test", _full_finder(stream), use_ranking=False)
    passes = _view_passes(model, protocol, _full_finder(stream), state, lambda: None)
    assert set(passes) == {"inductive", "new_old", "new_new"}
    start, _ = protocol.split.bounds("test")
    negative_key = "test/inductive/random"
    for view, scores in passes.items():
        mask = protocol.split.view_mask("test", view)
        assert mask.sum() > 16 or view == "new_new"  # more than one batch
        assert np.isnan(scores.pos[~mask]).all() and not np.isnan(scores.pos[mask]).any()
        # Reference: the backed-up state fed only this view's events, batch by batch.
        ref = Popularity(stream.num_nodes, window_s=50.0)
        ref.load_state(state)
        ids = start + np.flatnonzero(mask)
        expected = []
        for lo in range(0, len(ids), 16):
            part = ids[lo : lo + 16]
            expected.extend(ref.score(stream.src[part], stream.dst[part], stream.t[part]))
            ref.observe(stream.src[part], stream.dst[part], stream.t[part])
        np.testing.assert_array_equal(scores.pos[mask], expected)
    # The full pass also saw the transductive-only events before them: other scores.
    inductive = protocol.split.view_mask("test", "inductive")
    assert not np.array_equal(full.pos[inductive], passes["inductive"].pos[inductive])
    assert negative_key in protocol.negatives


def test_benchtemp_tgat_samples_neighbours_uniformly(stream: TemporalEvents) -> None:
    config = replace(ProtocolConfig.benchtemp(), max_epochs=1, embedding_dim=16, use_ranking=False)
    protocol = build_protocol(stream, "synthetic", config)
    tgat = run_link_prediction("tgat", protocol, 0, num_threads=1)
    tgn = run_link_prediction("tgn", protocol, 0, num_threads=1)
    assert tgat.model.neighbor_strategy == "uniform"  # type: ignore[union-attr]
    assert tgn.model.neighbor_strategy == "recent"  # type: ignore[union-attr]
    frugal = build_protocol(stream, "synthetic", replace(config, neighbor_sampling="recent"))
    # Node classification replays the stream with the same seeded uniform draws.
    nc = run_node_classification(tgat.model, protocol, 0, max_steps=20)  # type: ignore[arg-type]
    assert 0 <= nc["nc_auc"] <= 1
    tgat_frugal = run_link_prediction("tgat", frugal, 0, num_threads=1)
    assert tgat_frugal.model.neighbor_strategy == "recent"  # type: ignore[union-attr]


def test_split_held_batches_store_the_right_dyrep_vectors() -> None:
    # Coarse times and batches of 7 split many held batches at a time boundary; tag each
    # DyRep message vector with its event id (+ 0.5 on the destination half) and check that
    # every node ends up with its latest val event's vector, from the right half.
    from frugal.tgraph.train import _evaluation_finder

    rng = np.random.default_rng(3)
    num_events, num_nodes = 900, 30
    src = rng.integers(0, num_nodes, num_events)
    dst = (src + 1 + rng.integers(0, num_nodes - 1, num_events)) % num_nodes
    events = TemporalEvents(
        src=src, dst=dst, t=np.sort(rng.integers(0, 200, num_events)), num_nodes=num_nodes
    )
    config = replace(ProtocolConfig(), eval_batch_size=7, embedding_dim=16)
    protocol = build_protocol(events, "coarse", config)
    start, end = protocol.split.bounds("val")
    t = events.t
    split_batches = sum(
        t[start + lo] < t[start + lo + 6] == t[start + lo + 7]
        for lo in range(0, end - start - 7, 7)
    )
    assert split_batches >= 5
    model = _model("dyrep", events)
    forward = model.forward_batch

    def tagged(src, dst_sets, t, first_eid, finder, rng=None):  # type: ignore[no-untyped-def]
        logits, memory, last, vec = forward(src, dst_sets, t, first_eid, finder, rng)
        ids = torch.from_numpy(first_eid + np.arange(len(src))).float()
        vec = vec.clone()
        vec[: len(src), 0], vec[len(src) :, 0] = ids, ids + 0.5
        return logits, memory, last, vec

    model.forward_batch = tagged  # type: ignore[method-assign]
    with torch.no_grad():
        evaluate_split(model, protocol, "val", _evaluation_finder(protocol), use_ranking=False)
    latest = {}
    for i in range(start, end):
        latest[int(src[i])], latest[int(dst[i])] = i, i
    for node, eid in latest.items():
        assert int(model.pending_eid[node]) == eid
        vec = float(model.pending_vec[node, 0])
        assert int(vec) == eid  # the vector of that very event
        # A source stores the destination's half (+ 0.5) and a destination the source's.
        assert (vec % 1 == 0.5) == (int(src[eid]) == node)


def _full_finder(events: TemporalEvents) -> NeighborFinder:
    return NeighborFinder(events.src, events.dst, events.t, events.num_nodes)


def _hospital_prefix(num_events: int = 6000) -> TemporalEvents:
    full = load_events("sp_hospital")
    return replace(
        full, src=full.src[:num_events], dst=full.dst[:num_events], t=full.t[:num_events]
    )


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["tgn", "jodie", "dyrep", "tgat"])
def test_smoke_training_learns_on_real_data(variant: str) -> None:
    events = _hospital_prefix()
    config = replace(
        ProtocolConfig(), max_epochs=3, learning_rate=3e-3, embedding_dim=32, num_neighbors=5
    )
    protocol = build_protocol(events, "sp_hospital_prefix", config)
    result = run_link_prediction(variant, protocol, 0, num_threads=1)
    losses = [h["loss"] for h in result.history]
    assert losses[-1] < losses[0]
    head = next(
        r for r in result.rows if r["view"] == "transductive" and r["negatives"] == "random"
    )
    assert head["auc"] > 0.6
    assert 0 < head["mrr"] <= 1
    assert result.efficiency["params"] > 0
    if variant == "tgn":
        nc = run_node_classification(result.model, protocol, 0)  # type: ignore[arg-type]
        assert 0 <= nc["nc_auc"] <= 1
        assert nc["num_classes"] == 4


def test_fresh_memory_counts_time_from_the_stream_start() -> None:
    # Unix-second timestamps: a node's first message must see dt = t - t0 (here 5 s), not
    # ~1.7e9 s since 1970.
    events = TemporalEvents(
        src=np.array([0, 1]), dst=np.array([1, 2]), t=np.array([1_700_000_000, 1_700_000_005]),
        num_nodes=3,
    )  # fmt: skip
    msg = np.zeros((2, 0), np.float32)
    from frugal.tgraph.models.tgn import build_tgn

    inputs = ModelInputs(
        num_nodes=3, msg=msg, embedding_dim=8, num_neighbors=2, time_origin=int(events.t[0])
    )
    model = build_tgn(inputs)
    assert model.last_update.tolist() == [1_700_000_000] * 3
    model.reset_state()
    assert model.last_update.tolist() == [1_700_000_000] * 3
    model.commit_numpy(events.src[:1], events.dst[:1], events.t[:1], np.array([0]))
    _, last_update = model._flushed_memory(torch.tensor([0, 1]))
    assert last_update[:2].tolist() == [1_700_000_000, 1_700_000_000]  # the pending event's t


def test_time_encoder_learns_frequencies_in_log_space() -> None:
    from frugal.tgraph.models import TimeEncoder

    learnable, fixed = TimeEncoder(4), TimeEncoder(4, learnable=False)
    assert learnable.log_scale.requires_grad and not fixed.log_scale.requires_grad
    # w = 10^-[0, 3, 6, 9], b = 0: phi(0) = 1 everywhere, phi(1)[0] = cos(1).
    torch.testing.assert_close(learnable.weight, torch.tensor([1.0, 1e-3, 1e-6, 1e-9]))
    torch.testing.assert_close(learnable(torch.zeros(1)), torch.ones(1, 4))
    assert learnable(torch.ones(1))[0, 0].item() == pytest.approx(np.cos(1.0), abs=1e-6)
    # One Adam step at lr 1e-3 moves every frequency by about 0.1 % of itself: the lowest
    # one stays near 1e-9 (a linear parametrisation would move it to about 1e-3).
    optimizer = torch.optim.Adam(learnable.parameters(), lr=1e-3)
    learnable(torch.tensor([1e6, 3e6])).sum().backward()
    optimizer.step()
    ratio = learnable.weight.detach() / torch.tensor([1.0, 1e-3, 1e-6, 1e-9])
    assert torch.all((ratio - 1).abs() <= 1.01e-3)
    assert torch.any((ratio - 1).abs() > 1e-4)  # it did learn


def _textbook_attention(
    att: TemporalAttention,
    h_self: torch.Tensor,
    h_nbr: torch.Tensor,
    e_nbr: torch.Tensor,
    phi_zero: torch.Tensor,
    phi_nbr: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    """Keys, values and edge terms projected per (query, neighbour) pair, one head at a time."""
    num, _k, d = h_nbr.shape
    heads, c = att.num_heads, d // att.num_heads
    query = att.query(torch.cat([h_self, phi_zero.expand(num, -1)], dim=1))
    edge = att.edge(torch.cat([e_nbr, phi_nbr], dim=2))
    key, value = att.node_key(h_nbr) + edge, att.node_value(h_nbr) + edge
    out = torch.zeros(num, d)
    for b in range(num):  # the reference is deliberately per query and per head
        if not mask[b].any():
            continue
        for h in range(heads):
            part = slice(h * c, (h + 1) * c)
            logits = key[b, :, part] @ query[b, part] / c**0.5
            weight = torch.softmax(logits.masked_fill(~mask[b], float("-inf")), dim=0)
            out[b, part] = weight @ value[b, :, part]
    result: torch.Tensor = att.merge(torch.cat([out, h_self], dim=1))
    return result


@pytest.mark.parametrize("edge_dim", [0, 3])
def test_attention_matches_the_textbook_form(edge_dim: int) -> None:
    torch.manual_seed(0)
    num, k, d, t_dim = 6, 4, 8, 6
    att = TemporalAttention(d, edge_dim, t_dim, num_heads=2, dropout=0.1).eval()
    h_self, h_nbr = torch.randn(num, d), torch.randn(num, k, d, requires_grad=True)
    e_nbr, phi_nbr, phi_zero = (
        torch.randn(num, k, edge_dim),
        torch.randn(num, k, t_dim),
        torch.randn(t_dim),
    )
    mask = torch.rand(num, k) > 0.4
    mask[0] = False  # a query without neighbours gets the zero attention output
    mask[1] = True
    fast = att(h_self, h_nbr, e_nbr, phi_zero, phi_nbr, mask)
    slow = _textbook_attention(att, h_self, h_nbr, e_nbr, phi_zero, phi_nbr, mask)
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-5)
    # Gradients agree too (the re-association is exact algebra, not an approximation).
    grad_fast = torch.autograd.grad(fast.square().sum(), [h_nbr, att.edge.weight])
    grad_slow = torch.autograd.grad(slow.square().sum(), [h_nbr, att.edge.weight])
    for a, b in zip(grad_fast, grad_slow, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    # h_nbr=None means all-zero neighbour features (TGAT's first layer).
    zeros = torch.zeros(num, k, d)
    torch.testing.assert_close(
        att(h_self, None, e_nbr, phi_zero, phi_nbr, mask),
        _textbook_attention(att, h_self, zeros, e_nbr, phi_zero, phi_nbr, mask),
        rtol=1e-5,
        atol=1e-5,
    )
    # e_nbr=None means all-zero edge features: skipped, same output, zero edge-weight grads.
    zero_edges = torch.zeros(num, k, edge_dim)
    skipped = att(h_self, h_nbr, None, phi_zero, phi_nbr, mask)
    padded = _textbook_attention(att, h_self, h_nbr, zero_edges, phi_zero, phi_nbr, mask)
    torch.testing.assert_close(skipped, padded, rtol=1e-5, atol=1e-5)
    (grad_skipped,) = torch.autograd.grad(skipped.square().sum(), [att.edge.weight])
    (grad_padded,) = torch.autograd.grad(padded.square().sum(), [att.edge.weight])
    torch.testing.assert_close(grad_skipped, grad_padded, rtol=1e-4, atol=1e-5)
    assert torch.all(grad_padded[:, :edge_dim] == 0)


def test_time_encoder_backward_matches_autograd() -> None:
    from frugal.tgraph.models import TimeEncoder

    torch.manual_seed(0)
    encoder = TimeEncoder(5)
    with torch.no_grad():
        encoder.log_scale.copy_(torch.randn(5))
        encoder.bias.copy_(torch.randn(5))
    dt = torch.rand(3, 4, dtype=torch.float64) * 100
    upstream = torch.randn(3, 4, 5)
    fast = encoder(dt)
    # The reference: autograd through the textbook expression, in float64.
    w64 = encoder.weight.double()
    slow = torch.cos(dt.unsqueeze(-1) * w64 + encoder.bias.double())
    torch.testing.assert_close(fast, slow.float(), rtol=1e-5, atol=1e-5)
    grads_fast = torch.autograd.grad((fast * upstream).sum(), [encoder.log_scale, encoder.bias])
    grads_slow = torch.autograd.grad(
        (slow * upstream.double()).sum(), [encoder.log_scale, encoder.bias]
    )
    for a, b in zip(grads_fast, grads_slow, strict=True):
        torch.testing.assert_close(a, b.float(), rtol=1e-4, atol=1e-4)
    assert fast.shape == (3, 4, 5)


def test_time_encoder_deduplicates_repeated_dt_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    from frugal.tgraph.models import blocks as tgnn

    torch.manual_seed(0)
    encoder = tgnn.TimeEncoder(6)
    with torch.no_grad():
        encoder.log_scale.copy_(torch.randn(6))
        encoder.bias.copy_(torch.randn(6))
    encoded_rows: list[int] = []
    apply = tgnn._CosineEncoding.apply

    def counting_apply(dt_M: torch.Tensor, w_T: torch.Tensor, b_T: torch.Tensor) -> torch.Tensor:
        encoded_rows.append(dt_M.numel())
        out: torch.Tensor = apply(dt_M, w_T, b_T)
        return out

    monkeypatch.setattr(tgnn._CosineEncoding, "apply", counting_apply)
    # 100 x 60 slots over 37 distinct values (with the padding value 0 among them).
    repeated = torch.randint(0, 37, (100, 60)).float() * 1_000.0
    distinct = torch.randperm(6_000).float().view(100, 60)
    upstream = torch.randn(100, 60, 6)
    for dt, expected_rows in ((repeated, 37), (distinct, 6_000)):
        encoded_rows.clear()
        fast = encoder(dt)
        assert encoded_rows == [expected_rows]  # distinct values only, or all when no gain
        grads = torch.autograd.grad((fast * upstream).sum(), [encoder.log_scale, encoder.bias])
        monkeypatch.setattr(tgnn, "_DEDUP_MIN_SLOTS", 10**9)  # every slot encoded
        encoded_rows.clear()
        plain = encoder(dt)
        assert encoded_rows == [6_000]
        plain_grads = torch.autograd.grad(
            (plain * upstream).sum(), [encoder.log_scale, encoder.bias]
        )
        monkeypatch.setattr(tgnn, "_DEDUP_MIN_SLOTS", 4096)
        assert torch.equal(fast, plain)  # the same scalar ops per element: bit-identical
        for a, b in zip(grads, plain_grads, strict=True):  # only the summation order differs
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-3)
            assert torch.all(a != 0)


@pytest.mark.parametrize("num_columns", [0, 1, 7, 5_000])
def test_unique_columns_equals_numpy_unique(num_columns: int) -> None:
    from frugal.tgraph.models.blocks import unique_columns as _unique_columns

    rng = np.random.default_rng(num_columns)
    # Few distinct values per row, so columns repeat; negative values sort numerically.
    rows = rng.integers(-3, 4, size=(3, num_columns)).astype(np.int64)
    unique, inverse = _unique_columns(rows)
    expected_unique, expected_inverse = np.unique(rows, axis=1, return_inverse=True)
    np.testing.assert_array_equal(unique, expected_unique)
    np.testing.assert_array_equal(inverse, expected_inverse.ravel())
    np.testing.assert_array_equal(unique[:, inverse], rows)  # every column is recovered


def test_neighbour_memory_is_flushed_with_the_batch() -> None:
    # Batch 1: 1 -> 2 at t 1. Batch 2: 2 -> 3 at t 2; node 1 is not in batch 2 but is node
    # 2's neighbour, so its stored message must be applied before the attention reads it.
    events = TemporalEvents(
        src=np.array([1, 2]), dst=np.array([2, 3]), t=np.array([1, 2]), num_nodes=4
    )
    model = _model("tgn", events)
    finder = NeighborFinder(events.src, events.dst, events.t, events.num_nodes)
    with torch.no_grad():
        _step(model, events, 0, 1, finder)
        expected, _ = model.peek_memory()
        assert bool(model.pending[1])
        _, memory, _, _ = model.forward_batch(
            events.src[1:], [events.dst[1:]], events.t[1:], 1, finder
        )
        torch.testing.assert_close(memory[1], expected[1])
        model.commit_numpy(events.src[1:], events.dst[1:], events.t[1:], np.array([1]))
    assert not bool(model.pending[1])
    torch.testing.assert_close(model.memory[1], expected[1])
    assert model.memory[1].abs().sum() > 0


def _plain_pair_attention(
    qk: torch.Tensor, f: torch.Tensor, mask: torch.Tensor, keep: torch.Tensor | None
) -> torch.Tensor:
    logits = torch.bmm(qk, f.transpose(1, 2)).masked_fill(~mask.unsqueeze(1), float("-inf"))
    weight = torch.softmax(logits, dim=2).nan_to_num(0.0)
    return torch.bmm(weight if keep is None else weight * keep, f)


def test_pair_attention_backward_matches_autograd() -> None:
    from frugal.tgraph.models.blocks import _PairAttention

    torch.manual_seed(0)
    qk = torch.randn(5, 2, 7, dtype=torch.float64, requires_grad=True)
    f = torch.randn(5, 4, 7, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(5, 4) > 0.4
    mask[0], mask[1] = False, True
    # Without dropout: finite differences against the hand-written backward.
    assert torch.autograd.gradcheck(lambda a, b: _PairAttention.apply(a, b, mask, 0.0), (qk, f))
    # With dropout: the same keep mask (same seed) in a plain autograd version.
    grad = torch.randn(5, 2, 7, dtype=torch.float64)
    torch.manual_seed(1)
    fast = _PairAttention.apply(qk, f, mask, 0.5)
    torch.manual_seed(1)
    keep = torch.empty(5, 2, 4, dtype=torch.float64).bernoulli_(0.5).div_(0.5)
    slow = _plain_pair_attention(qk, f, mask, keep)
    torch.testing.assert_close(fast, slow)
    for a, b in zip(
        torch.autograd.grad(fast, (qk, f), grad),
        torch.autograd.grad(slow, (qk, f), grad),
        strict=True,
    ):
        torch.testing.assert_close(a, b)
    assert fast[0].abs().sum() == 0  # no neighbours: zero output


def test_node_classifier_learns_separable_classes_on_a_small_graph() -> None:
    # 75 nodes in 4 classes (SocioPatterns hospital's size): 45 training nodes are one
    # mini-batch, so the classifier must count steps, not epochs, to train at all.
    from frugal.tgraph.train import fit_node_classifier

    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), [8, 27, 29, 11])  # hospital's class sizes
    centers = rng.normal(size=(4, 16)) * 2.0
    x = torch.from_numpy((centers[labels] + rng.normal(size=(75, 16))).astype(np.float32))
    result = fit_node_classifier(x, labels, 4, seed=0)
    assert result["nc_auc"] > 0.9 and result["nc_val_auc"] > 0.9
    assert result["nc_steps"] >= 300  # stops on patience (30 scores x 10 steps) at the earliest
    # Features unrelated to the classes give chance-level test AUC, not a learned one.
    noise = torch.from_numpy(rng.normal(size=(75, 16)).astype(np.float32))
    assert fit_node_classifier(noise, labels, 4, seed=0)["nc_auc"] < 0.8


def test_degree_features_by_hand() -> None:
    from frugal.tgraph.train import degree_features

    # 0->1 at t 0, 0->2 at t 10, 1->2 at t 20 (span 20); node 3 never appears.
    events = TemporalEvents(
        src=np.array([0, 0, 1]), dst=np.array([1, 2, 2]), t=np.array([0, 10, 20]), num_nodes=4
    )
    got = degree_features(events).numpy()
    two = np.log1p(2.0)
    expected = [
        [two, two, 1.0, 0.0, 0.5, np.log1p(10.0)],
        [two, two, 0.5, 0.0, 1.0, np.log1p(20.0)],
        [two, two, 0.0, 0.5, 1.0, np.log1p(10.0)],
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    ]
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_train_step_draws_negatives_first_and_commits_the_batch(stream: TemporalEvents) -> None:
    from frugal.tgraph.train import train_step

    model = _model("tgn", stream)
    model.train()
    twin = _model("tgn", stream)  # same seed: identical weights
    twin.train()
    finder = NeighborFinder(stream.src[:200], stream.dst[:200], stream.t[:200], stream.num_nodes)
    index = np.arange(200, 250, dtype=np.int64)
    pool = np.unique(stream.dst[:200])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the weights stay
    torch.manual_seed(1)
    loss = train_step(
        model, optimizer, stream, index, dst_pool=pool, bound=200, finder=finder,
        rng=np.random.default_rng(7),
    )  # fmt: skip
    # By hand: the negatives are the first 50 draws of the seeded generator over the pool;
    # the loss is mean BCE(pos, 1) + mean BCE(neg, 0) = mean softplus(-pos) + mean softplus(neg).
    neg = pool[np.random.default_rng(7).integers(0, len(pool), size=50)]
    src, dst, t = stream.src[index], stream.dst[index], stream.t[index]
    torch.manual_seed(1)  # the same dropout masks
    with torch.no_grad():
        logits, _, _, _ = twin.forward_batch(src, [dst, neg], t, 200, finder)
    expected = (-logits[0]).exp().log1p().mean() + logits[1].exp().log1p().mean()
    assert float(loss.detach()) == pytest.approx(float(expected), rel=1e-6)
    # The batch's events are stored: every endpoint has a pending message, the last at t[-1].
    assert bool(model.pending[torch.from_numpy(np.concatenate([src, dst]))].all())
    assert int(model.pending_t.max()) == int(t[-1])


def test_commit_takes_numpy_arrays_as_commit_numpy_does() -> None:
    events = TemporalEvents(
        src=np.array([0, 0]), dst=np.array([1, 2]), t=np.array([5, 7]), num_nodes=3
    )
    model = _model("tgn", events)
    # Reversed arrays have negative strides: the commit copies them to contiguous tensors.
    model.commit(np.array([0, 0]), np.array([2, 1])[::-1], np.array([5, 7]), np.array([0, 1]))
    # As in test_commit_keeps_each_nodes_last_message: node 0 keeps (0 -> 2, t 7, eid 1).
    assert model.pending_other.tolist() == [2, 0, 0]
    assert model.pending_t.tolist() == [7, 5, 7]
    assert model.pending_eid.tolist() == [1, 0, 1]
    assert TemporalGNN.commit_numpy is TemporalGNN.commit
