"""frugal.tgraph: a fair temporal-GNN benchmark (Benchtemp, and better).

One hashed `Protocol` (split, masked nodes, fixed negatives) for every model; heuristic floors
and TGN / JODIE / DyRep / TGAT on shared building blocks; global and per-batch AUC/AP, full
ranking MRR/Hits@10, node classification; efficiency side by side.

Entry points: `run_tgraph_bench(TgraphBenchConfig.quick(), out_dir)` (what `frugal tgraph bench`
and `frugal reproduce` call), `build_protocol`, `run_link_prediction`, `write_leaderboard`.

References:
    BenchTemp: A General Benchmark for Evaluating Temporal Graph Neural Networks, ICDE 2024,
    arXiv 2308.16385.
"""

from frugal.tgraph.bench import TgraphBenchConfig, run_tgraph_bench
from frugal.tgraph.leaderboard import write_leaderboard
from frugal.tgraph.protocol import Protocol, ProtocolConfig, build_protocol
from frugal.tgraph.train import run_link_prediction, run_node_classification

__all__ = [
    "Protocol",
    "ProtocolConfig",
    "TgraphBenchConfig",
    "build_protocol",
    "run_link_prediction",
    "run_node_classification",
    "run_tgraph_bench",
    "write_leaderboard",
]
