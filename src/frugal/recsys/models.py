"""Dense parts of the recommenders; the embedding tables live on the parameter servers.

A model gets the pooled embeddings of every feature (pooled on the worker, Persia's
embedding-worker role) and the dense features, and returns one click logit per sample.

- `DLRM`: bottom MLP on the dense features, pairwise dot interaction of the F + 1 vectors,
  top MLP (Naumov et al., "Deep Learning Recommendation Model for Personalization and
  Recommendation Systems", arXiv 1906.00091, section 2).
- `WideDeepMLP`: a wide (linear) part on the concatenated inputs plus a deep MLP (Cheng et
  al., "Wide & Deep Learning for Recommender Systems", DLRS 2016, arXiv 1606.07792).

Both register themselves in `DENSE_MODELS` (`RecsysTrainConfig.model` names one);
`register_dense_model` adds another.

Shape legend: B samples, F features, E embedding_dim, D dense features.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor, nn

from frugal.registry import Registry

__all__ = [
    "DENSE_MODELS",
    "DLRM",
    "DenseModelFactory",
    "ModelName",
    "WideDeepMLP",
    "build_model",
    "register_dense_model",
]

ModelName = str
"""A name in `DENSE_MODELS` ("dlrm", "mlp", or one added by `register_dense_model`)."""


class DenseModelFactory(Protocol):
    """Builds a dense model: pooled embeddings and `(B, D)` dense in, `(B,)` out.

    The pooled embeddings are `(B, F, E)` when every feature has width E (`embedding_dim` an
    int), else `(B, sum of the widths)` (`embedding_dim` the tuple of per-feature widths).
    """

    def __call__(
        self,
        num_features: int,
        embedding_dim: int | tuple[int, ...],
        dense_dim: int,
        hidden: tuple[int, ...],
    ) -> nn.Module:
        """The model for F features of width E (or per-feature widths), D dense, MLP `hidden`."""
        ...


DENSE_MODELS: Registry[DenseModelFactory] = Registry("recsys dense model", field="model")
"""Every dense model `RecsysTrainConfig.model` may name."""


def register_dense_model(
    name: str, factory: DenseModelFactory, *, replace: bool = False
) -> DenseModelFactory:
    """Make `name` a valid `RecsysTrainConfig.model`.

    Registration is per process; the torchrun trainers are fresh processes and see the
    models registered on importing frugal.

    Args:
        name: The model's name, as users write it in a config.
        factory: Builds the model; called as `factory(num_features, embedding_dim,
            dense_dim, hidden)`, after `torch.manual_seed(config.seed)`.
        replace: Whether to replace a model registered under the same name.

    Returns:
        `factory`.

    Raises:
        ValueError: If `name` is taken and `replace` is False.
    """
    return DENSE_MODELS.register(name, factory, replace=replace)


def _mlp(sizes: list[int], *, last_activation: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_activation:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """DLRM-style model: bottom MLP, dot interaction, top MLP.

    Shapes:
        pooled_BFE: (B, F, E); dense_BD: (B, D) -> logits (B,).

    References:
        Deep Learning Recommendation Model for Personalization and Recommendation Systems,
        arXiv 1906.00091, section 2 (dot interaction of the bottom MLP output with the
        embeddings, upper triangle, concatenated with the bottom output).
    """

    def __init__(
        self,
        num_features: int,
        embedding_dim: int | tuple[int, ...],
        dense_dim: int,
        hidden: tuple[int, ...],
    ) -> None:
        """Raises `ValueError` for per-feature widths: dot interactions need one width."""
        super().__init__()
        if not isinstance(embedding_dim, int):
            raise ValueError(
                f"the dlrm model's dot interactions need one embedding_dim for every table, "
                f"not {list(embedding_dim)}; give one embedding_dim, or choose model='mlp' "
                "(wide & deep), which takes a width per table"
            )
        self.bottom = _mlp([max(dense_dim, 1), *hidden[-1:], embedding_dim], last_activation=True)
        self.dense_dim = dense_dim
        vectors = num_features + 1
        self.register_buffer(
            "pairs", torch.triu_indices(vectors, vectors, offset=1), persistent=False
        )
        interactions = vectors * (vectors - 1) // 2
        self.top = _mlp([interactions + embedding_dim, *hidden, 1], last_activation=False)

    def forward(self, pooled_BFE: Tensor, dense_BD: Tensor) -> Tensor:
        """Return the click logits."""
        if self.dense_dim == 0:
            dense_BD = torch.zeros(pooled_BFE.shape[0], 1)
        bottom_BE = self.bottom(dense_BD)
        vectors_BVE = torch.cat([bottom_BE.unsqueeze(1), pooled_BFE], dim=1)
        dots_BVV = torch.bmm(vectors_BVE, vectors_BVE.transpose(1, 2))
        pairs: Tensor = self.pairs  # type: ignore[assignment]  # registered buffer
        dots_BP = dots_BVV[:, pairs[0], pairs[1]]
        logits_B1: Tensor = self.top(torch.cat([bottom_BE, dots_BP], dim=1))
        return logits_B1.squeeze(1)


class WideDeepMLP(nn.Module):
    """Wide & deep MLP over the concatenated pooled embeddings and dense features.

    Shapes:
        pooled_BFE: (B, F, E), or (B, sum of the widths) with a width per feature;
        dense_BD: (B, D) -> logits (B,).

    References:
        Wide & Deep Learning for Recommender Systems, DLRS 2016, arXiv 1606.07792, section 3.
    """

    def __init__(
        self,
        num_features: int,
        embedding_dim: int | tuple[int, ...],
        dense_dim: int,
        hidden: tuple[int, ...],
    ) -> None:
        super().__init__()
        embedding_width = (
            num_features * embedding_dim if isinstance(embedding_dim, int) else sum(embedding_dim)
        )
        width = embedding_width + dense_dim
        self.wide = nn.Linear(width, 1)
        self.deep = _mlp([width, *hidden, 1], last_activation=False)

    def forward(self, pooled_BFE: Tensor, dense_BD: Tensor) -> Tensor:
        """Return the click logits."""
        x_BW = torch.cat([pooled_BFE.flatten(1), dense_BD], dim=1)
        logits_B1: Tensor = self.wide(x_BW) + self.deep(x_BW)
        return logits_B1.squeeze(1)


def build_model(
    name: ModelName,
    num_features: int,
    embedding_dim: int | tuple[int, ...],
    dense_dim: int,
    hidden: tuple[int, ...] = (64, 32),
) -> nn.Module:
    """Build the dense model registered as `name` ("dlrm", "mlp", ...).

    `embedding_dim` is one width for every feature, or a tuple of one per feature (then the
    pooled input is `(B, sum of the widths)`; dlrm refuses it).

    Raises:
        ValueError: If the name is not registered (the message lists the choices), or the
            model cannot take these widths.
    """
    return DENSE_MODELS.get(name)(num_features, embedding_dim, dense_dim, hidden)


register_dense_model("dlrm", DLRM)
register_dense_model("mlp", WideDeepMLP)
