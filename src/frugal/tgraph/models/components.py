"""The exchangeable parts of a memory-based TGNN, as PyG's `TGNMemory` takes them.

A `TemporalGNN` is assembled from a memory updater (an `nn.GRUCell` or `nn.RNNCell`, or none),
a message function, an aggregator and an embedding module; each model of the registry picks
its parts (`frugal.tgraph.models.tgn`, `jodie`, `dyrep`, `tgat`):

- message function: `IdentityMessage` [m_u || m_v || e || phi] (TGN, JODIE) or
  `AttentionMessage` [m_u || z_v || e || phi] (DyRep);
- aggregator: `LastAggregator` (keep each node's latest event);
- embedding module: `GraphAttentionEmbedding` (TGN over memory, TGAT over zero features),
  `MemoryEmbedding` (DyRep) or `TimeProjectionEmbedding` (JODIE); GraphMixer's
  `MixerEmbedding` lives in `frugal.tgraph.models.graphmixer`.

Shape legend: N nodes, B batch of queries, K neighbours, D memory/embedding width,
T time-encoding width, F edge-feature width, M messages.

References:
    Temporal Graph Networks for Deep Learning on Dynamic Graphs, ICML 2020 GRL workshop,
    arXiv 2006.10637 (message function, aggregator, memory updater and embedding module,
    section 3.1-3.3).
    Predicting Dynamic Embedding Trajectory in Temporal Interaction Networks (JODIE),
    KDD 2019, arXiv 1908.01207 (projection, section 3.3).
    DyRep: Learning Representations over Dynamic Graphs, ICLR 2019 (attention-based messages).
    Inductive Representation Learning on Temporal Graphs (TGAT), ICLR 2020, arXiv 2002.07962
    (temporal attention over zero node features, section 3).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from frugal._typing import I64
from frugal.tgraph.models.blocks import TemporalAttention, TimeEncoder, gather_rows, unique_columns
from frugal.tgraph.neighbors import NeighborFinder, Neighbors, NeighborStrategy

__all__ = [
    "AttentionMessage",
    "EmbeddingModule",
    "GraphAttentionEmbedding",
    "IdentityMessage",
    "LastAggregator",
    "MemoryEmbedding",
    "MessageFunction",
    "Prepared",
    "TimeProjectionEmbedding",
]


# -- embedding modules ------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class _Plan:
    """The sampled computation tree of one attention layer's embeddings (numpy only).

    Attributes:
        layer: Attention layers below and including this one (0 = memory / features).
        node: Query nodes, (B,).
        t: Query times, (B,).
        nbr: Sampled neighbours, (B, K') (layer >= 1).
        self_plan: Plan of the same queries one layer down (layer >= 1).
        child: Plan of the distinct (neighbour, time, bound) rows one layer down (layer >= 2).
        inverse: Row of `child` of every neighbour slot, (B * K',) (layer >= 2).
    """

    layer: int
    node: I64
    t: I64
    nbr: Neighbors | None = None
    self_plan: _Plan | None = None
    child: _Plan | None = None
    inverse: I64 | None = None

    def memory_nodes(self) -> list[I64]:
        """Nodes whose layer-0 input (memory) the plan reads (with repeats)."""
        if self.layer == 0:
            return [self.node]
        assert self.nbr is not None
        assert self.self_plan is not None
        out = self.self_plan.memory_nodes()
        if self.layer == 1:
            out.append(self.nbr.nbr[self.nbr.mask])
        else:
            assert self.child is not None
            out.extend(self.child.memory_nodes())
        return out


@dataclass(frozen=True, slots=True)
class Prepared:
    """What an embedding module sampled for a batch of queries (numpy only, no tensors).

    Attributes:
        plan: The sampled computation tree over the distinct queries.
        inverse: Row of the plan's output of every query, (B,), or None (one row per query).
    """

    plan: _Plan
    inverse: I64 | None


class EmbeddingModule(nn.Module):
    """Turns memory into temporal embeddings z(node, t); the base reads no neighbours.

    A subclass that samples neighbours overrides `prepare` (the numpy sampling, done before
    memory is flushed, so the flush covers every node the embedding reads) and
    `memory_nodes`.

    Attributes:
        neighbor_strategy: How the module samples neighbours ('recent' or 'uniform', which
            needs an rng), or None for one that reads none.
    """

    neighbor_strategy: NeighborStrategy | None = None

    def prepare(
        self,
        node: I64,
        t: I64,
        max_eid: I64,
        finder: NeighborFinder,
        rng: np.random.Generator | None,
    ) -> Prepared | None:
        """Sample what the embedding of these queries reads (None: nothing to sample)."""
        return None

    def memory_nodes(self, prepared: Prepared | None) -> list[I64]:
        """Nodes (beyond the queries) whose memory the prepared embedding reads."""
        return [] if prepared is None else prepared.plan.memory_nodes()

    def forward(
        self,
        prepared: Prepared | None,
        node: I64,
        t: I64,
        memory_ND: Tensor,
        last_update_N: Tensor,
        edge_msg_EF: Tensor | None,
    ) -> Tensor:
        """Embeddings of the queries, (B, D).

        Args:
            prepared: What `prepare` returned for these queries.
            node: Query nodes, (B,).
            t: Query times, (B,).
            memory_ND: Flushed memory of every node the embedding reads.
            last_update_N: Time of each node's last memory update.
            edge_msg_EF: Edge features of every event, or None when they are all zero.
        """
        raise NotImplementedError


class MemoryEmbedding(EmbeddingModule):
    """z(u, t) = m_u: the memory itself (DyRep's output)."""

    def forward(
        self,
        prepared: Prepared | None,
        node: I64,
        t: I64,
        memory_ND: Tensor,
        last_update_N: Tensor,
        edge_msg_EF: Tensor | None,
    ) -> Tensor:
        """The memory rows of the queries, (B, D)."""
        return gather_rows(memory_ND, node)


class TimeProjectionEmbedding(EmbeddingModule):
    """JODIE's projection z(u, t) = m_u * (1 + W dt_hat), dt_hat = (t - t_u - mean) / std.

    Args:
        embedding_dim: D.
        train_dt_stats: (mean, std) of the time between a node's training events; only
            training statistics, so nothing is read from val or test.

    References:
        Predicting Dynamic Embedding Trajectory in Temporal Interaction Networks, KDD 2019,
        arXiv 1908.01207 (embedding projection, section 3.3).
    """

    def __init__(self, embedding_dim: int, train_dt_stats: tuple[float, float]) -> None:
        super().__init__()
        self.time_projection = nn.Linear(1, embedding_dim)
        self.dt_mean, self.dt_std = float(train_dt_stats[0]), max(float(train_dt_stats[1]), 1e-9)

    def forward(
        self,
        prepared: Prepared | None,
        node: I64,
        t: I64,
        memory_ND: Tensor,
        last_update_N: Tensor,
        edge_msg_EF: Tensor | None,
    ) -> Tensor:
        """Projected memory of the queries, (B, D)."""
        z = gather_rows(memory_ND, node)
        # Subtract in int64, then cast: float32 times lose whole seconds beyond 2**24 s.
        dt = (torch.from_numpy(t) - last_update_N[torch.from_numpy(node)]).float()
        dt_hat = ((dt - self.dt_mean) / self.dt_std).unsqueeze(1)
        out: Tensor = z * (1 + self.time_projection(dt_hat))
        return out


class GraphAttentionEmbedding(EmbeddingModule):
    """`num_layers` temporal attention layers over memory (TGN) or zero node features (TGAT).

    Args:
        embedding_dim: D; divisible by `num_heads`.
        edge_dim: F, width of the edge features (may be 0).
        time_encoder: The model's shared time encoder (T = D).
        num_layers: Attention layers L, >= 1.
        num_neighbors: K, neighbours sampled per query and layer.
        num_heads: Attention heads.
        dropout: Dropout of the attention weights.
        neighbor_strategy: 'recent' (the K most recent) or 'uniform' (TGAT's sampler).
        use_memory: Whether layer 0 reads the memory (TGN) or zero features (TGAT).
        use_dedup: Whether identical (node, t, bound) queries are embedded once.

    Raises:
        ValueError: If `embedding_dim` is not divisible by `num_heads`, or L or K < 1.

    References:
        Temporal Graph Networks for Deep Learning on Dynamic Graphs, arXiv 2006.10637
        (graph attention embedding, section 3.3); Inductive Representation Learning on
        Temporal Graphs, ICLR 2020, arXiv 2002.07962 (section 3.3).
    """

    neighbor_strategy: NeighborStrategy

    def __init__(
        self,
        embedding_dim: int,
        edge_dim: int,
        time_encoder: TimeEncoder,
        *,
        num_layers: int,
        num_neighbors: int,
        num_heads: int = 2,
        dropout: float = 0.1,
        neighbor_strategy: NeighborStrategy = "recent",
        use_memory: bool = True,
        use_dedup: bool = True,
    ) -> None:
        super().__init__()
        if num_layers < 1 or num_neighbors < 1:
            raise ValueError(
                f"num_layers={num_layers} and num_neighbors={num_neighbors} must be >= 1"
            )
        self.embedding_dim = embedding_dim
        self.num_layers = num_layers
        self.num_neighbors = num_neighbors
        self.neighbor_strategy = neighbor_strategy
        self.use_memory = use_memory
        self.use_dedup = use_dedup
        self.time_encoder = time_encoder
        self.layers = nn.ModuleList(
            TemporalAttention(embedding_dim, edge_dim, embedding_dim, num_heads, dropout)
            for _ in range(num_layers)
        )

    def prepare(
        self,
        node: I64,
        t: I64,
        max_eid: I64,
        finder: NeighborFinder,
        rng: np.random.Generator | None,
    ) -> Prepared:
        """Sample the computation tree of the queries (deduplicated when `use_dedup`)."""
        if not self.use_dedup:
            return Prepared(self._plan(self.num_layers, node, t, max_eid, finder, rng), None)
        # Identical (node, t, bound) queries give identical embeddings: compute each once.
        rows = np.stack([node, t, max_eid])
        unique, inverse = unique_columns(rows)
        plan = self._plan(self.num_layers, unique[0], unique[1], unique[2], finder, rng)
        return Prepared(plan, inverse.ravel())

    def forward(
        self,
        prepared: Prepared | None,
        node: I64,
        t: I64,
        memory_ND: Tensor,
        last_update_N: Tensor,
        edge_msg_EF: Tensor | None,
    ) -> Tensor:
        """Attention embeddings of the prepared queries, (B, D)."""
        assert prepared is not None  # prepare() always plans
        out = self._compute(prepared.plan, memory_ND, edge_msg_EF)
        return out if prepared.inverse is None else gather_rows(out, prepared.inverse)

    def _plan(
        self,
        layer: int,
        node: I64,
        t: I64,
        max_eid: I64,
        finder: NeighborFinder,
        rng: np.random.Generator | None,
    ) -> _Plan:
        """Sample the computation tree of `layer` attention layers (numpy only, no tensors)."""
        if layer == 0:
            return _Plan(layer=0, node=node, t=t)
        k = self.num_neighbors
        cutoff = finder.cutoff_before(t, max_eid)
        nb = finder.sample(node, cutoff, k, strategy=self.neighbor_strategy, rng=rng)
        # Valid slots are the last ones of each row (recent: left-padded; uniform: all or
        # none), so columns that are empty in every row can be dropped without changing
        # the result; early in a stream most are.
        width = max(int(nb.mask.sum(axis=1).max(initial=0)), 1)
        if width < k:
            nb = Neighbors(
                nb.nbr[:, k - width :], nb.eid[:, k - width :], nb.t[:, k - width :],
                nb.mask[:, k - width :],
            )  # fmt: skip
        self_plan = self._plan(layer - 1, node, t, max_eid, finder, rng)
        if layer == 1:
            return _Plan(layer=1, node=node, t=t, nbr=nb, self_plan=self_plan)
        # A neighbour's own embedding is computed at its event time, before its event.
        # Identical (node, t, bound) rows (padding slots, shared events) are computed once.
        # Padding slots get the smallest time so that they sort first whatever the stream's
        # times are: the order of the computed rows, and so every float sum, does not change
        # when all timestamps shift by a constant (padding is masked out of the attention).
        pad_t = np.where(nb.mask, nb.t, np.iinfo(np.int64).min)
        rows = np.stack([nb.nbr.ravel(), pad_t.ravel(), nb.eid.ravel()])
        unique, inverse = unique_columns(rows)
        child = self._plan(layer - 1, unique[0], unique[1], unique[2], finder, rng)
        return _Plan(
            layer=layer, node=node, t=t, nbr=nb, self_plan=self_plan, child=child,
            inverse=inverse.ravel(),
        )  # fmt: skip

    def _compute(self, plan: _Plan, memory_ND: Tensor, edge_msg_EF: Tensor | None) -> Tensor:
        """Embeddings of a sampled plan, (B, D); layer 0 = memory (or zero features)."""
        num = len(plan.node)
        if plan.layer == 0:
            if not self.use_memory:
                return memory_ND.new_zeros((num, self.embedding_dim))
            return gather_rows(memory_ND, plan.node)
        nb, self_plan = plan.nbr, plan.self_plan
        assert nb is not None
        assert self_plan is not None
        h_self_BD = self._compute(self_plan, memory_ND, edge_msg_EF)
        h_nbr_BKD: Tensor | None = None
        if plan.layer == 1:
            if self.use_memory:
                h_nbr_BKD = gather_rows(memory_ND, nb.nbr)
        else:
            assert plan.child is not None
            assert plan.inverse is not None
            h_child = self._compute(plan.child, memory_ND, edge_msg_EF)
            h_nbr_BKD = gather_rows(h_child, plan.inverse).view(num, nb.nbr.shape[1], -1)
        mask_BK = torch.from_numpy(nb.mask)
        e_BKF = None if edge_msg_EF is None else gather_rows(edge_msg_EF, nb.eid)
        dt_BK = torch.from_numpy(plan.t[:, None] - nb.t).float() * mask_BK
        phi_BKT = self.time_encoder(dt_BK)
        phi_zero_T = self.time_encoder(torch.zeros(1))
        attention = self.layers[plan.layer - 1]
        assert isinstance(attention, TemporalAttention)
        out: Tensor = attention(h_self_BD, h_nbr_BKD, e_BKF, phi_zero_T, phi_BKT, mask_BK)
        return out


# -- message functions ------------------------------------------------------------------
class MessageFunction(nn.Module):
    """Builds each node's message from its stored last event (PyG's `message_module`).

    Attributes:
        vector_dim: Width of the per-node vector stored with each message (0: none).
        embedding: Embedding of the event's endpoints computed when the event is scored
            and stored as that vector (DyRep), or None.
    """

    def __init__(self) -> None:
        super().__init__()
        # Instance attributes, not class ones: a class attribute would shadow the
        # submodule that `nn.Module` keeps in `_modules` once a subclass assigns one.
        self.vector_dim = 0
        self.embedding: GraphAttentionEmbedding | None = None

    def forward(
        self,
        memory_ND: Tensor,
        n_id: Tensor,
        other: Tensor,
        vector_MV: Tensor,
        edge_MF: Tensor,
        phi_MT: Tensor,
    ) -> Tensor:
        """Messages of the nodes `n_id`, (M, 2D + F + T).

        Args:
            memory_ND: Memory of every node.
            n_id: Nodes with a stored message, (M,).
            other: The other endpoint of each node's stored event, (M,).
            vector_MV: The vector stored with each message, (M, V) (V = `vector_dim`).
            edge_MF: Edge features of each stored event, (M, F).
            phi_MT: Time encoding of t - t_u of each stored event, (M, T).
        """
        raise NotImplementedError


class IdentityMessage(MessageFunction):
    """[m_u || m_v || e || phi(t - t_u)] (TGN and JODIE; PyG's `IdentityMessage`)."""

    def forward(
        self,
        memory_ND: Tensor,
        n_id: Tensor,
        other: Tensor,
        vector_MV: Tensor,
        edge_MF: Tensor,
        phi_MT: Tensor,
    ) -> Tensor:
        """Concatenate both endpoints' memory, the edge features and the time encoding."""
        return torch.cat([memory_ND[n_id], memory_ND[other], edge_MF, phi_MT], dim=1)


class AttentionMessage(MessageFunction):
    """[m_u || z_v || e || phi(t - t_u)] with z_v v's attention embedding at the event (DyRep).

    Args:
        embedding: One attention layer over memory; it embeds [src; dst] of every scored
            batch, and each endpoint stores the other's embedding with its message.

    References:
        DyRep: Learning Representations over Dynamic Graphs, ICLR 2019 (attention-based
        messages, as in TGN's DyRep variant, arXiv 2006.10637, table 1).
    """

    def __init__(self, embedding: GraphAttentionEmbedding) -> None:
        super().__init__()
        self.embedding = embedding
        self.vector_dim = embedding.embedding_dim

    def forward(
        self,
        memory_ND: Tensor,
        n_id: Tensor,
        other: Tensor,
        vector_MV: Tensor,
        edge_MF: Tensor,
        phi_MT: Tensor,
    ) -> Tensor:
        """Concatenate the node's memory, the stored vector, the edge features and phi."""
        return torch.cat([memory_ND[n_id], vector_MV, edge_MF, phi_MT], dim=1)


# -- aggregators ------------------------------------------------------------------------
class LastAggregator:
    """Keep each node's latest event of a batch as its stored message (PyG's `LastAggregator`).

    Keep-last by event order: event i's source sits at position 2i, its destination at
    2i + 1, so a node's latest event wins whichever side of it the node was on.
    """

    def select(self, node_2B: Tensor, num_nodes: int) -> tuple[Tensor, Tensor]:
        """The nodes of a batch and, for each, the index into `node_2B` of its message.

        Args:
            node_2B: [src; dst] of the batch's events, in time order, (2B,).
            num_nodes: N.

        Returns:
            (nodes with a new message, (U,); index of each one's event side in `node_2B`, (U,)).
        """
        num = node_2B.numel() // 2
        position = torch.cat([2 * torch.arange(num), 2 * torch.arange(num) + 1])
        last = torch.full((num_nodes,), -1, dtype=torch.long)
        last.scatter_reduce_(0, node_2B, position, reduce="amax")
        nodes = torch.nonzero(last >= 0).squeeze(1)
        pick = last[nodes] // 2 + (last[nodes] % 2) * num  # back to an index into `node_2B`
        return nodes, pick
