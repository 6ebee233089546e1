"""Codecs on bfloat16 / float16 tensors: same bytes, same bounds as float32, input dtype back.

Every codec computes in float32 and casts its result to the dtype it was given, so a bfloat16
round trip is the float32 round trip of the (exactly widened) input, rounded once to bfloat16.
"""

from __future__ import annotations

import pytest
import torch

from frugal.comm.codecs import (
    ChannelQuantizeCodec,
    DeltaCodec,
    ErrorFeedbackCodec,
    HalfCodec,
    IdentityCodec,
    QuantizeCodec,
)
from frugal.comm.message import LinkCodec, parse_header
from frugal.parallel.codec import KIND_ACTIVATION, KIND_GRADIENT, CodecSpec

LOW = [torch.bfloat16, torch.float16]
CODECS = [
    IdentityCodec(),
    HalfCodec(torch.float16),
    HalfCodec(torch.bfloat16),
    QuantizeCodec(2),
    QuantizeCodec(3),
    ChannelQuantizeCodec(2),
    ChannelQuantizeCodec(4),
]

BF16_UNIT_ROUNDOFF = 2.0**-8
"""Round-to-nearest into bfloat16 (8 significant bits) moves v by at most 2^-8 |v|."""


def _x(dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(3, 4, 10, generator=torch.Generator().manual_seed(7)).to(dtype)


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_a_low_precision_round_trip_is_the_float32_one_in_the_input_dtype(
    codec: IdentityCodec | HalfCodec | QuantizeCodec | ChannelQuantizeCodec, dtype: torch.dtype
) -> None:
    x = _x(dtype)
    encoded = codec.encode(x)
    out = codec.decode(encoded)
    assert out.dtype == dtype and out.shape == x.shape and out.device == x.device
    # The wire does not depend on the dtype: the float32 size, exactly.
    assert encoded.nbytes == codec.wire_bytes(tuple(x.shape))
    assert encoded.nbytes == codec.encode(x.float()).nbytes
    # Same codes as the float32 input's (bf16/fp16 -> float32 is exact), one final rounding.
    assert torch.equal(out, codec.decode(codec.encode(x.float())).to(dtype))


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_directq_on_bfloat16_keeps_the_half_step_bound(bits: int) -> None:
    x = _x(torch.bfloat16)
    codec = QuantizeCodec(bits)
    out = codec.decode(codec.encode(x))
    rows, rows_hat = x.float().reshape(12, 10), out.float().reshape(12, 10)
    step = (rows.amax(dim=1) - rows.amin(dim=1)) / ((1 << bits) - 1)
    # float32's bound (step / 2), plus the one rounding of the result into bfloat16.
    bound = step.unsqueeze(1) / 2 + BF16_UNIT_ROUNDOFF * rows_hat.abs() + 1e-6
    assert torch.all((rows_hat - rows).abs() <= bound)


def test_directq_on_bfloat16_by_hand() -> None:
    # Row [0, 0.5, 1.25, 3] at 2 bits: min 0, step (3 - 0) / 3 = 1; codes round(x / 1) =
    # [0, 0 (half to even), 1, 3] -> [0, 0, 1, 3]: errors [0, 0.5, 0.25, 0] <= step / 2,
    # every value a bfloat16 (no final rounding), so the bound is float32's exactly.
    x = torch.tensor([[0.0, 0.5, 1.25, 3.0]], dtype=torch.bfloat16)
    codec = QuantizeCodec(2)
    out = codec.decode(codec.encode(x))
    assert out.dtype == torch.bfloat16
    assert out.tolist() == [[0.0, 0.0, 1.0, 3.0]]
    # Channel scales s = max |x| per channel = (1, 2); 2 bits: levels (code) x s / 2 with
    # code in [-2, 1]. Channel 0: -1 -> -2 -> -1.0, 0.5 -> 1 -> 0.5 (the top level, s / 2).
    # Channel 1: 2.0 -> 2, clipped to 1 -> 1.0 (the reference's asymmetric clip); -2 -> -2.0.
    channel = ChannelQuantizeCodec(2)
    y = torch.tensor([[-1.0, 2.0], [0.5, -2.0]], dtype=torch.bfloat16)
    assert channel.decode(channel.encode(y)).tolist() == [[-1.0, 1.0], [0.5, -2.0]]


@pytest.mark.parametrize("scale", ["row", "channel"])
def test_aqsgd_on_bfloat16_keeps_float32_buffers_that_agree(scale: str) -> None:
    sender, receiver = DeltaCodec(2, scale=scale), DeltaCodec(2, scale=scale)
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(4, 6, 8, generator=gen)
    ids = torch.tensor([5, 1, 9, 2])
    first = base.to(torch.bfloat16)
    out = receiver.decode(sender.encode(first, ids), ids)
    assert out.dtype == torch.bfloat16 and torch.equal(out, first)  # first visit: exact
    for epoch in range(1, 4):
        x = (base + 0.01 * epoch * torch.randn(4, 6, 8, generator=gen)).to(torch.bfloat16)
        previous = torch.stack([sender.buffers[int(i)] for i in ids])
        encoded = sender.encode(x, ids)
        assert encoded.nbytes == sender.wire_bytes((4, 6, 8))  # float32's size
        out = receiver.decode(encoded, ids)
        assert out.dtype == torch.bfloat16
        rows = torch.stack([receiver.buffers[int(i)] for i in ids])
        assert rows.dtype == torch.float32
        assert torch.equal(rows, torch.stack([sender.buffers[int(i)] for i in ids]))
        assert torch.equal(out, rows.to(torch.bfloat16))  # what the receiver computes with
        if scale == "row":  # the half-step bound of the change, as for float32 input
            delta = (x.float() - previous).reshape(-1, 8)
            step = (delta.amax(dim=1) - delta.amin(dim=1)) / 3
            error = (rows - x.float()).reshape(-1, 8).abs().amax(dim=1)
            assert torch.all(error <= step / 2 + 1e-6)
        assert sender.rows_checksum(ids) == receiver.rows_checksum(ids)


def test_error_feedback_returns_the_input_dtype() -> None:
    codec = ErrorFeedbackCodec(QuantizeCodec(4))
    x = _x(torch.bfloat16)
    encoded = codec.encode(x, torch.arange(3))
    assert encoded.dtype == torch.bfloat16
    assert codec.decode(encoded).dtype == torch.bfloat16
    assert codec.residual is not None
    assert codec.residual.read(torch.arange(3), 0).dtype == torch.float32


def test_rows_checksum_by_hand_and_on_change() -> None:
    codec = DeltaCodec(2)
    codec.store(torch.tensor([[1.0]]), torch.tensor([0]))
    # 1.0f is 0x3F800000 = 1,065,353,216; its weight a_0 = 0 x 48271 + 1 = 1; mod 2^31 - 1.
    assert codec.rows_checksum(torch.tensor([0])) == 1_065_353_216
    codec = DeltaCodec(2)
    codec.store(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([1, 2]))
    both = codec.rows_checksum(torch.tensor([1, 2]))
    assert both != codec.rows_checksum(torch.tensor([2, 1]))  # the order counts
    codec.store(torch.tensor([[1.0, 2.0], [3.0, 4.000001]]), torch.tensor([1, 2]))
    assert codec.rows_checksum(torch.tensor([1, 2])) != both


@pytest.mark.parametrize("spec", ["fp32", "bf16", "directq:fw2,bw4", "aqsgd:fw2,bw4"])
def test_link_codec_carries_the_dtype_in_the_header(spec: str) -> None:
    parsed = CodecSpec.parse(spec)
    ids = torch.arange(2)
    for kind in (KIND_ACTIVATION, KIND_GRADIENT):
        sender, receiver = LinkCodec(parsed, kind), LinkCodec(parsed, kind)
        for step in range(2):  # AQ-SGD: a first visit, then a delta
            x = torch.randn(2, 4, 8).to(torch.bfloat16)
            size = sender.payload_bytes((2, 4, 8), ids, step)  # before the buffers change
            header, payload, finite = sender.encode(x, ids, step, 0)
            fields = parse_header(header)
            assert finite and fields["dtype"] == 3  # bfloat16's id
            assert payload.numel() == size
            out = receiver.decode(receiver.expect(header, step, 0), payload, ids)
            assert out.dtype == torch.bfloat16 and out.shape == x.shape
            first_visit = parsed.method == "aqsgd" and kind == KIND_ACTIVATION and step == 0
            if spec in ("fp32", "bf16") or first_visit:
                assert torch.equal(out, x)  # lossless for a bfloat16 value
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        LinkCodec(parsed, KIND_ACTIVATION).encode(torch.zeros(2, 2, dtype=torch.float64), ids, 0, 0)
