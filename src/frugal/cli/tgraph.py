"""`frugal tgraph bench ...` and `frugal tgraph leaderboard DIR`."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from frugal.cli.bench import BenchEntry, add_bench
from frugal.cli.options import overlay_flags
from frugal.config import ConfigError

if TYPE_CHECKING:
    from frugal.bench.tgraph import TgraphBenchConfig

__all__ = ["add_actions", "bench_config"]


def add_actions(children: Any) -> None:
    """Add the actions of `frugal tgraph` to its subparsers."""
    bench = add_bench(
        children,
        _bench,
        help="train and evaluate models under one protocol",
        description=(
            "Train and evaluate every model on every dataset under one hashed protocol. Each "
            "finished (dataset, model, seed) run is journaled in OUT/runs.jsonl and reused by "
            "any later run with the same --out, protocol, task, threads and process isolation "
            "(other datasets, models or seeds add to it), so a long bench can be resumed and "
            "extended."
        ),
        quick_help="small preset: sp_hospital + collegemsg, 1 seed, 2 epochs",
        out="reports/tgraph",
        resumes=True,
    )
    bench.add_argument("--dataset", action="append", default=None, metavar="NAME|PATH",
                       help="dataset id, or the path of your own events file (a value with a "
                       "/ or ending in .csv): an ml_NAME.csv (with its .npy files beside it) "
                       "or a CSV with the header src,dst,t[,label][,feature columns...]; "
                       "repeatable; default collegemsg")  # fmt: skip
    bench.add_argument("--model", action="append", default=None, metavar="NAME",
                       help="registered model (repeatable): edgebank, edgebank_window, recency, "
                       "popularity, jodie, dyrep, tgn, tgat, graphmixer, cawn, dygformer, nat, "
                       "neurtw (the last four pair-scoring: their MRR ranks the protocol's "
                       "num_ranking_candidates sampled destinations, rows say ranking=sampled:N), "
                       "one added with register_model, or your own as package.module:attribute;"
                       " default all but cawn, dygformer and neurtw (hours a run on a "
                       "CPU)")  # fmt: skip
    bench.add_argument("--protocol", choices=("frugal", "benchtemp"), default=None,
                       help="evaluation protocol (default frugal)")  # fmt: skip
    bench.add_argument("--task", choices=("lp", "nc"), default=None,
                       help="link prediction, or also node classification")  # fmt: skip
    bench.add_argument("--seeds", type=int, default=None, metavar="N",
                       help="seeds per learned model (default 3)")  # fmt: skip
    bench.add_argument("--first-seed", type=int, default=None, metavar="K",
                       help="first seed (default 0): learned models run seeds K .. K+N-1 "
                       "(heuristics run once, as seed 0), so benches of one --out can split "
                       "the seeds between cores; give them disjoint seeds: a bench reads the "
                       "journal when it starts")  # fmt: skip
    board = children.add_parser("leaderboard", help="Markdown tables and a PNG from results")
    board.add_argument("results_dir", metavar="RESULTS_DIR",
                       help="folder with results.json files and bench journals "
                       "(runs.jsonl; searched at any depth)")  # fmt: skip
    board.add_argument("--metric", default="auc", choices=("auc", "ap", "mrr", "hits_at_10",
                       "sampled_mrr", "sampled_hits_at_10", "auc_per_batch", "ap_per_batch",
                       "nc_auc"),
                       help="metric of the tables (nc_auc: node classification only; mrr and "
                       "hits_at_10 get one table per ranking, all or sampled:N; sampled_mrr "
                       "ranks every model on the same sampled candidates)")  # fmt: skip
    board.set_defaults(handler=_leaderboard)


def bench_config(args: argparse.Namespace) -> TgraphBenchConfig:
    """The `TgraphBenchConfig` of parsed `tgraph bench` arguments.

    The preset (`--quick`, `--protocol`), then `--config` and `--set`, then the explicit flags.
    A `protocol.name` in `--config` or `--set` selects that protocol preset as `--protocol
    NAME` does (`benchtemp`: widths 172, patience 3, random negatives, ...); settings given
    explicitly still win over it.

    Raises:
        ConfigError: On an invalid setting, an unknown protocol preset, or `--protocol` and
            `protocol.name` naming different presets.
    """
    from frugal.bench.tgraph import TgraphBenchConfig, with_protocol_preset
    from frugal.config import config_to_dict, load_config

    preset = TgraphBenchConfig.quick() if args.quick else TgraphBenchConfig()
    if args.protocol is not None and args.protocol != preset.protocol.name:
        preset = with_protocol_preset(preset, args.protocol)
    merged = load_config(
        TgraphBenchConfig, args.config, args.overrides, base=config_to_dict(preset)
    )
    if merged.protocol.name != preset.protocol.name:
        if args.protocol is not None:
            raise ConfigError(
                f"--protocol {args.protocol} contradicts protocol.name = "
                f"{merged.protocol.name!r} from --config or --set; keep one of them"
            )
        preset = with_protocol_preset(preset, merged.protocol.name)
        merged = load_config(
            TgraphBenchConfig, args.config, args.overrides, base=config_to_dict(preset)
        )
    flags = {
        "datasets": args.dataset,
        "models": args.model,
        "task": args.task,
        "num_seeds": args.seeds,
        "first_seed": args.first_seed,
    }
    return overlay_flags(merged, flags)


def _bench() -> BenchEntry:
    from frugal.bench.tgraph import TgraphBenchConfig, run_tgraph_bench

    return BenchEntry(
        config_class=TgraphBenchConfig,
        run=run_tgraph_bench,
        resolve=bench_config,
        show=lambda summary: summary["datasets"],
        progress=_spinner,
    )


@contextlib.contextmanager
def _spinner() -> Iterator[Callable[[str], None]]:
    """A rich spinner showing the latest progress line; finished runs stay printed."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
        transient=False, console=Console(stderr=True),  # stdout holds only the results
    ) as progress:  # fmt: skip
        task = progress.add_task("tgraph bench", total=None)

        def report(line: str) -> None:
            progress.update(task, description=line)
            if line.endswith("s") and "done" in line:
                progress.console.print(line)

        yield report


def _leaderboard(args: argparse.Namespace) -> int:
    from frugal.tgraph.leaderboard import write_leaderboard

    if not Path(args.results_dir).is_dir():
        raise ConfigError(
            f"{args.results_dir} is not a folder; give the --out folder of `frugal tgraph bench`"
        )
    path = write_leaderboard(Path(args.results_dir), args.metric)
    print(path.read_text())
    print(f"wrote {path} and {path.with_suffix('.png')}", file=sys.stderr)
    return 0
