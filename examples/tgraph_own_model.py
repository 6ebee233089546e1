"""Your own temporal GNN and your own events file in `frugal tgraph bench`, with no glue code.

This file is the user's module. `NormedMemoryTGN` is TGN with one part changed, the memory
updater: a GRU cell followed by a LayerNorm, so a node's memory keeps one scale however many
updates it gets. Subclassing `TemporalGNN` gives the model every call the trainer makes
(`frugal.tgraph.models.LEARNED_MODEL_METHODS`); its `from_inputs` classmethod builds it from
the protocol's `ModelInputs`, which is how the bench builds a class it is pointed at:

    cd examples
    frugal tgraph bench --model tgraph_own_model:NormedMemoryTGN --model tgn --seeds 1

The reference is `package.module:attribute`, imported from the current folder or `sys.path`
(so it also reaches the bench's child processes). Every row then compares your model with
the built-in ones under the same hashed protocol and negatives. A class that lacks a call is
refused before any training, naming the missing methods (see `BrokenModel`).

Your data is a CSV with a header `src,dst,t[,label][,feature columns]` (or an `ml_NAME.csv`):
`--dataset path/to/events.csv`. Rows are named by the file's SHA-256, so a changed file is
never mixed up with results of the old one.

    python examples/tgraph_own_model.py                          # CollegeMsg, 2 epochs
    python examples/tgraph_own_model.py --dataset my_events.csv  # your events file
    python examples/tgraph_own_model.py --tiny                   # a 3,000-event CSV, 1 epoch
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from frugal.cli.main import main as frugal_main
from frugal.tgraph.models import IdentityMessage, ModelInputs, TemporalGNN, TimeEncoder
from frugal.tgraph.models.tgnn import attention_embedding, memory_cell


class NormedGRU(nn.Module):
    """memory' = LayerNorm(GRUCell(message, memory)); called as `updater(message, memory)`."""

    def __init__(self, inputs: ModelInputs) -> None:
        super().__init__()
        self.cell = memory_cell(nn.GRUCell, inputs)
        self.norm = nn.LayerNorm(inputs.embedding_dim)

    def forward(self, message_MX: Tensor, memory_MD: Tensor) -> Tensor:
        """The updated memory of M nodes, (M, D), from their messages (M, X)."""
        out: Tensor = self.norm(self.cell(message_MX, memory_MD))
        return out


class NormedMemoryTGN(TemporalGNN):
    """TGN (arXiv 2006.10637) whose memory updater is a GRU cell plus a LayerNorm."""

    @classmethod
    def from_inputs(cls, inputs: ModelInputs, **parts: Any) -> TemporalGNN:
        """The model over the protocol's inputs; the parts are chosen here, not passed in."""
        time_encoder = TimeEncoder(inputs.embedding_dim)
        embedding = attention_embedding(inputs, time_encoder, num_layers=1, num_heads=2)
        return super().from_inputs(
            inputs, time_encoder=time_encoder, embedding=embedding,
            memory_updater=NormedGRU(inputs), message=IdentityMessage(),
        )  # fmt: skip


class BrokenModel(nn.Module):
    """Not a temporal model: the bench refuses it before training and names what is missing."""

    def __init__(self, inputs: ModelInputs) -> None:
        super().__init__()
        self.linear = nn.Linear(inputs.embedding_dim, 1)


def _write_events_csv(path: Path, num_events: int = 3000) -> Path:
    """A synthetic stream written as a user's CSV: src, dst, t, f1, f2 (two edge features)."""
    import numpy as np
    import pandas as pd

    from frugal.data.synthetic import TemporalStreamConfig, generate_temporal_events

    events = generate_temporal_events(TemporalStreamConfig(num_nodes=60, num_events=num_events))
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"src": events.src, "dst": events.dst, "t": events.t})
    frame["f1"], frame["f2"] = rng.random(num_events), rng.random(num_events)
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False)
    return path


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Bench the model beside TGN; return {model: transductive test row vs random negatives}."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="reports/tgraph-own-model", help="bench folder")
    parser.add_argument("--dataset", default="collegemsg", help="bundled id or events file")
    parser.add_argument(
        "--tiny", action="store_true", default=os.environ.get("FRUGAL_TINY", "") not in ("", "0")
    )
    args = parser.parse_args(argv)
    # What `cd examples` does for a user: make this module importable by its name.
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    reference = "tgraph_own_model:NormedMemoryTGN"
    dataset = args.dataset
    if args.tiny:  # a user's events file: src, dst, t and two edge-feature columns
        dataset = str(_write_events_csv(Path(args.out) / "my_events.csv"))
    epochs = 1 if args.tiny else 2
    settings = ["--dataset", dataset, "--set", f"protocol.max_epochs={epochs}"]
    settings += ["--set", "compare_pyg_reference=false"]
    if args.tiny:
        settings += ["--set", "protocol.embedding_dim=16", "--set", "protocol.num_neighbors=5"]
    code = frugal_main(
        ["tgraph", "bench", "--model", reference, "--model", "tgn", "--seeds", "1",
         "--out", args.out, *settings]
    )  # fmt: skip
    if code != 0:
        raise SystemExit(code)
    rows = json.loads((Path(args.out) / "results.json").read_text())["rows"]
    picked = {
        row["system"]: row
        for row in rows
        if row["setting"] == "transductive" and row["negatives"] == "random"
    }
    for model in (reference, "tgn"):
        print(f"{model}: test AUC {picked[model]['auc']:.3f}  AP {picked[model]['ap']:.3f}")
    return picked


if __name__ == "__main__":
    main()
