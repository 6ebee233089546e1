"""Two trainers under torchrun on loopback (gloo + torch.distributed.rpc), MovieLens-100k."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frugal.config import config_to_dict
from frugal.recsys.datasets import RecsysDataConfig
from frugal.recsys.trainer import RecsysTrainConfig, staleness_bound
from frugal.testing import run_torchrun


def _train(tmp_path: Path, mode: str, staleness: int, rtt_ms: float = 0.0) -> dict:
    config = RecsysTrainConfig(
        data=RecsysDataConfig(dataset="movielens100k"),
        mode=mode,  # type: ignore[arg-type]
        staleness=staleness,
        nproc=2,
        rtt_ms=rtt_ms,
        max_steps=60,
        batch_size=256,
        timeout_s=60.0,
    )
    out = tmp_path / mode
    out.mkdir()
    job = {"runs": [{"config": config_to_dict(config), "out_dir": str(out)}]}
    (out / "job.json").write_text(json.dumps(job))
    result = run_torchrun(["frugal.recsys.trainer", str(out / "job.json")], nproc=2, timeout_s=240)
    assert result.ok, result.format()
    document: dict = json.loads((out / "result.json").read_text())
    return document


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize(("mode", "staleness", "rtt_ms"), [("sync", 1, 0.0), ("hybrid", 4, 2.0)])
def test_two_trainers_train_and_agree(
    tmp_path: Path, mode: str, staleness: int, rtt_ms: float
) -> None:
    result = _train(tmp_path, mode, staleness, rtt_ms)
    assert result["steps"] == 60
    # the loss goes down (mean of the last fifth of the steps vs the first fifth)
    assert result["train_loss_last"] < result["train_loss_first"] - 0.01
    # AllReduce every step: both ranks end with bit-identical dense parameters
    ranks = result["ranks"]
    assert len(ranks) == 2
    assert ranks[0]["dense_params_sha256"] == ranks[1]["dense_params_sha256"]
    # measured staleness within the mode's bound; every row update was logged
    bound = staleness_bound(mode, staleness, 2)  # type: ignore[arg-type]
    assert result["staleness_bound"] == bound
    assert result["max_staleness_seen"] <= bound
    assert sum(result["staleness_hist"]) > 0
    if mode == "sync":
        assert result["max_staleness_seen"] <= 1
    assert 0.55 < result["test_auc"] < 0.9
