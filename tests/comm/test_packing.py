"""The shift-and-sum packing for 1, 2, 4 and 8 bits writes the generic bit stream's bytes."""

from __future__ import annotations

import pytest
import torch

from frugal.comm.codecs import pack_bits, unpack_bits


def _bit_stream_reference(codes: torch.Tensor, bits: int) -> torch.Tensor:
    # Bit b of code j lands at stream position j * bits + b, LSB first, 8 per byte.
    rows, _ = codes.shape
    stream = ((codes.unsqueeze(-1).long() >> torch.arange(bits)) & 1).reshape(rows, -1)
    stream = torch.nn.functional.pad(stream, (0, (-stream.shape[1]) % 8))
    return (stream.reshape(rows, -1, 8) << torch.arange(8)).sum(-1).to(torch.uint8)


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("cols", [1, 3, 7, 13, 128])
def test_packing_equals_the_bit_stream_reference(bits: int, cols: int) -> None:
    gen = torch.Generator().manual_seed(bits * 100 + cols)
    codes = torch.randint(0, 1 << bits, (4, cols), generator=gen).to(torch.uint8)
    packed = pack_bits(codes, bits)
    assert torch.equal(packed, _bit_stream_reference(codes, bits))
    assert torch.equal(unpack_bits(packed, bits, cols), codes)


def test_two_bit_packing_by_hand() -> None:
    # Codes 1, 2, 3, 0, 1 -> byte 0 = 1 | 2 << 2 | 3 << 4 | 0 << 6 = 0b00111001 = 57; byte 1 = 1.
    codes = torch.tensor([[1, 2, 3, 0, 1]], dtype=torch.uint8)
    assert pack_bits(codes, 2).tolist() == [[57, 1]]


def test_channel_quantizer_by_hand() -> None:
    from frugal.comm.codecs import ChannelQuantizeCodec

    codec = ChannelQuantizeCodec(2)
    # Channel 0: s = 4 -> levels (code - 2) x 4 / 2 = -4, -2, 0, 2: 3 clips to 2 (top level
    # 0.5 s, the reference's asymmetric clipping), -4 is exact, 1 rounds to 2 (0.5 x 2 -> 1?
    # round(1 / 4 x 2) = round(0.5) = 0 (half to even) -> 0. Channel 1 is all zero: s = 0.
    x = torch.tensor([[3.0, 0.0], [-4.0, 0.0], [1.0, 0.0]])
    encoded = codec.encode(x)
    assert encoded.tensors[0].tolist() == [4.0, 0.0]  # fp16 scales
    assert encoded.nbytes == codec.wire_bytes((3, 2)) == 2 * 2 + 2  # 6 codes x 2 bits = 2 B
    assert codec.decode(encoded).tolist() == [[2.0, 0.0], [-4.0, 0.0], [0.0, 0.0]]


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_channel_quantizer_error_bound(bits: int) -> None:
    from frugal.comm.codecs import ChannelQuantizeCodec

    x = torch.randn(16, 8, 12, generator=torch.Generator().manual_seed(bits))
    codec = ChannelQuantizeCodec(bits)
    out = codec.decode(codec.encode(x))
    scale = x.reshape(-1, 12).abs().amax(dim=0).half().float()
    step = scale / (1 << (bits - 1))
    top = scale - step  # highest positive level; values above it clip to it
    expected_error = torch.where(x > top, x - top, torch.zeros_like(x))
    assert torch.all((out - x).abs() <= torch.maximum(step / 2 * 1.0001, expected_error + 1e-6))
