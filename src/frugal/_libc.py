"""glibc allocator settings for the bench children (no-ops where there is no glibc), and RAM."""

from __future__ import annotations

import ctypes
import ctypes.util
import os

__all__ = ["fixed_mmap_threshold", "keep_freed_memory", "physical_memory_bytes"]

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
