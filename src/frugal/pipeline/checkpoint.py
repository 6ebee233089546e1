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
`kill -9` and torchrun's `--max-restarts`). A checkpoint of another model, plan, codec or
batch is refused by name (`CheckpointMismatchError`).
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
    "RESUMABLE_SETTINGS",
    "CheckpointMismatchError",
    "commit_checkpoint",
    "fingerprint",
    "latest_checkpoint",
    "load_stage",
    "remove_incomplete",
    "save_stage",
]

CHECKPOINT_FORMAT = 1
"""Version of the checkpoint layout; a checkpoint of another version is refused."""

RESUMABLE_SETTINGS = frozenset(
    {
        "steps",
        "checkpoint_every",
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
"""Settings a resumed job may change: train longer, other links, buffers elsewhere."""

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


def latest_checkpoint(root: Path, expected: dict[str, str]) -> tuple[int, Path] | None:
    """The newest complete checkpoint under `root` as (step, folder), or None.

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
    if differing:
        raise CheckpointMismatchError(
            f"{path} was written by a job with other {', '.join(differing)}; resume with the "
            f"settings it was made with, or start fresh in another folder (or delete {root})"
        )
    return step, path


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


def _load_buffer(part: Any, stem: Path, step: int) -> None:
    ids = np.load(stem.with_name(stem.name + ".ids.npy"))
    rows = np.load(stem.with_name(stem.name + ".rows.npy"), mmap_mode="r")
    if len(ids) == 0:
        return
    buffer = part.restore_buffer(tuple(rows.shape[1:]))
    for start in range(0, len(ids), _CHUNK_ROWS):
        chunk = torch.from_numpy(np.ascontiguousarray(ids[start : start + _CHUNK_ROWS]))
        values = torch.from_numpy(np.array(rows[start : start + _CHUNK_ROWS], dtype=np.float32))
        buffer.write(chunk, values, step)


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


def load_stage(folder: Path, rank: int, runner: StageRunner) -> tuple[int, dict[str, Any]]:
    """Restore rank `rank`'s state from `folder` into a fresh runner.

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
    if runner.dp_sync is not None:
        runner.dp_sync.spec.load_state_dict(runner.dp_sync, state["dp"])
    torch.set_rng_state(state["rng"])
    runner.stats = StageStats(**state["stats"])
    step = int(state["step"])
    parts = dict(_buffers(runner))
    for name in state["buffers"]:
        _load_buffer(parts[name], folder / f"rank{rank}.{name}", step)
    return step, json.loads(state["extra"])


def commit_checkpoint(
    root: Path, step: int, world_size: int, expected: dict[str, str], *, keep: int = 1
) -> None:
    """Mark `root/step-<step>` complete and remove all but the `keep` newest complete ones.

    Called by rank 0 once every rank's `save_stage` has returned (after a barrier).

    Raises:
        FileNotFoundError: If a rank's file is missing (nothing is marked complete then).
    """
    folder = root / f"step-{step:08d}"
    missing = [r for r in range(world_size) if not (folder / f"rank{r}.pt").is_file()]
    if missing:
        raise FileNotFoundError(f"{folder}: ranks {missing} wrote no checkpoint")
    marker = {"step": step, "world_size": world_size, "fingerprint": expected}
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
