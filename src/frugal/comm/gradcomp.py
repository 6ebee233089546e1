"""Data-parallel gradient compression between the replicas of one pipeline stage.

A stage replicated K times must agree on one update per step. `GradientSync` does that over a
process group (one per stage, never WORLD) with one of `DP_METHODS`, a registry of
`DPMethodSpec`s (`register_dp_method` adds one, from inside or outside the package):

- `none`: float32 sum of the flat gradient over the replicas, by the collective the plan
  priced for the stage (`frugal.comm.collectives`: ring all-reduce, central parameter server
  or sequential peer exchange).
- `fp16`: torch's own DDP comm hook `fp16_compress_hook` (cast, divide by K, all-reduce in
  float16, cast back); half the bytes.
- `powersgd`: torch's own DDP comm hook `powerSGD_hook` (rank-r factors P, Q of every matrix
  gradient, error feedback, warm start; vectors are all-reduced uncompressed; plain all-reduce
  for the first `max(2, warmup_steps)` steps).
- `ef-kbit`: the gradient itself through the k-bit sharded parameter server
  (`frugal.comm.sharded_ps.ShardedExchange`), then AdamW as usual.
- `qadam`: AQ-SGD's reference data parallelism (DS3Lab/AC-SGD, `ShardedPSDPCompressed`):
  after the warm-up each rank folds its *local* gradient into Adam's first moment m and the
  ranks average m through the k-bit sharded parameter server; Adam's second moment is frozen
  at its warm-up value (bias-corrected, as 1-bit Adam; see `QAdamMethod.apply`). Warm-up
  steps sum the float32 gradient and run Adam.

The torch hooks all-reduce inside (a ring), and the sharded parameter server sends each
1/K chunk to its owner and all-gathers the owners' chunks (the traffic of `seq_peer`), so
those methods run one collective only (`DPMethodSpec.collectives`); a plan that priced
another one for their stage is refused (`DPMethodSpec.check_collective`).

Bytes are known up front (`dp_wire_bytes`) and measured at run time from the tensors handed to
the collectives (the torch hooks' all-reduces are counted by wrapping
`torch.distributed.all_reduce` while a hook runs).

Shape legend: n values of the flat gradient, K replicas.

References:
    Fine-tuning Language Models over Slow Networks using Activation Compression with
    Guarantees, NeurIPS 2022, arXiv 2206.01299 (section 5, "AQ-SGD with gradient
    compression"; reference code DS3Lab/AC-SGD, data_parallel/dist_dp_sharded_ps_compressed.py).
    PowerSGD: Practical Low-Rank Gradient Compression for Distributed Optimization, NeurIPS
    2019, arXiv 1905.13727 (torch's `powerSGD_hook`).
    1-bit Adam: Communication Efficient Large-Scale Training with Adam's Convergence Speed,
    ICML 2021, arXiv 2102.02888 (frozen variance, compressed momentum with error feedback).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import Tensor

from frugal.comm.collectives import COLLECTIVES, DPSyncError
from frugal.comm.shaped import ShapedGroup
from frugal.comm.sharded_ps import BucketQuantizer, ErrorFeedback, ShardedExchange, padded_length
from frugal.parallel.plan import PlanMismatchError
from frugal.registry import Registry

__all__ = [
    "DP_METHODS",
    "BucketQuantizer",
    "DPMethod",
    "DPMethodSpec",
    "DPSettings",
    "DPSyncError",
    "EFKbitMethod",
    "ErrorFeedback",
    "FP16Method",
    "GradientSync",
    "NoCompressionMethod",
    "PowerSGDMethod",
    "QAdamMethod",
    "ShardedExchange",
    "TorchHookMethod",
    "dp_wire_bytes",
    "powersgd_numel",
    "qadam_update",
    "register_dp_method",
]

_BETAS = (0.9, 0.999)
_EPS = 1e-8
_ADAM_RATIO_BOUND = (
    (1 - _BETAS[0]) / (1 - _BETAS[1]) ** 0.5 / (1 - _BETAS[0] ** 2 / _BETAS[1]) ** 0.5
)
"""The largest |m / sqrt(v)| Adam itself can reach, (1 - b1) / sqrt(1 - b2) / sqrt(1 - b1^2 / b2)
= 7.27 (Cauchy-Schwarz over the gradient history): qadam clips each element's normalised step to
it, so a weight whose warm-up gradients were all zero (v frozen at 0) moves at most as far per
step as Adam could ever move it, instead of m / eps."""


def powersgd_numel(shapes: Sequence[tuple[int, ...]], rank: int) -> int:
    """Values torch's powerSGD_hook all-reduces per step once compressing (P, Q and vectors).

    Per gradient viewed as an (n, m) matrix (n = first dimension): r = min(n, m, rank); the
    hook sends P (n r) and Q (m r) when (n + m) r x 2 < n m (its `min_compression_rate` 2),
    else the n m values themselves.
    """
    total = 0
    for shape in shapes:
        n = shape[0] if shape else 1
        m = math.prod(shape) // n if n else 0
        r = min(n, m, rank)
        compressed = (n + m) * r
        total += compressed if compressed * 2 < n * m else n * m
    return total


DPMethod = str
"""A DP compression method's name: a key of `DP_METHODS` (built in: "none", "fp16",
"powersgd", "ef-kbit", "qadam")."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DPSettings:
    """The knobs of the DP compression methods; each method reads the ones it uses.

    Attributes:
        bits: Bits per value of the k-bit exchanges (ef-kbit, qadam), 1..8.
        bucket_size: Values per fp16 scale of the k-bit exchanges, >= 1.
        powersgd_rank: PowerSGD's matrix_approximation_rank, >= 1.
        warmup_steps: Steps synchronised in float32 first, >= 0.
    """

    bits: int = 8
    bucket_size: int = 512
    powersgd_rank: int = 1
    warmup_steps: int = 0


class DPMethodSpec:
    """One DP compression method: its checks, its wire size and what one step does.

    A method is a subclass registered with `register_dp_method`; `GradientSync` looks it up in
    `DP_METHODS` and never branches on its name. `setup` builds the per-group state (kept as
    `GradientSync.state`), `step` synchronises one step's gradients and returns the bytes it
    handed to the collectives, which must equal `wire_bytes` of that step. A method whose
    `owns_optimizer` is True replaces the optimizer's step by `apply`.

    Attributes:
        description: One line for messages and the docs.
        uses_bits: Whether `DPSettings.bits` applies (`--dp-bits`).
        owns_optimizer: Whether `apply` replaces the optimizer's step.
        min_warmup_steps: Float32 steps the method needs before it compresses.
        warmup_reason: Why it needs them, for the error message.
        requires_replicas: Whether choosing it without data-parallel replicas is an error
            (False for the plain float32 sum, which is what a single replica does anyway).
        collectives: The plan collectives (`frugal.comm.collectives.COLLECTIVES` names) its
            exchange can run; None = any, because every exchange goes through
            `GradientSync.all_reduce`, which runs the stage's planned collective.
        checkpointable: Whether `state_dict` / `load_state_dict` save and restore its whole
            state (a pipeline job with checkpoints refuses a method that cannot).
    """

    description: str = ""
    uses_bits: bool = False
    owns_optimizer: bool = False
    min_warmup_steps: int = 0
    warmup_reason: str = ""
    requires_replicas: bool = True
    collectives: frozenset[str] | None = None
    checkpointable: bool = True

    def state_dict(self, sync: GradientSync) -> dict[str, Any]:
        """The method's state for a checkpoint: tensors and numbers only ({} if stateless)."""
        return {}

    def load_state_dict(self, sync: GradientSync, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (into a freshly set-up `sync.state`)."""

    def check_collective(self, name: str, collective: str, *, stage: int | None = None) -> None:
        """Refuse a planned collective this method's exchange cannot run.

        Args:
            name: The method's registered name (for the message).
            collective: The collective the plan priced for the stage.
            stage: The stage, for the message (None: not named).

        Raises:
            PlanMismatchError: If `collectives` is set and lacks `collective`.
        """
        if self.runs_collective(collective):
            return
        own = " or ".join(sorted(self.collectives or ()))
        able = " or ".join(m for m in DP_METHODS if DP_METHODS.get(m).runs_collective(collective))
        where = f"stage {stage}'s" if stage is not None else "the"
        raise PlanMismatchError(
            f"the plan priced {where} data-parallel exchange as {collective!r} but "
            f"dp_compression={name!r} always exchanges by {own}; run with --dp-compress "
            f"{able}, or plan again restricted to it: frugal plan ... --set "
            f"'workload.dp_collectives={json.dumps(sorted(self.collectives or ()))}'"
        )

    def runs_collective(self, collective: str) -> bool:
        """Whether the method's exchange can run `collective`."""
        return self.collectives is None or collective in self.collectives

    def check_warmup(self, name: str, warmup_steps: int, *, also: str = "") -> None:
        """Refuse fewer than `min_warmup_steps` warm-up steps.

        Args:
            name: The method's registered name (for the message).
            warmup_steps: The job's warm-up steps.
            also: Another fix to name first ("a plan with ... and "), or "".

        Raises:
            ValueError: If warmup_steps < min_warmup_steps.
        """
        if warmup_steps < self.min_warmup_steps:
            raise ValueError(
                f"dp_compression={name!r} {self.warmup_reason}; set {also}warmup_steps >= "
                f"{self.min_warmup_steps}"
            )

    def wire_bytes(
        self, shapes: Sequence[tuple[int, ...]], group_size: int, step: int, settings: DPSettings
    ) -> int:
        """S, the bytes per rank `step` hands to the collectives.

        Args:
            shapes: The synchronised parameters' shapes, in order.
            group_size: K, the replicas.
            step: The step, from 0.
            settings: The method's knobs.
        """
        raise NotImplementedError

    def setup(self, sync: GradientSync) -> Any:
        """The per-group state of the method (None by default), kept as `sync.state`."""
        return None

    def step(self, sync: GradientSync, flat: Tensor, step: int) -> int:
        """Synchronise this step: set every parameter's .grad to the sum over replicas.

        Args:
            sync: The group's `GradientSync` (its state, `all_reduce`, `set_grads`).
            flat: This replica's flat gradient, (n,) float32.
            step: The step, from 0.

        Returns:
            S, the bytes handed to the collectives.

        Raises:
            DPSyncError: If a collective fails or times out.
        """
        raise NotImplementedError

    def apply(self, sync: GradientSync) -> None:
        """The optimizer step of a method that owns it.

        Raises:
            RuntimeError: Always, for a method that leaves the optimizer alone.
        """
        raise RuntimeError(
            f"apply() belongs to a method that owns the optimizer, not {sync.method!r}"
        )


DP_METHODS: Registry[DPMethodSpec] = Registry("DP compression method", field="dp_compression")
"""Every DP compression method `dp_compression` may name, built-in ones first."""


def register_dp_method(name: str, spec: DPMethodSpec, *, replace: bool = False) -> DPMethodSpec:
    """Make `name` a valid `dp_compression` (and `--dp-compress` choice).

    Registration is per process: torchrun workers only know methods registered on importing
    frugal.

    Args:
        name: The method's name, as users write it.
        spec: The method.
        replace: Whether to replace a method registered under the same name.

    Returns:
        `spec`.

    Raises:
        ValueError: If `name` is empty or taken and `replace` is False.
    """
    return DP_METHODS.register(name, spec, replace=replace)


def dp_wire_bytes(
    method: str,
    shapes: Sequence[tuple[int, ...]],
    group_size: int,
    step: int,
    *,
    bits: int = 8,
    bucket_size: int = 512,
    powersgd_rank: int = 1,
    warmup_steps: int = 0,
) -> int:
    """S, the bytes per rank per step that `GradientSync.step` hands to its collectives.

    none 4 n; fp16 2 n; powersgd 4 x `powersgd_numel` (4 n during its first
    max(2, warmup_steps) steps); ef-kbit and qadam K x P with P the chunk payload of the
    sharded parameter server (4 n during the warm-up). A ring all-reduce of S bytes and the
    sharded parameter server both send 2 (K - 1) S / K bytes per rank.

    Raises:
        ConfigError: If the method is not registered (a ValueError naming every method).
    """
    settings = DPSettings(
        bits=bits, bucket_size=bucket_size, powersgd_rank=powersgd_rank, warmup_steps=warmup_steps
    )
    return DP_METHODS.get(method).wire_bytes(shapes, group_size, step, settings)


def _float32_bytes(shapes: Sequence[tuple[int, ...]]) -> int:
    return 4 * sum(math.prod(s) for s in shapes)


def _sharded_bytes(shapes: Sequence[tuple[int, ...]], group_size: int, settings: DPSettings) -> int:
    """K x P: the sharded parameter server's all-to-all input (see `ShardedExchange`)."""
    n = sum(math.prod(s) for s in shapes)
    chunk = padded_length(n, group_size, settings.bucket_size) // group_size
    return group_size * BucketQuantizer(settings.bits, settings.bucket_size).payload_bytes(chunk)


class _Bucket:
    """What torch's DDP comm hooks read from a `dist.GradBucket` (Python cannot build one).

    One bucket (index 0, the last) holding every gradient of the stage, flat.
    """

    def __init__(self, flat: Tensor, params: Sequence[Tensor]) -> None:
        self._flat = flat
        self._params = list(params)
        self._views: list[Tensor] = []
        offset = 0
        for p in self._params:
            self._views.append(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()

    def buffer(self) -> Tensor:
        return self._flat

    def index(self) -> int:
        return 0

    def is_last(self) -> bool:
        return True

    def gradients(self) -> list[Tensor]:
        return self._views

    def parameters(self) -> list[Tensor]:
        return self._params

    def set_buffer(self, tensor: Tensor) -> None:
        self._flat.copy_(tensor)


class _DoneWork:
    """A finished `dist.Work` of a shaped all-reduce (what torch's hooks chain on)."""

    def __init__(self, tensor: Tensor) -> None:
        self._tensor = tensor

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future[list[Tensor]]:
        future: torch.futures.Future[list[Tensor]] = torch.futures.Future()
        future.set_result([self._tensor])
        return future


@contextlib.contextmanager
def _counting_all_reduce(counts: list[int], shaped: ShapedGroup | None = None) -> Iterator[None]:
    """Count the bytes of every tensor torch.distributed.all_reduce gets while inside.

    With `shaped`, the all-reduce itself runs as a shaped ring (`ShapedGroup.ring_sum_`).
    """
    original = dist.all_reduce

    def counting(tensor: Tensor, *args: Any, **kwargs: Any) -> Any:
        counts.append(tensor.numel() * tensor.element_size())
        if shaped is None:
            return original(tensor, *args, **kwargs)
        shaped.ring_sum_(tensor, "a DDP comm hook's all-reduce")  # the hooks sum (the default)
        return _DoneWork(tensor) if kwargs.get("async_op") else None

    setattr(dist, "all_reduce", counting)  # noqa: B010  (the hooks look it up at call time)
    try:
        yield
    finally:
        setattr(dist, "all_reduce", original)  # noqa: B010


def qadam_update(
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    *,
    adam_steps: int,
    variance_steps: int,
    learning_rate: float,
) -> Tensor:
    """The parameter change of qadam: -lr clip(m_hat / (sqrt(v_hat) + eps), +-7.27).

    m_hat = m / (1 - b1^t) with t = `adam_steps`; v_hat = v / (1 - b2^w) with w =
    `variance_steps` (frozen after the warm-up). The clip is `_ADAM_RATIO_BOUND`.

    Shapes:
        exp_avg, exp_avg_sq: (P,) -> (P,).

    References:
        Fine-tuning Language Models over Slow Networks using Activation Compression with
        Guarantees, NeurIPS 2022, arXiv 2206.01299 (momentum compression); 1-bit Adam,
        ICML 2021, arXiv 2102.02888 (frozen variance after a warm-up).
    """
    beta1, beta2 = _BETAS
    denom = (exp_avg_sq / (1 - beta2**variance_steps)).sqrt_().add_(_EPS)
    ratio = (exp_avg / (1 - beta1**adam_steps)).div_(denom)
    return ratio.clamp_(-_ADAM_RATIO_BOUND, _ADAM_RATIO_BOUND).mul_(-learning_rate)


class GradientSync:
    """Agree on gradients (or Adam's momentum) across the replicas of one stage.

    Call `step(step)` after the backward passes of a step: it replaces every parameter's
    .grad by the sum over replicas (none, fp16, powersgd, ef-kbit; each replica's loss is
    already divided by the micro-batches of all replicas, so the sum is the macro-batch mean)
    and returns S, the bytes handed to the collectives. For a method that owns the optimizer
    (`qadam`), `step` exchanges the momentum instead and `apply()` must be called in place of
    the optimizer's step. What each method does is its `DPMethodSpec` in `DP_METHODS`.

    Args:
        method: A name in `DP_METHODS`.
        params: The stage's parameters (fixed order, same on every replica).
        group: The stage's data-parallel process group.
        bits: Bits of ef-kbit / qadam, 1..8 (the reference: 8).
        bucket_size: Values per fp16 scale (ef-kbit, qadam).
        powersgd_rank: PowerSGD's matrix_approximation_rank, >= 1.
        warmup_steps: Steps synchronised in float32 first (ef-kbit, qadam; PowerSGD starts at
            max(2, warmup_steps)); qadam needs >= 1 (its frozen variance comes from them).
        learning_rate: qadam's Adam learning rate (the others leave the optimizer alone).
        timeout_s: Limit of every collective.
        collective: The stage's planned collective (`frugal.comm.collectives.COLLECTIVES`),
            which `all_reduce` runs; "" = not planned (a ring, and any method may run).
        shaped: Run every exchange as messages through the emulated links of the group's
            members (`frugal.comm.shaped.ShapedGroup`); None = torch.distributed's
            collectives on the real transport.

    Raises:
        ValueError: If an argument is out of range or the method is not registered.
        PlanMismatchError: If the method cannot run `collective` (a ValueError).
    """

    def __init__(
        self,
        method: str,
        params: Sequence[Tensor],
        group: dist.ProcessGroup,
        *,
        bits: int = 8,
        bucket_size: int = 512,
        powersgd_rank: int = 1,
        warmup_steps: int = 0,
        learning_rate: float = 1e-3,
        timeout_s: float = 120.0,
        collective: str = "",
        shaped: ShapedGroup | None = None,
    ) -> None:
        self.shaped = shaped
        self.spec = DP_METHODS.get(method)
        self.collective = COLLECTIVES.get(collective or "ring")
        own = sorted(self.spec.collectives or ())
        self.collective_name = collective or (own[0] if own else "ring")
        """The collective this exchange runs (the planned one, else its own or a ring)."""
        if collective:
            self.spec.check_collective(method, collective)
        if isinstance(bits, bool) or not 1 <= bits <= 8:
            raise ValueError(f"dp_bits={bits} must be in [1, 8]")
        if powersgd_rank < 1:
            raise ValueError(f"powersgd_rank={powersgd_rank} must be >= 1")
        self.spec.check_warmup(method, warmup_steps)
        self.method = method
        self.params = list(params)
        self.shapes = [tuple(p.shape) for p in self.params]
        self.numel = sum(p.numel() for p in self.params)
        self.group = group
        self.size = dist.get_world_size(group)
        self.settings = DPSettings(
            bits=bits,
            bucket_size=bucket_size,
            powersgd_rank=powersgd_rank,
            warmup_steps=warmup_steps,
        )
        self.learning_rate = learning_rate
        self.timeout_s = timeout_s
        self.state: Any = self.spec.setup(self)

    @property
    def owns_optimizer(self) -> bool:
        """Whether `apply()` replaces the optimizer's step (qadam)."""
        return self.spec.owns_optimizer

    def wire_bytes(self, step: int) -> int:
        """The analytic S of `step` (`dp_wire_bytes`)."""
        return self.spec.wire_bytes(self.shapes, self.size, step, self.settings)

    def _grads(self) -> Tensor:
        return torch.cat(
            [
                (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                for p in self.params
            ]
        )

    def set_grads(self, flat: Tensor) -> None:
        """Copy the (n,) flat vector into the parameters' .grad, in order."""
        offset = 0
        for p in self.params:
            value = flat[offset : offset + p.numel()].view_as(p)
            if p.grad is None:
                p.grad = value.clone()
            else:
                p.grad.copy_(value)
            offset += p.numel()

    def all_reduce(self, flat: Tensor, step: int) -> int:
        """Sum `flat` over the group in place, uncompressed, by the planned collective.

        Returns:
            S, the vector's bytes.

        Raises:
            DPSyncError: If the collective fails or times out.
        """
        what = f"step {step}: gradient {self.collective.description}"
        if self.shaped is not None:
            self.collective.shaped_sum_(flat, self.shaped, what=what)
        else:
            self.collective.sum_(flat, self.group, what=what, timeout_s=self.timeout_s)
        return flat.numel() * flat.element_size()

    def run_hook(
        self, hook: Callable[[Any], torch.futures.Future[Tensor]], flat: Tensor, step: int
    ) -> tuple[Tensor, int]:
        """Run a torch DDP comm hook on one bucket holding `flat`: (sum over replicas, bytes).

        Args:
            hook: Called with the (duck-typed) `dist.GradBucket`; returns the hook's future.
            flat: This replica's flat gradient.
            step: The step (for messages).

        Raises:
            DPSyncError: If the hook fails or does not finish within the timeout.
        """
        bucket = cast(Any, _Bucket(flat, self.params))  # duck-typed dist.GradBucket
        counts: list[int] = []
        with _counting_all_reduce(counts, self.shaped):
            future = hook(bucket)
            deadline = time.monotonic() + self.timeout_s
            while not future.done():
                if time.monotonic() > deadline:
                    raise DPSyncError(
                        f"step {step}: the {self.method} hook did not finish in {self.timeout_s} s"
                    )
                time.sleep(1e-4)
            try:
                mean = future.wait()
            except RuntimeError as exc:
                raise DPSyncError(
                    f"step {step}: the {self.method} hook failed: {str(exc).splitlines()[0]}"
                ) from exc
        return mean * self.size, sum(counts)  # the hooks average; the runtime sums

    def close(self) -> None:
        """Stop the shaped links' threads (if any)."""
        if self.shaped is not None:
            self.shaped.close()

    def step(self, step: int) -> int:
        """Synchronise this step's gradients (qadam: momentum) across the replicas.

        Returns:
            S, the bytes this rank handed to the collectives (equal to `wire_bytes(step)`).

        Raises:
            DPSyncError: If a collective fails or times out.
        """
        return self.spec.step(self, self._grads(), step)

    @torch.no_grad()
    def apply(self) -> None:
        """The optimizer step of a method that owns it (qadam: see `QAdamMethod.apply`).

        Raises:
            RuntimeError: If the method leaves the optimizer alone.
        """
        self.spec.apply(self)


# --- built-in methods ------------------------------------------------------------------------


class NoCompressionMethod(DPMethodSpec):
    """`none`: float32 all-reduce of the flat gradient (sum over replicas)."""

    description = "float32 sum by the planned collective"
    requires_replicas = False

    def wire_bytes(
        self, shapes: Sequence[tuple[int, ...]], group_size: int, step: int, settings: DPSettings
    ) -> int:
        """4 n."""
        return _float32_bytes(shapes)

    def step(self, sync: GradientSync, flat: Tensor, step: int) -> int:
        """All-reduce `flat` and set it as the gradients."""
        nbytes = sync.all_reduce(flat, step)
        sync.set_grads(flat)
        return nbytes


class TorchHookMethod(DPMethodSpec):
    """A method that runs one of torch's DDP comm hooks on one bucket of every gradient.

    The hook all-reduces inside (`collectives` is "ring"); its bytes are counted by wrapping
    `torch.distributed.all_reduce` while it runs (`GradientSync.run_hook`).
    """

    collectives = frozenset({"ring"})

    def hook(self, sync: GradientSync, bucket: Any) -> torch.futures.Future[Tensor]:
        """Start the hook on `bucket` (a duck-typed `dist.GradBucket`); return its future."""
        raise NotImplementedError

    def step(self, sync: GradientSync, flat: Tensor, step: int) -> int:
        """Run the hook on `flat` and set its sum as the gradients."""
        reduced, nbytes = sync.run_hook(lambda bucket: self.hook(sync, bucket), flat, step)
        sync.set_grads(reduced)
        return nbytes


class FP16Method(TorchHookMethod):
    """`fp16`: torch's `fp16_compress_hook` (cast, divide by K, all-reduce in fp16, cast back)."""

    description = "torch's fp16 hook, 16 bits per value"

    def wire_bytes(
        self, shapes: Sequence[tuple[int, ...]], group_size: int, step: int, settings: DPSettings
    ) -> int:
        """2 n."""
        return _float32_bytes(shapes) // 2

    def hook(self, sync: GradientSync, bucket: Any) -> torch.futures.Future[Tensor]:
        """`fp16_compress_hook` over the group."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        return default_hooks.fp16_compress_hook(sync.group, bucket)


class PowerSGDMethod(TorchHookMethod):
    """`powersgd`: torch's `powerSGD_hook` (rank-r factors, error feedback, warm start).

    Plain all-reduce for the first max(2, warmup_steps) steps; vectors uncompressed.

    References:
        PowerSGD: Practical Low-Rank Gradient Compression for Distributed Optimization,
        NeurIPS 2019, arXiv 1905.13727.
    """

    description = "torch's PowerSGD hook, a rank-r factorisation"

    def wire_bytes(
        self, shapes: Sequence[tuple[int, ...]], group_size: int, step: int, settings: DPSettings
    ) -> int:
        """4 n during the first max(2, warmup_steps) steps, then 4 x `powersgd_numel`."""
        if step < max(2, settings.warmup_steps):
            return _float32_bytes(shapes)
        return 4 * powersgd_numel(shapes, settings.powersgd_rank)

    checkpointable = False  # PowerSGDState's error and warm-start matrices are torch's own

    def setup(self, sync: GradientSync) -> Any:
        """The group's `PowerSGDState` (seed 0)."""
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

        return PowerSGDState(
            process_group=sync.group,
            matrix_approximation_rank=sync.settings.powersgd_rank,
            start_powerSGD_iter=max(2, sync.settings.warmup_steps),
            use_error_feedback=True,
            warm_start=True,
            random_seed=0,
        )

    def hook(self, sync: GradientSync, bucket: Any) -> torch.futures.Future[Tensor]:
        """`powerSGD_hook` with the group's state."""
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

        return powerSGD_hook.powerSGD_hook(sync.state, bucket)


class EFKbitMethod(NoCompressionMethod):
    """`ef-kbit`: the gradient through the k-bit sharded parameter server, then AdamW.

    Float32 all-reduce during the warm-up.
    """

    description = "k-bit gradients through a sharded parameter server with error feedback"
    uses_bits = True
    requires_replicas = True
    collectives = frozenset({"seq_peer"})

    def wire_bytes(
        self, shapes: Sequence[tuple[int, ...]], group_size: int, step: int, settings: DPSettings
    ) -> int:
        """4 n during the warm-up, then K x P (`ShardedExchange`)."""
        if step < settings.warmup_steps:
            return _float32_bytes(shapes)
        return _sharded_bytes(shapes, group_size, settings)

    def setup(self, sync: GradientSync) -> Any:
        """The group's `ShardedExchange` (shaped when the sync is)."""
        return ShardedExchange(
            sync.numel,
            sync.group,
            bits=sync.settings.bits,
            bucket_size=sync.settings.bucket_size,
            timeout_s=sync.timeout_s,
            shaped=sync.shaped,
        )

    def state_dict(self, sync: GradientSync) -> dict[str, Any]:
        """The exchange's error-feedback residuals (worker and server side)."""
        exchange = _exchange(sync)
        return {
            "worker_residual": exchange.worker.residual.clone(),
            "server_residual": exchange.server.residual.clone(),
        }

    def load_state_dict(self, sync: GradientSync, state: dict[str, Any]) -> None:
        """Put the residuals back."""
        exchange = _exchange(sync)
        exchange.worker.residual.copy_(state["worker_residual"])
        exchange.server.residual.copy_(state["server_residual"])

    def step(self, sync: GradientSync, flat: Tensor, step: int) -> int:
        """All-reduce in the warm-up, else the compressed mean x K as the gradients."""
        if step < sync.settings.warmup_steps:
            return super().step(sync, flat, step)
        exchange: ShardedExchange = sync.state
        mean, nbytes = exchange.mean(flat * sync.size, step)
        sync.set_grads(mean)
        return nbytes


def _exchange(sync: GradientSync) -> ShardedExchange:
    state = sync.state
    return state.exchange if isinstance(state, _QAdamState) else state


class _QAdamState:
    """qadam's exchange, Adam's moments (flat, float32) and its step counters."""

    def __init__(self, exchange: ShardedExchange, numel: int) -> None:
        self.exchange = exchange
        self.exp_avg = torch.zeros(numel)
        self.exp_avg_sq = torch.zeros(numel)
        self.adam_steps = 0
        self.variance_steps = 0


class QAdamMethod(EFKbitMethod):
    """`qadam`: AQ-SGD's reference data parallelism (DS3Lab/AC-SGD, `ShardedPSDPCompressed`).

    After the warm-up each rank folds its local gradient into Adam's first moment m and the
    ranks average m through the k-bit sharded parameter server; Adam's second moment is frozen
    at its warm-up value. Warm-up steps all-reduce the float32 gradient and run Adam.

    References:
        Fine-tuning Language Models over Slow Networks using Activation Compression with
        Guarantees, NeurIPS 2022, arXiv 2206.01299 (section 5); 1-bit Adam, ICML 2021, arXiv
        2102.02888 (frozen variance after a warm-up).
    """

    description = "AQ-SGD's compressed Adam momentum, variance frozen after the warm-up"
    owns_optimizer = True
    min_warmup_steps = 1
    warmup_reason = (
        "freezes Adam's variance after the warm-up and exchanges its momentum between "
        "data-parallel replicas"
    )

    def setup(self, sync: GradientSync) -> Any:
        """The exchange and zeroed moments."""
        return _QAdamState(super().setup(sync), sync.numel)

    def state_dict(self, sync: GradientSync) -> dict[str, Any]:
        """The residuals, Adam's moments and its step counters."""
        state: _QAdamState = sync.state
        return super().state_dict(sync) | {
            "exp_avg": state.exp_avg.clone(),
            "exp_avg_sq": state.exp_avg_sq.clone(),
            "adam_steps": state.adam_steps,
            "variance_steps": state.variance_steps,
        }

    def load_state_dict(self, sync: GradientSync, state: dict[str, Any]) -> None:
        """Put the residuals, moments and counters back."""
        super().load_state_dict(sync, state)
        mine: _QAdamState = sync.state
        mine.exp_avg = state["exp_avg"].clone()
        mine.exp_avg_sq = state["exp_avg_sq"].clone()
        mine.adam_steps = int(state["adam_steps"])
        mine.variance_steps = int(state["variance_steps"])

    def step(self, sync: GradientSync, flat: Tensor, step: int) -> int:
        """Warm-up: exact gradient into m and v; then the compressed mean of the local m."""
        state: _QAdamState = sync.state
        beta1, beta2 = _BETAS
        if step < sync.settings.warmup_steps:
            nbytes = sync.all_reduce(flat, step)
            state.exp_avg.mul_(beta1).add_(flat, alpha=1 - beta1)
            state.exp_avg_sq.mul_(beta2).addcmul_(flat, flat, value=1 - beta2)
            state.variance_steps += 1
            return nbytes
        # local m <- b1 m + (1 - b1) K g_local (K g_local estimates the summed gradient), then
        # m <- the compressed mean of the replicas' m (identical on every rank).
        local = state.exp_avg * beta1 + (1 - beta1) * (flat * sync.size)
        state.exp_avg, nbytes = state.exchange.mean(local, step)
        return nbytes

    def apply(self, sync: GradientSync) -> None:
        """Adam's step with the exchanged momentum; variance frozen after the warm-up.

        update = -lr / (1 - b1^t) m / (sqrt(v / (1 - b2^w)) + eps), t = Adam steps so far,
        w = steps that updated v (frozen at the warm-up's count): during the warm-up this is
        torch's AdamW (weight decay 0); afterwards the *bias-corrected* variance stays fixed,
        as in 1-bit Adam. (The reference's `step_update` freezes v but keeps raising
        sqrt(1 - b2^t) with t, so its effective learning rate grows like sqrt(t / w) while
        t << 1 / (1 - b2); we do not copy that.) Each element's m / (sqrt(v) + eps) is clipped
        to +-7.27, the most Adam itself can produce: a weight whose gradient was 0 throughout
        a short warm-up (an embedding row not yet seen) would otherwise step by m / eps and
        diverge (measured: NaN by step 4 with `warmup_steps=1` on the tiny GPT).
        """
        state: _QAdamState = sync.state
        state.adam_steps += 1
        update = qadam_update(
            state.exp_avg,
            state.exp_avg_sq,
            adam_steps=state.adam_steps,
            variance_steps=max(state.variance_steps, 1),
            learning_rate=sync.learning_rate,
        )
        offset = 0
        for p in sync.params:
            p.add_(update[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


register_dp_method("none", NoCompressionMethod())
register_dp_method("fp16", FP16Method())
register_dp_method("powersgd", PowerSGDMethod())
register_dp_method("ef-kbit", EFKbitMethod())
register_dp_method("qadam", QAdamMethod())
