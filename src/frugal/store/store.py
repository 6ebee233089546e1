"""`EmbeddingStore`: embedding rows on disk, trained through a bounded cache without stalls.

One interface over every backend (`file`, `rocksdb`, `lmdb`, `memory`): batched `get`,
`put`, `apply_gradients` (fused sparse optimizer), `lookahead` hints for prefetching,
`flush`, `checkpoint`, `open` (= recover the last checkpoint), `close`, `stats`.

References:
    MLKV: Efficiently Scaling up Large Embedding Model Training with Disk-based Key-Value
    Storage, ICDE 2025, arXiv 2504.01506 (sections on lookahead prefetching and bounded
    staleness; see `frugal.store.cache` for where we depart from it).

Shape legend: N ids in a call, D embedding_dim, W row width.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import numpy as np

import frugal
from frugal._libc import physical_memory_bytes
from frugal._typing import F32, I64
from frugal.config import check_types, config_from_dict, config_to_dict
from frugal.disk import lock_file, make_folder
from frugal.store.backends import BACKENDS, BackendArgs
from frugal.store.backends.base import (
    StoreBackend,
    file_sha256,
    read_json,
    save_array_atomic,
    write_json_atomic,
)
from frugal.store.cache import RowCache, slot_overhead_bytes
from frugal.store.errors import (
    NonFiniteError,
    StoreCorruptionError,
    StoreError,
    StoreLockedError,
)
from frugal.store.keys import HashedKeys
from frugal.store.rows import RowSpec, apply_optimizer, init_rows, round_rows
from frugal.store.slot_index import (
    DenseSlotIndex,
    HashSlotIndex,
    SlotIndexKind,
    choose_slot_index,
)

__all__ = ["EmbeddingStore"]

MANIFEST_FORMAT = "frugal-store"
MANIFEST_VERSION = 2  # 2: the MANIFEST holds its own sha256 and its index files' sha256
_READABLE_MANIFEST_VERSIONS = (1, 2)  # 1: no checksums (frugal <= 0.x stores)
_MANIFEST_HASH_KEY = "manifest_sha256"
_RESTORE_FIX = (
    "the store is corrupt (a flipped byte or an edit); restore the store folder from a backup "
    "(frugal never repairs a store)"
)
_MIB = 1 << 20
_MIN_BUDGET_BYTES = 128 << 10
MIN_BUDGET_BYTES = _MIN_BUDGET_BYTES
"""The smallest memory budget any store opens with, bytes (more for large key maps)."""
_MIN_CACHED_ROWS = 64  # the smallest cache a store opens with
KeySpace = Literal["dense", "hashed"]
_OPEN_HERE: set[Path] = set()  # store folders this process holds the lock of


@dataclass(frozen=True, slots=True)
class _MemoryLayout:
    """How a memory budget is split (see `EmbeddingStore._memory_layout`)."""

    io_buffer_bytes: int
    backend_args: BackendArgs
    index_kind: Literal["dense", "hash"]
    capacity: int
    fixed_bytes: int
    bytes_per_slot: int


def _manifest_sha256(manifest: dict[str, Any]) -> str:
    """sha256 of a MANIFEST's content without its own hash (canonical JSON: sorted keys)."""
    body = {k: v for k, v in manifest.items() if k != _MANIFEST_HASH_KEY}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _read_manifest(path: Path) -> dict[str, Any]:
    """Read and check a MANIFEST: JSON, its own sha256, then its format and version.

    Raises:
        StoreCorruptionError: If it is unreadable or its content does not match its sha256.
        StoreError: If it is not a frugal store MANIFEST or of a version this frugal cannot
            read.
    """
    try:
        manifest = read_json(path)
    except ValueError as exc:  # also UnicodeDecodeError: a flipped byte outside ASCII
        raise StoreCorruptionError(f"{path}: unreadable MANIFEST ({exc}); {_RESTORE_FIX}") from exc
    stored = manifest.get(_MANIFEST_HASH_KEY)
    if stored is not None and stored != _manifest_sha256(manifest):
        raise StoreCorruptionError(
            f"{path}: the MANIFEST's content does not match its {_MANIFEST_HASH_KEY} "
            f"{str(stored)[:16]}...; {_RESTORE_FIX}"
        )
    if manifest.get("format") != MANIFEST_FORMAT:
        raise StoreError(f"{path}: not a frugal store MANIFEST")
    version = manifest.get("format_version")
    if version not in _READABLE_MANIFEST_VERSIONS:
        raise StoreError(
            f"{path}: format_version {version} but this frugal reads "
            f"{', '.join(map(str, _READABLE_MANIFEST_VERSIONS))}; open it with frugal "
            f"{manifest.get('frugal_version')}"
        )
    if stored is None and version != 1:
        raise StoreCorruptionError(
            f"{path}: format_version {version} but no {_MANIFEST_HASH_KEY}; {_RESTORE_FIX}"
        )
    return manifest


def _check_file_hashes(directory: Path, manifest: dict[str, Any]) -> None:
    """Check every file the MANIFEST lists under `file_sha256` (index, key map) against it.

    Raises:
        StoreCorruptionError: If such a file is missing, unreadable or differs from its hash.
    """
    hashes = manifest.get("file_sha256", {})
    if not isinstance(hashes, dict):
        raise StoreCorruptionError(f"{directory / 'MANIFEST'}: file_sha256 is not a mapping")
    for name, expected in sorted(hashes.items()):
        path = directory / str(name)
        try:
            actual = file_sha256(path)
        except OSError as exc:
            raise StoreCorruptionError(
                f"{path}: a file of checkpoint {manifest.get('epoch')} is missing or unreadable "
                f"({exc.strerror}); {_RESTORE_FIX}"
            ) from exc
        if actual != expected:
            raise StoreCorruptionError(
                f"{path}: sha256 {actual[:16]}... does not match the MANIFEST's "
                f"{str(expected)[:16]}...; {_RESTORE_FIX}"
            )


def _validate_ids(ids: Any, num_rows: int) -> I64:
    """Return ids as a flat int64 array, or raise without touching the store."""
    array = np.asarray(ids)
    if array.size == 0 and array.dtype == np.float64:  # `[]`: no ids, whatever numpy guessed
        array = array.astype(np.int64)
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
        raise TypeError(
            f"ids must be integers, got dtype {array.dtype}; pass an int64 array of row ids"
        )
    if array.dtype == np.uint64 and array.size and int(array.max()) >= num_rows:
        raise IndexError(
            f"ids reach {int(array.max())}, outside [0, num_rows={num_rows}); re-index them"
        )
    flat = array.astype(np.int64, copy=False).ravel()
    bad = (flat < 0) | (flat >= num_rows)
    if bad.any():
        offenders = np.unique(flat[bad])[:5].tolist()
        raise IndexError(
            f"{int(bad.sum())} ids are outside [0, num_rows={num_rows}), e.g. {offenders}; "
            "re-index them or create the store with more rows"
        )
    return flat


def _validate_keys(ids: Any) -> I64:
    """Return hashed-key-space ids as a flat int64 array; each must lie in [0, 2^63)."""
    array = np.asarray(ids)
    if array.size == 0 and array.dtype == np.float64:  # `[]`: no ids, whatever numpy guessed
        array = array.astype(np.int64)
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"ids must be integers, got dtype {array.dtype}; pass an int64 array")
    if array.dtype == np.uint64 and array.size and int(array.max()) >= 1 << 63:
        raise IndexError(f"ids reach {int(array.max())}, outside [0, 2^63); hash them to 63 bits")
    flat = array.astype(np.int64, copy=False).ravel()
    if flat.size and int(flat.min()) < 0:
        offenders = np.unique(flat[flat < 0])[:5].tolist()
        raise IndexError(f"ids must be >= 0 in a hashed key space, got e.g. {offenders}")
    return flat


def _unlock(directory: Path, lock_fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(lock_fd)
    _OPEN_HERE.discard(directory.resolve())


def _drop_stale_tmp(directory: Path) -> None:
    """Delete the leftovers of an interrupted checkpoint (`*.tmp` files and folders)."""
    for stale in directory.glob("*.tmp"):
        if stale.is_dir():  # e.g. RocksDB's own checkpoint folder, cut by a crash
            shutil.rmtree(stale)
        else:
            stale.unlink()


def _validate_step(step: Any) -> int:
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise TypeError(f"step={step!r} must be an integer >= 0 (the training step)")
    return int(step)


def _validate_cols(cols: str) -> None:
    if cols not in ("emb", "all"):
        raise ValueError(f"cols={cols!r}; choose 'emb' or 'all'")


def _validate_rows(rows: Any, count: int, width: int, what: str) -> F32:
    if not isinstance(rows, np.ndarray):
        raise TypeError(f"{what} must be a numpy float32 array, got {type(rows).__name__}")
    if rows.dtype != np.float32:
        raise TypeError(
            f"{what} must be float32, got {rows.dtype}; convert with .astype(np.float32)"
        )
    if rows.shape != (count, width):
        raise ValueError(f"{what} must have shape ({count}, {width}), got {rows.shape}")
    if not rows.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous; pass np.ascontiguousarray({what})")
    finite = np.isfinite(rows)
    if not finite.all():
        row = int(np.flatnonzero(~finite.all(axis=1))[0])
        raise NonFiniteError(f"{what} row {row} holds NaN or inf; nothing was written")
    return rows


def _is_strictly_increasing(ids: I64) -> bool:
    return bool(len(ids) < 2 or (ids[1:] > ids[:-1]).all())


def _unique(ids: I64) -> tuple[I64, I64 | None]:
    """np.unique with the inverse, skipping the sort when ids are already sorted and unique."""
    if _is_strictly_increasing(ids):
        return ids, None
    unique, inverse = np.unique(ids, return_inverse=True)
    return unique, inverse


def _sum_duplicates(ids: I64, values: F32) -> tuple[I64, F32]:
    """Unique sorted ids and the per-id sum of their value rows."""
    if _is_strictly_increasing(ids):
        return ids, values
    unique, inverse = np.unique(ids, return_inverse=True)
    if len(unique) == len(ids):
        order = np.argsort(ids, kind="stable")
        return unique, values[order]
    summed = np.zeros((len(unique), values.shape[1]), dtype=np.float32)
    np.add.at(summed, inverse, values)
    return unique, summed


class EmbeddingStore:
    """Rows of an embedding table (vector + optimizer state) on disk behind a bounded cache.

    Create with `EmbeddingStore.create`, reopen with `EmbeddingStore.open` (which recovers the
    last checkpoint). A store directory holds `MANIFEST`, `LOCK` and the backend's files; one
    process at a time may open it.

    Example:
        >>> spec = RowSpec(embedding_dim=16, optimizer=OptimizerConfig(kind="adam"))
        >>> with EmbeddingStore.create(path, num_rows=1000, spec=spec) as store:  # doctest: +SKIP
        ...     rows = store.get(ids, step=0)
        ...     store.apply_gradients(ids, grads, step=0)
    """

    @dataclass(frozen=True, kw_only=True, slots=True)
    class Config:
        """Runtime settings (the table's shape and optimizer live in the MANIFEST)."""

        backend: str = "file"
        """Storage engine, a name in `frugal.store.backend_names()` (`file`, `rocksdb`, `lmdb`,
        `memory` or one added by `register_backend`); only used by `create` (`open` reads it
        from the MANIFEST)."""
        memory_budget_bytes: int = 256 * _MIB
        """All RAM the store may use: cache slab, slot metadata, slot index, backend, I/O."""
        staleness_bound: int | None = 0
        """Updates a read may miss, >= 0 (0 = synchronous); None = unbounded."""
        eviction: Literal["lookahead", "lru"] = "lookahead"
        """Cache eviction policy; lru ignores lookahead hints (for ablations)."""
        io_threads: int = 8
        """Threads issuing parallel reads/writes in the file backend, in [1, 64]."""
        use_direct_io: bool = True
        """Bypass the page cache (O_DIRECT) where the file system allows it."""
        timeout_s: float = 60.0
        """Longest wait for a row (staleness bound, prefetch, write-back), > 0."""
        slot_index: SlotIndexKind = "auto"
        """id -> cache slot map: `dense` (4 B per table row, one gather), `hash` (16-32 B per
        cache slot) or `auto`, the one that leaves more cached rows (frugal.store.slot_index)."""
        max_space_amplification: float = 1.5
        """`file` backend: disk bytes of log per byte of written rows above which segments are
        cleaned online, > 1 (lower: less disk, more copying; see `frugal.store.backends.file`)."""

        def __post_init__(self) -> None:
            check_types(self)
            BACKENDS.check(self.backend)
            if self.memory_budget_bytes < 1:
                raise ValueError(
                    f"memory_budget_bytes={self.memory_budget_bytes} must be >= 1 (the store "
                    "names the minimum for a table when it opens; 128 KiB at the least)"
                )
            if self.staleness_bound is not None and self.staleness_bound < 0:
                raise ValueError(
                    f"staleness_bound={self.staleness_bound} must be >= 0, or None for unbounded"
                )
            if not 1 <= self.io_threads <= 64:
                raise ValueError(f"io_threads={self.io_threads} must be in [1, 64]")
            if self.timeout_s <= 0:
                raise ValueError(f"timeout_s={self.timeout_s} must be > 0")
            if not self.max_space_amplification > 1:
                raise ValueError(
                    f"max_space_amplification={self.max_space_amplification} must be > 1 "
                    "(disk bytes of log per live byte; 1.5 is the default)"
                )

    def __init__(
        self,
        directory: Path,
        manifest: dict[str, Any],
        config: Config,
        lock_fd: int,
        *,
        create: bool,
    ) -> None:
        self.directory = directory
        self.config = config
        self.num_rows = int(manifest["num_rows"])
        self.spec = config_from_dict(RowSpec, manifest["spec"], source=str(directory / "MANIFEST"))
        self.seed = int(manifest["seed"])
        self.backend_name: str = manifest["backend"]
        self.epoch = int(manifest["epoch"])
        self.step = int(manifest["step"])
        self.meta: dict[str, Any] = manifest.get("meta", {})
        self.store_id: str = str(manifest.get("store_id", ""))
        """A random id given at `create` and kept by every checkpoint (and by a moved or copied
        folder): tells two stores of the same shape, spec and seed apart; "" for older ones."""
        self.rows_epoch = int(manifest.get("rows_epoch", self.epoch))
        """The checkpoint that first held the current checkpoint's rows: a checkpoint taken
        with no `put`, `apply_gradients` or new key since the previous one keeps it."""
        self._changed = False  # rows or keys changed since the last checkpoint
        self._lock_fd = lock_fd
        self._closed = False
        self._last_step = self.step  # the largest step a get/put/update named
        width = self.spec.width
        budget = config.memory_budget_bytes
        recover_epoch = None if create else self.epoch
        self.key_space: KeySpace = manifest.get("key_space", "dense")
        self.keys: HashedKeys | None = None
        layout = self._memory_layout(budget, manifest.get("backend_info", {}), recover_epoch)
        io_buffer_bytes = layout.io_buffer_bytes
        self._io_buffer_bytes = io_buffer_bytes  # bounds every backend read and write buffer
        backend_args = layout.backend_args
        backend_type = BACKENDS.get(self.backend_name)
        index_kind, capacity = layout.index_kind, layout.capacity
        if capacity < _MIN_CACHED_ROWS or budget < _MIN_BUDGET_BYTES:  # before any file
            needed = layout.fixed_bytes + _MIN_CACHED_ROWS * layout.bytes_per_slot
            if needed > physical_memory_bytes():
                raise ValueError(
                    f"num_rows={self.num_rows:,} needs {needed / 2**30:,.1f} GiB of RAM for its "
                    "per-row maps (record addresses, key map, id map: 4-20 bytes per row) plus a "
                    "minimal cache, beyond this machine's memory; lower num_rows"
                )
            minimum = self._minimum_budget(budget, manifest.get("backend_info", {}))
            raise ValueError(
                f"memory_budget_bytes={budget} leaves room for {max(capacity, 0)} cached rows "
                f"after the {index_kind} slot index, backend and I/O buffers "
                f"({layout.fixed_bytes} bytes); a store needs {_MIN_CACHED_ROWS} cached rows and "
                f"{_MIN_BUDGET_BYTES} bytes or more, so set it to at least {minimum}"
            )
        if self.key_space == "hashed":
            self.keys = HashedKeys(self.num_rows)
            if recover_epoch is not None:
                self._restore_keys(recover_epoch)
        self.backend: StoreBackend = backend_type.open(backend_args)
        self.cache = RowCache(
            self.backend,
            num_rows=self.num_rows,
            width=width,
            capacity=int(capacity),
            initializer=lambda rows: init_rows(self._keys_of(rows), self.spec, self.seed),
            staleness_bound=config.staleness_bound,
            eviction=config.eviction,
            timeout_s=config.timeout_s,
            max_pending_rows=max(1, io_buffer_bytes // self.spec.row_bytes),
            slot_index=index_kind,
        )

    def _memory_layout(
        self, budget: int, info: dict[str, Any], epoch: int | None = None
    ) -> _MemoryLayout:
        """How `budget` splits into I/O buffers, key map, backend, slot index and cache slots."""
        io_buffer_bytes = max(16 << 10, min(16 * _MIB, budget // 8))
        key_map_bytes = 0
        if self.key_space == "hashed":
            key_map_bytes = HashedKeys.memory_bytes_for(self.num_rows)
        args = self._backend_args(epoch, budget, info, io_buffer_bytes)
        backend_bytes = BACKENDS.get(self.backend_name).reserved_memory_bytes(args)
        fixed = key_map_bytes + backend_bytes + io_buffer_bytes
        per_slot = self.spec.row_bytes + slot_overhead_bytes()
        index_kind, capacity = choose_slot_index(
            self.config.slot_index,
            num_rows=self.num_rows,
            available_bytes=budget - fixed,
            bytes_per_slot=per_slot,
        )
        if index_kind == "dense":
            fixed += DenseSlotIndex.memory_bytes_for(self.num_rows)
        else:
            fixed += HashSlotIndex.memory_bytes_for(max(capacity, _MIN_CACHED_ROWS))
        return _MemoryLayout(io_buffer_bytes, args, index_kind, int(capacity), fixed, per_slot)

    def _minimum_budget(self, budget: int, info: dict[str, Any]) -> int:
        """The smallest budget above `budget` that leaves `_MIN_CACHED_ROWS` cached rows.

        The I/O buffers and some backends' shares grow with the budget, so the bytes missing
        at `budget` are not enough: search upward until a budget fits, then bisect down to
        the smallest one that fits (the last value tried that fits is returned, so the
        suggestion is accepted even where the capacity is not monotone in the budget).
        """

        def fits(candidate: int) -> bool:
            return (
                candidate >= _MIN_BUDGET_BYTES
                and self._memory_layout(candidate, info).capacity >= _MIN_CACHED_ROWS
            )

        low, high = max(budget, _MIN_BUDGET_BYTES - 1), max(budget + 1, _MIN_BUDGET_BYTES)
        while not fits(high):
            layout = self._memory_layout(high, info)
            low = high
            high = max(2 * high, layout.fixed_bytes + _MIN_CACHED_ROWS * layout.bytes_per_slot)
        while high - low > 1:  # low does not fit, high does
            middle = (low + high) // 2
            if fits(middle):
                high = middle
            else:
                low = middle
        return high

    def _backend_args(
        self, epoch: int | None, budget: int, info: dict[str, Any], io_buffer_bytes: int
    ) -> BackendArgs:
        return BackendArgs(
            directory=self.directory,
            num_rows=self.num_rows,
            width=self.spec.width,
            epoch=epoch,
            budget_bytes=budget,
            dtype=self.spec.dtype,
            io_threads=self.config.io_threads,
            use_direct_io=self.config.use_direct_io,
            max_io_bytes=io_buffer_bytes,
            info=info,
            max_space_amplification=self.config.max_space_amplification,
        )

    def _keys_of(self, rows: I64) -> I64:
        """The ids users know the rows by (the rows themselves in a dense key space)."""
        if self.keys is None:
            return rows
        keys: I64 = self.keys.keys_by_row[rows]
        return keys

    def _rows_of(self, ids: Any, *, insert: bool = True) -> I64:
        """Validate ids and map them to rows (a hashed key space gives new keys rows)."""
        if self.keys is None:
            return _validate_ids(ids, self.num_rows)
        keys = _validate_keys(ids)
        if not insert:
            return self.keys.lookup(keys)
        num_keys = self.keys.num_keys
        rows = self.keys.lookup_or_insert(keys)
        self._changed |= self.keys.num_keys != num_keys  # the key map is checkpointed too
        recycled = self.keys.take_recycled()
        if len(recycled):  # rows of deleted keys: their data is the old keys'; reset it first
            initial = init_rows(self._keys_of(recycled), self.spec, self.seed)
            self.cache.write(recycled, initial, self._last_step)
        return rows

    def _keys_path(self, epoch: int) -> Path:
        return self.directory / f"keys.{epoch}.npy"

    def _restore_keys(self, epoch: int) -> None:
        assert self.keys is not None
        path = self._keys_path(epoch)
        try:
            saved = np.load(path, allow_pickle=False)
            if saved.dtype != np.int64 or saved.ndim != 1:
                raise ValueError(f"expected a 1-d int64 array, got {saved.dtype} {saved.shape}")
            self.keys.restore(saved)
        except (OSError, ValueError) as exc:
            raise StoreCorruptionError(
                f"{path}: the key map of checkpoint {epoch} is unreadable ({exc}); restore the "
                "folder from a backup"
            ) from exc

    # --- lifecycle -------------------------------------------------------------------------

    @staticmethod
    def _lock(directory: Path) -> int:
        if directory.resolve() in _OPEN_HERE:
            raise StoreLockedError(
                f"{directory} is already open in this process; use that EmbeddingStore or "
                "close it first"
            )
        fd = lock_file(directory / "LOCK")
        if isinstance(fd, str):
            raise StoreLockedError(
                f"{directory} is open for writing by process {fd}; close it there first "
                "(two writers would corrupt it)"
            )
        _OPEN_HERE.add(directory.resolve())
        return fd

    @classmethod
    def create(
        cls,
        directory: str | Path,
        *,
        num_rows: int,
        spec: RowSpec,
        config: Config | None = None,
        seed: int = 0,
        key_space: KeySpace = "dense",
    ) -> EmbeddingStore:
        """Create an empty store (every row at its seeded initial value) as checkpoint 0.

        Args:
            directory: A folder that does not exist or is empty.
            num_rows: Number of rows N; ids are 0..N-1.
            spec: Row layout: embedding_dim and the optimizer whose state rows carry.
            config: Runtime settings (backend, memory budget, staleness bound, ...).
            seed: Seed of the initial values (`init_rows`).
            key_space: "dense": ids are rows 0..N-1. "hashed": ids are any keys in
                [0, 2^63) (e.g. raw feature hashes); each new key takes the next free row on
                first use, up to N keys (`KeySpaceFullError` beyond). A row's initial value
                depends on its key, not on the order keys arrive.

        Returns:
            The open store.

        Raises:
            TypeError: If `config` is not an `EmbeddingStore.Config`.
            ValueError: If `num_rows` < 1 or needs more RAM than the machine has, the folder
                is not empty or cannot be created, or the budget is too small.
            StoreLockedError: If another process holds the folder.
        """
        config = cls._check_config(config)
        if (
            isinstance(num_rows, bool)
            or not isinstance(num_rows, (int, np.integer))
            or num_rows < 1
        ):
            raise ValueError(f"num_rows={num_rows!r} must be an integer >= 1")
        if not isinstance(spec, RowSpec):
            raise TypeError(f"spec must be a RowSpec, got {type(spec).__name__}")
        if key_space not in ("dense", "hashed"):
            raise ValueError(f"key_space={key_space!r}; choose 'dense' or 'hashed'")
        path = make_folder(Path(directory), what="the store folder")
        if any(p.name != "LOCK" for p in path.iterdir()):
            raise ValueError(
                f"{path} is not empty; create a store in a new folder, or EmbeddingStore.open it"
            )
        lock_fd = cls._lock(path)
        manifest = {
            "format": MANIFEST_FORMAT,
            "format_version": MANIFEST_VERSION,
            "frugal_version": frugal.__version__,
            "backend": config.backend,
            "num_rows": num_rows,
            "key_space": key_space,
            "spec": config_to_dict(spec),
            "seed": seed,
            "store_id": uuid.uuid4().hex,
            "epoch": 0,
            "step": 0,
            "meta": {},
        }
        try:
            store = cls(path, manifest, config, lock_fd, create=True)
            store._write_checkpoint(0, 0, {})  # MANIFEST last: a crash before it = incomplete
        except BaseException:
            _unlock(path, lock_fd)
            raise
        return store

    @classmethod
    def minimum_budget_bytes(
        cls,
        *,
        num_rows: int,
        spec: RowSpec,
        config: Config | None = None,
        key_space: KeySpace = "dense",
    ) -> int:
        """The smallest `memory_budget_bytes` that `create` accepts for a store of this shape.

        Lets a caller refuse a budget before it starts the processes that would create the
        store; nothing is written. `config.memory_budget_bytes` is ignored.

        Args:
            num_rows: Rows N of the store, >= 1.
            spec: Row layout.
            config: The other settings (the backend and the slot index change the minimum).
            key_space: "dense" or "hashed" (a hashed key map takes budget too).

        Returns:
            The minimum budget in bytes (at least 128 KiB).

        Raises:
            TypeError: If `config` is not an `EmbeddingStore.Config`.
        """
        return cls._layout_only(num_rows, spec, config, key_space)._minimum_budget(1, {})

    @classmethod
    def budget_for_cached_rows(
        cls,
        cached_rows: int,
        *,
        num_rows: int,
        spec: RowSpec,
        config: Config | None = None,
        key_space: KeySpace = "dense",
    ) -> int:
        """The smallest `memory_budget_bytes` whose cache holds `cached_rows` rows.

        Computed by the layout `create` uses (bisection over the budget); nothing is
        written. At least `minimum_budget_bytes`.

        Args:
            cached_rows: Rows the cache must hold, >= 1.
            num_rows: Rows N of the store, >= 1.
            spec: Row layout.
            config: The other settings (the backend and the slot index change the layout).
            key_space: "dense" or "hashed" (a hashed key map takes budget too).

        Raises:
            TypeError: If `config` is not an `EmbeddingStore.Config`.
        """
        store = cls._layout_only(num_rows, spec, config, key_space)
        low = store._minimum_budget(1, {})
        if store._memory_layout(low, {}).capacity >= cached_rows:
            return low
        high = 2 * low
        while store._memory_layout(high, {}).capacity < cached_rows:
            low, high = high, 2 * high
        while high - low > 1:  # low's cache is too small, high's holds them
            middle = (low + high) // 2
            if store._memory_layout(middle, {}).capacity >= cached_rows:
                high = middle
            else:
                low = middle
        return high

    @classmethod
    def cached_rows_for_budget(
        cls,
        memory_budget_bytes: int,
        *,
        num_rows: int,
        spec: RowSpec,
        config: Config | None = None,
        key_space: KeySpace = "dense",
    ) -> int:
        """Rows the cache of a store with this budget holds (0 below the minimum budget).

        Raises:
            TypeError: If `config` is not an `EmbeddingStore.Config`.
        """
        store = cls._layout_only(num_rows, spec, config, key_space)
        return max(int(store._memory_layout(memory_budget_bytes, {}).capacity), 0)

    @classmethod
    def _layout_only(
        cls, num_rows: int, spec: RowSpec, config: Config | None, key_space: KeySpace
    ) -> EmbeddingStore:
        """A store not opened, for its memory layout (what `create` would compute).

        `_memory_layout` reads only the fields set here.
        """
        config = cls._check_config(config)
        layout_only = cls.__new__(cls)
        layout_only.directory = Path()
        layout_only.num_rows = num_rows
        layout_only.spec = spec
        layout_only.config = config
        layout_only.backend_name = config.backend
        layout_only.key_space = key_space
        return layout_only

    @classmethod
    def _check_config(cls, config: Config | None) -> Config:
        if config is None:
            return cls.Config()
        if not isinstance(config, cls.Config):
            raise TypeError(
                f"config must be an EmbeddingStore.Config, got {type(config).__name__}; build "
                "one with EmbeddingStore.Config(memory_budget_bytes=..., ...)"
            )
        return config

    @classmethod
    def open(cls, directory: str | Path, config: Config | None = None) -> EmbeddingStore:
        """Open a store at its last checkpoint (updates after it are discarded).

        Args:
            directory: The store folder.
            config: Runtime settings; `backend` is read from the MANIFEST instead.

        Returns:
            The open store.

        Raises:
            StoreError: If there is no MANIFEST (an incomplete create) or it is of another
                format or version.
            StoreCorruptionError: If the MANIFEST does not match its own sha256, a file it
                lists (record index, key map) is missing or does not match its sha256, or
                the backend's files fail their checks.
            StoreLockedError: If another process holds the folder.
        """
        config = cls._check_config(config)
        path = Path(directory)
        if not path.is_dir():
            raise StoreError(f"{path} does not exist or is not a folder; check the store path")
        manifest_path = path / "MANIFEST"
        if not manifest_path.is_file():
            raise StoreError(
                f"{path}: incomplete store, no MANIFEST (create was interrupted, or this is "
                "not a store folder); delete the folder and create the store again"
            )
        manifest = _read_manifest(manifest_path)
        base = config or cls.Config()
        config = cls.Config(**(config_to_dict(base) | {"backend": manifest["backend"]}))
        lock_fd = cls._lock(path)
        try:
            _drop_stale_tmp(path)
            _check_file_hashes(path, manifest)
            return cls(path, manifest, config, lock_fd, create=False)
        except BaseException:
            _unlock(path, lock_fd)
            raise

    def _write_checkpoint(self, epoch: int, step: int, meta: dict[str, Any]) -> None:
        rows_epoch = epoch if self._changed or epoch == 0 else self.rows_epoch
        self.backend.sync()
        backend_info = dict(self.backend.checkpoint(epoch))
        file_hashes: dict[str, str] = dict(backend_info.pop("file_sha256", {}))
        if self.keys is not None:  # before the MANIFEST names the epoch
            file_hashes[self._keys_path(epoch).name] = save_array_atomic(
                self._keys_path(epoch), self.keys.keys_by_row[: self.keys.rows_used]
            )
        manifest = {
            "format": MANIFEST_FORMAT,
            "format_version": MANIFEST_VERSION,
            "frugal_version": frugal.__version__,
            "backend": self.backend_name,
            "backend_info": backend_info,
            "num_rows": self.num_rows,
            "key_space": self.key_space,
            "spec": config_to_dict(self.spec),
            "seed": self.seed,
            "epoch": epoch,
            "step": step,
            "rows_epoch": rows_epoch,
            "store_id": self.store_id,
            "meta": meta,
            "file_sha256": file_hashes,
        }
        manifest[_MANIFEST_HASH_KEY] = _manifest_sha256(manifest)
        write_json_atomic(self.directory / "MANIFEST", manifest)
        self.backend.finish_checkpoint(epoch)
        for path in self.directory.glob("keys.*.npy"):
            if path.name != self._keys_path(epoch).name:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        self.epoch, self.step, self.meta = epoch, step, meta
        self.rows_epoch, self._changed = rows_epoch, False

    def close(self, *, checkpoint: bool = True) -> None:
        """Close the store, first taking a checkpoint unless `checkpoint=False`.

        Without a checkpoint, updates since the last one are discarded on the next `open`.
        """
        if self._closed:
            return
        try:
            if checkpoint:
                self.checkpoint(meta=self.meta)
        finally:
            self._closed = True
            self.cache.close()
            self.backend.close()
            _unlock(self.directory, self._lock_fd)

    def rollback(self) -> None:
        """Discard every change since the last checkpoint, keeping this object usable.

        The same as `close(checkpoint=False)` followed by `open` with this store's config,
        done in place, so every holder of this `EmbeddingStore` sees the checkpoint's rows.
        Open reads are dropped with the changes.

        Raises:
            StoreError: If the store is closed, or its MANIFEST became unreadable.
            StoreCorruptionError: If the backend's files fail their checks (then the store
                stays closed).
        """
        self._check_open()
        directory, config = self.directory, self.config
        manifest_path = directory / "MANIFEST"
        self.close(checkpoint=False)
        try:
            manifest = read_json(manifest_path)
        except ValueError as exc:
            raise StoreError(f"{manifest_path}: unreadable MANIFEST: {exc}") from exc
        lock_fd = self._lock(directory)
        _drop_stale_tmp(directory)
        try:
            # Re-running __init__ rebuilds the cache and backend exactly as `open` does.
            EmbeddingStore.__init__(self, directory, manifest, config, lock_fd, create=False)
        except BaseException:
            self._closed = True
            _unlock(directory, lock_fd)
            raise

    def __getstate__(self) -> dict[str, Any]:
        """Refuse to pickle or deepcopy an open store (files, threads, a lock).

        Raises:
            TypeError: Always, naming what to share instead.
        """
        raise TypeError(
            f"an EmbeddingStore cannot be pickled or copied: it is the open store at "
            f"{self.directory}; pass its folder and open it with EmbeddingStore.open(...) in "
            "the other process (one process at a time), or copy the folder after close()"
        )

    def __enter__(self) -> EmbeddingStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(checkpoint=exc_type is None)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"{self.directory}: the store is closed")

    def _step_and_rows(self, ids: Any, step: int) -> tuple[int, I64]:
        """Validate `step` and record it as seen; then validate `ids` and map them to rows."""
        step = _validate_step(step)
        self._last_step = max(self._last_step, step)
        return step, self._rows_of(ids)

    def _first_non_finite_key(self, rows: I64, values: F32) -> int | None:
        """The user's id of the first of `rows` whose `values` hold NaN or inf, if any."""
        if np.isfinite(values).all():
            return None
        row = int(np.flatnonzero(~np.isfinite(values).all(axis=1))[0])
        return int(self._keys_of(rows[row : row + 1])[0])

    # --- data path -------------------------------------------------------------------------

    def get(self, ids: Any, step: int = 0, cols: Literal["emb", "all"] = "emb") -> F32:
        """Read rows by id (duplicates allowed), opening one read per unique row.

        Each unique row read must be closed by a `put` or `apply_gradients` of that row before
        it can be read more than `staleness_bound` times (bound 0: read, update, read, ...).

        Args:
            ids: Integer row ids of any shape.
            step: Training step (for recency and lookahead hints).
            cols: "emb" for the vectors, "all" for vectors and optimizer state.

        Returns:
            A float32 copy, shape ids.shape + (D,) or + (W,).

        Raises:
            TypeError: If ids are not integers.
            IndexError: If an id is outside [0, num_rows).
            StalenessTimeoutError: If a row stays beyond the staleness bound for timeout_s.
            StoreError: If the store is closed or a background job failed.
        """
        return self._cached_rows(ids, step, cols, open_reads=True)

    def _cached_rows(self, ids: Any, step: int, cols: str, *, open_reads: bool) -> F32:
        """Rows through the cache, opening one read per unique row or none (`read`)."""
        self._check_open()
        _validate_cols(cols)
        step, flat = self._step_and_rows(ids, step)
        unique, inverse = _unique(flat)
        columns = self.spec.embedding_dim if cols == "emb" else None
        if open_reads:
            rows = self.cache.get(unique, step, columns=columns)
        else:
            rows = self.cache.get(unique, step, count_read=False, columns=columns, count_stats=True)
        if inverse is not None:
            rows = rows[inverse]
        out: F32 = rows.reshape(*np.shape(ids), rows.shape[1])
        return out

    def read(self, ids: Any, step: int = 0, cols: Literal["emb", "all"] = "emb") -> F32:
        """Read rows that training never updates (e.g. node features), opening no read.

        Like `get` for the cache (recency, lookahead hints, hit and miss counts) but not
        counted against the staleness bound, so no `put` has to follow; a `get` would pin the
        rows until one did.

        Args:
            ids: Integer row ids of any shape.
            step: Training step (for recency and lookahead hints).
            cols: "emb" for the vectors, "all" for vectors and optimizer state.

        Returns:
            A float32 copy, shape ids.shape + (D,) or + (W,).

        Raises:
            TypeError: If ids are not integers.
            IndexError: If an id is outside [0, num_rows).
            StoreError: If the store is closed, a background job failed or the batch has more
                unique rows than the cache holds.
        """
        return self._cached_rows(ids, step, cols, open_reads=False)

    def peek(self, ids: Any, cols: Literal["emb", "all"] = "all") -> F32:
        """Read rows without opening reads (for inspection and evaluation, not training).

        A peek is not counted against the staleness bound and needs no put; it may return a
        row that another thread has read and not yet updated.

        Raises:
            TypeError: If ids are not integers.
            IndexError: If an id is outside [0, num_rows).

        Shapes:
            ids: any -> ids.shape + (W,) for "all", + (D,) for "emb".
        """
        self._check_open()
        _validate_cols(cols)
        if self.keys is None:
            rows = self._peek_rows(_validate_ids(ids, self.num_rows))
        else:  # unseen keys read as their initial value and are not inserted
            keys = _validate_keys(ids)
            found = self.keys.lookup(keys)
            present = found >= 0
            rows = np.empty((len(keys), self.spec.width), dtype=np.float32)
            rows[present] = self._peek_rows(found[present])
            rows[~present] = init_rows(keys[~present], self.spec, self.seed)
        if cols == "emb":
            rows = rows[:, : self.spec.embedding_dim]
        out: F32 = rows.reshape(*np.shape(ids), rows.shape[1])
        return out

    def _peek_rows(self, flat: I64) -> F32:
        unique, inverse = _unique(flat)
        chunk = max(1, self.cache.capacity // 2)  # larger reads stream through the cache
        rows = np.concatenate(
            [
                self.cache.get(unique[i : i + chunk], self.step, count_read=False)
                for i in range(0, len(unique), chunk)
            ]
            or [np.empty((0, self.spec.width), dtype=np.float32)]
        )
        out: F32 = rows if inverse is None else rows[inverse]
        return out

    def put(self, ids: Any, rows: Any, step: int = 0) -> None:
        """Overwrite whole rows (vector and state) of unique ids, closing their open reads.

        Raises:
            TypeError: If ids are not integers or rows are not float32.
            IndexError: If an id is out of range.
            ValueError: If ids repeat or rows have the wrong shape or layout.
            NonFiniteError: If rows hold NaN or inf (nothing is written).

        Shapes:
            ids: (N,); rows: (N, W).
        """
        self._check_open()
        step, flat = self._step_and_rows(ids, step)
        checked = _validate_rows(rows, len(flat), self.spec.width, "rows")
        order = np.argsort(flat, kind="stable")
        sorted_ids = flat[order]
        if len(sorted_ids) > 1 and (np.diff(sorted_ids) == 0).any():
            dup = int(sorted_ids[np.flatnonzero(np.diff(sorted_ids) == 0)[0]])
            raise ValueError(f"put got id {dup} more than once; each row must be written once")
        sorted_rows = checked[order]  # a copy: rounding never touches the caller's array
        round_rows(sorted_rows, self.spec)
        key = self._first_non_finite_key(sorted_ids, sorted_rows)
        if key is not None:
            raise NonFiniteError(
                f"row of id {key} exceeds the float16 range (|x| <= 65504) of "
                "this table; scale it down or use a float32 table; nothing was written"
            )
        self._changed = True
        self.cache.write(sorted_ids, sorted_rows, step)

    def apply_gradients(self, ids: Any, grads: Any, step: int = 0) -> None:
        """Apply the optimizer to the rows of `ids` (duplicates summed), closing their reads.

        Raises:
            TypeError: If ids are not integers or grads are not float32.
            IndexError: If an id is out of range.
            ValueError: If grads have the wrong shape or the optimizer is "none".
            NonFiniteError: If grads hold NaN or inf (nothing is written).

        Shapes:
            ids: (N,); grads: (N, D).
        """
        self._check_open()
        if self.spec.optimizer.kind == "none":
            raise ValueError("this store's rows have no optimizer (kind='none'); use put()")
        step, flat = self._step_and_rows(ids, step)
        checked = _validate_rows(grads, len(flat), self.spec.embedding_dim, "grads")
        unique, summed = _sum_duplicates(flat, checked)

        def step_rows(rows: F32) -> None:
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                apply_optimizer(rows, summed, self.spec)
            round_rows(rows, self.spec)
            key = self._first_non_finite_key(unique, rows)
            if key is not None:
                raise NonFiniteError(
                    f"the {self.spec.optimizer.kind} update of id {key} is not "
                    f"finite (gradient too large for {self.spec.dtype}?); nothing was written"
                )

        self._changed = True
        self.cache.update(unique, step, step_rows)

    def release(self, ids: Any, step: int = 0) -> None:
        """Close the reads a `get` of `ids` opened, without updating the rows.

        For a training step that fails between its `get` and its `apply_gradients` (a bad
        batch, a shape error in the model): without it the rows stay read, the next read
        beyond the staleness bound waits `timeout_s`, and `close()` refuses to checkpoint.
        Ids without an open read are ignored.

        Raises:
            TypeError: If ids are not integers.
            IndexError: If an id is out of range.
            StoreError: If the store is closed.
        """
        self._check_open()
        _validate_step(step)
        flat = self._rows_of(ids, insert=False)
        unique, _ = _unique(flat[flat >= 0])
        self.cache.release(unique)

    def delete(self, ids: Any) -> int:
        """Remove keys of a hashed key space; return how many were present.

        A deleted key reads as its initial value again (as if never seen), and its row goes
        back to the key map's free list for the next new key (`KeySpaceFullError` is then
        raised only when the live keys fill the store). For expiry and eviction of rows
        (e.g. a recommender's parameter server dropping ids unseen for T steps); the row's
        bytes on disk are reused by the next key that takes the row. Absent keys are ignored.

        Args:
            ids: Integer keys of any shape; duplicates are fine.

        Returns:
            Keys that were present and are deleted now.

        Raises:
            ValueError: If the key space is dense (rows there always exist).
            StoreError: If a key has an open read (a `get` not yet closed by `put`,
                `apply_gradients` or `release`), or the store is closed; nothing is deleted.
        """
        self._check_open()
        if self.keys is None:
            raise ValueError(
                "delete() needs a hashed key space (create the store with key_space='hashed'); "
                "a dense store's rows 0..num_rows-1 always exist: put() their initial values"
            )
        keys = np.unique(_validate_keys(ids))
        rows = self.keys.lookup(keys)
        present = rows >= 0
        open_rows = self.cache.open_reads(np.sort(rows[present]))
        if len(open_rows):
            key = int(self._keys_of(open_rows[:1])[0])
            raise StoreError(
                f"key {key} has an open read ({len(open_rows)} of the keys do); close the reads "
                "with put, apply_gradients or release before deleting; nothing was deleted"
            )
        self.cache.unpin(np.sort(rows[present]))  # the next key to take a row is not pinned
        deleted = self.keys.delete(keys[present])
        self._changed |= len(deleted) > 0
        return len(deleted)

    def pin(self, ids: Any, step: int = 0) -> int:
        """Load these rows into the cache and never evict them until `unpin`.

        A static cache for rows known to be hot, e.g. the features of the nodes a GNN
        sampler visits most (`frugal.store.gnn.hot_nodes`), as PaGraph (SoCC 2020) and GNNLab
        (EuroSys 2022) keep them: pinned rows are served without I/O however far ahead the
        lookahead looks. They take cache slots from the batches: at most half the cache may be
        pinned. Reads and updates of pinned rows work as usual (an updated pinned row is
        written back at `flush` and checkpoints).

        Pins live in this process only: `open`, `rollback()` (and so a store module's
        `load_state_dict`) start with none. In a hashed key space, pinning an unseen key gives
        it a row, as `get` does.

        Args:
            ids: Integer row ids (or keys) of any shape; duplicates are fine.
            step: Training step, for recency.

        Returns:
            The number of rows pinned now, these included.

        Raises:
            TypeError: If ids are not integers.
            IndexError: If an id is outside [0, num_rows) (a dense key space).
            KeySpaceFullError: If new keys of a hashed key space do not fit.
            ValueError: If more than half the cache would be pinned (the message says how
                many more rows fit).
            StoreError: If the store is closed.
        """
        self._check_open()
        step, flat = self._step_and_rows(ids, step)
        return self.cache.pin(np.unique(flat), step)

    def unpin(self, ids: Any = None) -> int:
        """Let pinned rows (None: all) be evicted again; returns how many stay pinned.

        Raises:
            TypeError: If ids are not integers.
            IndexError: If an id is outside [0, num_rows).
            StoreError: If the store is closed.
        """
        self._check_open()
        if ids is None:
            return self.cache.unpin(None)
        rows = self._rows_of(ids, insert=False)
        return self.cache.unpin(np.unique(rows[rows >= 0]))

    def lookahead(self, ids: Any, step: int) -> None:
        """Hint that `ids` will be read at `step`; missing rows are prefetched in the background.

        Never blocks and never changes values, only residency.

        Raises:
            TypeError: If ids are not integers.
            IndexError: If an id is out of range.
        """
        self._check_open()
        step, flat = self._step_and_rows(ids, step)
        unique, _ = _unique(flat)
        self.cache.prefetch(unique, step)

    def flush(self) -> None:
        """Write every dirty row to the backend and make it durable (not a checkpoint)."""
        self._check_open()
        self.cache.flush()
        self.backend.sync()

    def checkpoint(self, meta: dict[str, Any] | None = None, step: int | None = None) -> int:
        """Make the current table a durable checkpoint; return its epoch.

        Waits for open reads to close, flushes, syncs, then atomically replaces the MANIFEST.
        A crash at any moment leaves either this checkpoint or the previous one. A checkpoint
        with no `put`, `apply_gradients` or new key since the previous one holds the same rows
        and keeps its `rows_epoch` (what `frugal.store.nn` state dicts refer to).

        Args:
            meta: JSON-serialisable data stored with it (e.g. a data-loader cursor).
            step: Training step recorded in the MANIFEST (default: the largest step any
                get, put, update or lookahead named since open, or the last one recorded).

        Raises:
            StalenessTimeoutError: If open reads do not close within timeout_s.
            StoreError: If the store is closed or a write-back failed.
        """
        self._check_open()
        step = max(self.step, self._last_step) if step is None else _validate_step(step)
        meta = {} if meta is None else meta
        if not isinstance(meta, dict) or not all(isinstance(k, str) for k in meta):
            raise TypeError(
                f"checkpoint meta must be a dict with str keys, got {type(meta).__name__} "
                f"{str(meta)[:60]!r}; e.g. meta={{'cursor': 5}}"
            )
        try:
            json.dumps(meta, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"checkpoint meta must be JSON-serialisable (str, int, finite float, list...): "
                f"{exc}; convert numpy values with int()/float()"
            ) from exc
        self.cache.wait_quiescent()
        self.cache.flush()
        self._write_checkpoint(self.epoch + 1, step, meta)
        return self.epoch

    def table_sha256(self, chunk_rows: int | None = None, ids: Any = None) -> str:
        """SHA-256 of all rows (vector and state) in id order, after a flush.

        Equal hashes mean bit-identical tables, whatever backend or cache produced them. In a
        hashed key space the rows of the keys seen so far are hashed in key order, each after
        its key, so the order in which keys arrived does not matter.

        Args:
            chunk_rows: Rows read at a time (default: what the I/O buffer holds).
            ids: Hash only these rows, in this order (a dense key space only); e.g. the rows
                a run touched, when the table is too large to hash whole.

        Raises:
            IndexError: If `ids` are outside [0, num_rows).
            ValueError: If `ids` are given for a hashed key space, or `chunk_rows` < 1.
        """
        if chunk_rows is not None and (
            isinstance(chunk_rows, bool)
            or not isinstance(chunk_rows, (int, np.integer))
            or chunk_rows < 1
        ):
            raise ValueError(f"chunk_rows={chunk_rows!r} must be an integer >= 1, or None")
        self.flush()
        if chunk_rows is None:  # stay within the I/O share of the memory budget
            chunk_rows = max(256, self._io_buffer_bytes // (2 * self.spec.row_bytes))
        digest = hashlib.sha256()
        if ids is not None:
            if self.keys is not None:
                raise ValueError(
                    "table_sha256(ids=...) needs a dense key space; hash a hashed store whole"
                )
            order = _validate_ids(ids, self.num_rows)
        elif self.keys is None:
            order = np.arange(self.num_rows, dtype=np.int64)
        else:
            live = self.keys.live_rows()
            order = live[np.argsort(self.keys.keys_by_row[live], kind="stable")]
        for start in range(0, len(order), chunk_rows):
            ids = order[start : start + chunk_rows]
            sorted_ids = np.sort(ids)  # the backend reads in row order; hash in key order
            rows = np.empty((len(ids), self.spec.width), dtype=np.float32)
            present = self.backend.read_rows(sorted_ids, rows)
            if not present.all():
                rows[~present] = init_rows(
                    self._keys_of(sorted_ids[~present]), self.spec, self.seed
                )
            rows = rows[np.searchsorted(sorted_ids, ids)]
            if self.keys is not None:  # each row after its key: the same bytes for any chunking
                keys = self._keys_of(ids).astype("<i8").view(np.uint8).reshape(len(ids), 8)
                rows = np.concatenate([keys, rows.view(np.uint8)], axis=1)
            digest.update(np.ascontiguousarray(rows).tobytes())
        return digest.hexdigest()

    @property
    def cache_rows(self) -> int:
        """Rows the cache holds at once (what one call may touch at most)."""
        return int(self.cache.capacity)

    def stats(self) -> dict[str, Any]:
        """Counters since open: hits, misses, prefetches, bytes moved, stall time, staleness."""
        self._check_open()
        s = self.cache.stats
        hist = self.cache.staleness_histogram()
        looked_up = s.hits + s.misses
        return {
            "capacity_rows": self.cache.capacity,
            "pinned_rows": self.cache.pinned_count,
            "slot_index": self.cache.index.kind,
            "key_space": self.key_space,
            "num_keys": self.num_rows if self.keys is None else self.keys.num_keys,
            "memory_budget_bytes": self.config.memory_budget_bytes,
            "direct_io": self.backend.direct_io,
            "budget_enforced": self.backend.budget_enforced,
            "gets": s.gets,
            "hits": s.hits,
            "misses": s.misses,
            "hit_ratio": s.hits / looked_up if looked_up else 1.0,
            "prefetched": s.prefetched,
            "evictions": s.evictions,
            "writebacks": s.writebacks,
            "bytes_read": s.bytes_read,
            "bytes_written": s.bytes_written,
            "stall_s": s.stall_s,
            "staleness_hist": hist,
            "staleness_max": max((r for r, c in enumerate(hist) if c), default=0),
            "backend": backend_stats()
            if callable(backend_stats := getattr(self.backend, "stats", None))
            else {},
        }
