"""The GNN workload: sampler, SAGE layer, training through tables, PubMed quality, bad input."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from frugal.data import load_events
from frugal.data.papers_like import PapersLikeConfig, papers_like
from frugal.store import EmbeddingStore, OptimizerConfig, RowSpec, StoreError
from frugal.store.baselines import BenchTable, HybridLogTable, KvOffloadTable, RamTable
from frugal.store.gnn import (
    GnnTrainConfig,
    Graph,
    GraphSAGE,
    NeighborSampler,
    SAGEConv,
    load_rows,
    train_gnn,
)
from frugal.store.gnn.sampler import _sample_positions

MIB = 1 << 20


def _star_graph() -> Graph:
    # Node 0 is joined to 1..7, 2-3 is an edge, 8 is isolated (undirected):
    # rows 0: [1..7] (degree 7), 1: [0], 2: [0, 3], 3: [0, 2], 4..7: [0], 8: [].
    src = np.array([0, 0, 0, 0, 0, 0, 0, 2])
    dst = np.array([1, 2, 3, 4, 5, 6, 7, 3])
    ids = np.arange(9)
    return Graph.from_edges(
        src, dst, 9, ids % 2, train_ids=ids[:5], val_ids=ids[5:7], test_ids=ids[7:]
    )


def _neighbours(graph: Graph, node: int) -> set[int]:
    return set(graph.indices[graph.indptr[node] : graph.indptr[node + 1]].tolist())


def test_sampler_blocks_on_a_hand_built_graph() -> None:
    graph = _star_graph()
    sampler = NeighborSampler(graph, fanouts=(2, 2), batch_size=2, seed=0)
    batch = sampler.sample(np.array([2, 8]), step=0)
    # Hop 0: node 2 has 2 <= fanout neighbours, so both (0 and 3, in row order); 8 has none.
    assert batch.n_id[:4].tolist() == [2, 8, 0, 3]
    out = batch.blocks[-1]
    assert (out.num_dst, out.num_src) == (2, 4)
    assert out.dst.tolist() == [0, 0] and batch.n_id[out.src].tolist() == [0, 3]
    # Hop 1 reads every node so far: 2 -> {0, 3}, 8 -> {}, 0 -> 2 of its 7, 3 -> {0, 2}.
    inner = batch.blocks[0]
    assert (inner.num_dst, inner.num_src) == (4, len(batch.n_id))
    counts = np.bincount(inner.dst, minlength=4)
    assert counts.tolist() == [2, 0, 2, 2]
    assert len(batch.n_id) == len(np.unique(batch.n_id))  # n_id is unique
    for s, d in zip(inner.src.tolist(), inner.dst.tolist(), strict=True):
        assert int(batch.n_id[s]) in _neighbours(graph, int(batch.n_id[d]))
    drawn = batch.n_id[inner.src[inner.dst == 2]]
    assert len(set(drawn.tolist())) == 2  # without replacement
    assert set(batch.n_id[inner.src[inner.dst == 3]].tolist()) == {0, 2}


def test_sampler_respects_fanouts_and_real_edges_on_a_larger_graph(tmp_path: Path) -> None:
    graph = papers_like(tmp_path / "g", PapersLikeConfig(num_nodes=2000, num_classes=4, seed=3))
    sampler = NeighborSampler(graph, fanouts=(3, 2), batch_size=64, seed=1, nodes=np.arange(300))
    degrees = graph.degrees()
    for batch in sampler:
        assert np.array_equal(batch.n_id[: len(batch.seeds)], batch.seeds)  # seeds first
        for block, fanout in zip(batch.blocks, (2, 3), strict=True):  # input layer first
            per_dst = np.bincount(block.dst, minlength=block.num_dst)
            dst_nodes = batch.n_id[: block.num_dst]
            # Each node gets min(fanout, degree) draws (rows may repeat a neighbour id).
            assert np.array_equal(per_dst, np.minimum(degrees[dst_nodes], fanout))
            for s, d in zip(block.src[:50].tolist(), block.dst[:50].tolist(), strict=True):
                assert int(batch.n_id[s]) in _neighbours(graph, int(batch.n_id[d]))
        assert batch.blocks[0].num_dst == batch.blocks[1].num_src
    assert len(sampler) == 5  # ceil(300 / 64)


def test_sampler_is_deterministic_and_safe_to_run_ahead() -> None:
    graph = _star_graph()
    first = list(NeighborSampler(graph, fanouts=(2, 2), batch_size=2, seed=5))
    again = NeighborSampler(graph, fanouts=(2, 2), batch_size=2, seed=5)
    ahead = list(again)[::-1]  # drawing later batches first changes nothing
    for a, b in zip(first, ahead[::-1], strict=True):
        assert np.array_equal(a.n_id, b.n_id)
        assert all(
            np.array_equal(x.src, y.src) and np.array_equal(x.dst, y.dst)
            for x, y in zip(a.blocks, b.blocks, strict=True)
        )
        assert np.array_equal(again.sample(a.seeds, a.step).n_id, a.n_id)
    other = list(NeighborSampler(graph, fanouts=(2, 2), batch_size=2, seed=6))
    assert any(not np.array_equal(a.seeds, b.seeds) for a, b in zip(first, other, strict=True))
    again.set_epoch(1)  # a new epoch reshuffles
    assert [b.seeds.tolist() for b in again] != [b.seeds.tolist() for b in first]


def test_floyd_draws_are_distinct_and_uniform() -> None:
    # 20,000 nodes of degree 7, 3 draws each: every position is drawn 20,000 x 3/7 = 8,571
    # times in expectation (sd about 70); nodes of degree <= 3 take all their positions.
    degrees = np.concatenate([np.full(20_000, 7), np.array([0, 2, 3])]).astype(np.int64)
    node, position = _sample_positions(degrees, 3, np.random.default_rng(0))
    big = node < 20_000
    picks = position[big].reshape(20_000, 3)
    assert (picks[:, 0] < picks[:, 1]).all() and (picks[:, 1] < picks[:, 2]).all()
    counts = np.bincount(picks.ravel(), minlength=7)
    assert np.abs(counts - 60_000 / 7).max() < 400
    assert position[~big].tolist() == [0, 1, 0, 1, 2]


def test_sage_conv_is_the_mean_aggregation_worked_by_hand() -> None:
    conv = SAGEConv(2, 2)
    with torch.no_grad():
        conv.lin_self.weight.copy_(torch.eye(2))
        conv.lin_neigh.weight.copy_(2 * torch.eye(2))
        conv.lin_neigh.bias.copy_(torch.tensor([1.0, -1.0]))
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0], [4.0, 4.0]])
    # dst 0 <- src 1, 2: mean [2, 3]; out = [1, 0] + 2 * [2, 3] + [1, -1] = [6, 5].
    # dst 1 has no edge: mean 0; out = [0, 2] + [1, -1] = [1, 1].
    out = conv(x, torch.tensor([1, 2]), torch.tensor([0, 0]), num_dst=2)
    assert out.tolist() == [[6.0, 5.0], [1.0, 1.0]]


def _tiny_graph(tmp_path: Path) -> Graph:
    config = PapersLikeConfig(
        num_nodes=1500, num_classes=3, num_features=8, split=(0.3, 0.1, 0.2), seed=1
    )
    return papers_like(tmp_path / "graph", config)


TINY = GnnTrainConfig(
    fanouts=(3, 3), batch_size=64, hidden_channels=16, dropout=0.5, lr=1e-2, max_steps=7
)
EMB_SPEC = RowSpec(embedding_dim=8, optimizer=OptimizerConfig(kind="adam", lr=1e-2))
FEAT_SPEC = RowSpec(embedding_dim=8, optimizer=OptimizerConfig(kind="none"))


def test_training_through_a_store_equals_the_ram_table_bit_for_bit(tmp_path: Path) -> None:
    graph = _tiny_graph(tmp_path)
    assert graph.features is not None
    ram_features = RamTable(graph.num_nodes, FEAT_SPEC, seed=0)
    load_rows(ram_features, graph.features)
    ram_embeddings = RamTable(graph.num_nodes, EMB_SPEC, seed=2)
    expected = train_gnn(graph, features=ram_features, embeddings=ram_embeddings, config=TINY)
    # 224 KiB minus the dense id map, slot maps and I/O buffers caches 1,241 of the 1,500
    # embedding rows (136 B each): batches of up to 64 x 16 = 1,024 rows evict and re-read.
    config = EmbeddingStore.Config(memory_budget_bytes=224 << 10, staleness_bound=0)
    with (
        EmbeddingStore.create(
            tmp_path / "f", num_rows=graph.num_nodes, spec=FEAT_SPEC, config=config
        ) as features,
        EmbeddingStore.create(
            tmp_path / "e", num_rows=graph.num_nodes, spec=EMB_SPEC, config=config, seed=2
        ) as embeddings,
    ):
        load_rows(features, graph.features, chunk_rows=500)
        got = train_gnn(graph, features=features, embeddings=embeddings, config=TINY)
        stats = embeddings.stats()
        assert stats["capacity_rows"] < graph.num_nodes and stats["evictions"] > 0
        assert stats["staleness_max"] == 0
        assert features.stats()["gets"] > 0  # read-only reads count in the cache stats
        assert embeddings.table_sha256() == ram_embeddings.table_sha256()
        assert features.table_sha256() == ram_features.table_sha256()  # never written
    assert got.losses == expected.losses and len(got.losses) == 7
    assert got.test_accuracy == expected.test_accuracy
    assert got.num_seeds == 7 * 64 and len(got.pull_ms) == 7


def _baseline(kind: str, folder: Path, spec: RowSpec, num_rows: int, seed: int) -> BenchTable:
    if kind in ("rocksdb", "lmdb"):
        return KvOffloadTable(
            folder, num_rows, spec, seed, engine=kind, memory_budget_bytes=4 * MIB
        )
    # A log of 1,100 records, fewer than the 1,500 rows: records go to disk and come back.
    budget = 8 * num_rows + 1100 * (spec.row_bytes + 8)
    return HybridLogTable(
        folder, num_rows, spec, seed, memory_budget_bytes=budget, mlkv=kind == "mlkv"
    )


@pytest.mark.parametrize("kind", ["rocksdb", "lmdb", "hlog", "mlkv"])
def test_every_baseline_trains_to_the_ram_table(kind: str, tmp_path: Path) -> None:
    # The store bench runs train_gnn unchanged over each system: at staleness 0 they must
    # all end with the RAM table's embeddings and losses.
    graph = _tiny_graph(tmp_path)
    assert graph.features is not None
    tables = []
    for system in ("ram", kind):
        if system == "ram":
            features: BenchTable = RamTable(graph.num_nodes, FEAT_SPEC, seed=0)
            embeddings: BenchTable = RamTable(graph.num_nodes, EMB_SPEC, seed=2)
        else:
            features = _baseline(kind, tmp_path / "f", FEAT_SPEC, graph.num_nodes, 0)
            embeddings = _baseline(kind, tmp_path / "e", EMB_SPEC, graph.num_nodes, 2)
        load_rows(features, graph.features, chunk_rows=500)
        result = train_gnn(graph, features=features, embeddings=embeddings, config=TINY)
        if system != "ram":  # rows went to disk and came back
            assert embeddings.stats()["bytes_written"] > 0
            assert embeddings.stats()["bytes_read"] > 0
        tables.append((result.losses, embeddings.table_sha256(), features.table_sha256()))
        features.close()
        embeddings.close()
    assert tables[0] == tables[1]


def test_deterministic_kernels_are_restored_after_training(tmp_path: Path) -> None:
    graph = _tiny_graph(tmp_path)
    assert not torch.are_deterministic_algorithms_enabled()
    embeddings = RamTable(graph.num_nodes, EMB_SPEC, seed=0)
    train_gnn(graph, embeddings=embeddings, config=TINY)
    assert not torch.are_deterministic_algorithms_enabled()


def test_features_only_and_embeddings_only_both_train(tmp_path: Path) -> None:
    graph = _tiny_graph(tmp_path)
    assert graph.features is not None
    features = RamTable(graph.num_nodes, FEAT_SPEC, seed=0)
    load_rows(features, graph.features)
    with_features = train_gnn(graph, features=features, config=TINY)
    embeddings = RamTable(graph.num_nodes, EMB_SPEC, seed=0)
    before = embeddings.table_sha256()
    with_embeddings = train_gnn(graph, embeddings=embeddings, config=TINY)
    assert embeddings.table_sha256() != before  # the embeddings were trained
    assert with_features.losses != with_embeddings.losses
    assert all(np.isfinite(with_features.losses + with_embeddings.losses))


def test_pubmed_embeddings_beat_the_majority_class() -> None:
    # CI quality check: PubMed's bundled files hold no word features, so the model learns
    # node embeddings only (GraphSAGE without input features); 20 batches of 512 of the
    # 11,830 training nodes, evaluated on 1,000 test nodes, reach 0.84 (majority 0.40).
    graph = Graph.from_events(load_events("pubmed"), seed=0)
    test = graph.test_ids[:1000]
    majority = np.bincount(graph.labels[test]).max() / len(test)  # about 0.40
    embeddings = RamTable(
        graph.num_nodes,
        RowSpec(embedding_dim=16, optimizer=OptimizerConfig(kind="adam", lr=0.05)),
        seed=0,
    )
    config = GnnTrainConfig(
        fanouts=(5, 5),
        batch_size=512,
        hidden_channels=32,
        dropout=0.0,
        lr=1e-2,
        max_steps=20,
        max_eval_nodes=1000,
    )
    result = train_gnn(graph, embeddings=embeddings, config=config)
    assert result.num_test == 1000
    assert result.losses[-1] < result.losses[0]
    assert result.test_accuracy > majority + 0.3, (result.test_accuracy, majority)


def test_read_opens_no_read_so_rows_never_pin(tmp_path: Path) -> None:
    config = EmbeddingStore.Config(memory_budget_bytes=MIB, staleness_bound=0, timeout_s=0.4)
    with EmbeddingStore.create(tmp_path / "s", num_rows=50, spec=FEAT_SPEC, config=config) as st:
        ids = np.array([3, 7, 7, 9])
        first = st.read(ids, step=0)
        again = st.read(ids, step=1)  # a second get at bound 0 would wait for a put
        assert np.array_equal(first, again) and first.shape == (4, 8)
        assert np.array_equal(first, st.peek(ids, cols="emb"))
        stats = st.stats()
        assert stats["gets"] == 2 and stats["hits"] + stats["misses"] == 6  # 3 unique, twice
        assert stats["staleness_hist"] == [0]  # no read was opened
        st.checkpoint()  # waits for open reads: none
        st.get(ids, step=2)
        with pytest.raises(StoreError, match="open reads"):
            st.checkpoint()  # a get pins its rows until a put
        st.put(np.array([3, 7, 9]), np.zeros((3, 8), np.float32), step=2)


def test_load_rows_into_a_store_round_trips(tmp_path: Path) -> None:
    rows = np.arange(40 * 8, dtype=np.float32).reshape(40, 8)
    with EmbeddingStore.create(tmp_path / "s", num_rows=40, spec=FEAT_SPEC) as store:
        load_rows(store, rows, chunk_rows=7)
        assert np.array_equal(store.read(np.arange(40), step=1), rows)
    with pytest.raises(ValueError, match="2-D"):
        load_rows(RamTable(4, FEAT_SPEC, 0), np.zeros(8, np.float32))


def test_load_rows_streams_more_rows_than_the_cache_holds(tmp_path: Path) -> None:
    # the default chunk follows the store's cache, so features larger than it stream in
    rows = np.random.default_rng(0).random((20_000, 8), dtype=np.float32)
    config = EmbeddingStore.Config(memory_budget_bytes=256 << 10)
    with EmbeddingStore.create(
        tmp_path / "s", num_rows=20_000, spec=FEAT_SPEC, config=config
    ) as st:
        assert st.cache_rows < 20_000
        load_rows(st, rows)
        assert np.array_equal(st.peek(np.arange(0, 20_000, 997), cols="emb"), rows[::997])


@pytest.mark.parametrize(
    ("make", "error", "fragment"),
    [
        (
            lambda g: NeighborSampler(g, fanouts=(5, -1)),
            ValueError,
            r"fanouts=\(5, -1\) must be one integer >= 0 per layer",
        ),
        (lambda g: NeighborSampler(g, batch_size=0), ValueError, "batch_size=0 must be"),
        (
            lambda g: NeighborSampler(g, nodes=np.array([1, 9])),
            ValueError,
            r"nodes holds id 9, outside \[0, num_nodes=9\)",
        ),
        (lambda g: NeighborSampler(g, nodes=np.array([1, 1])), ValueError, "repeats an id"),
        (
            lambda g: NeighborSampler(g).sample(np.array([-2]), 0),
            ValueError,
            "seeds reach outside",
        ),
        (lambda g: train_gnn(g), ValueError, "needs a features table, an embeddings table"),
        (lambda g: GnnTrainConfig(lookahead=-1), ValueError, "lookahead=-1 must be >= 0"),
        (lambda g: GnnTrainConfig(max_steps=0), ValueError, "max_steps=0 must be >= 1"),
        (lambda g: GraphSAGE(4, 2, dropout=1.0), ValueError, r"dropout=1.0 must be in \[0, 1\)"),
    ],
)
def test_bad_input_names_the_value_and_the_fix(
    make: object, error: type[Exception], fragment: str
) -> None:
    with pytest.raises(error, match=fragment):
        make(_star_graph())  # type: ignore[operator]


def test_graphsage_needs_one_block_per_layer() -> None:
    graph = _star_graph()
    batch = NeighborSampler(graph, fanouts=(2, 2), batch_size=2).sample(np.array([0, 1]), 0)
    model = GraphSAGE(4, 2, hidden_channels=8, num_layers=3)
    with pytest.raises(ValueError, match="2 blocks for a 3-layer GraphSAGE"):
        model(torch.zeros(len(batch.n_id), 4), batch.blocks)
    out = GraphSAGE(4, 2, hidden_channels=8, num_layers=2)(
        torch.zeros(len(batch.n_id), 4), batch.blocks
    )
    assert out.shape == (2, 2)


def test_a_failed_step_releases_its_reads_so_training_can_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The loss of step 2 raises (as a NaN check or an out-of-memory would); the store at
    # staleness 0 must be left with no open read, so a new training run on it works and the
    # rows of the failed step are unchanged.
    graph = _tiny_graph(tmp_path)
    real = torch.nn.functional.cross_entropy
    calls = {"n": 0}

    def failing(*args: object, **kwargs: object) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("loss blew up")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    config = EmbeddingStore.Config(memory_budget_bytes=1 << 20, staleness_bound=0)
    with EmbeddingStore.create(
        tmp_path / "e", num_rows=graph.num_nodes, spec=EMB_SPEC, config=config
    ) as store:
        monkeypatch.setattr(torch.nn.functional, "cross_entropy", failing)
        with pytest.raises(RuntimeError, match="loss blew up"):
            train_gnn(graph, embeddings=store, config=TINY)
        monkeypatch.setattr(torch.nn.functional, "cross_entropy", real)
        result = train_gnn(graph, embeddings=store, config=TINY)
        assert len(result.losses) == 7 and all(np.isfinite(result.losses))


def test_hot_nodes_ranks_the_hub_of_a_star_first() -> None:
    # Every leaf's only neighbour is node 0, so each batch that holds a leaf samples node 0:
    # it is the most visited node whatever the seed.
    from frugal.store.gnn import hot_nodes

    graph = _star_graph()
    for seed in (1, 2, 3):
        hot = hot_nodes(graph, 3, fanouts=(2,), batch_size=2, num_batches=6, seed=seed)
        assert hot[0] == 0 and len(hot) == 3 and len(set(hot.tolist())) == 3
    visited = hot_nodes(graph, 100, fanouts=(2,), batch_size=2, num_batches=6)
    assert 8 not in visited.tolist()  # the isolated node is never sampled as a neighbour
    with pytest.raises(ValueError, match="num_batches=0 must be >= 1"):
        hot_nodes(graph, 3, fanouts=(2,), batch_size=2, num_batches=0)


def test_pinned_features_train_the_same_model_with_fewer_misses(tmp_path: Path) -> None:
    graph = _tiny_graph(tmp_path)
    assert graph.features is not None
    results, misses = {}, {}
    for fraction in (0.0, 0.25):
        # 128 KiB caches about 1,300 of the 1,500 feature rows (32 B each).
        config = EmbeddingStore.Config(memory_budget_bytes=128 << 10, staleness_bound=0)
        with EmbeddingStore.create(
            tmp_path / f"f{fraction}", num_rows=graph.num_nodes, spec=FEAT_SPEC, config=config
        ) as features:
            load_rows(features, graph.features, chunk_rows=500)
            before = features.stats()["misses"]
            settings = replace(TINY, pin_feature_fraction=fraction, lookahead=0)
            results[fraction] = train_gnn(graph, features=features, config=settings)
            misses[fraction] = features.stats()["misses"] - before
            assert features.stats()["pinned_rows"] == 0  # unpinned when training ended
            assert results[fraction].pinned_rows == int(fraction * features.cache_rows)
            if fraction:  # a second call pins (and reports) the same rows again
                again = train_gnn(graph, features=features, config=settings)
                assert again.pinned_rows == results[fraction].pinned_rows
    assert results[0.25].losses == results[0.0].losses  # pinning changes no value
    assert results[0.25].test_accuracy == results[0.0].test_accuracy
    assert 0 < misses[0.25] < misses[0.0]
