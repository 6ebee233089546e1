"""Load bundled datasets: locate, verify the checksum, parse, cache, check the counts.

Temporal graphs load as `TemporalEvents` (stably sorted by t, node ids dense), knowledge graphs
as `KnowledgeGraph` (train/valid/test triples, ids in sorted name order), tables as
pandas DataFrames, text as a tuple of documents, model files as a verified path. The parsed
form is cached under `$FRUGAL_CACHE`, keyed by the source files' digests and the parser
version, so a second load reads one `.npz`/`.parquet`/`.json` file.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import re
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
import pandas as pd

from frugal.config import ConfigError
from frugal.data.cache import atomic_write, atomic_write_bytes, cache_root
from frugal.data.errors import DatasetStatsError
from frugal.data.events import TemporalEvents, factorize_nodes
from frugal.data.records import DatasetInfo, DatasetStats, FileFormat, get_dataset_info
from frugal.data.source import LocatedFile, locate_files, verify_files
from frugal.data.text_files import is_text_file, read_text_documents
from frugal.data.triples import KnowledgeGraph, read_triples_tsv

__all__ = [
    "DataConfig",
    "compute_stats",
    "dataset_path",
    "load_documents",
    "load_events",
    "load_table",
    "load_text",
    "load_triples",
    "verify_dataset",
]

T = TypeVar("T")

# Bump when a parser's output changes, so stale cache entries are not read.
PARSER_VERSION = 1
_SNAP_TIME_FORMAT = "%m/%d/%y %I:%M %p"
_FORTUNE_SEPARATOR = re.compile(r"^%\n", flags=re.MULTILINE)


@dataclass(frozen=True, kw_only=True, slots=True)
class DataConfig:
    """Where parsed datasets are cached and how often files are hashed."""

    cache_dir: str = ""
    """Cache folder; "" means `$FRUGAL_CACHE`, else `~/.cache/frugal`."""
    verify: Literal["first_use", "always"] = "first_use"
    """Hash source files on first use only (remembered by size and mtime), or on every load."""
    use_cache: bool = True
    """Read and write the parsed-data cache; False always parses the source files."""

    def __post_init__(self) -> None:
        if self.verify not in ("first_use", "always"):
            raise ValueError(f"verify={self.verify!r}; choose 'first_use' or 'always'")

    def root(self) -> Path:
        """Return the cache folder this config points at."""
        return Path(self.cache_dir).expanduser() if self.cache_dir else cache_root()


def _info(dataset: str | DatasetInfo, loader: str | None = None) -> DatasetInfo:
    """The record of `dataset`; with `loader`, one that has that form ("events", "path", ...).

    Raises:
        TypeError: If `dataset` is neither a name nor a `DatasetInfo`.
        ConfigError: If the name is unknown, or the dataset has no `loader` form.
    """
    if isinstance(dataset, DatasetInfo):
        info = dataset
    elif isinstance(dataset, str):
        info = get_dataset_info(dataset)
    else:
        raise TypeError(f"dataset must be a name or a DatasetInfo, got {type(dataset).__name__}")
    if loader is not None and loader not in info.loaders:
        raise ConfigError(
            f"dataset {info.name!r} is {info.kind} data and has no {loader} form; it loads "
            f"with: {', '.join('load_' + name for name in info.loaders)}"
        )
    return info


def _prepare(info: DatasetInfo, config: DataConfig) -> tuple[list[LocatedFile], str | None]:
    """Locate and verify the files; return them and the cache key (None = do not cache)."""
    if not isinstance(config, DataConfig):
        raise TypeError(f"config must be a DataConfig, got {type(config).__name__}")
    files = locate_files(info)
    verify_files(files, force=config.verify == "always", cache_dir=config.root())
    if not config.use_cache or not all(f.pinned for f in files):
        return files, None
    digest = hashlib.sha256("".join(f.expected.sha256 for f in files).encode()).hexdigest()
    return files, f"{info.name}-{digest[:16]}-p{PARSER_VERSION}"


def _load_cached(
    info: DatasetInfo,
    config: DataConfig | None,
    suffix: str,
    *,
    parse: Callable[[list[Path]], T],
    read: Callable[[Path], T],
    write: Callable[[Path, T], None],
    stats: Callable[[T], DatasetStats],
    names: tuple[str, ...],
) -> T:
    """Parse a dataset, or read its cache entry; a bad entry is discarded and rebuilt.

    A cache entry is trusted only if it reads back and reproduces the record's counts, so a
    truncated, overwritten or foreign file is parsed again instead of returned. `config`
    None means `DataConfig()`.
    """
    config = config or DataConfig()
    files, key = _prepare(info, config)
    cached = config.root() / "parsed" / f"{key}{suffix}" if key else None
    if cached is not None and cached.exists():
        try:
            value = read(cached)
            _check_stats(info, stats(value), names=names)
            return value
        except (
            OSError,
            ValueError,
            KeyError,
            EOFError,
            zipfile.BadZipFile,
            DatasetStatsError,
        ) as exc:
            warnings.warn(f"ignoring bad cache entry {cached} ({exc}); parsing again", stacklevel=3)
            with contextlib.suppress(OSError):
                cached.unlink()
    value = parse([f.path for f in files])
    if all(f.pinned for f in files):
        _check_stats(info, stats(value), names=names)
    if cached is not None:
        try:
            write(cached, value)
        except OSError as exc:  # a read-only or full cache costs a re-parse, nothing more
            warnings.warn(f"cannot write cache entry {cached}: {exc}", stacklevel=3)
    return value


# --- temporal events -----------------------------------------------------------------------


def _events_from_frame(
    src: pd.Series[Any],
    dst: pd.Series[Any],
    t: np.ndarray[Any, Any],
    *,
    time_unit: str,
    bipartite: bool = False,
    msg: np.ndarray[Any, Any] | None = None,
    extra_nodes: np.ndarray[Any, Any] | None = None,
    node_class: dict[Any, str] | None = None,
    label_names: tuple[str, ...] | None = None,
    label: np.ndarray[Any, Any] | None = None,
) -> TemporalEvents:
    """Stable-sort by t, factorise node ids, and attach per-node classes (and event labels)."""
    order = np.argsort(t, kind="stable")
    src_raw = src.to_numpy()[order]
    dst_raw = dst.to_numpy()[order]
    src_ids, dst_ids, node_ids, num_src_nodes = factorize_nodes(
        src_raw, dst_raw, bipartite=bipartite
    )
    if extra_nodes is not None:  # nodes that appear in no event keep ids after the others
        missing = extra_nodes[~np.isin(extra_nodes, node_ids)]
        node_ids = np.concatenate([node_ids, missing])
    num_nodes = len(node_ids)
    node_label = None
    names: tuple[str, ...] = ()
    if node_class is not None:
        names = label_names or tuple(sorted(set(node_class.values())))
        code = {name: i for i, name in enumerate(names)}
        node_label = np.array([code.get(node_class.get(n, ""), -1) for n in node_ids.tolist()])
        node_label = node_label.astype(np.int64)
    return TemporalEvents(
        src=src_ids,
        dst=dst_ids,
        t=np.asarray(t, dtype=np.int64)[order],
        num_nodes=num_nodes,
        time_unit=time_unit,
        msg=None if msg is None else msg[order],
        label=None if label is None else label[order],
        node_ids=node_ids,
        node_label=node_label,
        label_names=names,
        bipartite=bipartite,
        num_src_nodes=num_src_nodes if bipartite else num_nodes,
    )


def _parse_snap_csv(paths: list[Path], info: DatasetInfo) -> TemporalEvents:
    frame = pd.read_csv(paths[0], compression="gzip")
    stamps = pd.to_datetime(frame["Timestamp"], format=_SNAP_TIME_FORMAT)
    seconds = (stamps - pd.Timestamp("1970-01-01")) // pd.Timedelta(seconds=1)
    return _events_from_frame(
        frame["Source"], frame["Target"], seconds.to_numpy(np.int64), time_unit=info.time_unit
    )


def _parse_pubmed_csv(paths: list[Path], info: DatasetInfo) -> TemporalEvents:
    edges = pd.read_csv(paths[0], compression="gzip")
    nodes = pd.read_csv(paths[1], compression="gzip")
    classes = {int(k): str(v) for k, v in zip(nodes["id"], nodes["label"], strict=True)}
    names = tuple(str(v) for v in sorted(nodes["label"].unique()))
    return _events_from_frame(
        edges["source"],
        edges["target"],
        edges["time"].to_numpy(np.int64),
        time_unit=info.time_unit,
        extra_nodes=nodes["id"].to_numpy(np.int64),
        node_class=classes,
        label_names=names,
    )


def _parse_sociopatterns_tsv(paths: list[Path], info: DatasetInfo) -> TemporalEvents:
    frame = pd.read_csv(
        paths[0], sep="\t", header=None, names=["t", "n1", "n2", "class1", "class2"]
    )
    pairs = pd.concat(
        [
            frame[["n1", "class1"]].set_axis(["node", "class"], axis=1),
            frame[["n2", "class2"]].set_axis(["node", "class"], axis=1),
        ]
    ).drop_duplicates()
    if not pairs["node"].is_unique:
        node = pairs["node"][pairs["node"].duplicated()].iloc[0]
        raise DatasetStatsError(f"{paths[0]}: node {node} has more than one class")
    classes = dict(zip(pairs["node"].tolist(), pairs["class"].astype(str).tolist(), strict=True))
    return _events_from_frame(
        frame["n1"],
        frame["n2"],
        frame["t"].to_numpy(np.int64),
        time_unit=info.time_unit,
        node_class=classes,
    )


def _parse_movielens_events(paths: list[Path], info: DatasetInfo) -> TemporalEvents:
    ratings = pd.read_parquet(paths[0])
    return _events_from_frame(
        ratings["user_id"],
        ratings["movie_id"],
        ratings["timestamp"].to_numpy(np.int64),
        time_unit=info.time_unit,
        bipartite=True,
        msg=ratings["rating"].to_numpy(np.float32).reshape(-1, 1),
    )


_EVENT_PARSERS: dict[FileFormat, Callable[[list[Path], DatasetInfo], TemporalEvents]] = {
    "snap_csv": _parse_snap_csv,
    "pubmed_csv": _parse_pubmed_csv,
    "sociopatterns_tsv": _parse_sociopatterns_tsv,
    "movielens_parquet": _parse_movielens_events,
}

_OPTIONAL_ARRAYS = ("msg", "label", "node_ids", "node_label")


def _save_events(path: Path, events: TemporalEvents) -> None:
    """Write events as one uncompressed .npz (atomically)."""
    arrays: dict[str, np.ndarray[Any, Any]] = {
        "src": events.src,
        "dst": events.dst,
        "t": events.t,
        "label_names": np.array(events.label_names, dtype=str),
        "meta": np.array(
            [events.num_nodes, events.num_src_nodes, int(events.bipartite)], dtype=np.int64
        ),
        "time_unit": np.array(events.time_unit),
    }
    for name in _OPTIONAL_ARRAYS:
        value = getattr(events, name)
        if value is not None:
            arrays[name] = value

    def write(tmp: Path) -> None:
        with tmp.open("wb") as fh:
            np.savez(fh, **arrays)  # type: ignore[arg-type]  # numpy stubs reject **dict

    atomic_write(path, write)


def _read_events(path: Path) -> TemporalEvents:
    with np.load(path, allow_pickle=False) as npz:
        num_nodes, num_src_nodes, bipartite = (int(v) for v in npz["meta"])
        optional = {name: npz[name] if name in npz.files else None for name in _OPTIONAL_ARRAYS}
        return TemporalEvents(
            src=npz["src"],
            dst=npz["dst"],
            t=npz["t"],
            num_nodes=num_nodes,
            time_unit=str(npz["time_unit"]),
            label_names=tuple(str(n) for n in npz["label_names"]),
            bipartite=bool(bipartite),
            num_src_nodes=num_src_nodes,
            **optional,
        )


def load_events(dataset: str | DatasetInfo, config: DataConfig | None = None) -> TemporalEvents:
    """Load a temporal graph as time-sorted events with dense node ids.

    Events keep the file's order within one timestamp (stable sort). Node ids are dense,
    0-based, in order of first appearance (see `factorize_nodes`); nodes that appear in no
    event (PubMed) follow. Static node classes are in `node_label`/`label_names`.

    Args:
        dataset: A dataset id (e.g. "collegemsg") or its record, or the path of your own
            events file (`frugal.data.event_files`: a value with a path separator or ending
            in `.csv`; an `ml_NAME.csv`, or a CSV with the header `src,dst,t[,label][,...]`).
        config: Cache and verification settings; defaults to `DataConfig()` (unused for a
            file of your own, which is parsed on every call).

    Returns:
        The events.

    Raises:
        ConfigError: If the name is unknown or the dataset is not a temporal graph, or your
            file is missing or breaks a rule of its layout (the message names the line).
        DatasetMissingError: If its package is not installed (names the pip line).
        DatasetChecksumError: If a file does not match its pinned SHA-256.
        DatasetStatsError: If the parse does not reproduce the pinned counts.
    """
    if isinstance(dataset, str):
        # Imported here: event_files reads plain CSVs with this module's _events_from_frame.
        from frugal.data.event_files import is_event_file, read_event_file

        if is_event_file(dataset):
            return read_event_file(dataset).events
    info = _info(dataset, "events")
    return _load_cached(
        info,
        config,
        ".npz",
        parse=lambda paths: _EVENT_PARSERS[info.file_format](paths, info),
        read=_read_events,
        write=_save_events,
        stats=lambda events: compute_stats(info, events=events),
        names=_EVENT_STATS,
    )


# --- knowledge graphs ----------------------------------------------------------------------


def _parse_kg_tsv(paths: list[Path], info: DatasetInfo) -> KnowledgeGraph:
    by_split = {path.stem: path for path in paths}
    missing = {"train", "valid", "test"} - set(by_split)
    if missing:
        raise ValueError(f"dataset {info.name!r} lists no {sorted(missing)} file")
    return read_triples_tsv(by_split["train"], by_split["valid"], by_split["test"], name=info.name)


def _save_triples(path: Path, graph: KnowledgeGraph) -> None:
    def write(tmp: Path) -> None:
        with tmp.open("wb") as fh:
            np.savez(
                fh,
                train=graph.train,
                valid=graph.valid,
                test=graph.test,
                entity_names=np.array(graph.entity_names, dtype=str),
                relation_names=np.array(graph.relation_names, dtype=str),
                name=np.array(graph.name),
            )

    atomic_write(path, write)


def _read_triples(path: Path) -> KnowledgeGraph:
    with np.load(path, allow_pickle=False) as npz:
        return KnowledgeGraph(
            train=npz["train"],
            valid=npz["valid"],
            test=npz["test"],
            entity_names=tuple(str(n) for n in npz["entity_names"]),
            relation_names=tuple(str(n) for n in npz["relation_names"]),
            name=str(npz["name"]),
        )


def load_triples(dataset: str | DatasetInfo, config: DataConfig | None = None) -> KnowledgeGraph:
    """Load a knowledge graph (Kinships, UMLS, Nations) as train/valid/test id triples.

    Entities and relations are numbered in sorted name order over the three splits, as PyKEEN's
    `TriplesFactory` numbers them. Your own graph: `frugal.data.triples.read_triples_tsv`.

    Args:
        dataset: A dataset id (e.g. "umls") or its record.
        config: Cache and verification settings.

    Returns:
        The graph.

    Raises:
        ConfigError: If the name is unknown or the dataset is not a knowledge graph.
        DatasetMissingError: If its package is not installed (names the pip line).
        DatasetChecksumError: If a file does not match its pinned SHA-256.
        DatasetStatsError: If the entity, relation or triple counts differ from the record.
    """
    info = _info(dataset, "triples")
    return _load_cached(
        info,
        config,
        ".npz",
        parse=lambda paths: _parse_kg_tsv(paths, info),
        read=_read_triples,
        write=_save_triples,
        stats=lambda graph: compute_stats(info, graph=graph),
        names=_TRIPLE_STATS,
    )


# --- tables --------------------------------------------------------------------------------


def _parse_movielens_table(paths: list[Path]) -> pd.DataFrame:
    ratings = pd.read_parquet(paths[0])
    users = pd.read_parquet(paths[1])
    items = pd.read_parquet(paths[2])
    table = ratings.merge(users, on="user_id", how="left", validate="many_to_one")
    table = table.merge(items, on="movie_id", how="left", validate="many_to_one")
    return table.sort_values("timestamp", kind="stable").reset_index(drop=True)


def _parse_parquet(paths: list[Path]) -> pd.DataFrame:
    return pd.read_parquet(paths[0])


_TABLE_PARSERS: dict[FileFormat, Callable[[list[Path]], pd.DataFrame]] = {
    "movielens_parquet": _parse_movielens_table,
    "adult_parquet": _parse_parquet,
}


def load_table(dataset: str | DatasetInfo, config: DataConfig | None = None) -> pd.DataFrame:
    """Load a tabular dataset as a pandas DataFrame.

    MovieLens-100k loads as one row per rating (user_id, movie_id, rating, timestamp) joined with
    the user and movie attributes, sorted by timestamp (stable). Adult loads as published.

    Args:
        dataset: A dataset id or its record.
        config: Cache and verification settings.

    Returns:
        The table.

    Raises:
        ConfigError: If the name is unknown or the dataset has no table form.
        DatasetMissingError: If its package is not installed.
        DatasetChecksumError: If a file does not match its pinned SHA-256.
        DatasetStatsError: If the row or column count differs from the record.
    """
    info = _info(dataset, "table")

    def write(path: Path, table: pd.DataFrame) -> None:
        atomic_write(path, lambda tmp: table.to_parquet(tmp, index=False))

    return _load_cached(
        info,
        config,
        ".parquet",
        parse=_TABLE_PARSERS[info.file_format],
        read=pd.read_parquet,
        write=write,
        stats=lambda table: compute_stats(info, table=table),
        names=_TABLE_STATS,
    )


# --- text ----------------------------------------------------------------------------------


def _parse_pydoc_topics(paths: list[Path]) -> tuple[str, ...]:
    spec = importlib.util.spec_from_file_location("_frugal_pydoc_topics", paths[0])
    if spec is None or spec.loader is None:
        raise OSError(f"cannot load {paths[0]} as a Python module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    topics: dict[str, str] = module.topics
    return tuple(topics[key] for key in sorted(topics))


def _parse_fortune_files(paths: list[Path]) -> tuple[str, ...]:
    documents: list[str] = []
    for file in sorted(paths, key=lambda p: p.name):
        text = file.read_text(encoding="utf-8")
        documents.extend(entry for entry in _FORTUNE_SEPARATOR.split(text) if entry.strip())
    return tuple(documents)


_TEXT_PARSERS: dict[FileFormat, Callable[[list[Path]], tuple[str, ...]]] = {
    "pydoc_topics": _parse_pydoc_topics,
    "fortune_files": _parse_fortune_files,
}


def load_documents(dataset: str | DatasetInfo, config: DataConfig | None = None) -> tuple[str, ...]:
    """Load a text corpus as documents (pydoc topics sorted by name; fortune entries by file).

    Args:
        dataset: A dataset id or its record, or the path of your own `.txt` or `.jsonl` file
            (`frugal.data.text_files`: paragraphs, or one `{"text": ...}` per line).
        config: Cache and verification settings.

    Returns:
        The documents, in a fixed order.

    Raises:
        ConfigError: If the name is unknown, the dataset is not text, or your file cannot be
            read as text documents.
        DatasetMissingError: If its package is not installed (an optional one names apt-get).
        DatasetChecksumError: If the files do not match the pinned SHA-256.
        DatasetStatsError: If the document or character count differs from the record.
    """
    if isinstance(dataset, str) and is_text_file(dataset):
        return read_text_documents(Path(dataset))
    info = _info(dataset, "documents")

    def read(path: Path) -> tuple[str, ...]:
        documents = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(documents, list) or not all(isinstance(d, str) for d in documents):
            raise ValueError("not a JSON list of strings")
        return tuple(documents)

    def write(path: Path, documents: tuple[str, ...]) -> None:
        atomic_write_bytes(path, json.dumps(list(documents)).encode("utf-8"))

    return _load_cached(
        info,
        config,
        ".json",
        parse=_TEXT_PARSERS[info.file_format],
        read=read,
        write=write,
        stats=lambda documents: compute_stats(info, documents=documents),
        names=_TEXT_STATS,
    )


def load_text(dataset: str | DatasetInfo, config: DataConfig | None = None) -> str:
    """Load a text corpus as one string: its documents joined by newlines.

    Raises:
        ConfigError: If the name is unknown or the dataset is not text.
        DatasetMissingError: If its package is not installed.
        DatasetChecksumError: If the files do not match the pinned SHA-256.
        DatasetStatsError: If the document or character count differs from the record.
    """
    return "\n".join(load_documents(dataset, config))


def dataset_path(dataset: str | DatasetInfo, config: DataConfig | None = None) -> Path:
    """Return the verified path of a file asset such as a model (`loaders` contains "path").

    Raises:
        ConfigError: If the name is unknown or the dataset is not a file asset.
        DatasetMissingError: If its package is not installed.
        DatasetChecksumError: If the file does not match its pinned SHA-256.
    """
    info = _info(dataset, "path")
    files, _ = _prepare(info, config or DataConfig())
    return files[0].path


# --- statistics ----------------------------------------------------------------------------

_EVENT_STATS = (
    "num_nodes",
    "num_events",
    "num_distinct_t",
    "t_min",
    "t_max",
    "num_users",
    "num_items",
    "class_counts",
)
_TABLE_STATS = ("num_rows", "num_columns")
_TRIPLE_STATS = ("num_entities", "num_relations", "num_triples")
_TEXT_STATS = ("num_documents", "num_chars")


def compute_stats(
    info: DatasetInfo,
    *,
    events: TemporalEvents | None = None,
    table: pd.DataFrame | None = None,
    documents: tuple[str, ...] | None = None,
    graph: KnowledgeGraph | None = None,
) -> DatasetStats:
    """Count what was parsed, in the fields of `DatasetStats`.

    Args:
        info: The dataset's record (for `bipartite`).
        events: Parsed events, if any.
        table: Parsed table, if any.
        documents: Parsed documents, if any.
        graph: A parsed knowledge graph, if any.

    Returns:
        The counts of every form given; other fields are None.
    """
    values: dict[str, Any] = {}
    if events is not None:
        values.update(
            num_nodes=events.num_nodes,
            num_events=events.num_events,
            num_distinct_t=len(np.unique(events.t)),
            t_min=int(events.t[0]) if events.num_events else None,
            t_max=int(events.t[-1]) if events.num_events else None,
        )
        if info.bipartite:
            values.update(
                num_users=events.num_src_nodes, num_items=events.num_nodes - events.num_src_nodes
            )
        if events.node_label is not None:
            counts = np.bincount(
                events.node_label[events.node_label >= 0], minlength=len(events.label_names)
            )
            values["class_counts"] = tuple(
                (name, int(c)) for name, c in zip(events.label_names, counts, strict=True)
            )
    if table is not None:
        values.update(num_rows=len(table), num_columns=len(table.columns))
    if documents is not None:
        values.update(num_documents=len(documents), num_chars=sum(len(d) for d in documents))
    if graph is not None:
        values.update(
            num_entities=graph.num_entities,
            num_relations=graph.num_relations,
            num_triples=(len(graph.train), len(graph.valid), len(graph.test)),
        )
    return DatasetStats(**values)


def _check_stats(info: DatasetInfo, actual: DatasetStats, *, names: tuple[str, ...]) -> None:
    for name in names:
        expected = getattr(info.stats, name)
        if expected is None or expected == ():
            continue
        got = getattr(actual, name)
        if got != expected:
            raise DatasetStatsError(
                f"dataset {info.name!r}: parsed {name} = {got} but the record pins {expected}; "
                "the checksum matched, so the parser is wrong: report this as a frugal bug"
            )


def verify_dataset(dataset: str | DatasetInfo, config: DataConfig | None = None) -> DatasetStats:
    """Hash every file of a dataset, parse it with every loader, and check all pinned counts.

    Args:
        dataset: A dataset id or its record.
        config: Settings; `verify` is forced to "always".

    Returns:
        The counts measured on the parsed data.

    Raises:
        ConfigError: If the name is unknown.
        DatasetMissingError: If its package is not installed.
        DatasetChecksumError: If a file does not match its pinned SHA-256.
        DatasetStatsError: If a parse does not reproduce the pinned counts.
    """
    info = _info(dataset)
    base = config or DataConfig()
    config = DataConfig(cache_dir=base.cache_dir, verify="always", use_cache=base.use_cache)
    # Cache entries are re-checked against the record's counts when read, so a bad entry
    # is rebuilt here too.
    forms: dict[str, Any] = {}
    if "events" in info.loaders:
        forms["events"] = load_events(info, config)
    if "triples" in info.loaders:
        forms["graph"] = load_triples(info, config)
    if "table" in info.loaders:
        forms["table"] = load_table(info, config)
    if "documents" in info.loaders:
        forms["documents"] = load_documents(info, config)
    if "path" in info.loaders:
        dataset_path(info, config)
    stats = compute_stats(info, **forms)
    _check_stats(info, stats, names=tuple(f.name for f in fields(DatasetStats)))
    return stats
