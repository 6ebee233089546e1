"""Exact wire sizes of the codecs, without torch (the planner prices links with them).

Shape legend: R rows (leading dimensions flattened), C values per row.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

__all__ = ["CODEC_NAMES", "CodecName", "wire_bytes"]

CodecName = Literal["fp32", "fp16", "bf16", "q1", "q2", "q3", "q4", "q5", "q6", "q7", "q8"]
CODEC_NAMES: tuple[str, ...] = get_args(CodecName)
_QUANT_HEADER_BYTES = 8  # per row: float32 min and float32 step


def wire_bytes(codec: str, shape: tuple[int, ...]) -> int:
    """Payload bytes of a float32 tensor of `shape` encoded with `codec`.

    fp32: 4 per value; fp16/bf16: 2; qK (DirectQ, K bits): per row of the last dimension,
    8 header bytes + ceil(C K / 8) packed code bytes.

    Raises:
        ValueError: If the codec name is unknown or the shape is empty.
    """
    if codec not in CODEC_NAMES:
        raise ValueError(f"unknown codec {codec!r}; choose one of {', '.join(CODEC_NAMES)}")
    if not shape:
        raise ValueError("shape must have at least one dimension")
    if codec == "fp32":
        return 4 * math.prod(shape)
    if codec in ("fp16", "bf16"):
        return 2 * math.prod(shape)
    bits = int(codec[1:])
    rows, cols = math.prod(shape[:-1]), shape[-1]
    return rows * (_QUANT_HEADER_BYTES + math.ceil(cols * bits / 8))
