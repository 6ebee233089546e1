"""CodecSpec: parsing, canonical labels and exact wire sizes computed by hand (no torch)."""

from __future__ import annotations

import sys

import pytest

from frugal.parallel.codec import (
    HEADER_BYTES,
    KIND_ACTIVATION,
    KIND_GRADIENT,
    CodecSpec,
    message_wire_bytes,
    payload_bytes,
)


@pytest.mark.parametrize(
    "text",
    ["fp32", "fp16", "bf16", "directq:fw2,bw4", "aqsgd:fw2,bw4", "aqsgd:fw3,bw8:row:fv8:ef"],
)
def test_labels_round_trip(text: str) -> None:
    assert CodecSpec.parse(text).label == text
    assert CodecSpec.parse(CodecSpec.parse(text).label) == CodecSpec.parse(text)


def test_the_planners_q_names_are_row_scaled_directq() -> None:
    assert CodecSpec.parse("q4") == CodecSpec.parse("directq:fw4,bw4:row")
    assert CodecSpec.parse("q4").label == "directq:fw4,bw4:row"
    with pytest.raises(ValueError, match="codec 'q9'"):
        CodecSpec.parse("q9")
    with pytest.raises(ValueError, match="directq has none"):
        CodecSpec.parse("directq:fw2,bw4:fv8")


def test_wire_sizes_by_hand() -> None:
    shape = (8, 16, 64)  # 8 examples x 16 tokens x 64 hidden: 128 rows, 8192 values
    fp16, aq = CodecSpec.parse("fp16"), CodecSpec.parse("aqsgd:fw2,bw4")
    assert payload_bytes(CodecSpec.parse("fp32"), KIND_ACTIVATION, shape) == 4 * 8192
    assert message_wire_bytes(fp16, KIND_GRADIENT, shape) == HEADER_BYTES + 2 * 8192
    # channel scales: 64 fp16 scales + 8192 x 2 bits forward, x 4 bits backward
    assert payload_bytes(aq, KIND_ACTIVATION, shape) == 2 * 64 + 8192 * 2 // 8
    assert payload_bytes(aq, KIND_GRADIENT, shape) == 2 * 64 + 8192 * 4 // 8
    # first visits travel as float32: 3 new examples of 16 x 64, the 5 others as 2-bit deltas
    assert payload_bytes(aq, KIND_ACTIVATION, shape, num_new=3) == (
        4 * 3 * 1024 + 2 * 64 + 5 * 1024 * 2 // 8
    )
    assert payload_bytes(aq, KIND_ACTIVATION, shape, warmup=True) == 4 * 8192
    # row scales: per row 8 header bytes + ceil(64 x 3 / 8) = 24 code bytes
    assert payload_bytes(CodecSpec.parse("q3"), KIND_ACTIVATION, shape) == 128 * (8 + 24)
    with pytest.raises(ValueError, match=r"num_new=9 must lie in \[0, shape\[0\]=8\]"):
        payload_bytes(aq, KIND_ACTIVATION, shape, num_new=9)
    with pytest.raises(ValueError, match="kind=2"):
        payload_bytes(aq, 2, shape)


def test_the_torch_codecs_send_exactly_the_priced_bytes() -> None:
    import torch

    from frugal.comm.message import LinkCodec

    for text in ("fp16", "directq:fw3,bw5", "directq:fw3,bw5:row", "aqsgd:fw2,bw4:fv4"):
        spec = CodecSpec.parse(text)
        for kind in (KIND_ACTIVATION, KIND_GRADIENT):
            x, ids = torch.randn(4, 6, 10), torch.arange(4)
            side = LinkCodec(spec, kind)
            _header, payload, _ = side.encode(x, ids, step=0, mb=0)
            num_new = 4 if spec.method == "aqsgd" and kind == KIND_ACTIVATION else 0
            assert HEADER_BYTES + payload.numel() == message_wire_bytes(
                spec, kind, (4, 6, 10), num_new=num_new
            )


def test_parallel_imports_no_torch() -> None:
    import subprocess

    code = (
        "import sys, frugal.parallel, frugal.parallel.plan; "
        "sys.exit(any(m == 'torch' or m.startswith('torch.') for m in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
