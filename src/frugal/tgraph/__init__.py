"""frugal.tgraph: a fair temporal-GNN benchmark (Benchtemp, and better).

One hashed `Protocol` (split, masked nodes, fixed negatives) for every model; heuristic floors
and TGN / JODIE / DyRep / TGAT on shared building blocks; global and per-batch AUC/AP, full
ranking MRR/Hits@10, node classification; efficiency side by side.

Entry points: `build_protocol`, `run_link_prediction`, `run_node_classification`,
`write_leaderboard`. The benchmark over every model (`frugal tgraph bench`) is
`frugal.bench.tgraph.run_tgraph_bench`.

References:
    BenchTemp: A General Benchmark for Evaluating Temporal Graph Neural Networks, ICDE 2024,
    arXiv 2308.16385.
"""

from frugal.tgraph.leaderboard import write_leaderboard
from frugal.tgraph.protocol import Protocol, ProtocolConfig, build_protocol
from frugal.tgraph.train import run_link_prediction, run_node_classification

__all__ = [
    "Protocol",
    "ProtocolConfig",
    "build_protocol",
    "run_link_prediction",
    "run_node_classification",
    "write_leaderboard",
]
