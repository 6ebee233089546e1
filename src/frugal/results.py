"""The `results.json` document every bench writes (format in ARCHITECTURE.md)."""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import frugal
from frugal.config import config_to_dict

__all__ = ["environment", "git_commit", "results_document", "write_results"]

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


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def results_document(
    benchmark: str, config: object, rows: list[dict[str, Any]], summary: dict[str, Any]
) -> dict[str, Any]:
    """Assemble a results document: metadata, resolved config, rows and summary.

    Raises:
        TypeError: If `config` is not a Config dataclass.
    """
    document: dict[str, Any] = _clean(
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
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)
