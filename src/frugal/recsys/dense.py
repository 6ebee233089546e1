"""The dense network's optimizer: plain SGD, or torch.optim's Adam and AdamW.

sync and hybrid trainers step it on the whole model after the AllReduce; in async mode each
`DenseShard` steps its own on its chunk of the flattened parameters, once per push. A
checkpoint holds the optimizer state in the model's layout (torch.optim's `state_dict` over
`model.parameters()`) whatever the mode and world size: `merge_chunk_states` builds it from
the async chunks' states and `chunk_state` cuts one chunk's part back out, so a checkpoint
resumes in any mode and onto any number of processes.

Shape legend: C chunk size, N flattened parameter count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol

import torch
from torch import Tensor

from frugal.recsys.errors import RecsysError

__all__ = [
    "DenseOptimizer",
    "DenseOptimizerName",
    "build_dense_optimizer",
    "chunk_state",
    "merge_chunk_states",
]

DenseOptimizerName = Literal["sgd", "adam", "adamw"]


class DenseOptimizer(Protocol):
    """What the trainers and `DenseShard` need of an optimizer (torch.optim's interface)."""

    def step(self) -> Any:
        """Update the parameters from their `.grad`."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The state a checkpoint keeps."""
        ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a `state_dict()`."""
        ...


class _DenseSGD:
    """Plain SGD on the dense parameters: `p -= lr * p.grad`.

    What torch.optim.SGD does without momentum or weight decay (bit-identical results,
    checked); used instead of it because its first construction imports torch._dynamo:
    seconds of start-up per trainer process.
    """

    def __init__(self, params: Sequence[Tensor], lr: float) -> None:
        self.params, self.lr = params, lr

    @torch.no_grad()
    def step(self) -> None:
        grads = [p.grad for p in self.params if p.grad is not None]
        torch._foreach_add_([p for p in self.params if p.grad is not None], grads, alpha=-self.lr)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "sgd", "lr": self.lr}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("kind") != "sgd" or state_dict.get("lr") != self.lr:
            raise RecsysError(
                f"the checkpoint's dense optimizer is {state_dict}, this job's sgd lr={self.lr}; "
                "resume with the same dense_optimizer and dense_lr"
            )


def build_dense_optimizer(
    params: Sequence[Tensor],
    kind: DenseOptimizerName,
    *,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
) -> DenseOptimizer:
    """The dense optimizer `kind` over `params`.

    Args:
        params: Leaf float32 tensors (the model's parameters, or one async chunk).
        kind: "sgd" (`p -= lr * grad`, no momentum), "adam" (torch.optim.Adam, L2
            `weight_decay` added to the gradient) or "adamw" (torch.optim.AdamW, decoupled
            decay `p *= 1 - lr * weight_decay`).
        lr: Learning rate, > 0.
        betas: Adam's moment decays (beta1, beta2).
        eps: Adam's denominator epsilon.
        weight_decay: Adam's L2 penalty or AdamW's decoupled decay; must be 0 for sgd.

    Returns:
        The optimizer (state_dict / load_state_dict as torch.optim's).

    Raises:
        ValueError: If `kind` is unknown, or `weight_decay` is not 0 with "sgd".

    References:
        Adam: A Method for Stochastic Optimization, ICLR 2015, arXiv 1412.6980 (Algorithm 1);
        Decoupled Weight Decay Regularization, ICLR 2019, arXiv 1711.05101 (Algorithm 2).
    """
    if kind == "sgd":
        if weight_decay:
            raise ValueError(
                f"weight_decay={weight_decay} needs kind 'adam' or 'adamw' (plain SGD has none)"
            )
        return _DenseSGD(params, lr)
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    raise ValueError(f"dense optimizer kind={kind!r} is unknown; choose 'sgd', 'adam' or 'adamw'")


def _is_torch_state(state: dict[str, Any]) -> bool:
    """Whether `state` is a torch.optim `state_dict` (the SGD one holds hyperparameters only)."""
    return "state" in state and "param_groups" in state


def _one_group(state: dict[str, Any]) -> dict[str, Any]:
    groups = state["param_groups"]
    if len(groups) != 1:
        raise RecsysError(f"the dense optimizer state has {len(groups)} param groups, not 1")
    return {key: value for key, value in groups[0].items() if key != "params"}


def merge_chunk_states(
    states: Sequence[dict[str, Any]], params: Sequence[Tensor]
) -> dict[str, Any]:
    """The optimizer state of `params` from the states of consecutive chunks of their vector.

    Args:
        states: `state_dict()` of each chunk's optimizer, in chunk order; the chunks
            concatenated are `parameters_to_vector(params)`. Every chunk has taken the same
            number of steps (async chunks do at a checkpoint: each rank pushed to each chunk
            once per step).
        params: The model's parameters, in `model.parameters()` order.

    Returns:
        A `state_dict()` for an optimizer over `params` (the chunks' hyperparameters); an
        SGD state as it is (it has no per-parameter state).

    Raises:
        RecsysError: If the chunks' step counts or sizes do not match `params`.

    Shapes:
        each chunk's moment tensors: (C,); concatenated: (N,) = total numel of `params`.
    """
    if not _is_torch_state(states[0]):
        return dict(states[0])
    group = _one_group(states[0])
    per_chunk = [state["state"].get(0) for state in states]
    merged: dict[str, Any] = {"state": {}, "param_groups": [{**group, "params": []}]}
    merged["param_groups"][0]["params"] = list(range(len(params)))
    if all(chunk is None for chunk in per_chunk):
        return merged  # no chunk has stepped yet
    if any(chunk is None for chunk in per_chunk):
        raise RecsysError("some dense chunks have optimizer state and some have none")
    total = sum(p.numel() for p in params)
    flat: dict[str, Tensor] = {}
    scalars: dict[str, Tensor] = {}
    for key, first in per_chunk[0].items():
        if first.dim() == 0:
            values = {float(chunk[key]) for chunk in per_chunk}
            if len(values) != 1:
                raise RecsysError(
                    f"the dense chunks' optimizer {key!r} differ ({sorted(values)}); a "
                    "checkpoint needs every rank's pushes applied"
                )
            scalars[key] = first
        else:
            flat[key] = torch.cat([chunk[key].reshape(-1) for chunk in per_chunk])
            if len(flat[key]) != total:
                raise RecsysError(
                    f"the dense chunks' {key!r} hold {len(flat[key])} values, the model {total}"
                )
    offset = 0
    for index, param in enumerate(params):
        n = param.numel()
        merged["state"][index] = {
            **{key: value.clone() for key, value in scalars.items()},
            **{
                key: value[offset : offset + n].view_as(param).clone()
                for key, value in flat.items()
            },
        }
        offset += n
    return merged


def chunk_state(
    state: dict[str, Any], params: Sequence[Tensor], start: int, stop: int
) -> dict[str, Any]:
    """The part of an optimizer state over `params` that covers elements [start, stop).

    The inverse of `merge_chunk_states`: the state of an optimizer over the one tensor
    `parameters_to_vector(params)[start:stop]` (an async `DenseShard`'s chunk).

    Args:
        state: `state_dict()` of an optimizer over `params` (or of a merge).
        params: The model's parameters, in `model.parameters()` order.
        start: First flattened element of the chunk, >= 0.
        stop: One past its last element, <= the total numel.

    Returns:
        A `state_dict()` for an optimizer over one (stop - start,) tensor; an SGD state as it is.

    Raises:
        RecsysError: If the parameters' step counts differ, or some have state and some none.

    Shapes:
        returned moment tensors: (C,) with C = stop - start.
    """
    if not _is_torch_state(state):
        return dict(state)
    chunk: dict[str, Any] = {"state": {}, "param_groups": [{**_one_group(state), "params": [0]}]}
    per_param = [state["state"].get(index) for index in range(len(params))]
    if all(entry is None for entry in per_param):
        return chunk
    if any(entry is None for entry in per_param):
        raise RecsysError("some dense parameters have optimizer state and some have none")
    values: dict[str, Tensor] = {}
    for key, first in per_param[0].items():
        if torch.is_tensor(first) and first.dim() == 0:
            steps = {float(entry[key]) for entry in per_param}
            if len(steps) != 1:
                raise RecsysError(
                    f"the dense parameters' optimizer {key!r} differ ({sorted(steps)}); "
                    "they cannot be cut into chunks"
                )
            values[key] = first.clone()
        else:
            vector_N = torch.cat([entry[key].reshape(-1) for entry in per_param])
            values[key] = vector_N[start:stop].clone()
    chunk["state"][0] = values
    return chunk
