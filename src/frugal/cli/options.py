"""What subcommands share: `Command`, an area's parser, `--config`, `--set`, `--print-config`."""

from __future__ import annotations

import argparse
import functools
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from frugal.config import ConfigError, config_to_commented_toml, config_to_dict, load_config
from frugal.disk import make_folder

__all__ = [
    "Command",
    "add_area",
    "add_config_arguments",
    "add_print_config_argument",
    "config_from_args",
    "output_file",
    "output_folder",
    "overlay_flags",
    "print_config",
    "with_config",
]

T = TypeVar("T")
Handler = Callable[[argparse.Namespace], int]


@dataclass(frozen=True, kw_only=True)
class Command:
    """A top-level subcommand `frugal NAME`: its help texts and what its module adds to it.

    Each `frugal.cli` module declares one (`COMMAND`); `frugal.cli.main` registers them in
    order. An area (`frugal data ACTION ...`) gives `actions`; a command with flags of its own
    (`frugal plan --scenario ...`) gives `arguments`.

    Raises:
        ValueError: If not exactly one of `actions` and `arguments` is given.
    """

    name: str
    """The subcommand, e.g. "data"."""
    help: str
    """One line for `frugal --help`."""
    description: str
    """Long text of `frugal NAME --help`."""
    actions: Callable[[Any], None] | None = None
    """Adds the area's actions to its subparsers (one of them is required), or None."""
    arguments: Callable[[argparse.ArgumentParser], None] | None = None
    """Adds the command's own arguments to its parser, or None."""

    def __post_init__(self) -> None:
        if (self.actions is None) == (self.arguments is None):
            raise ValueError(
                f"Command {self.name!r} needs exactly one of actions (an area) and arguments "
                "(a command with flags of its own)"
            )

    def register(self, commands: Any) -> None:
        """Add the command to the top-level subparsers `commands`."""
        texts = {"help": self.help, "description": self.description}
        if self.actions is not None:
            self.actions(add_area(commands, self.name, **texts))
        elif self.arguments is not None:
            self.arguments(commands.add_parser(self.name, **texts))


def add_area(commands: Any, name: str, *, help: str, description: str) -> Any:
    """Add the area `frugal NAME ACTION ...` to the top-level subparsers.

    Args:
        commands: The top-level subparsers.
        name: The area's subcommand, e.g. "data".
        help: One line for `frugal --help`.
        description: Long text of `frugal NAME --help`.

    Returns:
        The subparsers of the area's actions; one of them is required.
    """
    parser = commands.add_parser(name, help=help, description=description)
    children = parser.add_subparsers(dest=f"{name}_command", metavar="ACTION")
    children.required = True
    return children


def add_print_config_argument(
    parser: argparse.ArgumentParser, *, takes_config: bool = True
) -> None:
    """Add `--print-config`: print the resolved settings as TOML and exit without running.

    `takes_config`: whether the command also has `--config FILE` (the help then says the
    printed TOML can be passed back).
    """
    back = "; save it, edit it and pass it back with --config FILE" if takes_config else ""
    parser.add_argument(
        "--print-config",
        action="store_true",
        help=f"print the resolved settings as TOML (each with its meaning) and exit{back}",
    )


def print_config(args: argparse.Namespace, config: object) -> bool:
    """Print `config` as commented TOML if `--print-config` was given; return whether it was.

    A handler calls this once its Config is resolved and returns 0 when it gives True.
    """
    if not getattr(args, "print_config", False):
        return False
    print(config_to_commented_toml(config), end="")
    return True


def with_config(
    resolve: Callable[[argparse.Namespace], T],
) -> Callable[[Callable[[argparse.Namespace, T], int]], Handler]:
    """Make a handler `run(args, config)` of one taking `args` alone.

    The handler made resolves the Config with `resolve(args)`; under `--print-config` it prints
    it and returns 0, else it returns `run(args, config)`.

    Args:
        resolve: Builds the command's Config from its parsed arguments (it imports its
            subsystem, so the handler's module stays light).

    Returns:
        A decorator for `run`.
    """

    def decorate(run: Callable[[argparse.Namespace, T], int]) -> Handler:
        @functools.wraps(run)
        def handler(args: argparse.Namespace) -> int:
            config = resolve(args)
            if print_config(args, config):
                return 0
            return run(args, config)

        return handler

    return decorate


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `--config FILE.toml`, repeatable `--set KEY=VALUE` and `--print-config`."""
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
    add_print_config_argument(parser)


def config_from_args(cls: type[T], args: argparse.Namespace) -> T:
    """Build the Config of class `cls` from `--config` and `--set` (defaults live in `cls`).

    Raises:
        ConfigError: If the file or an override does not fit `cls`.
    """
    return load_config(cls, args.config, args.overrides)


def overlay_flags(config: T, flags: Mapping[str, Any]) -> T:
    """`config` (preset, `--config`, `--set`) with the flags that were given on top.

    Args:
        config: The Config resolved so far.
        flags: Each flag's value by the setting it sets (dotted for a nested one,
            "data.dataset"); a flag not given is None (an `append` flag's None or []).

    Raises:
        ConfigError: If a flag's value does not fit (the error names the command line).
    """
    merged = config_to_dict(config)
    for key, value in flags.items():
        if value is None or value == []:
            continue
        *parents, leaf = key.split(".")
        node = merged
        for parent in parents:
            node = node[parent]
        node[leaf] = value
    return load_config(type(config), base=merged, base_source="command line")


def output_folder(value: str, flag: str = "--out") -> Path:
    """The output folder of a command, created now (with its parents) and checked writable.

    Checked before any work, so a bad path fails in a second, not after an hour of bench: a
    file is created in the folder and removed again.

    Raises:
        ConfigError: If the path is an existing file, or the folder cannot be created or
            written.
    """
    path = make_folder(Path(value), what=flag, error=ConfigError)
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise ConfigError(
            f"{flag} {path}: cannot write into the folder ({exc.strerror}); choose a writable path"
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


def add_overwrite_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """Add `--overwrite`: replace `what` of an earlier run in `--out` (refused without it)."""
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help=f"replace {what} of an earlier run in --out (refused without it)",
    )


def add_force_argument(parser: argparse.ArgumentParser) -> None:
    """Add `--force`: start a job the resource guards refuse (`frugal.launch.guards`)."""
    parser.add_argument(
        "--force",
        action="store_true",
        help="start even if the job needs more processes per core or more memory than this "
        "machine has (refused without it; same as FRUGAL_FORCE=1)",
    )


def refuse_earlier_output(path: Path, args: argparse.Namespace, flag: str = "--out") -> None:
    """Refuse, before any work, to replace `path` (an earlier run's output) without --overwrite.

    Raises:
        ConfigError: If `path` exists and `args.overwrite` is not set.
    """
    if path.exists() and not getattr(args, "overwrite", False):
        raise ConfigError(
            f"{flag}: {path} holds an earlier run's output; pass --overwrite to replace it, "
            f"or choose another {flag}"
        )
