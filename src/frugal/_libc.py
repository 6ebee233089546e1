"""glibc settings: allocator tuning for bench children, RAM, and dying with a launcher.

No-ops where there is no glibc (or no Linux `prctl`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal

__all__ = [
    "LAUNCH_ENV",
    "die_with_launcher",
    "die_with_parent",
    "fixed_mmap_threshold",
    "keep_freed_memory",
    "physical_memory_bytes",
]

LAUNCH_ENV = "FRUGAL_LAUNCH_ID"
"""Environment variable holding the marker of a launch by `frugal.launch.run_torchrun`."""

_PR_SET_PDEATHSIG = 1

try:  # the running program's own symbols (libc's among them): no lookup, safe after fork
    _PROCESS_SYMBOLS: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:
    _PROCESS_SYMBOLS = None

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4


def _mallopt(*settings: tuple[int, int]) -> bool:
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        return all(bool(libc.mallopt(param, value)) for param, value in settings)
    except (OSError, AttributeError):
        return False


def fixed_mmap_threshold(threshold_bytes: int = 128 << 10) -> bool:
    """Pin glibc's mmap threshold (mallopt M_MMAP_THRESHOLD) so freed buffers leave RSS.

    glibc raises the threshold each time a large block is freed, after which multi-MiB
    temporaries come from the heap and stay resident after use: RSS then overstates what a
    process holds. Returns False where there is no glibc.
    """
    return _mallopt((_M_MMAP_THRESHOLD, threshold_bytes))


def keep_freed_memory() -> bool:
    """Serve every allocation from the heap and never trim it (M_MMAP_MAX 0, no trim).

    Blocks over 32 MiB otherwise always come from mmap and go back to the kernel on free,
    so a training loop that allocates the same 100 MiB temporaries every batch page-faults
    them in again each time (TGAT under Benchtemp's settings: 3 s of 15 s in the kernel).
    Peak RSS is unchanged; RSS no longer falls after a peak. Returns False where there is
    no glibc.
    """
    return _mallopt((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, 1 << 40))


def physical_memory_bytes() -> int:
    """This machine's physical memory (sysconf), or 2^62 where it cannot be read."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def die_with_parent(signum: int = signal.SIGKILL, parent_pid: int | None = None) -> bool:
    """Have the kernel send `signum` to this process when its parent exits (Linux prctl).

    Safe in a `subprocess.Popen` `preexec_fn` (no library lookup, no allocation of note).
    Without it, `kill -9` of a launcher leaves its children running on: torchrun's agent and
    its workers live in their own sessions, so they keep training (and writing checkpoints)
    beside a resumed run.

    `parent_pid` is the pid the parent had before the fork (`os.getpid()` there): if the
    parent already died before prctl was armed, the process is re-parented, the signal would
    never come, so it sends `signum` to itself at once. Without `parent_pid` that check can
    only compare with the parent seen on entry, which misses a parent that died between the
    fork and this call. Returns False where prctl is missing (nothing changes).
    """
    prctl = getattr(_PROCESS_SYMBOLS, "prctl", None)
    if prctl is None:
        return False
    parent = os.getppid() if parent_pid is None else parent_pid
    if prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:  # the parent died before prctl: the signal will never come
        os.kill(os.getpid(), signum)
    return True


def die_with_launcher() -> bool:
    """`die_with_parent()` in a torchrun worker that `frugal.launch.run_torchrun` started.

    Recognised by `LAUNCH_ENV` and torchrun's `LOCAL_RANK` in the environment; anywhere else
    (a user's own torchrun, a plain script) nothing changes and False is returned.
    """
    if LAUNCH_ENV in os.environ and "LOCAL_RANK" in os.environ:
        return die_with_parent()
    return False
