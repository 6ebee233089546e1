"""The pipeline job's memory estimate, term by term, and the guard that reads it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from frugal.config import ConfigError
from frugal.launch import MemoryWarning, check_job
from frugal.pipeline.job import RANK_BASELINE_BYTES, check_training
from frugal.pipeline.models import TinyGPT, TinyGPTConfig
from frugal.pipeline.train import PipelineTrainConfig
from frugal.pipeline.zoo import model_num_params


def test_tiny_gpt_params_are_counted_without_building_it() -> None:
    gpt = TinyGPTConfig(hidden=64, num_layers=3, context=32)
    config = PipelineTrainConfig(gpt=gpt, num_stages=3)
    built = sum(p.numel() for p in TinyGPT(gpt).parameters())
    assert model_num_params(config) == built
    # By hand: token and position embeddings, 3 blocks, final norm, head with bias.
    h, v, t = 64, gpt.vocab_size, 32
    block = 2 * 2 * h + (3 * h * h + 3 * h) + (h * h + h) + (4 * h * h + 4 * h) + (4 * h * h + h)
    assert built == v * h + t * h + 3 * block + 2 * h + h * v + v


def test_the_estimate_has_each_part_by_hand() -> None:
    config = PipelineTrainConfig(codec="aqsgd:fw2,bw4", num_stages=4, num_train=512)
    job = check_training(config)
    params = model_num_params(config)
    terms = dict(job.memory.terms)
    assert terms == {
        "4 ranks x 410 MiB": 4 * RANK_BASELINE_BYTES,
        f"4 whole-model copies of {params:,} float32 weights": 4 * 4 * params,
        "gradients and AdamW moments of 1 replica(s)": 12 * params,
        # 3 links, sender and receiver, one T x H float32 row per training window.
        "AQ-SGD buffers: 3 links x 2 sides x 512 windows": 3 * 2 * 512 * 64 * 128 * 4,
    }
    assert job.memory.fix == "keep the AQ-SGD buffers on disk (--set buffer_backend=store)"


def test_buffers_on_disk_count_their_budget_and_fp32_has_none() -> None:
    config = PipelineTrainConfig(codec="aqsgd:fw2,bw4", buffer_backend="store")
    terms = dict(check_training(replace(config, buffer_budget_mib=16)).memory.terms)
    assert terms["AQ-SGD buffers: 3 links x 2 sides x buffer_budget_mib"] == 6 * (16 << 20)
    assert not any(
        "AQ-SGD" in what for what, _ in check_training(PipelineTrainConfig()).memory.terms
    )


def test_a_job_over_the_machines_memory_is_refused_and_its_fix_accepted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import frugal.launch.guards as guards

    total = 8 << 30  # an 8 GiB machine
    monkeypatch.setattr(guards, "machine_memory_bytes", lambda: (total, total))
    config = PipelineTrainConfig(
        codec="aqsgd:fw2,bw4", gpt=TinyGPTConfig(hidden=2048), num_train=512
    )  # 201 M parameters, and 1.5 GiB of AQ-SGD buffers in RAM
    job = check_training(config)
    assert job.memory.total_bytes > total
    with pytest.raises(ConfigError, match=r"--set buffer_backend=store\), use fewer"):
        check_job(job.world_size, job.memory, force=False)
    with pytest.warns(MemoryWarning):
        check_job(job.world_size, job.memory, force=True)  # forced: it would start
    fixed = check_training(replace(config, buffer_backend="store"))  # the suggested fix
    assert fixed.memory.total_bytes <= total
    check_job(fixed.world_size, fixed.memory)
