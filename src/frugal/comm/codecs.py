"""Activation codecs for pipeline links: what crosses the wire, and its exact size.

One interface (`Codec`): `encode(x) -> Encoded` (the tensors that travel), `decode(Encoded) ->
x_hat`, and `wire_bytes(shape)`, the exact number of payload bytes for a tensor of that shape,
known before anything is sent (the planner's cost model prices links with it). Everything is
pure torch, so the same code runs on CPU/gloo and GPU/NCCL: a tensor's payload stays on its
device. Every codec takes float32, bfloat16 or float16, computes in float32, and decodes to the
dtype it was given (`Encoded.dtype`); the wire format and sizes do not depend on the dtype
(`fp32` sends 4 bytes per value whatever it is given, so a bfloat16 value round-trips exactly).

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
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch
from torch import Tensor

from frugal.comm.buffers import ActivationBuffer, BufferFactory, MemoryBuffer
from frugal.parallel.codec import ScaleName, quantized_bytes

__all__ = [
    "ChannelQuantizeCodec",
    "Codec",
    "DeltaCodec",
    "Encoded",
    "ErrorFeedbackCodec",
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
    dtype: torch.dtype = torch.float32
    """dtype of the original tensor, which decode returns (float32, bfloat16 or float16)."""

    @property
    def nbytes(self) -> int:
        """Payload bytes (what `Codec.wire_bytes` promises)."""
        return sum(t.numel() * t.element_size() for t in self.tensors)


class Codec(Protocol):
    """Encode a tensor for the wire and decode it on the other side."""

    name: str

    def wire_bytes(self, shape: tuple[int, ...]) -> int:
        """Exact payload bytes for a tensor of `shape` (any of the float dtypes)."""
        ...

    def encode(self, x: Tensor) -> Encoded:
        """Encode a float32, bfloat16 or float16 tensor."""
        ...

    def decode(self, encoded: Encoded) -> Tensor:
        """Rebuild a tensor of the original shape and dtype, on the payload's device."""
        ...


def _check_quantizable(x: Tensor) -> None:
    _check_float(x)
    if x.numel() == 0:
        raise ValueError(
            f"cannot quantize an empty tensor of shape {tuple(x.shape)}; send nothing instead"
        )


_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _check_float(x: Tensor) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(
            f"codecs take float32, bfloat16 or float16 torch tensors, got {type(x).__name__}; "
            "wrap a numpy array with torch.from_numpy"
        )
    if x.dtype not in _FLOATS:
        raise TypeError(
            f"codecs take float32, bfloat16 or float16 tensors, got {x.dtype}; convert with "
            ".float()"
        )
    if x.dim() < 1:
        raise ValueError("codecs take tensors with at least one dimension")


class IdentityCodec:
    """float32: 4 bytes per value, lossless (bfloat16 and float16 widen exactly)."""

    name = "fp32"

    def wire_bytes(self, shape: tuple[int, ...]) -> int:
        """4 x numel."""
        return 4 * math.prod(shape)

    def encode(self, x: Tensor) -> Encoded:
        """Send the tensor itself, as float32.

        Raises:
            TypeError: If `x` is not float32, bfloat16 or float16.
        """
        _check_float(x)
        return Encoded(tuple(x.shape), (x.float().contiguous(),), x.dtype)

    def decode(self, encoded: Encoded) -> Tensor:
        """The tensor that was sent, in its dtype."""
        return encoded.tensors[0].reshape(encoded.shape).to(encoded.dtype)


class HalfCodec:
    """float16 or bfloat16: 2 bytes per value."""

    def __init__(self, dtype: torch.dtype = torch.float16) -> None:
        if dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"dtype={dtype}; choose torch.float16 or torch.bfloat16")
        self.dtype = dtype
        self.name = "fp16" if dtype == torch.float16 else "bf16"

    def wire_bytes(self, shape: tuple[int, ...]) -> int:
        """2 x numel."""
        return 2 * math.prod(shape)

    def encode(self, x: Tensor) -> Encoded:
        """Cast to the half type.

        Raises:
            TypeError: If `x` is not float32, bfloat16 or float16.
            ValueError: If a value overflows float16 (|x| > 65504; bfloat16 has float32's
                range).
        """
        _check_float(x)
        if self.dtype == torch.float16 and x.numel():
            peak = float(x.abs().amax())
            if peak > 65504.0:
                raise ValueError(
                    f"|x| reaches {peak:.6g}, beyond float16's largest value 65504; send this "
                    "tensor as bf16 or fp32"
                )
        return Encoded(tuple(x.shape), (x.to(self.dtype).contiguous(),), x.dtype)

    def decode(self, encoded: Encoded) -> Tensor:
        """Cast back to the dtype that was encoded."""
        return encoded.tensors[0].to(encoded.dtype).reshape(encoded.shape)


_PACK_WEIGHTS: dict[tuple[int, torch.device], Tensor] = {}
_UNPACK_LUTS: dict[tuple[int, int, torch.dtype, torch.device], Tensor] = {}


def _pack_weights(bits: int, device: torch.device) -> Tensor:
    """(m,) float32: 2^(k i), the place of the i-th code of a byte (m = 8 / k codes)."""
    key = (bits, device)
    if key not in _PACK_WEIGHTS:
        _PACK_WEIGHTS[key] = torch.tensor(
            [float(1 << (bits * i)) for i in range(8 // bits)], device=device
        )
    return _PACK_WEIGHTS[key]


def _unpack_lut(bits: int, offset: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """(m * 256,) table: entry 256 i + b is code i of byte b, minus `offset`."""
    key = (bits, offset, dtype, device)
    if key not in _UNPACK_LUTS:
        byte = torch.arange(256, dtype=torch.int64)
        place = torch.arange(0, 8, bits, dtype=torch.int64).unsqueeze(1)
        codes = ((byte >> place) & ((1 << bits) - 1)) - offset  # (m, 256)
        _UNPACK_LUTS[key] = codes.reshape(-1).to(device=device, dtype=dtype)
    return _UNPACK_LUTS[key]


def pack_bits(codes: Tensor, bits: int) -> Tensor:
    """Pack k-bit codes (integers in [0, 2^k), uint8 or float32) of each row densely.

    Layout, row by row (C codes, B = ceil(C k / 8) bytes):
    - k in {1, 2, 4} (m = 8 / k codes per byte): planar. The row, zero-padded to m B codes, is
      cut into m consecutive parts of B codes; byte j holds code j of part i at bits k i to
      k i + k - 1. Packing is one matrix product with (1, 2^k, ..., 2^(k (m-1))), so it runs
      as the same few torch calls on CPU and GPU.
    - k = 8: the codes as bytes.
    - k in {3, 5, 6, 7}: a little-endian bit stream; code c occupies bits c k to c k + k - 1
      (8 codes per k bytes, packed as one int64 word per 8 codes).

    Raises:
        TypeError: If codes is not a tensor or bits not an integer.
        ValueError: If bits is not in [1, 8], codes is not 2-D, or a code is not an integer
            in [0, 2^k) (it would spill into its neighbour's bits).

    Shapes:
        codes: (R, C) -> (R, B) uint8.
    """
    _check_bits(bits)
    if not isinstance(codes, Tensor) or codes.dim() != 2:
        got = tuple(codes.shape) if isinstance(codes, Tensor) else type(codes).__name__
        raise ValueError(f"codes must be a 2-D (rows, cols) tensor, got {got}; reshape(1, -1)")
    if codes.numel():
        low, high = (float(v) for v in torch.aminmax(codes.float()))
        whole = codes.dtype != torch.float32 or bool((codes == codes.round()).all())
        if low < 0 or high >= (1 << bits) or not whole:
            raise ValueError(
                f"codes must be integers in [0, {1 << bits}) for bits={bits}, got values in "
                f"[{low:g}, {high:g}]{'' if whole else ' with fractions'}"
            )
    return _pack(codes, bits)


def _check_bits(bits: int) -> None:
    if isinstance(bits, bool) or not isinstance(bits, int):
        raise TypeError(f"bits={bits!r} must be an integer in [1, 8]")
    if not 1 <= bits <= 8:
        raise ValueError(f"bits={bits} must be in [1, 8]")


def _pack(codes: Tensor, bits: int) -> Tensor:
    """`pack_bits` without its checks (the quantizers' codes are in range by construction)."""
    rows, cols = codes.shape
    if bits == 8:
        return codes.to(torch.uint8).contiguous()
    if 8 % bits == 0:  # whole codes per byte: planar
        per_byte = 8 // bits
        codes_f = codes if codes.dtype == torch.float32 else codes.float()
        pad = (-cols) % per_byte
        if pad:
            codes_f = torch.nn.functional.pad(codes_f, (0, pad))
        grouped = codes_f.reshape(rows, per_byte, -1)  # (R, m, B)
        weights = _pack_weights(bits, codes.device)
        planar = (weights @ grouped[0]).unsqueeze(0) if rows == 1 else weights @ grouped
        return planar.to(torch.uint8)  # sums of distinct places: exact in float32
    # k in {3, 5, 6, 7}: 8 codes fill k bytes. Each group of 8 codes becomes one int64 word
    # (code i at bit k i) whose k low bytes, little-endian, are the stream's bytes.
    groups = -(-cols // 8)
    codes_g = codes if cols % 8 == 0 else torch.nn.functional.pad(codes, (0, 8 * groups - cols))
    places = torch.arange(0, 8 * bits, bits, device=codes.device, dtype=torch.int64)
    words = (codes_g.reshape(rows, groups, 8).long() << places).sum(dim=-1)  # (R, G)
    if sys.byteorder == "little":
        grouped = words.view(torch.uint8).reshape(rows, groups, 8)[:, :, :bits]
    else:  # byte b of a word is (word >> 8 b) & 255 whatever the machine's order
        shifts = torch.arange(0, 8 * bits, 8, device=codes.device, dtype=torch.int64)
        grouped = ((words.unsqueeze(-1) >> shifts) & 255).to(torch.uint8)
    return grouped.reshape(rows, groups * bits)[:, : -(-cols * bits // 8)].contiguous()


def unpack_bits(
    packed: Tensor, bits: int, cols: int, offset: int = 0, dtype: torch.dtype = torch.uint8
) -> Tensor:
    """Inverse of `pack_bits`: the codes minus `offset`, as `dtype`.

    `dtype=torch.float32, offset=2^(k-1)` gives a symmetric quantizer's signed levels in one
    table lookup (k in {1, 2, 4}).

    Raises:
        ValueError: If bits is not in [1, 8] or packed is not (R, ceil(cols k / 8)) uint8.

    Shapes:
        packed: (R, B) -> (R, cols).
    """
    _check_bits(bits)
    want = -(-cols * bits // 8) if isinstance(cols, int) and cols >= 0 else None
    if (
        not isinstance(packed, Tensor)
        or packed.dtype != torch.uint8
        or packed.dim() != 2
        or want is None
        or packed.shape[1] != want
    ):
        got = (tuple(packed.shape), packed.dtype) if isinstance(packed, Tensor) else packed
        raise ValueError(
            f"cols={cols!r} codes of {bits} bits need (rows, {want}) uint8 bytes, got {got}; "
            "pass the cols given to pack_bits"
        )
    rows = packed.shape[0]
    if bits == 8:
        return (packed[:, :cols].to(dtype) - offset) if offset else packed[:, :cols].to(dtype)
    if 8 % bits == 0:
        per_byte = 8 // bits
        lut = _unpack_lut(bits, offset, dtype, packed.device)
        place = torch.arange(0, 256 * per_byte, 256, device=packed.device)
        index = packed.reshape(rows, 1, -1).long() + place.view(1, per_byte, 1)  # (R, m, B)
        return torch.take(lut, index).reshape(rows, -1)[:, :cols]
    groups = -(-cols // 8)  # k in {3, 5, 6, 7}: rebuild each group's int64 word, then shift
    grouped = torch.nn.functional.pad(packed, (0, groups * bits - packed.shape[1]))
    grouped = grouped.reshape(rows, groups, bits).long()
    byte_places = torch.arange(0, 8 * bits, 8, device=packed.device, dtype=torch.int64)
    words = (grouped << byte_places).sum(dim=-1, keepdim=True)  # (R, G, 1), order-free
    places = torch.arange(0, 8 * bits, bits, device=packed.device, dtype=torch.int64)
    codes = ((words >> places) & ((1 << bits) - 1)).reshape(rows, groups * 8)[:, :cols]
    return (codes - offset).to(dtype) if offset else codes.to(dtype)


class _KBitQuantizer:
    """What the two k-bit quantizers share: the bits check, the name, the wire size, `encode`.

    A subclass sets `scale` (its scale groups, as `frugal.parallel.codec` names them) and
    `prefix` (of `name`), and defines `quantize` and `decode`.

    Args:
        bits: k, the code width, an integer in [1, 8].

    Raises:
        ValueError: If `bits` is not an integer in [1, 8].
    """

    scale: ClassVar[ScaleName]
    prefix: ClassVar[str]

    def __init__(self, bits: int) -> None:
        if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 8:
            raise ValueError(f"bits={bits!r} must be an integer in [1, 8]")
        self.bits = bits
        self.name = f"{self.prefix}{bits}"

    def wire_bytes(self, shape: tuple[int, ...]) -> int:
        """Exact payload bytes for `shape`: scales plus packed codes (see the class)."""
        return quantized_bytes(self.bits, self.scale, shape)

    def encode(self, x: Tensor) -> Encoded:
        """Quantize `x` to k-bit codes (see the class); the `Encoded` of `quantize`.

        Raises:
            TypeError: If `x` is not a float32, bfloat16 or float16 tensor.
            ValueError: If `x` holds NaN or inf (`QuantizeCodec`: or a row's range overflows
                float32).
        """
        return self.quantize(x)[0]

    def quantize(self, x: Tensor) -> tuple[Encoded, Tensor]:
        """`encode`, plus the value `decode` will return (bit-identical, without unpacking).

        Raises:
            TypeError: If `x` is not float32, bfloat16 or float16.
            ValueError: If `x` holds NaN or inf.
        """
        raise NotImplementedError


class QuantizeCodec(_KBitQuantizer):
    """DirectQ: per-row min/step (2 float32) and k-bit round-to-nearest codes.

    Each row is quantized by round-to-nearest between its min and max. Wire size: R x (8 +
    ceil(C k / 8)) bytes.
    """

    scale = "row"
    prefix = "q"

    @staticmethod
    def _rows(shape: tuple[int, ...]) -> tuple[int, int]:
        cols = shape[-1]
        return math.prod(shape[:-1]), cols

    def quantize(self, x: Tensor) -> tuple[Encoded, Tensor]:
        """`encode`, plus the value `decode` will return (bit-identical, without unpacking).

        Raises:
            TypeError: If `x` is not float32, bfloat16 or float16.
            ValueError: If `x` holds NaN or inf, or a row's range overflows float32.
        """
        _check_quantizable(x)
        dtype, x = x.dtype, x.float()  # quantize in float32 whatever the input dtype
        rows, cols = self._rows(tuple(x.shape))
        x_RC = x.reshape(rows, cols)
        low = x_RC.min(dim=1, keepdim=True).values
        high = x_RC.max(dim=1, keepdim=True).values
        levels = (1 << self.bits) - 1
        step = (high - low) / levels
        # min and max propagate NaN and reach +-inf, and so does step; step also overflows
        # when a row spans more than float32's range: one check covers all three.
        if not bool(torch.isfinite(step).all()):
            if not bool(torch.isfinite(x_RC).all()):
                raise ValueError("cannot quantize NaN or inf; check the activations for overflow")
            row = int(torch.nonzero(~torch.isfinite(step))[0, 0])
            raise ValueError(
                f"row {row} spans {float(low[row]):.6g} to {float(high[row]):.6g}, a range "
                "beyond float32's largest value; scale the tensor down before quantizing"
            )
        safe = torch.where(step > 0, step, torch.ones_like(step))
        codes = torch.round((x_RC - low) / safe).clamp_(0, levels)
        header = torch.cat([low, step], dim=1).contiguous()  # (R, 2) float32
        x_hat = (header[:, :1] + codes * header[:, 1:2]).reshape(x.shape)  # as decode computes
        packed = _pack(codes, self.bits)
        return Encoded(tuple(x.shape), (header, packed), dtype), x_hat.to(dtype)

    def decode(self, encoded: Encoded) -> Tensor:
        """Rebuild each value as min + code x step."""
        header, packed = encoded.tensors
        rows, cols = self._rows(encoded.shape)
        if tuple(header.shape) != (rows, 2) or tuple(packed.shape) != (
            rows,
            -(-cols * self.bits // 8),
        ):
            raise ValueError(
                f"a {self.bits}-bit message of shape {encoded.shape} has a ({rows}, 2) header and "
                f"({rows}, {-(-cols * self.bits // 8)}) code bytes, got {tuple(header.shape)} "
                f"and {tuple(packed.shape)}: the sender uses other bits or another shape"
            )
        codes = unpack_bits(packed, self.bits, cols, dtype=torch.float32)
        x_hat = (header[:, :1] + codes * header[:, 1:2]).reshape(encoded.shape)
        return x_hat.to(encoded.dtype)


class ChannelQuantizeCodec(_KBitQuantizer):
    """AQ-SGD's reference quantizer: one abs-max scale per channel, symmetric k-bit codes.

    The scale of channel c is s_c = max |x[:, c]| over all rows of the message, sent as fp16
    (C scales); code = clamp(round(x / s * 2^(k-1)), -2^(k-1), 2^(k-1) - 1) + 2^(k-1),
    round-to-nearest, packed densely over the whole message; x_hat = (code - 2^(k-1)) s /
    2^(k-1). The top positive level is (2^(k-1) - 1) / 2^(k-1) s (0.5 s at 2 bits): the
    reference clips positive values asymmetrically, which this codec reproduces. s = 0 gives
    zeros. A scale above fp16's largest value is clipped to 65504, so values beyond it clip
    too (activations and AQ-SGD's deltas stay far below). Wire size: 2 C + ceil(n k / 8)
    bytes for n values.

    References:
        Fine-tuning Language Models over Slow Networks using Activation Compression with
        Guarantees, NeurIPS 2022, arXiv 2206.01299 (reference code DS3Lab/AC-SGD).
    """

    scale = "channel"
    prefix = "c"

    def quantize(self, x: Tensor) -> tuple[Encoded, Tensor]:
        """`encode`, plus the value `decode` will return (bit-identical, without unpacking).

        Raises:
            TypeError: If `x` is not float32, bfloat16 or float16.
            ValueError: If `x` holds NaN or inf.
        """
        _check_quantizable(x)
        dtype, x = x.dtype, x.float()  # quantize in float32 whatever the input dtype
        cols = x.shape[-1]
        x_RC = x.reshape(-1, cols)
        half_levels = 1 << (self.bits - 1)
        amax_C = x_RC.abs().amax(dim=0)
        if not math.isfinite(amax_C.max().item()):  # amax propagates NaN and inf
            raise ValueError("cannot quantize NaN or inf; check the activations for overflow")
        scale_C = amax_C.clamp_(max=65504.0).to(torch.float16)
        step_C = scale_C.float().div_(half_levels)  # both sides use the fp16 value that travels
        # A zero scale (an all-zero channel, or one below fp16's smallest value) gets a tiny
        # divisor: its codes stay finite and its levels, code x 0, are zeros.
        divisor_C = step_C.clamp(min=1e-30)
        # x / (s / 2^(k-1)) = x / s x 2^(k-1) exactly: dividing by a power of two is exact.
        codes = torch.round(x_RC / divisor_C).clamp_(-half_levels, half_levels - 1)
        codes.add_(half_levels)  # now >= 0 (a -0.0 code becomes +half: no signed zeros)
        x_hat = ((codes - half_levels) * step_C).reshape(x.shape)  # decode's expression
        packed = _pack(codes.reshape(1, -1), self.bits)
        return Encoded(tuple(x.shape), (scale_C, packed), dtype), x_hat.to(dtype)

    def decode(self, encoded: Encoded) -> Tensor:
        """Rebuild x_hat = (code - 2^(k-1)) s / 2^(k-1), in the dtype that was encoded."""
        scale_C, packed = encoded.tensors
        return self.dequantize(scale_C, packed, encoded.shape).to(encoded.dtype)

    def dequantize(self, scale_C: Tensor, packed: Tensor, shape: tuple[int, ...]) -> Tensor:
        """x_hat from the fp16 scales (C,) and the packed codes: what `quantize` returns."""
        half_levels = 1 << (self.bits - 1)
        n = math.prod(shape)
        if scale_C.numel() != shape[-1] or packed.numel() != -(-n * self.bits // 8):
            raise ValueError(
                f"a {self.bits}-bit message of shape {shape} has {shape[-1]} scales and "
                f"{-(-n * self.bits // 8)} code bytes, got {scale_C.numel()} and "
                f"{packed.numel()}: the sender uses other bits or another shape"
            )
        levels = unpack_bits(
            packed.reshape(1, -1), self.bits, math.prod(shape), half_levels, torch.float32
        )
        step_C = scale_C.float().div_(half_levels)
        return (levels.reshape(-1, scale_C.numel()) * step_C).reshape(shape)


_NOT_IDS = (
    torch.bool,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
)


def _message_ids(example_ids: Tensor) -> tuple[Tensor, list[int]]:
    """(int64 ids, as a list) of one message, checked: integers, >= 0, each once."""
    if not isinstance(example_ids, Tensor) or example_ids.dtype in _NOT_IDS:
        got = example_ids.dtype if isinstance(example_ids, Tensor) else type(example_ids)
        raise TypeError(f"example_ids must be an integer tensor, got {got}; use .long()")
    ids = example_ids.long()
    flat: list[int] = ids.reshape(-1).tolist()  # a few ids: plain Python is cheapest
    if flat and min(flat) < 0:
        raise ValueError(f"example_ids must be >= 0, got min {min(flat)}")
    if len(set(flat)) != len(flat):
        raise ValueError("example_ids repeat within one message; each example once")
    return ids, flat


class DeltaCodec:
    """AQ-SGD: quantize the change of each example's activation against shared buffers.

    The sender and the receiver each hold one `DeltaCodec` with their own buffers. Call
    `encode(x, example_ids)` on the sender and `decode(encoded, example_ids)` on the receiver
    with the same ids; after each call both buffers hold the same value. An example seen for
    the first time is sent as float32 (its row of the payload is exact). The buffers are an
    `ActivationBuffer` (`frugal.comm.buffers`): a float32 table in RAM by default, or what
    `buffer_factory` makes (a memory-mapped file, `frugal.store`); one read of the seen rows
    and one write of all rows per message, no per-example Python work.

    Shapes:
        x: (N, ...) with one row per example; example_ids: (N,) int64, each >= 0.

    References:
        Fine-tuning Language Models over Slow Networks using Activation Compression with
        Guarantees, NeurIPS 2022, arXiv 2206.01299 (section 3, algorithm 1).
    """

    def __init__(
        self,
        bits: int,
        scale: str = "row",
        buffer_factory: BufferFactory | None = None,
        first_visit_bits: int = 32,
    ) -> None:
        if scale not in ("row", "channel"):
            raise ValueError(f"scale={scale!r}; choose 'row' (min/step) or 'channel' (abs-max)")
        if first_visit_bits != 32 and (
            isinstance(first_visit_bits, bool)
            or not isinstance(first_visit_bits, int)
            or not 1 <= first_visit_bits <= 8
        ):
            raise ValueError(
                f"first_visit_bits={first_visit_bits!r} must be 32 (float32) or in [1, 8]"
            )
        self.quantizer: QuantizeCodec | ChannelQuantizeCodec = (
            QuantizeCodec(bits) if scale == "row" else ChannelQuantizeCodec(bits)
        )
        self.first_visit: QuantizeCodec | ChannelQuantizeCodec | None = None
        if first_visit_bits != 32:
            self.first_visit = (
                QuantizeCodec(first_visit_bits)
                if scale == "row"
                else ChannelQuantizeCodec(first_visit_bits)
            )
        self.first_visit_bits = first_visit_bits
        self.bits = bits
        self.name = f"aqsgd{bits}"
        self._factory: BufferFactory = buffer_factory or MemoryBuffer
        self.buffer: ActivationBuffer | None = None
        self._row_shape: tuple[int, ...] = ()
        self._last: tuple[Tensor, Tensor] | None = None  # (ids, rows) of the last update
        self._new_memo: tuple[tuple[int, ...], Tensor] | None = None  # (ids, not yet seen)

    @property
    def buffers(self) -> Mapping[int, Tensor]:
        """Read-only view: example id -> its buffered activation (ids seen so far)."""
        return _BufferView(self.buffer)

    @property
    def buffer_bytes(self) -> int:
        """Bytes held by the buffers of the examples seen so far."""
        if self.buffer is None:
            return 0
        return int(self.buffer.seen_ids().numel()) * self.buffer.row_bytes

    def wire_bytes(self, shape: tuple[int, ...], num_new: int = 0) -> int:
        """Quantized deltas for the seen examples plus the `num_new` new ones' first visit."""
        seen = (shape[0] - num_new, *shape[1:])
        delta = self.quantizer.wire_bytes(seen) if seen[0] else 0
        return delta + self.first_visit_bytes((num_new, *shape[1:]))

    def first_visit_bytes(self, shape: tuple[int, ...]) -> int:
        """Bytes of `shape[0]` examples on their first visit: float32, or quantized."""
        if self.first_visit is None:
            return 4 * math.prod(shape)
        return self.first_visit.wire_bytes(shape) if shape[0] else 0

    def encode_first_visit(self, x: Tensor) -> tuple[Encoded, Tensor]:
        """Examples on their first visit: (what travels, the value both sides buffer).

        float32 by default (the value itself, widened from bfloat16 or float16); with
        `first_visit_bits` k <= 8, k-bit codes of the same scale type as the deltas, and both
        sides buffer the decoded value. Both parts are float32, on `x`'s device.

        Raises:
            TypeError: If `x` is not float32, bfloat16 or float16.
            ValueError: If `x` holds NaN or inf.
        """
        _check_float(x)
        x = x.float()  # the buffers and the wire are float32 whatever the activation dtype
        if self.first_visit is None:
            if not bool(torch.isfinite(x).all()):
                raise ValueError("cannot send NaN or inf; check the activations for overflow")
            return Encoded(tuple(x.shape), (x.contiguous(),)), x
        if x.shape[0] == 0:
            return Encoded(tuple(x.shape), self._no_first_visits(x.device)), x
        return self.first_visit.quantize(x)

    def decode_first_visit(self, encoded: Encoded) -> Tensor:
        """The buffered (float32) value of first-visit examples from `encode_first_visit`."""
        if self.first_visit is None:
            return encoded.tensors[0].reshape(encoded.shape)
        if encoded.shape[0] == 0:
            return torch.empty(encoded.shape, dtype=torch.float32, device=_device(encoded))
        return self.first_visit.decode(encoded)

    @property
    def first_visit_parts(self) -> int:
        """Tensors of the first-visit part of a message (1: float32 rows; 2: quantized)."""
        return 1 if self.first_visit is None else 2

    def _no_first_visits(self, device: torch.device) -> tuple[Tensor, ...]:
        if self.first_visit is None:
            return (torch.empty(0, dtype=torch.float32, device=device),)
        if isinstance(self.first_visit, ChannelQuantizeCodec):
            return (
                torch.empty(0, dtype=torch.float16, device=device),
                torch.empty((1, 0), dtype=torch.uint8, device=device),
            )
        return (
            torch.empty((0, 2), device=device),
            torch.empty((0, 0), dtype=torch.uint8, device=device),
        )

    def num_new(self, example_ids: Tensor) -> int:
        """How many of `example_ids` this side has not buffered yet."""
        if self.buffer is None:
            return int(example_ids.numel())
        return int(self._new(example_ids.long(), example_ids.reshape(-1).tolist()).sum())

    def _new(self, ids: Tensor, flat: list[int]) -> Tensor:
        """(M,) bool: not buffered yet.

        Remembered until the next write: `num_new` asks right before `encode`/`decode`.
        """
        assert self.buffer is not None
        key = tuple(flat)
        if self._new_memo is None or self._new_memo[0] != key:
            self._new_memo = (key, ~self.buffer.seen(ids))
        return self._new_memo[1]

    def rows_checksum(self, example_ids: Tensor) -> int:
        """Checksum of the buffered rows of `example_ids`, in that order (drift check).

        Computed where the rows are (no copy to the host): the rows' float32 bit patterns
        w_i (as unsigned 32-bit words, i in row-major order) give sum_i (w_i x a_i mod P)
        mod P, with P = 2^31 - 1 and a_i = (i x 48271 + 1) mod P. Every product and partial
        sum stays below 2^63, so CPU and GPU give the same int in [0, P); a changed or moved
        word changes it except by chance (about 1 in P).

        Right after an update of these ids, the rows just written are hashed (no read-back).
        """
        ids = example_ids.long()
        if self._last is not None and torch.equal(self._last[0], ids):
            rows = self._last[1]
        else:
            assert self.buffer is not None
            rows = self.buffer.peek(ids)
        words = rows.contiguous().view(torch.int32).reshape(-1).long() & 0xFFFFFFFF
        index = torch.arange(words.numel(), device=words.device, dtype=torch.int64)
        weights = (index * 48271 + 1) % _CHECKSUM_PRIME
        return int(((words * weights) % _CHECKSUM_PRIME).sum() % _CHECKSUM_PRIME)

    def prefetch(self, example_ids: Tensor, step: int) -> None:
        """Hint the buffers that `example_ids` come at `step` (a store reads them ahead)."""
        if self.buffer is not None:
            self.buffer.prefetch(example_ids.long(), step)

    def close(self) -> None:
        """Release the buffers' files and threads."""
        if self.buffer is not None:
            self.buffer.close()

    def restore_buffer(self, row_shape: tuple[int, ...]) -> ActivationBuffer:
        """A fresh, empty buffer for rows of `row_shape` (a checkpoint's rows go into it)."""
        self.close()
        self.buffer, self._row_shape, self._new_memo = self._factory(row_shape), row_shape, None
        return self.buffer

    def _prepare(self, example_ids: Tensor, row_shape: tuple[int, ...]) -> tuple[Tensor, Tensor]:
        ids, flat = _message_ids(example_ids)
        if self.buffer is None:
            self.buffer, self._row_shape = self._factory(row_shape), row_shape
        elif self._row_shape != row_shape:
            raise ValueError(
                f"example shape {row_shape} differs from the buffered {self._row_shape}; one "
                "DeltaCodec per link and tensor"
            )
        return ids, self._new(ids, flat)

    def _write(self, ids: Tensor, rows: Tensor, step: int) -> None:
        assert self.buffer is not None
        self._new_memo = None
        self.buffer.write(ids, rows, step)
        self._last = (ids, rows)

    def store(self, x: Tensor, example_ids: Tensor, step: int = 0) -> None:
        """Set the buffers of `example_ids` to `x` exactly (warm-up: x travelled as fp32).

        Raises:
            TypeError: If `x` is not float32, bfloat16 or float16, or the ids are not
                integers.
            ValueError: If ids repeat, are negative or do not match x's rows, or x holds NaN
                or inf.
        """
        _check_float(x)
        if example_ids.shape != (x.shape[0],):
            raise ValueError(
                f"example_ids must have shape ({x.shape[0]},), got {tuple(example_ids.shape)}"
            )
        if not bool(torch.isfinite(x).all()):
            raise ValueError("cannot buffer NaN or inf; check the activations for overflow")
        ids, _ = self._prepare(example_ids, tuple(x.shape[1:]))
        self._write(ids, x.to(torch.float32, copy=True), step)

    def encode(self, x: Tensor, example_ids: Tensor, step: int = 0) -> Encoded:
        """Encode; update this side's buffers with what the receiver will decode.

        The delta and the buffers are float32 whatever `x`'s dtype; the buffer rows are read
        onto `x`'s device (a memory buffer lives there already).

        Raises:
            TypeError: If `x` is not float32, bfloat16 or float16, or the ids are not
                integers.
            ValueError: If ids repeat, are negative or their count differs from x's first
                dimension, or x holds NaN or inf (nothing is buffered then).
        """
        _check_float(x)
        if example_ids.shape != (x.shape[0],):
            raise ValueError(
                f"example_ids must have shape ({x.shape[0]},), got {tuple(example_ids.shape)}"
            )
        dtype, x = x.dtype, x.float()
        ids, new = self._prepare(example_ids, tuple(x.shape[1:]))
        assert self.buffer is not None
        if not new.any():  # steady state (every example revisited): no masked copies
            reference = self.buffer.read(ids, step).to(x.device)
            delta, delta_hat = self.quantizer.quantize(x - reference)
            rows = reference.add_(delta_hat)  # the read is a copy: update it in place
            self._write(ids, rows, step)
            tensors = (*self._no_first_visits(x.device), *delta.tensors)
            return Encoded(tuple(x.shape), tensors, dtype)
        new_x = new.to(x.device)
        seen, seen_x = ~new, ~new_x
        first, first_hat = self.encode_first_visit(x[new_x])  # checks NaN and inf
        parts: list[Tensor] = list(first.tensors)
        rows = x.clone()
        if self.first_visit is not None:
            rows[new_x] = first_hat
        if seen.any():
            reference = self.buffer.read(ids[seen], step).to(x.device)
            delta, delta_hat = self.quantizer.quantize(x[seen_x] - reference)
            parts.extend(delta.tensors)
            rows[seen_x] = reference + delta_hat
        self._write(ids, rows, step)
        return Encoded(tuple(x.shape), tuple(parts), dtype)

    def decode(self, encoded: Encoded, example_ids: Tensor, step: int = 0) -> Tensor:
        """Rebuild the activations and update this side's buffers.

        Returns:
            The activations in the dtype the sender encoded (`encoded.dtype`), on the
            payload's device (the buffers stay float32).

        Raises:
            TypeError: If the ids are not integers.
            ValueError: If ids repeat, are negative or do not match the message's rows, or
                the message's first visits are not this side's unbuffered ids (the two
                sides are out of sync); nothing is buffered then.
        """
        if not isinstance(example_ids, Tensor) or example_ids.shape != encoded.shape[:1]:
            got = tuple(example_ids.shape) if isinstance(example_ids, Tensor) else example_ids
            raise ValueError(f"example_ids must have shape {encoded.shape[:1]}, got {got}")
        ids, new = self._prepare(example_ids, tuple(encoded.shape[1:]))
        assert self.buffer is not None
        num_new, parts = int(new.sum()), self.first_visit_parts
        sent_bytes = sum(t.numel() * t.element_size() for t in encoded.tensors[:parts])
        if sent_bytes != self.first_visit_bytes((num_new, *encoded.shape[1:])):
            per_example = self.first_visit_bytes((1, *encoded.shape[1:]))
            raise ValueError(
                f"the sender sent {sent_bytes} bytes of first visits ({per_example} per "
                f"example), but this side has {num_new} unbuffered id(s) "
                f"{ids[new].tolist()[:8]}: sender and receiver buffers are out of sync (same "
                "ids, same order, both sides)"
            )
        device = _device(encoded)
        if not new.any():  # steady state: no masked copies
            rows = self.buffer.read(ids, step).to(device)  # a copy
            deltas = Encoded(encoded.shape, tuple(encoded.tensors[parts:]))
            rows.add_(self.quantizer.decode(deltas))
            self._write(ids, rows, step)
            return rows.to(encoded.dtype, copy=True)
        new_x = new.to(device)
        seen, seen_x = ~new, ~new_x
        rows = torch.empty(encoded.shape, dtype=torch.float32, device=device)
        if seen.any():
            reference = self.buffer.read(ids[seen], step).to(device)
            shape = (int(seen.sum()), *encoded.shape[1:])
            delta = self.quantizer.decode(Encoded(shape, tuple(encoded.tensors[parts:])))
            rows[seen_x] = reference + delta
        first = Encoded((num_new, *encoded.shape[1:]), tuple(encoded.tensors[:parts]))
        rows[new_x] = self.decode_first_visit(first)
        self._write(ids, rows, step)
        return rows.to(encoded.dtype, copy=True)


class ErrorFeedbackCodec:
    """k-bit quantization with error feedback per example.

    What one message dropped is added to the same example's next message. The sender keeps
    a residual e per example (a buffer like AQ-SGD's, on the sender only): it sends
    Q(x + e) and keeps e <- (x + e) - Q(x + e), so over any run of messages the sum of what
    arrived differs from the sum of what was meant by the last residual only. The receiver
    decodes with the plain quantizer; the wire bytes are the quantizer's.

    Shapes:
        x: (N, ...) with one row per example; example_ids: (N,) int64, each >= 0.

    References:
        1-Bit Stochastic Gradient Descent and its Application to Data-Parallel Distributed
        Training of Speech DNNs, Interspeech 2014 (Seide et al.); Error Feedback Fixes SignSGD
        and other Gradient Compression Schemes, ICML 2019, arXiv 1901.09847.
    """

    def __init__(
        self,
        quantizer: QuantizeCodec | ChannelQuantizeCodec,
        buffer_factory: BufferFactory | None = None,
    ) -> None:
        self.quantizer = quantizer
        self._factory: BufferFactory = buffer_factory or MemoryBuffer
        self.residual: ActivationBuffer | None = None

    def wire_bytes(self, shape: tuple[int, ...]) -> int:
        """The quantizer's bytes: error feedback sends nothing more."""
        return self.quantizer.wire_bytes(shape)

    def encode(self, x: Tensor, example_ids: Tensor, step: int = 0) -> Encoded:
        """Quantize x plus each example's residual; keep the new residuals.

        The residuals are float32 whatever `x`'s dtype; the message decodes to `x`'s dtype.

        Raises:
            TypeError: If `x` is not float32, bfloat16 or float16, or the ids are not
                integers.
            ValueError: If the ids do not match x's rows, repeat or are negative, or x holds
                NaN or inf (no residual changes then).
        """
        _check_float(x)
        ids, _ = _message_ids(example_ids)
        if example_ids.shape != (x.shape[0],):
            raise ValueError(
                f"example_ids must have shape ({x.shape[0]},), got {tuple(example_ids.shape)}"
            )
        dtype, x = x.dtype, x.float()
        if self.residual is None:
            self.residual = self._factory(tuple(x.shape[1:]))
        seen = self.residual.seen(ids)
        if bool(seen.all()):
            target = x + self.residual.read(ids, step).to(x.device)
        else:
            target = x.clone()
            if bool(seen.any()):
                target[seen.to(x.device)] += self.residual.read(ids[seen], step).to(x.device)
        encoded, x_hat = self.quantizer.quantize(target)  # refuses NaN and inf
        self.residual.write(ids, target.sub_(x_hat), step)
        return Encoded(encoded.shape, encoded.tensors, dtype)

    def restore_buffer(self, row_shape: tuple[int, ...]) -> ActivationBuffer:
        """A fresh, empty residual buffer for rows of `row_shape` (a checkpoint's rows)."""
        self.close()
        self.residual = self._factory(row_shape)
        return self.residual

    def decode(self, encoded: Encoded) -> Tensor:
        """The plain quantizer's decode (the receiver keeps no state)."""
        return self.quantizer.decode(encoded)

    def close(self) -> None:
        """Release the residuals' files and threads."""
        if self.residual is not None:
            self.residual.close()


_CHECKSUM_PRIME = (1 << 31) - 1
"""P of `DeltaCodec.rows_checksum` (a Mersenne prime: weights and products fit int64)."""


def _device(encoded: Encoded) -> torch.device:
    """The device of an encoded message's payload (the CPU for one without tensors)."""
    return encoded.tensors[0].device if encoded.tensors else torch.device("cpu")


class _BufferView(Mapping[int, Tensor]):
    def __init__(self, buffer: ActivationBuffer | None) -> None:
        self._buffer = buffer
        self._ids = buffer.seen_ids() if buffer is not None else torch.zeros(0, dtype=torch.long)

    def __getitem__(self, key: int) -> Tensor:
        if self._buffer is None or key < 0 or not bool(self._buffer.seen(torch.tensor([key]))[0]):
            raise KeyError(key)
        return self._buffer.peek(torch.tensor([key]))[0]

    def __iter__(self) -> Iterator[int]:
        return iter(self._ids.tolist())

    def __len__(self) -> int:
        return int(self._ids.numel())
