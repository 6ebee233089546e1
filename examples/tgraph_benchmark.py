"""Benchmark temporal-graph models under one fixed protocol, through the public API.

Builds a `frugal.tgraph` protocol over a temporal graph (chronological split, masked nodes
for the inductive views, negatives drawn once per split and hashed), then trains and
evaluates a heuristic floor and a TGNN against exactly the same negatives, and prints their
test AUC, AP and MRR beside their training speed. Every model run through
`run_link_prediction` on the same `Protocol` is comparable with every other.

    python examples/tgraph_benchmark.py                   # bundled sp_hospital, TGN, 3 epochs
    python examples/tgraph_benchmark.py --dataset collegemsg --model jodie
    python examples/tgraph_benchmark.py --tiny            # 2,000 synthetic events, 1 epoch

The whole benchmark (every model, seeds, leaderboard) is `frugal tgraph bench`.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from frugal.data import TemporalEvents, load_events
from frugal.data.synthetic import TemporalStreamConfig, generate_temporal_events
from frugal.tgraph import ProtocolConfig, build_protocol, run_link_prediction


def main(argv: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Run the example; return per model its transductive test row against random negatives."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="sp_hospital", help="a bundled temporal graph")
    parser.add_argument("--model", default="tgn", help="jodie, dyrep, tgn or tgat")
    parser.add_argument(
        "--tiny", action="store_true", default=os.environ.get("FRUGAL_TINY", "") not in ("", "0")
    )
    args = parser.parse_args(argv)
    events: TemporalEvents
    if args.tiny:
        events = generate_temporal_events(TemporalStreamConfig(num_nodes=100, num_events=2000))
        name = "synthetic"
        config = ProtocolConfig(max_epochs=1, embedding_dim=16, num_neighbors=5)
    else:
        events, name = load_events(args.dataset), args.dataset
        config = ProtocolConfig(max_epochs=3)
    protocol = build_protocol(events, name, config)  # split + negatives, shared by every model
    print(f"{name}: {events.num_events:,} events, {events.num_nodes:,} nodes")
    rows = {}
    for model in ("recency", args.model):
        result = run_link_prediction(model, protocol, seed=0, num_threads=1)
        row = next(
            r for r in result.rows if r["view"] == "transductive" and r["negatives"] == "random"
        )
        rows[model] = {**row, **result.efficiency}
        speed = result.efficiency["train_events_per_s"]
        print(
            f"{model:>8}: test AUC {row['auc']:.3f}  AP {row['ap']:.3f}  MRR {row['mrr']:.3f}"
            f"  ({speed:,.0f} training events/s)"
        )
    return rows


if __name__ == "__main__":
    main()
