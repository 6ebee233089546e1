"""Pipeline-parallel training over slow links with compressed activations (AQ-SGD, and more).

The models it can run, by name (`zoo`: `ModelSpec`, `register_model`), stages of a model
(`models`), GPipe and 1F1B schedules (`schedule`), a runtime over
torch.distributed point-to-point or in one process (`runtime`), training and torchrun launch
(`train`) and a discrete-event simulator (`sim`). Its benchmarks live in `frugal.bench`.

References:
    Fine-tuning Language Models over Slow Networks using Activation Compression with
    Guarantees, NeurIPS 2022, arXiv 2206.01299.
"""
