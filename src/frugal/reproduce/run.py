"""Run the parts of `frugal reproduce`, resumably, and assemble one results document."""

from __future__ import annotations

import json
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from frugal.bench.harness import BenchResult, load_bench_result
from frugal.config import check_types
from frugal.disk import DiskFullError
from frugal.reproduce.parts import PART_NAMES, Mode, Part, Verdict, get_part

__all__ = ["MODES", "Mode", "PartOutcome", "ReproduceConfig", "run_reproduce"]

MODES: tuple[str, ...] = get_args(Mode)
_MARKER = "part.json"


@dataclass(frozen=True, kw_only=True, slots=True)
class ReproduceConfig:
    """What `frugal reproduce` runs.

    `smoke` is for CI (tiny settings, seconds per part, numbers meaningless), `quick` about 13
    minutes on 2 cores (README's `make run`), `full` the real benchmark (hours; resumable).
    """

    mode: Mode = "quick"
    """smoke | quick | full."""
    only: tuple[str, ...] = PART_NAMES
    """Parts to run, in report order (store, tgraph, recsys, pipeline, planner)."""

    def __post_init__(self) -> None:
        check_types(self)
        if not self.only:
            raise ValueError(f"only=() selects no part; choose from {', '.join(PART_NAMES)}")
        for name in self.only:
            get_part(name)  # unknown names fail before any work
        if len(set(self.only)) != len(self.only):
            raise ValueError(f"only={self.only} names a part twice")


@dataclass(frozen=True, kw_only=True, slots=True)
class PartOutcome:
    """What one part produced: its bench result, or the error that stopped it."""

    name: str
    status: Literal["ok", "failed"]
    wall_s: float
    result: BenchResult[Any] | None
    """The bench's typed summary, rows and document; None when the part failed."""
    verdicts: tuple[Verdict, ...]
    figure: str | None
    error: str | None
    resumed: bool

    @property
    def document(self) -> dict[str, Any] | None:
        """The bench's `results.json` content, or None when the part failed."""
        return None if self.result is None else self.result.document


class _Eta:
    """A rich progress display: one bar per part, one overall bar with the remaining time.

    Bars advance with wall time against each part's estimate (capped below 100% until the
    part ends), so the ETA stays honest when a bench prints nothing for a while.
    """

    def __init__(self, estimates: dict[str, float], enabled: bool) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("{task.description:<10}"),
            BarColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=Console(stderr=True, soft_wrap=True),
            disable=not enabled,
            transient=False,
        )
        self._estimates = estimates
        self._overall = self._progress.add_task("overall", total=sum(estimates.values()))
        self._tasks = {n: self._progress.add_task(n, total=s) for n, s in estimates.items()}
        self._done_s = 0.0
        self._current: str | None = None
        self._started = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, daemon=True)

    def __enter__(self) -> _Eta:
        self._progress.start()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
        self._progress.stop()

    def log(self, line: str) -> None:
        self._progress.console.print(line, markup=False, highlight=False)

    def begin(self, name: str) -> None:
        self._current, self._started = name, time.monotonic()

    def end(self, name: str) -> None:
        estimate = self._estimates[name]
        self._progress.update(self._tasks[name], completed=estimate)
        self._done_s += estimate
        self._progress.update(self._overall, completed=self._done_s)
        self._current = None

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            name = self._current
            if name is None:
                continue
            estimate = self._estimates[name]
            elapsed = min(time.monotonic() - self._started, 0.99 * estimate)
            self._progress.update(self._tasks[name], completed=elapsed)
            self._progress.update(self._overall, completed=self._done_s + elapsed)


def _finished_wall_s(folder: Path, mode: str, commit: str | None) -> float | None:
    """The wall seconds of a part finished earlier here with the same mode and code; else None.

    A part is reused only if its marker names the same mode and git commit, so a report never
    mixes numbers of different code.
    """
    try:
        meta = json.loads((folder / _MARKER).read_text())
        if (meta.get("mode"), meta.get("status"), meta.get("git_commit")) != (mode, "ok", commit):
            return None
        if not (folder / "results.json").is_file():
            return None
        return float(meta.get("wall_s", 0.0))
    except (OSError, ValueError, AttributeError, TypeError):
        return None


def _load_finished(part: Part, folder: Path) -> BenchResult[Any]:
    """The finished part's results.json, its summary parsed by the bench's Summary class.

    Raises:
        OSError: If the file cannot be read.
        ValueError: If it lacks rows or a summary, or the summary has a missing or unknown key
            (a results.json written by other code: delete the part's folder to measure again).
        TypeError: If a summary value has the wrong type.
    """
    try:
        return load_bench_result(folder / "results.json", part.summary_type())
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{exc} (delete {folder} to measure the part again)") from exc


def run_reproduce(
    config: ReproduceConfig,
    out_dir: Path,
    *,
    show_progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> tuple[dict[str, Any], list[PartOutcome]]:
    """Run each selected part's bench, then write `results.json`, `report.md` and figures.

    Each part works in `out_dir/parts/NAME/`; a part that finished in an earlier call with the
    same mode and git commit is not run again (delete its folder, or use a new `out_dir`, to
    redo it). A part that raises is reported in its section with the error; the others still
    run.

    Args:
        config: Mode and parts.
        out_dir: Output folder (created).
        show_progress: Draw the rich progress bars on stderr.
        log: Extra sink for the benches' progress lines (they always reach the display).

    Returns:
        The combined results document and one outcome per part, in report order.

    Raises:
        OSError: If `out_dir` cannot be written.
        DiskFullError: If a part fills the disk (the run stops; finished parts are kept and a
            rerun resumes from them).
    """
    from frugal.reproduce.report import write_report
    from frugal.results import git_commit, results_document, write_results

    out_dir.mkdir(parents=True, exist_ok=True)
    probe = out_dir / ".write-test"
    probe.write_text("")  # an unwritable folder fails now, not after hours of benches
    probe.unlink()
    commit = git_commit()
    parts = [get_part(name) for name in config.only]
    estimates = {p.name: float(p.estimate_s[config.mode]) for p in parts}
    outcomes: list[PartOutcome] = []
    with _Eta(estimates, show_progress) as eta:

        def progress(line: str) -> None:
            eta.log(line)
            if log is not None:
                log(line)

        for part in parts:
            folder = out_dir / "parts" / part.name
            folder.mkdir(parents=True, exist_ok=True)
            eta.begin(part.name)
            progress(f"[{part.name}] {part.title} ({config.mode})")
            start = time.monotonic()
            finished_s = _finished_wall_s(folder, config.mode, commit)
            resumed = finished_s is not None
            wall_s = finished_s or 0.0
            result: BenchResult[Any] | None = None
            error = None
            (out_dir / f"{part.name}.png").unlink(missing_ok=True)  # never a stale figure
            try:
                if resumed:  # a summary that does not parse fails the part, never "not measured"
                    result = _load_finished(part, folder)
                else:
                    (folder / _MARKER).unlink(missing_ok=True)
                    result = part.run(config.mode, folder, progress)
                    wall_s = time.monotonic() - start
                    marker = {"mode": config.mode, "status": "ok", "git_commit": commit,
                              "wall_s": wall_s}  # fmt: skip
                    (folder / _MARKER).write_text(json.dumps(marker) + "\n")
                verdicts = tuple(part.verdicts(result))
            except DiskFullError as exc:  # every later part would fail the same way: stop
                raise DiskFullError(
                    f"reproduce part {part.name}: {exc}; parts finished earlier in {out_dir} "
                    "are kept and a rerun resumes from them",
                    path=exc.path,
                    needed_bytes=exc.needed_bytes,
                    free_bytes=exc.free_bytes,
                ) from exc
            except Exception as exc:  # one part's failure must not stop the others
                error = f"{type(exc).__name__}: {exc}"
                progress(f"[{part.name}] FAILED: {error}")
                (folder / "error.txt").write_text(traceback.format_exc())
                result, verdicts = None, ()
            figure = None
            if result is not None:
                try:
                    path = out_dir / f"{part.name}.png"
                    part.figure(result, path)
                    figure = path.name if path.exists() else None
                except Exception as exc:  # a broken figure is reported, the numbers stay
                    progress(f"[{part.name}] figure failed: {type(exc).__name__}: {exc}")
            outcome = PartOutcome(
                name=part.name,
                status="ok" if error is None else "failed",
                wall_s=wall_s if error is None else time.monotonic() - start,
                result=result,
                verdicts=verdicts,
                figure=figure,
                error=error,
                resumed=resumed,
            )
            outcomes.append(outcome)
            eta.end(part.name)
            met = sum(v.met is True for v in verdicts)
            progress(
                f"[{part.name}] {outcome.status} in {outcome.wall_s:.0f} s"
                + (" (resumed)" if resumed else "")
                + (f"; claims met {met}/{len(verdicts)}" if verdicts else "")
            )
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"parts": {}, "verdicts": []}
    for outcome in outcomes:
        if outcome.result is not None:
            rows.extend({"part": outcome.name} | row for row in outcome.result.rows)
        summary["parts"][outcome.name] = {
            "status": outcome.status,
            "wall_s": outcome.wall_s,
            "resumed": outcome.resumed,
            "error": outcome.error,
            "summary": None if outcome.result is None else outcome.result.document["summary"],
        }
        summary["verdicts"].extend(v.as_row() for v in outcome.verdicts)
    summary["claims_met"] = sum(v["met"] is True for v in summary["verdicts"])
    summary["claims_not_met"] = sum(v["met"] is False for v in summary["verdicts"])
    summary["claims_not_measured"] = sum(v["met"] is None for v in summary["verdicts"])
    summary["parts_failed"] = [o.name for o in outcomes if o.status == "failed"]
    document = results_document("reproduce", config, rows, summary)
    write_results(out_dir / "results.json", document)
    write_report(out_dir / "report.md", document, outcomes)
    return document, outcomes
