"""The dense optimizer: config checks, Adam/AdamW against torch.optim, async chunks, resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn.utils import parameters_to_vector

from frugal.config import ConfigError
from frugal.recsys.checkpoint import check_compat, compat_fields
from frugal.recsys.config import RecsysTrainConfig, dense_weight_decay
from frugal.recsys.dense import DenseOptimizerName, chunk_state, merge_chunk_states
from frugal.recsys.errors import RecsysError
from frugal.recsys.ps import DenseShard
from frugal.recsys.trainer import _dense_optimizer


def test_config_checks_the_dense_optimizer_settings() -> None:
    with pytest.raises(ConfigError, match=r"dense_optimizer = 'lamb' is not allowed.*'adamw'"):
        RecsysTrainConfig(dense_optimizer="lamb")  # type: ignore[arg-type]  # the value refused
    with pytest.raises(ValueError, match=r"dense_betas=\(0.9, 1.0\) must each be in \[0, 1\)"):
        RecsysTrainConfig(dense_optimizer="adam", dense_betas=(0.9, 1.0))
    with pytest.raises(ValueError, match=r"dense_eps=0.0 must be > 0"):
        RecsysTrainConfig(dense_optimizer="adam", dense_eps=0.0)
    with pytest.raises(ValueError, match=r"dense_weight_decay=-0.1 must be >= 0"):
        RecsysTrainConfig(dense_optimizer="adamw", dense_weight_decay=-0.1)
    # Adam's settings with plain SGD would be ignored: refused, naming the fix
    with pytest.raises(ValueError, match=r"dense_weight_decay=0.1 applies to adam and adamw only"):
        RecsysTrainConfig(dense_weight_decay=0.1)
    with pytest.raises(ValueError, match=r"dense_betas=\(0.8, 0.99\) applies.*set dense_optimizer"):
        RecsysTrainConfig(dense_betas=(0.8, 0.99))
    with pytest.raises(ValueError, match=r"dense_eps=1e-06 applies to adam and adamw only"):
        RecsysTrainConfig(dense_eps=1e-6)
    RecsysTrainConfig(dense_weight_decay=0.0)  # no decay is what sgd does: accepted
    # None is torch's default: 0 for adam, 0.01 for adamw
    assert dense_weight_decay(RecsysTrainConfig(dense_optimizer="adam")) == 0.0
    assert dense_weight_decay(RecsysTrainConfig(dense_optimizer="adamw")) == 0.01
    assert (
        dense_weight_decay(RecsysTrainConfig(dense_optimizer="adam", dense_weight_decay=0.5)) == 0.5
    )


def _linear_loss_step(params: list[torch.Tensor], optimizer: Any) -> None:
    """One step on loss = 3 a - 0.5 b: a constant gradient (3, -0.5)."""
    for p in params:
        p.grad = None
    loss = 3.0 * params[0].sum() - 0.5 * params[1].sum()
    loss.backward()
    optimizer.step()


@pytest.mark.parametrize(
    ("kind", "weight_decay", "after_one", "after_two"),
    [
        # A constant gradient g gives Adam m_hat = g and v_hat = g^2 at every step, so each
        # step moves p by lr * g / (|g| + eps) = lr * sign(g) = (-0.1, +0.1).
        ("adam", None, (0.9, -1.9), (0.8, -1.8)),
        # AdamW (decay None = 0.01) first scales p by 1 - lr * decay = 0.999:
        # (1, -2) -> (0.999 - 0.1, -1.998 + 0.1) -> (0.899 * 0.999 - 0.1, -1.898 * 0.999 + 0.1)
        ("adamw", None, (0.899, -1.898), (0.798101, -1.796102)),
    ],
)
def test_trainer_dense_optimizer_steps_as_worked_out_and_as_torch(
    kind: DenseOptimizerName,
    weight_decay: float | None,
    after_one: tuple[float, float],
    after_two: tuple[float, float],
) -> None:
    config = RecsysTrainConfig(dense_optimizer=kind, dense_lr=0.1, dense_weight_decay=weight_decay)
    ours = [torch.tensor([1.0], requires_grad=True), torch.tensor([-2.0], requires_grad=True)]
    optimizer = _dense_optimizer(config)(ours)  # what every sync/hybrid trainer builds
    by_hand = [p.detach().clone().requires_grad_(True) for p in ours]
    torch_class = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
    reference = torch_class(
        by_hand, lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01 if kind == "adamw" else 0.0
    )
    for expected in (after_one, after_two):
        _linear_loss_step(ours, optimizer)
        _linear_loss_step(by_hand, reference)
        got = [float(p.detach()) for p in ours]
        assert got == pytest.approx(expected, abs=1e-6)
        assert got == [float(p.detach()) for p in by_hand]  # bit-identical to torch.optim
    ours_state, reference_state = optimizer.state_dict(), reference.state_dict()
    assert ours_state["param_groups"] == reference_state["param_groups"]
    for index in (0, 1):
        for key, value in reference_state["state"][index].items():
            torch.testing.assert_close(ours_state["state"][index][key], value, rtol=0, atol=0)


def test_adam_with_l2_decay_and_sgd_match_torch() -> None:
    for kind, torch_optimizer in (
        (
            "adam",
            lambda ps: torch.optim.Adam(ps, lr=0.05, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.5),
        ),
        ("sgd", lambda ps: torch.optim.SGD(ps, lr=0.05)),
    ):
        settings: dict[str, Any] = {"dense_optimizer": kind, "dense_lr": 0.05}
        if kind == "adam":
            settings |= {"dense_betas": (0.8, 0.99), "dense_eps": 1e-6, "dense_weight_decay": 0.5}
        ours = [
            torch.tensor([1.0, 4.0], requires_grad=True),
            torch.tensor([-2.0], requires_grad=True),
        ]
        by_hand = [p.detach().clone().requires_grad_(True) for p in ours]
        optimizer = _dense_optimizer(RecsysTrainConfig(**settings))(ours)
        reference = torch_optimizer(by_hand)
        for _ in range(3):
            _linear_loss_step(ours, optimizer)
            _linear_loss_step(by_hand, reference)
        for a, b in zip(ours, by_hand, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert not torch.equal(ours[0], torch.tensor([1.0, 4.0]))  # it did move


def _shards(vector: torch.Tensor, world_size: int, config: RecsysTrainConfig) -> list[DenseShard]:
    return [
        DenseShard(chunk, 2, optimizer=_dense_optimizer(config))
        for chunk in vector.tensor_split(world_size)
    ]


def _push_round(shards: list[DenseShard], grads_N: list[torch.Tensor]) -> None:
    """Each rank's push, in rank order, to every chunk: its slice of that rank's gradient."""
    for rank, grad_N in enumerate(grads_N):
        for shard, grad_C in zip(shards, grad_N.tensor_split(len(shards)), strict=True):
            shard.push(grad_C, shard.version, rank)


@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_async_chunks_step_as_torch_and_reshard_through_the_model_layout(
    kind: DenseOptimizerName,
) -> None:
    # A model of 7 parameters: a (2, 2) weight and a (3,) bias; async splits the flat vector
    # into 4 + 3 on two ranks, each rank pushes its gradient / 2 to both chunks every step.
    config = RecsysTrainConfig(
        mode="async", dense_optimizer=kind, dense_lr=0.01, dense_betas=(0.8, 0.9),
        dense_weight_decay=0.1,
    )  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    params = [torch.randn(2, 2, generator=generator), torch.randn(3, generator=generator)]
    shards = _shards(parameters_to_vector(params), 2, config)
    # torch.optim over the model's parameters, one step per push in the same order
    by_hand = [p.clone() for p in params]
    torch_class = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
    reference = torch_class(by_hand, lr=0.01, betas=(0.8, 0.9), eps=1e-8, weight_decay=0.1)

    def train(shards: list[DenseShard], steps: int) -> None:
        for _ in range(steps):
            grads_N = [torch.randn(7, generator=generator) / 2 for _ in range(2)]
            _push_round(shards, grads_N)
            for grad_N in grads_N:
                offset = 0
                for p in by_hand:
                    p.grad = grad_N[offset : offset + p.numel()].view_as(p)
                    offset += p.numel()
                reference.step()

    train(shards, 3)
    torch.testing.assert_close(
        torch.cat([s.pull()[0] for s in shards]), parameters_to_vector(by_hand), rtol=0, atol=0
    )
    # the chunks' states merged into the model's layout are torch's state over the model
    merged = merge_chunk_states([s.optimizer_state_dict() for s in shards], by_hand)
    want = reference.state_dict()
    assert merged["param_groups"] == want["param_groups"]
    for index in (0, 1):
        assert merged["state"][index].keys() == want["state"][index].keys()
        for key, value in want["state"][index].items():
            torch.testing.assert_close(merged["state"][index][key], value, rtol=0, atol=0)
    assert float(want["state"][0]["step"]) == 6  # one Adam step per push: 2 ranks x 3 steps
    # resume onto three chunks (4 + 3 -> 3 + 2 + 2): cut the merged state, keep training
    current = parameters_to_vector(by_hand)
    three = _shards(current, 3, config)
    start = 0
    for shard in three:
        stop = start + len(shard.params)
        shard.load_optimizer_state_dict(chunk_state(merged, by_hand, start, stop))
        start = stop
    train(three, 2)
    torch.testing.assert_close(
        torch.cat([s.pull()[0] for s in three]), parameters_to_vector(by_hand), rtol=0, atol=0
    )
    # without the state the three chunks would have restarted Adam: not the same values
    fresh = _shards(current, 3, config)
    _push_round(fresh, [torch.ones(7), -torch.ones(7)])
    restarted = torch.cat([s.pull()[0] for s in fresh])
    assert not torch.equal(restarted, current)


def test_merge_refuses_chunks_at_different_steps() -> None:
    config = RecsysTrainConfig(mode="async", dense_optimizer="adam")
    shards = _shards(torch.zeros(4), 2, config)
    shards[0].push(torch.ones(2), 0, 0)
    shards[0].push(torch.ones(2), 1, 1)
    shards[1].push(torch.ones(2), 0, 0)
    with pytest.raises(RecsysError, match=r"optimizer 'step' differ \(\[1.0, 2.0\]\)"):
        merge_chunk_states([s.optimizer_state_dict() for s in shards], [torch.zeros(4)])


def test_sgd_chunks_are_plain_sgd() -> None:
    shards = _shards(torch.tensor([1.0, 2.0, 3.0]), 2, RecsysTrainConfig(dense_lr=0.5))
    _push_round(shards, [torch.tensor([1.0, 2.0, 4.0]), torch.tensor([1.0, 0.0, 0.0])])
    # p -= 0.5 * g per push: (1, 2, 3) - 0.5 * ((1, 2, 4) + (1, 0, 0)) = (0, 1, 1)
    assert torch.cat([s.pull()[0] for s in shards]).tolist() == [0.0, 1.0, 1.0]
    assert merge_chunk_states([s.optimizer_state_dict() for s in shards], []) == {
        "kind": "sgd",
        "lr": 0.5,
    }


def _saved(config: RecsysTrainConfig) -> dict[str, Any]:
    """A manifest's compat fields as they come back from MANIFEST.json."""
    saved: dict[str, Any] = json.loads(json.dumps(compat_fields(config)))
    return saved


def test_resume_refuses_another_dense_optimizer_naming_both(tmp_path: Path) -> None:
    sgd = RecsysTrainConfig()
    adam = RecsysTrainConfig(dense_optimizer="adam", dense_lr=1e-3)
    adamw = RecsysTrainConfig(dense_optimizer="adamw", dense_lr=1e-3)
    for config in (sgd, adam, adamw):
        check_compat(tmp_path, _saved(config), config)  # its own checkpoint: accepted
    with pytest.raises(
        RecsysError,
        match=r"written with dense_optimizer='sgd', this job has dense_optimizer='adam'; "
        r"resume with dense_optimizer='sgd' or use a new checkpoint_dir",
    ):
        check_compat(tmp_path, _saved(sgd) | {"dense_lr": 1e-3}, adam)
    with pytest.raises(RecsysError, match=r"dense_optimizer='adamw', this job has .*'adam'"):
        check_compat(tmp_path, _saved(adamw), adam)
    with pytest.raises(RecsysError, match=r"dense_optimizer='adam', this job has .*'sgd'"):
        check_compat(tmp_path, _saved(adam) | {"dense_lr": 0.05}, sgd)
    # a checkpoint written before the dense optimizer was a setting holds sgd's state
    earlier = {
        k: v for k, v in _saved(sgd).items() if not k.startswith("dense_") or k == "dense_lr"
    }
    assert "dense_optimizer" not in earlier
    check_compat(tmp_path, earlier, sgd)
    with pytest.raises(RecsysError, match=r"dense_optimizer='sgd', this job has .*'adam'"):
        check_compat(tmp_path, earlier | {"dense_lr": 1e-3}, adam)
    # Adam's hyperparameters too (torch.optim would silently take the checkpoint's)
    with pytest.raises(RecsysError, match=r"dense_betas=\[0.9, 0.999\], this job has"):
        check_compat(tmp_path, _saved(adam), RecsysTrainConfig(
            dense_optimizer="adam", dense_lr=1e-3, dense_betas=(0.9, 0.99)
        ))  # fmt: skip
    # the weight decay is compared as resolved: None and torch's default are the same
    check_compat(tmp_path, _saved(adamw), RecsysTrainConfig(
        dense_optimizer="adamw", dense_lr=1e-3, dense_weight_decay=0.01
    ))  # fmt: skip
