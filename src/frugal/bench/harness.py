"""The one bench harness: presets, typed summaries, child-process cells and medians.

Every area's bench (`frugal.bench.store`, `frugal.bench.tgraph`, ...) is built from these parts:

- `Preset`: the sizes `frugal reproduce` runs a bench at (`"smoke"`, `"quick"`, `"full"`).
- `BenchConfig`: the base of each bench's Config. A bench declares its sizes as data, the
  settings of `--quick` (`QUICK`) and of each preset (`PRESETS`); `quick()` and
  `preset(name)` build them.
- `Summary`: the base of each bench's frozen summary dataclass (`StoreSummary`, ...). The
  `"summary"` of `results.json` is `Summary.to_dict()`; `Summary.from_dict` reads it back and
  raises on a missing or an unknown key, so a renamed field is an error, never a claim silently
  turning into "not measured".
- `BenchResult`: what a bench returns: its typed summary, its rows and the `results.json`
  document it wrote (`write_bench_results`, reading back: `load_bench_result`).
- `Bench`: the protocol `frugal reproduce` drives a bench through; `BenchSpec` builds one from
  a bench's name, Summary class, preset and run function.
- `run_cell`: runs one cell in a fresh child process with a timeout, under one failure rule.
- `median`, `median_after_warmup`, `median_item`: the medians every timing goes through.

The resumable journal of finished cells is `frugal.results.BenchJournal`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import multiprocessing
import os
import signal
import statistics
import traceback
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, Protocol, Self, TypeVar, get_args

from frugal import FrugalError
from frugal._libc import die_with_parent

__all__ = [
    "PRESETS",
    "Bench",
    "BenchConfig",
    "BenchResult",
    "BenchRun",
    "BenchSpec",
    "CellOutcome",
    "CellStatus",
    "Preset",
    "Progress",
    "Summary",
    "load_bench_result",
    "median",
    "median_after_warmup",
    "median_item",
    "process_pool",
    "run_cell",
    "write_bench_results",
]

Preset = Literal["smoke", "quick", "full"]
"""`smoke`: seconds per bench, numbers meaningless (CI); `quick`: minutes on 2 cores;
`full`: the real benchmark (hours)."""
PRESETS: tuple[Preset, ...] = get_args(Preset)
Progress = Callable[[str], None]
"""Called with one line per finished step of a bench."""

S = TypeVar("S", bound="Summary")
S_co = TypeVar("S_co", bound="Summary", covariant=True)
C = TypeVar("C")
C_contra = TypeVar("C_contra", contravariant=True)
T = TypeVar("T")
A = TypeVar("A")


# --- presets -------------------------------------------------------------------------------

_PRESET_CHAIN: tuple[Preset, ...] = ("quick", "smoke")
"""Each preset but `full` is the one before it (`--quick` first) with its own settings."""


class BenchConfig:
    """Base of every bench's Config: its `--quick` preset and its `frugal reproduce` presets.

    Subclasses are frozen dataclasses whose defaults are the full bench. They declare their
    smaller sizes as data: `QUICK`, the settings of `--quick` over the defaults, and `PRESETS`,
    the settings each preset adds to the one before it: `full` is the defaults, `quick` is
    `quick()` with `PRESETS["quick"]`, `smoke` is the `quick` preset with `PRESETS["smoke"]`.
    A setting whose value is a mapping updates a nested Config field by field
    (`{"protocol": {"max_epochs": 1}}`); any other value replaces the field. Annotate both
    tables `ClassVar` (imported at module level, so that a dataclass under
    `from __future__ import annotations` does not take them for fields).

    Example:
        >>> from dataclasses import dataclass
        >>> from typing import ClassVar
        >>> @dataclass(frozen=True)
        ... class DemoConfig(BenchConfig):
        ...     steps: int = 100
        ...     seeds: int = 3
        ...     QUICK: ClassVar = {"steps": 10}
        ...     PRESETS: ClassVar = {"smoke": {"seeds": 1}}
        >>> DemoConfig.quick(), DemoConfig.preset("smoke")
        (DemoConfig(steps=10, seeds=3), DemoConfig(steps=10, seeds=1))
    """

    __slots__ = ()

    QUICK: ClassVar[Mapping[str, Any]] = {}
    """The settings of `--quick` over the defaults."""
    PRESETS: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    """The settings of the `quick` and `smoke` presets, each over the one before it."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        unknown = [name for name in cls.PRESETS if name not in _PRESET_CHAIN]
        if unknown:
            raise TypeError(
                f"{cls.__name__}.PRESETS names {unknown}; it holds settings of "
                f"{' and '.join(_PRESET_CHAIN)} only (full is the defaults)"
            )

    @classmethod
    def quick(cls) -> Self:
        """The `--quick` preset: the defaults with the settings of `QUICK`."""
        config: Self = _with_settings(cls(), cls.QUICK)
        return config

    @classmethod
    def preset(cls, preset: Preset) -> Self:
        """The sizes `frugal reproduce` runs at `preset` (`full`: the defaults).

        Raises:
            ValueError: If `preset` is not one of `PRESETS`' names.
        """
        if preset not in PRESETS:
            raise ValueError(f"preset={preset!r}; choose one of {', '.join(PRESETS)}")
        if preset == "full":
            return cls()
        config = cls.quick()
        for step in _PRESET_CHAIN[: _PRESET_CHAIN.index(preset) + 1]:
            config = _with_settings(config, cls.PRESETS.get(step, {}))
        return config


def _with_settings(config: Any, settings: Mapping[str, Any]) -> Any:
    """`config` with `settings` (a mapping over a nested Config field updates it field by field)."""
    changes = {
        key: _with_settings(getattr(config, key), value)
        if isinstance(value, Mapping) and dataclasses.is_dataclass(getattr(config, key))
        else value
        for key, value in settings.items()
    }
    return dataclasses.replace(config, **changes)


# --- typed summaries -----------------------------------------------------------------------


class Summary:
    """Base of every bench's summary: a frozen dataclass whose fields are `results.json` keys.

    Subclasses are `@dataclass(frozen=True, kw_only=True, slots=True)`. Fields hold JSON data
    (numbers, strings, bools, None, lists, string-keyed dicts) or nested frozen dataclasses
    (also `Summary` subclasses). A value a run may not measure is `X | None`, never a missing
    key.
    """

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        """The summary as JSON data: the `"summary"` of `results.json`, one key per field."""
        data: dict[str, Any] = dataclasses.asdict(self)  # type: ignore[call-overload]  # subclasses are dataclasses
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Read a summary back from JSON data (e.g. the `"summary"` of a `results.json`).

        Every field must be present (a missing key is an error even where the field may be
        None) and no other key may appear. Nested summaries are checked the same way. A float
        field read as null is NaN (`results.json` writes non-finite numbers as null).

        Args:
            data: The summary as `to_dict` wrote it.

        Returns:
            The summary.

        Raises:
            ValueError: If a key is missing or unknown; the message gives the dotted key, the
                summary class and its keys.
            TypeError: If a value has the wrong type.
        """
        value: Self = _parse(cls, data, cls.__name__)
        return value

    @classmethod
    def from_json(cls, text: str) -> Self:
        """`from_dict` of a JSON text.

        Raises:
            ValueError: If `text` is not JSON, or a key is missing or unknown.
            TypeError: If a value has the wrong type.
        """
        return cls.from_dict(json.loads(text))

    def to_json(self) -> str:
        """`to_dict` as JSON text (non-finite floats as null, as in `results.json`)."""
        from frugal.results import clean_json

        return json.dumps(clean_json(self.to_dict()))


def _parse(tp: Any, value: Any, where: str) -> Any:
    """`value` checked against (and built into) the type `tp`; `where` is its dotted key."""
    if tp is Any or tp is object:
        return value
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _parse(option, value, where)
            except (TypeError, ValueError) as exc:
                errors.append(exc)
        raise errors[0] if len(errors) == 1 else TypeError(f"{where}={value!r} is none of {tp}")
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise ValueError(f"{where}={value!r} must be one of {typing.get_args(tp)}")
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _parse_dataclass(tp, value, where)
    if origin is dict:
        if not isinstance(value, Mapping):
            raise TypeError(f"{where} must be an object, got {type(value).__name__}")
        _, item = typing.get_args(tp) or (str, Any)
        return {str(k): _parse(item, v, f"{where}.{k}") for k, v in value.items()}
    if origin is list or origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"{where} must be a list, got {type(value).__name__}")
        args = typing.get_args(tp)
        item = args[0] if args else Any
        items = [_parse(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if tp is float:
        if value is None:
            return float("nan")  # results.json writes NaN and inf as null
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{where}={value!r} must be a number")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{where}={value!r} must be an integer")
        return value
    if tp in (bool, str):
        if not isinstance(value, tp):
            raise TypeError(f"{where}={value!r} must be a {tp.__name__}")
        return value
    return value


def _parse_dataclass(cls: type[Any], value: Any, where: str) -> Any:
    if not isinstance(value, Mapping):
        raise TypeError(f"{where} must be an object ({cls.__name__}), got {type(value).__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    missing = [n for n in names if n not in value]
    unknown = [k for k in value if k not in names]
    if missing or unknown:
        problems = []
        if missing:
            problems.append(f"lacks {', '.join(f'{where}.{n}' for n in missing)}")
        if unknown:
            problems.append(f"has unknown {', '.join(f'{where}.{k}' for k in unknown)}")
        name = where if where == cls.__name__ else f"{where} ({cls.__name__})"
        raise ValueError(
            f"{name} {' and '.join(problems)}; its keys are "
            f"{', '.join(names)}. A results.json of another frugal version? Measure it again."
        )
    return cls(**{n: _parse(hints[n], value[n], f"{where}.{n}") for n in names})


@dataclass(frozen=True, kw_only=True, slots=True)
class BenchResult(Generic[S_co]):
    """What a bench returns: its typed summary, its rows and the document it wrote."""

    summary: S_co
    """The headline numbers, typed; `document["summary"]` is `summary.to_dict()`."""
    rows: list[dict[str, Any]]
    """One row per measured cell (`document["rows"]`)."""
    document: dict[str, Any]
    """The `results.json` content (ARCHITECTURE.md format)."""


def write_bench_results(
    benchmark: str,
    config: object,
    rows: list[dict[str, Any]],
    summary: S,
    path: Path | None,
) -> BenchResult[S]:
    """Assemble the `results.json` document of a bench, write it to `path`, return the result.

    Args:
        benchmark: The document's `"benchmark"` name.
        config: The bench's resolved Config dataclass.
        rows: One row per measured cell.
        summary: The bench's typed summary.
        path: Where to write `results.json`; None to only build the result.

    Returns:
        The summary, the rows and the document.

    Raises:
        TypeError: If `config` is not a Config dataclass.
        OSError: If the file cannot be written.
    """
    from frugal.results import results_document, write_results

    document = results_document(benchmark, config, rows, summary.to_dict())
    if path is not None:
        write_results(path, document)
    return BenchResult(summary=summary, rows=document["rows"], document=document)


def load_bench_result(path: Path, summary_type: type[S]) -> BenchResult[S]:
    """Read a bench's `results.json` back, its summary parsed by `summary_type.from_dict`.

    Raises:
        OSError: If the file cannot be read.
        ValueError: If it is not JSON, lacks rows or a summary, or the summary has a missing or
            unknown key (the message names `path`).
        TypeError: If a summary value has the wrong type.
    """
    document = json.loads(path.read_text())
    if not isinstance(document, dict) or not isinstance(document.get("rows"), list):
        raise ValueError(f"{path} is not a results.json with rows")
    if not isinstance(document.get("summary"), dict):
        raise ValueError(f"{path} has no summary object")
    try:
        summary = summary_type.from_dict(document["summary"])
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{path}: {exc}") from exc
    return BenchResult(summary=summary, rows=document["rows"], document=document)


class Bench(Protocol[C, S_co]):
    """How `frugal reproduce` drives one area's bench (each bench module defines one)."""

    @property
    def name(self) -> str:
        """The area (`"store"`, `"tgraph"`, ...)."""
        ...

    @property
    def summary_type(self) -> type[S_co]:
        """The bench's Summary class (reads its `results.json` back)."""
        ...

    def preset(self, preset: Preset) -> C:
        """The bench's Config at the sizes of `preset`."""
        ...

    def run(
        self, config: C, out_dir: Path, *, progress: Progress | None = None
    ) -> BenchResult[S_co]:
        """Run every cell of `config`, write `out_dir/results.json`, return the result."""
        ...


class BenchRun(Protocol[C_contra, S_co]):
    """A bench's run function (`run_store_bench`, ...): runs every cell of a Config."""

    def __call__(
        self, config: C_contra, out_dir: Path, *, progress: Progress | None = None
    ) -> BenchResult[S_co]:
        """Run every cell of `config`, write `out_dir/results.json`, return the result."""
        ...


@dataclass(frozen=True, kw_only=True, slots=True)
class BenchSpec(Generic[C, S]):
    """A `Bench` made of its parts: each bench module declares one (`STORE_BENCH`, ...)."""

    name: str
    """The area (`"store"`, `"tgraph"`, ...)."""
    summary_type: type[S]
    """The bench's Summary class (reads its `results.json` back)."""
    preset: Callable[[Preset], C]
    """The bench's Config at the sizes of a preset (the Config's `preset` classmethod)."""
    run: BenchRun[C, S]
    """Runs every cell of a Config, writes `out_dir/results.json` and returns the result."""


# --- child-process cells -------------------------------------------------------------------

CellStatus = Literal["ok", "error", "timeout"]


@dataclass(frozen=True, kw_only=True, slots=True)
class CellOutcome(Generic[T]):
    """How one child-process cell ended.

    The one failure rule of `run_cell`: `"ok"` when the child returned a value and exited with
    code 0; `"error"` when the target raised (`error` is `Type: message`, `traceback` the
    child's), the child died before answering, or it exited non-zero after answering;
    `"timeout"` when no answer came within the limit (the child is killed).
    """

    status: CellStatus
    value: T | None
    """The target's return value (kept even when a non-zero exit made the status "error")."""
    error: str | None = None
    """One line saying what failed; None when ok."""
    traceback: str | None = None
    """The child's traceback when the target raised."""

    def unwrap(self, what: str) -> T:
        """The value of an ok cell; else raise.

        Args:
            what: Names the cell in the error (`"run sp_hospital/tgn/seed 0"`).

        Raises:
            FrugalError: If the cell's status is not "ok".
        """
        if self.status != "ok" or self.value is None:
            detail = f"\n{self.traceback}" if self.traceback else ""
            raise FrugalError(f"{what} failed ({self.status}): {self.error}{detail}")
        return self.value


_JOIN_S = 30.0
_GRACE_S = 10.0  # an interrupted cell's time to unwind before SIGKILL


def _child_main(
    target: Callable[[Any], Any],
    arg: Any,
    setup: Callable[[], object] | None,
    connection: Any,
    parent_pid: int,
) -> None:
    # A cell never outlives its bench: kill -9 of the bench kills it (and, through their own
    # parent-death signals, the launchers it runs and their workers).
    die_with_parent(signal.SIGKILL, parent_pid)
    # Started with SIGINT blocked (see `_sigint_blocked`); from here on Ctrl-C and SIGTERM
    # unwind the cell as KeyboardInterrupt, so the launchers it runs stop their workers.
    signal.signal(signal.SIGINT, _raise_interrupt)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        if hasattr(signal, "pthread_sigmask"):  # a Ctrl-C that came while importing: now
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        if setup is not None:
            setup()
        message: tuple[str, Any, str | None] = ("ok", target(arg), None)
    except BaseException as exc:  # reported as the cell's error; the bench goes on
        message = ("error", f"{type(exc).__name__}: {exc}", traceback.format_exc())
    with contextlib.suppress(OSError):  # the parent may have gone (it was interrupted)
        connection.send(message)
        connection.close()


def _raise_interrupt(signum: int, frame: object) -> None:
    # One-shot: Ctrl-C reaches the child, then the parent's SIGTERM follows; the second must not
    # interrupt the first one's unwinding (and print a traceback). A Python no-op, not SIG_IGN:
    # a signal already pending when SIG_IGN is set raises "ignored due to race condition".
    signal.signal(signal.SIGINT, _ignore_signal)
    signal.signal(signal.SIGTERM, _ignore_signal)
    raise KeyboardInterrupt


def _ignore_signal(signum: int, frame: object) -> None:
    return None


@contextlib.contextmanager
def _sigint_blocked() -> Iterator[None]:
    """Block SIGINT in this thread while a child process starts; the child inherits the mask.

    Ctrl-C signals the whole foreground process group. A spawned child that is still importing
    would print a `KeyboardInterrupt` traceback; blocked, the signal waits in the child until
    `_child_main` unblocks it inside its `try` (reported as the cell's error, no traceback),
    and in the parent until this block ends, where it raises as usual. Nothing is lost (an
    ignored signal would be). Where `pthread_sigmask` is missing nothing changes.

    multiprocessing's resource tracker is started first: its own start blocks SIGINT and then
    *unblocks* it (`SIG_UNBLOCK`, not a restore), so started inside this block it would undo
    the block and the first cell child of a process would start with SIGINT deliverable.
    """
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def process_pool(max_workers: int) -> concurrent.futures.ProcessPoolExecutor:
    """A pool of `max_workers` fresh (spawned) processes that die with this one.

    A plain pool's workers outlive a `kill -9` of their parent: they wait on its call queue
    forever (and hold its output pipes open). These are killed by the kernel when the process
    that created them exits (Linux parent-death signal; elsewhere a plain pool).

    Raises:
        ValueError: If `max_workers` < 1.
    """
    if max_workers < 1:
        raise ValueError(f"max_workers={max_workers} must be >= 1")
    return concurrent.futures.ProcessPoolExecutor(
        max_workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=die_with_parent,
        initargs=(signal.SIGKILL, os.getpid()),
    )


def run_cell(
    target: Callable[[A], T],
    arg: A,
    *,
    timeout_s: float,
    setup: Callable[[], object] | None = None,
) -> CellOutcome[T]:
    """Run `target(arg)` in a fresh (spawned) child process; kill it after `timeout_s`.

    A fresh process gives each cell its own peak RSS, allocator state and threads. `target`,
    `arg` and `setup` must pickle (module-level functions, plain data).

    Args:
        target: The cell; its return value must pickle.
        arg: Its argument.
        timeout_s: Wall-clock limit for the answer, > 0.
        setup: Called first in the child (e.g. allocator settings).

    Returns:
        The outcome under the failure rule of `CellOutcome`.

    Raises:
        ValueError: If `timeout_s` is not > 0.
    """
    if not timeout_s > 0:
        raise ValueError(f"timeout_s={timeout_s} must be > 0 seconds")
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(
        target=_child_main, args=(target, arg, setup, sender, os.getpid()), daemon=True
    )
    answered = False
    status: CellStatus = "error"
    value: Any = None
    error: str | None = None
    trace: str | None = None
    try:
        try:
            with _sigint_blocked():  # the child starts with SIGINT blocked (no import traceback)
                process.start()
        finally:
            sender.close()
        if receiver.poll(timeout_s):
            status, payload, trace = receiver.recv()
            answered = True
            if status == "ok":
                value = payload
            else:
                error = payload
        else:
            status, error = "timeout", f"over {timeout_s:g} s; killed"
            process.kill()
    except EOFError:
        status = "error"
    except BaseException:  # Ctrl-C or SIGTERM in the parent: stop the cell, then unwind
        if process.pid is not None:  # started (the interrupt may come during start)
            process.terminate()  # the child unwinds (its launchers clean up) or is killed below
            process.join(timeout=_GRACE_S)
        raise
    finally:
        if process.pid is not None:
            process.join(timeout=_JOIN_S)
            if process.is_alive():
                process.kill()
                process.join(timeout=10)
        receiver.close()
    if not answered and status == "error":
        error = f"the child process died (exit code {process.exitcode})"
    elif status == "ok" and process.exitcode not in (0, None):
        status, error = "error", f"the child process exited with code {process.exitcode}"
    return CellOutcome(status=status, value=value, error=error, traceback=trace)


# --- medians -------------------------------------------------------------------------------


def median(values: Iterable[float]) -> float:
    """The median (the mean of the two middle values for an even count).

    Raises:
        ValueError: If `values` is empty.
    """
    data = list(values)
    if not data:
        raise ValueError("median of no values; the bench measured nothing")
    return float(statistics.median(data))


def median_after_warmup(values: Sequence[float], warmup: int) -> float:
    """The median of `values` after the first `warmup` (of all of them if none would be left).

    Args:
        values: Timings in measurement order (e.g. seconds per step).
        warmup: Leading values excluded, >= 0.

    Raises:
        ValueError: If `values` is empty or `warmup` < 0.
    """
    if warmup < 0:
        raise ValueError(f"warmup={warmup} must be >= 0")
    return median(values[warmup:] if len(values) > warmup else values)


def median_item(items: Sequence[T], key: Callable[[T], float]) -> T:
    """The middle item of `items` ordered by `key` (the upper middle for an even count).

    Picks one whole measurement (e.g. the repeat whose samples/s is the median) rather than
    averaging two.

    Raises:
        ValueError: If `items` is empty.
    """
    if not items:
        raise ValueError("median_item of no items")
    return sorted(items, key=key)[len(items) // 2]
