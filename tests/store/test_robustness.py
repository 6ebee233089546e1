"""Bad budgets, flipped bytes in the index and MANIFEST: a clear error, never a wrong row."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from frugal.store import (
    EmbeddingStore,
    OptimizerConfig,
    RowSpec,
    StoreCorruptionError,
    init_rows,
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
    # the same minimum, computed before any store exists
    ahead = EmbeddingStore.minimum_budget_bytes(
        num_rows=num_rows,
        spec=spec,
        config=EmbeddingStore.Config(backend=backend),
        key_space=key_space,  # type: ignore[arg-type]
    )
    assert ahead == minimum
    with create("minimum", minimum) as store:  # the suggestion is accepted...
        assert store.cache.capacity >= 64
        assert store.stats()["memory_budget_bytes"] == minimum
    with pytest.raises(ValueError, match=f"at least {minimum}"):  # ...and is the smallest
        create("one_less", minimum - 1)


SPEC = RowSpec(embedding_dim=4, optimizer=OptimizerConfig(kind="sgd"))
ROW = np.full((1, 4), 7.0, np.float32)


def _store_with_row_42(directory: Path, backend: str, key_space: str = "dense") -> None:
    """A checkpointed 16-row store whose row 10 (hashed key space: key 42) holds 7.0."""
    config = EmbeddingStore.Config(backend=backend, memory_budget_bytes=1 * MIB)
    key = 42 if key_space == "hashed" else 10
    with EmbeddingStore.create(
        directory,
        num_rows=16,
        spec=SPEC,
        config=config,
        key_space=key_space,  # type: ignore[arg-type]
    ) as store:
        store.put(np.array([key]), ROW)


def _flip(path: Path, position: int) -> bytes:
    original = path.read_bytes()
    blob = bytearray(original)
    blob[position] ^= 0x01
    path.write_bytes(bytes(blob))
    return original


@pytest.mark.parametrize(
    ("backend", "key_space", "index_file"),
    [
        ("file", "dense", "index.1.npy"),  # record address per row
        ("file", "hashed", "keys.1.npy"),  # key of each row
        ("memory", "dense", "written.1.npy"),  # which rows hold stored values
    ],
)
def test_every_flipped_byte_of_an_index_file_is_refused_at_open(
    tmp_path: Path, backend: str, key_space: str, index_file: str
) -> None:
    directory = tmp_path / "s"
    _store_with_row_42(directory, backend, key_space)
    path = directory / index_file
    size = path.stat().st_size  # a .npy: 128-byte header, then the array
    for position in range(0, size, 3):  # every 3rd byte: header and entries, under 1 s
        original = _flip(path, position)
        with pytest.raises(StoreCorruptionError, match=rf"{index_file}: sha256 .* restore"):
            EmbeddingStore.open(directory)
        path.write_bytes(original)
    config = EmbeddingStore.Config(backend=backend, memory_budget_bytes=1 * MIB)
    with EmbeddingStore.open(directory, config) as store:  # intact again: the row is back
        assert np.array_equal(store.peek(np.array([42 if key_space == "hashed" else 10])), ROW)


def test_an_index_that_forgets_a_written_row_is_refused(tmp_path: Path) -> None:
    # Before checksums, index.1.npy with row 10's address set to -1 (a valid .npy) made the
    # store return row 10's initial value instead of the 7.0 written to it.
    directory = tmp_path / "s"
    _store_with_row_42(directory, "file")
    index = np.load(directory / "index.1.npy")
    index[10] = -1
    np.save(directory / "index.1.npy", index)
    with pytest.raises(StoreCorruptionError, match=r"index\.1\.npy: sha256"):
        EmbeddingStore.open(directory)
    (directory / "index.1.npy").unlink()
    with pytest.raises(StoreCorruptionError, match=r"index\.1\.npy: a file of checkpoint 1 is"):
        EmbeddingStore.open(directory)


def test_every_flipped_byte_of_the_manifest_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    _store_with_row_42(directory, "file")
    path = directory / "MANIFEST"
    for position in range(0, path.stat().st_size, 5):  # every 5th byte: keys and values
        original = _flip(path, position)
        with pytest.raises(StoreCorruptionError, match=r"MANIFEST.*restore the store folder"):
            EmbeddingStore.open(directory)
        path.write_bytes(original)
    with EmbeddingStore.open(directory) as store:
        assert np.array_equal(store.peek(np.array([10])), ROW)


def test_an_edited_seed_in_the_manifest_is_refused(tmp_path: Path) -> None:
    # The seed decides every never-written row: seed 1 would silently give row 3 another value.
    directory = tmp_path / "s"
    _store_with_row_42(directory, "file")
    manifest = json.loads((directory / "MANIFEST").read_text())
    assert manifest["seed"] == 0
    (directory / "MANIFEST").write_text(json.dumps(manifest | {"seed": 1}, indent=1))
    with pytest.raises(StoreCorruptionError, match="does not match its manifest_sha256"):
        EmbeddingStore.open(directory)
    (directory / "MANIFEST").write_text(json.dumps(manifest | {"seed": 0}, indent=1))
    with EmbeddingStore.open(directory) as store:  # the original content, re-serialised: fine
        assert np.array_equal(store.peek(np.array([3])), init_rows(np.array([3]), SPEC, 0))
