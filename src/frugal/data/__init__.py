"""Bundled real datasets, found in installed packages, verified, parsed and cached.

Each dataset is a `DatasetInfo` record (`DATASETS`, `get_dataset_info`); loaders return
standard containers: `load_events` -> `TemporalEvents` (a static `Graph` via
`Graph.from_events`), `load_triples` -> `KnowledgeGraph`, `load_table` -> pandas DataFrame,
`load_documents`/`load_text` -> text, `dataset_path` -> a verified model file. Synthetic
generators for scale and tests live in `frugal.data.synthetic` and `frugal.data.papers_like`
(an ogbn-papers100M-shaped graph on disk); the `ml_NAME` files of
Benchtemp/TGN are written and read by `frugal.data.ml_format`.
"""

from frugal.data.errors import DatasetChecksumError, DatasetMissingError, DatasetStatsError
from frugal.data.events import TemporalEvents, factorize_nodes
from frugal.data.graph import Graph, split_nodes
from frugal.data.loaders import (
    DataConfig,
    compute_stats,
    dataset_path,
    load_documents,
    load_events,
    load_table,
    load_text,
    load_triples,
    verify_dataset,
)
from frugal.data.papers_like import PapersLikeConfig, papers_like
from frugal.data.records import (
    DATASETS,
    DatasetInfo,
    DatasetSource,
    DatasetStats,
    SourceFile,
    data_wheel_requirements,
    get_dataset_info,
)
from frugal.data.triples import KnowledgeGraph

__all__ = [
    "DATASETS",
    "DataConfig",
    "DatasetChecksumError",
    "DatasetInfo",
    "DatasetMissingError",
    "DatasetSource",
    "DatasetStats",
    "DatasetStatsError",
    "Graph",
    "KnowledgeGraph",
    "PapersLikeConfig",
    "SourceFile",
    "TemporalEvents",
    "compute_stats",
    "data_wheel_requirements",
    "dataset_path",
    "factorize_nodes",
    "get_dataset_info",
    "load_documents",
    "load_events",
    "load_table",
    "load_text",
    "load_triples",
    "papers_like",
    "split_nodes",
    "verify_dataset",
]
