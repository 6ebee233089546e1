"""Dense models: output shapes, the DLRM interaction size, gradients reaching the inputs."""

from __future__ import annotations

import pytest
import torch

from frugal.recsys.models import DLRM, WideDeepMLP, build_model


@pytest.mark.parametrize("name", ["dlrm", "mlp"])
def test_models_map_pooled_and_dense_to_one_logit(name: str) -> None:
    torch.manual_seed(0)
    model = build_model(name, num_features=5, embedding_dim=8, dense_dim=3)
    pooled = torch.randn(4, 5, 8, requires_grad=True)
    logits = model(pooled, torch.randn(4, 3))
    assert logits.shape == (4,)
    logits.sum().backward()
    assert pooled.grad is not None and pooled.grad.abs().sum() > 0


def test_dlrm_interaction_uses_upper_triangle_pairs() -> None:
    model = DLRM(num_features=5, embedding_dim=8, dense_dim=3, hidden=(16,))
    # 6 vectors (bottom + 5) -> 15 dot products, plus the 8-wide bottom output
    first = model.top[0]
    assert isinstance(first, torch.nn.Linear) and first.in_features == 15 + 8


def test_dlrm_without_dense_features() -> None:
    model = DLRM(num_features=2, embedding_dim=4, dense_dim=0, hidden=(8,))
    assert model(torch.randn(3, 2, 4), torch.zeros(3, 0)).shape == (3,)


def test_wide_deep_width() -> None:
    model = WideDeepMLP(num_features=2, embedding_dim=4, dense_dim=3, hidden=(8,))
    assert model.wide.in_features == 11


def test_unknown_model_is_rejected() -> None:
    with pytest.raises(ValueError, match="model='gbdt'"):
        build_model("gbdt", 1, 1, 1)


class _LinearOnPooled(torch.nn.Module):
    """A user's dense model: one linear layer on the flattened pooled embeddings."""

    def __init__(
        self, num_features: int, embedding_dim: int, dense_dim: int, hidden: tuple[int, ...]
    ) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(num_features * embedding_dim + dense_dim, 1)

    def forward(self, pooled_BFE: torch.Tensor, dense_BD: torch.Tensor) -> torch.Tensor:
        x = torch.cat([pooled_BFE.flatten(1), dense_BD], dim=1)
        out: torch.Tensor = self.linear(x).squeeze(1)
        return out


def test_a_registered_dense_model_is_built_by_name() -> None:
    from frugal.recsys import RecsysTrainConfig
    from frugal.recsys.models import DENSE_MODELS, register_dense_model

    register_dense_model("linear", _LinearOnPooled)
    try:
        assert RecsysTrainConfig(model="linear").model == "linear"
        model = build_model("linear", num_features=5, embedding_dim=8, dense_dim=3)
        assert model.linear.in_features == 43  # 5 x 8 + 3
        assert model(torch.randn(4, 5, 8), torch.randn(4, 3)).shape == (4,)
    finally:
        DENSE_MODELS.unregister("linear")
    with pytest.raises(ValueError, match=r"model='linear' is not a registered .* dlrm, mlp"):
        RecsysTrainConfig(model="linear")
