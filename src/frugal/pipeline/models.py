"""The tiny byte-level GPT of CI, its split into pipeline stages, and its text windows.

Model: byte embedding (256) + learned positions, `num_layers` pre-norm blocks (causal
self-attention, GELU MLP 4x), final LayerNorm and a linear head; cross-entropy on the next
byte. Stages are contiguous blocks: stage 0 also holds the embeddings, the last stage the final
norm, the head and the loss.

Data: a real text corpus from `frugal.data` (pydoc topics by default), encoded as UTF-8 bytes,
cut into windows of T + 1 bytes with stride T; window index = example id (AQ-SGD keys its
buffers by it); every 8th window is held out for evaluation.

Shape legend: M micro-batch, T tokens (context), H hidden (d_model), V vocabulary (256).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol, Self

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from frugal.config import check_types
from frugal.parallel.partition import split_layers

__all__ = [
    "CausalLM",
    "PipelineStage",
    "StageBlocks",
    "StageModule",
    "TextWindows",
    "TinyGPT",
    "TinyGPTConfig",
    "build_stages",
    "check_stage_layers",
    "split_layers",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class TinyGPTConfig:
    """Shape of the tiny byte-level GPT."""

    context: int = 64
    """T, tokens per example, >= 2."""
    hidden: int = 128
    """H (d_model), divisible by num_heads."""
    num_heads: int = 4
    """Attention heads, >= 1."""
    num_layers: int = 4
    """Transformer blocks, >= 1 (one stage needs at least one)."""
    vocab_size: int = 256
    """V: 256 bytes (a pre-trained GPT-2 loaded by `frugal.pipeline.hf_loader`: its BPE)."""
    activation: Literal["gelu", "gelu_tanh"] = "gelu"
    """The MLP's GELU: exact, or the tanh approximation GPT-2 was trained with."""
    layer_norm_eps: float = 1e-5
    """LayerNorm epsilon, > 0."""
    tie_embeddings: bool = False
    """The head reuses the token embedding matrix (GPT-2's)."""
    head_bias: bool = True
    """The head adds a bias (GPT-2's tied head has none)."""

    @property
    def max_context(self) -> int:
        """Longest sequence the learned positions cover (= context)."""
        return self.context

    @property
    def num_params(self) -> int:
        """Parameters of the whole model (embeddings, positions, blocks, final norm, head)."""
        h = self.hidden
        block = 3 * h * h + 3 * h + h * h + h + 8 * h * h + 5 * h + 4 * h  # attn, MLP, 2 norms
        head = 0 if self.tie_embeddings else self.vocab_size * (h + int(self.head_bias))
        return self.vocab_size * h + self.context * h + self.num_layers * block + 2 * h + head

    def __post_init__(self) -> None:
        check_types(self)
        if self.layer_norm_eps <= 0:
            raise ValueError(f"layer_norm_eps={self.layer_norm_eps} must be > 0")
        if self.context < 2 or self.num_layers < 1 or self.num_heads < 1:
            raise ValueError(
                f"context={self.context} must be >= 2, num_layers={self.num_layers} and "
                f"num_heads={self.num_heads} >= 1"
            )
        if self.hidden % self.num_heads:
            raise ValueError(
                f"hidden={self.hidden} must be divisible by num_heads={self.num_heads}"
            )


class PipelineStage(Protocol):
    """What the runtime needs of a stage module (StageModule, llama.LlamaStage)."""

    stage: int
    is_first: bool
    is_last: bool

    def __call__(self, x: Tensor) -> Tensor:
        """Stage output (tokens or hidden states in; hidden states or logits out)."""
        ...

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]:
        """The stage's parameters (the optimizer's)."""
        ...

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, nn.Parameter]]:
        """The stage's parameters with their stage-local names."""
        ...


class _Block(nn.Module):
    def __init__(self, config: TinyGPTConfig) -> None:
        super().__init__()
        h = config.hidden
        self.num_heads = config.num_heads
        self.approximate = "tanh" if config.activation == "gelu_tanh" else "none"
        self.ln1 = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.fc = nn.Linear(h, 4 * h)
        self.out = nn.Linear(4 * h, h)

    def forward(self, x_MTH: Tensor) -> Tensor:
        m, t, h = x_MTH.shape
        qkv = self.qkv(self.ln1(x_MTH)).view(m, t, 3, self.num_heads, h // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (M, heads, T, H / heads)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x_MTH = x_MTH + self.proj(att.transpose(1, 2).reshape(m, t, h))
        mlp = F.gelu(self.fc(self.ln2(x_MTH)), approximate=self.approximate)
        out: Tensor = x_MTH + self.out(mlp)
        return out


class CausalLM(nn.Module):
    """What the whole models (`TinyGPT`, `frugal.pipeline.llama.Llama`) share.

    A token embedding `tok`, a `head` that is None when tied to it, and a constructor
    `cls(config, seed)` that skips the random init for `seed=None`.
    """

    tok: nn.Embedding
    head: nn.Linear | None

    @classmethod
    def load_weights(cls, config: Any, state: dict[str, Tensor]) -> Self:
        """A model of `config` holding copies of `state` (no random init: built on meta).

        Raises:
            RuntimeError: If `state` misses a parameter or has an unexpected one.
        """
        with torch.device("meta"):
            model = cls(config, seed=None)
        model.load_state_dict({k: v.clone() for k, v in state.items()}, assign=True)
        return model

    def head_weight(self) -> Tensor:
        """The (V, H) output projection (the embedding matrix when tied)."""
        return self.tok.weight if self.head is None else self.head.weight


class TinyGPT(CausalLM):
    """The whole (unpartitioned) model; `build_stages` splits it.

    Parameter names: `tok.weight`, `pos`, `blocks.{i}.{ln1,qkv,proj,ln2,fc,out}.{weight,bias}`,
    `ln_f.{weight,bias}`, and `head.weight` (+ `head.bias`) unless the embeddings are tied.

    Args:
        config: Model shape.
        seed: Seed of the initial weights (every rank builds the same model); None skips the
            init (the weights are loaded next: see `load_weights`).
    """

    def __init__(self, config: TinyGPTConfig, seed: int | None = 0) -> None:
        super().__init__()
        self.config = config
        h = config.hidden
        self.tok = nn.Embedding(config.vocab_size, h)
        self.pos = nn.Parameter(torch.zeros(config.context, h))
        self.blocks = nn.ModuleList(_Block(config) for _ in range(config.num_layers))
        self.ln_f = nn.LayerNorm(h, eps=config.layer_norm_eps)
        self.head = (
            None
            if config.tie_embeddings
            else nn.Linear(h, config.vocab_size, bias=config.head_bias)
        )
        if seed is None:
            return
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    std = 0.02 / math.sqrt(2 * config.num_layers) if "out" in name else 0.02
                    p.copy_(torch.randn(p.shape, generator=gen) * std)
                elif "ln" not in name:
                    p.zero_()

    def forward(self, tokens_MT: Tensor) -> Tensor:
        """Logits of the next byte.

        Shapes:
            tokens_MT: (M, T) int64 -> (M, T, V) float32.
        """
        x = self.tok(tokens_MT) + self.pos[: tokens_MT.shape[1]]
        for block in self.blocks:
            x = block(x)
        bias = None if self.head is None else self.head.bias
        return F.linear(self.ln_f(x), self.head_weight(), bias)


class StageBlocks(nn.Module):
    """The part every pipeline stage module shares: its place and its share of the blocks.

    Sets `stage`, `num_stages`, `is_first`, `is_last`, `blocks` (the model's blocks
    `sum(layers[:stage])` .. `+ layers[stage] - 1`, shared, not copied) and `use_recompute`,
    in that order (the order of the stage's parameter names). Subclasses add the embeddings
    and the head and write `forward`.

    Args:
        blocks: The whole model's blocks.
        stage: This stage's index, 0 <= stage < len(layers).
        layers: Blocks per stage (see `check_stage_layers`).
        use_recompute: Recompute each block's activations in the backward pass.
    """

    def __init__(
        self, blocks: nn.ModuleList, stage: int, layers: tuple[int, ...], use_recompute: bool
    ) -> None:
        super().__init__()
        self.stage = stage
        self.num_stages = len(layers)
        self.is_first = stage == 0
        self.is_last = stage == self.num_stages - 1
        lo = sum(layers[:stage])
        self.blocks = nn.ModuleList(blocks[lo : lo + layers[stage]])
        self.use_recompute = use_recompute

    def run_blocks(self, x: Tensor, *extra: Tensor) -> Tensor:
        """Apply the stage's blocks in order, each as `block(x, *extra)`.

        With `use_recompute` (and autograd on), each block's activations are recomputed in
        the backward pass (`torch.utils.checkpoint`, non-reentrant) instead of being kept.

        Shapes:
            x: the first block's input; returns the last block's output.
        """
        for block in self.blocks:
            if self.use_recompute and torch.is_grad_enabled():
                x = checkpoint(block, x, *extra, use_reentrant=False)
            else:
                x = block(x, *extra)
        return x


class StageModule(StageBlocks):
    """One pipeline stage: [embeddings] + contiguous blocks + [final norm, head].

    Its forward maps the stage input (tokens on stage 0, hidden states elsewhere) to its
    output (hidden states, or logits on the last stage). With `use_recompute`, each block's
    activations are recomputed in the backward pass (torch.utils.checkpoint).
    """

    def __init__(
        self, model: TinyGPT, stage: int, layers: tuple[int, ...], use_recompute: bool = False
    ) -> None:
        super().__init__(model.blocks, stage, layers, use_recompute)
        self.tok = model.tok if self.is_first or (self.is_last and model.head is None) else None
        self.pos = model.pos if self.is_first else None
        self.ln_f = model.ln_f if self.is_last else None
        self.head = model.head if self.is_last else None

    def forward(self, x: Tensor) -> Tensor:
        """Stage output.

        Shapes:
            x: (M, T) int64 on stage 0, else (M, T, H) float32 -> (M, T, H), or (M, T, V)
            on the last stage.
        """
        if self.is_first:
            assert self.tok is not None
            assert self.pos is not None
            x = self.tok(x) + self.pos[: x.shape[1]]
        x = self.run_blocks(x)
        if self.is_last:
            assert self.ln_f is not None
            head = self.head if self.head is not None else self.tok
            assert head is not None
            bias = self.head.bias if self.head is not None else None
            x = F.linear(self.ln_f(x), head.weight, bias)
        return x


def build_stages(
    model: TinyGPT, layers: tuple[int, ...], use_recompute: bool = False
) -> list[StageModule]:
    """Split `model` into stages sharing its parameters (one per entry of `layers`).

    Raises:
        ValueError: If `layers` does not sum to the model's blocks or has an entry < 1.
    """
    check_stage_layers(layers, model.config.num_layers)
    return [StageModule(model, s, layers, use_recompute) for s in range(len(layers))]


def check_stage_layers(layers: tuple[int, ...], num_layers: int) -> None:
    """Check a split of `num_layers` blocks into stages (one entry of `layers` per stage).

    Raises:
        ValueError: If `layers` does not sum to `num_layers` or has an entry < 1.
    """
    if sum(layers) != num_layers or min(layers) < 1:
        raise ValueError(
            f"layers per stage {layers} must be >= 1 each and sum to the model's "
            f"{num_layers} blocks"
        )


class TextWindows:
    """Byte windows of a real corpus, with train/eval ids.

    Args:
        text: The corpus.
        context: T; windows hold T + 1 bytes (inputs and next-byte targets).
        num_train: Train examples kept (the first ones in window order), >= 1.
        num_eval: Eval examples kept, >= 1.

    Raises:
        ValueError: If the corpus has too few windows.
    """

    def __init__(self, text: str, context: int, num_train: int, num_eval: int) -> None:
        self._cut(np.frombuffer(text.encode("utf-8"), dtype=np.uint8), context, num_train, num_eval)

    @classmethod
    def from_tokens(
        cls, tokens: np.ndarray, context: int, num_train: int, num_eval: int
    ) -> TextWindows:
        """Windows of an already tokenized corpus (e.g. BPE ids), same rules as bytes.

        Raises:
            ValueError: If the corpus has too few windows.
        """
        windows = cls.__new__(cls)
        windows._cut(np.asarray(tokens), context, num_train, num_eval)
        return windows

    def _cut(self, data: np.ndarray, context: int, num_train: int, num_eval: int) -> None:
        num_windows = (len(data) - 1) // context
        is_eval = np.arange(num_windows) % 8 == 7
        train, evals = np.flatnonzero(~is_eval), np.flatnonzero(is_eval)
        if len(train) < num_train or len(evals) < num_eval:
            raise ValueError(
                f"the corpus has {len(train)} train and {len(evals)} eval windows of "
                f"{context + 1} tokens; lower num_train={num_train} / num_eval={num_eval}"
            )
        starts = np.arange(num_windows) * context
        index = starts[:, None] + np.arange(context + 1)
        self.windows = torch.from_numpy(data[index].astype(np.int64))  # (W, T + 1)
        self.train_ids = torch.from_numpy(train[:num_train].astype(np.int64))
        self.eval_ids = torch.from_numpy(evals[:num_eval].astype(np.int64))
        # Train-side windows past num_train: never trained on nor evaluated (pre-training).
        self.rest_ids = torch.from_numpy(train[num_train:].astype(np.int64))

    def epoch_order(self, epoch: int, seed: int) -> Tensor:
        """Train ids in the seeded order of `epoch` (same on every rank)."""
        gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        return self.train_ids[torch.randperm(len(self.train_ids), generator=gen)]

    def batch(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """Inputs and targets of the windows `ids`.

        Shapes:
            ids: (M,) -> inputs (M, T), targets (M, T), int64.
        """
        w = self.windows[ids]
        return w[:, :-1], w[:, 1:]
