"""KGE through the store: score functions, sampler, filtered ranking, equality across tables."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from frugal.data import KnowledgeGraph, load_triples
from frugal.data.triples import FreebaseLikeStream
from frugal.store import EmbeddingStore
from frugal.store.baselines import HybridLogTable, KvOffloadTable, RamTable
from frugal.store.kge import (
    KGE_MODELS,
    KGEConfig,
    KGESampler,
    evaluate_kge,
    kge_row_spec,
    train_kge,
)
from frugal.store.rows import init_rows

SMALL = {"embedding_dim": 16, "batch_size": 256, "neg_chunk_size": 64, "neg_sample_size": 32}


def test_score_functions_match_hand_computation() -> None:
    h = torch.tensor([1.0, 2.0, 3.0, -1.0])
    r = torch.tensor([0.5, -1.0, 2.0, 1.0])
    t = torch.tensor([2.0, 1.0, 0.0, 3.0])
    distmult = KGE_MODELS.get("distmult")(KGEConfig())
    assert distmult.score(h, r, t).item() == pytest.approx(1 * 0.5 * 2 - 2 * 1 + 0 - 3)
    complex_ = KGE_MODELS.get("complex")(KGEConfig(embedding_dim=4))
    hc = torch.complex(h[:2], h[2:])
    rc = torch.complex(r[:2], r[2:])
    tc = torch.complex(t[:2], t[2:])
    expected = (hc * rc * tc.conj()).sum().real.item()
    assert complex_.score(h, r, t).item() == pytest.approx(expected)
    transe = KGE_MODELS.get("transe")(KGEConfig(gamma=5.0, p_norm=1))
    assert transe.score(h, r, t).item() == pytest.approx(5.0 - (0.5 + 0 + 5 + 3))


@pytest.mark.parametrize("name", ["distmult", "complex", "transe"])
def test_candidate_scores_equal_pairwise_scores(name: str) -> None:
    model = KGE_MODELS.get(name)(KGEConfig(model=name, embedding_dim=6))
    g = torch.Generator().manual_seed(0)
    h, r, t = (torch.randn(2, 3, 6, generator=g) for _ in range(3))
    cand = torch.randn(2, 5, 6, generator=g)
    tails = model.score_tails(h, r, cand)
    heads = model.score_heads(cand, r, t)
    for c in range(2):
        for i in range(3):
            for k in range(5):
                assert tails[c, i, k].item() == pytest.approx(
                    model.score(h[c, i], r[c, i], cand[c, k]).item(), abs=1e-5
                )
                assert heads[c, i, k].item() == pytest.approx(
                    model.score(cand[c, k], r[c, i], t[c, i]).item(), abs=1e-5
                )


def test_sampler_visits_each_training_triple_once_per_epoch() -> None:
    graph = load_triples("nations")
    config = KGEConfig(**SMALL)
    sampler = KGESampler(graph, config)
    per_epoch = len(graph.train) // 256
    assert sampler.batches_per_epoch == per_epoch == 6
    seen = np.concatenate([sampler.batch(s).triples for s in range(per_epoch)])
    keys = lambda a: set(map(tuple, a.tolist()))  # noqa: E731
    assert len(seen) == per_epoch * 256
    assert keys(seen) <= keys(graph.train)
    batch = sampler.batch(3)
    assert batch.corrupt == "head" and sampler.batch(4).corrupt == "tail"
    assert batch.negatives.shape == (4, 32)  # 256 / 64 chunks, 32 negatives each
    assert np.array_equal(
        batch.ids,
        np.unique(np.r_[batch.triples[:, 0], batch.triples[:, 2], batch.negatives.ravel()]),
    )
    again = KGESampler(graph, config).batch(3)  # a function of (seed, step) alone
    assert np.array_equal(again.triples, batch.triples)
    assert np.array_equal(again.negatives, batch.negatives)


def _toy_graph() -> KnowledgeGraph:
    z = np.empty((0, 3), dtype=np.int64)
    return KnowledgeGraph(
        train=np.array([[0, 0, 1], [0, 0, 2]], dtype=np.int64),
        valid=z,
        test=np.array([[0, 0, 3]], dtype=np.int64),
        entity_names=("a", "b", "c", "d", "e"),
        relation_names=("r",),
    )


def test_filtered_ranks_worked_out_by_hand() -> None:
    # DistMult with r = 1: score(h, t) = <e_h, e_t>. Entity vectors in 1-D.
    graph = _toy_graph()
    vectors = np.array([[1.0], [5.0], [4.0], [3.0], [3.0]], dtype=np.float32)
    relation = np.array([[1.0]], dtype=np.float32)
    model = KGE_MODELS.get("distmult")(KGEConfig(embedding_dim=1))

    def run(known: np.ndarray | None) -> dict[str, float]:
        return evaluate_kge(
            model, lambda i: vectors[i], lambda i: relation[i], graph.test,
            num_entities=5, num_relations=1, known=known,
        )  # fmt: skip

    # tail query (a, r, ?): scores b 5, c 4, d 3 (true), e 3 (tie), a 1
    #   raw: 1 + 2 higher + 1 tie / 2 = 3.5; filtered (b, c known): 1 + 0.5 = 1.5
    # head query (?, r, d): scores a 3 (true), b 15, c 12, d 9, e 9 -> raw 1 + 4 = 5;
    #   nothing known has tail d except the test triple, so filtered is 5 too
    raw = run(None)
    assert raw["mrr"] == pytest.approx((1 / 3.5 + 1 / 5) / 2)
    assert raw["hits@3"] == 0.0 and raw["hits@10"] == 1.0
    filtered = run(graph.all_triples())
    assert filtered["mrr"] == pytest.approx((1 / 1.5 + 1 / 5) / 2)
    assert filtered["hits@3"] == 0.5 and filtered["num_rankings"] == 2
    # a sample of 2 candidates (seeded) plus the answer: the rank is among those only
    sampled = evaluate_kge(
        model, lambda i: vectors[i], lambda i: relation[i], graph.test,
        num_entities=5, num_relations=1, num_candidates=2, seed=0,
    )  # fmt: skip
    assert 1.0 <= 1 / sampled["mrr"] <= 3.0
    with pytest.raises(ValueError, match=r"num_candidates=5 must be in \[1, 5\)"):
        evaluate_kge(
            model, lambda i: vectors[i], lambda i: relation[i], graph.test,
            num_entities=5, num_relations=1, num_candidates=5,
        )  # fmt: skip


def _reference_torch(graph: KnowledgeGraph, config: KGEConfig, num_steps: int) -> np.ndarray:
    """A plain in-RAM PyTorch DistMult: full tables as tensors, row-wise Adagrad by hand."""
    spec = kge_row_spec(config)
    d = config.embedding_dim
    ent = torch.from_numpy(init_rows(np.arange(graph.num_entities), spec, config.seed)[:, :d])
    rel = torch.from_numpy(init_rows(np.arange(graph.num_relations), spec, config.seed + 1)[:, :d])
    acc_e = torch.zeros(graph.num_entities)
    acc_r = torch.zeros(graph.num_relations)
    sampler = KGESampler(graph, config)
    for step in range(num_steps):
        batch = sampler.batch(step)
        ent.requires_grad_(True)
        rel.requires_grad_(True)
        tr = torch.from_numpy(batch.triples)
        h, r, t = ent[tr[:, 0]], rel[tr[:, 1]], ent[tr[:, 2]]
        pos = (h * r * t).sum(-1)
        cand = ent[torch.from_numpy(batch.negatives)]
        c = len(batch.negatives)
        if batch.corrupt == "tail":
            neg = torch.bmm((h * r).view(c, -1, d), cand.transpose(1, 2))
        else:
            neg = torch.bmm((r * t).view(c, -1, d), cand.transpose(1, 2))
        loss = -(F.logsigmoid(pos).mean() + F.logsigmoid(-neg).mean()) / 2
        grad_e, grad_r = torch.autograd.grad(loss, [ent, rel])
        with torch.no_grad():
            for table, acc, grad in ((ent, acc_e, grad_e), (rel, acc_r, grad_r)):
                touched = torch.nonzero(grad.abs().sum(1) > 0).squeeze(1)
                g = grad[touched]
                acc[touched] += (g * g).mean(1)
                table[touched] -= config.lr * g / (acc[touched].sqrt() + config.eps)[:, None]
        ent, rel = ent.detach(), rel.detach()
    out: np.ndarray = ent.numpy()
    return out


def test_store_training_matches_a_plain_pytorch_implementation() -> None:
    graph = load_triples("umls")
    config = KGEConfig(**SMALL)
    spec = kge_row_spec(config)
    ent = RamTable(graph.num_entities, spec, config.seed)
    rel = RamTable(graph.num_relations, spec, config.seed + 1)
    train_kge(KGESampler(graph, config), ent, rel, num_steps=30)
    reference = _reference_torch(graph, config, 30)
    np.testing.assert_allclose(ent.table[:, :16], reference, rtol=1e-4, atol=1e-5)


def test_distmult_learns_umls() -> None:
    # the CI quality check: filtered MRR far above an untrained table's
    graph = load_triples("umls")
    config = KGEConfig(embedding_dim=64, batch_size=512, neg_chunk_size=64, neg_sample_size=64)
    spec = kge_row_spec(config)
    ent = RamTable(graph.num_entities, spec, 0)
    rel = RamTable(graph.num_relations, spec, 1)
    model = KGE_MODELS.get("distmult")(config)

    def mrr() -> float:
        return evaluate_kge(
            model, lambda i: ent.table[i, :64], lambda i: rel.table[i, :64], graph.test,
            num_entities=graph.num_entities, num_relations=graph.num_relations,
            known=graph.all_triples(),
        )["mrr"]  # fmt: skip

    before = mrr()
    result = train_kge(KGESampler(graph, config), ent, rel, num_steps=250)
    assert result.losses[-1] < 0.5 * result.losses[0]
    after = mrr()
    assert before < 0.2 and after > 0.55  # 0.65 when written (PyKEEN-style filtered MRR)


def _stream_run(table: object, rel: RamTable, lookahead: int) -> tuple[float, ...]:
    stream = FreebaseLikeStream(FreebaseLikeStream.Config(num_entities=40_000, num_relations=30))
    config = KGEConfig(**SMALL)
    return train_kge(
        KGESampler(stream, config),
        table,
        rel,
        num_steps=12,
        lookahead=lookahead,  # type: ignore[arg-type]
    ).losses


def test_every_table_ends_bit_identical_at_staleness_0(tmp_path: Path) -> None:
    config = KGEConfig(**SMALL)
    spec = kge_row_spec(config)
    n = 40_000  # 40k x 68 B rows; 1 MiB caches ~7k (a batch touches ~600 entities)
    ram = RamTable(n, spec, 0)
    reference = _stream_run(ram, RamTable(30, spec, 1), 0)
    budget = 1 << 20  # 40% of the table's 2.7 MB
    store = EmbeddingStore.create(
        tmp_path / "store", num_rows=n, spec=spec, seed=0,
        config=EmbeddingStore.Config(memory_budget_bytes=1 << 20),
    )  # fmt: skip
    assert store.cache.capacity < n  # rows really leave the cache
    tables = {
        "frugal": (store, 4),
        "rocksdb": (
            KvOffloadTable(
                tmp_path / "kv", n, spec, 0, engine="rocksdb", memory_budget_bytes=budget
            ),
            0,
        ),
        "mlkv": (
            HybridLogTable(tmp_path / "hl", n, spec, 0, memory_budget_bytes=budget, mlkv=True),
            4,
        ),
    }
    for name, (table, window) in tables.items():
        losses = _stream_run(table, RamTable(30, spec, 1), window)
        assert losses == reference, name
        assert table.table_sha256() == ram.table_sha256(), name
        table.close()


def test_config_errors_name_the_value_and_a_fix() -> None:
    with pytest.raises(
        ValueError, match="batch_size=1000 must be a multiple of neg_chunk_size=256"
    ):
        KGEConfig(batch_size=1000)
    with pytest.raises(ValueError, match="embedding_dim=5 must be even for ComplEx"):
        KGEConfig(model="complex", embedding_dim=5)
    with pytest.raises(ValueError, match="model='rotate' is not a registered KGE model"):
        KGEConfig(model="rotate")
    with pytest.raises(ValueError, match="fewer than batch_size=4096"):
        KGESampler(load_triples("nations"), KGEConfig(batch_size=4096))


@pytest.mark.parametrize(("p", "c"), [(16, 4), (8, 8), (10, 3), (2, 2)])
def test_beta_states_swap_one_partition_and_meet_every_pair(p: int, c: int) -> None:
    from frugal.store.kge import assign_buckets, beta_buffer_states

    states = beta_buffer_states(p, c, seed=0)
    assert all(len(set(s.tolist())) == c for s in states)
    for before, after in itertools.pairwise(states):
        assert len(set(before.tolist()) - set(after.tolist())) == 1  # one swap per state
    buckets = [b for per_state in assign_buckets(states, p) for b in per_state]
    assert sorted(buckets) == [(i, j) for i in range(p) for j in range(p)]  # each once
    if (p, c) == (16, 4):
        # c - 1 fixed partitions meet the other 13, then 3 leave: about p^2 / c swaps
        assert len(states) - 1 <= 2 * p * p // c
    assert [s.tolist() for s in beta_buffer_states(p, c, seed=0)] == [s.tolist() for s in states]


def test_beta_epoch_trains_every_triple_once_with_negatives_from_the_buffer() -> None:
    graph = load_triples("kinships")
    config = KGEConfig(
        embedding_dim=8, batch_size=256, neg_chunk_size=64, neg_sample_size=16,
        ordering="beta", num_partitions=8, buffer_capacity=3,
    )  # fmt: skip
    sampler = KGESampler(graph, config)
    seen = []
    for step in range(sampler.batches_per_epoch):
        batch = sampler.batch(step)
        seen.append(batch.triples)
        touched = np.unique(sampler.partition_of(batch.negatives))
        assert len(touched) <= 3  # negatives only from the 3 buffered partitions
    rows = np.concatenate(seen)
    dropped = len(graph.train) - len(rows)  # the last partial batch
    assert 0 <= dropped < 256
    keys = {tuple(t) for t in rows.tolist()}
    assert keys <= {tuple(t) for t in graph.train.tolist()}
    # BETA order: consecutive triples mostly stay within the buffer of few partitions
    parts = sampler.partition_of(rows[:, [0, 2]])
    window = parts[:256].ravel()
    assert len(np.unique(window)) <= 6
    with pytest.raises(ValueError, match="buffer_capacity=9 must be in"):
        KGEConfig(ordering="beta", num_partitions=8, buffer_capacity=9)


def test_tables_of_the_wrong_width_are_refused_and_their_reads_released(
    tmp_path: Path,
) -> None:
    graph = load_triples("nations")
    config = KGEConfig(**SMALL)
    spec = kge_row_spec(config)
    narrow = kge_row_spec(KGEConfig(**{**SMALL, "embedding_dim": 8}))
    store = EmbeddingStore.create(
        tmp_path / "e", num_rows=graph.num_entities, spec=spec,
        config=EmbeddingStore.Config(timeout_s=2.0),
    )  # fmt: skip
    sampler = KGESampler(graph, config)
    with pytest.raises(ValueError, match="entity rows have 16 floats but relation rows 8"):
        train_kge(sampler, store, RamTable(graph.num_relations, narrow, 1), num_steps=1)
    # the failed step's reads were released: training goes on at once, and close checkpoints
    train_kge(sampler, store, RamTable(graph.num_relations, spec, 1), num_steps=2)
    store.close()
    assert EmbeddingStore.open(tmp_path / "e").epoch == 1
