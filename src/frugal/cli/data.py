"""`frugal data list | show NAME | export NAME --format ml --out DIR`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from frugal.cli.options import (
    add_config_arguments,
    config_from_args,
    output_folder,
    with_config,
)
from frugal.config import ConfigError

if TYPE_CHECKING:
    from frugal.data import DataConfig, DatasetInfo, DatasetStats

__all__ = ["add_actions"]


def add_actions(children: Any) -> None:
    """Add the actions of `frugal data` to its subparsers."""
    listing = children.add_parser("list", help="table of every bundled dataset")
    listing.add_argument(
        "--verify",
        action="store_true",
        help="hash every file, load every dataset and check its counts (exit 1 on a failure)",
    )
    listing.add_argument("--json", action="store_true", help="print JSON records instead")
    add_config_arguments(listing)
    listing.set_defaults(handler=_list)

    show = children.add_parser("show", help="one dataset's record and measured statistics")
    show.add_argument("name", help="dataset id, e.g. collegemsg")
    add_config_arguments(show)
    show.set_defaults(handler=_show)

    export = children.add_parser("export", help="write a temporal graph in a benchmark format")
    export.add_argument("name", help="dataset id of a temporal graph, e.g. collegemsg")
    export.add_argument(
        "--format",
        choices=["ml"],
        required=True,
        help="ml: the ml_NAME.csv/.npy files read by Benchtemp, TGN and DyGLib",
    )
    export.add_argument("--out", required=True, metavar="DIR", help="folder to write into")
    add_config_arguments(export)
    export.set_defaults(handler=_export)


def _data_config(args: argparse.Namespace) -> DataConfig:
    from frugal.data import DataConfig

    return config_from_args(DataConfig, args)


def _counts(stats: DatasetStats) -> str:
    parts = []
    for value, unit in (
        (stats.num_events, "events"),
        (stats.num_nodes, "nodes"),
        (stats.num_users, "users"),
        (stats.num_items, "items"),
        (stats.num_rows, "rows"),
        (stats.num_documents, "docs"),
        (stats.num_chars, "chars"),
        (stats.num_entities, "entities"),
        (stats.num_relations, "relations"),
        (sum(stats.num_triples) if stats.num_triples else None, "triples"),
    ):
        if value is not None:
            parts.append(f"{value:,} {unit}")
    if stats.class_counts:
        parts.append(f"{len(stats.class_counts)} classes")
    return ", ".join(parts)


def _source(info: DatasetInfo) -> str:
    source = info.source
    if source.channel == "pypi":
        return f"{source.distribution}=={source.version}"
    return f"{source.channel}: {source.distribution} {source.version}"


@with_config(_data_config)
def _list(args: argparse.Namespace, config: DataConfig) -> int:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from frugal.config import config_to_dict
    from frugal.data.status import check_datasets

    statuses = check_datasets(verify=args.verify, config=config)
    rows = [(s.info, s.text, s.stats) for s in statuses]
    failed = [f"{s.info.name}: {s.text}" for s in statuses if s.failed]

    if args.json:
        records = [
            {
                "name": info.name,
                "kind": info.kind,
                "source": config_to_dict(info.source) | {"files": len(info.source.files)},
                "licence": info.licence,
                "licence_note": info.licence_note,
                "task": info.task,
                "status": status,
                "stats": config_to_dict(stats if stats is not None else info.stats),
                "measured": stats is not None,
            }
            for info, status, stats in rows
        ]
        print(json.dumps(records, indent=2))
    else:
        terminal = Console()
        console = Console(width=None if terminal.is_terminal else 150)
        title = "frugal bundled datasets" + (
            " (verified: SHA-256 of every file, counts measured on the parsed data)"
            if args.verify
            else ""
        )
        table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
        for column in ("name", "kind", "source", "MiB", "counts", "licence", "status"):
            table.add_column(
                column, overflow="fold", justify="right" if column == "MiB" else "left"
            )
        for info, status, stats in rows:
            counts = _counts(stats if stats is not None else info.stats)
            table.add_row(
                info.name,
                info.kind,
                _source(info),
                f"{sum(f.size_bytes for f in info.source.files) / 2**20:.1f}",
                counts,
                info.licence,
                status,
            )
        console.print(table)
    if failed:
        print(f"frugal: {len(failed)} dataset(s) failed: {'; '.join(failed)}", file=sys.stderr)
        return 1
    return 0


@with_config(_data_config)
def _show(args: argparse.Namespace, config: DataConfig) -> int:
    from frugal.config import config_to_dict
    from frugal.data import get_dataset_info, verify_dataset

    info = get_dataset_info(args.name)
    stats = verify_dataset(info, config)
    record = config_to_dict(info)
    record["source"]["files"] = [
        f"{f['path']}  sha256={f['sha256']}  {f['size_bytes']:,} bytes"
        for f in record["source"]["files"]
    ]
    measured = {k: v for k, v in config_to_dict(stats).items() if v not in (None, [])}
    if "class_counts" in measured:
        measured["class_counts"] = [
            f"{name}: {count:,}" for name, count in measured["class_counts"]
        ]
    record["measured"] = measured
    del record["stats"]

    def text(value: Any) -> str:
        if isinstance(value, list):
            return ", ".join(str(v) for v in value)
        return (
            f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)
        )

    for key, value in record.items():
        if isinstance(value, dict):
            print(f"{key}:")
            for sub_key, sub_value in value.items():
                if sub_key in ("files", "class_counts"):
                    print(f"  {sub_key}:")
                    for item in sub_value:
                        print(f"    {item}")
                else:
                    print(f"  {sub_key}: {text(sub_value)}")
        else:
            print(f"{key}: {text(value)}")
    return 0


@with_config(_data_config)
def _export(args: argparse.Namespace, config: DataConfig) -> int:
    from frugal.data import get_dataset_info, load_events
    from frugal.data.ml_format import write_ml

    info = get_dataset_info(args.name)
    if "events" not in info.loaders:
        raise ConfigError(
            f"--format ml needs a temporal graph, but {info.name!r} is {info.kind} data; "
            "pick one of the temporal graphs in `frugal data list`"
        )
    if not args.out.strip():
        raise ConfigError("--out is empty; give the folder to write the ml_NAME files into")
    out = output_folder(args.out)  # a file or an unwritable path fails before loading
    events = load_events(info, config)
    for path in write_ml(events, info.name, out):
        print(path)
    return 0
