"""Train GraphSAGE with node features and node embeddings in disk-backed tables.

MLKV's GNN workload on one machine: an ogbn-papers100M-shaped graph
(`frugal.data.papers_like`, 128 float32 features per node) is written to a scratch folder;
its features go into one `EmbeddingStore` (read-only rows) and learnable node embeddings
into another, each with a RAM budget of `--ratio` x its table. The same `train_gnn` loop
runs over two `RamTable`s for comparison; at staleness 0 both runs give the same losses.

    python examples/store_gnn.py            # 300k nodes, MLKV's setup (batch 1024, 5,5,5)
    python examples/store_gnn.py --tiny     # 3k nodes, batches of 64 (what the test runs)

Prints seed nodes per second, test accuracy and the median per-batch time breakdown of each.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

from frugal.data import PapersLikeConfig, papers_like
from frugal.store import EmbeddingStore, OptimizerConfig, RowSpec
from frugal.store.baselines import BenchTable, RamTable
from frugal.store.gnn import GnnTrainConfig, load_rows, train_gnn


def main(argv: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Run the example; return each system's numbers."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tiny", action="store_true", default=os.environ.get("FRUGAL_TINY", "") not in ("", "0")
    )
    parser.add_argument("--ratio", type=float, default=0.5, help="budget / table bytes")
    parser.add_argument("--dir", type=Path, default=None, help="scratch folder")
    args = parser.parse_args(argv)
    if args.tiny:
        graph_config = PapersLikeConfig(num_nodes=3_000, num_classes=4, split=(0.3, 0.1, 0.2))
        config = GnnTrainConfig(fanouts=(5, 5), batch_size=64, hidden_channels=32, max_steps=6)
    else:
        graph_config = PapersLikeConfig(num_nodes=300_000, num_classes=16, split=(0.05, 0.01, 0.01))
        config = GnnTrainConfig(max_steps=15, max_eval_nodes=2048)
    feature_spec = RowSpec(embedding_dim=128, optimizer=OptimizerConfig(kind="none"))
    embedding_spec = RowSpec(embedding_dim=32, optimizer=OptimizerConfig(kind="adam", lr=0.01))
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        root = args.dir or Path(scratch)
        graph = papers_like(root / "graph", graph_config)
        assert graph.features is not None
        n = graph.num_nodes
        for system in ("ram", "frugal"):
            if system == "ram":
                features: BenchTable = RamTable(n, feature_spec, seed=0)
                embeddings: BenchTable = RamTable(n, embedding_spec, seed=1)
            else:
                features, embeddings = (
                    EmbeddingStore.create(
                        root / name,
                        num_rows=n,
                        spec=spec,
                        seed=seed,
                        config=EmbeddingStore.Config(
                            memory_budget_bytes=int(args.ratio * n * spec.row_bytes) + (2 << 20)
                        ),
                    )
                    for name, spec, seed in (("f", feature_spec, 0), ("e", embedding_spec, 1))
                )
            load_rows(features, graph.features)
            result = train_gnn(graph, features=features, embeddings=embeddings, config=config)
            results[system] = {
                "samples_per_s": result.samples_per_s,
                "test_accuracy": result.test_accuracy,
                "losses": result.losses,
                "embeddings_sha256": embeddings.table_sha256(),
                **result.median_ms(),
            }
            features.close()
            embeddings.close()
            print(
                f"{system:>6}: {result.samples_per_s:8.0f} seed nodes/s, test accuracy "
                f"{result.test_accuracy:.3f}, median ms "
                + ", ".join(f"{k} {v:.1f}" for k, v in result.median_ms().items())
            )
    ram, frugal = results["ram"], results["frugal"]
    same = ram["losses"] == frugal["losses"]
    same = same and ram["embeddings_sha256"] == frugal["embeddings_sha256"]
    print(f"same losses and embeddings: {same}")
    return results


if __name__ == "__main__":
    main()
