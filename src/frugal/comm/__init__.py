"""Communication codecs and link helpers for pipelines over slow networks (AQ-SGD).

References:
    Fine-tuning Language Models over Slow Networks using Activation Compression with
    Guarantees, NeurIPS 2022, arXiv 2206.01299.
"""

from frugal.comm.codecs import (
    Codec,
    DeltaCodec,
    Encoded,
    HalfCodec,
    IdentityCodec,
    QuantizeCodec,
    pack_bits,
    unpack_bits,
)

__all__ = [
    "Codec",
    "DeltaCodec",
    "Encoded",
    "HalfCodec",
    "IdentityCodec",
    "QuantizeCodec",
    "pack_bits",
    "unpack_bits",
]
