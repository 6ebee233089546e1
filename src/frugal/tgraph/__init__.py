"""frugal.tgraph: a fair temporal-GNN benchmark (Benchtemp, and better).

One hashed `Protocol` (split, masked nodes, fixed negatives) for every model; heuristic floors
and TGN / JODIE / DyRep / TGAT on shared building blocks; global and per-batch AUC/AP, full
ranking MRR/Hits@10, node classification; efficiency side by side.

Entry points: `build_protocol`, `run_link_prediction`, `run_node_classification`,
`write_leaderboard`. Protocol presets (`frugal`, `benchtemp`) are in `PROTOCOLS`, models in
`MODELS`; `register_protocol` and `register_model` add your own. The benchmark over every
model (`frugal tgraph bench`) is `frugal.bench.tgraph.run_tgraph_bench`.

References:
    BenchTemp: A General Benchmark for Evaluating Temporal Graph Neural Networks, ICDE 2024,
    arXiv 2308.16385.
"""

from frugal.tgraph.leaderboard import write_leaderboard
from frugal.tgraph.models import MODELS, ModelInputs, register_model
from frugal.tgraph.protocol import (
    PROTOCOLS,
    Protocol,
    ProtocolConfig,
    build_protocol,
    protocol_preset,
    register_protocol,
)
from frugal.tgraph.train import run_link_prediction, run_node_classification

__all__ = [
    "MODELS",
    "PROTOCOLS",
    "ModelInputs",
    "Protocol",
    "ProtocolConfig",
    "build_protocol",
    "protocol_preset",
    "register_model",
    "register_protocol",
    "run_link_prediction",
    "run_node_classification",
    "write_leaderboard",
]
