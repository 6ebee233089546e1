"""Row layout, deterministic initialisation and fused sparse optimizers.

A store row is `[w (embedding_dim) | optimizer state]`, float32 or float16 (`RowSpec.dtype`);
the state travels with the vector, so one read and one write serve a whole update. Rows are
computed in float32; a float16 table rounds every stored value (initial rows, puts, updates)
to float16, so the cache, every backend and every access order hold the same bits.
Shape legend: N rows, D embedding_dim, W row width (D + state).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from frugal._typing import F32, I64, U64
from frugal.config import check_types
from frugal.store.optimizers import OPTIMIZERS, OptimizerConfig

__all__ = [
    "OptimizerConfig",
    "RowSpec",
    "apply_optimizer",
    "init_rows",
    "round_rows",
    "splitmix64",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class RowSpec:
    """Layout of one stored row: the embedding and its optimizer state."""

    embedding_dim: int
    """Length D of the embedding vector, >= 1."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """The optimizer whose state is stored in the row."""
    dtype: Literal["float32", "float16"] = "float32"
    """Storage precision of the whole row (vector and state). float16 halves the bytes on
    disk; values are rounded to float16 after every update (Adam's per-row step count stays
    exact up to 2048)."""

    def __post_init__(self) -> None:
        check_types(self)
        if self.embedding_dim < 1:
            raise ValueError(f"embedding_dim={self.embedding_dim} must be >= 1")

    @property
    def width(self) -> int:
        """Row width W in float32 values."""
        return self.embedding_dim + self.optimizer.state_width(self.embedding_dim)

    @property
    def row_bytes(self) -> int:
        """Bytes of one row in memory, where rows are float32 (4 * W)."""
        return 4 * self.width

    @property
    def stored_row_bytes(self) -> int:
        """Bytes of one row in a backend (4 * W for float32, 2 * W for float16)."""
        return np.dtype(self.dtype).itemsize * self.width


def round_rows(rows: F32, spec: RowSpec) -> None:
    """Round float32 rows in place to the spec's storage precision (no-op for float32)."""
    if spec.dtype == "float16":
        with np.errstate(over="ignore"):  # overflow becomes inf; callers check finiteness
            rows[...] = rows.astype(np.float16)


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def splitmix64(x: U64) -> U64:
    """SplitMix64 finaliser, vectorised (Steele, Lea, Flood 2014); wraps modulo 2^64."""
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        result: U64 = z ^ (z >> np.uint64(31))
    return result


def init_rows(ids: I64, spec: RowSpec, seed: int) -> F32:
    """Deterministic initial rows: w uniform in [-1/sqrt(D), 1/sqrt(D)), state its init.

    The value of w[i, j] depends only on (seed, id, j), so every backend, cache size and
    access order starts from the same table. The state is the optimizer's `init_state`
    (zeros for every built-in rule).

    Args:
        ids: Row ids, int64.
        spec: The row layout.
        seed: Table seed.

    Returns:
        float32 rows.

    Shapes:
        ids: (N,) -> (N, W).
    """
    d = spec.embedding_dim
    with np.errstate(over="ignore"):
        base = np.uint64(seed & 0xFFFFFFFFFFFFFFFF) * _GOLDEN
        cols = np.arange(d, dtype=np.uint64)
        keys = (base + ids.astype(np.uint64)[:, None] * np.uint64(d) + cols).astype(np.uint64)
    u = (splitmix64(keys) >> np.uint64(40)).astype(np.float32) / np.float32(2**24)
    rows = np.zeros((len(ids), spec.width), dtype=np.float32)
    rows[:, :d] = (u - np.float32(0.5)) * np.float32(2.0 / math.sqrt(d))
    init_state = OPTIMIZERS.get(spec.optimizer.kind).init_state
    if init_state is not None:
        rows[:, d:] = init_state(spec.optimizer, d)
    round_rows(rows, spec)
    return rows


def apply_optimizer(rows_NW: F32, grads_ND: F32, spec: RowSpec) -> None:
    """Update unique rows in place with their summed gradients (one fused step).

    The rule is the registered `spec.optimizer.kind` (`frugal.store.optimizers`), given
    `g = grads + weight_decay * w`. Built in (torch.optim semantics restricted to the touched
    rows): sgd `m = mu*m + g; w -= lr*m` (no m when mu = 0); adagrad
    `a += g*g; w -= lr*g/(sqrt(a)+eps)`; rowwise_adagrad as adagrad with one accumulator per
    row, `a += mean(g*g)` (FBGEMM's row-wise Adagrad); adam with a per-row step t:
    `t += 1; m = b1*m+(1-b1)*g; v = b2*v+(1-b2)*g*g; w -= lr*(m/(1-b1^t))/(sqrt(v/(1-b2^t))+eps)`.

    Args:
        rows_NW: Rows to update, float32, modified in place.
        grads_ND: Gradients of the embedding part, float32, one per row (duplicates summed).
        spec: The row layout and optimizer.

    Raises:
        ValueError: If the optimizer has no update rule ("none": such rows take `put`).

    Shapes:
        rows_NW: (N, W); grads_ND: (N, D).
    """
    opt = spec.optimizer
    rule = OPTIMIZERS.get(opt.kind).update
    if rule is None:
        raise ValueError(f"optimizer kind {opt.kind!r} has no update rule; write rows with put()")
    d = spec.embedding_dim
    w = rows_NW[:, :d]
    g = grads_ND
    if opt.weight_decay:
        g = g + np.float32(opt.weight_decay) * w
    rule(w, rows_NW[:, d:], g, opt)
