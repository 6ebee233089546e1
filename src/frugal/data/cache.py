"""The parsed-dataset cache under `$FRUGAL_CACHE` (default `~/.cache/frugal`).

Every write goes to a temporary file in the target folder and is renamed into place, so a
crash or a full disk never leaves a half-written cache entry behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["atomic_write", "atomic_write_bytes", "cache_root"]

CACHE_ENV = "FRUGAL_CACHE"


def cache_root() -> Path:
    """Return the cache folder: `$FRUGAL_CACHE`, else `~/.cache/frugal` (not created here)."""
    configured = os.environ.get(CACHE_ENV, "").strip()
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "frugal"


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Create `path` atomically: `write` fills a temporary sibling, which is then renamed.

    Args:
        path: Final location; its folder is created if needed.
        write: Called with the temporary path; must write the complete file there.

    Raises:
        OSError: If the folder cannot be created or the write fails; the temporary file is
            removed and `path` is left as it was.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual mode
        write(tmp)
        with tmp.open("rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically (see `atomic_write`).

    Raises:
        OSError: If the write fails; `path` is left as it was.
    """

    def write(tmp: Path) -> None:
        tmp.write_bytes(data)

    atomic_write(path, write)
