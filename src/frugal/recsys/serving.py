"""Serving a trained model read-only: embedding lookups and click predictions from a checkpoint.

`Snapshot.open(path)` reads one sealed checkpoint (a `checkpoint_dir`, whose LATEST is used,
or a `step-N` folder; full or incremental, whose chain it replays) or a full export of
`frugal recsys export`, and serves

- `lookup(table, ids)`: the vectors the PS would return; ids never trained (or deleted by
  expiry or eviction) read the seeded initial value the PS gives them, `init_rows` of the key
  `(table << 56) | id` under the training seed;
- `predict(batch)`: click probabilities of the trained dense model (`dense.pt`, built with
  `frugal.recsys.models.build_model` from the manifest's settings), with the embeddings
  pooled as the trainer pools them (`EmbeddingClient`: rows in the training's `wire_dtype`,
  sum-pooled per feature), so it equals the trainer's own evaluation sample by sample.

Training may go on writing checkpoints meanwhile. A snapshot loads everything it needs at
`open` (each table's ids and vectors, 8 + 4E bytes a trained row, not the optimizer state;
and the dense model) and keeps no file open, so retention deleting its folders later cannot
break it; opening a `checkpoint_dir` whose LATEST moves on and prunes the chain being read
starts over from the new LATEST. The price is RAM: tables larger than memory cannot be served
this way.

Shape legend: N ids, E embedding_dim, B samples.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from frugal._typing import F32, I64
from frugal.config import ConfigError, config_from_dict
from frugal.recsys.batch import KJTBatch
from frugal.recsys.checkpoint import (
    EXPORT_FORMAT,
    compat_table_dims,
    read_chain,
    replay_table,
    resolve_checkpoint,
    shard_paths,
)
from frugal.recsys.client import EmbeddingClient, WireDtype
from frugal.recsys.errors import RecsysError
from frugal.recsys.models import build_model
from frugal.recsys.ps import ID_BITS, NUM_VIRTUAL_SHARDS, hash_raw_ids, table_keys
from frugal.recsys.shard_files import map_member, read_array, table_count
from frugal.store import OptimizerConfig, RowSpec, init_rows

__all__ = ["Snapshot"]

_ATTEMPTS = 3  # opens of a checkpoint_dir restarted when LATEST moves on mid-read
# what tables and a dense model share, and the values earlier checkpoints implied
_MODEL_KEYS = ("data", "model", "hidden", "embedding_dim", "embedding_dims", "sequence_features",
               "sequence_target")  # fmt: skip
_MODEL_DEFAULTS: dict[str, Any] = {
    "embedding_dims": [],
    "sequence_features": [],
    "sequence_target": None,
}


@dataclass(frozen=True, slots=True)
class _Tables:
    """Trained rows of every table (ids sorted) and what a snapshot needs to describe them."""

    ids: list[I64]
    vectors: list[F32]
    info: dict[str, Any]  # compat, features, dense_dim, config, samples_done
    source: str


class _Done:
    """A handle whose result is already there (the snapshot answers in the caller's thread)."""

    def __init__(self, value: Any) -> None:
        self._value = value

    def wait(self) -> Any:
        return self._value

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        fn()


class _SnapshotTransport:
    """Serves the `lookup` calls of an `EmbeddingClient` from a snapshot (one shard)."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def call(self, dst: int, op: str, *args: Any) -> _Done:
        if op != "lookup":
            raise ValueError(f"a snapshot is read-only: it serves lookups, not {op!r}")
        ids, counts, wire_dtype, _step = args
        bounds = np.concatenate([[0], np.cumsum(counts.numpy())])
        flat = ids.numpy()
        dims = self.snapshot.table_dims
        rows_G = [  # per width, ascending, the rows of its tables in table order (a PS shard's)
            torch.from_numpy(
                np.concatenate(
                    [
                        self.snapshot.lookup(t, flat[bounds[t] : bounds[t + 1]])
                        for t in range(self.snapshot.num_tables)
                        if dims[t] == dim
                    ]
                )
            ).to(wire_dtype)
            for dim in sorted(set(dims))
        ]
        versions = torch.zeros(len(flat), dtype=torch.int64)
        return _Done((rows_G, versions))

    def close(self) -> None:
        """Nothing to release."""


class Snapshot:
    """A read-only trained model: embedding tables and, from a checkpoint, the dense network.

    Build it with `Snapshot.open`. Thread-safe for concurrent `lookup` and `predict` calls
    (nothing is written after `open`).
    """

    def __init__(
        self, tables: _Tables, dense_state: dict[str, Tensor] | None, dense_info: dict[str, Any]
    ) -> None:
        """Use `Snapshot.open`."""
        compat = tables.info["compat"]
        self.source = tables.source
        """Where the tables were read (a step folder or an export file)."""
        self.samples_done: int | None = tables.info.get("samples_done")
        """Training samples consumed when the checkpoint was taken."""
        self.embedding_dim = int(compat["embedding_dim"])
        """Width E of the vectors of every table `table_dims` does not set otherwise."""
        self.num_tables = len(tables.ids)
        """Tables (features) served."""
        self.table_dims: tuple[int, ...] = compat_table_dims(compat, self.num_tables)
        """Width of each table's vectors."""
        self.features: tuple[str, ...] | None = (
            tuple(tables.info["features"]) if "features" in tables.info else None
        )
        """Feature names (None for a format-1 checkpoint, which did not record them)."""
        self.raw_ids = bool(tables.info.get("raw_ids", False))
        """The model was trained on raw 64-bit ids: `lookup` and `predict` hash them as the
        trainers did (`frugal.recsys.ps.hash_raw_ids`)."""
        self._ids, self._vectors = tables.ids, tables.vectors
        self.memory_mapped = any(isinstance(v, np.memmap) for v in tables.vectors)
        """The tables are served from a mapped export file (`open(..., mmap=True)`)."""
        self._seed = int(compat["seed"])
        optimizer = config_from_dict(
            OptimizerConfig, compat["embedding_optimizer"], source=f"{self.source} compat"
        )
        self._specs = {
            dim: RowSpec(embedding_dim=dim, optimizer=optimizer) for dim in set(self.table_dims)
        }
        self._model: nn.Module | None = None
        self._client: EmbeddingClient | None = None
        self._dense_dim: int | None = None
        self._no_model = (
            f"{self.source} holds embedding tables only; open it with dense=CHECKPOINT (the "
            "checkpoint it was exported from) to predict"
        )
        if dense_state is None:
            return
        if "dense_dim" not in dense_info or self.features is None:
            self._no_model = (
                f"{dense_info['source']} (checkpoint format 1) does not record the model's "
                "inputs (features, dense_dim), so its dense model cannot be built; resume it "
                "once with this frugal (resume=true: a finished job trains 0 steps and writes "
                "a format-2 checkpoint), then open that"
            )
            return
        self._build_model(dense_state, dense_info)

    def _build_model(self, state: dict[str, Tensor], info: dict[str, Any]) -> None:
        assert self.features is not None  # checked by the caller
        compat = info["compat"]
        self._dense_dim = int(info["dense_dim"])
        dims = self.table_dims
        sequences = tuple(self.features.index(n) for n in compat.get("sequence_features", []))
        target = compat.get("sequence_target")
        model = build_model(
            compat["model"],
            len(self.features),
            dims[0] if len(set(dims)) == 1 else dims,
            self._dense_dim,
            tuple(compat["hidden"]),
            sequence_features=sequences,
            sequence_target=None if target is None else self.features.index(target),
        )
        model.load_state_dict(state)
        model.eval()
        self._model = model
        config = info.get("config") or {}
        wire: WireDtype = config.get("wire_dtype", "float16")  # format 1: the default then
        owners = np.zeros(NUM_VIRTUAL_SHARDS, dtype=np.int64)  # one "shard": this snapshot
        self._client = EmbeddingClient(
            _SnapshotTransport(self),
            owners,
            self.num_tables,
            self.table_dims,
            wire,
            raw_ids=self.raw_ids,
            pooling=tuple(compat.get("pooling", ["sum"])),
            sequence_features=sequences,
        )

    @classmethod
    def open(
        cls, source: Path | str, *, dense: Path | str | None = None, mmap: bool = False
    ) -> Snapshot:
        """Read a checkpoint or a full export into memory, or map an export from disk.

        Args:
            source: A `checkpoint_dir` (its LATEST), a sealed `step-N` folder (full or
                incremental), or a full `.npz` export of `frugal recsys export`.
            dense: The checkpoint whose dense model `predict` uses (default: `source`'s own,
                when it is a checkpoint). Its model must be the tables' (same data, model,
                hidden widths, embedding widths and feature count).
            mmap: With an export as `source`: memory-map its ids and vectors instead of
                reading them (tables larger than RAM are served from the page cache; a
                lookup touches the pages of the ids it binary-searches and the rows it
                returns). The file must not change while the snapshot is open.

        Returns:
            The snapshot; `predict` needs a dense model (`source` a checkpoint, or `dense`).

        Raises:
            ConfigError: If a path is not a checkpoint or export, or `mmap` is asked of a
                checkpoint (export it first).
            RecsysError: If a checkpoint is damaged (sha256, a missing or altered base), an
                export is incremental or not frugal's, or the dense model is another
                model's (the message names the setting that differs).
        """
        path = Path(source)
        if path.is_file():
            tables = _read_export(path, mmap=mmap)
            dense_state, dense_info = None, None
        elif mmap:
            raise ConfigError(
                f"mmap=True maps an export file, and {path} is not one: a checkpoint's chain is "
                "replayed into memory; `frugal recsys export` it to a .npz and open that"
            )
        else:
            tables, dense_state, dense_info = _read_checkpoint_tables(path)
        if dense is not None:
            folder, manifest = resolve_checkpoint(Path(dense))
            dense_state = _load_dense(folder)
            dense_info = _info(folder, manifest)
        if dense_info is not None:
            _check_same_model(tables, dense_info)
        return cls(tables, dense_state, dense_info or {})

    def lookup(self, table: int, ids: I64 | list[int]) -> F32:
        """Vectors of `ids` in `table`: the trained ones, else the PS's seeded initial value.

        Args:
            table: Table index, in [0, num_tables).
            ids: Ids, each in [0, 2^56); any int64 where `raw_ids` (they are hashed first).

        Returns:
            float32 (N, E) with E = `table_dims[table]`.

        Raises:
            ValueError: If `table` or an id is out of range.
        """
        if not 0 <= table < self.num_tables:
            raise ValueError(
                f"table={table}, but {self.source} has {self.num_tables} tables "
                f"(0..{self.num_tables - 1})"
            )
        given = np.asarray(ids)
        if given.ndim > 1 or (given.size and given.dtype.kind not in "iu"):
            raise ValueError(
                f"ids must be a 1-d list or array of integers, got {given.dtype} of shape "
                f"{given.shape}"
            )
        ids_N = given.astype(np.int64).reshape(-1)
        if self.raw_ids:
            ids_N = hash_raw_ids(ids_N)
        if len(ids_N) and (ids_N.min() < 0 or ids_N.max() >= 1 << ID_BITS):
            bad = int(ids_N[(ids_N < 0) | (ids_N >= 1 << ID_BITS)][0])
            raise ValueError(f"id {bad} is outside [0, 2^{ID_BITS}); hash larger ids first")
        known, vectors = self._ids[table], self._vectors[table]
        where = np.minimum(np.searchsorted(known, ids_N), max(len(known) - 1, 0))
        found = known[where] == ids_N if len(known) else np.zeros(len(ids_N), dtype=bool)
        dim = self.table_dims[table]
        out_NE = np.empty((len(ids_N), dim), dtype=np.float32)
        out_NE[found] = vectors[where[found]]
        missing = ids_N[~found]
        keys = table_keys(np.full(len(missing), table, dtype=np.int64), missing)
        out_NE[~found] = init_rows(keys, self._specs[dim], self._seed)[:, :dim]
        return out_NE

    def predict(self, batch: KJTBatch) -> F32:
        """Click probabilities of a batch, as the trainer's evaluation computes them.

        Args:
            batch: Ids per (feature, sample) in the model's feature order, and the dense
                features (its labels are not used).

        Returns:
            float32 (B,), sigmoid of the model's logits.

        Raises:
            RecsysError: If the snapshot has no dense model (an export opened without
                `dense=`, or a format-1 checkpoint, which lacks the model's inputs).
            ValueError: If the batch's features or dense width are not the model's.
        """
        if self._model is None or self._client is None or self._dense_dim is None:
            raise RecsysError(self._no_model)
        if self.features is not None and tuple(batch.keys) != self.features:
            raise ValueError(
                f"the batch has features {list(batch.keys)}, the model {list(self.features)}; "
                "give the model's features in its order"
            )
        if batch.dense.ndim != 2 or batch.dense.shape[1] != self._dense_dim:
            raise ValueError(
                f"the batch has dense features of shape {batch.dense.shape}, the model takes "
                f"(B, {self._dense_dim})"
            )
        if batch.batch_size == 0:
            return np.empty(0, dtype=np.float32)
        with torch.no_grad():
            result = self._client.wait(self._client.lookup(batch))
            logits_B = self._client.forward(self._model, result, torch.from_numpy(batch.dense))
            probabilities: F32 = torch.sigmoid(logits_B).numpy()
        return probabilities


def _info(folder: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """What a snapshot needs from a checkpoint's manifest."""
    if not isinstance(manifest.get("compat"), dict):
        raise RecsysError(f"{folder}/MANIFEST.json has no compat fields; the checkpoint is damaged")
    info: dict[str, Any] = {
        key: manifest[key]
        for key in ("compat", "features", "dense_dim", "raw_ids")
        if key in manifest
    }
    info |= {"config": manifest.get("config"), "source": str(folder)}
    info["samples_done"] = manifest.get("samples_done")
    info["run_id"] = manifest.get("run_id")
    return info


def _load_dense(folder: Path) -> dict[str, Tensor]:
    dense: dict[str, Any] = torch.load(folder / "dense.pt", weights_only=True)
    model: dict[str, Tensor] = dense["model"]
    return model


def _read_checkpoint_tables(
    path: Path,
) -> tuple[_Tables, dict[str, Tensor] | None, dict[str, Any]]:
    """Replay a checkpoint's chain into memory, with its dense model.

    A `checkpoint_dir` is read at its LATEST; if a file vanishes meanwhile (retention after
    two newer checkpoints) and LATEST has moved on, the read starts over from the new one.
    """
    for attempt in range(_ATTEMPTS):
        latest = _latest_name(path)
        folder = path if latest is None else path / latest
        existed = folder.is_dir()
        try:
            folder, manifest = resolve_checkpoint(path)
            info = _info(folder, manifest)
            chain = read_chain(folder, manifest)
            num_tables = table_count(shard_paths(folder, manifest)[0])
            dims = compat_table_dims(info["compat"], num_tables)
            ids, vectors = [], []
            for t in range(num_tables):
                table_ids, table_vectors, _ = replay_table(chain, t, dims[t])
                ids.append(table_ids)
                vectors.append(table_vectors)
            state = _load_dense(folder) if "dense.pt" in manifest["files"] else None
        except (FileNotFoundError, RecsysError, ConfigError):
            moved = latest is not None and _latest_name(path) != latest
            if moved and attempt + 1 < _ATTEMPTS:
                continue
            if existed and not folder.exists():
                raise RecsysError(
                    f"{folder} was deleted while it was being read (a newer checkpoint's "
                    f"retention); open the checkpoint_dir {folder.parent} to follow LATEST"
                ) from None
            raise
        return _Tables(ids, vectors, info, str(folder)), state, info
    raise AssertionError("unreachable: the last attempt returns or raises")


def _latest_name(path: Path) -> str | None:
    """The folder a checkpoint_dir's LATEST names, or None."""
    try:
        return (path / "LATEST").read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None


def _read_export(path: Path, *, mmap: bool = False) -> _Tables:
    """The tables of a full export file, with its meta; `mmap` maps ids and vectors."""
    try:
        with zipfile.ZipFile(path) as archive:
            members = {name.removesuffix(".npy") for name in archive.namelist()}
            if "meta" not in members:
                raise RecsysError(
                    f"{path} has no meta: not an export of this frugal (exports before "
                    "checkpoint format 2 lacked it); export the checkpoint again"
                )
            meta = json.loads(read_array(archive, "meta").item())
            if meta.get("format") != EXPORT_FORMAT:
                raise RecsysError(
                    f"{path}: meta format {meta.get('format')!r} is not {EXPORT_FORMAT}"
                )
            if meta.get("kind") != "full":
                raise RecsysError(
                    f"{path} is an incremental export ({meta.get('since')} to "
                    f"{meta.get('checkpoint')}): it holds changes only; open a full export "
                    "or the checkpoint"
                )
            count = int(meta["num_tables"])
            read = (lambda a, n: map_member(path, a, n)) if mmap else read_array
            ids = [read(archive, f"ids{t}") for t in range(count)]
            vectors = [read(archive, f"vectors{t}") for t in range(count)]
    except zipfile.BadZipFile as exc:
        raise RecsysError(f"{path} is not an .npz export ({exc})") from exc
    info: dict[str, Any] = {
        key: meta[key] for key in ("compat", "features", "dense_dim", "raw_ids") if key in meta
    }
    info |= {
        "config": meta.get("config"),
        "samples_done": meta.get("samples_done"),
        "run_id": meta.get("run_id"),
    }
    return _Tables(ids, vectors, info, str(path))


def _check_same_model(tables: _Tables, dense: dict[str, Any]) -> None:
    """Refuse a dense model trained with other tables than `tables`."""
    ours_run, their_run = tables.info.get("run_id"), dense.get("run_id")
    if ours_run is not None and their_run is not None and ours_run != their_run:
        raise RecsysError(
            f"the tables of {tables.source} come from training run {ours_run[:12]}, the "
            f"dense model of {dense['source']} from run {their_run[:12]}: the same settings "
            "trained twice are two models; give a checkpoint of the tables' own run as dense="
        )
    mine, theirs = tables.info["compat"], dense["compat"]
    for key in _MODEL_KEYS:
        ours = mine.get(key, _MODEL_DEFAULTS.get(key))
        other = theirs.get(key, _MODEL_DEFAULTS.get(key))
        if ours != other:
            raise RecsysError(
                f"the tables of {tables.source} were trained with {key}={ours!r}, the "
                f"dense model of {dense['source']} with {key}={other!r}: a snapshot "
                "serves one model; give the checkpoint the tables came from as dense="
            )
    features = dense.get("features")
    if features is not None and len(features) != len(tables.ids):
        raise RecsysError(
            f"{tables.source} has {len(tables.ids)} tables, the dense model of "
            f"{dense['source']} takes {len(features)} features: a snapshot serves one model; "
            "give the checkpoint the tables came from as dense="
        )
