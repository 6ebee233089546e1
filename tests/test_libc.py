"""glibc settings: the bench children's allocator, and dying with a killed launcher."""

from __future__ import annotations

import ctypes.util
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

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


_GRANDCHILD = """
import os, sys, time
from frugal._libc import die_with_parent
parent = os.getpid()
pid = os.fork()
if pid == 0:
    if sys.argv[1] == "die":
        die_with_parent(parent_pid=parent)
    print(os.getpid(), flush=True)  # only once armed: a kill before this line would race
    time.sleep(60)
    os._exit(0)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("mode", ["die", "stay"])
def test_die_with_parent_ends_a_child_when_its_parent_is_killed(mode: str) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _GRANDCHILD, mode], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait(timeout=10)
    deadline = time.monotonic() + 5.0
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    survived = _alive(child)
    if survived:
        os.kill(child, signal.SIGKILL)
    # With die_with_parent the kernel kills it; without, it outlives its parent (the control).
    assert survived == (mode == "stay")


def test_die_with_parent_kills_at_once_when_the_parent_is_already_gone() -> None:
    # A parent pid that is not the current parent means the parent died before prctl was
    # armed: the process must end itself rather than wait for a signal that never comes.
    code = (
        "import os\nfrom frugal._libc import die_with_parent\n"
        "die_with_parent(parent_pid=os.getppid() + 1 if os.getppid() > 1 else 2)\n"
        "print('still alive')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    if "prctl" in done.stderr or platform.system() != "Linux":
        pytest.skip("needs Linux prctl")
    assert done.returncode == -signal.SIGKILL
    assert "still alive" not in done.stdout


def test_die_with_launcher_changes_nothing_outside_a_frugal_launch() -> None:
    code = "from frugal._libc import die_with_launcher\nprint(die_with_launcher())"
    env = {k: v for k, v in os.environ.items() if k not in ("FRUGAL_LAUNCH_ID", "LOCAL_RANK")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
        env={**env, "LOCAL_RANK": "0"},  # a user's own torchrun worker
    ).stdout.split()  # fmt: skip
    assert out == ["False"]
