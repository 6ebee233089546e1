"""Arguments shared by subcommands that build a Config: `--config FILE` and `--set KEY=VALUE`."""

from __future__ import annotations

import argparse
from typing import TypeVar

from frugal.config import load_config

__all__ = ["add_config_arguments", "config_from_args"]

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
            '--set \'systems=["ram", "frugal"]\''
        ),
    )


def config_from_args(cls: type[T], args: argparse.Namespace) -> T:
    """Build the Config of class `cls` from `--config` and `--set` (defaults live in `cls`).

    Raises:
        ConfigError: If the file or an override does not fit `cls`.
    """
    return load_config(cls, args.config, args.overrides)
