"""A full disk as one clear error: which path, how much space was needed and how much is free.

Long-running commands write checkpoints, journals and results as they go. When the disk fills
up, the write that fails raises `OSError` (ENOSPC, EDQUOT, or EFBIG under a file-size limit)
naming neither what was being written nor how much space it needed. `check_free_space` refuses
a write that cannot fit before it starts; `disk_full_error` turns the `OSError` of one that
failed anyway into a `DiskFullError` that says what is intact and what to do.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from frugal import FrugalError

__all__ = [
    "DiskFullError",
    "check_free_space",
    "disk_full_error",
    "free_bytes",
    "human_bytes",
    "is_disk_full",
]

_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class DiskFullError(FrugalError):
    """A write did not fit on its disk (or under the process's file-size limit).

    Attributes:
        path: What was being written (a file or folder).
        needed_bytes: Bytes the write needed (an estimate; None when unknown).
        free_bytes: Bytes free on the path's file system when the error was raised.
    """

    def __init__(
        self, message: str, *, path: Path, needed_bytes: int | None, free_bytes: int
    ) -> None:
        super().__init__(message)
        self.path = path
        self.needed_bytes = needed_bytes
        self.free_bytes = free_bytes


def is_disk_full(exc: BaseException) -> bool:
    """True for an `OSError` of a full disk, an exhausted quota or a file-size limit."""
    return isinstance(exc, OSError) and exc.errno in _DISK_FULL_ERRNOS


def free_bytes(path: Path) -> int:
    """Bytes free for an unprivileged writer on the file system holding `path`.

    `path` need not exist: its nearest existing parent is measured. Returns 0 if none can be
    read.
    """
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return 0


def human_bytes(count: float) -> str:
    """`count` bytes as `12.3 MiB` (binary units, 3 significant digits)."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _message(what: str, path: Path, needed: int | None, free: int, kept: str, fix: str) -> str:
    need = f"about {human_bytes(needed)} needed, " if needed is not None else ""
    tail = f"; {kept}" if kept else ""
    return f"{what}: the disk holding {path} is full ({need}{human_bytes(free)} free){tail}; {fix}"


def check_free_space(
    path: Path,
    needed_bytes: int,
    *,
    what: str,
    kept: str = "",
    fix: str = "free space there or choose a folder on a larger disk",
) -> None:
    """Raise `DiskFullError` before writing `needed_bytes` under `path` if they cannot fit.

    Args:
        path: The file or folder about to be written (need not exist yet).
        needed_bytes: Bytes the write will take (>= 0).
        what: What is written, for the message ("recsys checkpoint step-40960").
        kept: What stays intact, for the message ("the last checkpoint step-20480 is intact").
        fix: What to do.

    Raises:
        DiskFullError: If the file system holding `path` has fewer than `needed_bytes` free.
    """
    free = free_bytes(path)
    if needed_bytes > free:
        raise DiskFullError(
            _message(what, path, needed_bytes, free, kept, fix),
            path=path,
            needed_bytes=needed_bytes,
            free_bytes=free,
        )


def disk_full_error(
    exc: OSError,
    path: Path,
    *,
    what: str,
    needed_bytes: int | None = None,
    kept: str = "",
    fix: str = "free space there or choose a folder on a larger disk",
) -> DiskFullError:
    """The `DiskFullError` for `exc`, a write under `path` that failed on a full disk.

    Args:
        exc: The `OSError` (see `is_disk_full`).
        path: What was being written.
        what: What is written, for the message.
        needed_bytes: Bytes the write needed, if known.
        kept: What stays intact, for the message.
        fix: What to do.

    Returns:
        The error to raise (`raise disk_full_error(...) from exc`).
    """
    free = free_bytes(path)
    reason = exc.strerror or str(exc)
    if exc.errno == errno.EFBIG:
        reason += " (a file-size limit, see `ulimit -f`)"
    message = _message(what, path, needed_bytes, free, kept, fix)
    return DiskFullError(
        f"{message} [{reason}: {exc.filename or path}]",
        path=path,
        needed_bytes=needed_bytes,
        free_bytes=free,
    )
