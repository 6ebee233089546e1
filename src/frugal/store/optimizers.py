"""The sparse-optimizer registry: each update rule registers its state width, init and step.

A store row is `[w | state]`; an optimizer kind says how many state floats follow the vector,
what they start at and how one step updates `w` and the state of the touched rows. Built in:
`none`, `sgd` (with momentum), `adagrad`, `rowwise_adagrad`, `adam`. Adding a rule is one
`register_optimizer` call; the store, its cache, every backend and the baselines apply it
with no other change. Shape legend: N rows, D embedding_dim, S state width.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from frugal._typing import F32
from frugal.config import check_types
from frugal.registry import Registry

__all__ = [
    "OPTIMIZERS",
    "OptimizerConfig",
    "OptimizerType",
    "optimizer_names",
    "register_optimizer",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class OptimizerConfig:
    """A sparse optimizer applied row by row (the touched rows of each step only)."""

    kind: str = "sgd"
    """Update rule, a name in `frugal.store.optimizers.OPTIMIZERS` (`none`, `sgd`, `adagrad`,
    `rowwise_adagrad`, `adam`, or one added by `register_optimizer`); "none" stores vectors
    only (e.g. TGNN node memory)."""
    lr: float = 0.01
    """Learning rate, > 0."""
    momentum: float = 0.0
    """SGD momentum in [0, 1) (as torch.optim.SGD, dampening 0); > 0 adds D state floats."""
    weight_decay: float = 0.0
    """L2 penalty added to the gradient (torch's `weight_decay`), >= 0."""
    beta1: float = 0.9
    """Adam's first-moment decay, in [0, 1)."""
    beta2: float = 0.999
    """Adam's second-moment decay, in [0, 1)."""
    eps: float = 1e-8
    """Denominator epsilon of Adam (1e-8) and Adagrad (torch uses 1e-10), > 0."""

    def __post_init__(self) -> None:
        check_types(self)
        entry = OPTIMIZERS.get(self.kind)
        if self.lr <= 0:
            raise ValueError(f"lr={self.lr} must be > 0")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum={self.momentum} must be in [0, 1)")
        if self.momentum and "momentum" not in entry.hyperparameters:
            users = " or ".join(
                repr(name)
                for name in OPTIMIZERS
                if "momentum" in OPTIMIZERS.get(name).hyperparameters
            )
            raise ValueError(
                f"momentum={self.momentum} applies to kind={users} only, not {self.kind!r}"
            )
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay={self.weight_decay} must be >= 0")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ValueError(f"beta1={self.beta1}, beta2={self.beta2} must be in [0, 1)")
        if self.eps <= 0:
            raise ValueError(f"eps={self.eps} must be > 0")

    def state_width(self, embedding_dim: int) -> int:
        """Number of float32 state values stored after the vector."""
        return OPTIMIZERS.get(self.kind).state_width(self, embedding_dim)


UpdateRule = Callable[[F32, F32, F32, OptimizerConfig], None]
"""`update(w_ND, state_NS, g_ND, config)`: one step on N rows, in place on `w_ND` and
`state_NS` (views into the rows); `g_ND` already holds the weight decay term."""


@dataclass(frozen=True, slots=True)
class OptimizerType:
    """One registered update rule.

    Attributes:
        state_width: S, state floats per row for a config and embedding_dim D.
        update: The step (see `UpdateRule`), or None for a kind without one ("none": rows
            are written with `put`).
        init_state: The S initial state values of a row, or None for zeros.
        hyperparameters: The `OptimizerConfig` fields the rule reads besides `lr` and
            `weight_decay` (a config setting `momentum` for a rule without it is refused).
        description: One line for the docs.
    """

    state_width: Callable[[OptimizerConfig, int], int]
    update: UpdateRule | None
    init_state: Callable[[OptimizerConfig, int], F32] | None = None
    hyperparameters: frozenset[str] = frozenset()
    description: str = ""


OPTIMIZERS: Registry[OptimizerType] = Registry("store optimizer", field="kind")
"""Every update rule `OptimizerConfig.kind` may name."""


def register_optimizer(
    name: str,
    update: UpdateRule | None,
    *,
    state_width: Callable[[OptimizerConfig, int], int] = lambda config, embedding_dim: 0,
    init_state: Callable[[OptimizerConfig, int], F32] | None = None,
    hyperparameters: tuple[str, ...] = (),
    description: str = "",
    replace: bool = False,
) -> None:
    """Make `name` a valid `OptimizerConfig.kind`.

    Args:
        name: The rule's name, as users write it in a config.
        update: `update(w_ND, state_NS, g_ND, config)`, in place; `g_ND` is the summed
            gradient plus `weight_decay * w`. Compute in float32 (the store rounds float16
            tables after the step).
        state_width: S, state floats per row given the config and D (default 0).
        init_state: The S initial state values of a row (default: zeros).
        hyperparameters: `OptimizerConfig` fields the rule reads besides `lr` and
            `weight_decay`, e.g. `("momentum",)`.
        description: One line saying what the rule is.
        replace: Whether to replace a rule registered under the same name.

    Raises:
        ValueError: If `name` is taken and `replace` is False.

    Example:
        >>> import numpy as np
        >>> def sign_sgd(w, state, g, config):
        ...     w -= np.float32(config.lr) * np.sign(g)
        >>> register_optimizer("sign_sgd_doc", sign_sgd)
        >>> OptimizerConfig(kind="sign_sgd_doc").state_width(8)
        0
        >>> _ = OPTIMIZERS.unregister("sign_sgd_doc")
    """
    OPTIMIZERS.register(
        name,
        OptimizerType(state_width, update, init_state, frozenset(hyperparameters), description),
        replace=replace,
    )


def optimizer_names() -> tuple[str, ...]:
    """The registered update rules' names, built-in ones first."""
    return OPTIMIZERS.names()


# --- built-in rules (torch.optim semantics restricted to the touched rows) --------------------


def _sgd(w: F32, state: F32, g: F32, config: OptimizerConfig) -> None:
    """`m = mu*m + g; w -= lr*m` (no m when mu = 0)."""
    lr = np.float32(config.lr)
    if config.momentum > 0:
        m = state[:, : w.shape[1]]
        m *= np.float32(config.momentum)
        m += g
        w -= lr * m
    else:
        w -= lr * g


def _adagrad(w: F32, state: F32, g: F32, config: OptimizerConfig) -> None:
    """`a += g*g; w -= lr*g/(sqrt(a)+eps)`."""
    a = state[:, : w.shape[1]]
    a += g * g
    w -= np.float32(config.lr) * g / (np.sqrt(a) + np.float32(config.eps))


def _rowwise_adagrad(w: F32, state: F32, g: F32, config: OptimizerConfig) -> None:
    """Adagrad with one accumulator per row, `a += mean(g*g)` (FBGEMM's row-wise Adagrad)."""
    a = state[:, :1]
    a += np.mean(g * g, axis=1, keepdims=True, dtype=np.float32)
    w -= np.float32(config.lr) * g / (np.sqrt(a) + np.float32(config.eps))


def _adam(w: F32, state: F32, g: F32, config: OptimizerConfig) -> None:
    """Adam with a per-row step t (state `[m | v | t]`).

    `t += 1; m = b1*m+(1-b1)*g; v = b2*v+(1-b2)*g*g; w -= lr*(m/(1-b1^t))/(sqrt(v/(1-b2^t))+eps)`.
    """
    d = w.shape[1]
    m = state[:, :d]
    v = state[:, d : 2 * d]
    t = state[:, 2 * d : 2 * d + 1]
    t += np.float32(1.0)
    b1, b2 = np.float32(config.beta1), np.float32(config.beta2)
    m *= b1
    m += (np.float32(1.0) - b1) * g
    v *= b2
    v += (np.float32(1.0) - b2) * g * g
    bias1 = np.float32(1.0) - np.power(b1, t)
    bias2 = np.float32(1.0) - np.power(b2, t)
    w -= np.float32(config.lr) * (m / bias1) / (np.sqrt(v / bias2) + np.float32(config.eps))


register_optimizer("none", None, description="vectors only, no update rule (write with put)")
register_optimizer(
    "sgd",
    _sgd,
    state_width=lambda config, d: d if config.momentum > 0 else 0,
    hyperparameters=("momentum",),
    description="SGD, with heavy-ball momentum when momentum > 0 (torch.optim.SGD)",
)
register_optimizer(
    "adagrad",
    _adagrad,
    state_width=lambda config, d: d,
    hyperparameters=("eps",),
    description="Adagrad, one accumulator per value (torch.optim.Adagrad)",
)
register_optimizer(
    "rowwise_adagrad",
    _rowwise_adagrad,
    state_width=lambda config, d: 1,
    hyperparameters=("eps",),
    description="row-wise Adagrad, one accumulator per row (FBGEMM)",
)
register_optimizer(
    "adam",
    _adam,
    state_width=lambda config, d: 2 * d + 1,  # m, v, per-row step t
    hyperparameters=("beta1", "beta2", "eps"),
    description="Adam with a per-row step count (torch.optim.Adam on the touched rows)",
)
