"""Train knowledge-graph embeddings with the entity table on disk (MLKV's KGE workload).

DistMult (or ComplEx, TransE) learns UMLS, a real knowledge graph bundled through the pykeen
wheel, or your own graph given as three tab-separated files of `head<TAB>relation<TAB>tail`
names. Entity rows (vector + row-wise Adagrad accumulator) live in a
`frugal.store.EmbeddingStore` on local disk; the sampler's next batches are hinted to it
(`--lookahead`), so their rows are read while the current batch trains. Relations stay in
RAM. Evaluation is the filtered MRR / Hits@10 of head and tail prediction on the test split.

    python examples/store_kge.py                    # UMLS, DistMult, 600 steps
    python examples/store_kge.py --model complex
    python examples/store_kge.py --train my/train.txt --valid my/valid.txt --test my/test.txt
    python examples/store_kge.py --tiny             # what the test runs
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from frugal.data import load_triples
from frugal.data.triples import read_triples_tsv
from frugal.store import EmbeddingStore
from frugal.store.baselines import RamTable
from frugal.store.kge import (
    KGE_MODELS,
    KGEConfig,
    KGESampler,
    evaluate_kge,
    kge_row_spec,
    train_kge,
)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the example; return the metrics it prints."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    tiny_env = os.environ.get("FRUGAL_TINY", "") not in ("", "0")
    parser.add_argument("--tiny", action="store_true", default=tiny_env)
    parser.add_argument("--model", default="distmult", choices=list(KGE_MODELS))
    parser.add_argument("--train", type=Path, help="your training triples (TSV of names)")
    parser.add_argument("--valid", type=Path, help="your validation triples")
    parser.add_argument("--test", type=Path, help="your test triples")
    parser.add_argument("--lookahead", type=int, default=4, help="batches hinted ahead")
    parser.add_argument(
        "--batch-size", type=int, default=512, help="positives per step (a multiple of 64)"
    )
    parser.add_argument("--dir", type=Path, default=None, help="folder for the entity table")
    args = parser.parse_args(argv)
    own = [args.train, args.valid, args.test]
    if any(p is not None for p in own) and not all(p is not None for p in own):
        parser.error("give all three of --train, --valid and --test, or none (UMLS)")
    if args.train is not None:
        graph = read_triples_tsv(args.train, args.valid, args.test)
    else:
        graph = load_triples("umls")
    steps = 60 if args.tiny else 600
    config = KGEConfig(
        model=args.model, embedding_dim=64, batch_size=args.batch_size, neg_chunk_size=64,
        neg_sample_size=64, gamma=6.0,
    )  # fmt: skip
    spec = kge_row_spec(config)
    store_config = EmbeddingStore.Config(memory_budget_bytes=1 << 20)
    with tempfile.TemporaryDirectory() as scratch:
        root = args.dir or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="entities-", dir=root))  # a new one per run
        with EmbeddingStore.create(
            folder, num_rows=graph.num_entities, spec=spec, config=store_config, seed=0
        ) as entities:
            relations = RamTable(graph.num_relations, spec, seed=1)
            result = train_kge(
                KGESampler(graph, config), entities, relations,
                num_steps=steps, lookahead=args.lookahead,
            )  # fmt: skip
            metrics = evaluate_kge(
                KGE_MODELS.get(config.model)(config),
                lambda ids: entities.peek(ids, cols="emb"),
                lambda ids: relations.table[ids, : config.embedding_dim],
                graph.test,
                num_entities=graph.num_entities,
                num_relations=graph.num_relations,
                known=graph.all_triples(),
            )
    out = {
        "first_loss": result.losses[0],
        "last_loss": result.losses[-1],
        "mrr": metrics["mrr"],
        "hits@10": metrics["hits@10"],
        "triples_per_s": result.triples_per_s,
    }
    print(
        f"{config.model} on {graph.name}: loss {out['first_loss']:.3f} -> "
        f"{out['last_loss']:.3f}, filtered MRR {out['mrr']:.3f}, Hits@10 {out['hits@10']:.3f}, "
        f"{out['triples_per_s']:,.0f} triples/s"
    )
    return out


if __name__ == "__main__":
    main()
