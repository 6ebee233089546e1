"""Disk-backed embedding storage without data stalls (MLKV, ICDE 2025, arXiv 2504.01506).

`EmbeddingStore` keeps rows (vector + optimizer state) on a local disk behind a bounded
cache with lookahead prefetching, background write-back and bounded staleness; backends:
`file` (default, O_DIRECT), `rocksdb`, `lmdb`, `memory`. `LookaheadLoader` feeds it hints.
"""

from frugal.store.errors import (
    NonFiniteError,
    StalenessTimeoutError,
    StoreCorruptionError,
    StoreError,
    StoreLockedError,
)
from frugal.store.rows import OptimizerConfig, RowSpec, apply_optimizer, init_rows
from frugal.store.store import EmbeddingStore

__all__ = [
    "EmbeddingStore",
    "NonFiniteError",
    "OptimizerConfig",
    "RowSpec",
    "StalenessTimeoutError",
    "StoreCorruptionError",
    "StoreError",
    "StoreLockedError",
    "apply_optimizer",
    "init_rows",
]
