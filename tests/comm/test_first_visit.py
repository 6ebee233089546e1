"""AQ-SGD's compressed first visit (`:fvF`) and error-feedback gradients (`:ef`)."""

from __future__ import annotations

import math

import pytest
import torch

from frugal.comm.codecs import ChannelQuantizeCodec, DeltaCodec
from frugal.comm.message import LinkCodec
from frugal.parallel.codec import (
    HEADER_BYTES,
    KIND_ACTIVATION,
    KIND_GRADIENT,
    CodecSpec,
    message_wire_bytes,
)


def test_spec_parses_labels_and_ids_the_first_visit_suffix() -> None:
    spec = CodecSpec.parse("aqsgd:fw2,bw4:row:fv8")
    assert (spec.method, spec.fw_bits, spec.bw_bits, spec.scale) == ("aqsgd", 2, 4, "row")
    assert spec.first_visit_bits == 8 and spec.label == "aqsgd:fw2,bw4:row:fv8"
    plain = CodecSpec.parse("aqsgd:fw2,bw4:row")
    assert plain.first_visit_bits == 32 and plain.label == "aqsgd:fw2,bw4:row"
    assert spec.codec_id != plain.codec_id  # ranks that disagree fail on the first header
    assert CodecSpec.parse("aqsgd:fw2,bw4:fv4").label == "aqsgd:fw2,bw4:fv4"
    with pytest.raises(ValueError, match="directq has none"):
        CodecSpec.parse("directq:fw2,bw4:fv8")
    with pytest.raises(ValueError, match="optionally followed by :row"):
        CodecSpec.parse("aqsgd:fw2,bw4:fv9")
    with pytest.raises(ValueError, match=r"first_visit_bits=0 must be 32 \(float32\) or in"):
        DeltaCodec(2, first_visit_bits=0)


@pytest.mark.parametrize("scale", ["channel", "row"])
def test_first_visits_travel_quantized_and_both_buffers_agree(scale: str) -> None:
    gen = torch.Generator().manual_seed(0)
    sender = DeltaCodec(2, scale, first_visit_bits=8)
    receiver = DeltaCodec(2, scale, first_visit_bits=8)
    plain = DeltaCodec(2, scale)
    shape = (4, 6, 16)
    # Step 0: all new; step 1: two revisits and two new; step 2: all revisits.
    for ids in ([0, 1, 2, 3], [2, 9, 0, 7], [9, 7, 3, 1]):
        example_ids = torch.tensor(ids)
        num_new = sender.num_new(example_ids)
        x = torch.randn(shape, generator=gen)
        encoded = sender.encode(x, example_ids)
        assert encoded.nbytes == sender.wire_bytes(shape, num_new)
        out = receiver.decode(encoded, example_ids)
        for i in ids:
            assert torch.equal(sender.buffers[i], receiver.buffers[i])
        if num_new == 4:  # every row is a first visit: 8-bit error, a quarter of fp32's bytes
            # Channel: step s / 128, and the top value clips by one step (the reference's
            # asymmetric levels) plus the fp16 rounding of s (2^-11 s = 0.064 steps).
            per_channel = x.reshape(-1, 16).abs().amax(dim=0) / 128 * 1.07
            per_row = (x.amax(dim=-1) - x.amin(dim=-1)) / 255 / 2 * 1.001
            bound = per_channel if scale == "channel" else per_row.unsqueeze(-1)
            assert torch.all((out - x).abs() <= bound)
            assert encoded.nbytes < plain.wire_bytes(shape, num_new) / 2.5
    # By hand, channel scales: 4 new rows of 6 x 16 = 384 values at 8 bits + 16 fp16 scales.
    if scale == "channel":
        assert sender.wire_bytes(shape, 4) == 384 + 2 * 16
        assert sender.first_visit_bytes((0, 6, 16)) == 0


def test_link_codec_warmup_and_first_visits_match_the_analytic_bytes() -> None:
    spec = CodecSpec.parse("aqsgd:fw2,bw4:fv8")
    sender = LinkCodec(spec, KIND_ACTIVATION, warmup_steps=1)
    receiver = LinkCodec(spec, KIND_ACTIVATION, warmup_steps=1)
    gen = torch.Generator().manual_seed(1)
    shape = (4, 8, 32)
    for step, ids in enumerate(([0, 1, 2, 3], [0, 1, 5, 6], [5, 6, 0, 1])):
        example_ids = torch.tensor(ids)
        num_new = 4 if step == 0 else sender.delta.num_new(example_ids)  # type: ignore[union-attr]
        x = torch.randn(shape, generator=gen)
        header, payload, finite = sender.encode(x, example_ids, step, mb=0)
        assert finite
        expected = message_wire_bytes(spec, KIND_ACTIVATION, shape, num_new, warmup=step == 0)
        assert HEADER_BYTES + payload.numel() == expected
        assert payload.numel() == receiver.payload_bytes(shape, example_ids, step)
        out = receiver.decode(receiver.expect(header, step, 0), payload, example_ids)
        assert out.shape == shape
        for i in ids:
            mine = sender.delta.buffers[i]  # type: ignore[union-attr]
            assert torch.equal(mine, receiver.delta.buffers[i])  # type: ignore[union-attr]
    # The warm-up sent 8-bit codes, not float32: 4 x 8 x 32 values + 32 fp16 scales.
    n = math.prod(shape)
    assert message_wire_bytes(spec, KIND_ACTIVATION, shape, warmup=True) == HEADER_BYTES + n + 64
    assert ChannelQuantizeCodec(8).wire_bytes(shape) == n + 64


def test_error_feedback_sums_differ_from_the_truth_by_the_last_residual_only() -> None:
    from frugal.comm.codecs import ErrorFeedbackCodec, QuantizeCodec

    codec, plain = ErrorFeedbackCodec(ChannelQuantizeCodec(2)), ChannelQuantizeCodec(2)
    gen = torch.Generator().manual_seed(2)
    ids = torch.tensor([3, 1])
    meant, arrived, plain_arrived = torch.zeros(2, 5, 8), torch.zeros(2, 5, 8), torch.zeros(2, 5, 8)
    for _ in range(20):
        x = torch.randn(2, 5, 8, generator=gen)
        encoded = codec.encode(x, ids)
        assert encoded.nbytes == plain.wire_bytes((2, 5, 8))  # no extra bytes
        meant += x
        arrived += codec.decode(encoded)
        plain_arrived += plain.decode(plain.encode(x))
    assert codec.residual is not None
    residual = torch.stack([codec.residual.peek(torch.tensor([i]))[0] for i in (3, 1)])
    assert torch.allclose(meant - arrived, residual, atol=1e-4)
    # Without feedback the error of the sum grows with the steps; with it, it stays bounded.
    assert (meant - arrived).abs().mean() < 0.5 * (meant - plain_arrived).abs().mean()
    with pytest.raises(ValueError, match="repeat within one message"):
        codec.encode(torch.zeros(2, 5, 8), torch.tensor([4, 4]))
    with pytest.raises(ValueError, match="NaN or inf"):
        ErrorFeedbackCodec(QuantizeCodec(4)).encode(torch.full((1, 3), float("nan")), ids[:1])


def test_error_feedback_spec_and_link_codec_bytes() -> None:
    spec = CodecSpec.parse("aqsgd:fw2,bw4:row:fv8:ef")
    assert spec.bw_error_feedback and spec.first_visit_bits == 8
    assert spec.label == "aqsgd:fw2,bw4:row:fv8:ef"
    assert CodecSpec.parse("directq:fw2,bw4:ef").label == "directq:fw2,bw4:ef"
    assert spec.codec_id != CodecSpec.parse("aqsgd:fw2,bw4:row:fv8").codec_id
    sender = LinkCodec(CodecSpec.parse("directq:fw2,bw4:ef"), KIND_GRADIENT)
    receiver = LinkCodec(CodecSpec.parse("directq:fw2,bw4:ef"), KIND_GRADIENT)
    ids = torch.arange(4)
    for step in range(3):
        g = torch.randn(4, 8, 16)
        header, payload, _ = sender.encode(g, ids, step, mb=0)
        expected = message_wire_bytes(sender.spec, KIND_GRADIENT, (4, 8, 16))
        assert HEADER_BYTES + payload.numel() == expected
        out = receiver.decode(receiver.expect(header, step, 0), payload, ids)
        assert out.shape == g.shape
    assert sender.feedback is not None and receiver.feedback is not None
    assert receiver.feedback.residual is None  # the receiver keeps no state
