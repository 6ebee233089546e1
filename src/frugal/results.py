"""The `results.json` document every bench writes (format in ARCHITECTURE.md)."""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import json
import math
import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import frugal
from frugal.config import config_to_dict, config_to_json
from frugal.disk import guard_write

__all__ = [
    "BenchJournal",
    "clean_json",
    "environment",
    "git_commit",
    "results_document",
    "write_results",
    "write_text_atomically",
]

_GIT_TIMEOUT_S = 5.0


def git_commit() -> str | None:
    """The commit of the source tree frugal runs from, or None outside a git checkout."""
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def environment() -> dict[str, Any]:
    """Python, torch and numpy versions, CPU count and thread settings of this run."""
    import numpy

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }
    try:
        import torch

        env["torch"] = torch.__version__
        env["threads"] = torch.get_num_threads()
    except ImportError:  # pragma: no cover - torch is a dependency
        env["torch"] = None
    return env


def clean_json(value: Any) -> Any:
    """`value` with every non-finite float (JSON has no NaN/inf) replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    return value


def results_document(
    benchmark: str, config: object, rows: list[dict[str, Any]], summary: dict[str, Any]
) -> dict[str, Any]:
    """Assemble a results document: metadata, resolved config, rows and summary.

    Raises:
        TypeError: If `config` is not a Config dataclass.
    """
    document: dict[str, Any] = clean_json(
        {
            "benchmark": benchmark,
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "frugal_version": frugal.__version__,
            "git_commit": git_commit(),
            "env": environment(),
            "config": config_to_dict(config),
            "rows": rows,
            "summary": summary,
        }
    )
    return document


def write_results(path: Path, document: dict[str, Any]) -> None:
    """Write `document` as JSON to `path` (atomically: temporary file, then rename).

    Raises:
        OSError: If the file cannot be written.
    """
    write_text_atomically(path, json.dumps(document, indent=1, sort_keys=False) + "\n")


def write_text_atomically(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file of this process, then rename it.

    Readers see the old file or the whole new one, and processes writing the same path at
    once (benches sharing an output folder) do not take each other's temporary file.

    Raises:
        DiskFullError: If the disk holding `path` is full (the old file is left as it was).
        OSError: If the file cannot be written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    data = text.encode()
    try:
        with guard_write(path, what=f"writing {path.name}", needed_bytes=len(data)):
            tmp.write_bytes(data)
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # only left when the write or the rename failed


def _plain(value: Any) -> Any:
    """Numpy scalars and arrays as plain JSON data (`json.dumps(default=...)`)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON data")


def source_digest(folder: Path) -> str:
    """SHA-256 of the `.py` files under `folder` (relative paths and bytes, sorted by path).

    Equal for an editable checkout and an installed wheel of the same source, so a journal
    written by one resumes in the other; any edit changes it.
    """
    digest = hashlib.sha256()
    for file in sorted(folder.rglob("*.py"), key=lambda f: f.relative_to(folder).as_posix()):
        digest.update(file.relative_to(folder).as_posix().encode() + b"\0")
        digest.update(file.read_bytes() + b"\0")
    return digest.hexdigest()


class BenchJournal:
    """Finished cells of a long bench, appended to `runs.jsonl` so an interrupted run resumes.

    Each line is `{"config": key, "cell": name, "value": ...}`; `key` hashes the whole bench
    config and, when given, the source of the packages that shape the measurement, so a
    changed setting or changed code measures everything again. A line cut by a crash is
    skipped. A new output folder starts a fresh journal.
    """

    def __init__(self, path: Path, config: object, code: Sequence[Path] = ()) -> None:
        """Open (or start) the journal at `path` for `config` and the code under `code`.

        Args:
            path: The journal file (`runs.jsonl`).
            config: The bench's Config dataclass.
            code: Package folders whose `.py` files join the key (see `source_digest`).

        Raises:
            TypeError: If `config` is not a Config dataclass.
        """
        self.path = path
        digest = hashlib.sha256(config_to_json(config).encode())
        for folder in code:
            digest.update(source_digest(folder).encode())
        self.key = digest.hexdigest()[:16]
        self.finished: dict[str, Any] = {}
        if path.exists():
            text = path.read_text()
            if text and not text.endswith("\n"):
                with path.open("a") as handle:
                    handle.write("\n")  # end a line a crash cut, so the next record parses
            for line in text.splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue  # a line cut by a crash
                if isinstance(entry, dict) and entry.get("config") == self.key and "value" in entry:
                    self.finished[entry["cell"]] = entry["value"]

    def get(self, cell: str) -> Any | None:
        """The value recorded for `cell` under this config, or None."""
        return self.finished.get(cell)

    def record(self, cell: str, value: Any) -> None:
        """Append `cell`'s value (JSON data) and flush it to disk.

        The line goes out under an exclusive `flock` of the file, opened with `O_APPEND`, so
        benches that share an output folder (e.g. one seed each) append whole lines without
        interleaving, even where the kernel takes a long line in several `write` calls (seen
        once in CI: two processes' 200 KB lines interleaved into 51 lines of 50).
        """
        self.finished[cell] = value
        self.path.parent.mkdir(parents=True, exist_ok=True)
        entry = {"config": self.key, "cell": cell, "value": clean_json(value)}
        line = (json.dumps(entry, default=_plain) + "\n").encode()
        # A line cut by a full disk is skipped on reopening, like one cut by a crash.
        with guard_write(self.path, what=f"the bench journal {self.path}", needed_bytes=len(line)):
            descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX)  # released when the descriptor closes
                written = 0
                while written < len(line):  # a regular file takes it in one call; be safe
                    written += os.write(descriptor, line[written:])
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
