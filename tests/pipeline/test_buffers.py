"""AQ-SGD buffers in RAM, in a memory-mapped file and in frugal.store: same bits, drift found."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from frugal.comm.buffers import MemmapBuffer
from frugal.comm.message import BufferDriftError
from frugal.parallel.codec import CodecSpec
from frugal.parallel.schedule import build_schedule
from frugal.pipeline.buffers import BufferSet, StoreBuffer
from frugal.pipeline.models import TextWindows, TinyGPT, TinyGPTConfig, build_stages
from frugal.pipeline.runtime import LocalTransport, Microbatch, StageRunner, run_local_step
from frugal.pipeline.train import PipelineTrainConfig, train_local

GPT = TinyGPTConfig(context=16, hidden=32, num_heads=2, num_layers=2)
TEXT = "The quick brown fox jumps over the lazy dog. " * 40  # 112 windows of 17 bytes
BACKENDS = ("memory", "memmap", "store")


def _runners(buffers: BufferSet) -> tuple[TinyGPT, list[StageRunner], LocalTransport]:
    model = TinyGPT(GPT, seed=3)
    transport = LocalTransport()
    runners = [
        StageRunner(
            module,
            CodecSpec.parse("aqsgd:fw2,bw4"),
            transport,
            learning_rate=1e-3,
            num_microbatches_total=3,
            drift_check_every=1,
            buffers=buffers.factory,
        )
        for module in build_stages(model, (1, 1))
    ]
    return model, runners, transport


def _step(data: TextWindows, runners: list[StageRunner], transport: LocalTransport, step: int):
    per_epoch = len(data.train_ids) // 6
    order = data.epoch_order(step // per_epoch, seed=0)
    ids = order[(step % per_epoch) * 6 : (step % per_epoch + 1) * 6]
    nxt = data.epoch_order((step + 1) // per_epoch, seed=0)
    upcoming = nxt[((step + 1) % per_epoch) * 6 : ((step + 1) % per_epoch + 1) * 6]
    for runner in runners:
        runner.prefetch(upcoming, step + 1)  # the loader knows the order
    mbs = [Microbatch(c, *data.batch(c)) for c in ids.split(2)]
    actions = [build_schedule("gpipe", 2, s, 3) for s in range(2)]
    return run_local_step(runners, transport, actions, step, mbs)


@pytest.mark.slow
def test_three_backends_train_bit_identically() -> None:
    config = PipelineTrainConfig(
        gpt=GPT, num_stages=2, num_train=24, num_eval=4, micro_batch_size=2,
        num_microbatches=3, steps=6, codec="aqsgd:fw2,bw4", drift_check_every=1,
    )  # fmt: skip
    data = TextWindows(TEXT, GPT.context, 24, 4)  # 4 steps per epoch: revisits from step 4
    results = [train_local(replace(config, buffer_backend=b), data=data) for b in BACKENDS]
    memory = results[0]
    assert memory.losses[-1] < memory.losses[0]
    for other in results[1:]:
        assert other.losses == memory.losses  # exactly: the same float32 rows every time
        assert other.eval_loss == memory.eval_loss
        assert other.buffer_bytes == memory.buffer_bytes == 2 * 24 * 16 * 32 * 4


@pytest.mark.slow
def test_store_buffers_larger_than_their_cache_prefetch_and_match_ram(tmp_path: Path) -> None:
    data = TextWindows(TEXT, GPT.context, 96, 4)  # 16 steps per epoch
    params = []
    stores: list[StoreBuffer] = []
    for backend in ("memory", "store"):
        # 160 KiB per store: fewer cached rows of 2 KiB than the 96 examples it holds.
        buffers = BufferSet(backend, 112, str(tmp_path), store_budget_bytes=160 << 10)
        model, runners, transport = _runners(buffers)
        for step in range(20):
            _step(data, runners, transport, step)
        params.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
        stores = [b for b in buffers.buffers if isinstance(b, StoreBuffer)]
        if backend == "store":
            stats = [s.store.stats() for s in stores]
            assert all(s["capacity_rows"] < 96 for s in stats)  # the rows do not all fit
            assert all(s["evictions"] > 0 and s["prefetched"] > 0 for s in stats)
        buffers.close()
    assert torch.equal(params[0], params[1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_injected_drift_names_step_stage_and_examples(backend: str, tmp_path: Path) -> None:
    data = TextWindows(TEXT, GPT.context, 24, 4)
    buffers = BufferSet(backend, 112, str(tmp_path), store_budget_bytes=1 << 20)
    try:
        _, runners, transport = _runners(buffers)
        for step in range(4):  # epoch 0: every example buffered on both sides
            _step(data, runners, transport, step)
        receiver = runners[1].act_in.delta
        assert receiver is not None and receiver.buffer is not None
        victim = data.epoch_order(1, seed=0)[:1]  # first example of step 4
        receiver.buffer.write(victim, receiver.buffer.peek(victim) + 1e-3, 4)
        with pytest.raises(BufferDriftError) as info:
            _step(data, runners, transport, 4)
        message = str(info.value)
        assert "stage 1" in message and "step 4 mb 0" in message
        assert str(int(victim[0])) in message
    finally:
        buffers.close()


def test_memmap_rows_are_in_the_file_and_ids_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "rows.f32"
    buffer = MemmapBuffer(path, 10, (2, 3))
    rows = torch.arange(12, dtype=torch.float32).reshape(2, 2, 3)
    buffer.write(torch.tensor([7, 2]), rows, 0)
    assert buffer.seen(torch.tensor([2, 3, 7])).tolist() == [True, False, True]
    buffer.close()
    on_disk = np.fromfile(path, dtype=np.float32).reshape(10, 2, 3)
    assert np.array_equal(on_disk[7], rows[0].numpy()) and np.array_equal(on_disk[2], rows[1])
    with pytest.raises(ValueError, match="beyond this buffer's 10 rows"):
        MemmapBuffer(tmp_path / "b.f32", 10, (2,)).write(torch.tensor([10]), torch.ones(1, 2), 0)
    with pytest.raises(ValueError, match="example ids must be >= 0, got -1"):
        MemmapBuffer(tmp_path / "c.f32", 10, (2,)).write(torch.tensor([3, -1]), torch.ones(2, 2), 0)


@pytest.mark.slow
def test_both_sides_hold_equal_rows_for_every_backend(tmp_path: Path) -> None:
    data = TextWindows(TEXT, GPT.context, 24, 4)
    for backend in BACKENDS:
        buffers = BufferSet(backend, 112, str(tmp_path), store_budget_bytes=1 << 20)
        _, runners, transport = _runners(buffers)
        for step in range(6):
            _step(data, runners, transport, step)
        for sender, receiver in itertools.pairwise(runners):
            a, b = sender.act_out.delta, receiver.act_in.delta
            assert a is not None and b is not None and len(a.buffers) == len(b.buffers) == 24
            assert all(torch.equal(a.buffers[i], b.buffers[i]) for i in a.buffers)
        buffers.close()
    assert list(tmp_path.iterdir()) == []  # every temporary buffer folder removed


def test_buffer_set_removes_the_parent_it_made_but_keeps_a_users(tmp_path: Path) -> None:
    made = tmp_path / "new" / "buffers"
    buffers = BufferSet("memmap", 8, str(made))
    buffers.factory("link0-1.send")((4,))
    assert len(list(made.iterdir())) == 1  # the run's own fresh folder
    buffers.close()
    assert not (tmp_path / "new").exists()  # made by the set, empty again: removed
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    buffers = BufferSet("memmap", 8, str(kept))
    buffers.factory("link0-1.send")((4,))
    buffers.close()
    assert [p.name for p in kept.iterdir()] == ["notes.txt"]  # the user's folder stays as it was


def test_compressed_first_visits_train_with_buffers_in_sync() -> None:
    # fv8: the warm-up (2 steps) and every later first visit travel as 8-bit codes; the
    # drift check compares sender and receiver buffer CRCs at every message.
    config = PipelineTrainConfig(
        gpt=GPT, num_stages=2, num_train=24, num_eval=4, micro_batch_size=2,
        num_microbatches=3, steps=8, codec="aqsgd:fw2,bw4:fv8", drift_check_every=1,
        warmup_steps=2,
    )  # fmt: skip
    data = TextWindows(TEXT, GPT.context, 24, 4)  # 4 steps per epoch: revisits from step 4
    fv8 = train_local(config, data=data)
    plain = train_local(replace(config, codec="aqsgd:fw2,bw4"), data=data)
    assert fv8.losses[-1] < fv8.losses[0]
    # Step 0's stage 1 already sees 8-bit activations: close to fp32's, not equal.
    assert fv8.losses[0] != plain.losses[0]
    assert abs(fv8.losses[0] - plain.losses[0]) < 1e-4 * plain.losses[0]
    assert abs(fv8.eval_loss - plain.eval_loss) < 0.05 * plain.eval_loss


def test_error_feedback_gradients_train_and_differ_from_plain_ones() -> None:
    config = PipelineTrainConfig(
        gpt=GPT, num_stages=2, num_train=24, num_eval=4, micro_batch_size=2,
        num_microbatches=3, steps=8, codec="aqsgd:fw2,bw4:ef", drift_check_every=1,
    )  # fmt: skip
    data = TextWindows(TEXT, GPT.context, 24, 4)
    ef = train_local(config, data=data)
    plain = train_local(replace(config, codec="aqsgd:fw2,bw4"), data=data)
    assert ef.losses[-1] < ef.losses[0]
    assert ef.losses[0] == plain.losses[0]  # step 0's forward is the same; its backward is not
    assert ef.losses[1:] != plain.losses[1:]
    assert abs(ef.eval_loss - plain.eval_loss) < 0.05 * plain.eval_loss
