"""Codecs: round trips, error bounds, exact wire sizes, AQ-SGD buffer agreement."""

from __future__ import annotations

import math

import pytest
import torch

from frugal.comm.codecs import (
    ChannelQuantizeCodec,
    DeltaCodec,
    Encoded,
    HalfCodec,
    IdentityCodec,
    QuantizeCodec,
    pack_bits,
    unpack_bits,
)


@pytest.mark.parametrize("bits", range(1, 9))
def test_bit_packing_round_trips(bits: int) -> None:
    gen = torch.Generator().manual_seed(bits)
    codes = torch.randint(0, 1 << bits, (3, 13), generator=gen, dtype=torch.uint8)
    packed = pack_bits(codes, bits)
    assert packed.dtype == torch.uint8
    assert packed.shape == (3, math.ceil(13 * bits / 8))
    assert torch.equal(unpack_bits(packed, bits, 13), codes)


def test_packing_by_hand() -> None:
    # 2-bit codes [1, 2, 3, 0], one byte: code i at bit 2 i -> 0b00111001 = 57.
    packed = pack_bits(torch.tensor([[1, 2, 3, 0]], dtype=torch.uint8), 2)
    assert packed.tolist() == [[57]]


def test_identity_is_lossless_and_half_halves_the_bytes() -> None:
    x = torch.randn(4, 6)
    for codec, per_value in (
        (IdentityCodec(), 4),
        (HalfCodec(), 2),
        (HalfCodec(torch.bfloat16), 2),
    ):
        encoded = codec.encode(x)
        assert encoded.nbytes == codec.wire_bytes((4, 6)) == per_value * 24
        out = codec.decode(encoded)
        assert out.shape == x.shape
        assert out.dtype == torch.float32
    assert torch.equal(IdentityCodec().decode(IdentityCodec().encode(x)), x)


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
def test_quantizer_error_is_at_most_half_a_step(bits: int) -> None:
    x = torch.randn(5, 2, 17, generator=torch.Generator().manual_seed(0))
    codec = QuantizeCodec(bits)
    encoded = codec.encode(x)
    # Per row: 8 header bytes + ceil(17 k / 8) code bytes; 10 rows.
    assert encoded.nbytes == codec.wire_bytes((5, 2, 17)) == 10 * (8 + math.ceil(17 * bits / 8))
    out = codec.decode(encoded)
    rows = x.reshape(10, 17)
    step = (rows.max(dim=1).values - rows.min(dim=1).values) / ((1 << bits) - 1)
    error = (out.reshape(10, 17) - rows).abs().max(dim=1).values
    assert torch.all(error <= step / 2 + 1e-6)


def test_quantizer_by_hand_and_constant_rows() -> None:
    # Row [0, 1, 2, 3] at 2 bits: min 0, step 1 -> exact. A constant row decodes exactly.
    codec = QuantizeCodec(2)
    x = torch.tensor([[0.0, 1.0, 2.0, 3.0], [5.0, 5.0, 5.0, 5.0]])
    assert torch.equal(codec.decode(codec.encode(x)), x)
    with pytest.raises(ValueError, match="bits=9"):
        QuantizeCodec(9)
    with pytest.raises(ValueError, match="NaN or inf"):
        codec.encode(torch.tensor([[float("nan"), 1.0]]))
    with pytest.raises(TypeError, match="float32"):
        codec.encode(torch.zeros(2, 2, dtype=torch.float64))


def test_aqsgd_sender_and_receiver_buffers_agree() -> None:
    sender, receiver = DeltaCodec(2), DeltaCodec(2)
    gen = torch.Generator().manual_seed(1)
    base = torch.randn(6, 8, generator=gen)
    ids = torch.arange(6)
    first = sender.encode(base, ids)
    assert first.nbytes == sender.wire_bytes((6, 8), num_new=6) == 6 * 8 * 4  # all new: fp32
    assert torch.equal(receiver.decode(first, ids), base)
    for epoch in range(1, 6):
        x = base + 0.01 * epoch * torch.randn(6, 8, generator=gen)  # activations drift slowly
        delta = x - torch.stack([sender.buffers[i] for i in range(6)])
        step = (delta.max(dim=1).values - delta.min(dim=1).values) / 3  # 2 bits: 3 steps
        encoded = sender.encode(x, ids)
        # All seen: 6 rows x (8 header + ceil(8 * 2 / 8) = 2 code bytes) = 60 bytes.
        assert encoded.nbytes == sender.wire_bytes((6, 8)) == 60
        out = receiver.decode(encoded, ids)
        error = (out - x).abs().max(dim=1).values
        assert torch.all(error <= step / 2 + 1e-6)  # the bound applies to the change
        direct_step = (x.max(dim=1).values - x.min(dim=1).values) / 3
        assert torch.all(error < direct_step / 4)  # far below quantizing x itself
        for i in range(6):
            assert torch.equal(sender.buffers[i], receiver.buffers[i])  # never drift apart


def test_aqsgd_mixed_new_and_seen_examples() -> None:
    sender, receiver = DeltaCodec(4), DeltaCodec(4)
    x = torch.randn(3, 5)
    receiver.decode(sender.encode(x, torch.tensor([0, 1, 2])), torch.tensor([0, 1, 2]))
    y = torch.randn(3, 5)
    ids = torch.tensor([2, 7, 0])  # 7 is new
    encoded = sender.encode(y, ids)
    assert encoded.nbytes == sender.wire_bytes((3, 5), num_new=1)
    out = receiver.decode(encoded, ids)
    assert torch.equal(out[1], y[1])  # the new example travels exactly
    with pytest.raises(ValueError, match="repeat"):
        sender.encode(y, torch.tensor([1, 1, 2]))


def test_wire_sizes_without_torch_agree_with_the_codecs() -> None:
    from frugal.parallel.codec import KIND_ACTIVATION, CodecSpec, payload_bytes

    cases = (
        ("fp32", IdentityCodec()),
        ("fp16", HalfCodec()),
        ("q3", QuantizeCodec(3)),  # the planner's name of directq:fw3,bw3:row
        ("directq:fw3,bw3:row", QuantizeCodec(3)),
        ("directq:fw2,bw4", ChannelQuantizeCodec(2)),
    )
    for name, codec in cases:
        x = torch.randn(2, 3, 10)
        spec = CodecSpec.parse(name)
        assert payload_bytes(spec, KIND_ACTIVATION, (2, 3, 10)) == codec.encode(x).nbytes
    with pytest.raises(ValueError, match="codec 'q9'"):
        CodecSpec.parse("q9")


@pytest.mark.parametrize("scale", ["channel", "row"])
def test_aqsgd_buffers_stay_bit_identical_through_signed_zeros(scale: str) -> None:
    # -0.0 rows, deltas that round to a -0.0 code, and an all-zero channel: the sender's
    # update and the receiver's decode must agree bit for bit (the drift check hashes bytes).
    sender, receiver = DeltaCodec(2, scale=scale), DeltaCodec(2, scale=scale)
    ids = torch.arange(4)
    base = torch.tensor([[-0.0, 1.0, -0.0, 0.5]] * 4)
    receiver.decode(sender.encode(base, ids), ids)
    for tiny in (-1e-3, -1e-9, 0.0):
        x = base.clone()
        x[:, 0] += torch.tensor([tiny, 0.3, -0.3, tiny])  # on -0.0: a -0.0 code lands on -0.0
        x[:, 3] += tiny  # a channel whose change is tiny or zero everywhere
        receiver.decode(sender.encode(x, ids), ids)
        for i in range(4):
            mine, theirs = sender.buffers[i], receiver.buffers[i]
            assert torch.equal(mine.view(torch.int32), theirs.view(torch.int32)), (tiny, i)


def test_quantizers_refuse_nan_and_inf_anywhere() -> None:
    from frugal.comm.codecs import ChannelQuantizeCodec

    for bad in (float("nan"), float("inf"), float("-inf")):
        x = torch.zeros(5, 7)
        x[3, 4] = bad
        for codec in (QuantizeCodec(4), ChannelQuantizeCodec(2)):
            with pytest.raises(ValueError, match="NaN or inf"):
                codec.encode(x)


def test_delta_codec_refuses_negative_and_repeated_example_ids() -> None:
    from frugal.comm.codecs import DeltaCodec

    codec = DeltaCodec(2)
    x = torch.randn(3, 4)
    with pytest.raises(ValueError, match="example_ids must be >= 0, got min -2"):
        codec.encode(x, torch.tensor([0, -2, 1]))
    with pytest.raises(ValueError, match="repeat within one message"):
        codec.encode(x, torch.tensor([5, 1, 5]))
    with pytest.raises(ValueError, match=r"example_ids must have shape \(3,\)"):
        codec.encode(x, torch.tensor([0, 1]))
    codec.encode(x, torch.tensor([2, 0, 1]))  # nothing was stored by the refused calls
    assert sorted(codec.buffers) == [0, 1, 2]


def test_quantizer_refuses_a_row_whose_range_overflows_float32() -> None:
    # -3e38 .. 3e38 are finite, but max - min is not: step would be inf and decode NaN.
    with pytest.raises(ValueError, match=r"row 1 spans -3e\+38 to 3e\+38.*beyond float32"):
        QuantizeCodec(2).encode(torch.tensor([[0.0, 1.0], [-3e38, 3e38]]))
    with pytest.raises(ValueError, match="NaN or inf"):  # a true inf still says so
        QuantizeCodec(2).encode(torch.tensor([[0.0, float("inf")]]))


def test_pack_bits_refuses_codes_that_would_spill_into_their_neighbours() -> None:
    with pytest.raises(
        ValueError, match=r"integers in \[0, 4\) for bits=2, got values in \[0, 5\]"
    ):
        pack_bits(torch.tensor([[5, 0, 0, 0]], dtype=torch.uint8), 2)
    with pytest.raises(ValueError, match=r"in \[-1, 1\]"):
        pack_bits(torch.tensor([[-1.0, 1.0]]), 4)
    with pytest.raises(ValueError, match="with fractions"):
        pack_bits(torch.tensor([[0.5, 1.0]]), 4)
    with pytest.raises(TypeError, match="must be an integer"):
        pack_bits(torch.zeros(1, 4, dtype=torch.uint8), True)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be an integer"):
        pack_bits(torch.zeros(1, 4, dtype=torch.uint8), 2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"2-D \(rows, cols\) tensor, got \(4,\)"):
        pack_bits(torch.zeros(4, dtype=torch.uint8), 2)


def test_unpack_bits_refuses_a_width_that_does_not_match_cols() -> None:
    packed = pack_bits(torch.tensor([[1, 2, 3, 0, 1]], dtype=torch.uint8), 2)  # 2 bytes
    with pytest.raises(ValueError, match=r"cols=40 codes of 2 bits need \(rows, 10\)"):
        unpack_bits(packed, 2, 40)
    with pytest.raises(ValueError, match="cols=-1"):
        unpack_bits(packed, 2, -1)
    with pytest.raises(ValueError, match=r"bits=0 must be in \[1, 8\]"):
        unpack_bits(packed, 0, 5)


def test_codecs_name_the_wrong_input_type_and_refuse_empty_tensors() -> None:
    import numpy as np

    from frugal.comm.codecs import ChannelQuantizeCodec

    with pytest.raises(TypeError, match=r"got ndarray; wrap a numpy array with torch.from_numpy"):
        QuantizeCodec(2).encode(np.zeros((2, 3), dtype=np.float32))  # type: ignore[arg-type]
    for codec in (QuantizeCodec(2), ChannelQuantizeCodec(2)):
        with pytest.raises(ValueError, match=r"empty tensor of shape \(0, 8\)"):
            codec.encode(torch.zeros(0, 8))


def test_fp16_codec_refuses_values_beyond_its_range_and_bf16_takes_them() -> None:
    x = torch.tensor([1.0, -1e6])
    with pytest.raises(ValueError, match="reaches 1e\\+06, beyond float16's largest value 65504"):
        HalfCodec().encode(x)
    bf16 = HalfCodec(torch.bfloat16)
    assert torch.allclose(bf16.decode(bf16.encode(x)), x, rtol=1e-2)


def test_delta_codec_refuses_float_ids_and_nan_first_visits_without_buffering() -> None:
    codec = DeltaCodec(2)
    with pytest.raises(
        TypeError, match=r"example_ids must be an integer tensor, got torch\.float32"
    ):
        codec.encode(torch.randn(4, 8), torch.tensor([0.2, 1.7, 2.9, 3.1]))
    x = torch.randn(4, 8)
    x[2, 3] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf"):
        codec.encode(x, torch.arange(4))
    assert len(codec.buffers) == 0  # nothing was buffered
    with pytest.raises(ValueError, match="cannot buffer NaN or inf"):
        codec.store(x, torch.arange(4))
    assert len(codec.buffers) == 0


def test_delta_codec_decode_names_out_of_sync_buffers_and_other_bits() -> None:
    sender, receiver = DeltaCodec(2), DeltaCodec(2)
    ids = torch.arange(4)
    x = torch.randn(4, 8)
    receiver.decode(sender.encode(x, ids), ids)  # both buffer 0..3
    with pytest.raises(ValueError, match=r"example_ids must have shape \(4,\), got \(2,\)"):
        receiver.decode(sender.encode(x, ids), ids[:2])
    # The sender revisits 0..3 (deltas only); a receiver that never saw 4..7 cannot apply them.
    delta_message = sender.encode(x + 0.1, ids)
    before = {i: receiver.buffers[i].clone() for i in range(4)}
    with pytest.raises(
        ValueError,
        match=r"sent 0 bytes of first visits \(32 per example\), but this side has 4 unbuffered",
    ):
        receiver.decode(delta_message, ids + 4)
    assert sorted(receiver.buffers) == [0, 1, 2, 3]
    assert all(torch.equal(receiver.buffers[i], before[i]) for i in range(4))
    with pytest.raises(ValueError, match="the sender uses other bits"):
        _decode_seen_with(4, delta_message)  # a 4-bit receiver of a 2-bit message


def _decode_seen_with(bits: int, message: Encoded) -> None:
    receiver = DeltaCodec(bits)
    ids = torch.arange(message.shape[0])
    receiver.store(torch.zeros(message.shape), ids)
    receiver.decode(message, ids)


def test_memory_buffer_refuses_an_id_whose_dense_table_exceeds_ram() -> None:
    codec = DeltaCodec(2)
    with pytest.raises(ValueError, match=r"example id 1099511627776 needs a .* GiB table"):
        codec.encode(torch.randn(2, 8), torch.tensor([0, 2**40]))
    assert len(codec.buffers) == 0


def test_both_quantizers_share_the_bits_check_name_and_wire_size() -> None:
    x = torch.linspace(-1.0, 1.0, 40).reshape(4, 10)
    # 3 bits, 4 rows x 10 values. Per row: 8 bytes (min, step) + ceil(10 * 3 / 8) = 4 -> 48.
    # Per channel: 10 fp16 scales = 20 bytes + ceil(40 * 3 / 8) = 15 -> 35.
    for codec, name, size in ((QuantizeCodec(3), "q3", 48), (ChannelQuantizeCodec(3), "c3", 35)):
        assert codec.name == name
        assert codec.wire_bytes((4, 10)) == size
        assert codec.encode(x).nbytes == size
        for bits in (0, 9, True, 2.0):
            with pytest.raises(ValueError, match="must be an integer in"):
                type(codec)(bits)  # type: ignore[arg-type]
