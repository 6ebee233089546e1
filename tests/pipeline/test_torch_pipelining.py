"""The torch.distributed.pipelining baseline trains the same model to the same losses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from frugal.pipeline.models import TinyGPT, TinyGPTConfig
from frugal.pipeline.torch_pipelining import (
    SCHEDULES,
    _schedule_classes,
    launch_torch_pipelining,
    summarize,
)
from frugal.pipeline.train import PipelineTrainConfig, load_windows


def test_each_schedule_name_is_torchs_class_of_that_name() -> None:
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    assert _schedule_classes() == {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
    assert tuple(_schedule_classes()) == SCHEDULES


@pytest.mark.slow
@pytest.mark.distributed
def test_torch_pipelining_matches_the_unpartitioned_model(tmp_path: Path) -> None:
    config = PipelineTrainConfig(
        gpt=TinyGPTConfig(context=16, hidden=32, num_heads=2, num_layers=2),
        num_train=16, num_eval=8, num_stages=2, micro_batch_size=2, num_microbatches=3,
        learning_rate=1e-2, comm_timeout_s=60.0,
    )  # fmt: skip
    ranks = launch_torch_pipelining(config, ["gpipe", "1f1b"], 3, tmp_path, timeout_s=240)
    result = summarize(config, ranks)
    # Reference: the whole model, the same batch every step, mean of micro-batch means, AdamW.
    data = load_windows(config)
    inputs, targets = data.batch(data.epoch_order(0, config.seed)[:6])
    model = TinyGPT(config.gpt, seed=config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    expected = []
    for _ in range(3):
        optimizer.zero_grad()
        losses = [
            F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
            for x, y in zip(inputs.split(2), targets.split(2), strict=True)
        ]
        loss = torch.stack(losses).mean()
        loss.backward()
        optimizer.step()
        expected.append(float(loss.detach()))
    for schedule in ("gpipe", "1f1b"):
        assert result[schedule]["losses"] == pytest.approx(expected, rel=1e-4)
        assert result[schedule]["tokens_per_s"] > 0
    assert expected[2] < expected[0]
