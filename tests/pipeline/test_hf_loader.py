"""Hugging Face model folders: the loader against GGUF on the same weights, bad folders, the zoo.

Each test writes a tiny random-weight model in the layout `save_pretrained` writes
(config.json, *.safetensors, tokenizer.json) into tmp_path; nothing is downloaded.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from frugal.pipeline.gguf_loader import load_gguf_llama
from frugal.pipeline.hf_loader import HFModelError, load_hf_model, read_hf_config, read_hf_model
from frugal.pipeline.llama import Llama, LlamaConfig
from frugal.pipeline.models import TinyGPT, TinyGPTConfig, build_stages
from frugal.pipeline.zoo import HFModelConfig, build_model, default_layers, load_model_windows
from tests.pipeline.test_llama import MERGES, SPECIAL, TINY, TOKENS, _write_gguf

_BLOCK = {
    "attn_norm": "input_layernorm",
    "q_proj": "self_attn.q_proj",
    "k_proj": "self_attn.k_proj",
    "v_proj": "self_attn.v_proj",
    "o_proj": "self_attn.o_proj",
    "mlp_norm": "post_attention_layernorm",
    "gate_proj": "mlp.gate_proj",
    "up_proj": "mlp.up_proj",
    "down_proj": "mlp.down_proj",
}


def _hf_state(model: Llama) -> dict[str, torch.Tensor]:
    """`model`'s weights under Hugging Face's Llama/Qwen2 names."""
    state: dict[str, torch.Tensor] = {}
    for name, value in model.state_dict().items():
        if name == "tok.weight":
            state["model.embed_tokens.weight"] = value
        elif name == "norm.weight":
            state["model.norm.weight"] = value
        elif name == "head.weight":
            state["lm_head.weight"] = value
        else:
            _, i, module, kind = name.split(".")
            state[f"model.layers.{i}.{_BLOCK[module]}.{kind}"] = value
    return {k: v.detach().clone().contiguous() for k, v in state.items()}


def _tokenizer_json(path: Path) -> None:
    """The test GGUF's byte-level BPE as a fast tokenizer (digits split, as 'smollm')."""
    vocab = {token: i for i, token in enumerate(TOKENS)}
    merges = [tuple(m.split(" ", 1)) for m in MERGES]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(SPECIAL)
    tokenizer.save(str(path))


def write_hf_folder(
    folder: Path,
    model: Llama,
    *,
    architecture: str = "LlamaForCausalLM",
    dtype: torch.dtype = torch.float32,
    shards: int = 1,
    **config_overrides: Any,
) -> Path:
    """`model` as `save_pretrained` writes it: config.json, safetensors (sharded), tokenizer."""
    folder.mkdir(parents=True, exist_ok=True)
    c = model.config
    config: dict[str, Any] = {
        "architectures": [architecture],
        "model_type": "qwen2" if architecture.startswith("Qwen2") else "llama",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden,
        "intermediate_size": c.intermediate,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "rope_theta": c.rope_theta,
        "rms_norm_eps": c.rms_norm_eps,
        "max_position_embeddings": c.max_context,
        "tie_word_embeddings": c.tie_embeddings,
        "hidden_act": "silu",
        "rope_scaling": None,
        "torch_dtype": str(dtype).removeprefix("torch."),
    } | config_overrides
    (folder / "config.json").write_text(json.dumps(config))
    state = {k: v.to(dtype) for k, v in _hf_state(model).items()}
    names = sorted(state)
    if shards == 1:
        save_file(state, str(folder / "model.safetensors"))
    else:
        weight_map = {}
        for k in range(shards):
            file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: state[n] for n in names[k::shards]}
            save_file(part, str(folder / file))
            weight_map |= dict.fromkeys(part, file)
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    _tokenizer_json(folder / "tokenizer.json")
    return folder


def _nontrivial(config: LlamaConfig, seed: int = 1) -> Llama:
    model = Llama(config, seed=seed)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():  # norms and biases away from their init, so a swap shows
        for name, p in model.named_parameters():
            if p.dim() == 1:
                base = 1.0 if "norm" in name else 0.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=gen))
    return model


def test_hf_folder_and_gguf_of_the_same_weights_give_the_same_model(tmp_path: Path) -> None:
    model = _nontrivial(TINY)
    hf = write_hf_folder(tmp_path / "hf", model)
    _write_gguf(tmp_path / "tiny.gguf", model, embd_q8=False)
    from_hf, hf_tokenizer = load_hf_model(hf)
    from_gguf, gguf_tokenizer = load_gguf_llama(tmp_path / "tiny.gguf")
    assert from_hf.config == from_gguf.config == TINY
    for name, value in from_gguf.state_dict().items():
        torch.testing.assert_close(from_hf.state_dict()[name], value, rtol=0, atol=0, msg=name)
    text = "the cat 2024 <|im_start|>the"
    ids = hf_tokenizer.encode(text).ids
    assert ids == gguf_tokenizer.encode(text).ids and len(ids) > 5
    tokens = torch.tensor([ids])
    with torch.no_grad():
        torch.testing.assert_close(from_hf(tokens), from_gguf(tokens), rtol=0, atol=0)
        torch.testing.assert_close(from_hf(tokens), model(tokens), rtol=0, atol=0)


def test_bf16_weights_and_shards_load_as_float32_of_the_stored_values(tmp_path: Path) -> None:
    model = _nontrivial(replace(TINY, tie_embeddings=False))
    folder = write_hf_folder(tmp_path / "hf", model, dtype=torch.bfloat16, shards=3)
    loaded = read_hf_model(folder)
    assert len(list(folder.glob("*.safetensors"))) == 3
    assert not loaded.config.tie_embeddings and "head.weight" in loaded.state_dict
    assert set(loaded.stored_dtypes.values()) == {"torch.bfloat16"}
    for name, value in model.state_dict().items():
        expected = value.to(torch.bfloat16).to(torch.float32)
        torch.testing.assert_close(loaded.state_dict[name], expected, rtol=0, atol=0, msg=name)
        assert loaded.state_dict[name].dtype == torch.float32


def test_qwen2_loads_its_qkv_biases_and_they_change_the_output(tmp_path: Path) -> None:
    shape = replace(TINY, attention_bias=True)
    model = _nontrivial(shape)
    assert model.blocks[0].q_proj.bias is not None
    assert shape.num_params == sum(p.numel() for p in model.parameters())
    folder = write_hf_folder(tmp_path / "qwen", model, architecture="Qwen2ForCausalLM")
    loaded, _ = load_hf_model(folder)
    assert loaded.config == shape
    tokens = torch.tensor([[5, 9, 200, 7, 3, 1]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens), model(tokens), rtol=0, atol=0)
        loaded.blocks[0].q_proj.bias.zero_()
        assert not torch.allclose(loaded(tokens), model(tokens))


def test_a_seeded_biased_model_starts_with_zero_biases_whatever_the_global_seed() -> None:
    torch.manual_seed(1)
    a = Llama(replace(TINY, attention_bias=True), seed=3)
    torch.manual_seed(2)
    b = Llama(replace(TINY, attention_bias=True), seed=3)
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0, msg=name)
    assert a.blocks[0].k_proj.bias.abs().sum() == 0


def _edit_config(folder: Path, **changes: Any) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text()) | changes
    path.write_text(json.dumps({k: v for k, v in config.items() if v is not ...}))


def test_bad_folders_get_errors_that_name_the_file_and_the_fix(tmp_path: Path) -> None:
    model = _nontrivial(TINY)
    with pytest.raises(HFModelError, match=r"no such model folder; give the folder save_pretr"):
        read_hf_model(tmp_path / "nothing")
    folder = write_hf_folder(tmp_path / "hf", model)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"architectures": ["GPTNeoXForCausalLM"]},
         r"architectures=\['GPTNeoXForCausalLM'\] is not supported; supported: LlamaForCausalLM "
         r"\(Llama 2/3.*; Qwen2ForCausalLM \(Qwen2/2.5\); GPT2LMHeadModel \(GPT-2"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, r"rope_scaling=.* not supp"),
        ({"hidden_act": "gelu"}, r"hidden_act='gelu'; only 'silu'"),
        ({"head_dim": 4}, r"head_dim=4 x num_attention_heads=4 != hidden_size=32"),
        ({"num_hidden_layers": ...}, r"no 'num_hidden_layers'; the file is not a complete"),
        ({"num_hidden_layers": 5}, r"lack 9 tensors of a LlamaForCausalLM with 5 layers"),
        ({"num_hidden_layers": 3}, r"unexpected tensors \['model.layers.3.*9 in all"),
        ({"intermediate_size": 40}, r"mlp.gate_proj.weight|gate_proj.weight has shape"),
        ({"vocab_size": 100}, r"tok.weight has shape \(264, 32\), config.json implies \(100, 32"),
        ({"num_key_value_heads": 3}, r"num_heads=4 must be a multiple of num_kv_heads=3"),
    ]  # fmt: skip
    original = (folder / "config.json").read_text()
    for changes, message in cases:
        _edit_config(folder, **changes)
        with pytest.raises(HFModelError, match=message):
            read_hf_model(folder)
        (folder / "config.json").write_text(original)
    read_hf_model(folder)  # restored: loads again
    # The tokenizer of another, larger model.
    big = write_hf_folder(tmp_path / "big", _nontrivial(replace(TINY, vocab_size=300)))
    (folder / "tokenizer.json").unlink()
    with pytest.raises(HFModelError, match=r"no tokenizer.json; save the fast tokenizer"):
        read_hf_model(folder)
    _edit_config(big, vocab_size=300)
    small = write_hf_folder(tmp_path / "small", _nontrivial(replace(TINY, vocab_size=200)))
    (small / "tokenizer.json").write_bytes((big / "tokenizer.json").read_bytes())
    with pytest.raises(HFModelError, match=r"tokenizer has 264 tokens but .* vocab_size=200 rows"):
        read_hf_model(small)
    # Weights only as pytorch_model.bin, and a broken safetensors file.
    (small / "model.safetensors").rename(small / "pytorch_model.bin")
    with pytest.raises(HFModelError, match=r"no \*.safetensors weights \(found pytorch_model.bin"):
        read_hf_model(small)
    (small / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(HFModelError, match=r"model.safetensors: not a readable safetensors file"):
        read_hf_model(small)
    (small / "config.json").write_text("[1, 2]")
    with pytest.raises(HFModelError, match=r"config.json: holds a list, not a JSON object"):
        read_hf_config(small)


def test_the_hf_model_trains_on_your_own_jsonl_from_the_zoo(tmp_path: Path) -> None:
    from frugal.pipeline.train import PipelineTrainConfig, train_local

    folder = write_hf_folder(tmp_path / "hf", _nontrivial(TINY))
    corpus = tmp_path / "notes.jsonl"
    lines = [json.dumps({"text": f"the cat {i} sat on the mat {i % 7}"}) for i in range(80)]
    corpus.write_text("\n".join(lines) + "\n")
    config = PipelineTrainConfig(
        model="hf", hf=HFModelConfig(path=str(folder), context=16), dataset=str(corpus),
        num_stages=2, num_train=24, num_eval=8, micro_batch_size=2, num_microbatches=4, steps=6,
        learning_rate=3e-3, codec="aqsgd:fw4,bw8",
    )  # fmt: skip
    assert default_layers(config, 2) == (3, 1)  # the head costs 8 blocks: the last stage is light
    windows = load_model_windows(config)
    assert len(windows.train_ids) == 24 and windows.windows.shape[1] == 17
    assert int(windows.windows.min()) >= 0 and int(windows.windows.max()) < TINY.vocab_size
    model = build_model(config)
    assert isinstance(model, Llama) and not model.tok.weight.requires_grad  # embeddings frozen
    result = train_local(config)
    assert len(result.losses) == 6 and result.losses[-1] < result.losses[0]
    with pytest.raises(ValueError, match=r"model='hf' needs hf.path"):
        PipelineTrainConfig(model="hf", dataset=str(corpus))
    with pytest.raises(ValueError, match=r"context=100 exceeds the model's max_context=64"):
        build_model(replace(config, hf=HFModelConfig(path=str(folder), context=100)))


GPT2 = TinyGPTConfig(
    context=32, hidden=32, num_heads=4, num_layers=3, vocab_size=len(TOKENS),
    activation="gelu_tanh", tie_embeddings=True, head_bias=False,
)  # fmt: skip


def write_gpt2_folder(folder: Path, model: TinyGPT, *, prefix: str = "transformer.") -> Path:
    """`model` as a GPT-2 `save_pretrained` folder: Conv1D (in, out) weights, GPT-2 names."""
    folder.mkdir(parents=True, exist_ok=True)
    c = model.config
    config = {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": c.vocab_size,
        "n_positions": c.context, "n_embd": c.hidden, "n_layer": c.num_layers,
        "n_head": c.num_heads, "n_inner": None, "activation_function": "gelu_new",
        "layer_norm_epsilon": c.layer_norm_eps, "tie_word_embeddings": c.tie_embeddings,
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    blocks = {"ln1": "ln_1", "qkv": "attn.c_attn", "proj": "attn.c_proj", "ln2": "ln_2",
              "fc": "mlp.c_fc", "out": "mlp.c_proj"}  # fmt: skip
    state: dict[str, torch.Tensor] = {}
    for name, value in model.state_dict().items():
        value = value.detach().clone()
        if name == "tok.weight":
            state[prefix + "wte.weight"] = value
        elif name == "pos":
            state[prefix + "wpe.weight"] = value
        elif name.startswith("ln_f."):
            state[prefix + name] = value
        elif name.startswith("head."):
            state["lm_head." + name.split(".")[1]] = value
        else:
            _, i, module, kind = name.split(".")
            if kind == "weight" and module in ("qkv", "proj", "fc", "out"):
                value = value.t()  # Conv1D keeps (in, out)
            state[f"{prefix}h.{i}.{blocks[module]}.{kind}"] = value.contiguous()
    state[prefix + "h.0.attn.bias"] = torch.tril(torch.ones(1, 1, c.context, c.context))
    save_file(state, str(folder / "model.safetensors"))
    _tokenizer_json(folder / "tokenizer.json")
    return folder


def _nontrivial_gpt(config: TinyGPTConfig) -> TinyGPT:
    model = TinyGPT(config, seed=4)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():  # non-zero biases, norms away from 1: a swap or missed transpose shows
        for name, p in model.named_parameters():
            if p.dim() == 1:
                base = 1.0 if ".ln" in name or name.startswith("ln_f") else 0.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=gen))
            elif name == "pos":
                p.copy_(0.02 * torch.randn(p.shape, generator=gen))
    return model


@pytest.mark.parametrize("prefix", ["transformer.", ""])
def test_gpt2_folder_loads_into_tiny_gpt_with_transposed_conv1d_weights(
    tmp_path: Path, prefix: str
) -> None:
    model = _nontrivial_gpt(GPT2)
    folder = write_gpt2_folder(tmp_path / "gpt2", model, prefix=prefix)
    loaded, tokenizer = load_hf_model(folder)
    assert isinstance(loaded, TinyGPT) and loaded.config == GPT2 and loaded.head is None
    assert GPT2.num_params == sum(p.numel() for p in loaded.parameters())
    tokens = torch.tensor([tokenizer.encode("the cat 2024 the").ids])
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens), model(tokens), rtol=0, atol=0)
        # Stages of the tied model: the last one projects with the embedding, no head bias.
        first, last = build_stages(loaded, (2, 1))
        torch.testing.assert_close(last(first(tokens)), model(tokens), rtol=0, atol=0)
        assert last.tok is loaded.tok and last.head is None


def test_gpt2_settings_it_cannot_run_are_refused(tmp_path: Path) -> None:
    folder = write_gpt2_folder(tmp_path / "gpt2", _nontrivial_gpt(GPT2))
    for changes, message in [
        ({"activation_function": "relu"}, r"activation_function='relu'; supported: gelu_new"),
        ({"n_inner": 64}, r"n_inner=64 is not supported \(only 128\)"),
        ({"scale_attn_by_inverse_layer_idx": True}, r"scale_attn_by_inverse_layer_idx=True"),
        ({"n_layer": 2}, r"unexpected tensors \['h.2."),
    ]:
        original = (folder / "config.json").read_text()
        _edit_config(folder, **changes)
        with pytest.raises(HFModelError, match=message):
            read_hf_model(folder)
        (folder / "config.json").write_text(original)


def test_a_gpt2_trains_on_shorter_windows_than_its_positions(tmp_path: Path) -> None:
    from frugal.pipeline.train import PipelineTrainConfig, train_local

    model = _nontrivial_gpt(GPT2)
    folder = write_gpt2_folder(tmp_path / "gpt2", model)
    corpus = tmp_path / "notes.txt"
    corpus.write_text("\n\n".join(f"the cat {i} sat on the mat" for i in range(120)))
    config = PipelineTrainConfig(
        model="hf", hf=HFModelConfig(path=str(folder), context=12, embeddings="untied"),
        dataset=str(corpus), num_stages=3, num_train=24, num_eval=8, micro_batch_size=2,
        num_microbatches=4, steps=6, learning_rate=3e-3, codec="aqsgd:fw4,bw8",
    )  # fmt: skip
    built = build_model(config)
    assert isinstance(built, TinyGPT) and built.config.context == 12 and built.head is not None
    torch.testing.assert_close(built.pos, model.pos[:12], rtol=0, atol=0)
    torch.testing.assert_close(built.head.weight, model.tok.weight, rtol=0, atol=0)
    assert built.tok.weight.requires_grad  # untied: the embedding trains too
    result = train_local(config)
    assert len(result.losses) == 6 and result.losses[-1] < result.losses[0]
