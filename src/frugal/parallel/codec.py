"""`CodecSpec`: what a pipeline link sends each way, and its exact wire size (no torch).

One vocabulary for the runtime and the planner: `frugal.comm` encodes what a `CodecSpec`
says and `frugal.planner` prices the same spec's `message_wire_bytes`, so a plan priced for
one codec cannot silently run with another (`frugal.parallel.Plan` records it).

Texts: `fp32`, `fp16`, `bf16`, `directq:fwK,bwJ` (K-bit activations, J-bit gradients) and
`aqsgd:fwK,bwJ` (K-bit activation deltas against per-example buffers, DirectQ gradients), K
and J in 1..8, with optional suffixes `:row` (per-row min/step scales instead of per-channel
abs-max), `:fvF` (aqsgd: first visits as F-bit codes instead of float32) and `:ef` (error
feedback on the gradients). `qK` is the planner's older name of `directq:fwK,bwK:row`.

A message is a 128-byte header plus its payload:

| codec | payload bytes of a float32 (R rows x C values) tensor |
| --- | --- |
| fp32 | 4 R C |
| fp16, bf16 | 2 R C |
| k-bit, channel scales | 2 C (fp16 abs-max per channel) + ceil(R C k / 8) |
| k-bit, row scales | R (8 + ceil(C k / 8)) (float32 min and step per row) |
| aqsgd activation | first visits (4 per value, or F-bit codes) + k-bit deltas of the rest |

Rows are the leading dimensions flattened; the first dimension is examples.

References:
    Fine-tuning Language Models over Slow Networks using Activation Compression with
    Guarantees, NeurIPS 2022, arXiv 2206.01299 (AQ-SGD forward deltas, DirectQ backward).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "HEADER_BYTES",
    "KIND_ACTIVATION",
    "KIND_GRADIENT",
    "CodecSpec",
    "MethodName",
    "ScaleName",
    "mean_message_wire_bytes",
    "message_wire_bytes",
    "payload_bytes",
    "quantized_bytes",
]

HEADER_BYTES = 128
"""Bytes of every pipeline message's header (16 int64 words, `frugal.comm.message`)."""
KIND_ACTIVATION = 0
KIND_GRADIENT = 1
MethodName = Literal["fp32", "fp16", "bf16", "directq", "aqsgd"]
ScaleName = Literal["channel", "row"]
_METHOD_IDS: dict[str, int] = {"fp32": 1, "fp16": 2, "bf16": 3, "directq": 4, "aqsgd": 5}
_SPEC = re.compile(r"^(directq|aqsgd):fw([1-8]),bw([1-8])(:row|:channel)?(:fv([1-8]))?(:ef)?$")
_LEGACY = re.compile(r"^q([1-8])$")


@dataclass(frozen=True, slots=True)
class CodecSpec:
    """What a pipeline link sends: method and bits forward (activations) / backward (grads).

    Attributes:
        method: fp32, fp16, bf16, directq (k-bit both ways) or aqsgd (k-bit deltas forward
            against per-example buffers, DirectQ backward).
        fw_bits: Bits per activation value (directq, aqsgd), else 32 or 16.
        bw_bits: Bits per gradient value (directq, aqsgd), else 32 or 16.
        scale: Quantizer scales: "channel" (AQ-SGD's reference: per-channel abs-max, fp16
            scales; the default) or "row" (per-row min and step, finer; suffix `:row`).
        first_visit_bits: aqsgd only: how an example's first visit (and the warm-up)
            travels: 32 = float32 (AQ-SGD's reference), or k in 1..8 = k-bit codes of the
            same scale type, both sides buffering the decoded value (suffix `:fvK`).
        bw_error_feedback: Gradients (backward) with error feedback per example: the sender
            adds what an example's last gradient message dropped to its next one (`:ef`).
    """

    method: MethodName
    fw_bits: int
    bw_bits: int
    scale: ScaleName = "channel"
    first_visit_bits: int = 32
    bw_error_feedback: bool = False

    @classmethod
    def parse(cls, text: str) -> CodecSpec:
        """Parse a codec text (see the module docstring); `qK` means `directq:fwK,bwK:row`.

        Raises:
            ValueError: If the text is none of these (the message shows the forms).
        """
        if text in ("fp32", "fp16", "bf16"):
            bits = 32 if text == "fp32" else 16
            return cls(text, bits, bits)  # type: ignore[arg-type]  # narrowed by the check
        legacy = _LEGACY.match(text) if isinstance(text, str) else None
        if legacy is not None:
            bits = int(legacy.group(1))
            return cls("directq", bits, bits, "row")
        match = _SPEC.match(text) if isinstance(text, str) else None
        if match is None:
            raise ValueError(
                f"codec {text!r}: use fp32, fp16, bf16, directq:fwK,bwJ or aqsgd:fwK,bwJ "
                "with K, J in 1..8 (e.g. aqsgd:fw2,bw4), optionally followed by :row for "
                "per-row min/step scales, for aqsgd :fvF for F-bit first visits, and :ef for "
                "error feedback on the gradients (e.g. aqsgd:fw2,bw4:row:fv8:ef)"
            )
        method: MethodName = "directq" if match.group(1) == "directq" else "aqsgd"
        scale: ScaleName = "row" if match.group(4) == ":row" else "channel"
        if match.group(6) is not None and method != "aqsgd":
            raise ValueError(
                f"codec {text!r}: :fv{match.group(6)} sets how AQ-SGD sends first visits; "
                "directq has none (drop the suffix)"
            )
        first_visit_bits = int(match.group(6)) if match.group(6) is not None else 32
        feedback = match.group(7) is not None
        fw, bw = int(match.group(2)), int(match.group(3))
        return cls(method, fw, bw, scale, first_visit_bits, feedback)

    @property
    def label(self) -> str:
        """The canonical text form, e.g. `aqsgd:fw2,bw4` (`CodecSpec.parse(label)` == self)."""
        if self.method in ("fp32", "fp16", "bf16"):
            return self.method
        suffix = ":row" if self.scale == "row" else ""
        if self.first_visit_bits != 32:
            suffix += f":fv{self.first_visit_bits}"
        if self.bw_error_feedback:
            suffix += ":ef"
        return f"{self.method}:fw{self.fw_bits},bw{self.bw_bits}{suffix}"

    @property
    def is_lossless(self) -> bool:
        """Whether decode(encode(x)) == x."""
        return self.method == "fp32"

    def bits(self, kind: int) -> int:
        """Bits of the direction `kind` (KIND_ACTIVATION or KIND_GRADIENT)."""
        return self.fw_bits if kind == KIND_ACTIVATION else self.bw_bits

    @property
    def codec_id(self) -> int:
        """Method id (+ 16 row scales, + 32 F F-bit first visits, + 512 error feedback)."""
        first_visit = 0 if self.first_visit_bits == 32 else 32 * self.first_visit_bits
        feedback = 512 if self.bw_error_feedback else 0
        return (
            _METHOD_IDS[self.method] + (16 if self.scale == "row" else 0) + first_visit + feedback
        )


def quantized_bytes(bits: int, scale: str, shape: tuple[int, ...]) -> int:
    """Payload bytes of k-bit codes of a float32 tensor of `shape` (see the module table).

    Raises:
        ValueError: If bits is not in 1..8, the scale is unknown or the shape is empty.
    """
    if not shape:
        raise ValueError("shape must have at least one dimension")
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 8:
        raise ValueError(f"bits={bits!r} must be an integer in [1, 8]")
    rows, cols = math.prod(shape[:-1]), shape[-1]
    if scale == "channel":
        return 2 * cols + math.ceil(rows * cols * bits / 8)
    if scale == "row":
        return rows * (8 + math.ceil(cols * bits / 8))
    raise ValueError(f"scale={scale!r}; choose 'row' (min/step) or 'channel' (abs-max)")


def _first_visit_bytes(spec: CodecSpec, shape: tuple[int, ...]) -> int:
    if spec.first_visit_bits == 32:
        return 4 * math.prod(shape)
    return quantized_bytes(spec.first_visit_bits, spec.scale, shape) if shape[0] else 0


def payload_bytes(
    spec: CodecSpec, kind: int, shape: tuple[int, ...], num_new: int = 0, warmup: bool = False
) -> int:
    """Exact payload bytes of one message (the header not counted).

    Args:
        spec: The link's codec.
        kind: KIND_ACTIVATION or KIND_GRADIENT.
        shape: Shape of the float32 tensor, first dimension = examples.
        num_new: AQ-SGD activations only: examples on their first visit (sent as fp32, or
            as `first_visit_bits` codes).
        warmup: Whether the message falls in the warm-up (fp32; AQ-SGD activations with
            `:fvF` send every example as a first visit).

    Raises:
        ValueError: If `kind` is unknown, the shape is empty or num_new is outside
            [0, shape[0]].
    """
    if kind not in (KIND_ACTIVATION, KIND_GRADIENT):
        raise ValueError(f"kind={kind}; use KIND_ACTIVATION (0) or KIND_GRADIENT (1)")
    if not shape:
        raise ValueError("shape must have at least one dimension")
    if not 0 <= num_new <= shape[0]:
        raise ValueError(f"num_new={num_new} must lie in [0, shape[0]={shape[0]}]")
    n = math.prod(shape)
    if spec.method == "aqsgd" and kind == KIND_ACTIVATION:
        if warmup:
            return _first_visit_bytes(spec, shape)
        seen = (shape[0] - num_new, *shape[1:])
        delta = quantized_bytes(spec.fw_bits, spec.scale, seen) if seen[0] else 0
        return delta + _first_visit_bytes(spec, (num_new, *shape[1:]))
    if spec.method == "fp32" or warmup:
        return 4 * n
    if spec.method in ("fp16", "bf16"):
        return 2 * n
    return quantized_bytes(spec.bits(kind), spec.scale, shape)


def message_wire_bytes(
    spec: CodecSpec, kind: int, shape: tuple[int, ...], num_new: int = 0, warmup: bool = False
) -> int:
    """Exact bytes on the wire of one message: `HEADER_BYTES` + `payload_bytes`.

    Raises:
        ValueError: As `payload_bytes`.
    """
    return HEADER_BYTES + payload_bytes(spec, kind, shape, num_new, warmup)


def mean_message_wire_bytes(
    spec: CodecSpec,
    kind: int,
    shape: tuple[int, ...],
    *,
    first_visit_fraction: float = 0.0,
    warmup_fraction: float = 0.0,
) -> float:
    """Mean exact wire bytes of one message over a run, by `message_wire_bytes`.

    A run's messages are of three kinds: a `warmup_fraction` of them travel in the warm-up
    (fp32, or AQ-SGD's first-visit form), a `first_visit_fraction` carry examples on their
    first visit after it (AQ-SGD activations: every example new, its buffer still empty),
    and the rest are steady-state messages. Only AQ-SGD activations differ between the
    last two.

    Args:
        spec: The link's codec.
        kind: KIND_ACTIVATION or KIND_GRADIENT.
        shape: Shape of one message's float32 tensor, first dimension = examples.
        first_visit_fraction: Share of the run's messages whose examples are all new, in
            [0, 1].
        warmup_fraction: Share of the run's messages in the warm-up, in [0, 1].

    Returns:
        The weighted mean of the three sizes, bytes (header included).

    Raises:
        ValueError: If a fraction is outside [0, 1] or they sum past 1, or as
            `payload_bytes`.
    """
    if not (0.0 <= first_visit_fraction <= 1.0 and 0.0 <= warmup_fraction <= 1.0) or (
        first_visit_fraction + warmup_fraction > 1.0 + 1e-12
    ):
        raise ValueError(
            f"first_visit_fraction={first_visit_fraction} and warmup_fraction="
            f"{warmup_fraction} must each lie in [0, 1] and sum to at most 1"
        )
    steady = message_wire_bytes(spec, kind, shape)
    first = message_wire_bytes(spec, kind, shape, num_new=shape[0])
    warm = message_wire_bytes(spec, kind, shape, warmup=True)
    # As offsets from the steady size: exact (no rounding) where a kind equals it.
    return steady + first_visit_fraction * (first - steady) + warmup_fraction * (warm - steady)
