r"""Fine-tune your own Hugging Face model on your own text, split into pipeline stages.

Loads a causal LM from a folder that `save_pretrained` wrote (config.json, *.safetensors,
tokenizer.json; Llama/SmolLM2/TinyLlama, Qwen2 or GPT-2 family) and fine-tunes it on a .txt
(paragraphs) or .jsonl (one {"text": ...} per line) file with AQ-SGD between the stages. Every
stage runs in this process (`train_local`), so no ports are needed. Prints the first and last
loss and the eval loss.

    python examples/pipeline_your_model.py --model-dir ~/models/SmolLM2-135M --data notes.jsonl

The same job over torchrun, one process per stage, checkpointed and restarted if a rank dies:

    frugal pipeline train --model hf --set hf.path=~/models/SmolLM2-135M \
        --set dataset=notes.jsonl --stages 4 --codec aqsgd --fw-bits 2 --bw-bits 4 \
        --set checkpoint_every=20 --set max_restarts=2
"""

from __future__ import annotations

import argparse

from frugal.pipeline.train import PipelineTrainConfig, train_local
from frugal.pipeline.zoo import HFModelConfig


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the example; return the first and last train loss and the final eval loss."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True, help="the model folder")
    parser.add_argument("--data", required=True, help="your .txt or .jsonl file")
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--context", type=int, default=32, help="tokens per window")
    parser.add_argument("--num-train", type=int, default=64, help="training windows")
    args = parser.parse_args(argv)
    config = PipelineTrainConfig(
        model="hf",
        hf=HFModelConfig(path=args.model_dir, context=args.context),
        dataset=args.data,
        num_stages=args.stages,
        steps=args.steps,
        num_train=args.num_train,
        num_eval=8,
        micro_batch_size=2,
        num_microbatches=4,
        learning_rate=1e-3,
        codec="aqsgd:fw2,bw4",
    )
    result = train_local(config)
    out = {
        "first_loss": result.losses[0],
        "last_loss": result.losses[-1],
        "eval_loss": result.eval_loss,
    }
    print(", ".join(f"{k} {v:.4f}" for k, v in out.items()))
    return out


if __name__ == "__main__":
    main()
