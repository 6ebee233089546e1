"""The `ml_NAME` files that Benchtemp, TGN and DyGLib read, written and read back strictly.

- `ml_NAME.csv`: columns `u,i,ts,label,idx`, time-sorted; node ids 1-based (0 = padding);
  `idx` is the 1-based event id; `label` the source's dynamic state (0 if none).
- `ml_NAME.npy`: edge features, float32 (E+1, D), row 0 zeros.
- `ml_NAME_node.npy`: node features, float32 (N+1, D_n), row 0 zeros.
- `ml_NAME_node_label.csv` (frugal's addition, only for data with static node classes):
  `node,label,class` with the 1-based node id, the class code and its name.

Benchtemp's files carry an extra unnamed index column first; the reader accepts it and the
writer never writes it. Shape legend: E events, N nodes, D edge-feature width.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from frugal.data.cache import atomic_write
from frugal.data.events import TemporalEvents

__all__ = ["DEFAULT_FEATURE_DIM", "read_ml", "write_ml"]

DEFAULT_FEATURE_DIM = 172
"""Width of the all-zero features written when a graph has none (Benchtemp's/TGN's choice)."""

_COLUMNS = ["u", "i", "ts", "label", "idx"]


def _save_npy(path: Path, array: np.ndarray[Any, Any]) -> None:
    def write(tmp: Path) -> None:
        with tmp.open("wb") as fh:
            np.save(fh, array)

    atomic_write(path, write)


def write_ml(
    events: TemporalEvents,
    name: str,
    out_dir: str | Path,
    *,
    feature_dim: int = DEFAULT_FEATURE_DIM,
) -> list[Path]:
    """Write events as `ml_NAME.csv`, `ml_NAME.npy` and `ml_NAME_node.npy` (+ node labels).

    Args:
        events: The events to write.
        name: The NAME in the file names.
        out_dir: Folder to write into (created if needed).
        feature_dim: Width of the zero node features, and of the zero edge features when the
            events have no `msg`.

    Returns:
        The paths written.

    Raises:
        ValueError: If `feature_dim` < 1 or `name` contains a path separator.
        OSError: If a file cannot be written (each file is written atomically).

    Shapes:
        ml_NAME.npy: (E+1, D); ml_NAME_node.npy: (N+1, feature_dim).
    """
    if feature_dim < 1:
        raise ValueError(f"feature_dim={feature_dim} must be >= 1 (Benchtemp uses 172)")
    if not name or "/" in name or "\\" in name:
        raise ValueError(f"name={name!r} must be a plain file-name part such as 'collegemsg'")
    out = Path(out_dir)
    label = events.label if events.label is not None else np.zeros(events.num_events, np.int64)
    frame = pd.DataFrame(
        {
            "u": events.src + 1,
            "i": events.dst + 1,
            "ts": events.t,
            "label": label,
            "idx": np.arange(1, events.num_events + 1, dtype=np.int64),
        }
    )
    msg = events.msg
    if msg is None:
        msg = np.zeros((events.num_events, feature_dim), np.float32)
    edge_features = np.concatenate([np.zeros((1, msg.shape[1]), np.float32), msg])
    node_features = np.zeros((events.num_nodes + 1, feature_dim), np.float32)

    written = [out / f"ml_{name}.csv", out / f"ml_{name}.npy", out / f"ml_{name}_node.npy"]
    atomic_write(written[0], lambda tmp: frame.to_csv(tmp, index=False))
    _save_npy(written[1], edge_features.astype(np.float32))
    _save_npy(written[2], node_features)
    if events.node_label is not None:
        names = np.array((*events.label_names, ""), dtype=object)  # -1 (unknown) -> ""
        labels = pd.DataFrame(
            {
                "node": np.arange(1, events.num_nodes + 1),
                "label": events.node_label,
                "class": names[events.node_label],
            }
        )
        written.append(out / f"ml_{name}_node_label.csv")
        atomic_write(written[-1], lambda tmp: labels.to_csv(tmp, index=False))
    return written


def read_ml(name: str, directory: str | Path, *, time_unit: str = "s") -> TemporalEvents:
    """Read `ml_NAME.csv` (+ `ml_NAME.npy`) back into 0-based `TemporalEvents`, strictly.

    Args:
        name: The NAME in the file names.
        directory: Folder holding the files.
        time_unit: Unit of `ts`.

    Returns:
        The events: `src = u - 1`, `dst = i - 1`, `t = ts`, `label`, `msg` from `ml_NAME.npy`
        (row 0 dropped) when that file exists and is not all zeros, and node classes from
        `ml_NAME_node_label.csv` when it exists.

    Raises:
        FileNotFoundError: If `ml_NAME.csv` is missing.
        ValueError: If a column is missing, a value is not a finite number, ids are < 1,
            timestamps decrease, `idx` is not 1..E, or the feature rows do not match the
            events; the message names the file, the row and the constraint.
    """
    folder = Path(directory)
    csv_path = folder / f"ml_{name}.csv"
    try:
        frame = pd.read_csv(csv_path, dtype=str)
    except pd.errors.EmptyDataError as exc:
        raise ValueError(
            f"{csv_path}: empty file; an ml file needs a header u,i,ts,label,idx"
        ) from exc
    unnamed = [c for c in frame.columns if str(c).startswith("Unnamed")]
    frame = frame.drop(columns=unnamed)
    missing = [c for c in _COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(
            f"{csv_path}: missing column(s) {missing}; an ml file needs {','.join(_COLUMNS)}"
        )
    arrays: dict[str, npt.NDArray[np.int64]] = {}
    for column in _COLUMNS:
        text = frame[column].fillna("").str.strip()
        # Integers, optionally written as floats with a zero fraction ("3.0"), within int64.
        ok = text.str.fullmatch(r"[+-]?\d{1,18}(\.0*)?")
        if not ok.all():
            row = int(np.flatnonzero(~ok.to_numpy())[0])
            raise ValueError(
                f"{csv_path}: row {row + 1}, column {column} = {frame[column].iloc[row]!r} is not "
                "an integer of at most 18 digits"
            )
        arrays[column] = np.asarray(text.str.split(".").str[0].to_numpy(), dtype=np.int64)
    num_events = len(frame)
    for column in ("u", "i"):
        if num_events and arrays[column].min() < 1:
            row = int(np.argmin(arrays[column]))
            raise ValueError(
                f"{csv_path}: row {row + 1}, {column} = {arrays[column][row]} < 1; ml node ids "
                "are 1-based (0 is padding)"
            )
    decreasing = np.flatnonzero(arrays["ts"][1:] < arrays["ts"][:-1])
    if len(decreasing):
        row = int(decreasing[0]) + 1
        raise ValueError(
            f"{csv_path}: row {row + 1}, ts = {arrays['ts'][row]} is earlier than the previous "
            f"row's {arrays['ts'][row - 1]}; ml files must be sorted by ts"
        )
    if not np.array_equal(arrays["idx"], np.arange(1, num_events + 1)):
        row = int(np.flatnonzero(arrays["idx"] != np.arange(1, num_events + 1))[0])
        raise ValueError(
            f"{csv_path}: row {row + 1}, idx = {arrays['idx'][row]}, expected {row + 1}; idx "
            "must number the events 1..E in file order"
        )
    msg = None
    npy_path = folder / f"ml_{name}.npy"
    if npy_path.exists():
        try:
            features = np.load(npy_path, allow_pickle=False)
        except ValueError as exc:
            raise ValueError(f"{npy_path}: not a numeric .npy array ({exc})") from exc
        if features.ndim != 2 or len(features) != num_events + 1:
            raise ValueError(
                f"{npy_path}: shape {features.shape} does not match {num_events} events; edge "
                f"features need shape (E+1, D) = ({num_events + 1}, D) with row 0 zeros"
            )
        if not np.issubdtype(features.dtype, np.floating):
            raise ValueError(f"{npy_path}: dtype {features.dtype}; features must be floats")
        if not np.isfinite(features).all():
            row = int(np.flatnonzero(~np.isfinite(features).all(axis=1))[0])
            raise ValueError(f"{npy_path}: row {row} holds NaN or inf; features must be finite")
        if features[0].any():
            raise ValueError(f"{npy_path}: row 0 is not zeros; it is the padding row of edge 0")
        if features[1:].any():
            msg = features[1:].astype(np.float32)
    num_nodes = int(max(arrays["u"].max(initial=0), arrays["i"].max(initial=0)))
    node_path = folder / f"ml_{name}_node.npy"
    if node_path.exists():
        node_rows = np.load(node_path, mmap_mode="r").shape[0]
        if node_rows < num_nodes + 1:
            raise ValueError(
                f"{node_path}: {node_rows} rows but node ids reach {num_nodes}; node features "
                f"need at least {num_nodes + 1} rows (row 0 = padding)"
            )
        num_nodes = node_rows - 1
    node_label = None
    label_names: tuple[str, ...] = ()
    label_path = folder / f"ml_{name}_node_label.csv"
    if label_path.exists():
        labels = pd.read_csv(label_path, keep_default_na=False)
        if list(labels.columns) != ["node", "label", "class"] or not np.array_equal(
            labels["node"].to_numpy(), np.arange(1, num_nodes + 1)
        ):
            raise ValueError(
                f"{label_path}: needs columns node,label,class with one row per node 1..{num_nodes}"
            )
        codes = labels["label"].to_numpy(np.int64)
        names = labels.loc[codes >= 0].drop_duplicates("label").sort_values("label")
        if not np.array_equal(names["label"].to_numpy(), np.arange(len(names))):
            raise ValueError(f"{label_path}: class codes must be 0..C-1 (or -1 for unknown)")
        node_label, label_names = codes, tuple(str(c) for c in names["class"])
    return TemporalEvents(
        src=arrays["u"] - 1,
        dst=arrays["i"] - 1,
        t=arrays["ts"],
        num_nodes=num_nodes,
        time_unit=time_unit,
        msg=msg,
        label=arrays["label"],
        node_label=node_label,
        label_names=label_names,
    )
