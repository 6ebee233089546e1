"""`frugal recsys train ...`, `frugal recsys export CHECKPOINT` and `frugal recsys bench`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from frugal.cli.bench import BenchEntry, add_bench
from frugal.cli.options import (
    add_config_arguments,
    add_force_argument,
    add_overwrite_argument,
    output_file,
    output_folder,
    overlay_flags,
    refuse_earlier_output,
    with_config,
)
from frugal.config import ConfigError

if TYPE_CHECKING:
    from frugal.recsys.config import RecsysTrainConfig

__all__ = ["add_actions", "train_config"]


def add_actions(children: Any) -> None:
    """Add the actions of `frugal recsys` to its subparsers."""
    train = children.add_parser("train", help="train with N torchrun processes on 127.0.0.1")
    train.add_argument(
        "--dataset",
        help="dataset id: movielens100k, adult, criteo_zipf, criteo_kaggle_stream, "
        "criteo_terabyte_stream, or one registered in RECSYS_DATASETS",
    )
    train.add_argument("--mode", choices=("sync", "hybrid", "async"), help="training mode")
    train.add_argument("--staleness", type=int, metavar="K", help="permits per trainer (K)")
    train.add_argument("--nproc", type=int, metavar="N", help="trainer processes")
    train.add_argument("--rtt-ms", type=float, metavar="MS", help="simulated PS round trip")
    train.add_argument(
        "--out", default="reports/recsys-train", metavar="DIR", help="folder for result.json"
    )
    add_overwrite_argument(train, "result.json")
    add_force_argument(train)
    add_config_arguments(train)
    train.set_defaults(handler=_train)
    export = children.add_parser(
        "export", help="write a checkpoint's trained rows as (ids, vectors) per table"
    )
    export.add_argument(
        "checkpoint",
        metavar="CHECKPOINT",
        help="checkpoint_dir or one of its step-S folders (S = samples trained)",
    )
    export.add_argument("--out", required=True, metavar="FILE", help="the .npz file to write")
    export.add_argument(
        "--incremental-since",
        metavar="STEP_FOLDER",
        help="an earlier step-S folder of the same chain: write only the rows changed and "
        "the ids deleted since it",
    )
    add_overwrite_argument(export, "the .npz file")
    export.set_defaults(handler=_export)
    add_bench(
        children,
        _bench,
        help="sync vs hybrid vs async side by side",
        quick_help="small preset (1 seed, rtt 5 ms, K 4/16)",
        out="reports/recsys",
    )


def train_config(args: argparse.Namespace) -> RecsysTrainConfig:
    """The `RecsysTrainConfig` of parsed `recsys train` arguments.

    `--config` and `--set` first, then the flags (errors then name the command line).

    Raises:
        ConfigError: On an invalid setting, or `--staleness` with `--mode sync`.
    """
    from frugal.config import load_config
    from frugal.recsys.config import RecsysTrainConfig

    flags = {
        "data.dataset": args.dataset,
        "mode": args.mode,
        "staleness": args.staleness,
        "nproc": args.nproc,
        "rtt_ms": args.rtt_ms,
    }
    config = overlay_flags(load_config(RecsysTrainConfig, args.config, args.overrides), flags)
    staleness_given = args.staleness is not None or any(
        o.split("=", 1)[0].strip() == "staleness" for o in args.overrides
    )
    if config.mode == "sync" and staleness_given:
        raise ConfigError(
            f"--staleness {config.staleness} does not apply to --mode sync (every lookup "
            "waits for all earlier updates); drop --staleness or use --mode hybrid or async"
        )
    return config


@with_config(train_config)
def _train(args: argparse.Namespace, config: RecsysTrainConfig) -> int:
    from frugal.launch import check_job
    from frugal.recsys.launch import check_run, launch_training, memory_estimate

    if not (config.resume and config.checkpoint_dir):  # resuming rewrites its own result
        refuse_earlier_output(Path(args.out) / "result.json", args)
    # Refused or warned before anything is printed or created.
    check_run(config)
    check_job(config.nproc, memory_estimate(config), force=args.force)
    out = output_folder(args.out)
    cores = os.cpu_count() or 1
    print(
        f"starting {config.nproc} trainer process(es) on {cores} CPU core(s)"
        + (
            f"; far more processes than cores: start-up alone (torch import, gloo rendezvous) "
            f"can take minutes, bounded by job_timeout_s={config.job_timeout_s:g}"
            if config.nproc > 4 * cores
            else ""
        ),
        file=sys.stderr,
        flush=True,
    )
    result = launch_training(config, out, timeout_s=config.job_timeout_s, force=args.force)
    keys = ("mode", "dataset", "staleness", "test_auc", "test_logloss", "samples_per_s",
            "max_staleness_seen", "staleness_bound")  # fmt: skip
    print(json.dumps({k: result[k] for k in keys}, indent=1))
    print(f"wrote {out / 'result.json'}", file=sys.stderr)
    return 0


def _export(args: argparse.Namespace) -> int:
    from frugal.recsys.checkpoint import export_tables

    out = output_file(args.out)
    refuse_earlier_output(out, args)
    since = None if args.incremental_since is None else Path(args.incremental_since)
    counts = export_tables(Path(args.checkpoint), out, since=since)
    print(json.dumps(counts, indent=1))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _bench() -> BenchEntry:
    from frugal.bench.recsys import RecsysBenchConfig, run_recsys_bench

    return BenchEntry(
        config_class=RecsysBenchConfig, quick=RecsysBenchConfig.quick, run=run_recsys_bench
    )
