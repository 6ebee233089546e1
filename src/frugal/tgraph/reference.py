"""PyG's reference TGN training loop, timed side by side with ours on the same events.

PyG (`torch_geometric.nn.models.tgn`) is the ecosystem's TGN: `TGNMemory` with
`IdentityMessage` and `LastAggregator`, `LastNeighborLoader`, and the example's
`TransformerConv` embedding and MLP link predictor (examples/tgn.py). Both loops train on the
first batches of the training events with the same width, batch size, neighbours and thread
count; the median batch time after warm-up gives training events/s.

References:
    Temporal Graph Networks for Deep Learning on Dynamic Graphs, ICML 2020 GRL workshop,
    arXiv 2006.10637; PyG's examples/tgn.py (torch-geometric 2.8.1).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from frugal.data import load_events
from frugal.tgraph.neighbors import NeighborFinder
from frugal.tgraph.protocol import ProtocolConfig, build_split

__all__ = ["WARMUP_BATCHES", "compare_with_pyg_tgn"]

WARMUP_BATCHES = 5
_ROUNDS = 2


def _pyg_batch_times(
    src: Tensor, dst: Tensor, t: Tensor, msg: Tensor, num_nodes: int, dim: int,
    num_neighbors: int, batch_size: int, num_batches: int, lr: float,
) -> list[float]:  # fmt: skip
    from torch_geometric.nn import TransformerConv
    from torch_geometric.nn.models.tgn import (
        IdentityMessage,
        LastAggregator,
        LastNeighborLoader,
        TGNMemory,
    )

    class GraphAttentionEmbedding(nn.Module):  # as in PyG's examples/tgn.py
        def __init__(self, in_channels: int, out_channels: int, msg_dim: int, time_enc: Any):
            super().__init__()
            self.time_enc = time_enc
            edge_dim = msg_dim + time_enc.out_channels
            self.conv = TransformerConv(
                in_channels, out_channels // 2, heads=2, dropout=0.1, edge_dim=edge_dim
            )

        def forward(self, x: Tensor, last_update: Tensor, edge_index: Tensor, t: Tensor,
                    msg: Tensor) -> Tensor:  # fmt: skip
            rel_t = last_update[edge_index[0]] - t
            rel_t_enc = self.time_enc(rel_t.to(x.dtype))
            edge_attr = torch.cat([rel_t_enc, msg], dim=-1)
            out: Tensor = self.conv(x, edge_index, edge_attr)
            return out

    msg_dim = msg.shape[1]
    memory = TGNMemory(
        num_nodes, msg_dim, dim, dim,
        message_module=IdentityMessage(msg_dim, dim, dim), aggregator_module=LastAggregator(),
    )  # fmt: skip
    gnn = GraphAttentionEmbedding(dim, dim, msg_dim, memory.time_enc)
    decoder = nn.Sequential(nn.Linear(2 * dim, dim), nn.ReLU(), nn.Linear(dim, 1))
    params = set(memory.parameters()) | set(gnn.parameters()) | set(decoder.parameters())
    optimizer = torch.optim.Adam(params, lr=lr, fused=True)  # same optimizer as ours
    loss_fn = nn.BCEWithLogitsLoss()
    loader = LastNeighborLoader(num_nodes, size=num_neighbors)
    assoc = torch.empty(num_nodes, dtype=torch.long)
    memory.train()
    gnn.train()
    memory.reset_state()
    loader.reset_state()
    dst_pool = torch.unique(dst)
    generator = torch.Generator().manual_seed(0)
    times = []
    for b in range(num_batches):  # one iteration per training batch
        lo, hi = b * batch_size, (b + 1) * batch_size
        if hi > len(src):
            break
        began = time.perf_counter()
        b_src, b_dst, b_t, b_msg = src[lo:hi], dst[lo:hi], t[lo:hi], msg[lo:hi]
        neg = dst_pool[torch.randint(0, len(dst_pool), (hi - lo,), generator=generator)]
        optimizer.zero_grad()
        n_id = torch.unique(torch.cat([b_src, b_dst, neg]))
        n_id, edge_index, e_id = loader(n_id)
        assoc[n_id] = torch.arange(n_id.size(0))
        z, last_update = memory(n_id)
        z = gnn(z, last_update, edge_index, t[e_id], msg[e_id])
        z_src = z[assoc[b_src]]
        pos = decoder(torch.cat([z_src, z[assoc[b_dst]]], dim=1))
        negative = decoder(torch.cat([z_src, z[assoc[neg]]], dim=1))
        loss = loss_fn(pos, torch.ones_like(pos)) + loss_fn(negative, torch.zeros_like(negative))
        memory.update_state(b_src, b_dst, b_t, b_msg)
        loader.insert(b_src, b_dst)
        loss.backward()
        optimizer.step()
        memory.detach()
        times.append(time.perf_counter() - began)
    return times


def _our_batch_times(
    events: Any, msg: np.ndarray[Any, Any], index: np.ndarray[Any, Any], dim: int,
    num_neighbors: int, batch_size: int, num_batches: int, lr: float,
) -> list[float]:  # fmt: skip
    from frugal.tgraph.models import ModelInputs
    from frugal.tgraph.models.tgn import build_tgn
    from frugal.tgraph.train import train_step

    model = build_tgn(
        ModelInputs(
            num_nodes=events.num_nodes,
            msg=msg,
            embedding_dim=dim,
            num_neighbors=num_neighbors,
            time_origin=int(events.t[0]),
        )
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, fused=True)
    finder = NeighborFinder(
        events.src[index], events.dst[index], events.t[index], events.num_nodes, eid=index
    )
    dst_pool = np.unique(events.dst[index])
    rng = np.random.default_rng(0)
    model.train()
    model.reset_state()
    times = []
    for b in range(num_batches):  # one iteration per training batch
        batch = index[b * batch_size : (b + 1) * batch_size]
        if len(batch) < batch_size:
            break
        began = time.perf_counter()
        train_step(
            model, optimizer, events, batch, dst_pool=dst_pool, bound=int(batch[0]),
            finder=finder, rng=rng,
        )  # fmt: skip
        times.append(time.perf_counter() - began)
    return times


def compare_with_pyg_tgn(
    dataset: str, protocol: ProtocolConfig, num_batches: int, num_threads: int
) -> dict[str, Any]:
    """Time our TGN and PyG's reference TGN on the same training batches, alternately.

    Args:
        dataset: Dataset id, or the path of an events file (as `load_events` takes it).
        protocol: Supplies embedding_dim, num_neighbors, train_batch_size and learning rate.
        num_batches: Training batches per loop (the first 5 are warm-up).
        num_threads: torch threads.

    Returns:
        {"ours_train_events_per_s", "pyg_train_events_per_s", "speedup", ...}, or
        {"error": ...} if torch-geometric is not installed.
    """
    try:
        import torch_geometric  # noqa: F401
    except ModuleNotFoundError:
        return {"error": "torch-geometric is not installed: pip install torch-geometric==2.8.1"}
    torch.set_num_threads(num_threads)
    events = load_events(dataset)
    index = build_split(events, protocol).train_index
    dim, k, batch = protocol.embedding_dim, protocol.num_neighbors, protocol.train_batch_size
    lr = protocol.learning_rate
    # PyG's message store drops zero-width messages inconsistently, so a graph without edge
    # features gets one zero column in both loops.
    msg = events.msg if events.msg is not None else np.zeros((events.num_events, 1), np.float32)
    tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in (
        events.src[index], events.dst[index], events.t[index])]  # fmt: skip
    msg_t = torch.from_numpy(np.ascontiguousarray(msg[index]))
    src_t, dst_t, t_t = tensors
    ours: list[float] = []
    pyg: list[float] = []
    # Alternating rounds, so that a load change on a shared machine hits both loops.
    for _ in range(_ROUNDS):
        torch.manual_seed(0)
        ours += _our_batch_times(events, msg, index, dim, k, batch, num_batches, lr)[
            WARMUP_BATCHES:
        ]
        torch.manual_seed(0)
        pyg += _pyg_batch_times(
            src_t, dst_t, t_t, msg_t, events.num_nodes, dim, k, batch, num_batches, lr
        )[WARMUP_BATCHES:]
    ours_s = float(np.median(ours))
    pyg_s = float(np.median(pyg))
    return {
        "ours_train_events_per_s": batch / ours_s,
        "pyg_train_events_per_s": batch / pyg_s,
        "speedup": pyg_s / ours_s,
        "batch_size": batch,
        "embedding_dim": dim,
        "num_neighbors": k,
        "timed_batches": len(ours),
        "optimizer": "Adam(fused=True) in both loops",
        "time_encoder": "both learnable cos encodings (ours: log-space frequencies; PyG: "
        "Linear(1, T))",
        "queries": "ours: one embedding per distinct (node, event time), as in TGN; PyG's "
        "example: one per distinct node per batch (less work when few nodes are active)",
        "memory_flushed_for": "both: batch nodes and their sampled neighbours",
    }
