"""Activation codecs for pipeline links: what crosses the wire, and its exact size.

One interface (`Codec`): `encode(x) -> Encoded` (the tensors that travel), `decode(Encoded) ->
x_hat`, and `wire_bytes(shape)`, the exact number of payload bytes for a tensor of that shape,
known before anything is sent (the planner's cost model prices links with it). Everything is
pure torch, so the same code runs on CPU/gloo and GPU/NCCL.

- `IdentityCodec`: float32 as is (lossless).
- `HalfCodec`: float16 or bfloat16.
- `QuantizeCodec` (DirectQ): per-row min and step, then k-bit round-to-nearest codes packed
  densely (1 <= k <= 8); |x - x_hat| <= step / 2 with step = (max - min) / (2^k - 1) per row.
- `DeltaCodec` (AQ-SGD): sends the k-bit quantized *change* of each example's activation
  against a buffer both sides keep (the sender updates its buffer with the decoded change, so
  the two never drift); an example's first visit goes as float32.

Shape legend: R rows (leading dimensions flattened), C values per row, B bytes.

References:
    Fine-tuning Language Models over Slow Networks using Activation Compression with
    Guarantees, NeurIPS 2022, arXiv 2206.01299 (section 3: AQ-SGD's delta quantization).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from frugal.comm.wire import wire_bytes

__all__ = [
    "Codec",
    "DeltaCodec",
    "Encoded",
    "HalfCodec",
    "IdentityCodec",
    "QuantizeCodec",
    "pack_bits",
    "unpack_bits",
]


@dataclass(frozen=True, eq=False)
class Encoded:
    """What travels: payload tensors plus the shape needed to rebuild the value."""

    shape: tuple[int, ...]
    """Shape of the original tensor."""
    tensors: tuple[Tensor, ...]
    """Payload; its bytes are the wire size."""

    @property
    def nbytes(self) -> int:
        """Payload bytes (what `Codec.wire_bytes` promises)."""
        return sum(t.numel() * t.element_size() for t in self.tensors)


class Codec(Protocol):
    """Encode a tensor for the wire and decode it on the other side."""

    name: str

    def wire_bytes(self, shape: tuple[int, ...]) -> int:
        """Exact payload bytes for a float32 tensor of `shape`."""
        ...

    def encode(self, x: Tensor) -> Encoded:
        """Encode a float32 tensor."""
        ...

    def decode(self, encoded: Encoded) -> Tensor:
        """Rebuild a float32 tensor of the original shape."""
        ...


def _check_float32(x: Tensor) -> None:
    if x.dtype != torch.float32:
        raise TypeError(f"codecs take float32 tensors, got {x.dtype}; convert with .float()")
    if x.dim() < 1:
        raise ValueError("codecs take tensors with at least one dimension")


class IdentityCodec:
    """float32 as is: 4 bytes per value, lossless."""

    name = "fp32"

    def wire_bytes(self, shape: tuple[int, ...]) -> int:
        """4 x numel."""
        return wire_bytes("fp32", shape)

    def encode(self, x: Tensor) -> Encoded:
        """Send the tensor itself.

        Raises:
            TypeError: If `x` is not float32.
        """
        _check_float32(x)
        return Encoded(tuple(x.shape), (x.contiguous(),))

    def decode(self, encoded: Encoded) -> Tensor:
        """The tensor that was sent."""
        return encoded.tensors[0].reshape(encoded.shape)


class HalfCodec:
    """float16 or bfloat16: 2 bytes per value."""

    def __init__(self, dtype: torch.dtype = torch.float16) -> None:
        if dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"dtype={dtype}; choose torch.float16 or torch.bfloat16")
        self.dtype = dtype
        self.name = "fp16" if dtype == torch.float16 else "bf16"

    def wire_bytes(self, shape: tuple[int, ...]) -> int:
        """2 x numel."""
        return wire_bytes(self.name, shape)

    def encode(self, x: Tensor) -> Encoded:
        """Cast to the half type.

        Raises:
            TypeError: If `x` is not float32.
        """
        _check_float32(x)
        return Encoded(tuple(x.shape), (x.to(self.dtype).contiguous(),))

    def decode(self, encoded: Encoded) -> Tensor:
        """Cast back to float32."""
        return encoded.tensors[0].to(torch.float32).reshape(encoded.shape)


def pack_bits(codes: Tensor, bits: int) -> Tensor:
    """Pack k-bit codes (uint8, each < 2^k) densely, little-endian, 8 codes per k bytes.

    Raises:
        ValueError: If bits is not in [1, 8].

    Shapes:
        codes: (R, C) -> (R, ceil(C k / 8)) uint8.
    """
    if not 1 <= bits <= 8:
        raise ValueError(f"bits={bits} must be in [1, 8]")
    rows, cols = codes.shape
    shifts = torch.arange(bits, device=codes.device, dtype=torch.uint8)
    bit_RCk = (codes.unsqueeze(-1) >> shifts) & 1  # (R, C, k), bit b of each code
    stream = bit_RCk.reshape(rows, cols * bits)
    pad = (-stream.shape[1]) % 8
    if pad:
        stream = torch.nn.functional.pad(stream, (0, pad))
    weights = (1 << torch.arange(8, device=codes.device, dtype=torch.int32)).to(torch.uint8)
    packed: Tensor = (stream.reshape(rows, -1, 8) * weights).sum(dim=-1, dtype=torch.int32)
    return packed.to(torch.uint8)


def unpack_bits(packed: Tensor, bits: int, cols: int) -> Tensor:
    """Inverse of `pack_bits`.

    Shapes:
        packed: (R, B) -> (R, cols) uint8.
    """
    rows = packed.shape[0]
    shifts = torch.arange(8, device=packed.device, dtype=torch.uint8)
    stream = ((packed.unsqueeze(-1) >> shifts) & 1).reshape(rows, -1)[:, : cols * bits]
    weights = (1 << torch.arange(bits, device=packed.device, dtype=torch.int32)).to(torch.int32)
    codes: Tensor = (stream.reshape(rows, cols, bits).to(torch.int32) * weights).sum(dim=-1)
    return codes.to(torch.uint8)


class QuantizeCodec:
    """DirectQ: per-row min/step (2 float32) and k-bit round-to-nearest codes.

    Wire size per row: 8 + ceil(C k / 8) bytes.
    """

    def __init__(self, bits: int) -> None:
        if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 8:
            raise ValueError(f"bits={bits!r} must be an integer in [1, 8]")
        self.bits = bits
        self.name = f"q{bits}"

    @staticmethod
    def _rows(shape: tuple[int, ...]) -> tuple[int, int]:
        cols = shape[-1]
        return math.prod(shape[:-1]), cols

    def wire_bytes(self, shape: tuple[int, ...]) -> int:
        """R x (8 + ceil(C k / 8))."""
        return wire_bytes(self.name, shape)

    def encode(self, x: Tensor) -> Encoded:
        """Quantize each row to k bits by round-to-nearest between its min and max.

        Raises:
            TypeError: If `x` is not float32.
            ValueError: If `x` holds NaN or inf.
        """
        _check_float32(x)
        if not torch.isfinite(x).all():
            raise ValueError("cannot quantize NaN or inf; check the activations for overflow")
        rows, cols = self._rows(tuple(x.shape))
        x_RC = x.reshape(rows, cols)
        low = x_RC.min(dim=1, keepdim=True).values
        high = x_RC.max(dim=1, keepdim=True).values
        levels = (1 << self.bits) - 1
        step = (high - low) / levels
        safe = torch.where(step > 0, step, torch.ones_like(step))
        codes = torch.round((x_RC - low) / safe).clamp_(0, levels).to(torch.uint8)
        header = torch.cat([low, step], dim=1).contiguous()  # (R, 2) float32
        return Encoded(tuple(x.shape), (header, pack_bits(codes, self.bits)))

    def decode(self, encoded: Encoded) -> Tensor:
        """Rebuild each value as min + code x step."""
        header, packed = encoded.tensors
        _, cols = self._rows(encoded.shape)
        codes = unpack_bits(packed, self.bits, cols).to(torch.float32)
        return (header[:, :1] + codes * header[:, 1:2]).reshape(encoded.shape)


class DeltaCodec:
    """AQ-SGD: quantize the change of each example's activation against shared buffers.

    The sender and the receiver each hold one `DeltaCodec` with their own buffers. Call
    `encode(x, example_ids)` on the sender and `decode(encoded, example_ids)` on the receiver
    with the same ids; after each call both buffers hold the same value. An example seen for
    the first time is sent as float32 (its row of the payload is exact).

    Shapes:
        x: (N, ...) with one row per example; example_ids: (N,) int64.
    """

    def __init__(self, bits: int) -> None:
        self.quantizer = QuantizeCodec(bits)
        self.name = f"aqsgd{bits}"
        self.buffers: dict[int, Tensor] = {}

    def wire_bytes(self, shape: tuple[int, ...], num_new: int = 0) -> int:
        """Quantized deltas for the seen examples plus float32 rows for `num_new` new ones."""
        per_example = math.prod(shape[1:])
        seen = (shape[0] - num_new, *shape[1:])
        delta = self.quantizer.wire_bytes(seen) if seen[0] else 0
        return delta + 4 * per_example * num_new

    def _split(self, example_ids: Tensor) -> tuple[list[int], Tensor]:
        ids = [int(i) for i in example_ids.tolist()]
        if len(set(ids)) != len(ids):
            raise ValueError("example_ids repeat within one message; each example once")
        new = torch.tensor([i not in self.buffers for i in ids], dtype=torch.bool)
        return ids, new

    def encode(self, x: Tensor, example_ids: Tensor) -> Encoded:
        """Encode; update this side's buffers with what the receiver will decode.

        Raises:
            TypeError: If `x` is not float32.
            ValueError: If ids repeat or their count differs from x's first dimension.
        """
        _check_float32(x)
        if example_ids.shape != (x.shape[0],):
            raise ValueError(
                f"example_ids must have shape ({x.shape[0]},), got {tuple(example_ids.shape)}"
            )
        ids, new = self._split(example_ids)
        seen = ~new
        tensors: list[Tensor] = [x[new].contiguous()]
        if seen.any():
            reference = torch.stack(
                [self.buffers[i] for i, s in zip(ids, seen.tolist(), strict=True) if s]
            )
            delta = self.quantizer.encode(x[seen] - reference)
            tensors.extend(delta.tensors)
            decoded = reference + self.quantizer.decode(delta)
        rows_new = iter(x[new])
        rows_seen = iter(decoded) if seen.any() else iter(())
        for i, is_new in zip(ids, new.tolist(), strict=True):
            self.buffers[i] = (next(rows_new) if is_new else next(rows_seen)).clone()
        return Encoded(tuple(x.shape), tuple(tensors))

    def decode(self, encoded: Encoded, example_ids: Tensor) -> Tensor:
        """Rebuild the activations and update this side's buffers."""
        ids, new = self._split(example_ids)
        out = torch.empty(encoded.shape, dtype=torch.float32)
        out[new] = encoded.tensors[0]
        seen = ~new
        if seen.any():
            reference = torch.stack(
                [self.buffers[i] for i, s in zip(ids, seen.tolist(), strict=True) if s]
            )
            shape = (int(seen.sum()), *encoded.shape[1:])
            delta = self.quantizer.decode(Encoded(shape, tuple(encoded.tensors[1:])))
            out[seen] = reference + delta
        for k, i in enumerate(ids):
            self.buffers[i] = out[k].clone()
        return out
