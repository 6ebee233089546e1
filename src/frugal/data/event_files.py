"""Your own temporal graph: a CSV file of events read as `TemporalEvents`, with its digest.

A dataset value is a file path, not a bundled id, when it contains a path separator or ends
in `.csv` (`is_event_file`; no bundled id does either). Two layouts, told apart by the name:

- `ml_NAME.csv`: the `u,i,ts,label,idx` files of Jodie/TGN/Benchtemp/DyGLib, read by
  `frugal.data.ml_format.read_ml` with the `ml_NAME.npy` edge features, `ml_NAME_node.npy`
  and `ml_NAME_node_label.csv` beside it when present. Node ids are kept (minus the format's
  1-based offset) and the rows must be sorted by `ts`, as the format requires.
- any other `.csv`: a header `src,dst,t`, then optionally `label`, then any further columns,
  which are numeric edge features (float32, in column order; `TemporalEvents.msg`). `src`
  and `dst` are integer node ids >= 0, re-indexed densely in order of first appearance as
  the bundled datasets are (`factorize_nodes`; the file's id of each dense id is in
  `node_ids`). `t` is an integer timestamp in any unit; negative times are accepted (models
  see only time differences). Rows may come in any time order: they are sorted stably by
  `t` (rows of one timestamp keep their file order) and `EventFile.resorted` says so.
  `label` is the source's 0/1 state after the event.

`EventFile.sha256` hashes the bytes of every file read, so results name the exact data: the
file's own SHA-256 when it is read alone, else the SHA-256 of the `NAME SHA256` lines of
its files. Shape legend: E events, D edge-feature width.
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
import pandas as pd

from frugal.config import ConfigError
from frugal.data.events import TemporalEvents
from frugal.data.loaders import _events_from_frame
from frugal.data.ml_format import read_ml

__all__ = ["CSV_COLUMNS", "EventFile", "is_event_file", "read_event_file"]

CSV_COLUMNS = ("src", "dst", "t")
"""The columns every plain events CSV has; `label` and edge-feature columns may follow."""

_ML_NAME = re.compile(r"ml_(.+)\.csv", flags=re.IGNORECASE)
_INTEGER = r"[+-]?\d{1,19}(\.0*)?"  # an integer, optionally written "3.0" (as read_ml takes it)
_LAYOUT_HELP = "an events CSV needs a header src,dst,t[,label][,feature columns...]"


def is_event_file(dataset: str) -> bool:
    """Whether `dataset` is the path of a user's events file rather than a bundled id.

    The rule: it contains a path separator (`/`, or the OS's own) or ends in `.csv` (any case).
    """
    separators = {"/", os.sep} | ({os.altsep} if os.altsep else set())
    return any(s in dataset for s in separators) or dataset.lower().endswith(".csv")


@dataclass(frozen=True, eq=False)
class EventFile:
    """A user's events file, read and hashed.

    Attributes:
        path: The CSV file, absolute.
        layout: "ml" (`ml_NAME.csv` and its `.npy` files) or "csv" (`src,dst,t,...`).
        files: Every file read, the CSV first.
        sha256: Hex SHA-256 of the CSV's bytes when it is the only file, else of the lines
            `NAME SHA256` of every file read (so a changed feature file changes it too).
        events: The events.
        resorted: Whether the file's rows were not in time order and were sorted stably by t.
    """

    path: Path
    layout: Literal["ml", "csv"]
    files: tuple[Path, ...]
    sha256: str
    events: TemporalEvents
    resorted: bool

    @property
    def key(self) -> str:
        """The dataset name in results: `FILENAME@` and the first 16 hex digits of `sha256`.

        Two files of one name but other content get other keys, so their results never mix.
        """
        return f"{self.path.name}@{self.sha256[:16]}"

    def describe(self) -> dict[str, object]:
        """JSON-ready provenance: path, layout, digest, event count and whether it was sorted."""
        return {
            "dataset_path": str(self.path),
            "dataset_layout": self.layout,
            "dataset_sha256": self.sha256,
            "dataset_num_events": self.events.num_events,
            "dataset_resorted_by_t": self.resorted,
        }


def read_event_file(path: str | Path) -> EventFile:
    """Read and hash a user's events file (layouts in the module docstring).

    Args:
        path: An `ml_NAME.csv`, or a CSV with the header `src,dst,t[,label][,features...]`.

    Returns:
        The events with the file's digest; plain CSV events have `label` when the file has
        that column and `msg` (float32, (E, D)) when it has D feature columns.

    Raises:
        ConfigError: If the file is missing or unreadable, is empty or holds no events, lacks
            a column, or a value breaks its rule (`t` not a finite integer, a node id not an
            integer >= 0, a label not 0 or 1, a feature not a finite number); the message
            names the file, the line (header = line 1), the column, the value and the fix.
            `ml_` files raise `read_ml`'s errors, which name the data row.
    """
    csv_path = Path(path).expanduser().absolute()
    ml_name = _ML_NAME.fullmatch(csv_path.name)
    if csv_path.suffix.lower() != ".csv":
        raise ConfigError(
            f"{path}: an events file is a .csv ({_LAYOUT_HELP}, or an ml_NAME.csv); convert "
            "it to CSV, or give a bundled dataset id (see `frugal data list`)"
        )
    data = _read_bytes(csv_path)
    if ml_name is None:
        events, resorted = _parse_csv(csv_path, data)
        return EventFile(
            path=csv_path,
            layout="csv",
            files=(csv_path,),
            sha256=hashlib.sha256(data).hexdigest(),
            events=events,
            resorted=resorted,
        )
    name = ml_name.group(1)
    folder = csv_path.parent
    sidecars = [f"ml_{name}.npy", f"ml_{name}_node.npy", f"ml_{name}_node_label.csv"]
    files = (csv_path, *(folder / s for s in sidecars if (folder / s).is_file()))
    digests = [hashlib.sha256(data).hexdigest()]
    digests += [hashlib.sha256(_read_bytes(f)).hexdigest() for f in files[1:]]
    sha256 = digests[0]
    if len(files) > 1:
        listing = "".join(f"{f.name} {d}\n" for f, d in zip(files, digests, strict=True))
        sha256 = hashlib.sha256(listing.encode()).hexdigest()
    try:
        events = read_ml(name, folder)
    except ValueError as exc:
        raise ConfigError(
            f"{exc} (a file named ml_NAME.csv is read in the ml layout u,i,ts,label,idx; rename "
            f"it if it is a plain CSV: {_LAYOUT_HELP})"
        ) from None
    return EventFile(
        path=csv_path, layout="ml", files=files, sha256=sha256, events=events, resorted=False
    )


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: no such file; give the path of your events CSV ({_LAYOUT_HELP}) or a "
            "bundled dataset id (see `frugal data list`)"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror})") from None


def _parse_csv(path: Path, data: bytes) -> tuple[TemporalEvents, bool]:
    """Events of a plain CSV (stably sorted by t, ids factorised) and whether rows moved."""
    try:
        frame = pd.read_csv(
            io.BytesIO(data),
            dtype=str,
            keep_default_na=False,  # every cell stays text: "nan" is checked like "x"
            skip_blank_lines=False,  # so that row k is line k + 2
            encoding="utf-8-sig",
        )
    except pd.errors.EmptyDataError:
        raise ConfigError(f"{path}: empty file; {_LAYOUT_HELP} and one event a line") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not a readable CSV ({exc}); {_LAYOUT_HELP}") from None
    header = next(iter(io.TextIOWrapper(io.BytesIO(data), encoding="utf-8-sig")), "")
    names = [name.strip() for name in next(csv.reader([header]), [])]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigError(
            f"{path}: line 1: column(s) {','.join(twice)} appear more than once in the header "
            f"{','.join(names)!r}; give every column its own name ({_LAYOUT_HELP})"
        )
    frame.columns = [str(c).strip() for c in frame.columns]
    missing = [c for c in CSV_COLUMNS if c not in frame.columns]
    if missing:
        raise ConfigError(
            f"{path}: line 1: missing column(s) {','.join(missing)} in the header "
            f"{','.join(frame.columns)!r}; {_LAYOUT_HELP}"
        )
    text = frame.fillna("").apply(lambda column: column.str.strip())
    lines = np.arange(len(frame), dtype=np.int64) + 2
    filled = (text != "").any(axis=1).to_numpy()
    text, lines = text[filled], lines[filled]  # blank lines
    if not len(text):
        raise ConfigError(f"{path}: a header but no events; add one line src,dst,t per event")
    src = _integers(path, text, lines, "src", "a node id must be an integer >= 0")
    dst = _integers(path, text, lines, "dst", "a node id must be an integer >= 0")
    for name, ids in (("src", src), ("dst", dst)):
        if ids.min() < 0:
            row = int(np.argmin(ids))
            raise ConfigError(
                f"{path}: line {lines[row]}: {name} = {ids[row]} is negative; node ids must be "
                "integers >= 0 (shift or re-number them)"
            )
    t = _integers(
        path, text, lines, "t", "times must be finite integers (any unit; scale fractional "
        "times to integers, e.g. milliseconds)",
    )  # fmt: skip
    label = None
    if "label" in text.columns:
        label = _integers(path, text, lines, "label", "a label must be 0 or 1")
        if ((label != 0) & (label != 1)).any():
            row = int(np.flatnonzero((label != 0) & (label != 1))[0])
            raise ConfigError(
                f"{path}: line {lines[row]}: label = {label[row]} is not 0 or 1; the label "
                "column holds the source's 0/1 state after the event (drop it if you have none)"
            )
    features = [c for c in text.columns if c not in (*CSV_COLUMNS, "label")]
    msg = None
    if features:
        msg = np.empty((len(text), len(features)), np.float32)
        for k, column in enumerate(features):
            values = pd.to_numeric(text[column], errors="coerce").to_numpy(np.float64)
            msg[:, k] = values
            bad = np.flatnonzero(~np.isfinite(msg[:, k]))
            if len(bad):
                raise ConfigError(
                    f"{path}: line {lines[bad[0]]}: feature column {column!r} = "
                    f"{text[column].iloc[bad[0]]!r} is not a finite float32 number; edge "
                    "features must be finite numbers (fill or drop missing values; every "
                    f"column after {','.join(CSV_COLUMNS)}[,label] is a feature)"
                )
    resorted = bool((t[1:] < t[:-1]).any())
    events = _events_from_frame(
        pd.Series(src), pd.Series(dst), t, time_unit="s", msg=msg, label=label
    )
    return events, resorted


def _integers(
    path: Path, text: pd.DataFrame, lines: npt.NDArray[np.int64], column: str, rule: str
) -> npt.NDArray[np.int64]:
    """Column `column` as int64; raises ConfigError naming the first value that is not one."""
    values = text[column]
    ok = values.str.fullmatch(_INTEGER).to_numpy(bool)
    if not ok.all():
        row = int(np.flatnonzero(~ok)[0])
        raise ConfigError(
            f"{path}: line {lines[row]}: {column} = {values.iloc[row]!r} is not an integer; {rule}"
        )
    digits = values.str.split(".").str[0].to_numpy()
    try:
        return np.asarray(digits, dtype=np.int64)
    except OverflowError:
        limit = np.iinfo(np.int64)
        row = next(k for k, v in enumerate(digits) if not limit.min <= int(v) <= limit.max)
        raise ConfigError(
            f"{path}: line {lines[row]}: {column} = {values.iloc[row]!r} does not fit in a 64-bit "
            f"integer ([{limit.min}, {limit.max}]); "
            + ("re-number the ids" if column in ("src", "dst") else "rescale the times")
        ) from None
