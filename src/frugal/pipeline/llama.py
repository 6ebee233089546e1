"""A compact Llama decoder (SmolLM2's architecture) and its split into pipeline stages.

Model: token embedding, `num_layers` pre-norm blocks (RMSNorm; grouped-query causal
self-attention with rotary position embeddings; SwiGLU MLP), a final RMSNorm and a linear head
(tied to the embedding when `tie_embeddings`). Weights come from a GGUF file
(`frugal.pipeline.gguf_loader`) or a seeded random init (tests).

RoPE uses the "rotate half" layout (the first and second half of each head's dimensions form
the rotated pairs), as Hugging Face's Llama does; GGUF files store q/k rows permuted for
llama.cpp's interleaved pairs, and the loader undoes that permutation.

Shape legend: M micro-batch, T tokens, H hidden, N query heads, K key/value heads, D head
dim, F MLP (intermediate) width, V vocabulary.

References:
    LLaMA: Open and Efficient Foundation Language Models, arXiv 2302.13971 (pre-norm RMSNorm,
    SwiGLU, rotary embeddings). GQA: Training Generalized Multi-Query Transformer Models from
    Multi-Head Checkpoints, EMNLP 2023, arXiv 2305.13245. RoFormer: Enhanced Transformer with
    Rotary Position Embedding, arXiv 2104.09864.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from frugal.config import check_types
from frugal.pipeline.models import CausalLM, StageBlocks, check_stage_layers

__all__ = [
    "Llama",
    "LlamaConfig",
    "LlamaStage",
    "build_llama_stages",
    "rope_cos_sin",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class LlamaConfig:
    """Shape of a Llama decoder (defaults: SmolLM2-135M)."""

    vocab_size: int = 49152
    """V, tokens in the vocabulary, >= 1."""
    hidden: int = 576
    """H (d_model), = num_heads x head_dim."""
    intermediate: int = 1536
    """F, SwiGLU MLP width, >= 1."""
    num_layers: int = 30
    """Decoder blocks, >= 1."""
    num_heads: int = 9
    """N, query heads, a multiple of num_kv_heads."""
    num_kv_heads: int = 3
    """K, key/value heads (grouped-query attention), >= 1."""
    rope_theta: float = 100000.0
    """RoPE base, > 0."""
    rms_norm_eps: float = 1e-5
    """RMSNorm epsilon, > 0."""
    max_context: int = 8192
    """Longest sequence the RoPE tables cover, >= 1."""
    tie_embeddings: bool = True
    """The head reuses the token embedding matrix."""
    attention_bias: bool = False
    """q, k and v projections carry a bias (Qwen2's attention; Llama's has none)."""

    @property
    def num_params(self) -> int:
        """Parameters of the whole model (SmolLM2-135M: 134,515,008).

        The embedding, the blocks (attention with K kv heads and the q/k/v biases if any,
        SwiGLU MLP, two RMSNorms), the final norm, and the head unless tied.
        """
        h, kv = self.hidden, self.num_kv_heads * (self.hidden // self.num_heads)
        block = 2 * h * h + 2 * h * kv + 3 * h * self.intermediate + 2 * h
        block += (h + 2 * kv) if self.attention_bias else 0
        head = 0 if self.tie_embeddings else self.vocab_size * h
        return self.vocab_size * h + self.num_layers * block + h + head

    def __post_init__(self) -> None:
        check_types(self)
        if min(self.vocab_size, self.intermediate, self.num_layers, self.max_context) < 1:
            raise ValueError(
                f"vocab_size={self.vocab_size}, intermediate={self.intermediate}, "
                f"num_layers={self.num_layers} and max_context={self.max_context} must be >= 1"
            )
        if self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} must be a multiple of num_kv_heads="
                f"{self.num_kv_heads} >= 1"
            )
        if self.hidden % self.num_heads or (self.hidden // self.num_heads) % 2:
            raise ValueError(
                f"hidden={self.hidden} must be num_heads={self.num_heads} x an even head dim"
            )
        if self.rope_theta <= 0 or self.rms_norm_eps <= 0:
            raise ValueError(
                f"rope_theta={self.rope_theta} and rms_norm_eps={self.rms_norm_eps} must be > 0"
            )

    @property
    def head_dim(self) -> int:
        """D = hidden / num_heads."""
        return self.hidden // self.num_heads


def rope_cos_sin(config: LlamaConfig, length: int) -> tuple[Tensor, Tensor]:
    """Cosine and sine tables of RoPE in the rotate-half layout, float32.

    Angle of position t and pair i (i < D / 2): t / theta^(2 i / D); both halves repeat it.

    Shapes:
        -> cos, sin: (length, D).
    """
    d = config.head_dim
    inv_freq = 1.0 / config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.outer(torch.arange(length, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension."""

    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: Tensor) -> Tensor:
        """Normalised x, same shape."""
        out: Tensor = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        return out


class LlamaBlock(nn.Module):
    """One pre-norm decoder block: x + attn(norm(x)), then + mlp(norm(.))."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        h, d = config.hidden, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_heads,
            config.num_kv_heads,
            d,
        )
        self.attn_norm = RMSNorm(h, config.rms_norm_eps)
        bias = config.attention_bias
        self.q_proj = nn.Linear(h, config.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(h, config.num_kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(h, config.num_kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(config.num_heads * d, h, bias=False)
        self.mlp_norm = RMSNorm(h, config.rms_norm_eps)
        self.gate_proj = nn.Linear(h, config.intermediate, bias=False)
        self.up_proj = nn.Linear(h, config.intermediate, bias=False)
        self.down_proj = nn.Linear(config.intermediate, h, bias=False)

    def forward(self, x_MTH: Tensor, cos_TD: Tensor, sin_TD: Tensor) -> Tensor:
        """Block output.

        Shapes:
            x_MTH: (M, T, H); cos_TD, sin_TD: (T, D) -> (M, T, H).
        """
        m, t, _ = x_MTH.shape
        y = self.attn_norm(x_MTH)
        q_MNTD = self.q_proj(y).view(m, t, self.num_heads, self.head_dim).transpose(1, 2)
        k_MKTD = self.k_proj(y).view(m, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v_MKTD = self.v_proj(y).view(m, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q_MNTD = q_MNTD * cos_TD + _rotate_half(q_MNTD) * sin_TD
        k_MKTD = k_MKTD * cos_TD + _rotate_half(k_MKTD) * sin_TD
        group = self.num_heads // self.num_kv_heads  # query head n reads kv head n // group
        k_MNTD = k_MKTD.repeat_interleave(group, dim=1)
        v_MNTD = v_MKTD.repeat_interleave(group, dim=1)
        att_MNTD = F.scaled_dot_product_attention(q_MNTD, k_MNTD, v_MNTD, is_causal=True)
        x_MTH = x_MTH + self.o_proj(att_MNTD.transpose(1, 2).reshape(m, t, -1))
        y = self.mlp_norm(x_MTH)
        out: Tensor = x_MTH + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))
        return out


class Llama(CausalLM):
    """The whole (unpartitioned) decoder; `build_llama_stages` splits it.

    Parameter names: `tok.weight`, `blocks.{i}.{attn_norm,q_proj,k_proj,v_proj,o_proj,
    mlp_norm,gate_proj,up_proj,down_proj}.weight` (and `blocks.{i}.{q,k,v}_proj.bias` with
    `attention_bias`), `norm.weight`, and `head.weight` when the embeddings are not tied.

    Args:
        config: Model shape.
        seed: Seed of the random initial weights; None skips the init (the weights are
            loaded next: build under `torch.device("meta")` and `load_weights`).
    """

    def __init__(self, config: LlamaConfig, seed: int | None = 0) -> None:
        super().__init__()
        self.config = config
        self.tok = nn.Embedding(config.vocab_size, config.hidden)
        self.blocks = nn.ModuleList(LlamaBlock(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden, config.rms_norm_eps)
        self.head = (
            None
            if config.tie_embeddings
            else nn.Linear(config.hidden, config.vocab_size, bias=False)
        )
        if seed is not None:
            gen = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for name, p in self.named_parameters():
                    if p.dim() >= 2:
                        p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
                    elif name.endswith("_proj.bias"):
                        p.zero_()  # not nn.Linear's draw from the global generator
        self._rope: tuple[Tensor, Tensor] | None = None

    def rope(self, length: int) -> tuple[Tensor, Tensor]:
        """RoPE tables for `length` positions (cached; not parameters, never trained).

        Raises:
            ValueError: If length exceeds config.max_context.
        """
        if length > self.config.max_context:
            raise ValueError(
                f"sequence length {length} exceeds max_context={self.config.max_context}; "
                "use shorter windows"
            )
        if self._rope is None or self._rope[0].shape[0] < length:
            self._rope = rope_cos_sin(self.config, max(length, 128))
        cos, sin = self._rope
        return cos[:length], sin[:length]

    def forward(self, tokens_MT: Tensor) -> Tensor:
        """Logits of the next token.

        Shapes:
            tokens_MT: (M, T) int64 -> (M, T, V) float32.
        """
        cos, sin = self.rope(tokens_MT.shape[1])
        x = self.tok(tokens_MT)
        for block in self.blocks:
            x = block(x, cos, sin)
        return F.linear(self.norm(x), self.head_weight())


class LlamaStage(StageBlocks):
    """One pipeline stage of a `Llama`: [embedding] + contiguous blocks + [norm, head].

    Same contract as `frugal.pipeline.models.StageModule`: stage 0 maps tokens (M, T) to
    hidden states (M, T, H), middle stages hidden to hidden, the last stage to logits
    (M, T, V). Its parameters are the model's (shared, not copied); the tied embedding
    appears in the first and the last stage.
    """

    def __init__(
        self, model: Llama, stage: int, layers: tuple[int, ...], use_recompute: bool = False
    ) -> None:
        super().__init__(model.blocks, stage, layers, use_recompute)
        self.tok = model.tok if self.is_first or (self.is_last and model.head is None) else None
        self.norm = model.norm if self.is_last else None
        self.head = model.head if self.is_last else None
        self._model_rope = model.rope  # a bound method: no parameters, no module registration

    def forward(self, x: Tensor) -> Tensor:
        """Stage output.

        Shapes:
            x: (M, T) int64 on stage 0, else (M, T, H) float32 -> (M, T, H), or (M, T, V)
            on the last stage.
        """
        cos, sin = self._model_rope(x.shape[1])
        if self.is_first:
            assert self.tok is not None
            x = self.tok(x)
        x = self.run_blocks(x, cos, sin)
        if self.is_last:
            head = self.head if self.head is not None else self.tok
            assert head is not None
            assert self.norm is not None
            x = F.linear(self.norm(x), head.weight)
        return x


def build_llama_stages(
    model: Llama, layers: tuple[int, ...], use_recompute: bool = False
) -> list[LlamaStage]:
    """Split `model` into stages sharing its parameters (one per entry of `layers`).

    Raises:
        ValueError: If `layers` does not sum to the model's blocks or has an entry < 1.
    """
    check_stage_layers(layers, model.config.num_layers)
    return [LlamaStage(model, s, layers, use_recompute) for s in range(len(layers))]
