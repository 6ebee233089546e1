"""An existing output is never replaced silently: refused before any work, or --overwrite."""

from __future__ import annotations

from pathlib import Path

import pytest

from frugal.cli.main import build_parser, main


@pytest.mark.parametrize(
    ("argv", "earlier"),
    [
        (["pipeline", "train", "--steps", "1"], "train.json"),
        (["recsys", "train", "--nproc", "1"], "result.json"),
    ],
    ids=["pipeline-train", "recsys-train"],
)
def test_a_training_command_refuses_an_earlier_result_without_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], earlier: str
) -> None:
    (tmp_path / earlier).write_text('{"earlier": true}')
    assert main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / earlier} holds an earlier run's output; pass --overwrite" in err
    assert (tmp_path / earlier).read_text() == '{"earlier": true}'
    assert build_parser().parse_args([*argv, "--overwrite", "--out", str(tmp_path)]).overwrite


def test_plan_refuses_an_existing_plan_file_before_the_search(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import frugal.planner.plan

    def no_search(*args: object, **kwargs: object) -> None:
        raise AssertionError("the search ran before the output was checked")

    monkeypatch.setattr(frugal.planner.plan, "build_plan", no_search)
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    assert main(["plan", "--scenario", "world", "--out", str(plan)]) == 2
    assert "holds an earlier run's output; pass --overwrite" in capsys.readouterr().err
    assert plan.read_text() == "{}"
    # An unwritable --out fails the same way, before the search.
    assert main(["plan", "--scenario", "world", "--out", "/proc/x.json"]) == 2
    assert "--out folder /proc: cannot write into the folder" in capsys.readouterr().err


def test_recsys_export_refuses_an_existing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rows.npz"
    out.write_bytes(b"earlier")
    assert main(["recsys", "export", str(tmp_path / "ck"), "--out", str(out)]) == 2
    assert "rows.npz holds an earlier run's output" in capsys.readouterr().err
    assert out.read_bytes() == b"earlier"


def test_recsys_train_resuming_its_checkpoints_rewrites_its_own_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `resume=true` continues the run whose result.json is there (a kill may land after it
    # was written): not an earlier run's output to protect.
    import frugal.recsys.launch

    class LaunchedError(Exception):
        pass

    def launch(*args: object, **kwargs: object) -> None:
        raise LaunchedError

    monkeypatch.setattr(frugal.recsys.launch, "launch_training", launch)
    (tmp_path / "result.json").write_text('{"earlier": true}')
    checkpoints = f"checkpoint_dir='{tmp_path / 'checkpoints'}'"
    argv = ["recsys", "train", "--nproc", "1", "--out", str(tmp_path), "--set", checkpoints]
    with pytest.raises(LaunchedError):
        main([*argv, "--set", "resume=true"])
    assert main(argv) == 2  # without resume it is an earlier run's output again
