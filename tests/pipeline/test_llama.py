"""The compact Llama, its stages and the GGUF loader, on tiny models written to GGUF here."""

from __future__ import annotations

import copy
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tokenizers import pre_tokenizers

from frugal.parallel.codec import CodecSpec
from frugal.parallel.schedule import build_schedule
from frugal.pipeline.gguf_loader import (
    GGUFFormatError,
    load_gguf_llama,
    permute_for_gguf,
    read_gguf_llama,
    tokenizer_from_gguf,
    unpermute_from_gguf,
)
from frugal.pipeline.llama import Llama, LlamaConfig, build_llama_stages
from frugal.pipeline.models import TextWindows
from frugal.pipeline.runtime import LocalTransport, Microbatch, StageRunner, run_local_step
from frugal.pipeline.zoo import balanced_layers, unigram_entropy

ALPHABET = sorted(pre_tokenizers.ByteLevel.alphabet())  # the 256 byte-level symbols
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "Ġ c", "a t"]
TOKENS = [*SPECIAL, *ALPHABET, "Ġt", "he", "Ġthe", "Ġc", "at"]
TINY = LlamaConfig(
    vocab_size=len(TOKENS),
    hidden=32,
    intermediate=48,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    rope_theta=10000.0,
    max_context=64,
)


def _write_gguf(path: Path, model: Llama, *, embd_q8: bool = True, arch: str = "llama") -> None:
    """A GGUF file as llama.cpp's converter writes it: q/k rows permuted, names, metadata."""
    c = model.config
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(c.num_layers)
    writer.add_context_length(c.max_context)
    writer.add_embedding_length(c.hidden)
    writer.add_feed_forward_length(c.intermediate)
    writer.add_head_count(c.num_heads)
    writer.add_head_count_kv(c.num_kv_heads)
    writer.add_rope_freq_base(c.rope_theta)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(TOKENS)
    writer.add_token_types([3] * len(SPECIAL) + [1] * (len(TOKENS) - len(SPECIAL)))
    writer.add_token_merges(MERGES)

    def add(name: str, w: torch.Tensor, qtype: gguf.GGMLQuantizationType) -> None:
        values = w.detach().numpy().astype(np.float32)
        if qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, values)
        else:
            writer.add_tensor(name, gguf.quantize(values, qtype), raw_dtype=qtype)

    f32 = gguf.GGMLQuantizationType.F32
    add("token_embd.weight", model.tok.weight, gguf.GGMLQuantizationType.Q8_0 if embd_q8 else f32)
    add("output_norm.weight", model.norm.weight, f32)
    names = {
        "attn_norm": "attn_norm",
        "attn_q": "q_proj",
        "attn_k": "k_proj",
        "attn_v": "v_proj",
        "attn_output": "o_proj",
        "ffn_norm": "mlp_norm",
        "ffn_gate": "gate_proj",
        "ffn_up": "up_proj",
        "ffn_down": "down_proj",
    }
    for i, block in enumerate(model.blocks):
        for theirs, ours in names.items():
            w = getattr(block, ours).weight
            if theirs == "attn_q":
                w = permute_for_gguf(w, c.num_heads)
            elif theirs == "attn_k":
                w = permute_for_gguf(w, c.num_kv_heads)
            add(f"blk.{i}.{theirs}.weight", w, f32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Llama, Path]:
    model = Llama(TINY, seed=1)
    with torch.no_grad():  # non-trivial norms, so a swapped norm weight shows
        for p in model.parameters():
            if p.dim() == 1:
                p.copy_(1 + 0.1 * torch.randn(p.shape))
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    _write_gguf(path, model, embd_q8=False)
    return model, path


def test_permutation_is_inverted() -> None:
    w = torch.arange(12 * 3, dtype=torch.float32).view(12, 3)
    permuted = permute_for_gguf(w, 2)  # 2 heads of 6 rows: 0 3 1 4 2 5 | 6 9 7 10 8 11
    assert permuted[:, 0].tolist() == [0, 9, 3, 12, 6, 15, 18, 27, 21, 30, 24, 33]
    torch.testing.assert_close(unpermute_from_gguf(permuted, 2), w, rtol=0, atol=0)


def test_loader_restores_every_weight_and_the_shape(written: tuple[Llama, Path]) -> None:
    model, path = written
    loaded = read_gguf_llama(path)
    assert loaded.config == TINY
    assert set(loaded.state_dict) == set(model.state_dict())
    for name, value in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict[name], value, rtol=0, atol=0, msg=name)
    assert loaded.tensor_types["blk.0.attn_q.weight"] == "F32"


def test_loaded_model_computes_the_same_logits(written: tuple[Llama, Path]) -> None:
    model, path = written
    loaded, _ = load_gguf_llama(path)
    tokens = torch.randint(0, TINY.vocab_size, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens), model(tokens), rtol=1e-5, atol=1e-5)


def test_q8_0_embedding_is_within_its_quantization_step(tmp_path: Path) -> None:
    model = Llama(TINY, seed=2)
    _write_gguf(tmp_path / "q8.gguf", model, embd_q8=True)
    w = read_gguf_llama(tmp_path / "q8.gguf").state_dict["tok.weight"]
    ref = model.tok.weight.detach()
    # Q8_0: per 32 values d = absmax / 127, w = d * round(x / d): error <= d / 2 (+ fp16 d).
    step = ref.view(-1, 32).abs().amax(1, keepdim=True) / 127
    assert bool(((w - ref).view(-1, 32).abs() <= step * 0.5 + 1e-4).all())
    assert not torch.equal(w, ref)


def test_q4_1_block_dequantizes_by_hand(tmp_path: Path) -> None:
    # One Q4_1 block of 32 weights: fp16 d = 0.5, fp16 m = -1, 16 bytes of nibbles; weight j
    # (j < 16) is the low nibble of byte j, weight 16 + j its high nibble; w = d q + m.
    q = np.array([j % 16 for j in range(32)], dtype=np.uint8)
    q[16:] = 15 - q[16:]
    block = np.concatenate(
        [
            np.array([0.5, -1.0], dtype=np.float16).view(np.uint8),
            (q[:16] | (q[16:] << 4)).astype(np.uint8),
        ]
    )
    writer = gguf.GGUFWriter(tmp_path / "q41.gguf", "llama")
    writer.add_tensor("t", block.reshape(1, 20), raw_dtype=gguf.GGMLQuantizationType.Q4_1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tensor = gguf.GGUFReader(tmp_path / "q41.gguf").tensors[0]
    values = gguf.dequantize(tensor.data, tensor.tensor_type).reshape(-1)
    expected = [0.5 * j - 1 for j in range(16)] + [0.5 * (15 - j) - 1 for j in range(16)]
    assert values.tolist() == expected


def test_rotate_half_on_unpermuted_weights_equals_interleaved_rope_on_gguf_weights() -> None:
    # Independent path: llama.cpp rotates adjacent pairs (2i, 2i + 1) of the *permuted* q/k
    # rows (complex multiplication, as Meta's reference); we rotate halves of un-permuted
    # rows. The attention scores must agree.
    torch.manual_seed(0)
    heads, d, hidden, length, theta = 2, 8, 16, 5, 10000.0
    wq = torch.randn(heads * d, hidden)
    x = torch.randn(length, hidden)
    model = Llama(
        LlamaConfig(
            vocab_size=4,
            hidden=hidden,
            intermediate=4,
            num_layers=1,
            num_heads=heads,
            num_kv_heads=heads,
            rope_theta=theta,
            max_context=length,
        )
    )
    cos, sin = model.rope(length)

    def rotate_half(v: torch.Tensor) -> torch.Tensor:
        return torch.cat([-v[..., d // 2 :], v[..., : d // 2]], dim=-1)

    q = (x @ wq.T).view(length, heads, d).transpose(0, 1)
    ours = q * cos + rotate_half(q) * sin
    gg = (x @ permute_for_gguf(wq, heads).T).view(length, heads, d // 2, 2)
    angles = torch.outer(
        torch.arange(length, dtype=torch.float64),
        1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d),
    )
    rot = torch.polar(torch.ones_like(angles), angles).to(torch.complex64)  # (T, D / 2)
    theirs = torch.view_as_real(torch.view_as_complex(gg.contiguous()) * rot[:, None])
    theirs = theirs.reshape(length, heads, d).transpose(0, 1)
    # Same vectors up to the fixed row order inside each head, so equal dot products.
    torch.testing.assert_close(ours @ ours.transpose(1, 2), theirs @ theirs.transpose(1, 2))
    torch.testing.assert_close(
        ours, theirs.view(heads, length, d // 2, 2).transpose(2, 3).reshape(heads, length, d)
    )


def test_tokenizer_from_gguf_merges_splits_digits_and_keeps_specials(
    written: tuple[Llama, Path],
) -> None:
    _, path = written
    tokenizer = tokenizer_from_gguf(path)
    enc = tokenizer.encode("<|im_start|>the cat 42")
    assert enc.tokens == ["<|im_start|>", "t", "he", "Ġc", "at", "Ġ", "4", "2"]
    assert enc.ids[0] == 1
    assert tokenizer.encode(" the").tokens == ["Ġthe"]
    assert tokenizer.decode(enc.ids, skip_special_tokens=False) == "<|im_start|>the cat 42"


def test_a_non_llama_file_is_refused(tmp_path: Path) -> None:
    model = Llama(TINY, seed=0)
    _write_gguf(tmp_path / "gpt2.gguf", model, arch="gpt2")
    with pytest.raises(GGUFFormatError, match=r"general\.architecture='gpt2'"):
        read_gguf_llama(tmp_path / "gpt2.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(GGUFFormatError, match="not a readable GGUF"):
        read_gguf_llama(tmp_path / "junk.gguf")


@pytest.mark.parametrize("layers", [(1, 1, 1, 1), (2, 1, 1), (4,)])
def test_stages_compose_to_the_whole_model(layers: tuple[int, ...]) -> None:
    model = Llama(TINY, seed=4)
    tokens = torch.randint(0, TINY.vocab_size, (3, 12), generator=torch.Generator().manual_seed(1))
    x = tokens
    for stage in build_llama_stages(model, layers):
        x = stage(x)
    with torch.no_grad():
        torch.testing.assert_close(x, model(tokens), rtol=0, atol=0)
    with pytest.raises(ValueError, match="sum to the model's 4 blocks"):
        build_llama_stages(model, (2, 1))


def test_fp32_pipeline_step_of_a_llama_matches_the_unpartitioned_model() -> None:
    model = Llama(TINY, seed=5)
    model.tok.weight.requires_grad_(False)  # frozen tied embedding, as the SmolLM2 default
    reference = copy.deepcopy(model)
    tokens = np.random.default_rng(0).integers(0, TINY.vocab_size, 2000)
    data = TextWindows.from_tokens(tokens, 16, num_train=8, num_eval=2)
    transport = LocalTransport()
    runners = [
        StageRunner(
            module, CodecSpec.parse("fp32"), transport, learning_rate=1e-3, num_microbatches_total=3
        )
        for module in build_llama_stages(model, (1, 2, 1))
    ]
    actions = [build_schedule("1f1b", 3, s, 3) for s in range(3)]
    ids = data.train_ids[:6]
    mbs = [Microbatch(c, *data.batch(c)) for c in ids.split(2)]
    loss = run_local_step(runners, transport, actions, 0, mbs)
    inputs, targets = data.batch(ids)
    ref = F.cross_entropy(reference(inputs).reshape(-1, TINY.vocab_size), targets.reshape(-1))
    ref.backward()
    assert loss == pytest.approx(float(ref.detach()), rel=1e-6)
    for (name, p), (_, q) in zip(
        model.named_parameters(), reference.named_parameters(), strict=True
    ):
        if not q.requires_grad:
            assert p.grad is None, name
            continue
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7, msg=name)
    torch.testing.assert_close(model.tok.weight, reference.tok.weight, rtol=0, atol=0)


def test_balanced_layers_lighten_the_last_stage() -> None:
    # SmolLM2: 30 blocks, head ~ 8 blocks: (10, 10, 9) + 1 block + head -> max cost 10.
    assert balanced_layers(30, 4, 8.0) == (10, 10, 9, 1)
    assert balanced_layers(8, 2, 0.0) == (4, 4)
    # 12 blocks, head 2: last 2 -> 5 | 5 | 2 + 2 (max 5); last 3 ties (5 | 4 | 5): the first
    # minimum, the lighter last stage, wins.
    assert balanced_layers(12, 3, 2.0) == (5, 5, 2)
    assert balanced_layers(5, 1, 3.0) == (5,)
    with pytest.raises(ValueError, match="between 1 and 5"):
        balanced_layers(5, 6, 0.0)


def test_unigram_entropy_by_hand() -> None:
    # counts 2, 1, 1 of 4: -(1/2 ln 1/2 + 2 * 1/4 ln 1/4) = 1.5 ln 2
    assert unigram_entropy(np.array([0, 0, 1, 2]), 5) == pytest.approx(1.5 * np.log(2))


def test_smollm2_preset_and_its_default_layout() -> None:
    from frugal.pipeline.train import make_layout
    from frugal.pipeline.zoo import boundary_shape, smollm2_train_config

    config = smollm2_train_config()
    assert (config.model, config.dataset, config.smollm.embeddings) == (
        "smollm2-135m",
        "fortunes",
        "frozen",
    )
    assert make_layout(config, 4).layers == (10, 10, 9, 1)
    assert boundary_shape(config) == (2, 64, 576)
