"""Pipeline-train a tiny GPT with AQ-SGD activation compression, all stages in one process.

Trains the byte-level tiny GPT of `frugal.pipeline` on the Python docs bundled with the
standard library (`pydoc_topics`), split into pipeline stages that exchange activations and
gradients through a codec: once in FP32 and once with AQ-SGD (2-bit activation deltas, 4-bit
gradients). Every stage runs in this process (`train_local`: the same `StageRunner` and
schedule as under torchrun, over an in-process transport), so it needs no ports and no
second machine. Prints each codec's first and last loss and the bytes its activations and
gradients put on the wire.

    python examples/pipeline_tiny_gpt.py            # 4 stages, 48 steps
    python examples/pipeline_tiny_gpt.py --tiny     # 2 stages, 2 layers, 12 steps (the test)

The same training over torchrun, one process per stage, with an emulated 100 Mbit/s link:

    frugal pipeline train --model tiny-gpt --stages 4 --codec aqsgd --fw-bits 2 --bw-bits 4 \
        --rho 100mbps --steps 64
"""

from __future__ import annotations

import argparse
import os

from frugal.pipeline.models import TinyGPTConfig
from frugal.pipeline.train import PipelineTrainConfig, train_local


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    """Run the example; return per codec its first and last loss and wire bytes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tiny", action="store_true", default=os.environ.get("FRUGAL_TINY", "") not in ("", "0")
    )
    args = parser.parse_args(argv)
    if args.tiny:
        gpt = TinyGPTConfig(context=32, hidden=32, num_heads=2, num_layers=2)
        sizes = {"num_stages": 2, "steps": 12, "num_train": 64, "num_eval": 8}
    else:
        gpt = TinyGPTConfig()
        sizes = {"num_stages": 4, "steps": 48, "num_train": 512, "num_eval": 64}
    results = {}
    for codec in ("fp32", "aqsgd:fw2,bw4"):
        config = PipelineTrainConfig(
            gpt=gpt, codec=codec, micro_batch_size=4, num_microbatches=2, seed=0, **sizes
        )
        result = train_local(config)
        wire = sum(map(sum, (b for stage in result.activation_bytes for b in stage)))
        wire += sum(map(sum, (b for stage in result.gradient_bytes for b in stage)))
        results[codec] = {
            "first_loss": result.losses[0],
            "last_loss": result.losses[-1],
            "eval_loss": result.eval_loss,
            "wire_bytes": float(wire),
        }
        print(
            f"{codec:>14}: loss {result.losses[0]:.3f} -> {result.losses[-1]:.3f} "
            f"(eval {result.eval_loss:.3f}), {wire:,} bytes between stages"
        )
    return results


if __name__ == "__main__":
    main()
