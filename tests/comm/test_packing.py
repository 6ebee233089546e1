"""Bit packing against plain-Python references: planar for 1, 2, 4 bits, a bit stream else."""

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


def _planar_reference(codes: torch.Tensor, bits: int) -> torch.Tensor:
    # m = 8 / k codes per byte, B = ceil(C / m) bytes: byte j holds code i B + j at bit k i.
    per_byte = 8 // bits
    out = []
    for row in codes.tolist():
        num_bytes = -(-len(row) // per_byte)
        row = row + [0] * (per_byte * num_bytes - len(row))
        out.append(
            [
                sum(row[i * num_bytes + j] << (bits * i) for i in range(per_byte))
                for j in range(num_bytes)
            ]
        )
    return torch.tensor(out, dtype=torch.uint8)


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("cols", [1, 3, 7, 13, 128])
def test_packing_equals_the_reference_layout(bits: int, cols: int) -> None:
    gen = torch.Generator().manual_seed(bits * 100 + cols)
    codes = torch.randint(0, 1 << bits, (4, cols), generator=gen).to(torch.uint8)
    packed = pack_bits(codes, bits)
    planar = bits in (1, 2, 4)
    expected = _planar_reference(codes, bits) if planar else _bit_stream_reference(codes, bits)
    assert torch.equal(packed, expected)
    assert torch.equal(pack_bits(codes.float(), bits), expected)  # float codes pack the same
    assert torch.equal(unpack_bits(packed, bits, cols), codes)
    signed = unpack_bits(packed, bits, cols, offset=1 << (bits - 1), dtype=torch.float32)
    assert torch.equal(signed, codes.float() - (1 << (bits - 1)))


def test_two_bit_packing_by_hand() -> None:
    # Codes 1, 2, 3, 0, 1 padded to 8 = 4 parts of B = 2: [1, 2] [3, 0] [1, 0] [0, 0].
    # Byte 0 = 1 | 3 << 2 | 1 << 4 | 0 << 6 = 29; byte 1 = 2 | 0 | 0 | 0 = 2.
    codes = torch.tensor([[1, 2, 3, 0, 1]], dtype=torch.uint8)
    assert pack_bits(codes, 2).tolist() == [[29, 2]]


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
