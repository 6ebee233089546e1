"""Storage engines behind `EmbeddingStore`: file (default), rocksdb, lmdb, memory."""

from frugal.store.backends.base import StoreBackend
from frugal.store.backends.file import FileBackend
from frugal.store.backends.kv import LmdbBackend, RocksDbBackend
from frugal.store.backends.memory import MemoryBackend

__all__ = ["FileBackend", "LmdbBackend", "MemoryBackend", "RocksDbBackend", "StoreBackend"]
