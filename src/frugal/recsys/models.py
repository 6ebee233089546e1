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
    "SequenceAttention",
    "SequenceFeatures",
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


DENSE_MODELS: Registry[DenseModelFactory] = Registry(
    "recsys dense model", field="model", entry_point_group="frugal.recsys.models"
)
"""Every dense model `RecsysTrainConfig.model` may name."""


def register_dense_model(
    name: str, factory: DenseModelFactory, *, replace: bool = False
) -> DenseModelFactory:
    """Make `name` a valid `RecsysTrainConfig.model`.

    Registration is per process and the torchrun trainers are fresh processes: call this
    from a module named in `FRUGAL_PLUGINS`, or declare the factory as an entry point in group
    `frugal.recsys.models` (`frugal.registry`), which every process loads.

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

    With a width per feature (mixed-dimension embeddings), each feature narrower than the
    widest is first projected to the widest width E by its own learned linear map (no
    bias), so the dot interactions see one width: the MD embeddings of Ginart et al.

    Shapes:
        pooled_BFE: (B, F, E), or (B, sum of the widths) with a width per feature;
        dense_BD: (B, D) -> logits (B,).

    References:
        Deep Learning Recommendation Model for Personalization and Recommendation Systems,
        arXiv 1906.00091, section 2 (dot interaction of the bottom MLP output with the
        embeddings, upper triangle, concatenated with the bottom output).
        Mixed Dimension Embeddings with Application to Memory-Efficient Recommendation
        Systems, ISIT 2021, arXiv 1909.11810, section 3 (a projection per feature to the
        base dimension).
    """

    def __init__(
        self,
        num_features: int,
        embedding_dim: int | tuple[int, ...],
        dense_dim: int,
        hidden: tuple[int, ...],
    ) -> None:
        """Raises `ValueError` if a per-feature width tuple is not one per feature."""
        super().__init__()
        dims = (embedding_dim,) * num_features if isinstance(embedding_dim, int) else embedding_dim
        if len(dims) != num_features:
            raise ValueError(
                f"embedding_dim has {len(dims)} widths for {num_features} features; give one "
                "per feature"
            )
        width = max(dims)
        self.widths = tuple(dims)
        self.mixed = not isinstance(embedding_dim, int)
        self.projections = nn.ModuleList(
            [nn.Identity() if dim == width else nn.Linear(dim, width, bias=False) for dim in dims]
        )
        self.bottom = _mlp([max(dense_dim, 1), *hidden[-1:], width], last_activation=True)
        self.dense_dim = dense_dim
        vectors = num_features + 1
        self.register_buffer(
            "pairs", torch.triu_indices(vectors, vectors, offset=1), persistent=False
        )
        interactions = vectors * (vectors - 1) // 2
        self.top = _mlp([interactions + width, *hidden, 1], last_activation=False)

    def forward(self, pooled_BFE: Tensor, dense_BD: Tensor) -> Tensor:
        """Return the click logits."""
        if self.mixed:  # (B, sum of widths) -> each feature projected -> (B, F, E)
            features = torch.split(pooled_BFE, list(self.widths), dim=1)
            pooled_BFE = torch.stack(
                [project(f) for project, f in zip(self.projections, features, strict=True)],
                dim=1,
            )
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


class SequenceAttention(nn.Module):
    """DIN's activation unit: pools a sequence of embeddings by weights a query sets.

    Each item h_l of a sequence gets the weight w_l = MLP([h_l, q, h_l - q, h_l * q]) (PReLU
    hidden layers, a linear output), and the sequence becomes sum_l w_l h_l over its real
    items. As in DIN the weights are not normalised (no softmax), so the pooled vector keeps
    how strongly the sequence matches the query.

    Shapes:
        items_BLE: (B, L, E); mask_BL: (B, L) bool (False: padding); query_BE: (B, E) ->
        (B, E).

    References:
        Deep Interest Network for Click-Through Rate Prediction, KDD 2018, arXiv 1706.06978,
        section 4.3 and figure 2 (the local activation unit).
    """

    def __init__(self, embedding_dim: int, hidden: tuple[int, ...] = (36,)) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = 4 * embedding_dim
        for size in hidden:
            layers += [nn.Linear(width, size), nn.PReLU()]
            width = size
        layers.append(nn.Linear(width, 1))
        self.unit = nn.Sequential(*layers)

    def forward(self, items_BLE: Tensor, mask_BL: Tensor, query_BE: Tensor) -> Tensor:
        """Return the pooled sequences."""
        query_BLE = query_BE.unsqueeze(1).expand_as(items_BLE)
        joint = torch.cat(
            [items_BLE, query_BLE, items_BLE - query_BLE, items_BLE * query_BLE], dim=-1
        )
        weights_BL = self.unit(joint).squeeze(-1) * mask_BL.to(items_BLE.dtype)
        pooled_BE: Tensor = (weights_BL.unsqueeze(-1) * items_BLE).sum(dim=1)
        return pooled_BE


class SequenceFeatures(nn.Module):
    """A dense model whose sequence features are pooled by DIN attention first.

    Each sequence feature (a bag of ids kept in order, unpooled: the movies a user rated
    before) is pooled by its own `SequenceAttention` against a query: the pooled vector of
    the `target` feature (DIN's candidate item, e.g. the movie being rated), or a learned
    vector when there is none. The result takes the feature's place among the pooled ones,
    and the wrapped model runs on them as it would on pooled features.

    Shapes:
        features: per feature (B, E_f), None at the sequence features; sequences: per
        sequence feature ((B, L, E_f), mask (B, L)); dense_BD: (B, D) -> logits (B,).

    References:
        Deep Interest Network for Click-Through Rate Prediction, KDD 2018, arXiv 1706.06978.
    """

    def __init__(
        self,
        model: nn.Module,
        table_dims: tuple[int, ...],
        sequence_features: tuple[int, ...],
        target: int | None,
    ) -> None:
        """Wrap `model` (built for every feature pooled).

        Raises:
            ValueError: If a feature index is out of range, the target is a sequence
                feature, or a sequence feature's width differs from the target's.
        """
        super().__init__()
        num_features = len(table_dims)
        if not sequence_features or any(not 0 <= f < num_features for f in sequence_features):
            raise ValueError(
                f"sequence_features={list(sequence_features)} must be feature indices in "
                f"[0, {num_features})"
            )
        if target is not None and (not 0 <= target < num_features or target in sequence_features):
            raise ValueError(
                f"sequence target {target} must be a pooled feature, in [0, {num_features}) "
                f"and not one of the sequence features {list(sequence_features)}"
            )
        for f in sequence_features:
            if target is not None and table_dims[f] != table_dims[target]:
                raise ValueError(
                    f"sequence feature {f} has width {table_dims[f]}, its target {target} "
                    f"{table_dims[target]}: attention compares them, give them one width"
                )
        self.model = model
        self.sequence_features = tuple(sequence_features)
        self.target = target
        self.one_width = len(set(table_dims)) == 1
        self.attention = nn.ModuleList(
            [SequenceAttention(table_dims[f]) for f in sequence_features]
        )
        self.queries = nn.ParameterList(
            [nn.Parameter(0.1 * torch.randn(table_dims[f])) for f in sequence_features]
            if target is None
            else []
        )

    def forward(
        self,
        features: list[Tensor | None],
        sequences: list[tuple[Tensor, Tensor]],
        dense_BD: Tensor,
    ) -> Tensor:
        """Return the click logits."""
        filled = list(features)
        for i, f in enumerate(self.sequence_features):
            items_BLE, mask_BL = sequences[i]
            if self.target is None:
                query_BE = self.queries[i].expand(items_BLE.shape[0], -1)
            else:
                query = features[self.target]
                assert query is not None  # a pooled feature (checked in __init__)
                query_BE = query
            filled[f] = self.attention[i](items_BLE, mask_BL, query_BE)
        pooled = [vector for vector in filled if vector is not None]
        if len(pooled) != len(filled):
            raise ValueError("a feature is neither pooled nor a sequence feature")
        inputs = torch.stack(pooled, dim=1) if self.one_width else torch.cat(pooled, dim=1)
        logits: Tensor = self.model(inputs, dense_BD)
        return logits


def build_model(
    name: ModelName,
    num_features: int,
    embedding_dim: int | tuple[int, ...],
    dense_dim: int,
    hidden: tuple[int, ...] = (64, 32),
    *,
    sequence_features: tuple[int, ...] = (),
    sequence_target: int | None = None,
) -> nn.Module:
    """Build the dense model registered as `name` ("dlrm", "mlp", ...).

    `embedding_dim` is one width for every feature, or a tuple of one per feature (then the
    pooled input is `(B, sum of the widths)`; dlrm projects it to one width). With
    `sequence_features`
    (feature indices) the model is wrapped in `SequenceFeatures`, which pools them by DIN
    attention against the pooled `sequence_target` feature (or a learned query).

    Raises:
        ValueError: If the name is not registered (the message lists the choices), or the
            model cannot take these widths or sequence features.
    """
    model = DENSE_MODELS.get(name)(num_features, embedding_dim, dense_dim, hidden)
    if not sequence_features:
        return model
    dims = (embedding_dim,) * num_features if isinstance(embedding_dim, int) else embedding_dim
    return SequenceFeatures(model, tuple(dims), sequence_features, sequence_target)


register_dense_model("dlrm", DLRM)
register_dense_model("mlp", WideDeepMLP)
