"""Storage engines behind `EmbeddingStore`, chosen by name from a registry.

Built in: `file` (default), `rocksdb`, `lmdb`, `memory`. `register_backend` adds another.
"""

from frugal.store.backends.base import StoreBackend
from frugal.store.backends.file import FileBackend
from frugal.store.backends.kv import LmdbBackend, RocksDbBackend
from frugal.store.backends.memory import MemoryBackend
from frugal.store.backends.registry import (
    BACKENDS,
    BackendArgs,
    BackendType,
    backend_names,
    register_backend,
)

__all__ = [
    "BACKENDS",
    "BackendArgs",
    "BackendType",
    "FileBackend",
    "LmdbBackend",
    "MemoryBackend",
    "RocksDbBackend",
    "StoreBackend",
    "backend_names",
    "register_backend",
]
