"""Store optimizers come from a registry: a user's update rule plugs in with one call."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from frugal.store import EmbeddingStore, OptimizerConfig, RowSpec, apply_optimizer, init_rows
from frugal.store.optimizers import OPTIMIZERS, optimizer_names, register_optimizer

F32 = npt.NDArray[np.float32]


def _signum(w: F32, state: F32, g: F32, config: OptimizerConfig) -> None:
    """Sign-SGD with momentum (signSGD, ICML 2018): m = b1*m + (1-b1)*g; w -= lr*sign(m)."""
    m = state[:, : w.shape[1]]
    m *= np.float32(config.beta1)
    m += (np.float32(1.0) - np.float32(config.beta1)) * g
    w -= np.float32(config.lr) * np.sign(m)


@pytest.fixture
def signum() -> Iterator[str]:
    register_optimizer(
        "signum",
        _signum,
        state_width=lambda config, embedding_dim: embedding_dim,
        hyperparameters=("beta1",),
        description="sign-SGD with momentum",
    )
    yield "signum"
    OPTIMIZERS.unregister("signum")


@pytest.fixture
def adagrad_from_a_tenth() -> Iterator[str]:
    # torch.optim.Adagrad's initial_accumulator_value=0.1, as a user rule with an init.
    adagrad = OPTIMIZERS.get("adagrad")
    register_optimizer(
        "adagrad_init",
        adagrad.update,
        state_width=adagrad.state_width,
        init_state=lambda config, embedding_dim: np.full(embedding_dim, 0.1, np.float32),
        hyperparameters=("eps",),
    )
    yield "adagrad_init"
    OPTIMIZERS.unregister("adagrad_init")


def test_the_built_in_rules_are_registered() -> None:
    assert optimizer_names()[:5] == ("none", "sgd", "adagrad", "rowwise_adagrad", "adam")
    widths = [OptimizerConfig(kind=k).state_width(8) for k in optimizer_names()[:5]]
    assert widths == [0, 0, 8, 1, 17]  # adam: m, v (8 each) and the step count


def test_an_unknown_rule_and_a_momentum_it_ignores_are_refused(signum: str) -> None:
    with pytest.raises(ValueError, match=r"kind='lion' is not a registered store optimizer"):
        OptimizerConfig(kind="lion")
    with pytest.raises(ValueError, match=r"momentum=0\.5 applies to kind='sgd' only"):
        OptimizerConfig(kind="signum", momentum=0.5)  # signum reads beta1, not momentum


def test_the_store_applies_a_registered_rule(tmp_path: Path, signum: str) -> None:
    spec = RowSpec(embedding_dim=2, optimizer=OptimizerConfig(kind="signum", lr=0.5, beta1=0.5))
    config = EmbeddingStore.Config(backend="memory", memory_budget_bytes=1 << 20)
    store = EmbeddingStore.create(tmp_path / "t", num_rows=4, spec=spec, config=config)
    with store:
        w0 = store.peek(np.array([1]))[0, :2].copy()
        assert store.peek(np.array([1])).shape == (1, 4)  # [w (2) | m (2)], m starts at 0
        store.apply_gradients(np.array([1]), np.array([[2.0, -4.0]], np.float32), step=0)
        # m = 0.5 * 0 + 0.5 * (2, -4) = (1, -2); w = w0 - 0.5 * sign(m) = w0 + (-0.5, 0.5)
        row = store.peek(np.array([1]))[0]
        np.testing.assert_array_equal(row[2:], [1.0, -2.0])
        np.testing.assert_array_equal(row[:2], w0 + np.float32([-0.5, 0.5]))
        store.apply_gradients(np.array([1]), np.array([[-6.0, 1.0]], np.float32), step=1)
        # m = 0.5 * (1, -2) + 0.5 * (-6, 1) = (-2.5, -0.5); sign (-1, -1): w += (0.5, 0.5)
        row = store.peek(np.array([1]))[0]
        np.testing.assert_array_equal(row[2:], [-2.5, -0.5])
        np.testing.assert_array_equal(row[:2], w0 + np.float32([-0.5, 0.5]) + np.float32(0.5))


def test_a_registered_initial_state_starts_every_row(adagrad_from_a_tenth: str) -> None:
    spec = RowSpec(embedding_dim=2, optimizer=OptimizerConfig(kind=adagrad_from_a_tenth, lr=1.0))
    rows = init_rows(np.arange(3, dtype=np.int64), spec, seed=0)
    np.testing.assert_array_equal(rows[:, 2:], np.float32(0.1))
    w0 = rows[0, :2].copy()
    apply_optimizer(rows[:1], np.array([[0.3, 0.0]], np.float32), spec)
    # a = 0.1 + 0.09 = 0.19; w -= 1.0 * 0.3 / (sqrt(0.19) + 1e-8) = 0.688 (second: g = 0)
    np.testing.assert_allclose(rows[0, 2:], [0.19, 0.1], rtol=1e-6)
    np.testing.assert_allclose(rows[0, :2], w0 - [0.3 / np.sqrt(0.19), 0.0], rtol=1e-6)
