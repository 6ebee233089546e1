"""MLKV's GNN workload: GraphSAGE with node features and node embeddings in tables.

- `NeighborSampler`: seeded numpy fan-out sampling over a CSR `Graph` (`frugal.data.graph`);
  batches can be drawn ahead to hint the tables (`lookahead`).
- `GraphSAGE` / `SAGEConv`: the mean-aggregator model, run on the sampled blocks.
- `train_gnn`: the training loop over any two `BenchTable`s (read-only features, learnable
  embeddings), returning losses, samples/s, a per-batch time breakdown and test accuracy.
- `load_rows`: write read-only feature rows into a table.
- `hot_nodes`: the nodes sampling visits most (GNNLab's presampling), to `pin` their
  feature rows (`GnnTrainConfig.pin_feature_fraction`).

Data: `Graph.from_events(load_events("pubmed"))` (real, 19,717 nodes, 3 classes, no features
in the bundled files) and `frugal.data.papers_like` (ogbn-papers100M-shaped, any size).

References:
    Inductive Representation Learning on Large Graphs (GraphSAGE), NeurIPS 2017,
    arXiv 1706.02216. MLKV: Efficiently Scaling up Large Embedding Model Training with
    Disk-based Key-Value Storage, ICDE 2025, arXiv 2504.01506.
"""

from frugal.data.graph import Graph
from frugal.store.gnn.model import GraphSAGE, SAGEConv
from frugal.store.gnn.sampler import Block, NeighborSampler, SampledBatch
from frugal.store.gnn.train import (
    GnnTrainConfig,
    GnnTrainResult,
    hot_nodes,
    load_rows,
    train_gnn,
)

__all__ = [
    "Block",
    "GnnTrainConfig",
    "GnnTrainResult",
    "Graph",
    "GraphSAGE",
    "NeighborSampler",
    "SAGEConv",
    "SampledBatch",
    "hot_nodes",
    "load_rows",
    "train_gnn",
]
