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
    assert "warmup_steps >= 1" in capsys.readouterr().err
    assert main(["pipeline", "train", "--plan", plan, "--dp-bits", "9"]) == 2
    assert "dp_bits=9" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:  # argparse refuses the choice itself
        main(["pipeline", "train", "--dp-compress", "topk"])
    assert info.value.code == 2
    assert main(["pipeline", "train", "--set", "buffer_backend=disk"]) == 2
    assert main(["pipeline", "train", "--set", "buffer_budget_mib=0"]) == 2
