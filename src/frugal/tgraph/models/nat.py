"""NAT: neighbourhood-aware temporal network learning with N-caches (`scoring='pair'`).

Every node keeps two kinds of state, updated from its events only (no neighbour finder):

- a self representation h_u (width S, default 72), updated by a GRU cell from the node's
  last event (u, v, e, t): h_u <- GRU(W_s [h_v || x_e || phi(t - t_u')], h_u), where t_u'
  is the time of u's previous update. As in TGN, the update of an event is applied the
  next time u is scored (out of place, so gradients reach the GRU) and written when u's
  next event is stored.
- dictionary-type N-caches: a hop-0 entry (u itself) and a 1-hop cache of K slots
  (default 16). Neighbour v is stored in u's slot `slot_of(v) = (a v + (a + 1) v^2) mod K`
  (the reference's hash, a = `hash_multiplier`) as (v, event id, time, value), the value a
  small vector (width V, default 4). A new neighbour whose slot holds another id replaces it with
  probability `replace_prob` (default 0.9); the draw is a fixed hash of (event id, side,
  seed) (`replacement_uniforms`), so the caches do not depend on batching or on an rng.
  When an entry is read at time t its value is refreshed by a second GRU cell:
  value <- GRU(W_n [h_w || x_e || phi(t - t_entry)], value) for the entry's node w
  (zero for an empty entry or a node without events), and the refreshed value is written
  back when the entry's owner has an event (the hop-0 entry always; a 1-hop entry when it
  holds the event's other endpoint).

A pair (u, v, t) is scored from the union of u's and v's entries (2 (K + 1) per pair):
entries of the same node are merged (values summed) and the merged entry gets a joint
structural code, the bit set of the caches it was found in (u hop 0, u hop 1, v hop 0,
v hop 1: bits 1, 2, 4, 8; `joint_structure`), so a common neighbour of u and v has code
2 + 8 = 10 and v in u's 1-hop cache has code 2 + 4 = 6. The code is embedded (16 wide,
the reference's `pos_dim`) and concatenated to the merged value; one attention head
pools the pair's entries (a GAT layer: leaky-ReLU scores of the projected entries, a
softmax over the pair's entries); the pooled vector, h_u and h_v go through an MLP
(in -> in -> 1) to a logit. The joint code makes the score a function of the pair, so the
evaluator ranks NAT against the protocol's sampled candidates (`ranking="sampled:N"`).

Scoring reads the state left by earlier batches only; a batch's events are written by
`commit_numpy` / `store_events` after it is scored (nothing is staged), so no score reads
its own batch or a later event.

Defaults, the reference README's settings as Benchtemp runs NAT (`--n_degree 16 --n_hop 1
--self_dim 72 --ngh_dim 4 --pos_dim 16 --attn_n_head 1 --replace_prob 0.9 --seed 2`, time
encoding width 1, the reference's `--time_dim` default). The reference draws the hash's a
as `random.randint(0, 100)` once per run; the default a = 7 is that draw right after
`random.seed(2)`. With K = 16 an odd a reaches every slot and an even one only 4 (checked
for every a in [0, 100]; a = 2 puts even ids in slots 0 and 8), so about half of the
reference's runs used a quarter of the cache. Benchtemp also trains NAT with batch 100,
evaluates with batch 32, stops on validation AP with patience 3 and relative tolerance
1e-3, and seeds the model with 2; frugal's protocol has one setting of each for all models,
so these are not applied here (set them on the protocol:
`replace(protocol_preset("benchtemp"), train_batch_size=100, eval_batch_size=32)`; its
tolerance is absolute).

Departures from the reference code (Graph-COM/Neighborhood-Aware-Temporal-Network,
`module.py`):

- Times enter only as differences (t - t_entry, t - t_u'); the reference encodes absolute
  timestamps.
- One hop (the reference also has a 2-hop cache, off in Benchtemp's setting).
- The attention softmax is applied (the paper's Eq. for the attention pooling; the
  reference's GAT layer has it commented out and sums the projected entries).
- Empty state is zeros (the reference initialises the hop-0 values Xavier-random at each
  reset) and a node's self representation is updated only when it has an event to apply
  (the reference runs the GRU on a zero event too).
- Several events of a batch aimed at one slot: the batch's last one is the candidate (the
  reference's scatter keeps an unspecified one); the replacement draw compares it with the
  slot's content before the batch. The written values are recomputed when the events are
  stored (after the optimiser step in training), not kept from the scoring pass.
- Ids are 0-based with -1 for empty (the reference uses id 0 as empty).
- The hash's a is a setting (default 7, odd), not a fresh random draw per run.

Shape legend: N nodes, B queries, C destinations per query, P pairs, M nodes read, K
slots, E entries per node (K + 1), S self width, V value width, T time width, F edge
features, A attention width (V + pos_dim).

References:
    Neighborhood-aware Scalable Temporal Network Representation Learning, LoG 2022, arXiv
    2209.01084 (section 4: N-caches, self representations, joint neighbourhood features,
    attention and decoder). Reference code Graph-COM/Neighborhood-Aware-Temporal-Network,
    `module.py` (`NAT.contrast`, `batch_fetch_ncaches`, `update_memory`, `ncache_hash`,
    `update_ncaches`, `get_joint_feature`, `OutLayer`) and `GAT.py`.
"""

from __future__ import annotations

from typing import Any, Self

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor, nn

from frugal._typing import F64, I64
from frugal.tgraph.models.blocks import TimeEncoder
from frugal.tgraph.models.pair import PairScoringModel
from frugal.tgraph.models.registry import ModelInputs, register_model
from frugal.tgraph.neighbors import NeighborFinder, NeighborStrategy

__all__ = ["NAT", "build_nat", "joint_structure", "replacement_uniforms", "slot_of"]

_MASK64 = (1 << 64) - 1


def slot_of(node: I64, num_slots: int, hash_multiplier: int = 7) -> I64:
    """The N-cache slot of each neighbour id: the reference's `ncache_hash`.

    slot = (a v + (a + 1) v^2) mod K with a = hash_multiplier mod 100 (int64: v < 3e8).

    Shapes:
        node: any -> the same.
    """
    a = hash_multiplier % 100
    v = np.asarray(node, dtype=np.int64)
    slots: I64 = (a * v + (a + 1) * v * v) % num_slots
    return slots


def replacement_uniforms(eid: I64, side: I64, seed: int = 2) -> F64:
    """The replacement draw of each (event id, side) in [0, 1): splitmix64 of a counter.

    Side 0 is the event's source (inserting the destination), 1 its destination. A draw
    below `replace_prob` lets the event replace another neighbour in its slot. The draws are
    fixed by (eid, side, seed), so they do not depend on how events fall into batches.

    Shapes:
        eid, side: (M,) -> (M,).
    """
    mix = np.uint64(((seed * 0x9E3779B97F4A7C15) + 0x9E3779B97F4A7C15) & _MASK64)
    with np.errstate(over="ignore"):
        z = np.asarray(eid, dtype=np.uint64) * np.uint64(2) + np.asarray(side, np.uint64) + mix
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    uniforms: F64 = (z >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return uniforms


def joint_structure(
    node_PX: Tensor, bit_PX: Tensor, valid_PX: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Merge a pair's entries by node: each entry's joint code and whether it is the first.

    The reference's `get_joint_feature` scatter-adds the entries of each (node, pair): here
    entry i's code is the sum of the bits of every valid entry of its pair with the same node
    (the caches it was found in: each (side, hop) holds a node at most once, so the sum is
    the bit set), and only the first entry of each node is kept.

    Args:
        node_PX: Node id of each entry (X = the pair's entries from both sides).
        bit_PX: Bit of each entry's cache (1 << index of (side, hop)).
        valid_PX: Whether the entry holds a node.

    Returns:
        (code (P, X) int64, keep (P, X) bool, same (P, X, X) bool: entries i and j are both
        valid and hold the same node).

    Shapes:
        node_PX, bit_PX, valid_PX: (P, X) -> (P, X), (P, X), (P, X, X).
    """
    same_PXX = (node_PX[:, :, None] == node_PX[:, None, :]) & valid_PX[:, None, :]
    same_PXX &= valid_PX[:, :, None]
    code_PX = (same_PXX.long() * bit_PX[:, None, :]).sum(dim=2)
    earlier_XX = torch.ones(node_PX.shape[1], node_PX.shape[1], dtype=torch.bool).tril(-1)
    keep_PX = valid_PX & ~(same_PXX & earlier_XX).any(dim=2)
    return code_PX, keep_PX, same_PXX


def _last_per_key(key: I64, order: I64) -> I64:
    """Index of the row with the largest `order` among the rows of each distinct `key`."""
    idx = np.lexsort((order, key))
    last = np.ones(len(idx), dtype=bool)
    last[:-1] = key[idx[1:]] != key[idx[:-1]]
    picked: I64 = idx[last]
    return picked


class NAT(PairScoringModel):
    """Neighbourhood-aware temporal network link predictor (see the module docstring).

    Implements `PAIR_MODEL_METHODS` on `PairScoringModel` with event state of its own:
    self representations and N-caches, reset at each epoch and backed up with `state()`.

    Args:
        num_nodes: N.
        msg: Edge features of every event, (E, F) float32 (F may be 0; all-zero columns are
            left out).
        self_dim: S, width of the self representation, >= 1.
        num_slots: K, slots of the 1-hop N-cache, >= 1.
        value_dim: V, width of an N-cache value, >= 1.
        pos_dim: Width of the joint structural code's embedding, >= 1.
        time_dim: T, width of the time encoding, >= 1.
        num_heads: Attention heads (the outputs are averaged), >= 1.
        replace_prob: Probability that a new neighbour replaces another in its slot, [0, 1].
        hash_multiplier: a of the slot hash (odd reaches every slot of a power-of-2 K).
        seed: Seed of the replacement draws (the reference's `--seed 2`).
        dropout: Dropout of the attention layer.
        time_origin: Time of the stream's first event (a fresh node's last update).

    Raises:
        ValueError: On a setting out of range.
    """

    edge_msg: Tensor
    self_rep: Tensor
    self_t: Tensor
    pending: Tensor
    pending_other: Tensor
    pending_t: Tensor
    pending_eid: Tensor
    own_value: Tensor
    own_t: Tensor
    own_eid: Tensor
    cache_id: Tensor
    cache_t: Tensor
    cache_eid: Tensor
    cache_value: Tensor

    _STATE = ("self_rep", "self_t", "pending", "pending_other", "pending_t", "pending_eid",
              "own_value", "own_t", "own_eid", "cache_id", "cache_t", "cache_eid",
              "cache_value")  # fmt: skip

    def __init__(
        self,
        num_nodes: int,
        msg: npt.NDArray[np.float32],
        *,
        self_dim: int = 72,
        num_slots: int = 16,
        value_dim: int = 4,
        pos_dim: int = 16,
        time_dim: int = 1,
        num_heads: int = 1,
        replace_prob: float = 0.9,
        hash_multiplier: int = 7,
        seed: int = 2,
        dropout: float = 0.1,
        time_origin: int = 0,
    ) -> None:
        super().__init__()
        sizes = {"self_dim": self_dim, "num_slots": num_slots, "value_dim": value_dim,
                 "pos_dim": pos_dim, "time_dim": time_dim, "num_heads": num_heads}  # fmt: skip
        low = [f"{name}={value}" for name, value in sizes.items() if value < 1]
        if low:
            raise ValueError(f"{', '.join(low)}: NAT's widths and counts must be >= 1")
        if not 0.0 <= replace_prob <= 1.0:
            raise ValueError(f"replace_prob={replace_prob} must lie in [0, 1]")
        if msg.ndim != 2:
            raise ValueError(f"msg has shape {msg.shape}; edge features must be (E, F)")
        self.num_nodes = num_nodes
        self.num_slots = num_slots
        self.replace_prob = float(replace_prob)
        self.hash_multiplier = int(hash_multiplier)
        self.seed = int(seed)
        self.time_origin = int(time_origin)
        self.use_edge_features = int(msg.shape[1]) > 0 and bool(np.any(msg))
        edge_width = int(msg.shape[1]) if self.use_edge_features else 0
        self.register_buffer(
            "edge_msg", torch.from_numpy(np.ascontiguousarray(msg)).float(), persistent=False
        )
        self.time_encoder = TimeEncoder(time_dim)
        event_width = self_dim + edge_width + time_dim
        self.self_linear = nn.Linear(event_width, self_dim, bias=False)
        self.self_cell = nn.GRUCell(self_dim, self_dim)
        self.value_linear = nn.Linear(event_width, value_dim, bias=False)
        self.value_cell = nn.GRUCell(value_dim, value_dim)
        # Codes are bit sets over (u hop 0, u hop 1, v hop 0, v hop 1).
        self.code_embedding = nn.Embedding(16, pos_dim)
        attn_dim = value_dim + pos_dim
        self.attention = _EntryAttention(attn_dim, num_heads, dropout)
        out_width = attn_dim + 2 * self_dim
        # The reference's OutLayer: fc1 (in -> in), ReLU, fc2 (in -> 1), Xavier-normal.
        self.fc1 = nn.Linear(out_width, out_width)
        self.fc2 = nn.Linear(out_width, 1)
        nn.init.xavier_normal_(self.fc1.weight)
        nn.init.xavier_normal_(self.fc2.weight)
        n, k = num_nodes, num_slots
        self.register_buffer("self_rep", torch.zeros(n, self_dim))
        self.register_buffer("self_t", torch.full((n,), self.time_origin, dtype=torch.long))
        self.register_buffer("pending", torch.zeros(n, dtype=torch.bool))
        self.register_buffer("pending_other", torch.zeros(n, dtype=torch.long))
        self.register_buffer("pending_t", torch.zeros(n, dtype=torch.long))
        self.register_buffer("pending_eid", torch.full((n,), -1, dtype=torch.long))
        self.register_buffer("own_value", torch.zeros(n, value_dim))
        self.register_buffer("own_t", torch.zeros(n, dtype=torch.long))
        self.register_buffer("own_eid", torch.full((n,), -1, dtype=torch.long))
        self.register_buffer("cache_id", torch.full((n, k), -1, dtype=torch.long))
        self.register_buffer("cache_t", torch.zeros(n, k, dtype=torch.long))
        self.register_buffer("cache_eid", torch.full((n, k), -1, dtype=torch.long))
        self.register_buffer("cache_value", torch.zeros(n, k, value_dim))

    @classmethod
    def from_inputs(cls, inputs: ModelInputs, **options: Any) -> Self:
        """The model over the graph, dropout and time origin of `inputs`; `options` override.

        NAT's widths are its own (S = 72, ...): `inputs.embedding_dim` is not used.
        """
        return cls(
            inputs.num_nodes, inputs.msg, dropout=inputs.dropout,
            time_origin=inputs.time_origin, **options,
        )  # fmt: skip

    @property
    def neighbor_strategy(self) -> NeighborStrategy:
        """'recent': NAT reads its own caches, never the neighbour finder, and draws nothing."""
        return "recent"

    # -- event state ---------------------------------------------------------------------
    def reset_state(self) -> None:
        """Forget every event: zero representations, empty caches (start of every epoch)."""
        for name in self._STATE:
            getattr(self, name).zero_()
        self.self_t.fill_(self.time_origin)
        for name in ("pending_eid", "own_eid", "cache_id", "cache_eid"):
            getattr(self, name).fill_(-1)

    def state(self) -> dict[str, Tensor]:
        """A copy of the event state (self representations and N-caches)."""
        return {name: getattr(self, name).clone() for name in self._STATE}

    def load_state(self, state: dict[str, Tensor]) -> None:
        """Restore a `state()` copy."""
        for name in self._STATE:
            getattr(self, name).copy_(state[name])

    @torch.no_grad()
    def commit_numpy(
        self, src: I64, dst: I64, t: I64, eid: I64, other_vec: Tensor | None = None
    ) -> None:
        """Store scored events: N-cache entries, hop-0 entries, then self representations.

        Every value written is computed from the state before these events (the reference's
        order: the caches are refreshed with the self representations before the batch's
        update). `other_vec` is not used.

        Shapes:
            src, dst, t, eid: (B,), in time order.
        """
        if len(src) == 0:
            return
        node = np.concatenate([src, dst]).astype(np.int64)
        other = np.concatenate([dst, src]).astype(np.int64)
        times = np.concatenate([t, t]).astype(np.int64)
        eids = np.concatenate([eid, eid]).astype(np.int64)
        side = np.repeat(np.array([0, 1], dtype=np.int64), len(src))
        order = 2 * eids + side
        # 1-hop: the batch's last candidate per (node, slot) against the slot's content.
        slot = slot_of(other, self.num_slots, self.hash_multiplier)
        pick = _last_per_key(node * self.num_slots + slot, order)
        n_c, s_c = torch.from_numpy(node[pick]), torch.from_numpy(slot[pick])
        o_c, t_c = torch.from_numpy(other[pick]), torch.from_numpy(times[pick])
        held = self.cache_id[n_c, s_c]
        same = held == o_c
        value = self._refresh(o_c, self.cache_value[n_c, s_c], self.cache_eid[n_c, s_c],
                              t_c - self.cache_t[n_c, s_c], same)  # fmt: skip
        draws = torch.from_numpy(replacement_uniforms(eids[pick], side[pick], self.seed))
        write = (held < 0) | same | (draws < self.replace_prob)
        n_w, s_w = n_c[write], s_c[write]
        # hop 0 and the self representation: the batch's last event per node.
        last = _last_per_key(node, order)
        u = torch.from_numpy(node[last])
        u_t = torch.from_numpy(times[last])
        own = self._refresh(u, self.own_value[u], self.own_eid[u], u_t - self.own_t[u],
                            self.own_eid[u] >= 0)  # fmt: skip
        flushed = self._self_reps(u)
        self.cache_id[n_w, s_w] = o_c[write]
        self.cache_t[n_w, s_w] = t_c[write]
        self.cache_eid[n_w, s_w] = torch.from_numpy(eids[pick])[write]
        self.cache_value[n_w, s_w] = value[write]
        self.own_value[u] = own
        self.own_t[u] = u_t
        self.own_eid[u] = torch.from_numpy(eids[last])
        self.self_t[u] = torch.where(self.pending[u], self.pending_t[u], self.self_t[u])
        self.self_rep[u] = flushed
        self.pending[u] = True
        self.pending_other[u] = torch.from_numpy(other[last])
        self.pending_t[u] = u_t
        self.pending_eid[u] = torch.from_numpy(eids[last])

    store_events = commit_numpy

    # -- representations -----------------------------------------------------------------
    def _event_input(self, rep_MS: Tensor, eid_M: Tensor, dt_M: Tensor) -> Tensor:
        """[h_other || x_e || phi(dt)] of M events (zero edge features where eid < 0)."""
        parts = [rep_MS]
        if self.use_edge_features:
            known = eid_M >= 0
            parts.append(self.edge_msg[eid_M.clamp(min=0)] * known[..., None])
        parts.append(self.time_encoder(dt_M.float()))
        return torch.cat(parts, dim=-1)

    def _refresh(
        self, node_M: Tensor, value_MV: Tensor, eid_M: Tensor, dt_M: Tensor, valid_M: Tensor
    ) -> Tensor:
        """Entry values refreshed by the value GRU at the read time (zero where not valid).

        Shapes:
            node_M, eid_M, dt_M, valid_M: (M,) (any leading shape); value_MV: (M, V).
        """
        shape = node_M.shape
        flat = node_M.reshape(-1)
        valid = valid_M.reshape(-1)
        dt = torch.where(valid, dt_M.reshape(-1), 0)
        x = self._event_input(self.self_rep[flat.clamp(min=0)], eid_M.reshape(-1), dt)
        value: Tensor = self.value_cell(self.value_linear(x), value_MV.reshape(len(flat), -1))
        return (value * valid[:, None]).reshape(*shape, -1)

    def _self_reps(self, node_M: Tensor) -> Tensor:
        """Self representations with each node's stored event applied (out of place), (M, S)."""
        has = self.pending[node_M]
        dt = torch.where(has, self.pending_t[node_M] - self.self_t[node_M], 0)
        x = self._event_input(
            self.self_rep[self.pending_other[node_M]], self.pending_eid[node_M], dt
        )  # fmt: skip
        current = self.self_rep[node_M]
        updated: Tensor = self.self_cell(self.self_linear(x), current)
        return torch.where(has[:, None], updated, current)

    def entries(self, node: I64, t: I64) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The hop-0 entry and the 1-hop N-cache of each node, values refreshed at time t.

        Returns:
            (node ids (M, E), hop (E,), valid (M, E), values (M, E, V)); entry 0 is the node
            itself (always valid, value zero before its first event).

        Shapes:
            node, t: (M,) -> (M, E), (E,), (M, E), (M, E, V).
        """
        q = torch.from_numpy(np.ascontiguousarray(node, dtype=np.int64))
        t_q = torch.from_numpy(np.ascontiguousarray(t, dtype=np.int64))
        own = self._refresh(q, self.own_value[q], self.own_eid[q], t_q - self.own_t[q],
                            self.own_eid[q] >= 0)  # fmt: skip
        ids_MK = self.cache_id[q]
        valid_MK = ids_MK >= 0
        cached = self._refresh(ids_MK, self.cache_value[q], self.cache_eid[q],
                               t_q[:, None] - self.cache_t[q], valid_MK)  # fmt: skip
        ids = torch.cat([q[:, None], ids_MK], dim=1)
        valid = torch.cat([torch.ones_like(valid_MK[:, :1]), valid_MK], dim=1)
        hop = torch.ones(ids.shape[1], dtype=torch.long)
        hop[0] = 0
        return ids, hop, valid, torch.cat([own[:, None], cached], dim=1)

    # -- scoring -------------------------------------------------------------------------
    def joint_entries(self, src: I64, dst: I64, t: I64) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The merged entries of every pair (src[b], dst[b, c]) at t[b], pairs row-major.

        Returns:
            (node (P, X), joint code (P, X), keep (P, X): the first entry of each node,
            merged values (P, X, V): the sum over the pair's entries of the same node),
            X = 2 E: src's entries, then dst's.

        Shapes:
            src, t: (B,); dst: (B, C) -> P = B C.
        """
        b, c = dst.shape
        src_ids, hop, src_valid, src_values = self.entries(src, t)
        dst_ids, _, dst_valid, dst_values = self.entries(dst.reshape(-1), np.repeat(t, c))
        row = torch.arange(b).repeat_interleave(c)
        bits = torch.cat([1 << hop, 1 << (hop + int(hop.max()) + 1)])  # src, then dst caches
        node_PX = torch.cat([src_ids[row], dst_ids], dim=1)
        valid_PX = torch.cat([src_valid[row], dst_valid], dim=1)
        code_PX, keep_PX, same_PXX = joint_structure(
            node_PX, bits.expand_as(node_PX), valid_PX
        )  # fmt: skip
        values_PXV = torch.cat([src_values[row], dst_values], dim=1)
        return node_PX, code_PX, keep_PX, torch.bmm(same_PXX.float(), values_PXV)

    def score_pairs(
        self,
        src: I64,
        dst: I64,
        t: I64,
        first_eid: int,
        finder: NeighborFinder,
        rng: np.random.Generator | None = None,
    ) -> Tensor:
        """Logits of (src[b], dst[b, c], t[b]) from the state of earlier batches; writes none.

        `first_eid`, `finder` and `rng` are not used: the state holds only stored events.

        Returns:
            Logits, (B, C) (with autograd in train mode).

        Shapes:
            src, t: (B,); dst: (B, C) -> (B, C).
        """
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        t = np.asarray(t, dtype=np.int64)
        b, c = dst.shape
        row = torch.arange(b).repeat_interleave(c)
        _, code_PX, keep_PX, merged_PXV = self.joint_entries(src, dst, t)
        features_PXA = torch.cat([merged_PXV, self.code_embedding(code_PX)], dim=2)
        pooled_PA = self.attention(features_PXA, keep_PX)
        rep_src = self._self_reps(torch.from_numpy(src))
        rep_dst = self._self_reps(torch.from_numpy(dst.reshape(-1)))
        hidden = torch.relu(self.fc1(torch.cat([pooled_PA, rep_src[row], rep_dst], dim=1)))
        logits_P1: Tensor = self.fc2(hidden)
        return logits_P1[:, 0].reshape(b, c)


class _EntryAttention(nn.Module):
    """The reference's one-layer GAT over a pair's entries, with the softmax applied.

    Entries are projected (W, dropout before and after as in the reference's `GATLayerImp3`),
    scored by leaky-ReLU(a . W x), normalised by a softmax over the pair's kept entries per
    head; the heads' weighted sums are averaged and a bias added.

    Shapes:
        forward: x (P, X, A), keep (P, X) bool (each pair keeps >= 1) -> (P, A).
    """

    def __init__(self, width: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.proj = nn.Linear(width, num_heads * width, bias=False)
        self.score = nn.Parameter(torch.empty(num_heads, width))
        self.bias = nn.Parameter(torch.zeros(width))
        self.dropout = nn.Dropout(dropout)
        nn.init.xavier_uniform_(self.proj.weight)
        nn.init.xavier_uniform_(self.score)

    def forward(self, x_PXA: Tensor, keep_PX: Tensor) -> Tensor:
        """Attention-pooled entries of each pair."""
        p, x, a = x_PXA.shape
        h_PXHA = self.dropout(self.proj(self.dropout(x_PXA))).view(p, x, self.num_heads, a)
        logits_PXH = nn.functional.leaky_relu((h_PXHA * self.score).sum(dim=3), 0.2)
        logits_PXH = logits_PXH.masked_fill(~keep_PX[:, :, None], float("-inf"))
        weights_PXH = torch.softmax(logits_PXH, dim=1)
        pooled_PHA = torch.einsum("pxh,pxha->pha", weights_PXH, h_PXHA)
        out: Tensor = pooled_PHA.mean(dim=1) + self.bias
        return out


def build_nat(inputs: ModelInputs, **options: object) -> NAT:
    """The registered `nat`: `NAT.from_inputs` with the defaults of the module docstring."""
    return NAT.from_inputs(inputs, **options)


register_model(
    "nat",
    build_nat,
    description="NAT (LoG 2022, arXiv 2209.01084): 72-d self representations and 1-hop "
    "dictionary N-caches (16 slots, 4-d values) updated by GRUs, joint structural codes, "
    "1-head attention, MLP; pair-scoring (ranked on the protocol's sampled candidates)",
    native_neighbor_strategy="recent",
    scoring="pair",
    # Benchtemp's NAT script: batches of 100, tolerance 1e-3 (relative there, absolute here).
    training={"benchtemp": {"train_batch_size": 100, "tolerance": 1e-3}},
)
