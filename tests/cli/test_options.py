"""`frugal.cli.options`: a `Command` registers its parser; `with_config` runs a handler."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from frugal.cli.main import COMMANDS, build_parser, main
from frugal.cli.options import Command, output_file, output_folder, with_config
from frugal.config import ConfigError


def test_command_registers_an_area_with_a_required_action() -> None:
    seen: list[str] = []

    def actions(children: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        seen.append(children.dest)
        children.add_parser("go").set_defaults(handler=lambda args: 7)

    parser = argparse.ArgumentParser(prog="t")
    commands = parser.add_subparsers(dest="command")
    Command(name="demo", help="one line", description="long", actions=actions).register(commands)
    assert seen == ["demo_command"]
    assert parser.parse_args(["demo", "go"]).handler(None) == 7
    with pytest.raises(SystemExit):  # the area's action is required
        parser.parse_args(["demo"])


def test_command_needs_exactly_one_of_actions_and_arguments() -> None:
    with pytest.raises(ValueError, match="exactly one of actions"):
        Command(name="x", help="h", description="d")
    with pytest.raises(ValueError, match="exactly one of actions"):
        Command(name="x", help="h", description="d", actions=print, arguments=print)


def test_main_registers_every_command_in_help_order() -> None:
    names = [command.name for command in COMMANDS]
    assert names == ["data", "store", "plan", "recsys", "tgraph", "pipeline", "reproduce"]
    subparsers = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    assert list(subparsers.choices) == names


def test_with_config_resolves_then_prints_or_runs(capsys: pytest.CaptureFixture[str]) -> None:
    from frugal.data import DataConfig

    calls: list[object] = []

    @with_config(lambda args: DataConfig())
    def handler(args: argparse.Namespace, config: DataConfig) -> int:
        calls.append(config)
        return 5

    assert handler(argparse.Namespace(print_config=False)) == 5
    assert calls == [DataConfig()]
    assert handler(argparse.Namespace(print_config=True)) == 0  # printed, not run
    assert len(calls) == 1
    assert capsys.readouterr().out.startswith("# ")


def test_overlay_flags_sets_nested_settings_and_skips_flags_not_given() -> None:
    from frugal.cli.options import overlay_flags
    from frugal.recsys.config import RecsysTrainConfig

    base = RecsysTrainConfig()
    flags = {"data.dataset": "adult", "rtt_ms": 7.5, "mode": None, "nproc": []}
    config = overlay_flags(base, flags)
    assert (config.data.dataset, config.rtt_ms) == ("adult", 7.5)
    assert (config.mode, config.nproc) == (base.mode, base.nproc)
    assert config.data.zipf_alpha == base.data.zipf_alpha  # the rest of [data] is kept


def test_recsys_train_names_a_non_finite_rtt(capsys: pytest.CaptureFixture[str]) -> None:
    from frugal.cli.main import main

    assert main(["recsys", "train", "--rtt-ms", "inf", "--print-config"]) == 2
    assert "rtt_ms = inf must be finite" in capsys.readouterr().err


def test_output_folder_refuses_a_folder_it_cannot_write(tmp_path: Path) -> None:
    assert output_folder(str(tmp_path / "new" / "sub")) == tmp_path / "new" / "sub"
    assert list((tmp_path / "new" / "sub").iterdir()) == []  # the probe file is gone
    with pytest.raises(ConfigError, match=r"--out /proc: cannot write into the folder"):
        output_folder("/proc")  # exists, so mkdir passes; only writing tells
    with pytest.raises(ConfigError, match=r"--out folder /proc: cannot write"):
        output_file("/proc/plan.json")


def test_a_bench_without_a_journal_keeps_an_earlier_results_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    earlier = tmp_path / "results.json"
    earlier.write_text('{"earlier": true}')
    code = main(["plan", "bench", "--quick", "--out", str(tmp_path)])
    assert code == 2
    err = capsys.readouterr().err
    assert "results.json holds an earlier run's output; pass --overwrite" in err
    assert earlier.read_text() == '{"earlier": true}'  # refused before any work
    # The flag the error names is accepted by that command.
    args = build_parser().parse_args(["plan", "bench", "--overwrite", "--out", str(tmp_path)])
    assert args.overwrite is True
