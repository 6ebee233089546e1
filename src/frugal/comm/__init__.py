"""Communication codecs and link helpers for pipelines over slow networks (AQ-SGD).

`frugal.comm.codecs` holds the torch codecs and `frugal.comm.message` the pipeline's framed
messages; both run what a `frugal.parallel.CodecSpec` says, and the spec's exact wire sizes
(`frugal.parallel.codec`, no torch) are what the planner prices.

References:
    Fine-tuning Language Models over Slow Networks using Activation Compression with
    Guarantees, NeurIPS 2022, arXiv 2206.01299.
"""
