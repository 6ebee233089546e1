"""Communication codecs and link helpers for pipelines over slow networks (AQ-SGD).

`frugal.comm.codecs` holds the torch codecs; `frugal.comm.wire` their exact wire sizes without
importing torch (so the planner can price links cheaply).

References:
    Fine-tuning Language Models over Slow Networks using Activation Compression with
    Guarantees, NeurIPS 2022, arXiv 2206.01299.
"""

from frugal.comm.wire import CODEC_NAMES, CodecName, wire_bytes

__all__ = ["CODEC_NAMES", "CodecName", "wire_bytes"]
