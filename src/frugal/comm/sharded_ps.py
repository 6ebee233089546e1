"""The k-bit sharded parameter server of the DP compression methods ef-kbit and qadam.

`ShardedExchange` averages a flat vector over a process group: the vector (zero-padded to a
multiple of K x bucket) is cut into K chunks of c values. Worker side: chunk i plus its
residual e_i is quantized, e_i <- (chunk_i + e_i) - deQ, and sent to rank i (all-to-all).
Server side (rank i owns chunk i): the mean of the K decoded chunks plus its own residual is
quantized again, with the same error feedback, and all-gathered. Every rank decodes the same
bytes, so the replicas stay bit-identical. Quantizer: AQ-SGD's reference `..._by_bucket`: the
chunk is viewed as (bucket, c / bucket), one fp16 abs-max scale per column (512 values
strided c / 512 apart), symmetric k-bit codes (`ChannelQuantizeCodec`). Residuals are fp16 as
in the reference (`residual_dtype`). Bytes: one chunk payload is P = 2 c / bucket + ceil(c k /
8); each rank sends (K - 1) P in each of the two phases, 2 (K - 1) P per step, exactly a ring
all-reduce's 2 (K - 1) S / K for a vector of S = K P bytes.

Shape legend: n values of the vector, K replicas, c = padded n / K values per chunk.

References:
    Fine-tuning Language Models over Slow Networks using Activation Compression with
    Guarantees, NeurIPS 2022, arXiv 2206.01299 (section 5, "AQ-SGD with gradient
    compression"; reference code DS3Lab/AC-SGD, data_parallel/dist_dp_sharded_ps_compressed.py).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import Tensor

from frugal.comm.codecs import ChannelQuantizeCodec
from frugal.comm.shaped import DirectGroup, ShapedGroup

__all__ = ["BucketQuantizer", "ErrorFeedback", "ShardedExchange", "padded_length"]


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


class ShardedExchange:
    """Mean of a vector over a group through a k-bit sharded parameter server, two-sided EF.

    Args:
        n: Vector length (padded inside to a multiple of K x bucket_size).
        group: The replicas' process group (gloo or NCCL).
        bits: Bits per value, 1..8.
        bucket_size: Values per scale.
        timeout_s: Limit of each collective.
        residual_dtype: Dtype of the worker and server residuals.
        shaped: Send the chunks as messages through the emulated links
            (`frugal.comm.shaped.ShapedGroup`); None = torch.distributed's collectives.
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
        shaped: ShapedGroup | None = None,
    ) -> None:
        self.comm = shaped if shaped is not None else DirectGroup(group, timeout_s=timeout_s)
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.n = n
        self.quantizer = BucketQuantizer(bits, bucket_size)
        self.padded = padded_length(n, self.size, bucket_size)
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
        self.comm.all_to_all_single(
            incoming, outgoing, f"step {step}: all-to-all of the compressed chunks"
        )
        # Server: mean of the K decoded copies of my chunk, compressed again with its own EF.
        pieces = incoming.view(k, self.chunk_bytes)
        total = self.quantizer.decode(pieces[0], c)
        for j in range(1, k):
            total += self.quantizer.decode(pieces[j], c)
        reduced, _ = self.server.compress(total / k)
        gathered = [torch.empty_like(reduced) for _ in range(k)]
        self.comm.all_gather(gathered, reduced, f"step {step}: all-gather of the reduced chunks")
        out = torch.cat([self.quantizer.decode(g, c) for g in gathered])
        return out[: self.n], outgoing.numel()


def padded_length(n: int, size: int, bucket_size: int) -> int:
    """The length of the exchange's vector: n rounded up to a multiple of size x bucket."""
    unit = size * bucket_size
    return max(1, math.ceil(n / unit)) * unit
