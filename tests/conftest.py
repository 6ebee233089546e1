"""Shared fixtures: every test session gets its own dataset cache, never ~/.cache/frugal."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def frugal_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Point $FRUGAL_CACHE at a fresh folder for the whole session."""
    cache = tmp_path_factory.mktemp("frugal-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FRUGAL_CACHE", str(cache))
        yield cache
