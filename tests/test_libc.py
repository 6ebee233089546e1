"""The glibc allocator settings used by the bench children."""

from __future__ import annotations

import ctypes.util
import platform
import subprocess
import sys

import pytest


@pytest.mark.skipif(ctypes.util.find_library("c") is None, reason="needs a C library")
def test_allocator_settings_are_accepted_by_glibc() -> None:
    # mallopt returns 0 for an unknown parameter or a refused value, so each setting
    # reports whether glibc took it; run in a child so this test process keeps its own.
    code = (
        "from frugal._libc import fixed_mmap_threshold, keep_freed_memory\n"
        "print(fixed_mmap_threshold(), keep_freed_memory())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    if platform.libc_ver()[0] == "glibc":
        assert out == ["True", "True"]
    else:
        assert set(out) <= {"True", "False"}
