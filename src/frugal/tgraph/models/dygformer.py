"""DyGFormer: a Transformer over both endpoints' interaction sequences (`scoring='pair'`).

For a query (u, v, t), each endpoint's sequence is the endpoint itself (slot 0, at time t,
over no event) followed by its L - 1 most recent events strictly before t (and before the
batch's first event id under `neighbor_bound='batch'`), oldest first, right-padded to L
slots (`first_hop_sequences`). Each slot has four channels:

- node: the neighbour's node features (zeros in frugal, as in Benchtemp and DyGLib);
- edge: the features of the slot's event;
- time: phi(t - t_event), the learnable cosine time encoding (zero on padded slots);
- neighbour co-occurrence: for the slot's node w, its count in u's sequence and its count
  in v's sequence (`cooccurrence_counts`; padded slots count 0 and are never counted), each
  count mapped by a 2-layer MLP (1 -> H -> H) and the two summed.

The sequence is cut into patches of `patch_size` slots; each channel's patch is projected
linearly to H (`channel_embedding_dim`), the four are concatenated (4 H), u's and v's
patch sequences are concatenated (2 L / patch_size tokens) and run through `num_layers`
pre-norm Transformer encoder layers (GELU, 4x feed-forward). Each side's patches are
averaged and mapped to D by one output layer: z_u, z_v. The link decoder is DyGLib's
`MergeLayer`, fc2(ReLU(fc1([z_u || z_v]))), 2 D -> D -> 1.

Because u's co-occurrence features depend on v's sequence (and the Transformer attends
across both), the model scores (u, v, t) jointly: the evaluator ranks it against the
protocol's sampled candidates (`ranking="sampled:N"`).

Defaults (DyGLib `utils/load_configs.py` for every dataset but Reddit): L =
`max_input_sequence_length` = 32, `patch_size` = 1, H = 50, time width T = 100,
`num_layers` = 2, `num_heads` = 2, dropout 0.1 (the protocol's); D = `embedding_dim` (the
protocol's; DyGLib: the node-feature width, 172). `build_dygformer` caps H at D // 2 and T
at D, which changes nothing at D >= 100 (both protocols) and keeps narrow test models small.

Departures from DyGLib's `models/DyGFormer.py`:

- Fixed length: every sequence is padded to L slots. DyGLib pads to the longest sequence of
  the batch (plus one, rounded up to a multiple of `patch_size`), and its padded tokens are
  not masked in attention nor in the mean, so a query's score there depends on which other
  queries share its batch; here it does not (the ranking scores the true destination in
  another batch than the AUC pass, and both must agree). The two coincide when some node of
  the batch has >= L - 1 earlier events, which is the common case on busy graphs.
- Padding is told by a mask, not by node id 0 (frugal's ids start at 0); a padded slot
  holds what DyGLib's does: zero node, edge and time features and zero counts, so its
  token is the projections' biases plus the projected MLP(0) + MLP(0).
- Zero features are not multiplied: the node channel (frugal graphs have no node
  features) is a learned constant, the bias of a projection of zeros (initialised as
  `nn.Linear(patch_size * D, H)`'s bias), and so is the edge channel on featureless data
  (F = 0, or Benchtemp's all-zero columns; DyGLib's projection weights of those zeros get
  no gradient, and are not built here).
- The co-occurrence MLP runs once on the counts 0..L and is gathered per slot (the same
  numbers as running it per slot); the counting is vectorised over (P, L, L) comparisons
  instead of DyGLib's per-query `np.unique` and dictionaries.
- The time encoder is `TimeEncoder` (frequencies learned in log space, see its docstring)
  where DyGLib learns them linearly.

Shape legend: B queries, C destinations per query, P pairs, S sequences, L slots, Q patches
per side (L / patch_size), H channel width, F edge features, T time-encoding width, D
embedding width.

References:
    Towards Better Dynamic Graph Learning: New Architecture and Unified Library, NeurIPS
    2023, arXiv 2303.13047 (section 4: learning from first-hop interactions, neighbour
    co-occurrence encoding, patching, Transformer encoder). Reference code yule-BUAA/DyGLib,
    `models/DyGFormer.py` (`DyGFormer`, `NeighborCooccurrenceEncoder`, `TransformerEncoder`)
    and `models/modules.py` (`TimeEncoder`, `MergeLayer`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from frugal._typing import I64
from frugal.tgraph.models.blocks import TimeEncoder, gather_rows, unique_columns
from frugal.tgraph.models.pair import PairScoringModel
from frugal.tgraph.models.registry import ModelInputs, register_model
from frugal.tgraph.neighbors import NeighborFinder, NeighborStrategy

__all__ = [
    "DyGFormer",
    "InteractionSequences",
    "build_dygformer",
    "cooccurrence_counts",
    "first_hop_sequences",
]

_TOKENS_PER_CHUNK = 32768  # Transformer tokens encoded at once when scoring many pairs


@dataclass(frozen=True, slots=True)
class InteractionSequences:
    """Each query node's first-hop interaction sequence, DyGLib's layout.

    Slot 0 is the node itself at the query time (over no event); slots 1..n hold its n most
    recent earlier events, oldest first; slots n+1..L-1 are padding (all arrays 0 there).

    Attributes:
        node: The node of each slot (slot 0: the query node; else the other endpoint), (S, L).
        eid: Global event id of the slot's event (0 at slot 0 and padding), (S, L).
        t: Time of the slot's event (the query time at slot 0, 0 at padding), (S, L).
        mask: True at slot 0 and at real events, (S, L).
    """

    node: I64
    eid: I64
    t: I64
    mask: npt.NDArray[np.bool_]


def first_hop_sequences(
    finder: NeighborFinder, node: I64, t: I64, first_eid: int, length: int
) -> InteractionSequences:
    """The node itself and its `length` - 1 most recent events before t, right-padded.

    An event is in the sequence if it is strictly before t and its id is below `first_eid`
    (the finder's `cutoff_before`).

    Args:
        finder: Neighbour finder over the events the model may see.
        node: Query nodes, (S,).
        t: Query times, (S,).
        first_eid: Event-id bound: no event with this id or later.
        length: L, >= 2.

    Returns:
        The sequences, each array (S, L).

    Raises:
        ValueError: If `length` < 2.
    """
    if length < 2:
        raise ValueError(f"length={length} must be >= 2 (the node itself and one event)")
    node = np.asarray(node, dtype=np.int64)
    t = np.asarray(t, dtype=np.int64)
    cutoff = finder.cutoff_before(t, np.full(len(node), first_eid, dtype=np.int64))
    nb = finder.sample(node, cutoff, length - 1, strategy="recent")  # left-padded
    # Real events first, in time order (a stable sort keeps their order): right padding.
    order = np.argsort(~nb.mask, axis=1, kind="stable")
    mask = np.take_along_axis(nb.mask, order, axis=1)

    def slots(self_column: I64, events: I64) -> I64:
        right = np.where(mask, np.take_along_axis(events, order, axis=1), 0)
        return np.concatenate([self_column[:, None], right], axis=1)

    return InteractionSequences(
        node=slots(node, nb.nbr),
        eid=slots(np.zeros_like(node), nb.eid),
        t=slots(t, nb.t),
        mask=np.concatenate([np.ones((len(node), 1), bool), mask], axis=1),
    )


def cooccurrence_counts(
    src_node: I64,
    src_mask: npt.NDArray[np.bool_],
    dst_node: I64,
    dst_mask: npt.NDArray[np.bool_],
) -> tuple[I64, I64]:
    """Each slot's node counted in the source's and in the destination's sequence.

    For pair p and source slot i holding node w: [count of w among the source's real slots,
    count of w among the destination's real slots]; the same for destination slots (source
    count first, as DyGLib). Padded slots (mask False) count nothing and get [0, 0].

    Args:
        src_node: Source sequences' nodes, (P, L).
        src_mask: Their real slots, (P, L).
        dst_node: Destination sequences' nodes, (P, M).
        dst_mask: Their real slots, (P, M).

    Returns:
        (source counts (P, L, 2), destination counts (P, M, 2)), int64.

    Shapes:
        src_node, src_mask: (P, L); dst_node, dst_mask: (P, M) -> (P, L, 2), (P, M, 2).

    References:
        DyGFormer, arXiv 2303.13047 (section 4.1, neighbour co-occurrence encoding);
        DyGLib `NeighborCooccurrenceEncoder.count_nodes_appearances`.
    """
    # One (P, L, M) comparison per pair of sequences, reduced along either side.
    cross = src_node[:, :, None] == dst_node[:, None, :]
    src_in_dst = (cross & dst_mask[:, None, :]).sum(axis=2)
    dst_in_src = (cross & src_mask[:, :, None]).sum(axis=1)
    src_in_src = ((src_node[:, :, None] == src_node[:, None, :]) & src_mask[:, None, :]).sum(2)
    dst_in_dst = ((dst_node[:, :, None] == dst_node[:, None, :]) & dst_mask[:, None, :]).sum(2)
    src_counts = np.stack([src_in_src, src_in_dst], axis=2) * src_mask[:, :, None]
    dst_counts = np.stack([dst_in_src, dst_in_dst], axis=2) * dst_mask[:, :, None]
    return src_counts.astype(np.int64), dst_counts.astype(np.int64)


def _constant_channel(fan_in: int, width: int) -> nn.Parameter:
    """The output of `nn.Linear(fan_in, width)` on zeros: its bias, initialised as torch does."""
    bound = 1.0 / math.sqrt(fan_in)
    return nn.Parameter(torch.empty(width).uniform_(-bound, bound))


class DyGFormer(PairScoringModel):
    """DyGFormer link predictor (see the module docstring).

    Implements the pair-model calls of the trainer (`PAIR_MODEL_METHODS`) on
    `PairScoringModel`: it keeps no event state (the sequences read the neighbour finder).

    Args:
        num_nodes: N.
        msg: Edge features of every event, (E, F) float32 (F may be 0).
        embedding_dim: D, the width of z_u and z_v and of the decoder's hidden layer.
        channel_embedding_dim: H, the width of each of the 4 channels (DyGLib: 50).
        time_dim: T, the time-encoding width (DyGLib: 100).
        max_input_sequence_length: L, slots per endpoint including the endpoint itself
            (DyGLib: 32), >= 2 and a multiple of `patch_size`.
        patch_size: Slots per patch (DyGLib: 1), >= 1.
        num_layers: Transformer encoder layers (DyGLib: 2), >= 1.
        num_heads: Attention heads (DyGLib: 2); 4 H must be divisible by it.
        dropout: Dropout of attention, feed-forward and residual branches (DyGLib: 0.1).

    Raises:
        ValueError: On a setting out of range.

    Shapes:
        score_pairs: src, t (B,); dst (B, C) -> (B, C).
    """

    edge_msg: Tensor
    cooccurrence_values: Tensor

    def __init__(
        self,
        num_nodes: int,
        msg: npt.NDArray[np.float32],
        *,
        embedding_dim: int = 100,
        channel_embedding_dim: int = 50,
        time_dim: int = 100,
        max_input_sequence_length: int = 32,
        patch_size: int = 1,
        num_layers: int = 2,
        num_heads: int = 2,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        sizes = {
            "embedding_dim": embedding_dim, "channel_embedding_dim": channel_embedding_dim,
            "time_dim": time_dim, "patch_size": patch_size, "num_layers": num_layers,
            "num_heads": num_heads,
        }  # fmt: skip
        small = [f"{name}={value}" for name, value in sizes.items() if value < 1]
        if small:
            raise ValueError(f"{', '.join(small)}: each must be >= 1")
        length = max_input_sequence_length
        if length < 2 or length % patch_size:
            raise ValueError(
                f"max_input_sequence_length={length} must be >= 2 and a multiple of "
                f"patch_size={patch_size}; change either"
            )
        width = 4 * channel_embedding_dim
        if width % num_heads:
            raise ValueError(
                f"4 x channel_embedding_dim = {width} is not divisible by num_heads="
                f"{num_heads}; change either"
            )
        if msg.ndim != 2:
            raise ValueError(f"msg has shape {msg.shape}; edge features must be (E, F)")
        self.num_nodes = num_nodes
        self.length = length
        self.patch_size = patch_size
        self.channel_embedding_dim = channel_embedding_dim
        edge_dim = int(msg.shape[1])
        # Zero edge features (featureless data, Benchtemp's zero columns) are not multiplied.
        self.use_edge_features = edge_dim > 0 and bool(np.any(msg))
        self.register_buffer(
            "edge_msg", torch.from_numpy(np.ascontiguousarray(msg)).float(), persistent=False
        )
        self.register_buffer(
            "cooccurrence_values", torch.arange(length + 1, dtype=torch.float32)[:, None],
            persistent=False,
        )  # fmt: skip
        self.time_encoder = TimeEncoder(time_dim)
        h = channel_embedding_dim
        self.cooccurrence_mlp = nn.Sequential(nn.Linear(1, h), nn.ReLU(), nn.Linear(h, h))
        # The node channel projects zero node features: its bias, a learned constant.
        self.node_channel = _constant_channel(patch_size * embedding_dim, h)
        # Without edge features the edge channel is a learned constant too (initialised as
        # the bias of DyGLib's projection of its zero columns, or of D zeros when F = 0).
        self.edge_projection: nn.Linear | None = None
        self.edge_channel: nn.Parameter | None = None
        if self.use_edge_features:
            self.edge_projection = nn.Linear(patch_size * edge_dim, h)
        else:
            self.edge_channel = _constant_channel(patch_size * (edge_dim or embedding_dim), h)
        self.time_projection = nn.Linear(patch_size * time_dim, h)
        self.cooccurrence_projection = nn.Linear(patch_size * h, h)
        # DyGLib's TransformerEncoder: pre-norm, attention and residual dropout, GELU, 4x FFN.
        self.transformers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                width,
                num_heads,
                4 * width,
                dropout,
                activation="gelu",
                batch_first=True,
                norm_first=True,
            )
            for _ in range(num_layers)
        )
        self.output_layer = nn.Linear(width, embedding_dim)
        # DyGLib's MergeLayer(D, D, D, 1) with torch's default initialisation.
        self.fc1 = nn.Linear(2 * embedding_dim, embedding_dim)
        self.fc2 = nn.Linear(embedding_dim, 1)

    @property
    def neighbor_strategy(self) -> NeighborStrategy:
        """'recent': the sequences are each node's most recent events (no randomness)."""
        return "recent"

    # -- encoding ------------------------------------------------------------------------
    def _patches(self, x_PLW: Tensor) -> Tensor:
        """(P, L, W) slot features -> (P, Q, patch_size W) patches, slots in order."""
        p, length, w = x_PLW.shape
        return x_PLW.reshape(p, length // self.patch_size, self.patch_size * w)

    def _tokens(self, seq: InteractionSequences, counts_PL2: I64, t_P: I64) -> Tensor:
        """One side's patch tokens [node || edge || time || co-occurrence], (P, Q, 4 H)."""
        p, length = seq.node.shape
        q, h = length // self.patch_size, self.channel_embedding_dim
        mask_PL1 = torch.from_numpy(seq.mask)[:, :, None]
        constant = self.node_channel.expand(p, q, h)
        if self.edge_projection is None:
            assert self.edge_channel is not None  # built when edge features are all zero
            edge_PQH = self.edge_channel.expand(p, q, h)
        else:
            real = seq.mask.copy()
            real[:, 0] = False  # slot 0 (the node itself) arrives over no event
            e_PLF = gather_rows(self.edge_msg, seq.eid) * torch.from_numpy(real)[:, :, None]
            edge_PQH = self.edge_projection(self._patches(e_PLF))
        # Padded slots encode dt = 0 (one repeated value for the encoder's dedup), then zero.
        dt_PL = torch.from_numpy((t_P[:, None] - seq.t) * seq.mask).float()
        time_PLT = self.time_encoder(dt_PL) * mask_PL1
        time_PQH = self.time_projection(self._patches(time_PLT))
        # The MLP of every possible count, gathered: counts lie in [0, L].
        table_VH = self.cooccurrence_mlp(self.cooccurrence_values)
        cooc_PLH = gather_rows(table_VH, counts_PL2[:, :, 0]) + gather_rows(
            table_VH, counts_PL2[:, :, 1]
        )
        cooc_PQH = self.cooccurrence_projection(self._patches(cooc_PLH))
        return torch.cat([constant, edge_PQH, time_PQH, cooc_PQH], dim=2)

    def embed_pairs(
        self, src_seq: InteractionSequences, dst_seq: InteractionSequences, t_P: I64
    ) -> tuple[Tensor, Tensor]:
        """z_u and z_v of each pair of sequences.

        Args:
            src_seq: The sources' sequences, (P, L) each.
            dst_seq: The destinations' sequences, (P, L) each.
            t_P: Query times, (P,).

        Returns:
            (z_u (P, D), z_v (P, D)).
        """
        src_counts, dst_counts = cooccurrence_counts(
            src_seq.node, src_seq.mask, dst_seq.node, dst_seq.mask
        )  # fmt: skip
        src_PQW = self._tokens(src_seq, src_counts, t_P)
        dst_PQW = self._tokens(dst_seq, dst_counts, t_P)
        x_PKW = torch.cat([src_PQW, dst_PQW], dim=1)
        for layer in self.transformers:
            x_PKW = layer(x_PKW)
        q = src_PQW.shape[1]
        z_src = self.output_layer(x_PKW[:, :q].mean(dim=1))
        z_dst = self.output_layer(x_PKW[:, q:].mean(dim=1))
        return z_src, z_dst

    # -- scoring -------------------------------------------------------------------------
    def score_pairs(
        self,
        src: I64,
        dst: I64,
        t: I64,
        first_eid: int,
        finder: NeighborFinder,
        rng: np.random.Generator | None = None,
    ) -> Tensor:
        """Logits of (src[b], dst[b, c], t[b]) for every b and c; reads and writes no state.

        Each source's sequence is read once and shared by its C destinations; each distinct
        (destination, t) once. Pairs are encoded in chunks of about 32,768 Transformer
        tokens (the result does not depend on the chunking).

        Args:
            src: Sources, (B,).
            dst: Destinations, (B, C).
            t: Query times, (B,).
            first_eid: Event-id bound: no sequence holds an event with this id or later.
            finder: Neighbour finder over the events the model may see.
            rng: Unused (the sequences are the most recent events).

        Returns:
            Logits, (B, C) (with autograd in train mode).

        Shapes:
            src, t: (B,); dst: (B, C) -> (B, C).
        """
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        t = np.asarray(t, dtype=np.int64)
        b, c = dst.shape
        src_seq = first_hop_sequences(finder, src, t, first_eid, self.length)
        # Distinct (destination, t) queries: candidates repeat across a batch's rows.
        unique_RU, dst_of = unique_columns(np.stack([dst.ravel(), np.repeat(t, c)]))
        dst_seq = first_hop_sequences(finder, unique_RU[0], unique_RU[1], first_eid, self.length)
        src_of = np.repeat(np.arange(b), c)
        chunk = max(1, _TOKENS_PER_CHUNK // (2 * self.length // self.patch_size))
        parts = []
        for lo in range(0, b * c, chunk):  # one iteration per chunk of pairs
            rows_s, rows_d = src_of[lo : lo + chunk], dst_of[lo : lo + chunk]
            z_src, z_dst = self.embed_pairs(
                _take(src_seq, rows_s), _take(dst_seq, rows_d), t[rows_s]
            )  # fmt: skip
            hidden = F.relu(self.fc1(torch.cat([z_src, z_dst], dim=1)))
            parts.append(self.fc2(hidden)[:, 0])
        return torch.cat(parts).reshape(b, c)


def _take(seq: InteractionSequences, rows: I64) -> InteractionSequences:
    """The sequences of `rows`, in that order."""
    return InteractionSequences(seq.node[rows], seq.eid[rows], seq.t[rows], seq.mask[rows])


def build_dygformer(inputs: ModelInputs, **options: object) -> DyGFormer:
    """The registered `dygformer`: DyGLib's defaults, H and T capped at D // 2 and D.

    Args:
        inputs: Sizes and shared settings (D = `embedding_dim`, dropout).
        **options: `DyGFormer` keyword arguments that override the defaults.

    Returns:
        The model, initialised under the caller's torch seed.

    Raises:
        ValueError: On a setting out of range.
    """
    d = inputs.embedding_dim
    widths = {"channel_embedding_dim": max(1, min(50, d // 2)), "time_dim": min(100, d)}
    return DyGFormer.from_inputs(inputs, **{**widths, **options})


register_model(
    "dygformer",
    build_dygformer,
    description="DyGFormer (NeurIPS 2023, arXiv 2303.13047): Transformer over both endpoints' "
    "32 most recent interactions with neighbour co-occurrence counts; pair-scoring (ranked "
    "on the protocol's sampled candidates)",
    native_neighbor_strategy="recent",
    scoring="pair",
    in_default=False,  # hours per epoch and evaluation on a CPU: name it with --model
)
