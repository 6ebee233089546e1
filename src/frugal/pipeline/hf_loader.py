"""Load a Hugging Face-format causal LM from a local folder into `frugal.pipeline.llama.Llama`.

The folder is what `save_pretrained` writes: `config.json`, the weights as `*.safetensors`
(one file, or shards listed by `model.safetensors.index.json`) and the fast tokenizer's
`tokenizer.json`. Weights are read with `safetensors` (any stored dtype -> float32) and mapped
from Hugging Face's names to ours; Hugging Face stores q/k rows in the rotate-half layout our
`Llama` uses, so no permutation is needed (unlike GGUF). The tokenizer is read with
`tokenizers`. Nothing is downloaded.

Supported architectures (`config.json`'s `architectures`), each an `HFFamily` entry of
`HF_ARCHITECTURES`: `LlamaForCausalLM` (Llama 2/3, SmolLM/SmolLM2, TinyLlama, ...) and
`Qwen2ForCausalLM` (Qwen2/2.5: q/k/v biases) load into `Llama`; `GPT2LMHeadModel` (GPT-2,
DistilGPT2) loads into `TinyGPT` (its Conv1D weights transposed, the tanh GELU, the tied head).
RoPE scaling, MLP biases and other activations are refused by name.

References:
    LLaMA: Open and Efficient Foundation Language Models, arXiv 2302.13971. Qwen2 Technical
    Report, arXiv 2407.10671 (q/k/v biases). Language Models are Unsupervised Multitask
    Learners (GPT-2, Radford et al., 2019).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from frugal import FrugalError
from frugal.pipeline.llama import Llama, LlamaConfig, build_llama_stages
from frugal.pipeline.models import PipelineStage, TinyGPT, TinyGPTConfig, build_stages

__all__ = [
    "HF_ARCHITECTURES",
    "HFFamily",
    "HFModel",
    "HFModelError",
    "ModelShape",
    "load_hf_model",
    "read_hf_config",
    "read_hf_model",
]

ModelShape = LlamaConfig | TinyGPTConfig
"""The shape of a model a Hugging Face folder loads into."""

_LLAMA_BLOCK = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "q_proj.weight",
    "self_attn.k_proj.weight": "k_proj.weight",
    "self_attn.v_proj.weight": "v_proj.weight",
    "self_attn.o_proj.weight": "o_proj.weight",
    "post_attention_layernorm.weight": "mlp_norm.weight",
    "mlp.gate_proj.weight": "gate_proj.weight",
    "mlp.up_proj.weight": "up_proj.weight",
    "mlp.down_proj.weight": "down_proj.weight",
}
_LLAMA_BIAS = {f"self_attn.{p}_proj.bias": f"{p}_proj.bias" for p in "qkv"}
_GPT2_BLOCK = {
    "ln_1": "ln1",
    "attn.c_attn": "qkv",
    "attn.c_proj": "proj",
    "ln_2": "ln2",
    "mlp.c_fc": "fc",
    "mlp.c_proj": "out",
}
_GPT2_CONV1D = ("qkv.weight", "proj.weight", "fc.weight", "out.weight")  # stored (in, out)
_GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}


class HFModelError(FrugalError):
    """The model folder is not a causal LM this loader can run (names the file and the fix)."""


@dataclass(frozen=True, slots=True)
class HFModel:
    """What a Hugging Face model folder holds, in our names."""

    config: ModelShape
    """Model shape from `config.json` (a `TinyGPTConfig`'s context is the model's maximum)."""
    state_dict: dict[str, Tensor]
    """Float32 weights keyed like the family's model's `state_dict()`."""
    tokenizer: Any
    """The folder's `tokenizers.Tokenizer` (from `tokenizer.json`)."""
    architecture: str
    """`config.json`'s architecture, e.g. "LlamaForCausalLM"."""
    stored_dtypes: dict[str, str]
    """Hugging Face tensor name -> its stored dtype (e.g. "torch.bfloat16")."""

    @property
    def family(self) -> HFFamily:
        """How this architecture maps onto a frugal model."""
        return HF_ARCHITECTURES[self.architecture]


def _read_config(folder: Path) -> dict[str, Any]:
    if not folder.is_dir():
        raise HFModelError(
            f"{folder}: no such model folder; give the folder save_pretrained wrote "
            "(config.json, *.safetensors, tokenizer.json)"
        )
    path = folder / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HFModelError(
            f"{folder}: no config.json; give the folder save_pretrained wrote"
        ) from None
    except (OSError, ValueError) as exc:
        raise HFModelError(f"{path}: not a readable JSON file ({exc})") from None
    if not isinstance(config, dict):
        raise HFModelError(f"{path}: holds a {type(config).__name__}, not a JSON object")
    return config


def _need(config: dict[str, Any], key: str, path: Path) -> Any:
    if key not in config:
        raise HFModelError(f"{path}: no {key!r}; the file is not a complete model config")
    return config[key]


def _llama_shape(config: dict[str, Any], path: Path, *, attention_bias: bool) -> LlamaConfig:
    """Our `LlamaConfig` for a Llama/Qwen2 `config.json`, or an error naming the key."""
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise HFModelError(f"{path}: hidden_act={act!r}; only 'silu' (SwiGLU) is supported")
    scaling = config.get("rope_scaling")
    if scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
        raise HFModelError(
            f"{path}: rope_scaling={scaling!r} is not supported (only unscaled RoPE); use a "
            "model without RoPE scaling"
        )
    if config.get("mlp_bias"):
        raise HFModelError(f"{path}: mlp_bias=true is not supported (SwiGLU without biases)")
    hidden = int(_need(config, "hidden_size", path))
    num_heads = int(_need(config, "num_attention_heads", path))
    head_dim = config.get("head_dim")
    if head_dim is not None and num_heads * int(head_dim) != hidden:
        raise HFModelError(
            f"{path}: head_dim={head_dim} x num_attention_heads={num_heads} != hidden_size="
            f"{hidden}; only head_dim = hidden_size / num_attention_heads is supported"
        )
    return LlamaConfig(
        vocab_size=int(_need(config, "vocab_size", path)),
        hidden=hidden,
        intermediate=int(_need(config, "intermediate_size", path)),
        num_layers=int(_need(config, "num_hidden_layers", path)),
        num_heads=num_heads,
        num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
        rope_theta=float(config.get("rope_theta", 10000.0)),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        max_context=int(config.get("max_position_embeddings", 2048)),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        attention_bias=attention_bias or bool(config.get("attention_bias")),
    )


def _gpt2_shape(config: dict[str, Any], path: Path) -> TinyGPTConfig:
    """Our `TinyGPTConfig` for a GPT-2 `config.json` (context = n_positions, the maximum)."""
    act = config.get("activation_function", "gelu_new")
    if act not in _GPT2_ACTIVATIONS:
        raise HFModelError(
            f"{path}: activation_function={act!r}; supported: {', '.join(_GPT2_ACTIVATIONS)}"
        )
    hidden = int(_need(config, "n_embd", path))
    inner = config.get("n_inner")
    for key, value, wanted in (
        ("n_inner", inner, 4 * hidden),
        ("scale_attn_weights", config.get("scale_attn_weights", True), True),
        ("scale_attn_by_inverse_layer_idx", config.get("scale_attn_by_inverse_layer_idx"), False),
        ("reorder_and_upcast_attn", config.get("reorder_and_upcast_attn"), False),
    ):
        if value not in (None, wanted):
            raise HFModelError(f"{path}: {key}={value!r} is not supported (only {wanted!r})")
    return TinyGPTConfig(
        context=int(config.get("n_positions") or _need(config, "n_ctx", path)),
        hidden=hidden,
        num_heads=int(_need(config, "n_head", path)),
        num_layers=int(_need(config, "n_layer", path)),
        vocab_size=int(_need(config, "vocab_size", path)),
        activation=_GPT2_ACTIVATIONS[act],  # type: ignore[arg-type]
        layer_norm_eps=float(config.get("layer_norm_epsilon", 1e-5)),
        tie_embeddings=bool(config.get("tie_word_embeddings", True)),
        head_bias=False,
    )


def _llama_names(shape: ModelShape) -> dict[str, str]:
    assert isinstance(shape, LlamaConfig)
    names = {"model.embed_tokens.weight": "tok.weight", "model.norm.weight": "norm.weight"}
    if not shape.tie_embeddings:
        names["lm_head.weight"] = "head.weight"
    block = _LLAMA_BLOCK | (_LLAMA_BIAS if shape.attention_bias else {})
    for i in range(shape.num_layers):
        for theirs, ours in block.items():
            names[f"model.layers.{i}.{theirs}"] = f"blocks.{i}.{ours}"
    return names


def _gpt2_names(shape: ModelShape) -> dict[str, str]:
    names = {"wte.weight": "tok.weight", "wpe.weight": "pos"}
    names |= {f"ln_f.{kind}": f"ln_f.{kind}" for kind in ("weight", "bias")}
    if not shape.tie_embeddings:
        names["lm_head.weight"] = "head.weight"
    for i in range(shape.num_layers):
        for theirs, ours in _GPT2_BLOCK.items():
            for kind in ("weight", "bias"):
                names[f"h.{i}.{theirs}.{kind}"] = f"blocks.{i}.{ours}.{kind}"
    return names


def _gpt2_convert(ours: str, tensor: Tensor) -> Tensor:
    """GPT-2's Conv1D stores (in, out); nn.Linear holds (out, in)."""
    return tensor.t().contiguous() if ours.endswith(_GPT2_CONV1D) else tensor


def _gpt2_context(
    shape: ModelShape, state: dict[str, Tensor], context: int
) -> tuple[ModelShape, dict[str, Tensor]]:
    """The learned positions of the first `context` tokens (GPT-2 keeps n_positions)."""
    assert isinstance(shape, TinyGPTConfig)
    return replace(shape, context=context), state | {"pos": state["pos"][:context]}


@dataclass(frozen=True, slots=True)
class HFFamily:
    """How one Hugging Face architecture maps onto a frugal model (an `HF_ARCHITECTURES` entry).

    Adding an architecture is one entry: read its config.json into a shape, name its tensors
    in ours, and say which model class holds them.
    """

    examples: str
    """Models of this family, for error messages and docs."""
    read_shape: Callable[[dict[str, Any], Path], ModelShape]
    """config.json (parsed) -> the model shape; raises `HFModelError` naming a bad key."""
    weight_names: Callable[[ModelShape], dict[str, str]]
    """Hugging Face tensor name -> ours, for every tensor the shape needs."""
    model_class: type[Llama] | type[TinyGPT]
    """The frugal model (`cls(shape, seed=None)`, `cls.load_weights(shape, state)`)."""
    build_stages: Callable[[Any, tuple[int, ...], bool], Sequence[PipelineStage]]
    """(model, blocks per stage, use_recompute) -> its pipeline stages."""
    convert: Callable[[str, Tensor], Tensor] = lambda ours, tensor: tensor
    """(our name, stored tensor) -> the tensor our model holds (e.g. a transpose)."""
    strip_prefix: str = ""
    """A prefix some checkpoints put before every name (GPT-2's "transformer.")."""
    ignored_suffixes: tuple[str, ...] = ()
    """Stored buffers that are not weights (skipped)."""
    with_context: Callable[
        [ModelShape, dict[str, Tensor], int], tuple[ModelShape, dict[str, Tensor]]
    ] = lambda shape, state, context: (shape, state)
    """The shape and weights of a model trained on `context`-token windows."""

    def build(self, shape: ModelShape, state: dict[str, Tensor]) -> nn.Module:
        """A model of `shape` holding copies of `state`."""
        return self.model_class.load_weights(shape, state)

    def param_shapes(self, shape: ModelShape) -> dict[str, tuple[int, ...]]:
        """Parameter shapes of a model of `shape`, by name (built on the meta device)."""
        with torch.device("meta"):
            model = self.model_class(shape, seed=None)  # type: ignore[arg-type]
        return {name: tuple(p.shape) for name, p in model.state_dict().items()}


def _llama_family(examples: str, *, attention_bias: bool) -> HFFamily:
    """A Llama-shaped architecture (RMSNorm, RoPE, GQA, SwiGLU) that loads into `Llama`."""
    return HFFamily(
        examples=examples,
        read_shape=lambda config, path: _llama_shape(config, path, attention_bias=attention_bias),
        weight_names=_llama_names,
        model_class=Llama,
        build_stages=build_llama_stages,
        ignored_suffixes=(".rotary_emb.inv_freq",),
    )


HF_ARCHITECTURES: Mapping[str, HFFamily] = {
    "LlamaForCausalLM": _llama_family("Llama 2/3, SmolLM2, TinyLlama", attention_bias=False),
    "Qwen2ForCausalLM": _llama_family("Qwen2/2.5", attention_bias=True),
    "GPT2LMHeadModel": HFFamily(
        examples="GPT-2, DistilGPT2",
        read_shape=_gpt2_shape,
        weight_names=_gpt2_names,
        model_class=TinyGPT,
        build_stages=build_stages,
        convert=_gpt2_convert,
        strip_prefix="transformer.",
        ignored_suffixes=(".attn.bias", ".attn.masked_bias"),
        with_context=_gpt2_context,
    ),
}
"""Supported `architectures` entries of config.json."""


def read_hf_config(folder: Path) -> tuple[ModelShape, str]:
    """The model shape and architecture of a Hugging Face folder, from its config.json alone.

    Raises:
        HFModelError: If the folder or config.json is missing or unreadable, or the
            architecture or a setting is not supported (the error lists what is).
    """
    folder = Path(folder)
    path = folder / "config.json"
    config = _read_config(folder)
    names = config.get("architectures") or []
    architecture = next((a for a in names if a in HF_ARCHITECTURES), None)
    if architecture is None:
        supported = "; ".join(f"{a} ({f.examples})" for a, f in HF_ARCHITECTURES.items())
        raise HFModelError(
            f"{path}: architectures={names!r} is not supported; supported: {supported}"
        )
    try:
        return HF_ARCHITECTURES[architecture].read_shape(config, path), architecture
    except (ValueError, TypeError) as exc:
        raise HFModelError(f"{path}: {exc}") from None


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise HFModelError(f"{index}: not a safetensors index ({exc})") from None
        files = [folder / name for name in sorted(set(weight_map.values()))]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        bins = sorted(p.name for p in folder.glob("*.bin"))
        hint = f" (found {', '.join(bins)}: re-save with safe_serialization=True)" if bins else ""
        raise HFModelError(f"{folder}: no *.safetensors weights{hint}")
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise HFModelError(f"{folder}: the index lists missing shards {missing}")
    return files


def _read_tensors(files: list[Path]) -> tuple[dict[str, Tensor], dict[str, str]]:
    from safetensors import SafetensorError, safe_open

    tensors: dict[str, Tensor] = {}
    dtypes: dict[str, str] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as reader:
                for name in reader.keys():  # noqa: SIM118 - safe_open is no mapping
                    tensor = reader.get_tensor(name)
                    dtypes[name] = str(tensor.dtype)
                    tensors[name] = tensor.to(torch.float32)
        except (SafetensorError, OSError) as exc:
            raise HFModelError(f"{file}: not a readable safetensors file ({exc})") from None
    return tensors, dtypes


def read_hf_model(folder: Path) -> HFModel:
    """Read a Hugging Face model folder into float32 tensors with our names.

    Args:
        folder: The folder `save_pretrained` wrote.

    Returns:
        The shape, the state dict, the tokenizer, the architecture and the stored dtypes.

    Raises:
        HFModelError: If a file is missing or unreadable, the architecture or a setting is
            not supported (the error lists what is), a weight is missing, unexpected or of
            the wrong shape, or the tokenizer has more tokens than the model's vocabulary.
    """
    folder = Path(folder)
    shape, architecture = read_hf_config(folder)
    family = HF_ARCHITECTURES[architecture]
    stored, dtypes = _read_tensors(_weight_files(folder))
    prefix = family.strip_prefix
    tensors = {
        name.removeprefix(prefix): value
        for name, value in stored.items()
        if not name.endswith(family.ignored_suffixes)
    }
    mapping = family.weight_names(shape)
    missing = [name for name in mapping if name not in tensors]
    if missing:
        raise HFModelError(
            f"{folder}: the weights lack {len(missing)} tensors of a {architecture} with "
            f"{shape.num_layers} layers, e.g. {missing[:3]}; the weights do not match config.json"
        )
    # A tied head may be saved anyway (it equals the embedding): not an unexpected tensor.
    extra = [name for name in tensors if name not in mapping and name != "lm_head.weight"]
    if extra:
        raise HFModelError(
            f"{folder}: unexpected tensors {extra[:3]} ({len(extra)} in all); the weights do not "
            f"match config.json's {architecture}"
        )
    state = {ours: family.convert(ours, tensors[theirs]) for theirs, ours in mapping.items()}
    for name, expected in family.param_shapes(shape).items():
        if tuple(state[name].shape) != expected:
            raise HFModelError(
                f"{folder}: tensor {name} has shape {tuple(state[name].shape)}, config.json "
                f"implies {expected}; the weights do not match config.json"
            )
    return HFModel(shape, state, _read_tokenizer(folder, shape), architecture, dtypes)


def _read_tokenizer(folder: Path, config: ModelShape) -> Any:
    from tokenizers import Tokenizer

    path = folder / "tokenizer.json"
    if not path.is_file():
        raise HFModelError(
            f"{folder}: no tokenizer.json; save the fast tokenizer next to the model "
            "(AutoTokenizer.from_pretrained(...).save_pretrained(folder))"
        )
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises its own Exception subclass
        raise HFModelError(f"{path}: not a readable tokenizer ({exc})") from None
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size > config.vocab_size:
        raise HFModelError(
            f"{path}: the tokenizer has {size} tokens but the model's embedding has "
            f"vocab_size={config.vocab_size} rows; the tokenizer does not belong to this model"
        )
    return tokenizer


def load_hf_model(folder: Path) -> tuple[nn.Module, Any]:
    """The folder's model holding its weights (float32, CPU), and its tokenizer.

    Returns a `Llama` (Llama, Qwen2 families) or a `TinyGPT` (GPT-2).

    Raises:
        HFModelError: As `read_hf_model`.
    """
    model_file = read_hf_model(folder)
    return model_file.family.build(model_file.config, model_file.state_dict), model_file.tokenizer
