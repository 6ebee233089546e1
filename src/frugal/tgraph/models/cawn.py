"""CAWN: causal anonymous walks, a pair-scoring model (`scoring='pair'`).

For a query (src, dst, t), M temporal walks of L steps go backwards in time from src and
from dst (`frugal.tgraph.walks.sample_walks`, P ~ exp(alpha (t' - t))). Each node on a walk
is replaced by its hitting counts in both walk sets (`hitting_counts`, CAW section 4.2),
normalised by M (CAW's landing probabilities, `enc='lp'`) and mapped by an MLP
(L + 1 -> pos_dim -> pos_dim) applied to the src-set and dst-set counts and summed. Each
walk step is then [position encoding || time encoding phi(t - t_step) || edge features of
the step's event]; a bidirectional LSTM over the walk's steps and one over its position
encodings (CAW's `FeatureEncoder`s) are concatenated and projected to D_a = (input width)
// 2; the M walks are pooled (mean, Benchtemp's `walk_pool='sum'`, which CAW computes as a
mean; or a transformer layer then the mean, `'attn'`) and projected to D; src's and
dst's vectors go through CAW's `MergeLayer` (2 D -> D -> 1) to a logit.

Because the anonymisation of src's walks depends on dst's walk set, the model scores
(src, dst, t) jointly: it has no node embedding, so the evaluator ranks it against the
protocol's sampled candidates (`ranking="sampled:N"`), not against every node.

Defaults: M = 32 walks ("lite", the brief's 16-32 for 2 CPU cores; Benchtemp and CAW's
README use 64), L = 2 (CAW `--n_layer 2`), alpha = 1e-5 per time unit (the brief;
Benchtemp), pos_dim = 108 (CAW README), `walk_pool='sum'` (Benchtemp), time width D =
`embedding_dim` (CAW: the node-feature width), 8 heads for 'attn'.

Departures from the reference code (snap-stanford/CAW `module.py`): no node features (frugal
data has none, Benchtemp's are zeros) and zero edge features are left out of the step
vector; the LSTM's output is read at each walk's last real step (CAW reads index -1 of the
padded output, which is zero for walks shorter than the batch's longest); a walk step after
the first takes events strictly before the previous step's time (CAW: before the previous
event in the node's list, which admits same-time events); walks see nothing at or after the
batch's first event id under `neighbor_bound='batch'`.

Shape legend: B queries, C destinations per query, P pairs, M walks, L steps (L + 1 nodes),
D embedding width, F edge features, S step width.

References:
    Inductive Representation Learning in Temporal Networks via Causal Anonymous Walks, ICLR
    2021, arXiv 2101.05974 (sections 4.1-4.4); reference code snap-stanford/CAW, `module.py`
    (`CAWN`, `PositionEncoder`, `RandomWalkAttention`, `FeatureEncoder`, `SetPooler`,
    `MergeLayer`) and `graph.py` (`NeighborFinder.get_temporal_neighbor`); Benchtemp's CAWN
    runner (qianghuangwhu/benchtemp).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, cast

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor, nn

from frugal._typing import I64
from frugal.tgraph.models.blocks import TimeEncoder
from frugal.tgraph.models.pair import PairScoringModel
from frugal.tgraph.models.registry import ModelInputs, register_model
from frugal.tgraph.neighbors import NeighborFinder, NeighborStrategy
from frugal.tgraph.walks import TemporalWalks, hitting_counts, sample_walks

__all__ = ["CAWN", "AnonymousWalkModel", "WalkEncoder", "build_cawn"]

WalkPool = Literal["sum", "attn"]
SequenceEncoderFactory = Callable[[int, int], nn.Module]
"""Builds a walk's sequence encoder from (input width, hidden width): a module with an
`out_features` attribute, called as (x (W, L + 1, S), length (W,)[, gap (W, L)]) -> (W, H)."""
_WALKS_PER_CHUNK = 16384  # walks encoded at once when scoring many pairs (memory bound)


class _LastStepBiLSTM(nn.Module):
    """CAW's bidirectional `FeatureEncoder`, read at each walk's last real step.

    At step len - 1 the forward direction has read steps 0..len-1 and the backward
    direction (of a packed sequence) only step len - 1, so the backward half is one LSTM
    step from zero state on that step's input.

    Shapes:
        forward: x (W, L + 1, S), length (W,) in [1, L + 1] -> (W, 2 (H // 2)).
    """

    def __init__(self, in_features: int, hidden_features: int) -> None:
        super().__init__()
        half = max(hidden_features // 2, 1)
        self.out_features = 2 * half
        self.forward_lstm = nn.LSTM(in_features, half, batch_first=True)
        self.backward_lstm = nn.LSTM(in_features, half, batch_first=True)

    def forward(self, x_WLS: Tensor, length_W: Tensor) -> Tensor:
        """Concatenated forward and backward states at each walk's last real step."""
        num = x_WLS.shape[0]
        # The number of walks changes every batch (distinct walks only), and oneDNN caches
        # one LSTM primitive (with its memory, tens of MiB) per input shape: a CollegeMsg
        # run grew by ~20 MiB a step to over 10 GiB. Padding to one of 8 sizes per octave
        # keeps the shapes few, for at most 12.5 % more rows (zeros, never read back).
        padded = _bucket(num)
        if padded > num:
            x_WLS = torch.cat([x_WLS, x_WLS.new_zeros(padded - num, *x_WLS.shape[1:])])
        out_WLH, _ = self.forward_lstm(x_WLS)
        rows = torch.arange(num)
        last = length_W - 1
        last_WS = x_WLS[rows, last]
        if padded > num:
            last_WS = torch.cat([last_WS, last_WS.new_zeros(padded - num, last_WS.shape[1])])
        backward_W1H, _ = self.backward_lstm(last_WS[:, None, :])
        return torch.cat([out_WLH[rows, last], backward_W1H[:num, 0]], dim=1)


def _bucket(num: int) -> int:
    """`num` rounded up to a multiple of 2^(floor(log2 num) - 3) (8 sizes per octave)."""
    if num <= 64:
        return 64
    step = 1 << (num.bit_length() - 4)
    return -(-num // step) * step


class WalkEncoder(nn.Module):
    """Encodes one walk set per pair into a vector: CAW's `RandomWalkAttention`.

    Args:
        step_features: S, the width of [time encoding || edge features] per step.
        walk_length: L.
        pos_dim: Width of the position (anonymisation) encoding.
        out_features: D, the output width.
        walk_pool: 'sum' (mean over walks, Benchtemp) or 'attn' (transformer layer, then
            the mean; CAW's default).
        num_heads: Heads of the 'attn' transformer layer.
        dropout: Dropout.
        sequence_encoder: Builds the encoders of a walk's steps and of its position
            encodings (default CAW's bi-LSTM read at the last real step; NeurTW passes its
            GRU-ODE, which also reads the time gaps between steps).

    Raises:
        ValueError: If 'attn' pooling's width is not divisible by `num_heads`.

    Shapes:
        forward: counts (P, M, L + 1, 2, L + 1) int (the raw hitting counts; divided by M
            here), walk (P, M) (each pair walk's row in steps), steps (W, L + 1, S) (the
            features of W distinct walks), length (W,), gap (W, L) or None -> (P, D).
    """

    def __init__(
        self,
        step_features: int,
        walk_length: int,
        pos_dim: int,
        out_features: int,
        *,
        walk_pool: WalkPool = "sum",
        num_heads: int = 8,
        dropout: float = 0.1,
        sequence_encoder: SequenceEncoderFactory | None = None,
    ) -> None:
        super().__init__()
        self.walk_pool = walk_pool
        self.position_mlp = nn.Sequential(
            nn.Linear(walk_length + 1, pos_dim), nn.ReLU(), nn.Linear(pos_dim, pos_dim)
        )
        model_dim = step_features + pos_dim
        build = _LastStepBiLSTM if sequence_encoder is None else sequence_encoder
        self.feature_encoder = build(model_dim, model_dim)
        self.position_encoder = build(pos_dim, pos_dim)
        attn_dim = model_dim // 2
        width = cast(int, self.feature_encoder.out_features) + cast(
            int, self.position_encoder.out_features
        )
        self.projector = nn.Sequential(nn.Linear(width, attn_dim), nn.ReLU(), nn.Dropout(dropout))
        self.attention: nn.Module | None = None
        if walk_pool == "attn":
            if attn_dim % num_heads:
                raise ValueError(
                    f"walk_pool='attn' needs the walk width {attn_dim} divisible by "
                    f"num_heads={num_heads}; change pos_dim or num_heads"
                )
            self.attention = nn.TransformerEncoderLayer(
                attn_dim, num_heads, 4 * attn_dim, dropout, batch_first=True
            )
        self.out_proj = nn.Sequential(
            nn.Linear(attn_dim, out_features), nn.ReLU(), nn.Dropout(dropout)
        )

    def forward(
        self,
        counts_PMLKL: I64,
        walk_PM: I64,
        steps_WLS: Tensor,
        length_W: Tensor,
        gap_WL: Tensor | None = None,
    ) -> Tensor:
        """One vector per pair from its M walks (see the class docstring for shapes)."""
        p, m, length = counts_PMLKL.shape[:3]
        # Everything before the pooling is a function of (walk, hitting-count pattern), and
        # few of those are distinct: the position branch depends on the pattern only (most
        # nodes are hit once, in one set), and a source walk ranked against C candidates
        # that share none of its nodes has the same pattern for all C. Each runs once per
        # distinct key and is gathered back, which gives the same numbers.
        patterns_UX, pattern_of = np.unique(
            counts_PMLKL.reshape(p * m, -1), axis=0, return_inverse=True
        )  # fmt: skip
        num_patterns = len(patterns_UX)
        pattern_of = pattern_of.reshape(-1)
        keys_K, key_of = np.unique(
            walk_PM.reshape(-1) * num_patterns + pattern_of, return_inverse=True
        )  # fmt: skip
        walk_K = torch.from_numpy(keys_K // num_patterns)
        pattern_K = torch.from_numpy(keys_K % num_patterns)
        landing_ULKL = torch.from_numpy(patterns_UX.reshape(num_patterns, length, 2, length))
        landing_ULKL = landing_ULKL.float() / m  # counts / M: CAW's landing probabilities
        position_ULQ = self.position_mlp(landing_ULKL).sum(dim=2)  # src set + dst set
        if gap_WL is None:
            # A real step is hit at least once in its own set; null steps have no counts.
            real_UL = patterns_UX.reshape(num_patterns, length, -1).sum(axis=2) > 0
            position_walk_UQ = self.position_encoder(
                position_ULQ, torch.from_numpy(real_UL.sum(axis=1))
            )  # fmt: skip
            position_walk_KQ = position_walk_UQ[pattern_K]
            gaps: tuple[Tensor, ...] = ()
        else:  # the encoders read the walk's time gaps too: one run per (walk, pattern)
            gaps = (gap_WL[walk_K],)
            position_walk_KQ = self.position_encoder(
                position_ULQ[pattern_K], length_W[walk_K], *gaps
            )  # fmt: skip
        combined_KLS = torch.cat([steps_WLS[walk_K], position_ULQ[pattern_K]], dim=2)
        walk_KA = self.projector(
            torch.cat(
                [self.feature_encoder(combined_KLS, length_W[walk_K], *gaps), position_walk_KQ],
                dim=1,
            )
        )
        walks_PMA = walk_KA[torch.from_numpy(key_of.reshape(-1))].reshape(p, m, -1)
        if self.attention is not None:
            walks_PMA = self.attention(walks_PMA)
        out: Tensor = self.out_proj(walks_PMA.mean(dim=1))
        return out


class AnonymousWalkModel(PairScoringModel):
    """The walk pair scorer CAWN and NeurTW share: walks, anonymisation, encoder, merge layer.

    For a query (src, dst, t) it samples M walks of L steps from each endpoint
    (`sample_walks`), replaces their nodes by hitting counts in both walk sets
    (`hitting_counts`), encodes each side's walk set with `walk_encoder` (a `WalkEncoder`)
    and scores the two vectors with CAW's `MergeLayer`. A subclass builds `walk_encoder`
    after this `__init__`, then calls `_build_merge_layer` (so parameters are created, and
    initialised, in CAWN's order), and implements `_steps`.

    Args:
        num_nodes: N.
        msg: Edge features of every event, (E, F) float32 (F may be 0).
        num_walks: M walks per node, >= 1.
        walk_length: L steps per walk, >= 1.
        alpha: Recency bias of the walk sampler per unit of t, >= 0 (0: uniform).
        pos_dim: Width of the anonymisation encoding, >= 1.
        spatial_bias: NeurTW's structural bias of the walk sampler, >= 0 (0: none).

    Raises:
        ValueError: On a setting out of range.
    """

    edge_msg: Tensor
    walk_encoder: WalkEncoder

    def __init__(
        self,
        num_nodes: int,
        msg: npt.NDArray[np.float32],
        *,
        num_walks: int,
        walk_length: int,
        alpha: float,
        pos_dim: int,
        spatial_bias: float = 0.0,
    ) -> None:
        super().__init__()
        if num_walks < 1 or walk_length < 1 or pos_dim < 1 or not alpha >= 0:
            raise ValueError(
                f"num_walks={num_walks}, walk_length={walk_length} and pos_dim={pos_dim} must "
                f"be >= 1 and alpha={alpha} >= 0"
            )
        if not spatial_bias >= 0:
            raise ValueError(f"spatial_bias={spatial_bias} must be >= 0 (0: no structural bias)")
        if msg.ndim != 2:
            raise ValueError(f"msg has shape {msg.shape}; edge features must be (E, F)")
        self.num_nodes = num_nodes
        self.num_walks = num_walks
        self.walk_length = walk_length
        self.alpha = float(alpha)
        self.spatial_bias = float(spatial_bias)
        # Zero edge features (featureless data, Benchtemp's 172 zero columns) are left out.
        self.use_edge_features = int(msg.shape[1]) > 0 and bool(np.any(msg))
        self.edge_width = int(msg.shape[1]) if self.use_edge_features else 0
        self.register_buffer(
            "edge_msg", torch.from_numpy(np.ascontiguousarray(msg)).float(), persistent=False
        )

    def _build_merge_layer(self, embedding_dim: int) -> None:
        """CAW's MergeLayer(D, D, D, 1): fc1 (2 D -> D), ReLU, fc2 (D -> 1), Xavier-normal."""
        self.fc1 = nn.Linear(2 * embedding_dim, embedding_dim)
        self.fc2 = nn.Linear(embedding_dim, 1)
        nn.init.xavier_normal_(self.fc1.weight)
        nn.init.xavier_normal_(self.fc2.weight)

    @property
    def neighbor_strategy(self) -> NeighborStrategy:
        """'uniform': the walks are random draws, so the trainer passes an rng."""
        return "uniform"

    # -- scoring -------------------------------------------------------------------------
    def _walks(
        self,
        node: I64,
        t: I64,
        first_eid: int,
        finder: NeighborFinder,
        rng: np.random.Generator,
    ) -> TemporalWalks:
        return sample_walks(
            finder, node, t, np.full(len(node), first_eid, dtype=np.int64),
            num_walks=self.num_walks, walk_length=self.walk_length, alpha=self.alpha, rng=rng,
            spatial_bias=self.spatial_bias,
        )  # fmt: skip

    def _edge_features(self, walks: TemporalWalks, rows: I64) -> Tensor:
        """Features of the event each position of the walks of sets `rows` was reached over.

        Shapes:
            -> (R, M, L + 1, F), zeros at position 0 (no event) and at null positions.
        """
        eid = torch.from_numpy(walks.eid[rows])
        real = torch.from_numpy(walks.mask[rows].copy())
        real[:, :, 0] = False  # the start node arrives over no event
        return self.edge_msg[eid] * real[..., None]

    def _steps(self, walks: TemporalWalks, rows: I64) -> tuple[Tensor, Tensor, Tensor | None]:
        """Per-step features of the walks of sets `rows`, their lengths, and time gaps or None.

        Shapes:
            -> (R M, L + 1, S), (R M,), (R M, L) or None.
        """
        raise NotImplementedError

    def _score(
        self, src_walks: TemporalWalks, src_rows: I64, dst_walks: TemporalWalks, dst_rows: I64
    ) -> Tensor:
        """Logits of pairs (src walk set src_rows[p], dst walk set dst_rows[p]), (P,)."""
        m = self.num_walks
        src_counts, dst_counts = hitting_counts(
            src_walks.node[src_rows], dst_walks.node[dst_rows]
        )  # fmt: skip
        z = []
        for walks, rows, counts in (
            (src_walks, src_rows, src_counts),
            (dst_walks, dst_rows, dst_counts),
        ):
            sets, set_of = np.unique(rows, return_inverse=True)  # a source serves C pairs
            steps, length, gap = self._steps(walks, sets)
            walk_PM = set_of.reshape(-1, 1) * m + np.arange(m)
            z.append(self.walk_encoder(counts, walk_PM, steps, length, gap))
        hidden = torch.relu(self.fc1(torch.cat(z, dim=1)))
        logits_P1: Tensor = self.fc2(hidden)
        return logits_P1[:, 0]

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

        Src's M walks are sampled once per query and shared by its C destinations; each
        destination gets its own walks. Pairs are encoded in chunks of about
        16,384 walks (the result does not depend on the chunking).

        Args:
            src: Sources, (B,).
            dst: Destinations, (B, C).
            t: Query times, (B,).
            first_eid: Event-id bound: no walk uses an event with this id or later.
            finder: Neighbour finder over the events the model may see.
            rng: Generator of the walks (None: `np.random.default_rng(first_eid)`).

        Returns:
            Logits, (B, C) (with autograd in train mode).

        Shapes:
            src, t: (B,); dst: (B, C) -> (B, C).
        """
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        t = np.asarray(t, dtype=np.int64)
        b, c = dst.shape
        rng = np.random.default_rng(first_eid) if rng is None else rng
        src_walks = self._walks(src, t, first_eid, finder, rng)
        dst_walks = self._walks(dst.ravel(), np.repeat(t, c), first_eid, finder, rng)
        pairs = b * c
        src_rows = np.repeat(np.arange(b), c)
        chunk = max(1, _WALKS_PER_CHUNK // (2 * self.num_walks))
        parts = [
            self._score(
                src_walks,
                src_rows[lo : lo + chunk],
                dst_walks,
                np.arange(lo, min(lo + chunk, pairs)),
            )
            for lo in range(0, pairs, chunk)  # one iteration per chunk of pairs
        ]
        return torch.cat(parts).reshape(b, c)


class CAWN(AnonymousWalkModel):
    """Causal Anonymous Walk Network link predictor (see the module docstring).

    Implements the pair-model calls of the trainer (`PAIR_MODEL_METHODS`) on
    `PairScoringModel`: it keeps no event state (the walks read the neighbour finder).

    Args:
        num_nodes: N.
        msg: Edge features of every event, (E, F) float32 (F may be 0).
        embedding_dim: D, time-encoding and output width.
        num_walks: M walks per node, >= 1.
        walk_length: L steps per walk, >= 1.
        alpha: Recency bias of the walk sampler per unit of t, >= 0 (0: uniform).
        pos_dim: Width of the anonymisation encoding, >= 1.
        walk_pool: 'sum' or 'attn'.
        num_heads: Heads of 'attn' pooling.
        dropout: Dropout.

    Raises:
        ValueError: On a setting out of range.
    """

    def __init__(
        self,
        num_nodes: int,
        msg: npt.NDArray[np.float32],
        *,
        embedding_dim: int = 100,
        num_walks: int = 32,
        walk_length: int = 2,
        alpha: float = 1e-5,
        pos_dim: int = 108,
        walk_pool: WalkPool = "sum",
        num_heads: int = 8,
        dropout: float = 0.1,
    ) -> None:
        if walk_pool not in ("sum", "attn"):
            raise ValueError(f"walk_pool={walk_pool!r} must be 'sum' or 'attn'")
        super().__init__(
            num_nodes, msg, num_walks=num_walks, walk_length=walk_length, alpha=alpha,
            pos_dim=pos_dim,
        )  # fmt: skip
        self.time_encoder = TimeEncoder(embedding_dim)
        self.walk_encoder = WalkEncoder(
            embedding_dim + self.edge_width, walk_length, pos_dim, embedding_dim,
            walk_pool=walk_pool, num_heads=num_heads, dropout=dropout,
        )  # fmt: skip
        self._build_merge_layer(embedding_dim)

    def _steps(self, walks: TemporalWalks, rows: I64) -> tuple[Tensor, Tensor, None]:
        """[phi(t_0 - t_i) || edge features] per step of the walks of sets `rows`, and lengths.

        Shapes:
            -> (R M, L + 1, S), (R M,), None (the LSTMs read no time gaps).
        """
        t = walks.t[rows]
        mask = walks.mask[rows]
        # Null steps are never read (the LSTMs stop at each walk's last real step); their
        # dt is set to 0 so they do not depend on the query time.
        dt = np.where(mask, t[:, :, :1] - t, 0).astype(np.float32)
        parts = [self.time_encoder(torch.from_numpy(dt))]
        if self.use_edge_features:
            parts.append(self._edge_features(walks, rows))
        steps = torch.cat(parts, dim=3)
        length = torch.from_numpy(mask.sum(axis=2))
        return steps.reshape(-1, *steps.shape[2:]), length.reshape(-1), None


def build_cawn(inputs: ModelInputs, **options: object) -> CAWN:
    """The registered `cawn`: `CAWN.from_inputs` with the defaults of the module docstring."""
    return CAWN.from_inputs(inputs, **options)


register_model(
    "cawn",
    build_cawn,
    description="CAWN (ICLR 2021, arXiv 2101.05974): causal anonymous walks, 32 walks of 2 "
    "steps, exp(alpha dt) sampling, mean-pooled bi-LSTM walk encodings; pair-scoring "
    "(ranked on the protocol's sampled candidates)",
    native_neighbor_strategy="uniform",
    scoring="pair",
    # Benchtemp's CAWN script: batches of 32, early stopping with tolerance 0.
    training={"benchtemp": {"train_batch_size": 32, "tolerance": 0.0}},
    in_default=False,  # hours per epoch and evaluation on a CPU: name it with --model
)
