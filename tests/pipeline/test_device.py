"""Device and dtype: auto/cpu/cuda resolution, refusal before launch, bfloat16 on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from frugal.cli.main import main
from frugal.config import ConfigError
from frugal.pipeline.device import (
    FLOAT16_LOSS_SCALE,
    Precision,
    process_group_backend,
    rank_device,
    resolve_device,
)
from frugal.pipeline.models import TinyGPTConfig
from frugal.pipeline.runtime import LocalTransport
from frugal.pipeline.train import PipelineTrainConfig, train_local


def _gpus(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    """Pretend this machine has `count` CUDA GPUs (the test holds with or without real ones)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_auto_is_cpu_without_a_gpu_and_cuda_with_one_per_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _gpus(monkeypatch, 0)
    assert resolve_device("auto") == "cpu" and resolve_device("cpu", 4) == "cpu"
    _gpus(monkeypatch, 2)
    assert resolve_device("auto", 2) == "cuda"
    assert resolve_device("auto", 4) == "cpu"  # 4 ranks cannot each have one of 2 GPUs
    assert resolve_device("cuda", 2) == "cuda"
    assert rank_device("cuda", 1) == torch.device("cuda", 1)
    assert rank_device("cpu", 1) == torch.device("cpu")
    assert (process_group_backend("cuda"), process_group_backend("cpu")) == ("nccl", "gloo")


def test_auto_resolves_to_cpu_on_this_machine() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: auto may resolve to cuda")
    assert resolve_device("auto", 1) == "cpu"


def test_cuda_without_enough_gpus_names_the_constraint_and_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _gpus(monkeypatch, 0)
    with pytest.raises(ConfigError, match=r"--device cuda .*sees no CUDA GPU.*use --device cpu"):
        resolve_device("cuda")
    _gpus(monkeypatch, 1)
    with pytest.raises(ConfigError, match=r"with 4 processes on this machine, but it has 1 GPU"):
        resolve_device("cuda", 4)
    with pytest.raises(ConfigError, match="choose one of auto, cpu, cuda"):
        resolve_device("tpu")


def test_cli_refuses_cuda_without_a_gpu_before_launching(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _gpus(monkeypatch, 0)
    out = tmp_path / "run"
    assert main(["pipeline", "train", "--stages", "2", "--device", "cuda", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--device cuda" in err and "no CUDA GPU" in err and "use --device cpu" in err
    assert not (out / "job.json").exists()  # nothing launched
    _gpus(monkeypatch, 1)  # one GPU, two processes on this machine
    assert main(["pipeline", "train", "--stages", "2", "--device", "cuda", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "with 2 processes on this machine, but it has 1 GPU(s)" in err
    assert "use at most 1 stages per machine" in err and not (out / "job.json").exists()
    with pytest.raises(SystemExit) as exit_info:
        main(["pipeline", "train", "--device", "gpu"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'gpu'" in capsys.readouterr().err


def test_cli_flags_set_the_config(tmp_path: Path) -> None:
    from frugal.cli.main import build_parser
    from frugal.cli.pipeline import train_config

    args = build_parser().parse_args(
        ["pipeline", "train", "--device", "auto", "--dtype", "bfloat16", "--out", str(tmp_path)]
    )
    config = train_config(args)
    assert (config.device, config.dtype) == ("auto", "bfloat16")
    assert (PipelineTrainConfig().device, PipelineTrainConfig().dtype) == ("cpu", "float32")


def _tiny(**changes: object) -> PipelineTrainConfig:
    settings: dict[str, object] = {
        "gpt": TinyGPTConfig(context=16, hidden=32, num_heads=2, num_layers=2),
        "num_stages": 2,
        "num_train": 32,
        "num_eval": 8,
        "micro_batch_size": 4,
        "num_microbatches": 2,
        "steps": 8,
        "learning_rate": 1e-2,
        "device": "cpu",
        "drift_check_every": 1,
    }
    return PipelineTrainConfig(**{**settings, **changes})  # type: ignore[arg-type]


@pytest.mark.parametrize("codec", ["fp32", "bf16", "aqsgd:fw2,bw4"])
def test_bfloat16_trains_a_two_stage_gpt_on_the_cpu(
    codec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[int, torch.dtype]] = []
    post = LocalTransport.post

    def spy(self: LocalTransport, peer: int, tag: int, header: torch.Tensor, *a, **k):  # type: ignore[no-untyped-def]
        sent.append((int(header[7]), header.device.type))
        return post(self, peer, tag, header, *a, **k)

    monkeypatch.setattr(LocalTransport, "post", spy)
    reference = train_local(_tiny(steps=1, codec="fp32"))
    sent.clear()
    low = train_local(_tiny(codec=codec, dtype="bfloat16"))
    # Both start from the same weights (seed 0) and batch: ln(256) = 5.55 nats at init.
    # bfloat16 matmuls (8 significant bits) move it by ~1e-3 here; 0.02 nats is the bound.
    assert abs(low.losses[0] - reference.losses[0]) < 0.02
    assert low.losses[-1] < low.losses[0] - 0.5  # 8 steps at lr 1e-2: 5.6 -> ~3.7
    # Activations and gradients crossed the boundary as bfloat16 (header dtype id 3).
    assert sent and all(item == (3, "cpu") for item in sent)
    # The wire is float32's: the same bytes per message whatever the dtype.
    same = train_local(_tiny(codec=codec, steps=2))
    assert low.activation_bytes[0][:2] == same.activation_bytes[0]
    assert low.gradient_bytes[1][:2] == same.gradient_bytes[1]


def test_float16_uses_a_static_loss_scale_and_trains() -> None:
    precision = Precision(torch.device("cpu"), torch.float16)
    assert precision.loss_scale == FLOAT16_LOSS_SCALE == 1024.0
    assert Precision(torch.device("cpu"), torch.bfloat16).loss_scale == 1.0
    result = train_local(_tiny(codec="fp16", dtype="float16", steps=4))
    # The reported loss is the unscaled one, and the step is the unscaled gradient's.
    assert result.losses[0] == pytest.approx(5.55, abs=0.1)
    assert result.losses[-1] < result.losses[0]


def test_cuda_local_training_without_a_gpu_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    _gpus(monkeypatch, 0)
    with pytest.raises(ConfigError, match="no CUDA GPU"):
        train_local(_tiny(device="cuda"))
