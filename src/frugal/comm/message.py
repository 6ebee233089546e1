"""Pipeline messages: a 128-byte header and a uint8 payload, sent as one buffer.

A `CodecSpec` (`frugal.parallel.codec`) names what a pipeline link does in
each direction (`fp32`, `fp16`, `bf16`, `directq:fw2,bw4`, `aqsgd:fw2,bw4`); a `LinkCodec` is
one side (sender or receiver) of one link in one direction. `LinkCodec.encode` returns the
header and payload that travel; the exact bytes on the wire are `HEADER_BYTES + payload`,
known up front from `message_wire_bytes`, and the receiver computes them itself
(`LinkCodec.payload_bytes`), so header and payload travel as one message (one rendezvous
instead of two: 3.7 vs 7.8 ms per 131 KB round trip on a loaded 2-core machine).

Header (16 x int64): magic, version, codec id, kind (0 activation, 1 gradient), step,
micro-batch, bits, dtype, shape[4] (-1 padded), payload bytes, new examples (AQ-SGD first
visits), flags (bit 0: non-finite values at the sender), buffer checksum (AQ-SGD drift check,
`DeltaCodec.rows_checksum`, computed on the rows' device; -1 when not checked).

Shape legend: M micro-batch (examples), T tokens, H hidden.

References:
    Fine-tuning Language Models over Slow Networks using Activation Compression with
    Guarantees, NeurIPS 2022, arXiv 2206.01299 (AQ-SGD forward deltas, DirectQ backward).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from frugal import FrugalError
from frugal.comm.buffers import BufferFactory
from frugal.comm.codecs import (
    ChannelQuantizeCodec,
    DeltaCodec,
    Encoded,
    ErrorFeedbackCodec,
    HalfCodec,
    IdentityCodec,
    QuantizeCodec,
)
from frugal.parallel import codec as wire
from frugal.parallel.codec import HEADER_BYTES, KIND_ACTIVATION, KIND_GRADIENT, CodecSpec

__all__ = [
    "HEADER_WORDS",
    "BufferDriftError",
    "LinkCodec",
    "NonFiniteMessageError",
    "ProtocolError",
    "all_finite",
    "delta_codec_for",
    "parse_header",
    "quantizer_for",
]

HEADER_WORDS = 16
assert HEADER_BYTES == 8 * HEADER_WORDS
MAGIC = 0x46525547  # "FRUG"
VERSION = 3
"""2 -> 3: the drift field is `DeltaCodec.rows_checksum` (was zlib CRC32); dtype ids 2, 3."""
FLAG_NONFINITE = 1
_DTYPE_IDS = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 3}
"""Header `dtype` field: the dtype of the tensor the sender encoded, which decode returns."""
_DTYPES = {v: k for k, v in _DTYPE_IDS.items()}


class ProtocolError(FrugalError):
    """A message header that does not match what this side expects (magic, codec, step...)."""


class NonFiniteMessageError(FrugalError):
    """The peer flagged NaN/inf in the tensor it was sending."""


class BufferDriftError(FrugalError):
    """Sender and receiver AQ-SGD buffers differ (checksum mismatch after the update)."""


def quantizer_for(spec: CodecSpec, kind: int) -> QuantizeCodec | ChannelQuantizeCodec:
    """The k-bit quantizer of direction `kind` of a directq or aqsgd spec."""
    bits = spec.bits(kind)
    return QuantizeCodec(bits) if spec.scale == "row" else ChannelQuantizeCodec(bits)


def delta_codec_for(spec: CodecSpec, buffer_factory: BufferFactory | None = None) -> DeltaCodec:
    """The AQ-SGD activation codec of an aqsgd spec."""
    return DeltaCodec(spec.fw_bits, spec.scale, buffer_factory, spec.first_visit_bits)


def parse_header(header: Tensor) -> dict[str, int]:
    """Named fields of a received header.

    Raises:
        ProtocolError: If the magic or version is wrong.
    """
    words = [int(v) for v in header.tolist()]
    if words[0] != MAGIC or words[1] != VERSION:
        raise ProtocolError(
            f"bad message header (magic {words[0]:#x}, version {words[1]}); expected "
            f"{MAGIC:#x} v{VERSION}: every rank must run the same frugal"
        )
    return {
        "codec": words[2],
        "kind": words[3],
        "step": words[4],
        "mb": words[5],
        "bits": words[6],
        "dtype": words[7],
        "shape": tuple(w for w in words[8:12] if w >= 0),  # type: ignore[dict-item]
        "payload_bytes": words[12],
        "num_new": words[13],
        "flags": words[14],
        "crc32": words[15],
    }


def _to_payload(encoded: Encoded, device: torch.device) -> Tensor:
    parts = [t.contiguous().reshape(-1).view(torch.uint8) for t in encoded.tensors]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8, device=device)


def _take(payload: Tensor, offset: int, dtype: torch.dtype, shape: tuple[int, ...]) -> Tensor:
    size = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
    return payload[offset : offset + size].view(dtype).reshape(shape)


def _quantized_parts(
    payload: Tensor, offset: int, shape: tuple[int, ...], bits: int, scale: str
) -> tuple[Tensor, Tensor]:
    rows, cols = math.prod(shape[:-1]), shape[-1]
    if scale == "channel":  # fp16 scale per channel, then the whole message's codes
        scales = _take(payload, offset, torch.float16, (cols,))
        size = math.ceil(rows * cols * bits / 8)
        return scales, _take(payload, offset + 2 * cols, torch.uint8, (1, size))
    header = _take(payload, offset, torch.float32, (rows, 2))
    packed = _take(payload, offset + 8 * rows, torch.uint8, (rows, math.ceil(cols * bits / 8)))
    return header, packed


def all_finite(x: Tensor) -> bool:
    """Whether every value of `x` is finite: its min or max is NaN or inf exactly when one is.

    One pass with no temporary (`torch.aminmax`), where `isfinite(x).all()` builds a boolean
    tensor as large as `x`: 0.3 ms against 2.4 ms per million float32 values on one core.
    """
    if x.numel() == 0:
        return True
    low, high = torch.aminmax(x.detach())
    return bool(torch.isfinite(low)) and bool(torch.isfinite(high))


class LinkCodec:
    """One side (sender or receiver) of one pipeline link in one direction.

    Args:
        spec: The link's codec.
        kind: KIND_ACTIVATION (forward) or KIND_GRADIENT (backward).
        warmup_steps: Steps (from 0) during which everything travels as fp32 (the reference's
            warm-up; AQ-SGD buffers are still filled, so deltas can start after it).
        buffer_factory: Where AQ-SGD's per-example buffers live (`frugal.comm.buffers`;
            None: RAM).
    """

    def __init__(
        self,
        spec: CodecSpec,
        kind: int,
        warmup_steps: int = 0,
        buffer_factory: BufferFactory | None = None,
    ) -> None:
        self.spec = spec
        self.kind = kind
        self.warmup_steps = warmup_steps
        self.delta: DeltaCodec | None = None
        if spec.method == "aqsgd" and kind == KIND_ACTIVATION:
            self.delta = delta_codec_for(spec, buffer_factory)
        self.feedback: ErrorFeedbackCodec | None = None
        if spec.bw_error_feedback and kind == KIND_GRADIENT:
            self.feedback = ErrorFeedbackCodec(quantizer_for(spec, kind))
        self._fp32 = IdentityCodec()
        self.sent_bytes = 0
        """Wire bytes this side encoded or decoded so far (header + payload)."""

    def _plain(self, step: int) -> IdentityCodec | HalfCodec | QuantizeCodec | ChannelQuantizeCodec:
        method = "fp32" if step < self.warmup_steps else self.spec.method
        if method == "fp32":
            return self._fp32
        if method in ("fp16", "bf16"):
            return HalfCodec(torch.float16 if method == "fp16" else torch.bfloat16)
        return quantizer_for(self.spec, self.kind)

    def payload_bytes(self, shape: tuple[int, ...], example_ids: Tensor, step: int) -> int:
        """Payload bytes of the message for a tensor of `shape` at `step` (no header).

        Either side computes it from its own state: AQ-SGD's first visits are counted in this
        side's buffers (the receiver's match the sender's, or the ids differ across ranks), so
        the receiver knows how many bytes to expect before anything arrives.
        """
        num_new = self.delta.num_new(example_ids) if self.delta is not None else 0
        warmup = step < self.warmup_steps
        return wire.payload_bytes(self.spec, self.kind, shape, num_new, warmup)

    def encode(
        self, x: Tensor, example_ids: Tensor, step: int, mb: int, check_crc: bool = False
    ) -> tuple[Tensor, Tensor, bool]:
        """Encode `x` for the wire.

        The header and payload are on `x`'s device; the header records `x`'s dtype, which
        the receiver's `decode` returns (the wire format and size do not depend on it).

        Returns:
            (header int64[16], payload uint8[P], finite). When `x` holds NaN/inf the payload is
            zeros of the expected size (`payload_bytes`), the header is flagged and finite is
            False (send it, then fail): the receiver gets the message it waits for and fails too.

        Raises:
            TypeError: If `x` is not float32, bfloat16 or float16.

        Shapes:
            x: (M, ...) float32, bfloat16 or float16; example_ids: (M,) int64.
        """
        if x.dtype not in _DTYPE_IDS:
            raise TypeError(
                f"pipeline messages carry float32, bfloat16 or float16, got {x.dtype}; cast "
                "the activation with .to(torch.bfloat16) or .float()"
            )
        finite = all_finite(x)
        num_new, crc, flags = 0, -1, 0
        if not finite:
            size = self.payload_bytes(tuple(x.shape), example_ids, step)
            payload = torch.zeros(size, dtype=torch.uint8, device=x.device)
            flags = FLAG_NONFINITE
        elif self.delta is not None:
            num_new = self.delta.num_new(example_ids)
            if step < self.warmup_steps:  # warm-up: every example as a first visit
                first, first_hat = self.delta.encode_first_visit(x)
                self.delta.store(first_hat, example_ids, step)
                payload, num_new = _to_payload(first, x.device), x.shape[0]
            else:
                payload = _to_payload(self.delta.encode(x, example_ids, step), x.device)
            if check_crc:
                crc = self.delta.rows_checksum(example_ids)
        elif self.feedback is not None and step >= self.warmup_steps:
            payload = _to_payload(self.feedback.encode(x, example_ids, step), x.device)
        else:
            payload = _to_payload(self._plain(step).encode(x), x.device)
        shape = [*x.shape, *([-1] * (4 - x.dim()))]
        header = torch.tensor(
            [
                MAGIC,
                VERSION,
                self.spec.codec_id,
                self.kind,
                step,
                mb,
                self._bits(step),
                _DTYPE_IDS[x.dtype],
                *shape,
                payload.numel(),
                num_new,
                flags,
                crc,
            ],
            dtype=torch.int64,
            device=x.device,
        )
        self.sent_bytes += HEADER_BYTES + payload.numel()
        return header, payload, finite

    def _bits(self, step: int) -> int:
        if step >= self.warmup_steps:
            return self.spec.bits(self.kind)
        return self.delta.first_visit_bits if self.delta is not None else 32

    def expect(self, header: Tensor, step: int, mb: int) -> dict[str, int]:
        """Parse and check a received header against (codec, kind, step, micro-batch).

        Raises:
            ProtocolError: If any field differs.
            NonFiniteMessageError: If the sender flagged NaN/inf.
        """
        fields = parse_header(header)
        want = (self.spec.codec_id, self.kind, step, mb)
        got = (fields["codec"], fields["kind"], fields["step"], fields["mb"])
        if got != want:
            raise ProtocolError(
                f"expected (codec, kind, step, mb) = {want}, received {got}: the ranks run "
                "different codecs or schedules"
            )
        if fields["flags"] & FLAG_NONFINITE:
            raise NonFiniteMessageError(
                f"the peer sent NaN/inf in its {'activation' if self.kind == 0 else 'gradient'}"
                f" at step {step}, micro-batch {mb}"
            )
        return fields

    def _first_visit_parts(self, payload: Tensor, shape: tuple[int, ...]) -> tuple[Tensor, ...]:
        """The first-visit tensors of `shape[0]` examples at the payload's start."""
        assert self.delta is not None
        if self.delta.first_visit is None:
            return (_take(payload, 0, torch.float32, shape),)
        if shape[0] == 0:
            empty = torch.empty(shape, device=payload.device)
            return self.delta.encode_first_visit(empty)[0].tensors
        return _quantized_parts(payload, 0, shape, self.delta.first_visit_bits, self.spec.scale)

    def decode(self, fields: dict[str, int], payload: Tensor, example_ids: Tensor) -> Tensor:
        """Rebuild the tensor from a checked header and its payload.

        Returns:
            The tensor, in the dtype the sender encoded (the header's), on the payload's
            device.

        Raises:
            ProtocolError: If the payload size, the first-visit count or the dtype does not
                match.
            BufferDriftError: If the header's buffer checksum differs from this side's.
        """
        shape: tuple[int, ...] = fields["shape"]  # type: ignore[assignment]
        step = fields["step"]
        if fields["dtype"] not in _DTYPES:
            raise ProtocolError(
                f"step {step} mb {fields['mb']}: unknown dtype id {fields['dtype']} in the "
                f"header (known: {_DTYPE_IDS}); every rank must run the same frugal"
            )
        dtype = _DTYPES[fields["dtype"]]
        self.sent_bytes += HEADER_BYTES + payload.numel()
        if self.delta is not None:
            num_new = self.delta.num_new(example_ids)
            if step < self.warmup_steps:
                x = self.delta.decode_first_visit(
                    Encoded(shape, self._first_visit_parts(payload, shape))
                ).clone()
                self.delta.store(x, example_ids, step)
                x = x.to(dtype)
            else:
                if num_new != fields["num_new"]:
                    raise ProtocolError(
                        f"step {step} mb {fields['mb']}: sender saw {fields['num_new']} new "
                        f"examples, receiver {num_new}; the example ids differ across ranks"
                    )
                rows_new = (num_new, *shape[1:])
                parts: list[Tensor] = list(self._first_visit_parts(payload, rows_new))
                seen = (shape[0] - num_new, *shape[1:])
                if seen[0]:
                    off = self.delta.first_visit_bytes(rows_new)
                    parts.extend(
                        _quantized_parts(payload, off, seen, self.spec.fw_bits, self.spec.scale)
                    )
                x = self.delta.decode(Encoded(shape, tuple(parts), dtype), example_ids, step)
            if fields["crc32"] >= 0 and self.delta.rows_checksum(example_ids) != fields["crc32"]:
                raise BufferDriftError(
                    f"AQ-SGD buffers drifted at step {step} mb {fields['mb']} for examples "
                    f"{example_ids.tolist()}: sender and receiver rows differ"
                )
            return x
        codec = self._plain(step)
        if isinstance(codec, IdentityCodec):
            parts = [_take(payload, 0, torch.float32, shape)]
        elif isinstance(codec, HalfCodec):
            parts = [_take(payload, 0, codec.dtype, shape)]
        else:
            parts = list(_quantized_parts(payload, 0, shape, codec.bits, self.spec.scale))
        return codec.decode(Encoded(shape, tuple(parts), dtype)).clone()
