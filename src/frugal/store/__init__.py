"""Disk-backed embedding storage without data stalls (MLKV, ICDE 2025, arXiv 2504.01506).

`EmbeddingStore` keeps rows (vector + optimizer state) on a local disk behind a bounded
cache with lookahead prefetching, background write-back and bounded staleness; backends:
`file` (default, O_DIRECT), `rocksdb`, `lmdb`, `memory`. `LookaheadLoader` feeds it hints.
Ids are dense rows 0..N-1, or any keys in [0, 2^63) with `key_space="hashed"`; rows are
float32 or float16 (`RowSpec.dtype`). Optimizers (`OptimizerConfig.kind`) come from a
registry too: `register_optimizer` adds an update rule.
"""

from frugal.store.backends import (
    BackendArgs,
    StoreBackend,
    backend_names,
    register_backend,
)
from frugal.store.errors import (
    CacheTooSmallError,
    NonFiniteError,
    StalenessTimeoutError,
    StoreCorruptionError,
    StoreError,
    StoreLockedError,
)
from frugal.store.keys import KeySpaceFullError
from frugal.store.optimizers import optimizer_names, register_optimizer
from frugal.store.rows import OptimizerConfig, RowSpec, apply_optimizer, init_rows
from frugal.store.store import EmbeddingStore

__all__ = [
    "BackendArgs",
    "CacheTooSmallError",
    "EmbeddingStore",
    "KeySpaceFullError",
    "NonFiniteError",
    "OptimizerConfig",
    "RowSpec",
    "StalenessTimeoutError",
    "StoreBackend",
    "StoreCorruptionError",
    "StoreError",
    "StoreLockedError",
    "apply_optimizer",
    "backend_names",
    "init_rows",
    "optimizer_names",
    "register_backend",
    "register_optimizer",
]
