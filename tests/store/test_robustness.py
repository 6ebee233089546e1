"""Bad budgets, flipped bytes in the index and MANIFEST: a clear error, never a wrong row."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from frugal.store import (
    EmbeddingStore,
    OptimizerConfig,
    RowSpec,
)

MIB = 1 << 20


@pytest.mark.parametrize(
    ("num_rows", "embedding_dim", "optimizer", "key_space", "backend"),
    [
        (1_000_000, 64, "adam", "dense", "file"),  # the case of the issue: 4,184,832 refused
        (1_000_000, 16, "adagrad", "hashed", "file"),
        (300_000, 8, "sgd", "dense", "file"),
        (200_000, 32, "adam", "hashed", "rocksdb"),  # RocksDB's share grows with the budget
    ],
)
def test_the_minimum_budget_an_error_names_is_accepted(
    tmp_path: Path,
    num_rows: int,
    embedding_dim: int,
    optimizer: str,
    key_space: str,
    backend: str,
) -> None:
    spec = RowSpec(embedding_dim=embedding_dim, optimizer=OptimizerConfig(kind=optimizer))

    def create(name: str, budget: int) -> EmbeddingStore:
        config = EmbeddingStore.Config(backend=backend, memory_budget_bytes=budget)
        return EmbeddingStore.create(
            tmp_path / name,
            num_rows=num_rows,
            spec=spec,
            config=config,
            key_space=key_space,  # type: ignore[arg-type]
        )

    with pytest.raises(ValueError, match="set it to at least") as refused:
        create("small", 1 * MIB)
    match = re.search(r"at least (\d+)", str(refused.value))
    assert match is not None
    minimum = int(match.group(1))
    with create("minimum", minimum) as store:  # the suggestion is accepted...
        assert store.cache.capacity >= 64
        assert store.stats()["memory_budget_bytes"] == minimum
    with pytest.raises(ValueError, match=f"at least {minimum}"):  # ...and is the smallest
        create("one_less", minimum - 1)
