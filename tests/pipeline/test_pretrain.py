"""Pre-training on unseen windows and fine-tuning from `init_weights` (the bench's quality runs)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from frugal.pipeline.models import TinyGPTConfig
from frugal.pipeline.train import (
    PipelineTrainConfig,
    evaluate,
    load_windows,
    pretrain_local,
    train_local,
)
from frugal.pipeline.zoo import build_model

CONFIG = PipelineTrainConfig(
    gpt=TinyGPTConfig(context=16, hidden=32, num_heads=2, num_layers=2),
    num_stages=2, num_train=64, num_eval=16, micro_batch_size=4, num_microbatches=2, steps=2,
)  # fmt: skip


def test_pretraining_windows_are_disjoint_from_train_and_eval() -> None:
    data = load_windows(CONFIG)
    train, evals, rest = (
        set(ids.tolist()) for ids in (data.train_ids, data.eval_ids, data.rest_ids)
    )
    assert not (rest & train) and not (rest & evals) and not (train & evals)
    assert len(train) == 64 and len(rest) > 1000
    assert all(i % 8 != 7 for i in rest)  # every 8th window is held out for evaluation


def test_pretrained_weights_load_and_fine_tuning_starts_from_them(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    path = tmp_path / "pretrained.pt"
    info = pretrain_local(CONFIG, 1, path, max_windows=256)
    assert info["windows"] == 256 and info["steps"] == 256 // 8
    fresh = build_model(CONFIG)
    tuned = build_model(replace(CONFIG, init_weights=str(path)))
    saved = torch.load(path, weights_only=True)
    assert all(torch.equal(tuned.state_dict()[k], v) for k, v in saved.items())
    assert not torch.equal(fresh.state_dict()["head.weight"], saved["head.weight"])
    data = load_windows(CONFIG)
    assert info["eval_loss"] == pytest.approx(evaluate(tuned, data))
    assert info["eval_loss"] < evaluate(fresh, data) - 0.5  # 32 steps learn byte statistics
    # A fine-tuning run from the weights starts where pre-training ended.
    result = train_local(replace(CONFIG, init_weights=str(path), steps=1, learning_rate=1e-9))
    assert result.eval_loss == pytest.approx(info["eval_loss"], abs=1e-4)


def test_init_weights_of_another_model_or_a_missing_file_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.pt"
    other = replace(CONFIG, gpt=replace(CONFIG.gpt, hidden=64))
    torch.save(build_model(other).state_dict(), path)
    with pytest.raises(ValueError, match="does not fit the tiny-gpt of this config"):
        build_model(replace(CONFIG, init_weights=str(path)))
    with pytest.raises(ValueError, match=r"init_weights='nope\.pt': no such file"):
        replace(CONFIG, init_weights="nope.pt")
    with pytest.raises(ValueError, match="epochs=0 must be >= 1"):
        pretrain_local(CONFIG, 0, path)


def test_unreadable_init_weights_and_non_text_datasets_are_clear_errors(tmp_path: Path) -> None:
    empty, garbage, listed = tmp_path / "empty.pt", tmp_path / "garbage.pt", tmp_path / "l.pt"
    empty.write_bytes(b"")
    garbage.write_text("not a checkpoint")
    torch.save([1, 2], listed)
    for path, message in ((empty, r"\(EOFError"), (garbage, r"\(UnpicklingError"),
                          (listed, "holds a list, not a state_dict")):  # fmt: skip
        with pytest.raises(ValueError, match=message):
            build_model(replace(CONFIG, init_weights=str(path)))
    with pytest.raises(ValueError, match=r"'adult' is not a text corpus.*pydoc_topics, fortunes"):
        replace(CONFIG, dataset="adult")
    with pytest.raises(ValueError, match="unknown dataset 'nosuch'; the pipeline trains on"):
        replace(CONFIG, dataset="nosuch")
    with pytest.raises(ValueError, match=r"buffer_dir=.* is a file; give a folder"):
        replace(CONFIG, buffer_dir=str(garbage))
    with pytest.raises(ValueError, match="steps=0 must be >= 1"):
        replace(CONFIG, steps=0)
