"""Consistent checkpoints of a training job, and resume (also onto another shard count).

A checkpoint is taken at a step boundary after quiescing: the run-ahead stops at the
boundary, every permit comes back (all pushes applied) and a barrier passes. Then, into
`step-N.tmp/` (N = samples consumed, the data-loader cursor): each shard writes the rows it
has updated (ids, vector + optimizer state, version clock) per table; rank 0 writes the dense
model and optimizer. After a second barrier rank 0 writes `MANIFEST.json` (cursor, world
size, virtual-shard owners, compatibility fields, sha256 of every file), fsyncs, renames the
folder to `step-N/` and swaps `LATEST` by temporary file + rename; the two newest
checkpoints are kept. A folder without a manifest (a crash mid-checkpoint) is ignored.

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
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from frugal.config import ConfigError, config_to_dict
from frugal.recsys.config import RecsysTrainConfig, dense_weight_decay
from frugal.recsys.errors import RecsysError
from frugal.recsys.ps import EmbeddingShard, virtual_shard

__all__ = [
    "CHECKPOINT_FORMAT",
    "check_compat",
    "commit_checkpoint",
    "compat_fields",
    "export_shard_rows",
    "export_tables",
    "import_shard_rows",
    "read_checkpoint",
    "read_latest",
]

CHECKPOINT_FORMAT = "frugal-recsys-checkpoint"
CHECKPOINT_VERSION = 1
_KEEP = 2
_COMPAT_KEYS = ("data", "model", "hidden", "embedding_dim", "embedding_optimizer",
                "batch_size", "seed", "dense_lr", "dense_optimizer", "dense_betas", "dense_eps",
                "dense_weight_decay")  # fmt: skip
# Compatibility fields added after the first checkpoints, with the value those implied.
_EARLIER_COMPAT = {
    "dense_optimizer": "sgd",
    "dense_betas": [0.9, 0.999],
    "dense_eps": 1e-8,
    "dense_weight_decay": 0.0,
}


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


def export_shard_rows(shard: EmbeddingShard, path: Path) -> None:
    """Write the rows this shard has updated (version > 0), per table, to `path` (.npz).

    Untouched rows are not written: they equal the store's seeded initial value. Call it
    only while the shard is quiescent (no push in flight).

    Raises:
        OSError: If the file cannot be written.
    """
    arrays: dict[str, npt.NDArray[Any]] = {}
    for t, (ids, rows, versions, last_push) in enumerate(shard.updated_rows()):
        arrays[f"ids{t}"] = ids
        arrays[f"rows{t}"] = rows
        arrays[f"versions{t}"] = versions
        arrays[f"last_push{t}"] = last_push
    tmp = path.with_name(path.name + ".part")
    with tmp.open("wb") as fh:
        np.savez(fh, **arrays)  # type: ignore[arg-type]  # numpy's stub wants positional arrays
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def import_shard_rows(
    shard: EmbeddingShard,
    owners: npt.NDArray[np.int64],
    rank: int,
    paths: list[Path],
    step: int = 0,
) -> int:
    """Load, from old shard files, the rows whose virtual shard `rank` owns under `owners`.

    Args:
        shard: A fresh shard (its stores at their initial values).
        owners: The new owner of each virtual shard, int64 (1024,).
        rank: This shard's index in the new owner table.
        paths: Every old shard's file (any old shard count).
        step: The push step rows count as last pushed at where a file does not record it
            (files written before expiry existed): expiry then restarts from the resume.

    Returns:
        Rows loaded.

    Raises:
        RecsysError: If a file does not match the shard's tables or row width.
    """
    loaded = 0
    for path in paths:
        with np.load(path) as data:
            for t in range(shard.num_tables):
                if f"ids{t}" not in data:
                    raise RecsysError(f"{path}: no table {t}; the checkpoint has other tables")
                ids, rows = data[f"ids{t}"], data[f"rows{t}"]
                if rows.shape[1:] != (shard.row_width,):
                    raise RecsysError(
                        f"{path}: table {t} rows are {rows.shape[1:]} wide, the shard's "
                        f"{shard.row_width}; resume with the same embedding_dim and optimizer"
                    )
                mine = owners[virtual_shard(t, ids)] == rank
                if mine.any():
                    last_push = data[f"last_push{t}"][mine] if f"last_push{t}" in data else step
                    shard.load_rows(t, ids[mine], rows[mine], data[f"versions{t}"][mine], last_push)
                    loaded += int(mine.sum())
    return loaded


def compat_fields(config: RecsysTrainConfig) -> dict[str, Any]:
    """The settings a job resuming from a checkpoint of `config` must share with it.

    The model and its data, the embedding optimizer, and the dense optimizer with its
    hyperparameters (`dense_weight_decay` resolved: torch's default when None), as plain
    data for the manifest.
    """
    full = config_to_dict(config)
    compat = {key: full[key] for key in _COMPAT_KEYS}
    compat["dense_weight_decay"] = dense_weight_decay(config)
    return compat


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


def commit_checkpoint(directory: Path, tmp: Path, manifest: dict[str, Any]) -> Path:
    """Seal `tmp` as a checkpoint: manifest with sha256s, fsync, rename, swap LATEST.

    Args:
        directory: The checkpoint folder (holds `step-N/` folders and `LATEST`).
        tmp: The `step-N.tmp/` folder every rank has written into.
        manifest: Fields to record (cursor, world size, owners, compatibility fields).

    Returns:
        The final folder.

    Raises:
        OSError: If a write fails (the previous checkpoint stays LATEST).
    """
    files = {p.name: _sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
    document = {
        "format": CHECKPOINT_FORMAT,
        "format_version": CHECKPOINT_VERSION,
        **manifest,
        "files": files,
    }
    with (tmp / "MANIFEST.json").open("w") as fh:
        json.dump(document, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    _fsync_dir(tmp)
    final = tmp.with_name(tmp.name.removesuffix(".tmp"))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    latest_tmp = directory / "LATEST.tmp"
    latest_tmp.write_text(final.name + "\n")
    with latest_tmp.open("rb") as fh:
        os.fsync(fh.fileno())
    os.replace(latest_tmp, directory / "LATEST")
    _fsync_dir(directory)
    sealed = sorted(
        (p for p in directory.glob("step-*") if p.is_dir() and not p.name.endswith(".tmp")),
        key=lambda p: int(p.name.split("-")[1]),
    )
    for old in sealed[:-_KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def read_latest(directory: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest sealed checkpoint and its manifest, or None if there is none.

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


def read_checkpoint(folder: Path) -> dict[str, Any]:
    """The manifest of a sealed `step-N` folder, after checking every file's sha256.

    Raises:
        ConfigError: If `folder` is missing, a file, or holds no manifest (not a checkpoint).
        RecsysError: If the manifest is not JSON, of another format or lacks a field, or a
            file is corrupt.
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
    _require(manifest_path, manifest, ("files",))
    for name, digest in manifest["files"].items():
        if _sha256(folder / name) != digest:
            raise RecsysError(f"{folder / name}: sha256 mismatch; the checkpoint is corrupt")
    return manifest


def _require(manifest_path: Path, manifest: dict[str, Any], fields: tuple[str, ...]) -> None:
    """Raise RecsysError naming the manifest's missing or malformed fields."""
    compat = manifest.get("compat")
    checks = {
        "files": isinstance(manifest.get("files"), dict),
        "world_size": isinstance(manifest.get("world_size"), int),
        "compat": isinstance(compat, dict),
        "compat.embedding_dim": isinstance(compat, dict) and "embedding_dim" in compat,
    }
    lacking = [field for field in fields if not checks[field]]
    if lacking:
        raise RecsysError(
            f"{manifest_path}: missing or malformed {lacking}; the checkpoint is damaged or "
            "from another version; use an older step-S"
        )


def export_tables(checkpoint: Path, out_path: Path) -> dict[str, int]:
    """Write every trained row of a checkpoint as (ids, vectors) per table, one shard-free file.

    The result is an `.npz` with `ids{t}` (int64, sorted) and `vectors{t}` (float32, (N, E))
    for each table t; rows never updated keep their seeded initial value and are not listed.

    Args:
        checkpoint: A sealed `step-N` folder, or a checkpoint folder (its LATEST is used).
        out_path: The `.npz` file to write.

    Returns:
        Rows written per table, keyed `table{t}`.

    Raises:
        RecsysError: If there is no sealed checkpoint there or its files fail their sha256.
    """
    found = read_latest(checkpoint)
    if found is not None:
        folder, manifest = found
    else:
        folder, manifest = checkpoint, read_checkpoint(checkpoint)
    _require(folder / "MANIFEST.json", manifest, ("world_size", "compat", "compat.embedding_dim"))
    embedding_dim = int(manifest["compat"]["embedding_dim"])
    per_table: dict[int, list[tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]]] = {}
    for rank in range(int(manifest["world_size"])):
        with np.load(folder / f"shard{rank}.npz") as data:
            t = 0
            while f"ids{t}" in data:
                rows = data[f"rows{t}"][:, :embedding_dim].astype(np.float32)
                per_table.setdefault(t, []).append((data[f"ids{t}"], rows))
                t += 1
    arrays: dict[str, npt.NDArray[Any]] = {}
    counts = {}
    for t, parts in sorted(per_table.items()):
        ids = np.concatenate([p[0] for p in parts])
        vectors = np.concatenate([p[1] for p in parts])
        order = np.argsort(ids, kind="stable")
        arrays[f"ids{t}"], arrays[f"vectors{t}"] = ids[order], vectors[order]
        counts[f"table{t}"] = len(ids)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with out_path.open("wb") as fh:
        np.savez(fh, **arrays)  # type: ignore[arg-type]  # numpy's stub wants positional arrays
    return counts
