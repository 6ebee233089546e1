"""Data-parallel gradient compression between the replicas of one pipeline stage.

A stage replicated K times must agree on one update per step. `GradientSync` does that over a
process group (one per stage, never WORLD) with one of `DP_METHODS`:

- `none`: float32 all-reduce of the flat gradient (sum over replicas).
- `fp16`: torch's own DDP comm hook `fp16_compress_hook` (cast, divide by K, all-reduce in
  float16, cast back); half the bytes.
- `powersgd`: torch's own DDP comm hook `powerSGD_hook` (rank-r factors P, Q of every matrix
  gradient, error feedback, warm start; vectors are all-reduced uncompressed; plain all-reduce
  for the first `max(2, warmup_steps)` steps).
- `ef-kbit`: the gradient itself through the k-bit sharded parameter server below, then
  AdamW as usual.
- `qadam`: AQ-SGD's reference data parallelism (DS3Lab/AC-SGD, `ShardedPSDPCompressed`):
  after the warm-up each rank folds its *local* gradient into Adam's first moment m and the
  ranks average m through the k-bit sharded parameter server; Adam's second moment is frozen
  at its warm-up value (bias-corrected, as 1-bit Adam; see `GradientSync.apply`). Warm-up
  steps all-reduce the float32 gradient and run Adam.

**k-bit sharded parameter server** (`ShardedExchange`): the flat vector (zero-padded to a
multiple of K x bucket) is cut into K chunks of c values. Worker side: chunk i plus its
residual e_i is quantized, e_i <- (chunk_i + e_i) - deQ, and sent to rank i (all-to-all).
Server side (rank i owns chunk i): the mean of the K decoded chunks plus its own residual is
quantized again, with the same error feedback, and all-gathered. Every rank decodes the same
bytes, so the replicas stay bit-identical. Quantizer: AQ-SGD's reference `..._by_bucket`: the
chunk is viewed as (bucket, c / bucket), one fp16 abs-max scale per column (512 values
strided c / 512 apart), symmetric k-bit codes (`ChannelQuantizeCodec`). Residuals are fp16 as
in the reference (`residual_dtype`). Bytes: one chunk payload is P = 2 c / bucket + ceil(c k /
8); each rank sends (K - 1) P in each of the two phases, 2 (K - 1) P per step, exactly a ring
all-reduce's 2 (K - 1) S / K for a vector of S = K P bytes: `GradientSync.step` reports S.

Bytes are known up front (`dp_wire_bytes`) and measured at run time from the tensors handed to
the collectives (the torch hooks' all-reduces are counted by wrapping
`torch.distributed.all_reduce` while a hook runs).

Shape legend: n values of the flat gradient, K replicas, c = padded n / K values per chunk.

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
import datetime
import math
import time
from collections.abc import Iterator, Sequence
from typing import Any, Literal, cast, get_args

import torch
import torch.distributed as dist
from torch import Tensor

from frugal import FrugalError
from frugal.comm.codecs import ChannelQuantizeCodec

__all__ = [
    "DP_METHODS",
    "BucketQuantizer",
    "DPMethod",
    "DPSyncError",
    "ErrorFeedback",
    "GradientSync",
    "ShardedExchange",
    "dp_wire_bytes",
    "powersgd_numel",
    "qadam_update",
]

DPMethod = Literal["none", "fp16", "powersgd", "ef-kbit", "qadam"]
DP_METHODS: tuple[str, ...] = get_args(DPMethod)
_BETAS = (0.9, 0.999)
_EPS = 1e-8
_ADAM_RATIO_BOUND = (
    (1 - _BETAS[0]) / (1 - _BETAS[1]) ** 0.5 / (1 - _BETAS[0] ** 2 / _BETAS[1]) ** 0.5
)
"""The largest |m / sqrt(v)| Adam itself can reach, (1 - b1) / sqrt(1 - b2) / sqrt(1 - b1^2 / b2)
= 7.27 (Cauchy-Schwarz over the gradient history): qadam clips each element's normalised step to
it, so a weight whose warm-up gradients were all zero (v frozen at 0) moves at most as far per
step as Adam could ever move it, instead of m / eps."""


class DPSyncError(FrugalError):
    """A data-parallel collective failed or did not finish within the timeout."""


class BucketQuantizer:
    """k-bit abs-max quantizer of a flat vector, AQ-SGD's reference bucket layout.

    The vector (length n, a multiple of `bucket_size`) is viewed as (bucket_size, n /
    bucket_size); each column gets one fp16 abs-max scale (`ChannelQuantizeCodec`), so a
    "bucket" is bucket_size values strided n / bucket_size apart, as in the reference's
    `compress_flexible_nbits_by_bucket`. Payload: fp16 scales then packed codes, uint8.

    Args:
        bits: Bits per value, 1..8.
        bucket_size: Values per scale, >= 1.

    Raises:
        ValueError: If bits or bucket_size is out of range.
    """

    def __init__(self, bits: int, bucket_size: int = 512) -> None:
        if bucket_size < 1:
            raise ValueError(f"bucket_size={bucket_size} must be >= 1")
        self.codec = ChannelQuantizeCodec(bits)
        self.bits = bits
        self.bucket_size = bucket_size

    def payload_bytes(self, n: int) -> int:
        """2 n / bucket (fp16 scales) + ceil(n bits / 8) packed codes.

        Raises:
            ValueError: If n is not a positive multiple of the bucket size.
        """
        if n < 1 or n % self.bucket_size:
            raise ValueError(f"n={n} must be a positive multiple of bucket_size={self.bucket_size}")
        return 2 * (n // self.bucket_size) + math.ceil(n * self.bits / 8)

    def encode(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Quantize; returns (payload uint8[payload_bytes(n)], the value decode will give).

        Raises:
            ValueError: If x holds NaN/inf or its length is not a multiple of the bucket.

        Shapes:
            x: (n,) float32.
        """
        n = x.numel()
        self.payload_bytes(n)
        encoded, x_hat = self.codec.quantize(x.reshape(self.bucket_size, n // self.bucket_size))
        scales, packed = encoded.tensors
        payload = torch.cat([scales.view(torch.uint8), packed.reshape(-1)])
        return payload, x_hat.reshape(n)

    def decode(self, payload: Tensor, n: int) -> Tensor:
        """Rebuild the (n,) float32 vector from a payload of `payload_bytes(n)` bytes.

        Raises:
            ValueError: If the payload size is wrong.
        """
        if payload.numel() != self.payload_bytes(n):
            raise ValueError(
                f"payload of {payload.numel()} bytes; {self.payload_bytes(n)} expected for n={n}"
            )
        cols = n // self.bucket_size
        scales = payload[: 2 * cols].clone().view(torch.float16)  # may start at an odd byte
        return self.codec.dequantize(scales, payload[2 * cols :], (self.bucket_size, cols)).reshape(
            n
        )


class ErrorFeedback:
    """Error feedback around a quantizer: send Q(x + e), keep e <- x + e - deQ(Q(x + e)).

    After T calls, sum of the sent (decoded) values + e = sum of the inputs (exactly, up to
    the rounding of e to `residual_dtype`).

    Args:
        quantizer: The k-bit quantizer.
        n: Vector length.
        residual_dtype: Dtype e is kept in (fp16 in the reference, halving its memory).
    """

    def __init__(
        self, quantizer: BucketQuantizer, n: int, residual_dtype: torch.dtype = torch.float16
    ) -> None:
        self.quantizer = quantizer
        self.residual = torch.zeros(n, dtype=residual_dtype)

    def compress(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(payload, decoded value sent) for x + e; updates e.

        Shapes:
            x: (n,) float32.
        """
        corrected = x + self.residual.float()
        payload, sent = self.quantizer.encode(corrected)
        self.residual = (corrected - sent).to(self.residual.dtype)
        return payload, sent


def _wait(work: Any, what: str, timeout_s: float) -> None:
    try:
        ok = work.wait(datetime.timedelta(seconds=timeout_s))
    except RuntimeError as exc:
        raise DPSyncError(f"{what} failed: {str(exc).splitlines()[0]}") from exc
    if ok is False:
        raise DPSyncError(f"{what} did not finish in {timeout_s} s")


class ShardedExchange:
    """Mean of a vector over a group through a k-bit sharded parameter server, two-sided EF.

    Args:
        n: Vector length (padded inside to a multiple of K x bucket_size).
        group: The replicas' process group (gloo or NCCL).
        bits: Bits per value, 1..8.
        bucket_size: Values per scale.
        timeout_s: Limit of each collective.
        residual_dtype: Dtype of the worker and server residuals.
    """

    def __init__(
        self,
        n: int,
        group: dist.ProcessGroup,
        *,
        bits: int,
        bucket_size: int = 512,
        timeout_s: float = 120.0,
        residual_dtype: torch.dtype = torch.float16,
    ) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.n = n
        self.quantizer = BucketQuantizer(bits, bucket_size)
        self.padded = _padded(n, self.size, bucket_size)
        self.chunk = self.padded // self.size
        self.chunk_bytes = self.quantizer.payload_bytes(self.chunk)
        self.worker = ErrorFeedback(self.quantizer, self.padded, residual_dtype)
        self.server = ErrorFeedback(self.quantizer, self.chunk, residual_dtype)
        self.timeout_s = timeout_s

    def mean(self, x: Tensor, step: int) -> tuple[Tensor, int]:
        """The compressed mean of x over the group, identical on every rank.

        Returns:
            (mean (n,) float32, S = K x chunk payload bytes: this rank's all-to-all input).

        Raises:
            DPSyncError: If a collective fails or times out.

        Shapes:
            x: (n,) float32.
        """
        k, c = self.size, self.chunk
        flat = torch.zeros(self.padded)
        flat[: self.n] = x
        # Worker: compress chunk i (+ its residual) for rank i; the residual corrects the next.
        corrected = flat + self.worker.residual.float()
        parts, sent = zip(
            *(self.quantizer.encode(corrected[i * c : (i + 1) * c]) for i in range(k)), strict=True
        )
        self.worker.residual = (corrected - torch.cat(sent)).to(self.worker.residual.dtype)
        outgoing = torch.cat(parts)
        incoming = torch.empty_like(outgoing)
        work = dist.all_to_all_single(incoming, outgoing, group=self.group, async_op=True)
        _wait(work, f"step {step}: all-to-all of the compressed chunks", self.timeout_s)
        # Server: mean of the K decoded copies of my chunk, compressed again with its own EF.
        pieces = incoming.view(k, self.chunk_bytes)
        total = self.quantizer.decode(pieces[0], c)
        for j in range(1, k):
            total += self.quantizer.decode(pieces[j], c)
        reduced, _ = self.server.compress(total / k)
        gathered = [torch.empty_like(reduced) for _ in range(k)]
        work = dist.all_gather(gathered, reduced, group=self.group, async_op=True)
        _wait(work, f"step {step}: all-gather of the reduced chunks", self.timeout_s)
        out = torch.cat([self.quantizer.decode(g, c) for g in gathered])
        return out[: self.n], outgoing.numel()


def _padded(n: int, size: int, bucket_size: int) -> int:
    unit = size * bucket_size
    return max(1, math.ceil(n / unit)) * unit


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
        ValueError: If the method is unknown.
    """
    n = sum(math.prod(s) for s in shapes)
    if method not in DP_METHODS:
        raise ValueError(f"dp method {method!r}; choose one of {', '.join(DP_METHODS)}")
    if method == "none" or (method in ("ef-kbit", "qadam") and step < warmup_steps):
        return 4 * n
    if method == "fp16":
        return 2 * n
    if method == "powersgd":
        if step < max(2, warmup_steps):
            return 4 * n
        return 4 * powersgd_numel(shapes, powersgd_rank)
    chunk = _padded(n, group_size, bucket_size) // group_size
    return group_size * BucketQuantizer(bits, bucket_size).payload_bytes(chunk)


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


@contextlib.contextmanager
def _counting_all_reduce(counts: list[int]) -> Iterator[None]:
    """Count the bytes of every tensor torch.distributed.all_reduce gets while inside."""
    original = dist.all_reduce

    def counting(tensor: Tensor, *args: Any, **kwargs: Any) -> Any:
        counts.append(tensor.numel() * tensor.element_size())
        return original(tensor, *args, **kwargs)

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
    and returns S, the bytes handed to the collectives. For `qadam`, `step` exchanges the
    momentum instead and `apply()` must be called in place of the optimizer's step.

    Args:
        method: One of `DP_METHODS`.
        params: The stage's parameters (fixed order, same on every replica).
        group: The stage's data-parallel process group.
        bits: Bits of ef-kbit / qadam, 1..8 (the reference: 8).
        bucket_size: Values per fp16 scale (ef-kbit, qadam).
        powersgd_rank: PowerSGD's matrix_approximation_rank, >= 1.
        warmup_steps: Steps synchronised in float32 first (ef-kbit, qadam; PowerSGD starts at
            max(2, warmup_steps)); qadam needs >= 1 (its frozen variance comes from them).
        learning_rate: qadam's Adam learning rate (the others leave the optimizer alone).
        timeout_s: Limit of every collective.

    Raises:
        ValueError: If an argument is out of range.
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
    ) -> None:
        if method not in DP_METHODS:
            raise ValueError(f"dp_compression={method!r}; choose one of {', '.join(DP_METHODS)}")
        if isinstance(bits, bool) or not 1 <= bits <= 8:
            raise ValueError(f"dp_bits={bits} must be in [1, 8]")
        if powersgd_rank < 1:
            raise ValueError(f"powersgd_rank={powersgd_rank} must be >= 1")
        if method == "qadam" and warmup_steps < 1:
            raise ValueError(
                "dp_compression='qadam' freezes Adam's variance after the warm-up; set "
                "warmup_steps >= 1 (the reference warms up for one epoch)"
            )
        self.method = method
        self.params = list(params)
        self.shapes = [tuple(p.shape) for p in self.params]
        self.numel = sum(p.numel() for p in self.params)
        self.group = group
        self.size = dist.get_world_size(group)
        self.bits, self.bucket_size, self.powersgd_rank = bits, bucket_size, powersgd_rank
        self.warmup_steps = warmup_steps
        self.learning_rate = learning_rate
        self.timeout_s = timeout_s
        self.exchange: ShardedExchange | None = None
        if method in ("ef-kbit", "qadam"):
            self.exchange = ShardedExchange(
                self.numel, group, bits=bits, bucket_size=bucket_size, timeout_s=timeout_s
            )
        self._powersgd: Any = None
        if method == "powersgd":
            from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

            self._powersgd = PowerSGDState(
                process_group=group,
                matrix_approximation_rank=powersgd_rank,
                start_powerSGD_iter=max(2, warmup_steps),
                use_error_feedback=True,
                warm_start=True,
                random_seed=0,
            )
        self.exp_avg = torch.zeros(self.numel)
        self.exp_avg_sq = torch.zeros(self.numel)
        self._adam_steps = 0
        self._variance_steps = 0

    @property
    def owns_optimizer(self) -> bool:
        """Whether `apply()` replaces the optimizer's step (qadam)."""
        return self.method == "qadam"

    def wire_bytes(self, step: int) -> int:
        """The analytic S of `step` (`dp_wire_bytes`)."""
        return dp_wire_bytes(
            self.method,
            self.shapes,
            self.size,
            step,
            bits=self.bits,
            bucket_size=self.bucket_size,
            powersgd_rank=self.powersgd_rank,
            warmup_steps=self.warmup_steps,
        )

    def _grads(self) -> Tensor:
        return torch.cat(
            [
                (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                for p in self.params
            ]
        )

    def _set_grads(self, flat: Tensor) -> None:
        offset = 0
        for p in self.params:
            value = flat[offset : offset + p.numel()].view_as(p)
            if p.grad is None:
                p.grad = value.clone()
            else:
                p.grad.copy_(value)
            offset += p.numel()

    def _all_reduce(self, flat: Tensor, step: int) -> int:
        work = dist.all_reduce(flat, group=self.group, async_op=True)
        _wait(work, f"step {step}: gradient all-reduce", self.timeout_s)
        return flat.numel() * flat.element_size()

    def _hook(self, flat: Tensor, step: int) -> tuple[Tensor, int]:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        bucket = cast(Any, _Bucket(flat, self.params))  # duck-typed dist.GradBucket
        counts: list[int] = []
        with _counting_all_reduce(counts):
            if self.method == "fp16":
                future = default_hooks.fp16_compress_hook(self.group, bucket)
            else:
                future = powerSGD_hook.powerSGD_hook(self._powersgd, bucket)
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

    def step(self, step: int) -> int:
        """Synchronise this step's gradients (qadam: momentum) across the replicas.

        Returns:
            S, the bytes this rank handed to the collectives (equal to `wire_bytes(step)`).

        Raises:
            DPSyncError: If a collective fails or times out.
        """
        flat = self._grads()
        warm = step < self.warmup_steps
        if self.method == "none" or (self.method in ("ef-kbit", "qadam") and warm):
            nbytes = self._all_reduce(flat, step)
            if self.method == "qadam":  # warm-up: exact gradient into m and v
                self._fold(flat, update_variance=True)
            else:
                self._set_grads(flat)
            return nbytes
        if self.method in ("fp16", "powersgd"):
            reduced, nbytes = self._hook(flat, step)
            self._set_grads(reduced)
            return nbytes
        assert self.exchange is not None
        if self.method == "ef-kbit":
            mean, nbytes = self.exchange.mean(flat * self.size, step)
            self._set_grads(mean)
            return nbytes
        # qadam: local m <- b1 m + (1 - b1) K g_local (K g_local estimates the summed gradient),
        # then m <- the compressed mean of the replicas' m (identical on every rank).
        beta1 = _BETAS[0]
        local = self.exp_avg * beta1 + (1 - beta1) * (flat * self.size)
        self.exp_avg, nbytes = self.exchange.mean(local, step)
        return nbytes

    def _fold(self, grad: Tensor, *, update_variance: bool) -> None:
        beta1, beta2 = _BETAS
        self.exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        if update_variance:
            self.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            self._variance_steps += 1

    @torch.no_grad()
    def apply(self) -> None:
        """qadam: Adam's step with the exchanged momentum; variance frozen after the warm-up.

        update = -lr / (1 - b1^t) m / (sqrt(v / (1 - b2^w)) + eps), t = Adam steps so far,
        w = steps that updated v (frozen at the warm-up's count): during the warm-up this is
        torch's AdamW (weight decay 0); afterwards the *bias-corrected* variance stays fixed,
        as in 1-bit Adam. (The reference's `step_update` freezes v but keeps raising
        sqrt(1 - b2^t) with t, so its effective learning rate grows like sqrt(t / w) while
        t << 1 / (1 - b2); we do not copy that.) Each element's m / (sqrt(v) + eps) is clipped
        to +-7.27, the most Adam itself can produce: a weight whose gradient was 0 throughout
        a short warm-up (an embedding row not yet seen) would otherwise step by m / eps and
        diverge (measured: NaN by step 4 with `warmup_steps=1` on the tiny GPT).

        Raises:
            RuntimeError: If the method is not qadam.
        """
        if self.method != "qadam":
            raise RuntimeError(f"apply() belongs to qadam, not {self.method!r}")
        self._adam_steps += 1
        update = qadam_update(
            self.exp_avg,
            self.exp_avg_sq,
            adam_steps=self._adam_steps,
            variance_steps=max(self._variance_steps, 1),
            learning_rate=self.learning_rate,
        )
        offset = 0
        for p in self.params:
            p.add_(update[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
