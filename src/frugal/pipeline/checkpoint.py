"""Pipeline checkpoints: every rank's whole training state, committed together, resumed exactly.

A checkpoint of step N (N optimizer steps done) is a folder `step-<N>` under the job's
checkpoint folder. Each rank writes its own files there:

- `rank<r>.pt`: its stage's weights and optimizer state (AdamW's moments), the data cursor
  (N: the sample order is a function of the step), the data-parallel method's state (its
  error-feedback residuals, qadam's moments), the torch RNG state and what it measured so
  far (losses, step times), so a resumed job reports the whole run;
- `rank<r>.<link>.<part>.ids.npy` / `.rows.npy`: every per-example buffer of its pipeline
  links (AQ-SGD's activation buffers on both sides of each link, gradient error-feedback
  residuals), read and written through the `ActivationBuffer` protocol in chunks, so any
  backend (RAM, memmap, `frugal.store`) is saved and restored the same way.

Every file is written to a temporary name and renamed. After every rank has written, rank 0
writes `COMPLETE` (the job's fingerprint) and only then removes the older checkpoints, so a
crash at any moment leaves the last complete checkpoint intact and an incomplete one is never
read. A job (re)started with the same settings resumes from the newest complete checkpoint:
on CPU its loss curve equals the uninterrupted one bit for bit (a test checks it under a
`kill -9` and torchrun's `--max-restarts`). A checkpoint of another model, codec or batch is
refused by name (`CheckpointMismatchError`).

**Another plan** (after `frugal plan --replan`: hosts left or joined, so other ranks, replicas
or world size) resumes too, when it splits the layers into the same stages and keeps the
global batch: `COMPLETE` records the layout that wrote the checkpoint, and each new rank
(replica j, stage i) loads its stage's weights, optimizer state, RNG and statistics from the
old rank of stage i in replica min(j, old replicas - 1) (replicas of a stage hold the same
weights and optimizer state), and merges the per-example buffers of *every* old rank of stage
i (each example's AQ-SGD buffers were on one old replica; after the change another replica
may see it). A data-parallel method's own state (error-feedback residuals) is per replica and
starts afresh. The data cursor is the step; each replica of the new layout reads its own
shard from there (the same shards when the replica count is the same).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from frugal import FrugalError
from frugal.comm.buffers import ActivationBuffer
from frugal.config import config_to_dict

if TYPE_CHECKING:
    from frugal.pipeline.runtime import StageRunner
    from frugal.pipeline.train import PipelineTrainConfig

__all__ = [
    "CHECKPOINT_FORMAT",
    "RELAYOUT_SETTINGS",
    "RESUMABLE_SETTINGS",
    "CheckpointMismatchError",
    "commit_checkpoint",
    "fingerprint",
    "latest_checkpoint",
    "load_stage",
    "relayout_sources",
    "remove_incomplete",
    "save_stage",
    "saved_layout",
]

CHECKPOINT_FORMAT = 1
"""Version of the checkpoint layout; a checkpoint of another version is refused."""

RESUMABLE_SETTINGS = frozenset(
    {
        "steps",
        "checkpoint_every",
        "checkpoint_dir",
        "max_restarts",
        "comm_timeout_s",
        "bandwidth_mbps",
        "rho",
        "latency_ms",
        "calibrate_steps",
        "buffer_backend",
        "buffer_dir",
        "buffer_budget_mib",
        "prepost_receives",
        "drift_check_every",
    }
)
"""Settings a resumed job may change: train longer, other links, buffers elsewhere, the
checkpoint folder moved or copied."""

RELAYOUT_SETTINGS = frozenset({"layout", "plan"})
"""Fingerprint entries a job on another plan may change (`relayout_sources` checks the rest)."""

_CHUNK_ROWS = 4096
_LINKS = ("act_out", "act_in", "grad_out", "grad_in")


class CheckpointMismatchError(FrugalError):
    """The checkpoint folder holds another job's checkpoint (names the settings that differ)."""


def fingerprint(config: PipelineTrainConfig, run_label: str, layout: str) -> dict[str, str]:
    """What a checkpoint must match to be resumed: a digest per setting that shapes training.

    Settings in `RESUMABLE_SETTINGS` are left out; the run's label and the layout (stages,
    replicas, blocks per stage) are in.
    """
    settings = {k: v for k, v in config_to_dict(config).items() if k not in RESUMABLE_SETTINGS}
    digests = {
        key: hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]
        for key, value in settings.items()
    }
    return digests | {"run": run_label, "layout": layout, "format": str(CHECKPOINT_FORMAT)}


def _step_folders(root: Path) -> Iterator[tuple[int, Path]]:
    if root.is_dir():
        for path in root.glob("step-*"):
            suffix = path.name.removeprefix("step-")
            if path.is_dir() and suffix.isdigit():
                yield int(suffix), path


def latest_checkpoint(
    root: Path, expected: dict[str, str], *, relayout: bool = False
) -> tuple[int, Path] | None:
    """The newest complete checkpoint under `root` as (step, folder), or None.

    Args:
        root: The job's checkpoint folder.
        expected: The resuming job's `fingerprint`.
        relayout: Accept a checkpoint whose layout and plan differ (`RELAYOUT_SETTINGS`)
            when it recorded its layout; the caller then maps ranks with `relayout_sources`.

    Raises:
        CheckpointMismatchError: If the newest complete checkpoint was made by a job with
            other settings (the message names them and the fix).
    """
    complete = sorted(
        (step, path) for step, path in _step_folders(root) if (path / "COMPLETE").is_file()
    )
    if not complete:
        return None
    step, path = complete[-1]
    saved = json.loads((path / "COMPLETE").read_text())["fingerprint"]
    differing = sorted(k for k in set(saved) | set(expected) if saved.get(k) != expected.get(k))
    if differing and relayout and set(differing) <= RELAYOUT_SETTINGS:
        if saved_layout(path) is not None:
            return step, path
        raise CheckpointMismatchError(
            f"{path} was written on another plan by a frugal that did not record its layout; "
            "resume it on the plan it was made with, or start fresh in another folder"
        )
    if differing:
        raise CheckpointMismatchError(
            f"{path} was written by a job with other {', '.join(differing)}; resume with the "
            f"settings it was made with, or start fresh in another folder (or delete {root})"
        )
    return step, path


def saved_layout(folder: Path) -> dict[str, Any] | None:
    """The layout (mesh, layers, num_microbatches) that wrote a complete checkpoint, if known."""
    layout: dict[str, Any] | None = json.loads((folder / "COMPLETE").read_text()).get("layout")
    return layout


def relayout_sources(
    saved: dict[str, Any],
    *,
    layers: tuple[int, ...],
    num_microbatches: tuple[int, ...],
    replica: int,
    stage: int,
) -> tuple[int, tuple[int, ...]]:
    """Where rank (replica, stage) of a job on another plan reads a checkpoint from.

    Args:
        saved: `saved_layout` of the checkpoint.
        layers: Layers per stage of the new layout.
        num_microbatches: Micro-batches per replica of the new layout.
        replica: The rank's replica j in the new layout.
        stage: The rank's stage i.

    Returns:
        (source, buffer_ranks): the old rank whose stage state it loads (stage i of replica
        min(j, old replicas - 1)) and every old rank of stage i (their buffers are merged).

    Raises:
        CheckpointMismatchError: If the stages split the layers differently or the global
            batch (micro-batches per step summed over replicas) changed.
    """
    old_layers = tuple(saved["layers"])
    if old_layers != tuple(layers):
        raise CheckpointMismatchError(
            f"the checkpoint's stages hold {list(old_layers)} layers but the new plan's "
            f"{list(layers)}; a job resumes on another plan only with the same stages: re-plan "
            "with `frugal plan --replan` (it keeps the split when speeds are equal) or set the "
            "plan's num_layers_per_stage"
        )
    if sum(saved["num_microbatches"]) != sum(num_microbatches):
        raise CheckpointMismatchError(
            f"the checkpoint's step has {sum(saved['num_microbatches'])} micro-batches over its "
            f"replicas but the new plan's {sum(num_microbatches)}; keep the global batch "
            "(workload.global_batch_size) when re-planning, or start fresh"
        )
    mesh = [list(row) for row in saved["mesh"]]
    source = mesh[min(replica, len(mesh) - 1)][stage]
    return int(source), tuple(int(row[stage]) for row in mesh)


def _atomic(path: Path, write: Any) -> None:
    """`write(tmp)` then rename to `path` (tmp keeps the suffix: np.save appends .npy)."""
    tmp = path.with_name(f".tmp-{path.name}")
    write(tmp)
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _buffers(runner: StageRunner) -> Iterator[tuple[str, Any]]:
    """(name, codec part) of every per-example buffer owner of the runner's links."""
    for link in _LINKS:
        codec = getattr(runner, link)
        if codec.delta is not None:
            yield f"{link}.delta", codec.delta
        if codec.feedback is not None:
            yield f"{link}.feedback", codec.feedback


def _current(part: Any) -> ActivationBuffer | None:
    """A DeltaCodec's `buffer` or an ErrorFeedbackCodec's `residual` (None before any use)."""
    buffer: ActivationBuffer | None = (
        part.buffer if hasattr(part, "buffer") else getattr(part, "residual", None)
    )
    return buffer


def _save_buffer(buffer: ActivationBuffer, stem: Path) -> None:
    ids = buffer.seen_ids().to(torch.int64)
    rows_shape = (int(ids.numel()), *buffer.peek(ids[:1]).shape[1:]) if ids.numel() else (0,)
    _atomic(stem.with_name(stem.name + ".ids.npy"), lambda p: np.save(p, ids.numpy()))

    def write_rows(path: Path) -> None:
        rows = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=rows_shape)
        for start in range(0, rows_shape[0], _CHUNK_ROWS):
            chunk = ids[start : start + _CHUNK_ROWS]
            rows[start : start + len(chunk)] = buffer.peek(chunk).cpu().numpy()
        rows.flush()
        del rows

    _atomic(stem.with_name(stem.name + ".rows.npy"), write_rows)


def _load_buffer(
    part: Any, stem: Path, step: int, buffer: ActivationBuffer | None = None
) -> ActivationBuffer | None:
    """Write a saved buffer's rows into `buffer` (a fresh one from `part` if None).

    Returns the buffer written to (None if nothing was saved and none was given), so the
    buffers of several ranks merge into one.
    """
    ids = np.load(stem.with_name(stem.name + ".ids.npy"))
    rows = np.load(stem.with_name(stem.name + ".rows.npy"), mmap_mode="r")
    if len(ids) == 0:
        return buffer
    if buffer is None:
        buffer = part.restore_buffer(tuple(rows.shape[1:]))
    for start in range(0, len(ids), _CHUNK_ROWS):
        chunk = torch.from_numpy(np.ascontiguousarray(ids[start : start + _CHUNK_ROWS]))
        values = torch.from_numpy(np.array(rows[start : start + _CHUNK_ROWS], dtype=np.float32))
        buffer.write(chunk, values, step)
    return buffer


def save_stage(
    folder: Path, rank: int, runner: StageRunner, *, step: int, extra: dict[str, Any]
) -> None:
    """Write rank `rank`'s state after `step` optimizer steps into `folder` (created).

    Args:
        folder: The checkpoint's `step-<N>` folder.
        rank: This process's rank.
        runner: The stage's runner (weights, optimizer, link buffers, DP state, stats).
        step: Optimizer steps done (the data cursor).
        extra: More JSON-able values to restore (e.g. the eval loss before training).

    Raises:
        OSError: If the folder cannot be written (the last complete checkpoint is kept).
    """
    folder.mkdir(parents=True, exist_ok=True)
    sync = runner.dp_sync
    state = {
        "format": CHECKPOINT_FORMAT,
        "step": step,
        "module": {name: p.detach().clone() for name, p in runner.module.named_parameters()},
        "optimizer": runner.optimizer.state_dict(),
        "dp": sync.spec.state_dict(sync) if sync is not None else {},
        "rng": torch.get_rng_state(),
        "stats": dataclasses.asdict(runner.stats),
        "extra": json.dumps(extra),
        "buffers": [name for name, part in _buffers(runner) if _current(part) is not None],
    }
    _atomic(folder / f"rank{rank}.pt", lambda p: torch.save(state, p))
    for name, part in _buffers(runner):
        buffer = _current(part)
        if buffer is not None:
            _save_buffer(buffer, folder / f"rank{rank}.{name}")


def load_stage(
    folder: Path, rank: int, runner: StageRunner, *, buffer_ranks: tuple[int, ...] | None = None
) -> tuple[int, dict[str, Any]]:
    """Restore rank `rank`'s state from `folder` into a fresh runner.

    Args:
        folder: The checkpoint's `step-<N>` folder.
        rank: The rank whose state is read (on another plan: `relayout_sources`' source).
        runner: The fresh stage runner to restore into.
        buffer_ranks: On another plan, the old ranks whose per-example buffers are merged
            (their ids are disjoint); the data-parallel method's state is then not restored
            (it is per replica). None: this rank's own, all of it.

    Returns:
        (step, extra): the optimizer steps done and the `extra` values saved.

    Raises:
        CheckpointMismatchError: If the files are of another checkpoint format or stage.
        OSError: If a file is missing or unreadable.
    """
    from frugal.pipeline.runtime import StageStats

    state = torch.load(folder / f"rank{rank}.pt", map_location="cpu", weights_only=True)
    if state.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointMismatchError(
            f"{folder}: checkpoint format {state.get('format')}, this frugal reads "
            f"{CHECKPOINT_FORMAT}; resume with the frugal that wrote it or start fresh"
        )
    params = dict(runner.module.named_parameters())
    saved = state["module"]
    wrong = sorted(
        set(params) ^ set(saved)
        | {k for k in params.keys() & saved.keys() if params[k].shape != saved[k].shape}
    )
    if wrong:
        raise CheckpointMismatchError(
            f"{folder}/rank{rank}.pt does not fit this rank's stage (parameters {wrong[:3]} "
            "differ); start fresh in another folder"
        )
    with torch.no_grad():
        for name, value in saved.items():
            params[name].copy_(value)
    runner.optimizer.load_state_dict(state["optimizer"])
    if runner.dp_sync is not None and buffer_ranks is None:
        runner.dp_sync.spec.load_state_dict(runner.dp_sync, state["dp"])
    torch.set_rng_state(state["rng"])
    runner.stats = StageStats(**state["stats"])
    step = int(state["step"])
    parts = dict(_buffers(runner))
    for name in state["buffers"]:
        merged: ActivationBuffer | None = None
        for owner in (rank,) if buffer_ranks is None else buffer_ranks:
            stem = folder / f"rank{owner}.{name}"
            if stem.with_name(stem.name + ".ids.npy").is_file():
                merged = _load_buffer(parts[name], stem, step, merged)
    return step, json.loads(state["extra"])


def commit_checkpoint(
    root: Path,
    step: int,
    world_size: int,
    expected: dict[str, str],
    *,
    keep: int = 1,
    layout: dict[str, Any] | None = None,
) -> None:
    """Mark `root/step-<step>` complete and remove all but the `keep` newest complete ones.

    Called by rank 0 once every rank's `save_stage` has returned (after a barrier).
    `layout` ({"mesh", "layers", "num_microbatches"}) lets a job on another plan resume it.

    Raises:
        FileNotFoundError: If a rank's file is missing (nothing is marked complete then).
    """
    folder = root / f"step-{step:08d}"
    missing = [r for r in range(world_size) if not (folder / f"rank{r}.pt").is_file()]
    if missing:
        raise FileNotFoundError(f"{folder}: ranks {missing} wrote no checkpoint")
    marker = {"step": step, "world_size": world_size, "fingerprint": expected}
    if layout is not None:
        marker["layout"] = layout
    _atomic(folder / "COMPLETE", lambda p: p.write_text(json.dumps(marker)))
    complete = sorted(s for s, p in _step_folders(root) if (p / "COMPLETE").is_file())
    for old, path in _step_folders(root):
        if old < step and old not in complete[-keep:]:
            shutil.rmtree(path, ignore_errors=True)


def remove_incomplete(root: Path, after: int) -> None:
    """Remove checkpoint folders newer than step `after` that never completed (rank 0)."""
    for step, path in _step_folders(root):
        if step > after and not (path / "COMPLETE").is_file():
            shutil.rmtree(path, ignore_errors=True)
