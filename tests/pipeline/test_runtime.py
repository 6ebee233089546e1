"""One process: the S-stage pipelined step equals the unpartitioned model (fp32 is exact)."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
import torch.nn.functional as F

from frugal.parallel.codec import CodecSpec, message_wire_bytes
from frugal.parallel.schedule import build_schedule
from frugal.pipeline.models import TextWindows, TinyGPT, TinyGPTConfig, build_stages
from frugal.pipeline.runtime import (
    LocalTransport,
    Microbatch,
    NonFiniteError,
    StageRunner,
    run_local_step,
)

CONFIG = TinyGPTConfig(context=16, hidden=32, num_heads=2, num_layers=4)
TEXT = "The quick brown fox jumps over the lazy dog. " * 40  # 1,800 bytes -> 112 windows


def _pipeline(spec: str, schedule: str, num_stages: int = 4, m: int = 3, micro: int = 2):
    model = TinyGPT(CONFIG, seed=3)
    reference = copy.deepcopy(model)
    data = TextWindows(TEXT, CONFIG.context, num_train=48, num_eval=4)
    layers = (1,) * num_stages if num_stages == 4 else (2, 2)
    transport = LocalTransport()
    runners = [
        StageRunner(
            module,
            CodecSpec.parse(spec),
            transport,
            learning_rate=1e-3,
            num_microbatches_total=m,
            drift_check_every=1,
            # receivers compute each message's size, and the local transport checks it
            example_shape=(CONFIG.context, CONFIG.hidden),
        )
        for module in build_stages(model, layers)
    ]
    actions = [build_schedule(schedule, num_stages, s, m) for s in range(num_stages)]
    return model, reference, data, transport, runners, actions


def _microbatches(data: TextWindows, ids: torch.Tensor, micro: int) -> list[Microbatch]:
    return [Microbatch(c, *data.batch(c)) for c in ids.split(micro)]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_fp32_pipeline_matches_the_unpartitioned_model(schedule: str) -> None:
    model, reference, data, transport, runners, actions = _pipeline("fp32", schedule)
    ids = data.train_ids[:6]
    loss = run_local_step(runners, transport, actions, 0, _microbatches(data, ids, 2))
    inputs, targets = data.batch(ids)
    ref_loss = F.cross_entropy(reference(inputs).reshape(-1, 256), targets.reshape(-1))
    ref_loss.backward()
    # Equal-size micro-batches: the mean of their mean losses is the macro-batch mean.
    assert loss == pytest.approx(float(ref_loss.detach()), rel=1e-6)
    for (name, p), (_, q) in zip(
        model.named_parameters(), reference.named_parameters(), strict=True
    ):
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_gpipe_and_1f1b_give_the_same_parameters() -> None:
    finals = []
    for schedule in ("gpipe", "1f1b"):
        model, _, data, transport, runners, actions = _pipeline("aqsgd:fw2,bw4", schedule)
        for step in range(3):
            ids = data.train_ids[(step % 2) * 6 : (step % 2) * 6 + 6]
            run_local_step(runners, transport, actions, step, _microbatches(data, ids, 2))
        finals.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    torch.testing.assert_close(finals[0], finals[1], rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    "spec",
    [
        "fp32",
        "fp16",
        "directq:fw2,bw4",
        "directq:fw2,bw4:row",
        "aqsgd:fw3,bw6",
        "aqsgd:fw2,bw4:row",
    ],
)
def test_bytes_per_step_equal_the_analytic_wire_size(spec: str) -> None:
    _, _, data, transport, runners, actions = _pipeline(spec, "1f1b")
    codec = CodecSpec.parse(spec)
    shape = (2, CONFIG.context, CONFIG.hidden)  # one micro-batch's boundary tensor
    for step, start in enumerate((0, 6, 0)):  # the third step revisits the first's examples
        ids = data.train_ids[start : start + 6]
        run_local_step(runners, transport, actions, step, _microbatches(data, ids, 2))
        new = 2 if (codec.method == "aqsgd" and step < 2) else 0  # first visits travel fp32
        for runner in runners[:-1]:
            assert (
                runner.stats.activation_bytes[-1]
                == [message_wire_bytes(codec, 0, shape, num_new=new)] * 3
            )
        for runner in runners[1:]:
            assert runner.stats.gradient_bytes[-1] == [message_wire_bytes(codec, 1, shape)] * 3
    if spec == "directq:fw2,bw4":
        # 1,024 values of 32 channels: fw 2 x 32 fp16 scales + 1,024 x 2 / 8 + 128 header
        # = 448 B; bw 4 bits: 64 + 512 + 128 = 704 B (fp32 would be 4,096 + 128).
        assert message_wire_bytes(codec, 0, shape) == 448
        assert message_wire_bytes(codec, 1, shape) == 704
    if spec == "directq:fw2,bw4:row":
        # Row scales: 32 rows x (8 + 32 x 2 / 8) + 128 = 640 B; 4 bits: 32 x 24 + 128 = 896 B.
        assert message_wire_bytes(codec, 0, shape) == 640
        assert message_wire_bytes(codec, 1, shape) == 896


def test_aqsgd_sender_and_receiver_buffers_stay_identical() -> None:
    _, _, data, transport, runners, actions = _pipeline("aqsgd:fw2,bw4", "gpipe")
    for step in range(4):  # drift_check_every=1: every message carries the sender's CRC32
        ids = data.train_ids[(step % 2) * 6 : (step % 2) * 6 + 6]
        run_local_step(runners, transport, actions, step, _microbatches(data, ids, 2))
    for sender, receiver in itertools.pairwise(runners):
        a, b = sender.act_out.delta, receiver.act_in.delta
        assert a is not None and b is not None
        assert len(a.buffers) == len(b.buffers) == 12
        assert all(torch.equal(a.buffers[i], b.buffers[i]) for i in a.buffers)


def test_nan_in_an_activation_names_step_and_stage() -> None:
    _, _, data, transport, runners, actions = _pipeline("fp32", "gpipe")
    ids = data.train_ids[:6]
    run_local_step(runners, transport, actions, 0, _microbatches(data, ids, 2))
    runners[1].module.blocks[0].register_forward_hook(lambda *_: torch.full((2, 16, 32), torch.nan))
    with pytest.raises(NonFiniteError, match="step 1, stage 1, micro-batch 0"):
        run_local_step(runners, transport, actions, 1, _microbatches(data, ids, 2))


def test_recompute_gives_the_same_gradients() -> None:
    grads = []
    for use_recompute in (False, True):
        model = TinyGPT(CONFIG, seed=3)
        data = TextWindows(TEXT, CONFIG.context, num_train=48, num_eval=4)
        transport = LocalTransport()
        runners = [
            StageRunner(module, CodecSpec.parse("fp32"), transport, learning_rate=1e-3,
                        num_microbatches_total=3)
            for module in build_stages(model, (2, 2), use_recompute=use_recompute)
        ]  # fmt: skip
        actions = [build_schedule("1f1b", 2, s, 3) for s in range(2)]
        run_local_step(runners, transport, actions, 0, _microbatches(data, data.train_ids[:6], 2))
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))  # type: ignore[union-attr]
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-6, atol=1e-8)


def test_a_drifted_receiver_buffer_is_detected() -> None:
    from frugal.comm.message import BufferDriftError

    _, _, data, transport, runners, actions = _pipeline("aqsgd:fw2,bw4", "gpipe")
    ids = data.train_ids[:6]
    run_local_step(runners, transport, actions, 0, _microbatches(data, ids, 2))
    receiver = runners[2].act_in.delta
    assert receiver is not None
    assert receiver.buffer is not None
    one = ids[:1]  # one row of stage 2's copy goes wrong
    receiver.buffer.write(one, receiver.buffer.peek(one) + 1e-3, 0)
    with pytest.raises(BufferDriftError, match="step 1 mb 0"):
        run_local_step(runners, transport, actions, 1, _microbatches(data, ids, 2))


def test_warmup_sends_fp32_both_ways_then_compresses() -> None:
    model = TinyGPT(CONFIG, seed=3)
    data = TextWindows(TEXT, CONFIG.context, num_train=48, num_eval=4)
    transport = LocalTransport()
    spec = CodecSpec.parse("aqsgd:fw2,bw4")
    runners = [
        StageRunner(module, spec, transport, learning_rate=1e-3, num_microbatches_total=3,
                    warmup_steps=1, drift_check_every=1,
                    example_shape=(CONFIG.context, CONFIG.hidden))
        for module in build_stages(model, (2, 2))
    ]  # fmt: skip
    actions = [build_schedule("gpipe", 2, s, 3) for s in range(2)]
    shape = (2, CONFIG.context, CONFIG.hidden)
    for step in range(2):  # the same six examples twice
        run_local_step(
            runners, transport, actions, step, _microbatches(data, data.train_ids[:6], 2)
        )
    fp32 = message_wire_bytes(CodecSpec.parse("fp32"), 0, shape)  # 4,096 + 128
    assert runners[0].stats.activation_bytes[0] == [fp32] * 3
    assert runners[1].stats.gradient_bytes[0] == [fp32] * 3
    assert runners[0].stats.activation_bytes[1] == [message_wire_bytes(spec, 0, shape)] * 3
    assert runners[1].stats.gradient_bytes[1] == [message_wire_bytes(spec, 1, shape)] * 3


def test_a_receiver_expecting_another_size_fails_with_a_protocol_error() -> None:
    from frugal.comm.message import ProtocolError

    _, _, data, transport, runners, actions = _pipeline("aqsgd:fw2,bw4", "gpipe")
    runners[2].example_shape = (CONFIG.context, CONFIG.hidden // 2)  # wrong hidden size
    # stage 2 expects 2 x 16 x 16 first-visit floats (2,048 B), stage 1 sends 4,096 B
    with pytest.raises(ProtocolError, match="expected a 2048-byte payload from stage 1"):
        run_local_step(runners, transport, actions, 0, _microbatches(data, data.train_ids[:6], 2))


def test_all_finite_sees_nan_and_inf_anywhere() -> None:
    from frugal.comm.message import all_finite

    x = torch.randn(3, 5, 7)
    assert all_finite(x) and all_finite(torch.zeros(0))
    for bad in (torch.nan, torch.inf, -torch.inf):
        for index in ((0, 0, 0), (2, 4, 6), (1, 2, 3)):
            y = x.clone()
            y[index] = bad
            assert not all_finite(y), (bad, index)


def test_nan_in_a_weight_gradient_is_reported_with_its_stage() -> None:
    _, _, data, transport, runners, actions = _pipeline("fp32", "gpipe")
    ids = data.train_ids[:6]
    weight = next(runners[2].module.parameters())
    weight.register_hook(lambda grad: torch.full_like(grad, torch.inf))
    with pytest.raises(NonFiniteError, match="stage 2") as info:
        run_local_step(runners, transport, actions, 0, _microbatches(data, ids, 2))
    assert "weight gradient" in str(info.value)
