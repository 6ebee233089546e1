"""`frugal pipeline train --dp-compress/--dp-bits` and buffer settings: bad input exits 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from frugal.cli.main import main
from tests.pipeline.test_distributed import _dp_plan


def test_dp_compression_needs_replicas_warmup_and_sane_bits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["pipeline", "train", "--dp-compress", "powersgd"]) == 2
    assert "needs data-parallel replicas" in capsys.readouterr().err
    plan = str(_dp_plan(tmp_path))
    assert main(["pipeline", "train", "--plan", plan, "--dp-compress", "qadam"]) == 2
    err = capsys.readouterr().err
    assert "set warmup_steps >= 1" in err and "--plan" not in err
    # Without a plan both fixes are named at once (not one, then the other).
    assert main(["pipeline", "train", "--dp-compress", "qadam"]) == 2
    assert "num_replicas >= 2 (--plan) and warmup_steps >= 1" in capsys.readouterr().err
    assert main(["pipeline", "train", "--plan", plan, "--dp-bits", "9"]) == 2
    assert "dp_bits=9" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:  # argparse refuses the choice itself
        main(["pipeline", "train", "--dp-compress", "topk"])
    assert info.value.code == 2
    assert main(["pipeline", "train", "--set", "buffer_backend=disk"]) == 2
    assert main(["pipeline", "train", "--set", "buffer_budget_mib=0"]) == 2


def test_plan_batch_larger_than_the_data_and_a_missing_plan_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = str(_dp_plan(tmp_path))  # 2 replicas x 2 micro-batches of 8 = 32 windows per step
    args = ["pipeline", "train", "--plan", plan, "--set", "num_train=24"]
    assert main([*args, "--set", "num_microbatches=2"]) == 2
    assert "one step needs 32 training windows" in capsys.readouterr().err
    assert main(["pipeline", "train", "--plan", str(tmp_path / "none.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    for key in ("warmup_steps=-3", "drift_check_every=-1"):
        assert main(["pipeline", "train", "--set", key]) == 2
        assert key in capsys.readouterr().err
