"""Entry point of the `frugal` command: the top-level parser, dispatch and exit codes."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import frugal
from frugal import FrugalError
from frugal.cli import data as data_command
from frugal.cli import pipeline as pipeline_command
from frugal.cli import plan as plan_command
from frugal.cli import recsys as recsys_command
from frugal.cli import reproduce as reproduce_command
from frugal.cli import store as store_command
from frugal.cli import tgraph as tgraph_command
from frugal.cli.options import Command
from frugal.config import ConfigError

__all__ = ["COMMANDS", "build_parser", "cli_surface", "main"]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM

Handler = Callable[[argparse.Namespace], int]


COMMANDS: tuple[Command, ...] = (
    Command(
        name="data",
        help="list, inspect and export the bundled real datasets",
        description="The bundled real datasets: found in installed packages, never downloaded.",
        actions=data_command.add_actions,
    ),
    Command(
        name="store",
        help="disk-backed embedding storage (MLKV): benchmark",
        description="frugal.store: embedding tables on disk behind a lookahead cache.",
        actions=store_command.add_actions,
    ),
    Command(
        name="plan",
        help="place pipeline x data-parallel training on a (geo-distributed) cluster",
        description=(
            "Search a placement (DT-FM scheduler's cost model) and print it; settings such as "
            "num_stages, num_replicas, method, budget and seed go through --set."
        ),
        arguments=plan_command.add_arguments,
    ),
    Command(
        name="recsys",
        help="hybrid sync/async recommender training (Persia): train, benchmark",
        description="frugal.recsys: async embeddings + sync dense network on torch.distributed.",
        actions=recsys_command.add_actions,
    ),
    Command(
        name="tgraph",
        help="temporal-GNN benchmark (Benchtemp): bench, leaderboard",
        description="frugal.tgraph: one fair protocol for every temporal GNN.",
        actions=tgraph_command.add_actions,
    ),
    Command(
        name="pipeline",
        help="compressed pipeline-parallel training over slow links (AQ-SGD)",
        description="frugal.pipeline: GPipe/1F1B over torch.distributed with activation codecs.",
        actions=pipeline_command.add_actions,
    ),
    Command(
        name="reproduce",
        help="the main job: every subsystem's headline claim vs its baselines, one report",
        description=(
            "Run each subsystem's bench (store, tgraph, recsys, pipeline, planner) side by side "
            "with its baselines on the bundled real data and write results.json, report.md and "
            "figures. Parts finished earlier in the same folder and mode are not redone."
        ),
        arguments=reproduce_command.add_arguments,
    ),
)
"""The subcommands of `frugal`, in the order of `frugal --help`."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr and exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """Return the full `frugal` argument parser."""
    parser = _Parser(
        prog="frugal",
        description=(
            "frugal: train large models on the infrastructure people actually have "
            "(disk-backed embeddings, compressed pipelines, geo-distributed placement)."
        ),
    )
    parser.add_argument("--version", action="version", version=f"frugal {frugal.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True
    for command in COMMANDS:
        command.register(commands)
    return parser


def cli_surface(parser: argparse.ArgumentParser | None = None) -> dict[str, list[str]]:
    """Return every subcommand path with its sorted option flags, e.g. {"data list": [...]}.

    A test pins this, so that the command line changes only on purpose.
    """
    surface: dict[str, list[str]] = {}

    def walk(node: argparse.ArgumentParser, path: str) -> None:
        flags = sorted(
            flag
            for action in node._actions  # argparse offers no public way to list actions
            for flag in action.option_strings
        )
        positionals = [
            action.dest.upper()
            for action in node._actions
            if not action.option_strings and not isinstance(action, argparse._SubParsersAction)
        ]
        surface[path] = flags + positionals
        for action in node._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, f"{path} {name}".strip())

    walk(parser or build_parser(), "")
    return surface


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code (0 ok, 1 failure, 2 bad input, 130, 143).

    Ctrl-C returns 130 and SIGTERM 143 (128 + the signal), each after one line. Bad input (a
    `ConfigError`) prints one line and returns 2; another `FrugalError` or an `OSError` prints
    one line and returns 1. Any other exception, a `ValueError` or `TypeError` from library
    internals included, is a bug and propagates with its traceback.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    # SIGTERM (timeout, kill) unwinds like Ctrl-C, so launchers' cleanup stops their workers.
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if in_main_thread else None
    show_warning = warnings.showwarning
    warnings.showwarning = _one_line_warning(show_warning)
    try:
        return handler(args)
    except BrokenPipeError:  # e.g. `frugal data list --json | head`: the reader left
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the exit-time flush
        return EXIT_OK
    except ConfigError as exc:  # bad input, raised where the input is checked
        print(f"frugal: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except FrugalError as exc:  # a domain failure: missing package, corrupt store, lost rank
        print(f"frugal: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except OSError as exc:  # a path that cannot be read or written, a full disk
        print(f"frugal: {_describe_os_error(exc)}", file=sys.stderr)
        return EXIT_FAILURE
    except Terminated:
        print("frugal: terminated", file=sys.stderr)
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        print("frugal: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        warnings.showwarning = show_warning
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _one_line_warning(fallback: Callable[..., None]) -> Callable[..., None]:
    """A `warnings.showwarning` that prints frugal's own warnings as one line.

    `frugal: warning: ...`, without the source location and code Python adds; warnings of
    other packages are shown by `fallback`, as Python shows them.
    """

    def show(
        message: Warning | str, category: type[Warning], filename: str, lineno: int,
        file: Any = None, line: str | None = None,
    ) -> None:  # fmt: skip
        if os.path.abspath(filename).startswith(_PACKAGE_DIR + os.sep):
            print(f"frugal: warning: {message}", file=sys.stderr if file is None else file)
        else:
            fallback(message, category, filename, lineno, file, line)

    return show


def _describe_os_error(exc: OSError) -> str:
    """One line for an `OSError`; a full disk also says where, how much is free, what to do."""
    from frugal.disk import disk_full_error, is_disk_full

    if not is_disk_full(exc):
        return str(exc)
    if not exc.filename:
        return f"the disk is full ({exc}); {_DISK_FULL_FIX}"
    path = Path(exc.filename)
    return str(disk_full_error(exc, path, what=f"writing {path.name}", fix=_DISK_FULL_FIX))


_DISK_FULL_FIX = (
    "files written before it are whole (each is written to a temporary name, then renamed); "
    "free space there or give --out a folder on a larger disk, then run the command again"
)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so every `finally` and launcher cleanup runs; exit 143."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


if __name__ == "__main__":
    sys.exit(main())
