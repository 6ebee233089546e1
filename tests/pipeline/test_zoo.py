"""Pipeline models come from a registry: a user's model plugs in with one `register_model`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from frugal.pipeline.models import TinyGPTConfig
from frugal.pipeline.train import PipelineTrainConfig, make_layout, train_local
from frugal.pipeline.zoo import (
    MODELS,
    ModelSpec,
    boundary_shape,
    build_model,
    build_model_stages,
    byte_windows,
    model_names,
    register_model,
)

# A user's model, written as it would be outside frugal: a byte-level residual MLP whose
# weights are read from a file (built here in tmp_path; nothing is downloaded).
# M micro-batch, T tokens, H hidden, V vocabulary (256 bytes).
CONTEXT, HIDDEN, NUM_BLOCKS = 8, 16, 2


class ByteMLP(nn.Module):
    """Embedding, `NUM_BLOCKS` residual MLP blocks, a head; no attention (each token alone)."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(256, HIDDEN)
        self.blocks = nn.ModuleList(nn.Linear(HIDDEN, HIDDEN) for _ in range(NUM_BLOCKS))
        self.head = nn.Linear(HIDDEN, 256)

    def forward(self, tokens_MT: Tensor) -> Tensor:
        x_MTH = self.tok(tokens_MT)
        for block in self.blocks:
            x_MTH = x_MTH + torch.tanh(block(x_MTH))
        logits: Tensor = self.head(x_MTH)
        return logits


class ByteMLPStage(nn.Module):
    """Blocks `[lo, lo + n)` of a ByteMLP, with the embedding first and the head last."""

    def __init__(self, model: ByteMLP, stage: int, layers: tuple[int, ...]) -> None:
        super().__init__()
        self.stage, self.is_first, self.is_last = stage, stage == 0, stage == len(layers) - 1
        lo = sum(layers[:stage])
        self.blocks = nn.ModuleList(model.blocks[lo : lo + layers[stage]])  # blocks.<local i>
        self.tok = model.tok if self.is_first else None
        self.head = model.head if self.is_last else None

    def forward(self, x: Tensor) -> Tensor:
        if self.tok is not None:
            x = self.tok(x)
        for block in self.blocks:
            x = x + torch.tanh(block(x))
        return self.head(x) if self.head is not None else x


def _byte_mlp_spec(weights: Path) -> ModelSpec:
    def build(config: PipelineTrainConfig) -> nn.Module:
        model = ByteMLP()
        model.load_state_dict(torch.load(weights, weights_only=True))
        return model

    def build_stages(
        config: PipelineTrainConfig, model: nn.Module, layers: tuple[int, ...]
    ) -> list[ByteMLPStage]:
        assert isinstance(model, ByteMLP)
        return [ByteMLPStage(model, s, layers) for s in range(len(layers))]

    return ModelSpec(
        name="byte-mlp",
        description="a user's byte-level residual MLP, weights from a file",
        num_layers=lambda config: NUM_BLOCKS,
        context=lambda config: CONTEXT,
        hidden=lambda config: HIDDEN,
        build=build,
        build_stages=build_stages,
        load_windows=lambda config: byte_windows(config, CONTEXT),
        preset=lambda: {"model": "byte-mlp", "num_stages": 2, "steps": 3},
    )


@pytest.fixture
def byte_mlp(tmp_path: Path) -> Iterator[Path]:
    torch.manual_seed(0)
    weights = tmp_path / "byte_mlp.pt"
    torch.save(ByteMLP().state_dict(), weights)
    register_model(_byte_mlp_spec(weights))
    try:
        yield weights
    finally:
        MODELS.unregister("byte-mlp")


def test_the_built_in_models_are_registered() -> None:
    assert model_names()[:2] == ("tiny-gpt", "smollm2-135m")
    tiny = PipelineTrainConfig(gpt=TinyGPTConfig(context=16, hidden=32, num_layers=4))
    assert boundary_shape(tiny) == (8, 16, 32)  # (micro_batch_size, gpt.context, gpt.hidden)


def test_an_unknown_model_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match=r"model='gpt-5' .* choose one of tiny-gpt, smollm2"):
        PipelineTrainConfig(model="gpt-5")
    with pytest.raises(ValueError, match="already registered"):
        register_model(replace(MODELS.get("tiny-gpt"), description="again"))


def test_a_registered_model_trains_through_the_pipeline(byte_mlp: Path) -> None:
    torch.set_num_threads(1)
    config = PipelineTrainConfig(
        model="byte-mlp",
        num_stages=2,
        num_train=16,
        num_eval=8,
        micro_batch_size=4,
        num_microbatches=2,
        steps=4,
        learning_rate=1e-2,
    )
    assert make_layout(config, 2).layers == (1, 1)  # even split of the spec's 2 blocks
    assert boundary_shape(config) == (4, CONTEXT, HIDDEN)
    model = build_model(config)
    assert torch.equal(model.state_dict()["head.weight"], torch.load(byte_mlp)["head.weight"])
    stages = build_model_stages(config, model, (1, 1))
    assert [type(s) for s in stages] == [ByteMLPStage, ByteMLPStage]
    result = train_local(config)
    # Byte windows of 8 tokens: the loss starts near ln 256 = 5.55 nats and falls.
    assert len(result.losses) == 4
    assert result.losses[-1] < result.losses[0]
    assert result.eval_loss < 5.6


def test_the_cli_accepts_a_registered_model(byte_mlp: Path) -> None:
    from frugal.cli.main import build_parser

    args = build_parser().parse_args(["pipeline", "train", "--model", "byte-mlp"])
    assert args.model == "byte-mlp"
