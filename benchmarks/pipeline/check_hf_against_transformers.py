"""Check frugal's Hugging Face loader against transformers' own models (not run in CI).

transformers is not a frugal dependency; install it next to frugal to run this:

    pip install transformers && python benchmarks/pipeline/check_hf_against_transformers.py

For each supported architecture it builds a small random model with transformers (norms and
biases randomised too), saves it with `save_pretrained`, loads the folder with
`frugal.pipeline.hf_loader.read_hf_model` and compares the logits of both on random tokens.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from frugal.pipeline.hf_loader import read_hf_model

VOCAB = 264


def _tokenizer(path: Path) -> None:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.save(str(path))


def main() -> None:
    """Build, save, load and compare each architecture; exit non-zero on a mismatch."""
    torch.manual_seed(0)
    llama = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 48,
             "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
             "max_position_embeddings": 64}  # fmt: skip
    cases = {
        "gpt2": GPT2LMHeadModel(
            GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=3, n_head=4)
        ),
        "llama (tied)": LlamaForCausalLM(LlamaConfig(**llama, tie_word_embeddings=True)),
        "llama (untied)": LlamaForCausalLM(LlamaConfig(**llama, tie_word_embeddings=False)),
        "qwen2": Qwen2ForCausalLM(Qwen2Config(**llama, tie_word_embeddings=True)),
    }
    folder_root = Path(tempfile.mkdtemp(prefix="frugal-hf-check-"))
    for name, reference in cases.items():
        reference.eval()
        with torch.no_grad():
            for p in reference.parameters():
                if p.dim() == 1:
                    p.add_(0.1 * torch.randn_like(p))
        folder = folder_root / name.replace(" ", "_")
        reference.save_pretrained(folder)
        _tokenizer(folder / "tokenizer.json")
        loaded = read_hf_model(folder)
        model = loaded.family.build(loaded.config, loaded.state_dict)
        tokens = torch.randint(0, VOCAB, (2, 40))
        with torch.no_grad():
            error = (reference(tokens).logits - model(tokens)).abs().max().item()
        print(f"{name:15s} {loaded.architecture:17s} max |logit difference| = {error:.1e}")
        if error > 1e-4:
            raise SystemExit(f"{name}: frugal's model differs from transformers'")
    print("every architecture matches transformers")


if __name__ == "__main__":
    main()
