"""Atomic writes: a failing writer never leaves a partial file or a temp file behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from frugal.data.cache import atomic_write, atomic_write_bytes, cache_root


def test_cache_root_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FRUGAL_CACHE", str(tmp_path / "c"))
    assert cache_root() == tmp_path / "c"
    monkeypatch.delenv("FRUGAL_CACHE")
    assert cache_root() == Path.home() / ".cache" / "frugal"


def test_failed_write_keeps_the_old_file_and_removes_the_temp(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "entry.bin"
    atomic_write_bytes(target, b"old")

    def half_write(tmp: Path) -> None:
        tmp.write_bytes(b"partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, half_write)
    assert target.read_bytes() == b"old"
    assert [p.name for p in target.parent.iterdir()] == ["entry.bin"]


def test_write_replaces_atomically(tmp_path: Path) -> None:
    target = tmp_path / "entry.bin"
    atomic_write_bytes(target, b"one")
    atomic_write_bytes(target, b"two")
    assert target.read_bytes() == b"two"
