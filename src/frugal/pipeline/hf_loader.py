"""Load a Hugging Face-format causal LM from a local folder into `frugal.pipeline.llama.Llama`.

The folder is what `save_pretrained` writes: `config.json`, the weights as `*.safetensors`
(one file, or shards listed by `model.safetensors.index.json`) and the fast tokenizer's
`tokenizer.json`. Weights are read with `safetensors` (any stored dtype -> float32) and mapped
from Hugging Face's names to ours; Hugging Face stores q/k rows in the rotate-half layout our
`Llama` uses, so no permutation is needed (unlike GGUF). The tokenizer is read with
`tokenizers`. Nothing is downloaded.

Supported architectures (`config.json`'s `architectures`): `LlamaForCausalLM` (Llama 2/3,
SmolLM/SmolLM2, TinyLlama, ...) and `Qwen2ForCausalLM` (Qwen2/2.5: q/k/v biases). RoPE
scaling, MLP biases and activations other than SiLU are refused by name.

References:
    LLaMA: Open and Efficient Foundation Language Models, arXiv 2302.13971. Qwen2 Technical
    Report, arXiv 2407.10671 (q/k/v biases).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from frugal import FrugalError
from frugal.pipeline.llama import Llama, LlamaConfig

__all__ = [
    "HF_ARCHITECTURES",
    "HFModel",
    "HFModelError",
    "load_hf_llama",
    "read_hf_config",
    "read_hf_llama",
]

HF_ARCHITECTURES: Mapping[str, bool] = {"LlamaForCausalLM": False, "Qwen2ForCausalLM": True}
"""Supported `architectures` entries -> whether their q/k/v projections carry biases."""

_BLOCK_TENSORS = {
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
_BIAS_TENSORS = {f"self_attn.{p}_proj.bias": f"{p}_proj.bias" for p in "qkv"}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers older checkpoints saved


class HFModelError(FrugalError):
    """The model folder is not a causal LM this loader can run (names the file and the fix)."""


@dataclass(frozen=True, slots=True)
class HFModel:
    """What a Hugging Face model folder holds, in our names."""

    config: LlamaConfig
    """Model shape from `config.json`."""
    state_dict: dict[str, Tensor]
    """Float32 weights keyed like `Llama.state_dict()`."""
    tokenizer: Any
    """The folder's `tokenizers.Tokenizer` (from `tokenizer.json`)."""
    architecture: str
    """`config.json`'s architecture, e.g. "LlamaForCausalLM"."""
    stored_dtypes: dict[str, str]
    """Hugging Face tensor name -> its stored dtype (e.g. "torch.bfloat16")."""


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


def _llama_config(config: dict[str, Any], path: Path) -> tuple[LlamaConfig, str]:
    """Our `LlamaConfig` for a `config.json`, or an error naming the unsupported key."""
    names = config.get("architectures") or []
    architecture = next((a for a in names if a in HF_ARCHITECTURES), None)
    if architecture is None:
        raise HFModelError(
            f"{path}: architectures={names!r} is not supported; supported: "
            f"{', '.join(HF_ARCHITECTURES)} (Llama 2/3, SmolLM2, TinyLlama, Qwen2/2.5)"
        )
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

    def need(key: str) -> Any:
        if key not in config:
            raise HFModelError(f"{path}: no {key!r}; the file is not a complete model config")
        return config[key]

    hidden, num_heads = int(need("hidden_size")), int(need("num_attention_heads"))
    head_dim = config.get("head_dim")
    if head_dim is not None and num_heads * int(head_dim) != hidden:
        raise HFModelError(
            f"{path}: head_dim={head_dim} x num_attention_heads={num_heads} != hidden_size="
            f"{hidden}; only head_dim = hidden_size / num_attention_heads is supported"
        )
    try:
        return LlamaConfig(
            vocab_size=int(need("vocab_size")),
            hidden=hidden,
            intermediate=int(need("intermediate_size")),
            num_layers=int(need("num_hidden_layers")),
            num_heads=num_heads,
            num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
            rope_theta=float(config.get("rope_theta", 10000.0)),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            max_context=int(config.get("max_position_embeddings", 2048)),
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=HF_ARCHITECTURES[architecture] or bool(config.get("attention_bias")),
        ), architecture
    except ValueError as exc:
        raise HFModelError(f"{path}: {exc}") from None


def read_hf_config(folder: Path) -> tuple[LlamaConfig, str]:
    """The model shape and architecture of a Hugging Face folder, from its config.json alone.

    Raises:
        HFModelError: If the folder or config.json is missing or unreadable, or the
            architecture or a setting is not supported (the error lists what is).
    """
    folder = Path(folder)
    return _llama_config(_read_config(folder), folder / "config.json")


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


def read_hf_llama(folder: Path) -> HFModel:
    """Read a Hugging Face model folder into float32 tensors with our names.

    Args:
        folder: The folder `save_pretrained` wrote.

    Returns:
        The config, the state dict, the tokenizer, the architecture and the stored dtypes.

    Raises:
        HFModelError: If a file is missing or unreadable, the architecture or a setting is
            not supported (the error lists what is), a weight is missing, unexpected or of
            the wrong shape, or the tokenizer has more tokens than the model's vocabulary.
    """
    folder = Path(folder)
    config, architecture = read_hf_config(folder)
    tensors, dtypes = _read_tensors(_weight_files(folder))
    mapping = {"model.embed_tokens.weight": "tok.weight", "model.norm.weight": "norm.weight"}
    if not config.tie_embeddings:
        mapping["lm_head.weight"] = "head.weight"
    block_tensors = _BLOCK_TENSORS | (_BIAS_TENSORS if config.attention_bias else {})
    for i in range(config.num_layers):
        for theirs, ours in block_tensors.items():
            mapping[f"model.layers.{i}.{theirs}"] = f"blocks.{i}.{ours}"
    missing = [name for name in mapping if name not in tensors]
    if missing:
        raise HFModelError(
            f"{folder}: the weights lack {len(missing)} tensors of a {architecture} with "
            f"{config.num_layers} layers, e.g. {missing[:3]}; the weights do not match config.json"
        )
    extra = [
        name
        for name in tensors
        if name not in mapping and not name.endswith(_IGNORED_SUFFIXES) and name != "lm_head.weight"
    ]
    if extra:
        raise HFModelError(
            f"{folder}: unexpected tensors {extra[:3]} ({len(extra)} in all); the weights do not "
            f"match config.json's {architecture}"
        )
    state = {ours: tensors[theirs] for theirs, ours in mapping.items()}
    expected = _llama_shapes(config)
    for name, shape in expected.items():
        if tuple(state[name].shape) != shape:
            raise HFModelError(
                f"{folder}: tensor {name} has shape {tuple(state[name].shape)}, config.json "
                f"implies {shape}; the weights do not match config.json"
            )
    return HFModel(config, state, _read_tokenizer(folder, config), architecture, dtypes)


def _llama_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Parameter shapes of a `Llama` of `config`, by name (built on the meta device)."""
    with torch.device("meta"):
        model = Llama(config, seed=None)
    return {name: tuple(p.shape) for name, p in model.state_dict().items()}


def _read_tokenizer(folder: Path, config: LlamaConfig) -> Any:
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


def load_hf_llama(folder: Path) -> tuple[Llama, Any]:
    """A `Llama` holding the folder's weights (float32, CPU), and its tokenizer.

    Raises:
        HFModelError: As `read_hf_llama`.
    """
    model_file = read_hf_llama(folder)
    return Llama.load_weights(model_file.config, model_file.state_dict), model_file.tokenizer
