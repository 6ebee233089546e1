"""The one bench command path: `frugal <area> bench [--quick] [--out DIR]` for every area.

Each area's subcommand registers its bench with `add_bench` in a few lines: the Config class,
its `--quick` preset and the entry function of its `frugal.bench` module, imported only when
the command runs. The shared handler builds the Config (preset, then `--config`, then `--set`),
honours `--print-config`, runs the entry function, prints the summary as JSON on stdout and
the results path on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frugal.cli.options import (
    add_config_arguments,
    add_overwrite_argument,
    output_folder,
    print_config,
    refuse_earlier_output,
)
from frugal.config import config_to_dict, load_config

__all__ = ["BenchEntry", "add_bench", "plain", "run_bench"]

Progress = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class BenchEntry:
    """How one bench runs: its Config, its preset and its entry function.

    Attributes:
        config_class: The bench's Config class (defaults live there).
        run: The entry function, `run(config, out_dir, progress=callable)`, returning a
            `frugal.bench.harness.BenchResult`, or a document (a dict or a dataclass with a
            `summary`, a dict or a dataclass).
        quick: The `--quick` preset (a function returning a Config), or None.
        resolve: Builds the Config from the parsed arguments instead of the generic
            preset/`--config`/`--set` order (for a bench with its own flags), or None.
        show: What of the summary to print (default: all of it).
        progress: A context manager giving the progress callback (default: lines on stderr).
        exit_code: The exit code of a finished document (default: 0).
    """

    config_class: type[Any]
    run: Callable[..., Any]
    quick: Callable[[], Any] | None = None
    resolve: Callable[[argparse.Namespace], Any] | None = None
    show: Callable[[dict[str, Any]], Any] | None = None
    progress: Callable[[], AbstractContextManager[Progress]] | None = None
    exit_code: Callable[[dict[str, Any]], int] | None = None


def add_bench(
    children: Any,
    entry: Callable[[], BenchEntry],
    *,
    name: str = "bench",
    help: str,
    quick_help: str,
    out: str,
    out_help: str = "folder for results.json",
    description: str | None = None,
    check: Callable[[argparse.Namespace], None] | None = None,
    resumes: bool = False,
) -> argparse.ArgumentParser:
    """Add a bench subcommand with `--quick`, `--out`, `--config`, `--set`, `--print-config`.

    Args:
        children: The subparsers of the area (`frugal store ...`).
        entry: Returns the bench's `BenchEntry`; called only when the command runs, so the
            bench module is imported lazily.
        name: The subcommand's name.
        help: One line for the area's `--help`.
        quick_help: Help of `--quick` (what the small preset runs).
        out: Default of `--out`.
        out_help: Help of `--out`.
        description: Long text of the subcommand's `--help`.
        check: Refuses arguments before anything is built (raises `ConfigError`), or None.
        resumes: The bench journals its finished cells in `--out` and resumes from them. If
            False, the subcommand gets `--overwrite` and refuses, before any work, an `--out`
            that holds an earlier run's results.json without it.

    Returns:
        The subcommand's parser, for extra arguments.
    """
    parser: argparse.ArgumentParser = children.add_parser(name, help=help, description=description)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--out", default=out, metavar="DIR", help=out_help)
    if not resumes:
        add_overwrite_argument(parser, "the results.json")
    add_config_arguments(parser)

    def handler(args: argparse.Namespace) -> int:
        if check is not None:
            check(args)
        return run_bench(args, entry())

    parser.set_defaults(handler=handler)
    return parser


def plain(value: Any) -> Any:
    """A summary or document as plain data: a dataclass becomes a dict, anything else stays."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def run_bench(args: argparse.Namespace, entry: BenchEntry) -> int:
    """Build the bench's Config from `args`, run it and print its summary; return the exit code.

    Raises:
        ConfigError: If a setting or `--out` is invalid, or `--out` holds an earlier run's
            results.json and the bench neither resumes nor was given `--overwrite`.
    """
    if entry.resolve is not None:
        config = entry.resolve(args)
    else:
        preset = config_to_dict(entry.quick()) if args.quick and entry.quick else None
        config = load_config(entry.config_class, args.config, args.overrides, base=preset)
    if print_config(args, config):
        return 0
    out = output_folder(args.out)
    if hasattr(args, "overwrite"):  # a bench that does not resume
        refuse_earlier_output(out / "results.json", args)
    from frugal.bench.harness import BenchResult

    with (entry.progress or _stderr_lines)() as progress:
        result = entry.run(config, out, progress=progress)
    document = result.document if isinstance(result, BenchResult) else plain(result)
    if isinstance(document, Mapping) and "summary" in document:
        document = {**document, "summary": plain(document["summary"])}
        summary = document["summary"]
    else:  # the entry returned its summary itself
        summary = document
        document = {"summary": summary}
    print(json.dumps(entry.show(summary) if entry.show else summary, indent=1))
    print(f"wrote {Path(out) / 'results.json'}", file=sys.stderr)
    return entry.exit_code(document) if entry.exit_code else 0


@contextlib.contextmanager
def _stderr_lines() -> Iterator[Progress]:
    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    yield progress
