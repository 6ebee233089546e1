"""The error policy: bad input is one line and exit 2; a bug shows its traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from frugal.cli import data as data_command
from frugal.cli.main import main


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["data", "show", "nope"], "unknown dataset 'nope'"),
        (["tgraph", "bench", "--model", "apan"], "apan"),
        (["tgraph", "bench", "--dataset", "nope"], "nope"),
        (["pipeline", "train", "--codec", "nope"], "codec 'nope'"),
        (["pipeline", "train", "--set", "num_train=-1"], "num_train=-1"),
        (["store", "bench", "--set", "num_batches=-5"], "num_batches"),
        (["recsys", "train", "--nproc", "0"], "nproc"),
        (["plan", "--scenario", "nowhere"], "unknown scenario 'nowhere'"),
        (["plan", "--scenario", "spot", "--set", "num_stages=8", "--set", "num_replicas=4"],
         "num_stages*num_replicas = 8*4 = 32 but world_size = 64"),
        (["reproduce", "--only", "store,nope"], "nope"),
        (["store", "bench", "--set", "nope=1"], "unknown key nope"),
    ],
)  # fmt: skip
def test_common_bad_input_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], fragment: str
) -> None:
    out = ["--out", str(tmp_path / "out")] if args[0] != "data" and args[:1] != ["plan"] else []
    assert main([*args, *out]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("frugal: error: ") and fragment in err[0]


def test_an_unknown_key_in_a_config_file_exits_2_naming_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = tmp_path / "bench.toml"
    recipe.write_text("num_batches = 10\nbogus = 1\n")
    assert main(["store", "bench", "--config", str(recipe), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{recipe}: unknown key bogus; allowed keys:" in err[0]


def test_an_internal_value_error_is_a_bug_and_propagates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(args: object) -> int:
        raise ValueError("internal invariant broken")

    monkeypatch.setattr(data_command, "_list", broken)
    with pytest.raises(ValueError, match="internal invariant broken"):
        main(["data", "list"])


def test_a_bug_shows_its_traceback_and_exits_1_while_bad_input_is_one_line() -> None:
    # A subprocess: the real exit path (uncaught exception -> traceback, exit 1).
    code = (
        "import sys; import frugal.cli.data as d; from frugal.cli.main import main\n"
        "def broken(args): raise TypeError('bug in a handler')\n"
        "d._list = broken\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    bug = subprocess.run(
        [sys.executable, "-c", code, "data", "list"], capture_output=True, text=True, timeout=120
    )
    assert bug.returncode == 1
    assert "Traceback (most recent call last)" in bug.stderr
    assert "TypeError: bug in a handler" in bug.stderr
    bad = subprocess.run(
        [sys.executable, "-c", code, "data", "show", "nope"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1
    assert bad.stderr.startswith("frugal: error: unknown dataset 'nope'")


def test_a_flag_counts_before_the_settings_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    # 2 layers fit --stages 2, not the default 4 stages: checked after the flag applies.
    assert main(["pipeline", "train", "--stages", "2", "--set", "gpt.num_layers=2",
                 "--print-config"]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "num_stages = 2" in printed and "num_layers = 2" in printed
    assert main(["pipeline", "train", "--stages", "5", "--set", "gpt.num_layers=2"]) == 2
    assert "num_stages=5 but the model has 2 blocks" in capsys.readouterr().err
