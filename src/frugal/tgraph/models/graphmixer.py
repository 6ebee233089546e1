"""GraphMixer: no memory, no attention; an MLP-Mixer over a node's K most recent links.

For a query (u, t), the link encoder takes u's K most recent events strictly before t, each a
token [e_j || phi(t - t_j)] with phi a fixed (not learned) cosine time encoding; a linear map
projects the tokens to C channels, `num_layers` MLP-Mixer layers mix them across tokens and
across channels, and the mean over the K tokens is the link encoding. The node encoder adds
u's own features to the mean of its recent neighbours' features; the embedding is
`output_layer([link encoding || node encoding])`. The link decoder is `TemporalGNN`'s MLP.

Shape legend: B queries, K tokens (neighbour slots), C channels, F edge-feature width,
T time-encoding width, D embedding width, E events.

Departures from DyGLib's `models/GraphMixer.py`, each exact or forced by frugal's inputs:

- Node encoder: frugal's graphs carry no node features (Benchtemp's and DyGLib's are zeros
  too), so u's features and the mean of its `time_gap` (2,000) most recent neighbours'
  features are both zero vectors and the node encoding is exactly 0. It is not computed:
  `output_layer` keeps DyGLib's (C + D) -> D weight shape and initialisation, and only its
  first C input columns are multiplied (the same result as concatenating the zeros).
- Channels: DyGLib sets C to the edge-feature width, which it pads to 172 on featureless
  data; here C = D (`embedding_dim`; 172 under `--protocol benchtemp`, where F is 172 too),
  so featureless data under the frugal protocol (F = 0) gets channels.
- Zero edge features (Benchtemp's padding) are left out of the projection's product; their
  weight columns stay in its shape and would get zero gradient anyway.
- Padding: DyGLib's padded slot reads edge row 0 (all zeros) and its time encoding is zeroed;
  frugal's edge ids start at 0, so both parts of a padded token are zeroed by the mask.
  A padded token then holds the projection's bias, and enters the token mixing and the mean
  over tokens, as in DyGLib.

References:
    Do We Really Need Complicated Model Architectures For Temporal Networks? (GraphMixer),
    ICLR 2023, arXiv 2302.11636 (section 3: link encoder, fixed time encoding, node
    encoder, link classifier). Implementation and defaults follow DyGLib
    (yule-BUAA/DyGLib, `models/GraphMixer.py`; Towards Better Dynamic Graph Learning: New
    Architecture and Unified Library, NeurIPS 2023, arXiv 2303.13047).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from frugal._typing import I64
from frugal.tgraph.models.blocks import TimeEncoder, gather_rows, unique_columns
from frugal.tgraph.models.components import EmbeddingModule, IdentityMessage, Prepared, _Plan
from frugal.tgraph.models.registry import ModelInputs, register_model
from frugal.tgraph.models.tgnn import TemporalGNN
from frugal.tgraph.neighbors import NeighborFinder, NeighborStrategy

__all__ = ["MixerEmbedding", "MixerLayer", "build_graphmixer"]


def _feed_forward(width: int, expansion: float, dropout: float) -> nn.Sequential:
    """Linear(width, int(expansion * width)) -> GELU -> dropout -> Linear back -> dropout."""
    hidden = int(expansion * width)
    return nn.Sequential(
        nn.Linear(width, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, width),
        nn.Dropout(dropout),
    )  # fmt: skip


class MixerLayer(nn.Module):
    """One MLP-Mixer layer: token mixing, then channel mixing, each pre-norm with a residual.

    x = x + FFN_K(LayerNorm_K(x^T))^T, then x = x + FFN_C(LayerNorm_C(x)), where FFN_K widens
    the K tokens by `token_expansion` and FFN_C the C channels by `channel_expansion` (GELU,
    dropout after each of its two linear maps, as DyGLib's `FeedForwardNet`).

    Args:
        num_tokens: K.
        num_channels: C.
        token_expansion: Hidden width of the token MLP as a multiple of K (DyGLib: 0.5).
        channel_expansion: Hidden width of the channel MLP as a multiple of C (DyGLib: 4.0).
        dropout: Dropout inside both MLPs.

    Raises:
        ValueError: If either hidden width rounds down to 0.

    Shapes:
        forward: x (B, K, C) -> (B, K, C).

    References:
        MLP-Mixer: An all-MLP Architecture for Vision, NeurIPS 2021, arXiv 2105.01601
        (section 2); GraphMixer, arXiv 2302.11636 (section 3.1).
    """

    def __init__(
        self,
        num_tokens: int,
        num_channels: int,
        *,
        token_expansion: float = 0.5,
        channel_expansion: float = 4.0,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        for name, width, factor in (
            ("token_expansion", num_tokens, token_expansion),
            ("channel_expansion", num_channels, channel_expansion),
        ):
            if int(factor * width) < 1:
                raise ValueError(
                    f"{name}={factor} x width {width} rounds to a hidden width of 0; "
                    f"raise {name} or the number of tokens / channels"
                )
        self.token_norm = nn.LayerNorm(num_tokens)
        self.token_mlp = _feed_forward(num_tokens, token_expansion, dropout)
        self.channel_norm = nn.LayerNorm(num_channels)
        self.channel_mlp = _feed_forward(num_channels, channel_expansion, dropout)

    def forward(self, x_BKC: Tensor) -> Tensor:
        """Mix across the tokens, then across the channels."""
        mixed_BCK = self.token_mlp(self.token_norm(x_BKC.transpose(1, 2)))
        x_BKC = x_BKC + mixed_BCK.transpose(1, 2)
        out: Tensor = x_BKC + self.channel_mlp(self.channel_norm(x_BKC))
        return out


class MixerEmbedding(EmbeddingModule):
    """GraphMixer's node embedding: MLP-Mixer link encoder plus (zero) node encoder.

    z(u, t) = W_out [mean_k Mixer(W_in [e_k || phi(t - t_k)]) || 0] + b_out over u's K most
    recent events before t (zero-padded on the left where u has fewer), with phi fixed.

    Args:
        embedding_dim: D, the output width (DyGLib: the node-feature width, 172).
        edge_dim: F, width of the edge features (may be 0).
        time_encoder: The fixed time encoder (T wide; DyGLib 100).
        num_neighbors: K, tokens per query (DyGLib: 20).
        num_channels: C, the mixer's width (DyGLib: the padded edge width, 172).
        num_layers: Mixer layers (DyGLib: 2).
        token_expansion: Token-MLP expansion (DyGLib: 0.5).
        channel_expansion: Channel-MLP expansion (DyGLib: 4.0).
        dropout: Dropout inside the mixer MLPs (DyGLib: 0.1).
        neighbor_strategy: 'recent' (DyGLib's for GraphMixer) or 'uniform'.
        use_dedup: Whether identical (node, t, bound) queries are embedded once.

    Raises:
        ValueError: If K, C or `num_layers` is < 1, or a mixer hidden width rounds to 0.

    Shapes:
        forward: node, t (B,) -> (B, D).

    References:
        Do We Really Need Complicated Model Architectures For Temporal Networks?, ICLR 2023,
        arXiv 2302.11636 (section 3.1, link encoder; section 3.2, node encoder).
    """

    neighbor_strategy: NeighborStrategy

    def __init__(
        self,
        embedding_dim: int,
        edge_dim: int,
        time_encoder: TimeEncoder,
        *,
        num_neighbors: int = 20,
        num_channels: int = 100,
        num_layers: int = 2,
        token_expansion: float = 0.5,
        channel_expansion: float = 4.0,
        dropout: float = 0.1,
        neighbor_strategy: NeighborStrategy = "recent",
        use_dedup: bool = True,
    ) -> None:
        super().__init__()
        if num_neighbors < 1 or num_channels < 1 or num_layers < 1:
            raise ValueError(
                f"num_neighbors={num_neighbors}, num_channels={num_channels} and "
                f"num_layers={num_layers} must each be >= 1"
            )
        self.embedding_dim = embedding_dim
        self.edge_dim = edge_dim
        self.num_neighbors = num_neighbors
        self.num_channels = num_channels
        self.neighbor_strategy = neighbor_strategy
        self.use_dedup = use_dedup
        self.time_encoder = time_encoder
        self.projection = nn.Linear(edge_dim + time_encoder.out_channels, num_channels)
        self.mixers = nn.ModuleList(
            MixerLayer(
                num_neighbors,
                num_channels,
                token_expansion=token_expansion,
                channel_expansion=channel_expansion,
                dropout=dropout,
            )
            for _ in range(num_layers)
        )
        # DyGLib's output layer reads [link encoding || node encoding]; the node encoding is
        # the D-wide zero vector here (see the module docstring), so only the first C input
        # columns are used, but the shape (and so the initialisation) is DyGLib's.
        self.output_layer = nn.Linear(num_channels + embedding_dim, embedding_dim)

    def prepare(
        self,
        node: I64,
        t: I64,
        max_eid: I64,
        finder: NeighborFinder,
        rng: np.random.Generator | None,
    ) -> Prepared:
        """Sample each distinct query's K neighbours (no tensors)."""
        inverse = None
        if self.use_dedup:  # identical (node, t, bound) queries give identical embeddings
            unique, inverse_M = unique_columns(np.stack([node, t, max_eid]))
            node, t, max_eid = unique[0], unique[1], unique[2]
            inverse = inverse_M.ravel()
        cutoff = finder.cutoff_before(t, max_eid)
        nb = finder.sample(node, cutoff, self.num_neighbors, strategy=self.neighbor_strategy,
                           rng=rng)  # fmt: skip
        plan = _Plan(layer=1, node=node, t=t, nbr=nb, self_plan=_Plan(layer=0, node=node, t=t))
        return Prepared(plan, inverse)

    def memory_nodes(self, prepared: Prepared | None) -> list[I64]:
        """None: GraphMixer reads no memory."""
        return []

    def tokens(
        self, prepared: Prepared, edge_msg_EF: Tensor | None
    ) -> tuple[Tensor | None, Tensor]:
        """The token inputs of the prepared (distinct) queries: edge features and phi(dt).

        Slot k of query b holds its k-th oldest of the K most recent events before t (the
        last slot is the most recent); padded slots are all zero in both parts.

        Returns:
            (edge features e (B, K, F), or None when they are all zero; phi(t - t_k) (B, K, T)).
        """
        nb = prepared.plan.nbr
        assert nb is not None  # prepare() always samples
        mask_BK1 = torch.from_numpy(nb.mask).unsqueeze(2)
        # Masked slots encode dt = 0 (one repeated value for the encoder's dedup), then zero.
        dt_BK = torch.from_numpy((prepared.plan.t[:, None] - nb.t) * nb.mask).float()
        phi_BKT = self.time_encoder(dt_BK) * mask_BK1
        e_BKF = None
        if edge_msg_EF is not None and self.edge_dim:
            e_BKF = gather_rows(edge_msg_EF, nb.eid) * mask_BK1
        return e_BKF, phi_BKT

    def forward(
        self,
        prepared: Prepared | None,
        node: I64,
        t: I64,
        memory_ND: Tensor,
        last_update_N: Tensor,
        edge_msg_EF: Tensor | None,
    ) -> Tensor:
        """Embeddings of the prepared queries, (B, D); `memory_ND` is not read."""
        assert prepared is not None  # prepare() always samples
        e_BKF, phi_BKT = self.tokens(prepared, edge_msg_EF)
        weight, bias = self.projection.weight, self.projection.bias
        if e_BKF is None:  # zero edge features add nothing: skip their columns
            x_BKC = F.linear(phi_BKT, weight[:, self.edge_dim :], bias)
        else:
            x_BKC = F.linear(torch.cat([e_BKF, phi_BKT], dim=2), weight, bias)
        for mixer in self.mixers:
            x_BKC = mixer(x_BKC)
        link_BC = x_BKC.mean(dim=1)
        out_BD = F.linear(link_BC, self.output_layer.weight[:, : self.num_channels],
                          self.output_layer.bias)  # fmt: skip
        return out_BD if prepared.inverse is None else gather_rows(out_BD, prepared.inverse)


def build_graphmixer(
    inputs: ModelInputs,
    *,
    num_neighbors: int | None = None,
    time_dim: int = 100,
    num_layers: int = 2,
    token_expansion: float = 0.5,
    channel_expansion: float = 4.0,
) -> TemporalGNN:
    """GraphMixer with DyGLib's defaults, as a memory-less `TemporalGNN`.

    Args:
        inputs: Sizes and shared settings (D = `embedding_dim` is the embedding width and the
            mixer's channels; dropout and neighbour sampler as given).
        num_neighbors: K, tokens per query; default 2 x `inputs.num_neighbors` (20 under
            both protocols: DyGLib's 20, as TGAT's 2 K).
        time_dim: T, width of the fixed time encoding (DyGLib: 100).
        num_layers: MLP-Mixer layers (DyGLib: 2).
        token_expansion: Token-MLP expansion (DyGLib: 0.5).
        channel_expansion: Channel-MLP expansion (DyGLib: 4.0).

    Returns:
        The model, initialised under the caller's torch seed.

    Raises:
        ValueError: If a size is < 1 or a mixer hidden width rounds to 0.

    References:
        Do We Really Need Complicated Model Architectures For Temporal Networks?, ICLR 2023,
        arXiv 2302.11636; DyGLib `models/GraphMixer.py` (arXiv 2303.13047).
    """
    d = inputs.embedding_dim
    k = 2 * inputs.num_neighbors if num_neighbors is None else num_neighbors
    # GraphMixer's time encoding is fixed (section 3.1): frequencies 10^(-linspace(0, 9, T)).
    mixer_time = TimeEncoder(time_dim, learnable=False)
    embedding = MixerEmbedding(
        d, int(inputs.msg.shape[1]), mixer_time, num_neighbors=k, num_channels=d,
        num_layers=num_layers, token_expansion=token_expansion,
        channel_expansion=channel_expansion, dropout=inputs.dropout,
        neighbor_strategy=inputs.neighbor_strategy,
    )  # fmt: skip
    # `TemporalGNN` takes its width D from its own time encoder, which only memory messages
    # read; without memory it is unused, so share the mixer's when the widths agree.
    model_time = mixer_time if time_dim == d else TimeEncoder(d, learnable=False)
    return TemporalGNN.from_inputs(
        inputs, time_encoder=model_time, embedding=embedding, memory_updater=None,
        message=IdentityMessage(),
    )  # fmt: skip


register_model(
    "graphmixer",
    build_graphmixer,
    description="GraphMixer: MLP-Mixer over the 2 K most recent links (arXiv 2302.11636)",
    native_neighbor_strategy="recent",
)
