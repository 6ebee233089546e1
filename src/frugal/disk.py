"""A full disk as one clear error: which path, how much space was needed and how much is free.

Long-running commands write checkpoints, journals and results as they go. When the disk fills
up, the write that fails raises `OSError` (ENOSPC, EDQUOT, or EFBIG under a file-size limit)
naming neither what was being written nor how much space it needed. `check_free_space` refuses
a write that cannot fit before it starts; `disk_full_error` turns the `OSError` of one that
failed anyway into a `DiskFullError` that says what is intact and what to do.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

from frugal import FrugalError

__all__ = [
    "DiskFullError",
    "check_free_space",
    "disk_filled_error",
    "disk_full_error",
    "free_bytes",
    "guard_write",
    "human_bytes",
    "is_disk_full",
    "make_folder",
    "mentions_disk_full",
]

_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_NUMPY_SHORT_WRITE = re.compile(r"Not enough free space to write|\d+ requested and \d+ written")
_DISK_FULL_TEXT = re.compile(
    "|".join(re.escape(os.strerror(code)) for code in sorted(_DISK_FULL_ERRNOS))
    + f"|{_NUMPY_SHORT_WRITE.pattern}"
    + r"|the disk holding .+ is full"  # frugal's own words (DiskFullError, the store)
)
_FIX = "free space there or choose a folder on a larger disk"


class DiskFullError(FrugalError):
    """A write did not fit on its disk (or under the process's file-size limit).

    Attributes:
        path: What was being written (a file or folder).
        needed_bytes: Bytes the write needed (an estimate, a lower bound from
            `disk_filled_error`, or None when unknown).
        free_bytes: Bytes free on the path's file system when the error was raised.
    """

    def __init__(
        self, message: str, *, path: Path, needed_bytes: int | None, free_bytes: int
    ) -> None:
        super().__init__(message)
        self.path = path
        self.needed_bytes = needed_bytes
        self.free_bytes = free_bytes


def lock_file(path: Path) -> int | str:
    """Take an exclusive `flock` on `path` (created if absent) and write this pid into it.

    The lock lasts until the returned descriptor is closed or the process dies (the kernel
    drops it then), so a crashed holder never leaves a stale lock.

    Returns:
        The open descriptor holding the lock, or, if another process holds it, that
        process's id as written in the file ("unknown" if it wrote none).
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        return holder
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def is_disk_full(exc: BaseException) -> bool:
    """True for an `OSError` of a full disk, an exhausted quota or a file-size limit.

    numpy's `save`/`tofile` report a full disk without an errno ("Not enough free space to
    write N bytes", "N requested and M written"); those count too.
    """
    if not isinstance(exc, OSError):
        return False
    if exc.errno is None:
        return _NUMPY_SHORT_WRITE.search(str(exc)) is not None
    return exc.errno in _DISK_FULL_ERRNOS


def mentions_disk_full(text: str) -> bool:
    """True if an error's text reports a full disk, a quota or a file-size limit.

    For errors that reach us as text: a child process's failure, or an engine's own exception
    that wraps the OS error (RocksDB's `IO error: No space left on device`, the store's
    background write-back error). Matches the C library's message of ENOSPC, EDQUOT and EFBIG
    and numpy's short-write messages.
    """
    return _DISK_FULL_TEXT.search(text) is not None


def make_folder(path: Path, *, what: str, error: type[ValueError] = ValueError) -> Path:
    """Create the folder `path` (with its parents) or say in one line why it cannot be.

    Args:
        path: The folder; an existing folder is fine.
        what: How the error names the path, e.g. "--out" or "the store folder".
        error: The error class raised (a `ConfigError` for a command's flag).

    Returns:
        `path`.

    Raises:
        ValueError: (`error`) If `path` is an existing file or the folder cannot be created.
    """
    if path.exists() and not path.is_dir():
        raise error(f"{what} {path} is a file; give a folder (it is created if missing)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise error(
            f"{what} {path}: cannot create the folder ({exc.strerror}); choose a writable path"
        ) from exc
    return path


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


def _message(
    what: str, path: Path, needed: int | None, free: int, kept: str, fix: str, bound: str = "about"
) -> str:
    need = f"{bound} {human_bytes(needed)} needed, " if needed is not None else ""
    tail = f"; {kept}" if kept else ""
    return f"{what}: the disk holding {path} is full ({need}{human_bytes(free)} free){tail}; {fix}"


def check_free_space(
    path: Path,
    needed_bytes: int,
    *,
    what: str,
    kept: str = "",
    fix: str = _FIX,
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
    fix: str = _FIX,
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


def disk_filled_error(
    path: Path,
    *,
    what: str,
    written_bytes: int,
    detail: str,
    kept: str = "",
    fix: str = _FIX,
) -> DiskFullError:
    """The `DiskFullError` of a write that filled the disk after `written_bytes` (as text).

    For a failure known only by its text (see `mentions_disk_full`), e.g. in a child process:
    the space it needed is unknown, but more than it had: more than what it had written when
    the disk filled up, and more than is free once what it left is removed (it had all of
    that). The message says so ("more than 7.4 MiB needed, 7.4 MiB free"). Call it after
    removing what the failed write left, so the free space it reports is what a rerun finds.

    Args:
        path: Where the write went.
        what: What was written, for the message.
        written_bytes: Bytes it had written when it failed (>= 0).
        detail: The failure's own text, appended in brackets.
        kept: What stays intact, for the message.
        fix: What to do.

    Returns:
        The error to raise.
    """
    free = free_bytes(path)
    needed = max(written_bytes, free)
    message = _message(what, path, needed, free, kept, fix, bound="more than")
    return DiskFullError(f"{message} [{detail}]", path=path, needed_bytes=needed, free_bytes=free)


@contextlib.contextmanager
def guard_write(
    path: Path,
    *,
    what: str,
    needed_bytes: int | None = None,
    kept: str = "",
    fix: str = _FIX,
    partial: Iterable[Path] = (),
) -> Iterator[None]:
    """Around a write under `path`: refuse it up front if it cannot fit, explain it if it fails.

    Args:
        path: The file or folder written.
        what: What is written, for the message.
        needed_bytes: Bytes the write takes, if known: checked against the free space first.
        kept: What stays intact, for the message.
        fix: What to do.
        partial: Files or folders the write may leave half-written; removed if it fails on a
            full disk, so the space they took is given back.

    Raises:
        DiskFullError: If the space is known to be too small, or the write fails with a full
            disk (the `OSError` is its cause). Any other `OSError` propagates unchanged.
    """
    leftovers = list(partial)
    try:
        if needed_bytes is not None:
            check_free_space(path, needed_bytes, what=what, kept=kept, fix=fix)
        yield
    except (OSError, DiskFullError) as exc:
        if isinstance(exc, OSError) and not is_disk_full(exc):
            raise
        for leftover in leftovers:
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)
        if isinstance(exc, DiskFullError):
            raise
        raise disk_full_error(
            exc, path, what=what, needed_bytes=needed_bytes, kept=kept, fix=fix
        ) from exc
