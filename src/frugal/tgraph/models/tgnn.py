"""TGN, JODIE, DyRep and TGAT on one set of building blocks.

Blocks: a learnable cosine `TimeEncoder`; a `TemporalAttention` layer (queries
[h_u || phi(0)], keys [h_j || e_j || phi(t - t_j)]); a node memory held as one (N, D) tensor
with a vectorised keep-last message store (PyG's `TGNMemory` keeps a Python dict per node and
loops over nodes; here the store is three (N,) tensors, so a flush is one GRU call); a decoder
MLP([z_u || z_v]) -> logit trained with `BCEWithLogitsLoss`.

Variants (`TemporalGNN.Config.variant`):
- tgn: GRU memory, messages [m_u || m_v || e || phi(t - t_u)], 1 attention layer over the k most
  recent neighbours.
- jodie: RNN-cell memory, same messages, embedding m_u * (1 + W dt_hat) with dt normalised by
  training-only statistics.
- dyrep: RNN-cell memory, messages carry the other endpoint's attention embedding instead of
  its memory; the output embedding is the memory.
- tgat: no memory; 2 attention layers over zero node features, k neighbours each.
The memory is updated from stored messages at the start of the next batch that touches a node,
so a batch never sees its own events and gradients reach the updater.

Shape legend: N nodes, B batch of queries, K neighbours, D memory/embedding width,
T time-encoding width, F edge-feature width, C candidates.

References:
    Temporal Graph Networks for Deep Learning on Dynamic Graphs, ICML 2020 GRL workshop,
    arXiv 2006.10637 (memory, messages, embedding module, section 3).
    Predicting Dynamic Embedding Trajectory in Temporal Interaction Networks (JODIE),
    KDD 2019, arXiv 1908.01207 (projection, section 3.3).
    DyRep: Learning Representations over Dynamic Graphs, ICLR 2019 (attention-based messages).
    Inductive Representation Learning on Temporal Graphs (TGAT), ICLR 2020, arXiv 2002.07962
    (functional time encoding, temporal attention, section 3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor, nn

from frugal.config import check_types
from frugal.tgraph.neighbors import NeighborFinder, Neighbors

__all__ = ["TemporalAttention", "TemporalGNN", "TimeEncoder"]

IntArray = npt.NDArray[np.int64]
Variant = Literal["tgn", "jodie", "dyrep", "tgat"]


def _rows(x_ND: Tensor, index: IntArray) -> Tensor:
    """x[index] for a numpy index of any shape -> (*index.shape, D).

    `index_select`, whose backward is a vectorised `index_add_`, not advanced indexing, whose
    CPU backward (an accumulating `index_put_`) is an order of magnitude slower here.
    """
    flat = torch.from_numpy(np.ascontiguousarray(index).reshape(-1))
    return x_ND.index_select(0, flat).view(*index.shape, *x_ND.shape[1:])


def _unique_columns(rows_RM: IntArray) -> tuple[IntArray, IntArray]:
    """Distinct columns of an (R, M) integer array, sorted, and each column's index among them.

    The same result as `np.unique(rows_RM, axis=1, return_inverse=True)` (columns in
    lexicographic order, first row most significant), by one `np.lexsort`: about 6x faster
    than numpy's structured-dtype sort at TGAT's 10^4-10^5 neighbour slots per batch.

    Shapes:
        rows_RM: (R, M) -> unique (R, U), inverse (M,).
    """
    num = rows_RM.shape[1]
    if num == 0:
        return rows_RM.copy(), np.zeros(0, dtype=np.int64)
    order = np.lexsort(rows_RM[::-1])
    sorted_RM = rows_RM[:, order]
    first = np.empty(num, dtype=bool)
    first[0] = True
    np.any(sorted_RM[:, 1:] != sorted_RM[:, :-1], axis=0, out=first[1:])
    inverse = np.empty(num, dtype=np.int64)
    inverse[order] = np.cumsum(first) - 1
    return sorted_RM[:, first], inverse


_DEDUP_MIN_SLOTS = 4096
"""Inputs of `TimeEncoder` from this many dt values on are deduplicated before encoding."""


class TimeEncoder(nn.Module):
    """phi(dt) = cos(w * dt + b), w initialised to 10^(-linspace(0, 9, T)), b = 0, learnable.

    The frequencies are learned in log space, w = w0 * exp(s) with s initialised to 0: Adam
    moves a parameter by about the learning rate per step whatever its scale, so a linear w
    (TGAT's parametrisation) moves its low frequencies by orders of magnitude within an
    epoch, and with dt in raw seconds (up to 1e7 on CollegeMsg) the encoding turns to noise
    (measured on CollegeMsg, TGN, lr 1e-4: val AP 0.66-0.71 over five epochs with a linear
    w, 0.848 with log-space w after eight, 0.848 with w fixed). In log space each step
    changes every frequency by the same small relative amount.

    Args:
        out_channels: T, the encoding width.
        learnable: Whether w (in log space) and b are trained; False fixes them, as in
            GraphMixer.

    Shapes:
        forward: dt (...) float -> (..., T).

    References:
        Inductive Representation Learning on Temporal Graphs, ICLR 2020, arXiv 2002.07962
        (section 3.2, functional time encoding); fixed frequencies from Do We Really Need
        Complicated Model Architectures for Temporal Networks? (GraphMixer), ICLR 2023,
        arXiv 2302.11636.
    """

    base: Tensor

    def __init__(self, out_channels: int, learnable: bool = True) -> None:
        super().__init__()
        self.out_channels = out_channels
        base = torch.from_numpy(10.0 ** -np.linspace(0, 9, out_channels)).float()
        self.register_buffer("base", base)
        self.log_scale = nn.Parameter(torch.zeros(out_channels), requires_grad=learnable)
        self.bias = nn.Parameter(torch.zeros(out_channels), requires_grad=learnable)

    @property
    def weight(self) -> Tensor:
        """The frequencies w, shape (T,)."""
        return self.base * self.log_scale.exp()

    def forward(self, dt: Tensor) -> Tensor:
        """Encode time differences (any shape, in the dataset's time unit).

        Large inputs are deduplicated first: each distinct dt is encoded once and its row
        gathered into every slot that holds it. With one torch thread the rows are
        bit-identical to encoding every slot (the same scalar ops per element; with more,
        the vectorised split over threads can differ in the last bits); the gradients of w
        and b are summed in another order. Neighbour slots repeat their dt a lot (padding
        slots are all 0, shared events recur across a batch's queries): TGAT's CollegeMsg
        batches hold 13-17 % distinct values in its 2-hop layer and 30-40 % in its 1-hop one.
        """
        flat = dt.reshape(-1).float()
        w_T, b_T = self.weight, self.bias
        if flat.numel() >= _DEDUP_MIN_SLOTS:
            unique_U, inverse_M = torch.unique(flat, return_inverse=True)
            if 2 * unique_U.numel() <= flat.numel():  # encoding cost dominates the gather
                phi_UT: Tensor = _CosineEncoding.apply(unique_U, w_T, b_T)  # type: ignore[no-untyped-call]
                return phi_UT.index_select(0, inverse_M).view(*dt.shape, self.out_channels)
        phi: Tensor = _CosineEncoding.apply(flat, w_T, b_T)  # type: ignore[no-untyped-call]
        return phi.view(*dt.shape, self.out_channels)


class _CosineEncoding(torch.autograd.Function):
    """cos(dt w^T + b) for dt (M,), w (T,), b (T,) -> (M, T), with a fused backward.

    Autograd's chain (outer product, add, cos) keeps three (M, T) tensors and runs five
    passes over them backward; here the backward recomputes the phase in place, and the
    gradients of w and b are one (2, M) x (M, T) product. TGAT's first layer encodes
    ~10^5 neighbour slots per batch, where this halves the encoder's time.
    """

    @staticmethod
    def forward(ctx: Any, dt_M: Tensor, w_T: Tensor, b_T: Tensor) -> Tensor:
        ctx.save_for_backward(dt_M, w_T, b_T)
        return torch.addr(b_T, dt_M, w_T).cos_()

    @staticmethod
    def backward(ctx: Any, grad_MT: Tensor) -> tuple[None, Tensor | None, Tensor | None]:
        dt_M, w_T, b_T = ctx.saved_tensors
        if not (ctx.needs_input_grad[1] or ctx.needs_input_grad[2]):
            return None, None, None
        # d cos(x) / dx = -sin(x): fold the sign into the left factor.
        grad_x_MT = torch.addr(b_T, dt_M, w_T).sin_().mul_(grad_MT)
        left_2M = torch.stack([dt_M, torch.ones_like(dt_M)]).neg_()
        grad_wb_2T = left_2M @ grad_x_MT
        return None, grad_wb_2T[0], grad_wb_2T[1]


class TemporalAttention(nn.Module):
    """One temporal graph-attention layer (multi-head) with a merge MLP.

    Query q = W_q [h_u || phi(0)]; key k_j = W_k h_j + W_e [e_j || phi(t - t_j)]; value
    v_j = W_v h_j + W_e [e_j || phi(t - t_j)] (the edge term is shared by key and value, as in
    PyG's `TransformerConv`). Output: MLP([attention || h_u]).

    The linear maps are re-associated with the attention sums, so no (B, K, D) key, value or
    edge projection is ever formed: per head h (width c = D / H),
    q_h . k_j = (W_k,h^T q_h) . h_j + q_h . b_k,h + (W_e,h^T q_h) . [e_j || phi_j], and
    sum_j a_j v_j = W_v,h (sum_j a_j h_j) + (sum_j a_j) b_v,h + W_e,h (sum_j a_j [e_j || phi_j]).
    A (query, neighbour) pair then costs O(H (D + F + T)) instead of O(D (D + F + T)); the
    result equals the textbook form up to float rounding (tested against it).

    Args:
        node_dim: D, width of h; must be divisible by `num_heads`.
        edge_dim: F, width of edge features (may be 0).
        time_dim: T.
        num_heads: Attention heads.
        dropout: Dropout of the attention weights.

    Shapes:
        forward: h_self (B, D), h_nbr (B, K, D) or None (all-zero neighbour features),
        e_nbr (B, K, F) or None (all-zero edge features), phi_zero (T,), phi_nbr (B, K, T),
        mask (B, K) -> (B, D).

    References:
        Temporal Graph Networks for Deep Learning on Dynamic Graphs, arXiv 2006.10637
        (graph attention embedding, section 3.3); Masked Label Prediction: Unified Message
        Passing Model for Semi-Supervised Classification, IJCAI 2021, arXiv 2009.03509
        (edge term added to keys and values).
    """

    def __init__(
        self, node_dim: int, edge_dim: int, time_dim: int, num_heads: int, dropout: float
    ) -> None:
        super().__init__()
        if node_dim % num_heads:
            raise ValueError(f"embedding_dim={node_dim} must be divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.edge_dim = edge_dim
        self.query = nn.Linear(node_dim + time_dim, node_dim)
        self.node_key = nn.Linear(node_dim, node_dim)
        self.node_value = nn.Linear(node_dim, node_dim)
        self.edge = nn.Linear(edge_dim + time_dim, node_dim, bias=False)
        self.dropout = nn.Dropout(dropout)
        self.merge = nn.Sequential(
            nn.Linear(2 * node_dim, node_dim), nn.ReLU(), nn.Linear(node_dim, node_dim)
        )

    def forward(
        self,
        h_self_BD: Tensor,
        h_nbr_BKD: Tensor | None,
        e_nbr_BKF: Tensor | None,
        phi_zero_T: Tensor,
        phi_nbr_BKT: Tensor,
        mask_BK: Tensor,
    ) -> Tensor:
        """Attend from each query node over its neighbours; nodes without any get zeros."""
        num, d = h_self_BD.shape
        heads = self.num_heads
        c = d // heads
        query_BD = self.query(torch.cat([h_self_BD, phi_zero_T.expand(num, -1)], dim=1))
        q_BHc = query_BD.view(num, heads, c)
        # Per-pair features f_j = [h_j || phi_j || e_j || 1] (G wide); the trailing 1 carries
        # the value bias, sum_j a_j b_v (dropout makes sum_j a_j differ from 1).
        w_edge_HcX = self.edge.weight.view(heads, c, -1)  # X = F + T: features, then time
        w_e_HcF, w_t_HcT = w_edge_HcX[:, :, : self.edge_dim], w_edge_HcX[:, :, self.edge_dim :]
        parts = [phi_nbr_BKT, phi_nbr_BKT.new_ones(num, phi_nbr_BKT.shape[1], 1)]
        key_parts = [w_t_HcT, w_t_HcT.new_zeros(heads, c, 1)]
        value_parts = [w_t_HcT, self.node_value.bias.view(heads, c, 1)]
        if e_nbr_BKF is not None and self.edge_dim:
            # All-zero features (None) add nothing to any logit or sum, and their weights
            # get zero gradients, so leaving them out changes no result (Benchtemp pads
            # featureless graphs with 172 zeros: a third of every product at its width).
            parts.insert(1, e_nbr_BKF)
            key_parts.insert(1, w_e_HcF)
            value_parts.insert(1, w_e_HcF)
        if h_nbr_BKD is not None:
            parts.insert(0, h_nbr_BKD)
            key_parts.insert(0, self.node_key.weight.view(heads, c, d))
            value_parts.insert(0, self.node_value.weight.view(heads, c, d))
        f_BKG = torch.cat(parts, dim=2)
        # q . b_k is equal for every neighbour of a query and cancels in the softmax.
        qk_BHG = torch.einsum("bhc,hcg->bhg", q_BHc * c**-0.5, torch.cat(key_parts, dim=2))
        p = self.dropout.p if self.training else 0.0
        agg_BHG: Tensor = _PairAttention.apply(qk_BHG, f_BKG, mask_BK, p)  # type: ignore[no-untyped-call]
        out_BHc = torch.einsum("bhg,hcg->bhc", agg_BHG, torch.cat(value_parts, dim=2))
        out: Tensor = self.merge(torch.cat([out_BHc.reshape(num, d), h_self_BD], dim=1))
        return out


class _PairAttention(torch.autograd.Function):
    """Masked, dropped-out softmax attention of each query over its own K neighbours.

    agg_b = dropout(softmax_k(q_b f_bk^T, masked)) f_b for queries (B, H, G) and features
    (B, K, G) -> (B, H, G); a query without neighbours gets zeros. A hand-written backward
    packs both gradients of f into one batched product (autograd's generic one runs four
    inner-dimension-H products), so a layer costs five small batched matmuls in all.
    """

    @staticmethod
    def forward(ctx: Any, qk_BHG: Tensor, f_BKG: Tensor, mask_BK: Tensor, p: float) -> Tensor:
        logits_BHK = torch.bmm(qk_BHG, f_BKG.transpose(1, 2))
        logits_BHK.masked_fill_(~mask_BK.unsqueeze(1), float("-inf"))
        weight_BHK = torch.softmax(logits_BHK, dim=2).nan_to_num_(0.0)
        keep_BHK = None
        dropped_BHK = weight_BHK
        if p > 0:
            keep_BHK = torch.empty_like(weight_BHK).bernoulli_(1.0 - p).div_(1.0 - p)
            dropped_BHK = weight_BHK * keep_BHK
        ctx.save_for_backward(qk_BHG, f_BKG, weight_BHK, dropped_BHK, keep_BHK)
        return torch.bmm(dropped_BHK, f_BKG)

    @staticmethod
    def backward(ctx: Any, grad_BHG: Tensor) -> tuple[Tensor, Tensor, None, None]:
        qk_BHG, f_BKG, weight_BHK, dropped_BHK, keep_BHK = ctx.saved_tensors
        grad_w_BHK = torch.bmm(grad_BHG, f_BKG.transpose(1, 2))
        if keep_BHK is not None:
            grad_w_BHK = grad_w_BHK * keep_BHK
        # Softmax backward; masked slots have weight 0 and so get gradient 0.
        grad_logits_BHK = weight_BHK * (
            grad_w_BHK - (grad_w_BHK * weight_BHK).sum(dim=2, keepdim=True)
        )
        grad_qk_BHG = torch.bmm(grad_logits_BHK, f_BKG)
        # f enters through the logits and through the weighted sum: one product for both.
        left_BK2H = torch.cat([grad_logits_BHK, dropped_BHK], dim=1).transpose(1, 2)
        grad_f_BKG = torch.bmm(left_BK2H, torch.cat([qk_BHG, grad_BHG], dim=1))
        return grad_qk_BHG, grad_f_BKG, None, None


class TemporalGNN(nn.Module):
    """A memory-based or attention-based TGNN link predictor (see the module docstring).

    Args:
        config: The model settings.
        num_nodes: N.
        msg: Edge features of every event, (E, F) float32 (F may be 0).
        train_dt_stats: (mean, std) of time since a node's previous training event (JODIE).
        time_origin: Time of the stream's first event; the last update of a fresh memory.

    Raises:
        ValueError: If the sizes are inconsistent.
    """

    memory: Tensor
    last_update: Tensor
    pending: Tensor
    pending_other: Tensor
    pending_t: Tensor
    pending_eid: Tensor
    pending_vec: Tensor
    edge_msg: Tensor

    @dataclass(frozen=True, kw_only=True, slots=True)
    class Config:
        """Settings of one TGNN."""

        variant: Variant = "tgn"
        """Which model: 'tgn', 'jodie', 'dyrep' or 'tgat'."""
        embedding_dim: int = 100
        """D: memory and embedding width; the time encoding uses the same width."""
        num_neighbors: int = 10
        """K: neighbours per attention layer."""
        num_layers: int = -1
        """Attention layers; -1 = the variant's default (tgn 1, tgat 2, jodie/dyrep 0)."""
        num_heads: int = 2
        """Attention heads."""
        dropout: float = 0.1
        """Dropout in attention and decoder."""
        neighbor_strategy: Literal["recent", "uniform"] = "recent"
        """Neighbour sampling: most recent K or uniform over the past (TGAT's original)."""
        use_learnable_time: bool = True
        """Train the time encoder's frequencies (TGAT/TGN, in log space) instead of fixing
        them (GraphMixer); see `TimeEncoder`."""

        def __post_init__(self) -> None:
            check_types(self)
            if self.embedding_dim < 1 or self.num_neighbors < 1 or self.num_heads < 1:
                raise ValueError("embedding_dim, num_neighbors and num_heads must be >= 1")
            if self.embedding_dim % self.num_heads:
                raise ValueError(
                    f"embedding_dim={self.embedding_dim} must be divisible by "
                    f"num_heads={self.num_heads}"
                )

    def __init__(
        self,
        config: TemporalGNN.Config,
        num_nodes: int,
        msg: npt.NDArray[np.float32],
        train_dt_stats: tuple[float, float] = (0.0, 1.0),
        time_origin: int = 0,
    ) -> None:
        super().__init__()
        self.config = config
        # A node that was never updated counts time from the stream's start, not from the
        # Unix epoch: Delta t of ~1e9 s would make its first message's time encoding noise.
        self.time_origin = int(time_origin)
        self.num_nodes = num_nodes
        d = config.embedding_dim
        variant = config.variant
        self.use_memory = variant != "tgat"
        default_layers = {"tgn": 1, "tgat": 2, "jodie": 0, "dyrep": 0}[variant]
        self.num_layers = default_layers if config.num_layers < 0 else config.num_layers
        self.register_buffer("edge_msg", torch.from_numpy(np.ascontiguousarray(msg)).float())
        edge_dim = int(msg.shape[1])
        # Featureless graphs padded with zeros: the padding is kept in every weight's shape
        # (same initialisation) but skipped in the products (see `TemporalAttention`).
        self.edge_features_zero = edge_dim == 0 or not bool(np.any(msg))
        self.time_encoder = TimeEncoder(d, learnable=config.use_learnable_time)
        attention_layers = max(self.num_layers, 1 if variant == "dyrep" else 0)
        self.layers = nn.ModuleList(
            TemporalAttention(d, edge_dim, d, config.num_heads, config.dropout)
            for _ in range(attention_layers)
        )
        message_dim = 2 * d + edge_dim + d
        self.updater: nn.Module | None = None
        if variant == "tgn":
            self.updater = nn.GRUCell(message_dim, d)
        elif variant in ("jodie", "dyrep"):
            self.updater = nn.RNNCell(message_dim, d)
        self.time_projection = nn.Linear(1, d) if variant == "jodie" else None
        self.dt_mean, self.dt_std = float(train_dt_stats[0]), max(float(train_dt_stats[1]), 1e-9)
        self.decoder = nn.Sequential(
            nn.Linear(2 * d, d), nn.ReLU(), nn.Dropout(config.dropout), nn.Linear(d, 1)
        )
        self.register_buffer("memory", torch.zeros(num_nodes, d))
        self.register_buffer(
            "last_update", torch.full((num_nodes,), self.time_origin, dtype=torch.long)
        )
        self.register_buffer("pending", torch.zeros(num_nodes, dtype=torch.bool))
        self.register_buffer("pending_other", torch.zeros(num_nodes, dtype=torch.long))
        self.register_buffer("pending_t", torch.zeros(num_nodes, dtype=torch.long))
        self.register_buffer("pending_eid", torch.zeros(num_nodes, dtype=torch.long))
        self.register_buffer("pending_vec", torch.zeros(num_nodes, d if variant == "dyrep" else 0))
        self._staged: tuple[Tensor, Tensor, Tensor] | None = None

    # -- state -------------------------------------------------------------------------
    _STATE = ("memory", "last_update", "pending", "pending_other", "pending_t", "pending_eid",
              "pending_vec")  # fmt: skip

    def reset_state(self) -> None:
        """Zero the memory and drop stored messages (start of every epoch)."""
        for name in self._STATE:
            getattr(self, name).zero_()
        self.last_update.fill_(self.time_origin)
        self._staged = None

    def state(self) -> dict[str, Tensor]:
        """A copy of the memory state (for backup and restore between passes)."""
        return {name: getattr(self, name).clone() for name in self._STATE}

    def load_state(self, state: dict[str, Tensor]) -> None:
        """Restore a state from `state()`."""
        for name in self._STATE:
            getattr(self, name).copy_(state[name])
        self._staged = None

    # -- memory ------------------------------------------------------------------------
    def _flushed_memory(self, n_id: Tensor, stage: bool = True) -> tuple[Tensor, Tensor]:
        """Memory of every node after applying the stored messages of `n_id` (out of place).

        A node's flushed memory depends only on the stored state, not on which other nodes
        are flushed with it. With `stage`, the update is kept for the next `commit`.

        Returns:
            (memory (N, D) with grad to the updater, last_update (N,)).
        """
        memory_ND, last_update_N = self.memory, self.last_update
        if self.updater is None:
            return memory_ND, last_update_N
        n_id = n_id[self.pending[n_id]]
        if n_id.numel() == 0:
            if stage:
                self._staged = (n_id, memory_ND[n_id], last_update_N[n_id])
            return memory_ND, last_update_N
        other = self.pending_other[n_id]
        t = self.pending_t[n_id]
        other_part = self.pending_vec[n_id] if self.config.variant == "dyrep" else memory_ND[other]
        message = torch.cat(
            [
                memory_ND[n_id],
                other_part,
                self.edge_msg[self.pending_eid[n_id]],
                self.time_encoder((t - last_update_N[n_id]).float()),
            ],
            dim=1,
        )
        updated: Tensor = self.updater(message, memory_ND[n_id])
        memory_ND = memory_ND.index_copy(0, n_id, updated)
        last_update_N = last_update_N.index_put((n_id,), t)
        if stage:
            self._staged = (n_id, updated, t)
        return memory_ND, last_update_N

    def peek_memory(self) -> tuple[Tensor, Tensor]:
        """Memory and last update of every node with all stored messages applied, (N, D), (N,).

        Nothing is staged: the next `commit` writes only what `forward_batch` flushed. Used
        to embed nodes outside the batch (ranking candidates, node classification).
        """
        return self._flushed_memory(torch.arange(self.num_nodes), stage=False)

    @torch.no_grad()
    def write_staged(self) -> None:
        """Write the memory that the last `forward_batch` flushed, storing no new messages.

        Used when a batch's own events are held back (`store_events` stores them later).
        """
        if self._staged is not None:
            n_id, updated, new_t = self._staged
            self.memory[n_id] = updated.detach()
            self.last_update[n_id] = new_t
            self.pending[n_id] = False
            self._staged = None

    @torch.no_grad()
    def store_events(
        self,
        src: IntArray,
        dst: IntArray,
        t: IntArray,
        eid: IntArray,
        other_vec: Tensor | None = None,
    ) -> None:
        """Store events scored earlier (held back) as their nodes' last messages.

        Each node's message still waiting is applied first, as the flush of a batch with
        these nodes would, so no update is lost when the new message replaces it. Call
        `write_staged` after the `forward_batch` that scored them.

        Shapes:
            src, dst, t, eid: (B,); other_vec: (2B, D) (DyRep) or None.
        """
        if self.updater is None:
            return
        self.write_staged()
        nodes = torch.from_numpy(np.unique(np.concatenate([src, dst])))
        self._flushed_memory(nodes, stage=True)
        self.commit_numpy(src, dst, t, eid, other_vec)

    @torch.no_grad()
    def commit(
        self, src: Tensor, dst: Tensor, t: Tensor, eid: Tensor, other_vec: Tensor | None = None
    ) -> None:
        """Write the flushed memory and store this batch's events as each node's last message.

        Args:
            src: Sources of the batch's true events, (B,), in time order.
            dst: Their destinations, (B,).
            t: Their times, (B,).
            eid: Their global event ids, (B,).
            other_vec: DyRep only: attention embedding of (src, dst), shape (2B, D).
        """
        if self.updater is None:
            return
        self.write_staged()
        num = src.numel()
        node = torch.cat([src, dst])
        other = torch.cat([dst, src])
        # Keep-last by event order: event i's source sits at position 2i, its destination
        # at 2i + 1, so a node's latest event wins whichever side of it the node was on.
        position = torch.cat([2 * torch.arange(num), 2 * torch.arange(num) + 1])
        last = torch.full((self.num_nodes,), -1, dtype=torch.long)
        last.scatter_reduce_(0, node, position, reduce="amax")
        nodes = torch.nonzero(last >= 0).squeeze(1)
        pick = last[nodes] // 2 + (last[nodes] % 2) * num  # back to an index into `node`
        self.pending[nodes] = True
        self.pending_other[nodes] = other[pick]
        self.pending_t[nodes] = torch.cat([t, t])[pick]
        self.pending_eid[nodes] = torch.cat([eid, eid])[pick]
        if self.config.variant == "dyrep" and other_vec is not None:
            swapped = torch.cat([other_vec[src.numel() :], other_vec[: src.numel()]])
            self.pending_vec[nodes] = swapped[pick].detach()

    def commit_numpy(
        self,
        src: IntArray,
        dst: IntArray,
        t: IntArray,
        eid: IntArray,
        other_vec: Tensor | None = None,
    ) -> None:
        """`commit` for numpy event arrays, shape (B,) each."""
        self.commit(
            torch.from_numpy(np.ascontiguousarray(src)),
            torch.from_numpy(np.ascontiguousarray(dst)),
            torch.from_numpy(np.ascontiguousarray(t)),
            torch.from_numpy(np.ascontiguousarray(eid)),
            other_vec,
        )

    # -- embeddings --------------------------------------------------------------------
    def _plan(
        self,
        layer: int,
        node: IntArray,
        t: IntArray,
        max_eid: IntArray,
        finder: NeighborFinder,
        rng: np.random.Generator | None,
    ) -> _Plan:
        """Sample the computation tree of `layer` attention layers (numpy only, no tensors)."""
        if layer == 0:
            return _Plan(layer=0, node=node, t=t)
        k = self.config.num_neighbors
        cutoff = finder.cutoff_before(t, max_eid)
        nb = finder.sample(node, cutoff, k, strategy=self.config.neighbor_strategy, rng=rng)
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
        rows = np.stack([nb.nbr.ravel(), nb.t.ravel(), nb.eid.ravel()])
        unique, inverse = _unique_columns(rows)
        child = self._plan(layer - 1, unique[0], unique[1], unique[2], finder, rng)
        return _Plan(
            layer=layer, node=node, t=t, nbr=nb, self_plan=self_plan, child=child,
            inverse=inverse.ravel(),
        )  # fmt: skip

    def _compute(self, plan: _Plan, memory_ND: Tensor) -> Tensor:
        """Embeddings of a sampled plan, (B, D); layer 0 = memory (or zero features)."""
        num = len(plan.node)
        if plan.layer == 0:
            if not self.use_memory:
                return memory_ND.new_zeros((num, self.config.embedding_dim))
            return _rows(memory_ND, plan.node)
        nb, self_plan = plan.nbr, plan.self_plan
        assert nb is not None
        assert self_plan is not None
        h_self_BD = self._compute(self_plan, memory_ND)
        h_nbr_BKD: Tensor | None = None
        if plan.layer == 1:
            if self.use_memory:
                h_nbr_BKD = _rows(memory_ND, nb.nbr)
        else:
            assert plan.child is not None
            assert plan.inverse is not None
            h_child = self._compute(plan.child, memory_ND)
            h_nbr_BKD = _rows(h_child, plan.inverse).view(num, nb.nbr.shape[1], -1)
        mask_BK = torch.from_numpy(nb.mask)
        e_BKF = None if self.edge_features_zero else _rows(self.edge_msg, nb.eid)
        dt_BK = torch.from_numpy(plan.t[:, None] - nb.t).float() * mask_BK
        phi_BKT = self.time_encoder(dt_BK)
        phi_zero_T = self.time_encoder(torch.zeros(1))
        attention = self.layers[plan.layer - 1]
        assert isinstance(attention, TemporalAttention)
        out: Tensor = attention(h_self_BD, h_nbr_BKD, e_BKF, phi_zero_T, phi_BKT, mask_BK)
        return out

    def _prepare(
        self,
        node: IntArray,
        t: IntArray,
        max_eid: IntArray,
        finder: NeighborFinder,
        rng: np.random.Generator | None,
    ) -> tuple[_Plan, IntArray] | None:
        """Dedup (node, t, bound) queries and sample their plan (TGN, TGAT), else None."""
        if self.config.variant not in ("tgn", "tgat"):
            return None
        # Identical (node, t, bound) queries give identical embeddings: compute each once.
        rows = np.stack([node, t, max_eid])
        unique, inverse = _unique_columns(rows)
        plan = self._plan(self.num_layers, unique[0], unique[1], unique[2], finder, rng)
        return plan, inverse.ravel()

    def _embed_prepared(
        self,
        prepared: tuple[_Plan, IntArray] | None,
        node: IntArray,
        t: IntArray,
        memory_ND: Tensor,
        last_update_N: Tensor,
    ) -> Tensor:
        if prepared is not None:
            plan, inverse = prepared
            return _rows(self._compute(plan, memory_ND), inverse)
        z = _rows(memory_ND, node)
        if self.config.variant == "jodie":
            assert self.time_projection is not None
            dt = torch.from_numpy(t).float() - last_update_N[torch.from_numpy(node)].float()
            dt_hat = ((dt - self.dt_mean) / self.dt_std).unsqueeze(1)
            z = z * (1 + self.time_projection(dt_hat))
        return z

    def embed(
        self,
        node: IntArray,
        t: IntArray,
        max_eid: IntArray,
        finder: NeighborFinder,
        memory_ND: Tensor,
        last_update_N: Tensor,
        rng: np.random.Generator | None = None,
    ) -> Tensor:
        """Temporal embeddings z(node, t) seeing only events with id < max_eid and time < t.

        `memory_ND` must hold the flushed memory of every node the embedding reads (the
        queries and their sampled neighbours); `peek_memory()` flushes all of them.

        Shapes:
            node, t, max_eid: (B,) -> (B, D).
        """
        prepared = self._prepare(node, t, max_eid, finder, rng)
        return self._embed_prepared(prepared, node, t, memory_ND, last_update_N)

    def score(self, z_src_BD: Tensor, z_dst_BD: Tensor) -> Tensor:
        """Decoder logits of (src, dst) pairs, shape (B,)."""
        logits_B1: Tensor = self.decoder(torch.cat([z_src_BD, z_dst_BD], dim=1))
        return logits_B1.squeeze(1)

    @torch.no_grad()
    def score_all(self, z_src_BD: Tensor, z_cand_CD: Tensor, chunk_size: int = 8) -> Tensor:
        """Logits of every (src, candidate) pair, shape (B, C), chunked over B (no autograd).

        The first decoder layer splits into a src part and a candidate part, so the (B, C)
        matrix costs one (B, C, D) ReLU instead of B * C concatenations. Small chunks keep
        the (chunk, C, D) hidden tensor in cache, and the ReLU and product write in place
        (13x faster than 64-row chunks on CollegeMsg's 1,899 candidates).
        """
        first, _, _, last = self.decoder
        assert isinstance(first, nn.Linear)
        assert isinstance(last, nn.Linear)
        d = z_src_BD.shape[1]
        src_part_BD = z_src_BD @ first.weight[:, :d].T + first.bias
        cand_part_CD = z_cand_CD @ first.weight[:, d:].T
        out_BC = z_src_BD.new_empty((z_src_BD.shape[0], z_cand_CD.shape[0]))
        for lo in range(0, src_part_BD.shape[0], chunk_size):  # one step per chunk of rows
            hidden = src_part_BD[lo : lo + chunk_size, None, :] + cand_part_CD[None]
            torch.matmul(hidden.relu_(), last.weight[0], out=out_BC[lo : lo + chunk_size])
        return out_BC + last.bias[0]

    def forward_batch(
        self,
        src: IntArray,
        dst_sets: list[IntArray],
        t: IntArray,
        first_eid: int,
        finder: NeighborFinder,
        rng: np.random.Generator | None = None,
    ) -> tuple[list[Tensor], Tensor, Tensor, Tensor | None]:
        """Flush memory for the batch's nodes and embed src and every destination set.

        Neighbours are sampled first, so the memory read by the embedding (queries and
        their sampled neighbours) is flushed in the same GRU call, as in TGN and PyG.

        Args:
            src: Sources, (B,).
            dst_sets: Destination arrays, each (B,): the true dst first, then negatives.
            t: Event times, (B,).
            first_eid: Global event id bound of the neighbour sampling: nothing with an id
                at or after it is seen (the batch's first event hides the whole batch).
            finder: Neighbour finder over the events the model may see.
            rng: Generator for uniform neighbour sampling.

        Returns:
            (logits per destination set, memory (N, D), last_update (N,), DyRep's attention
            embedding of [src; true dst] or None).
        """
        all_nodes = np.concatenate([src, *dst_sets])
        times = np.tile(t, 1 + len(dst_sets))
        max_eid = np.full(len(all_nodes), first_eid, dtype=np.int64)
        prepared = self._prepare(all_nodes, times, max_eid, finder, rng)
        dyrep_plan = None
        if self.config.variant == "dyrep":
            pair = np.concatenate([src, dst_sets[0]])
            dyrep_plan = self._plan(1, pair, np.tile(t, 2), max_eid[: 2 * len(src)], finder, rng)
        read = [all_nodes]
        for plan in (prepared[0] if prepared is not None else None, dyrep_plan):
            if plan is not None:
                read.extend(plan.memory_nodes())
        memory_ND, last_update_N = self._flushed_memory(
            torch.from_numpy(np.unique(np.concatenate(read)))
        )
        z = self._embed_prepared(prepared, all_nodes, times, memory_ND, last_update_N)
        z_parts = torch.split(z, len(src))
        logits = [self.score(z_parts[0], part) for part in z_parts[1:]]
        other_vec = None if dyrep_plan is None else self._compute(dyrep_plan, memory_ND)
        return logits, memory_ND, last_update_N, other_vec


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
    node: IntArray
    t: IntArray
    nbr: Neighbors | None = None
    self_plan: _Plan | None = None
    child: _Plan | None = None
    inverse: IntArray | None = None

    def memory_nodes(self) -> list[IntArray]:
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
