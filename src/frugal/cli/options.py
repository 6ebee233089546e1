"""Arguments shared by subcommands that build a Config: `--config FILE` and `--set KEY=VALUE`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TypeVar

from frugal.config import ConfigError, load_config

__all__ = ["add_config_arguments", "config_from_args", "output_file", "output_folder"]

T = TypeVar("T")


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `--config FILE.toml` and repeatable `--set KEY=VALUE` to a subcommand's parser."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="TOML file of settings; unknown keys are an error",
    )
    parser.add_argument(
        "--set",
        metavar="KEY=VALUE",
        dest="overrides",
        action="append",
        default=[],
        help=(
            "override one setting (repeatable); the value is TOML: --set seed=1, "
            "--set 'name=\"text\"', --set 'values=[1, 2]', --set 'table.key=1'; an unknown "
            "KEY's error lists every setting (e.g. --set list=0)"
        ),
    )


def config_from_args(cls: type[T], args: argparse.Namespace) -> T:
    """Build the Config of class `cls` from `--config` and `--set` (defaults live in `cls`).

    Raises:
        ConfigError: If the file or an override does not fit `cls`.
    """
    return load_config(cls, args.config, args.overrides)


def output_folder(value: str, flag: str = "--out") -> Path:
    """The output folder of a command, created now (with its parents).

    Checked before any work, so a bad path fails in a second, not after an hour of bench.

    Raises:
        ConfigError: If the path is an existing file or the folder cannot be created.
    """
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path} is a file; give a folder (it is created if missing)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"{flag} {path}: cannot create the folder ({exc.strerror}); choose a writable path"
        ) from exc
    return path


def output_file(value: str, flag: str = "--out") -> Path:
    """The output file of a command: its folder is created now, the file written later.

    Raises:
        ConfigError: If the path is a folder or its folder cannot be created.
    """
    path = Path(value)
    if path.is_dir():
        raise ConfigError(f"{flag} {path} is a folder; give a file name")
    output_folder(str(path.parent) if str(path.parent) else ".", flag=f"{flag} folder")
    return path
