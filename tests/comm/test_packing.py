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
