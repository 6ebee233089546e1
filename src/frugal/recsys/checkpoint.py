"""Consistent checkpoints of a training job, incremental ones, and resume (onto any shard count).

A checkpoint is taken at a step boundary after quiescing: the run-ahead stops at the
boundary, every permit comes back (all pushes applied) and a barrier passes. Then, into
`step-N.tmp/` (N = samples consumed, the data-loader cursor): each shard writes its rows per
table (`frugal.recsys.shard_files`: ids, vector + optimizer state, version clock, last push);
rank 0 writes the dense model and optimizer (`dense.pt`). After a second barrier rank 0
writes `MANIFEST.json` (cursor, world size, virtual-shard owners, compatibility fields, the
resolved config, sha256 of every file), fsyncs, renames the folder to `step-N/` and swaps
`LATEST` by temporary file + rename. A folder without a manifest (a crash mid-checkpoint) is
ignored.

Incremental checkpoints (format 2). A *full* checkpoint's shard files hold every live row; a
*delta* holds only the rows written since the checkpoint before it (its `base`) and the ids
deleted (expired, evicted) since then. Its manifest names the base's folder and the sha256
of the base's manifest, which itself covers the base's files and its own base: a chain
full -> delta -> ... -> delta is checked link by link, so a missing or rewritten base is an
error, never a silent resurrection of deleted rows. Replaying a chain (resume, export,
serving) loads the full checkpoint, then each delta in order: its deletions delete, its rows
overwrite. The trainer writes a full checkpoint every `checkpoint_full_every` checkpoints (1:
always full, format 1's behaviour). Retention keeps the chains of the two newest checkpoints
(LATEST and the one it replaced), so no base a kept checkpoint needs is ever deleted.
Format-1 checkpoints (full, no base) are read as full checkpoints.

Rows are owned by virtual shard, so loading onto P' shards only needs the new owner table:
each new shard takes, from every old shard file, the rows whose virtual shard it owns.

References:
    Persia: An Open, Hybrid System Scaling Deep Learning-based Recommenders up to 100
    Trillion Parameters, KDD 2022, arXiv 2111.05897 (section 4.3: fault tolerance).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from frugal._typing import I64
from frugal.config import ConfigError, config_to_dict
from frugal.recsys.config import RecsysTrainConfig, dense_weight_decay
from frugal.recsys.errors import RecsysError
from frugal.recsys.ps import EmbeddingShard
from frugal.recsys.shard_files import (
    CHUNK_ROWS,
    export_shard_rows,
    import_shard_rows,
    map_member,
    read_array,
    table_count,
    write_rows,
)

__all__ = [
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_VERSION",
    "EXPORT_FORMAT",
    "check_compat",
    "commit_checkpoint",
    "compat_fields",
    "compat_table_dims",
    "export_shard_rows",
    "export_tables",
    "import_chain",
    "import_shard_rows",
    "manifest_sha256",
    "read_chain",
    "read_checkpoint",
    "read_latest",
    "replay_table",
    "resolve_checkpoint",
    "shard_paths",
]

CHECKPOINT_FORMAT = "frugal-recsys-checkpoint"
CHECKPOINT_VERSION = 2
"""2: incremental checkpoints (`kind`, `base`, `chain`), `deleted{t}` in shard files."""
EXPORT_FORMAT = "frugal-recsys-export"
_COMPAT_KEYS = ("data", "model", "hidden", "embedding_dim", "embedding_optimizer",
                "batch_size", "seed", "dense_lr", "dense_optimizer", "dense_betas", "dense_eps",
                "dense_weight_decay", "pooling", "embedding_dims", "sequence_features",
                "sequence_target")  # fmt: skip
# Compatibility fields added after the first checkpoints, with the value those implied.
_EARLIER_COMPAT = {
    "dense_optimizer": "sgd",
    "dense_betas": [0.9, 0.999],
    "dense_eps": 1e-8,
    "dense_weight_decay": 0.0,
    "pooling": ["sum"],
    "embedding_dims": [],
    "sequence_features": [],
    "sequence_target": None,
}
_MAX_CHAIN = 100_000  # longer base links than this are a cycle (a hand-edited manifest)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def manifest_sha256(folder: Path) -> str:
    """sha256 of a checkpoint's `MANIFEST.json` (what a delta built on it records).

    Raises:
        OSError: If the manifest cannot be read.
    """
    return _sha256(folder / "MANIFEST.json")


def compat_fields(config: RecsysTrainConfig) -> dict[str, Any]:
    """The settings a job resuming from a checkpoint of `config` must share with it.

    The model and its data, the embedding optimizer, and the dense optimizer with its
    hyperparameters (`dense_weight_decay` resolved: torch's default when None), as plain
    data for the manifest.
    """
    full = config_to_dict(config)
    compat = {key: full[key] for key in _COMPAT_KEYS}
    compat["dense_weight_decay"] = dense_weight_decay(config)
    if len(set(config.embedding_dims)) == 1:  # one width given per table: one width
        compat["embedding_dim"], compat["embedding_dims"] = config.embedding_dims[0], []
    return compat


def compat_table_dims(compat: dict[str, Any], num_tables: int) -> tuple[int, ...]:
    """Embedding width of each table of a checkpoint or export, from its `compat` fields.

    Raises:
        RecsysError: If `embedding_dims` lists another number of widths than `num_tables`.
    """
    dims = compat.get("embedding_dims") or [compat["embedding_dim"]] * num_tables
    if len(dims) != num_tables:
        raise RecsysError(
            f"the manifest lists {len(dims)} embedding_dims for {num_tables} tables; it is damaged"
        )
    return tuple(int(dim) for dim in dims)


def check_compat(folder: Path, saved: dict[str, Any], config: RecsysTrainConfig) -> None:
    """Refuse to resume `config` from a checkpoint whose compatibility fields differ.

    Args:
        folder: The checkpoint (named in the error).
        saved: Its manifest's `compat`; a field it lacks (a checkpoint written before the
            field existed) counts as the value such checkpoints had (dense_optimizer "sgd").
        config: The resuming job.

    Raises:
        RecsysError: Naming the first field that differs, both values and the fix.
    """
    current = compat_fields(config)
    for key, value in ({**_EARLIER_COMPAT, **saved}).items():
        if current.get(key) != value:
            raise RecsysError(
                f"{folder}: the checkpoint was written with {key}={value!r}, this job has "
                f"{key}={current.get(key)!r}; resume with {key}={value!r} or use a new "
                "checkpoint_dir (which trains from scratch)"
            )


def commit_checkpoint(
    directory: Path, tmp: Path, manifest: dict[str, Any], *, base: Path | None = None
) -> Path:
    """Seal `tmp` as a checkpoint: manifest with sha256s, fsync, rename, swap LATEST, prune.

    Args:
        directory: The checkpoint folder (holds `step-N/` folders and `LATEST`).
        tmp: The `step-N.tmp/` folder every rank has written into.
        manifest: Fields to record (cursor, world size, owners, compatibility fields).
        base: For a delta (shard files written with `incremental=True`), the sealed
            checkpoint in `directory` its changes are relative to; None for a full one.

    Returns:
        The final folder.

    Raises:
        ValueError: If `base` is not a sealed checkpoint of `directory` or has the new
            checkpoint's name.
        OSError: If a write fails (the previous checkpoint stays LATEST).
    """
    final = tmp.with_name(tmp.name.removesuffix(".tmp"))
    chain: dict[str, Any] = {"kind": "full", "base": None, "chain": []}
    if base is not None:
        if base.parent != directory or base.name == final.name:
            raise ValueError(
                f"base={base} must be another checkpoint of {directory} than {final.name}"
            )
        if not (base / "MANIFEST.json").is_file():
            raise ValueError(f"base={base} is not a sealed checkpoint (no MANIFEST.json)")
        base_manifest = json.loads((base / "MANIFEST.json").read_text())
        chain = {
            "kind": "delta",
            "base": {"folder": base.name, "manifest_sha256": manifest_sha256(base)},
            "chain": [*base_manifest.get("chain", []), base.name],
        }
    files = {p.name: _sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
    document = {
        "format": CHECKPOINT_FORMAT,
        "format_version": CHECKPOINT_VERSION,
        **manifest,
        **chain,
        "files": files,
    }
    with (tmp / "MANIFEST.json").open("w") as fh:
        json.dump(document, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    _fsync_dir(tmp)
    replaced: list[str] = []  # a checkpoint of the same step (a resumed finished job) goes,
    if final.exists():  # its bases stay as the fallback
        try:
            replaced = _chain_names(final)
        except ValueError:  # a damaged folder: its bases, if any, are unknown
            replaced = []
        shutil.rmtree(final)
    os.replace(tmp, final)
    latest = directory / "LATEST"
    previous = latest.read_text().strip() if latest.is_file() else None
    latest_tmp = directory / "LATEST.tmp"
    latest_tmp.write_text(final.name + "\n")
    with latest_tmp.open("rb") as fh:
        os.fsync(fh.fileno())
    os.replace(latest_tmp, latest)
    _fsync_dir(directory)
    _prune(directory, [*chain["chain"], final.name, *replaced], previous)
    return final


def _chain_names(folder: Path) -> list[str]:
    """The bases a sealed checkpoint's manifest lists (format 1: none).

    Raises:
        ValueError: If the manifest is unreadable or its chain malformed.
    """
    try:
        manifest = json.loads((folder / "MANIFEST.json").read_text())
    except OSError as exc:
        raise ValueError(f"{folder}: no readable manifest") from exc
    names = manifest.get("chain", []) if isinstance(manifest, dict) else None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{folder}: malformed chain {names!r}")
    return names


def _prune(directory: Path, keep: list[str], previous: str | None) -> None:
    """Delete sealed checkpoints outside the chains of the new and the previous LATEST.

    The previous LATEST stays (a fallback, as the two newest full checkpoints did in format
    1) with every base it needs. If its manifest cannot be read its chain is unknown, and
    nothing is deleted.
    """
    kept = set(keep)
    if previous is not None and previous not in kept:
        try:
            kept.update([previous, *_chain_names(directory / previous)])
        except ValueError:
            return
    for old in directory.glob("step-*"):
        if old.is_dir() and not old.name.endswith(".tmp") and old.name not in kept:
            shutil.rmtree(old, ignore_errors=True)


def read_latest(directory: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest sealed checkpoint and its manifest, or None if there is none.

    Only that folder's files are checked; `read_chain` checks the bases a delta needs.

    Raises:
        RecsysError: If LATEST names a missing folder, or its manifest is missing, of another
            format, or its files fail their sha256.
    """
    latest = directory / "LATEST"
    if not latest.is_file():
        return None
    name = latest.read_text().strip()
    folder = directory / name
    if not folder.is_dir():
        raise RecsysError(
            f"{latest} names {name!r}, which is missing: the checkpoint folder is damaged; "
            "give one of its step-S folders instead"
        )
    return folder, read_checkpoint(folder)


def resolve_checkpoint(path: Path) -> tuple[Path, dict[str, Any]]:
    """A checkpoint_dir's LATEST, or a `step-N` folder itself, with its checked manifest.

    Raises:
        ConfigError: If `path` is not a checkpoint (see `read_checkpoint`).
        RecsysError: If it is damaged.
    """
    found = read_latest(path)
    return found if found is not None else (path, read_checkpoint(path))


def read_checkpoint(folder: Path) -> dict[str, Any]:
    """The manifest of a sealed `step-N` folder, after checking every file's sha256.

    Raises:
        ConfigError: If `folder` is missing, a file, or holds no manifest (not a checkpoint).
        RecsysError: If the manifest is not JSON, of another format or a newer version, or
            lacks a field, or a file is corrupt.
    """
    manifest_path = folder / "MANIFEST.json"
    if not folder.exists():
        raise ConfigError(f"checkpoint {folder} does not exist; give a checkpoint_dir or step-S")
    if not folder.is_dir():
        raise ConfigError(f"checkpoint {folder} is a file; give a checkpoint_dir or step-S folder")
    if not manifest_path.is_file():
        raise ConfigError(
            f"{folder} has neither LATEST nor MANIFEST.json: not a checkpoint; give a "
            "checkpoint_dir written by `frugal recsys train` or one of its step-S folders"
        )
    damaged = "the checkpoint is damaged or from another version; use an older step-S"
    try:
        manifest = json.loads(manifest_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RecsysError(f"{manifest_path} is not valid JSON ({exc}); {damaged}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != CHECKPOINT_FORMAT:
        raise RecsysError(f"{manifest_path}: not a frugal recsys checkpoint")
    version = manifest.get("format_version", 1)
    if not isinstance(version, int) or version > CHECKPOINT_VERSION:
        raise RecsysError(
            f"{manifest_path}: format_version={version!r}, but this frugal reads versions "
            f"1 to {CHECKPOINT_VERSION}; upgrade frugal to read it"
        )
    _require(manifest_path, manifest, ("files", "base"))
    for name, digest in manifest["files"].items():
        if not (folder / name).is_file():
            raise RecsysError(
                f"{folder / name} is missing: {manifest_path} lists it, so {damaged} (or "
                "restore the file)"
            )
        if _sha256(folder / name) != digest:
            raise RecsysError(f"{folder / name}: sha256 mismatch; the checkpoint is corrupt")
    return manifest


def _require(manifest_path: Path, manifest: dict[str, Any], fields: tuple[str, ...]) -> None:
    """Raise RecsysError naming the manifest's missing or malformed fields."""
    compat = manifest.get("compat")
    base = manifest.get("base")
    checks = {
        "files": isinstance(manifest.get("files"), dict),
        "world_size": isinstance(manifest.get("world_size"), int),
        "compat": isinstance(compat, dict),
        "compat.embedding_dim": isinstance(compat, dict) and "embedding_dim" in compat,
        "base": base is None
        or (
            isinstance(base, dict)
            and isinstance(base.get("folder"), str)
            and "/" not in base["folder"]
            and isinstance(base.get("manifest_sha256"), str)
        ),
    }
    lacking = [field for field in fields if not checks[field]]
    if lacking:
        raise RecsysError(
            f"{manifest_path}: missing or malformed {lacking}; the checkpoint is damaged or "
            "from another version; use an older step-S"
        )


def _full_checkpoints(directory: Path) -> list[str]:
    """Sealed full checkpoints of a folder, by name (for error messages)."""
    names = []
    for folder in sorted(directory.glob("step-*")):
        try:
            manifest = json.loads((folder / "MANIFEST.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(manifest, dict) and manifest.get("base") is None:
            names.append(folder.name)
    return names


def _chain_fix(delta: Path, base: Path) -> str:
    """What to do about a delta whose base is missing or altered."""
    fulls = [name for name in _full_checkpoints(delta.parent) if name != delta.name]
    if not fulls:
        return (
            f"restore {base.name} from a copy ({delta.parent} holds no full checkpoint), or "
            "start a new checkpoint_dir"
        )
    return (
        f"restore {base.name} from a copy, or use a full checkpoint of {delta.parent} "
        f"({', '.join(fulls)}: give its folder to export or serving, or write its name into "
        "LATEST to resume from it), or start a new checkpoint_dir"
    )


def read_chain(
    folder: Path, manifest: dict[str, Any] | None = None
) -> list[tuple[Path, dict[str, Any]]]:
    """The checkpoints to replay for `folder`: its full base first, `folder` last.

    Each link is checked: the base a delta names must exist, its manifest must have the
    sha256 the delta recorded, and its files their sha256s.

    Args:
        folder: A sealed checkpoint (full or delta).
        manifest: Its manifest, if `read_checkpoint` already checked it.

    Returns:
        (folder, manifest) pairs, full checkpoint first.

    Raises:
        RecsysError: If a base is missing or was altered (the message names the delta, the
            base, both sha256s where they differ, and the fix), or a file is corrupt.
        ConfigError: If `folder` is not a checkpoint.
    """
    if manifest is None:
        manifest = read_checkpoint(folder)
    chain = [(folder, manifest)]
    while (base := manifest.get("base")) is not None:
        delta = folder
        folder = delta.parent / base["folder"]
        if not (folder / "MANIFEST.json").is_file():
            raise RecsysError(
                f"{delta} is an incremental checkpoint on top of {folder}, which is missing "
                f"(moved or deleted by hand: retention keeps every base it needs); "
                f"{_chain_fix(delta, folder)}"
            )
        digest = manifest_sha256(folder)
        if digest != base["manifest_sha256"]:
            raise RecsysError(
                f"{delta} is an incremental checkpoint on top of {folder}, whose MANIFEST.json "
                f"has sha256 {digest}, not the {base['manifest_sha256']} it had when {delta.name} "
                f"was written: {folder.name} was replaced or altered; {_chain_fix(delta, folder)}"
            )
        if len(chain) >= _MAX_CHAIN:
            raise RecsysError(f"{delta}: the chain of bases loops; the manifests were edited")
        manifest = read_checkpoint(folder)
        chain.append((folder, manifest))
    chain.reverse()
    return chain


def shard_paths(folder: Path, manifest: dict[str, Any]) -> list[Path]:
    """The shard files of a checkpoint, `shard0.npz` ... one per rank that wrote it.

    Raises:
        RecsysError: If the manifest lacks `world_size`.
    """
    _require(folder / "MANIFEST.json", manifest, ("world_size",))
    return [folder / f"shard{r}.npz" for r in range(int(manifest["world_size"]))]


def import_chain(
    shard: EmbeddingShard,
    owners: I64,
    rank: int,
    chain: list[tuple[Path, dict[str, Any]]],
    step: int = 0,
) -> int:
    """Replay a chain (`read_chain`) onto a fresh shard: the rows its virtual shards own.

    The full checkpoint first, then each delta (its deletions delete, its rows overwrite).
    The shard's change tracking is then cleared: it holds the chain's last checkpoint, on
    which the next delta can build.

    Args:
        shard: A fresh shard (its stores at their initial values).
        owners: The new owner of each virtual shard, int64 (1024,).
        rank: This shard's index in the new owner table.
        chain: The checkpoints, full first.
        step: Last push step of rows whose file does not record one (format-1 files
            written before expiry existed).

    Returns:
        Rows loaded (a row changed in several checkpoints counts once per checkpoint).

    Raises:
        RecsysError: If a file does not match the shard's tables or row width.
    """
    loaded = 0
    for folder, manifest in chain:
        loaded += import_shard_rows(shard, owners, rank, shard_paths(folder, manifest), step)
    shard.clear_changes()
    return loaded


def _replay_sources(
    chain: list[tuple[Path, dict[str, Any]]], table: int
) -> tuple[I64, npt.NDArray[np.int32], I64, list[Path], I64]:
    """Where each row of a table lives after replaying `chain`: its file and row there.

    Reads ids only (8 B a row, plus 12 B of position), never the rows themselves.

    Returns:
        (ids sorted (N,), file index into `files` int32 (N,), row in that file's table
        int64 (N,), files, deleted ids sorted (M,)); see `replay_table`.

    Raises:
        RecsysError: If a shard file lacks the table.
    """
    ids: I64 = np.empty(0, dtype=np.int64)
    source_file = np.empty(0, dtype=np.int32)
    source_row: I64 = np.empty(0, dtype=np.int64)
    deleted: I64 = np.empty(0, dtype=np.int64)
    files: list[Path] = []
    for folder, manifest in chain:
        new_ids: list[I64] = []
        new_files: list[npt.NDArray[np.int32]] = []
        new_rows: list[I64] = []
        gone: list[I64] = []
        for path in shard_paths(folder, manifest):
            with zipfile.ZipFile(path) as archive:
                members = {name.removesuffix(".npy") for name in archive.namelist()}
                if f"ids{table}" not in members:
                    raise RecsysError(
                        f"{path}: no table {table}; the chain's checkpoints hold other tables"
                    )
                file_ids = read_array(archive, f"ids{table}")
                if f"deleted{table}" in members:
                    gone.append(read_array(archive, f"deleted{table}"))
            new_ids.append(file_ids)
            new_files.append(np.full(len(file_ids), len(files), dtype=np.int32))
            new_rows.append(np.arange(len(file_ids), dtype=np.int64))
            files.append(path)
        added = np.concatenate(new_ids) if new_ids else np.empty(0, dtype=np.int64)
        removed = np.concatenate(gone) if gone else np.empty(0, dtype=np.int64)
        stay = ~np.isin(ids, np.concatenate([added, removed]))
        ids = np.concatenate([ids[stay], added])
        source_file = np.concatenate([source_file[stay], *new_files])
        source_row = np.concatenate([source_row[stay], *new_rows])
        deleted = np.union1d(deleted, removed)
        deleted = deleted[~np.isin(deleted, added)]
    order = np.argsort(ids, kind="stable")
    return ids[order], source_file[order], source_row[order], files, deleted


def _gather_vectors(
    files: list[Path],
    source_file: npt.NDArray[np.int32],
    source_row: I64,
    table: int,
    embedding_dim: int,
) -> Iterator[npt.NDArray[np.float32]]:
    """The vectors at (file, row) positions, `CHUNK_ROWS` at a time, each (n, E).

    Each file's rows are memory-mapped (shard files store them uncompressed), so a chunk
    reads only its own rows: a table larger than RAM streams through.

    Raises:
        RecsysError: If a file's rows are narrower than `embedding_dim` or compressed.
    """
    mapped: dict[int, npt.NDArray[Any]] = {}

    def rows_of(index: int) -> npt.NDArray[Any]:
        if index not in mapped:
            path = files[index]
            with zipfile.ZipFile(path) as archive:
                rows = map_member(path, archive, f"rows{table}")
            if rows.ndim != 2 or rows.shape[1] < embedding_dim:
                raise RecsysError(
                    f"{path}: table {table} rows are {rows.shape}, narrower than "
                    f"embedding_dim={embedding_dim}; the manifest is damaged"
                )
            mapped[index] = rows
        return mapped[index]

    for lo in range(0, len(source_file), CHUNK_ROWS):
        chunk_files = source_file[lo : lo + CHUNK_ROWS]
        chunk_rows = source_row[lo : lo + CHUNK_ROWS]
        out_NE = np.empty((len(chunk_files), embedding_dim), dtype=np.float32)
        for index in np.unique(chunk_files):
            mine = chunk_files == index
            out_NE[mine] = rows_of(int(index))[chunk_rows[mine], :embedding_dim]
        yield out_NE


def replay_table(
    chain: list[tuple[Path, dict[str, Any]]], table: int, embedding_dim: int
) -> tuple[I64, npt.NDArray[np.float32], I64]:
    """One table's rows after replaying `chain`, and the ids its deltas deleted.

    Given a chain from a full checkpoint, the result is that table's state at the chain's
    last checkpoint. Given only deltas (the ones after a checkpoint S), it is the change
    since S: the rows written since and the ids deleted since and absent at the end (an id
    created and deleted in between may be listed: deleting it is a no-op). The result is in
    RAM; `export_tables` streams the same rows to a file instead.

    Args:
        chain: Checkpoints in order, e.g. `read_chain(...)` or a tail of it.
        table: The table index.
        embedding_dim: Columns of each row kept (the vector, not the optimizer state).

    Returns:
        (ids sorted int64 (N,), vectors float32 (N, E), deleted ids sorted int64 (M,)).

    Raises:
        RecsysError: If a shard file lacks the table or is damaged.
    """
    ids, source_file, source_row, files, deleted = _replay_sources(chain, table)
    chunks = list(_gather_vectors(files, source_file, source_row, table, embedding_dim))
    vectors = np.concatenate(chunks) if chunks else np.empty((0, embedding_dim), dtype=np.float32)
    return ids, vectors, deleted


def _write_member(archive: zipfile.ZipFile, name: str, array: npt.NDArray[Any]) -> None:
    with archive.open(f"{name}.npy", "w", force_zip64=True) as fh:
        np.lib.format.write_array(fh, array, allow_pickle=False)  # C order


def export_tables(checkpoint: Path, out_path: Path, *, since: Path | None = None) -> dict[str, int]:
    """Write a checkpoint's trained rows as (ids, vectors) per table, one shard-free file.

    The result is an `.npz` with `ids{t}` (int64, sorted) and `vectors{t}` (float32, (N, E))
    for each table t, and `meta` (a JSON string: the format, `kind` "full" or
    "incremental", the checkpoint, the compatibility fields, the model's inputs and the
    training config, for `frugal.recsys.serving.Snapshot`). A full export lists every row
    the chain ends with; rows never updated (or deleted since) keep their seeded initial
    value and are not listed. With `since`, only the rows written between `since` and
    `checkpoint` are listed, plus `deleted{t}`: the ids deleted in between and absent at
    `checkpoint`. Tables are written one at a time.

    Args:
        checkpoint: A sealed `step-N` folder, or a checkpoint folder (its LATEST is used);
            full or incremental (its chain is replayed).
        out_path: The `.npz` file to write (written to `.part`, then renamed).
        since: An earlier checkpoint of the same chain (a `step-S` folder) for an
            incremental export.

    Returns:
        Rows written per table, keyed `table{t}`; with `since`, also `deleted{t}`.

    Raises:
        RecsysError: If there is no sealed checkpoint there, a file fails its sha256, or a
            base is missing or altered.
        ConfigError: If `checkpoint` is not a checkpoint, or `since` is not one of its
            chain (the message names the ones that are).
    """
    folder, manifest = resolve_checkpoint(checkpoint)
    _require(folder / "MANIFEST.json", manifest, ("world_size", "compat", "compat.embedding_dim"))
    chain = read_chain(folder, manifest)
    if since is not None:
        names = [f.name for f, _ in chain]
        same_folder = since.resolve().parent == folder.resolve().parent
        if same_folder and since.name == names[-1]:
            earlier = ", ".join(str(folder.parent / name) for name in names[:-1])
            raise ConfigError(
                f"--incremental-since {since} is the checkpoint being exported: there are no "
                "changes since itself; give an earlier checkpoint of its chain"
                + (f" ({earlier})" if earlier else " (it has none: export it in full)")
            )
        if not same_folder or since.name not in names:
            valid = ", ".join(str(folder.parent / name) for name in names[:-1])
            if not valid:
                raise ConfigError(
                    f"--incremental-since {since}: {folder} is a full checkpoint, the first of "
                    "its chain, so no other checkpoint is its base; export it in full"
                )
            missing = "" if since.exists() else " does not exist, so it"
            raise ConfigError(
                f"--incremental-since {since}{missing} is not an earlier checkpoint of the "
                f"chain of {folder}: give one of {valid} (the changes since it), or export in full "
                f"(changes from before the chain's full checkpoint, {names[0]}, are only in "
                "a full export)"
            )
        chain = chain[names.index(since.name) + 1 :]
    num_tables = table_count(shard_paths(folder, manifest)[0])
    dims = compat_table_dims(manifest["compat"], num_tables)
    meta: dict[str, Any] = {
        "format": EXPORT_FORMAT,
        "format_version": 1,
        "kind": "full" if since is None else "incremental",
        "checkpoint": folder.name,
        "since": None if since is None else since.name,
        "samples_done": manifest.get("samples_done"),
        "run_id": manifest.get("run_id"),
        "num_tables": num_tables,
        **{
            key: manifest[key]
            for key in ("compat", "features", "dense_dim", "raw_ids")
            if key in manifest
        },
        "config": manifest.get("config"),
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".part")
    counts: dict[str, int] = {}
    try:
        with tmp.open("wb") as fh, zipfile.ZipFile(fh, "w", allowZip64=True) as archive:
            for t in range(num_tables):  # ids and positions in RAM, vectors streamed
                ids, source_file, source_row, files, deleted = _replay_sources(chain, t)
                _write_member(archive, f"ids{t}", ids)
                vectors = _gather_vectors(files, source_file, source_row, t, dims[t])
                write_rows(archive, f"vectors{t}", (len(ids), dims[t]), vectors)
                counts[f"table{t}"] = len(ids)
                if since is not None:
                    _write_member(archive, f"deleted{t}", deleted)
                    counts[f"deleted{t}"] = len(deleted)
            _write_member(archive, "meta", np.array(json.dumps(meta)))
        os.replace(tmp, out_path)
    finally:
        tmp.unlink(missing_ok=True)
    return counts
