"""Building blocks of the TGNNs: the time encoder and the temporal attention layer.

`TimeEncoder` is the learnable cosine encoding phi(dt) every model shares; `TemporalAttention`
is one multi-head temporal graph-attention layer with a merge MLP, with hand-written backward
passes for the two hot spots (the cosine encoding and the masked softmax over neighbours).

Shape legend: N nodes, B batch of queries, K neighbours, D memory/embedding width,
T time-encoding width, F edge-feature width, M encoded values, H heads, G pair features.

References:
    Inductive Representation Learning on Temporal Graphs (TGAT), ICLR 2020, arXiv 2002.07962
    (functional time encoding, temporal attention, section 3).
    Temporal Graph Networks for Deep Learning on Dynamic Graphs, ICML 2020 GRL workshop,
    arXiv 2006.10637 (graph attention embedding, section 3.3).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from frugal._typing import I64

__all__ = ["TemporalAttention", "TimeEncoder"]


def gather_rows(x_ND: Tensor, index: I64) -> Tensor:
    """x[index] for a numpy index of any shape -> (*index.shape, D).

    `index_select`, whose backward is a vectorised `index_add_`, not advanced indexing, whose
    CPU backward (an accumulating `index_put_`) is an order of magnitude slower here.
    """
    flat = torch.from_numpy(np.ascontiguousarray(index).reshape(-1))
    return x_ND.index_select(0, flat).view(*index.shape, *x_ND.shape[1:])


def unique_columns(rows_RM: I64) -> tuple[I64, I64]:
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
