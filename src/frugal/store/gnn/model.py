"""GraphSAGE with the mean aggregator, run on the blocks of a `NeighborSampler` batch.

Shape legend: S nodes a layer reads (src), T nodes it writes (dst), E edges, I input
channels, H hidden channels, O output channels.

References:
    Inductive Representation Learning on Large Graphs (GraphSAGE), NeurIPS 2017,
    arXiv 1706.02216, section 3.3 (the mean aggregator) and Algorithm 2.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from frugal.store.gnn.sampler import Block

__all__ = ["GraphSAGE", "SAGEConv"]


class SAGEConv(nn.Module):
    """One GraphSAGE layer, mean aggregator: h'_v = W_self h_v + W_neigh mean_{u in N(v)} h_u + b.

    This is DGL's `SAGEConv(aggregator_type="mean")` and PyG's `SAGEConv` (root weight on);
    a node without sampled neighbours aggregates zeros.

    Args:
        in_channels: I, width of the input rows.
        out_channels: O, width of the output rows.

    Shapes:
        x_SI: (S, I) rows of the src nodes, the T dst nodes first; src_E, dst_E: (E,) local
        ids; returns (T, O).
    """

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.lin_self = nn.Linear(in_channels, out_channels, bias=False)
        self.lin_neigh = nn.Linear(in_channels, out_channels, bias=True)

    def forward(self, x_SI: Tensor, src_E: Tensor, dst_E: Tensor, num_dst: int) -> Tensor:
        """Aggregate the neighbours of the first `num_dst` rows and combine with their own."""
        sum_TI = x_SI.new_zeros(num_dst, x_SI.shape[1]).index_add_(0, dst_E, x_SI[src_E])
        count_T = torch.bincount(dst_E, minlength=num_dst).clamp_(min=1).to(x_SI.dtype)
        mean_TI = sum_TI / count_T.unsqueeze(1)
        out: Tensor = self.lin_self(x_SI[:num_dst]) + self.lin_neigh(mean_TI)
        return out


class GraphSAGE(nn.Module):
    """A stack of `SAGEConv` layers with ReLU and dropout between them (no activation last).

    Defaults follow MLKV's DGL setup: 3 layers, 256 hidden channels.

    Args:
        in_channels: Width of the input rows (features and/or node embeddings), >= 1.
        out_channels: Number of classes, >= 1.
        hidden_channels: Width between layers, >= 1.
        num_layers: Layers, >= 1; must equal the sampler's number of fanouts.
        dropout: Dropout probability between layers, in [0, 1).

    Raises:
        ValueError: If a size is < 1 or dropout is outside [0, 1).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        hidden_channels: int = 256,
        num_layers: int = 3,
        dropout: float = 0.5,
    ) -> None:
        super().__init__()
        for name, value in (
            ("in_channels", in_channels),
            ("out_channels", out_channels),
            ("hidden_channels", hidden_channels),
            ("num_layers", num_layers),
        ):
            if value < 1:
                raise ValueError(f"{name}={value} must be >= 1")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout={dropout} must be in [0, 1)")
        widths = [in_channels] + [hidden_channels] * (num_layers - 1) + [out_channels]
        self.convs = nn.ModuleList(SAGEConv(a, b) for a, b in itertools.pairwise(widths))
        self.dropout = dropout

    @property
    def num_layers(self) -> int:
        """Number of `SAGEConv` layers."""
        return len(self.convs)

    def forward(self, x_SI: Tensor, blocks: Sequence[Block]) -> Tensor:
        """Logits of the last block's dst nodes (the seeds).

        Args:
            x_SI: Input rows of the batch's `n_id` (at least the first block's src nodes).
            blocks: One block per layer, input layer first.

        Returns:
            Logits (B, out_channels).

        Raises:
            ValueError: If the number of blocks is not `num_layers`.
        """
        if len(blocks) != len(self.convs):
            raise ValueError(
                f"{len(blocks)} blocks for a {len(self.convs)}-layer GraphSAGE; sample with "
                f"one fanout per layer (fanouts of length {len(self.convs)})"
            )
        h = x_SI
        for index, (conv, block) in enumerate(zip(self.convs, blocks, strict=True)):
            src_E = torch.from_numpy(block.src)
            dst_E = torch.from_numpy(block.dst)
            h = conv(h[: block.num_src], src_E, dst_E, block.num_dst)
            if index < len(self.convs) - 1:
                h = torch.relu(h)
                h = nn.functional.dropout(h, p=self.dropout, training=self.training)
        return h
