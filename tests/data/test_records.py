"""The dataset catalogue read from `datasets.toml`: unchanged records, strict loading."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from frugal.config import ConfigError, config_from_dict
from frugal.data.records import DATASETS, DatasetInfo

FROZEN = Path(__file__).with_name("datasets_frozen.json")


def test_catalogue_equals_the_frozen_records() -> None:
    # datasets_frozen.json is `dataclasses.asdict` of every record, dumped from the Python
    # literals the catalogue had before it moved to datasets.toml. JSON loses tuple-vs-list,
    # but the loader converts every value to its annotated type strictly (int stays int,
    # arrays become tuples), so equal dumps mean equal records.
    frozen = json.loads(FROZEN.read_text())
    current = json.loads(json.dumps([dataclasses.asdict(info) for info in DATASETS]))
    assert [r["name"] for r in current] == [r["name"] for r in frozen]
    for record, expected in zip(current, frozen, strict=True):
        assert record == expected, record["name"]


def test_records_hold_their_annotated_types() -> None:
    pubmed = next(info for info in DATASETS if info.name == "pubmed")
    assert pubmed.loaders == ("events",)
    assert pubmed.stats.class_counts == (("1", 4103), ("2", 7875), ("3", 7739))
    assert isinstance(pubmed.source.files, tuple)
    assert pubmed.source.files[1].size_bytes == 87828
    fortunes = next(info for info in DATASETS if info.name == "fortunes")
    assert fortunes.optional and len(fortunes.source.files) == 43


def test_each_distribution_is_pinned_at_one_version() -> None:
    versions: dict[str, set[str]] = {}
    for info in DATASETS:
        versions.setdefault(info.source.distribution, set()).add(info.source.version)
    assert {name: len(v) for name, v in versions.items() if len(v) != 1} == {}


def test_a_bad_table_fails_with_its_dotted_key() -> None:
    table = dataclasses.asdict(DATASETS[0])
    table["stats"]["num_edges"] = 1
    with pytest.raises(ConfigError, match=r"unknown key dataset\[0\]\.stats\.num_edges"):
        config_from_dict(DatasetInfo, table, source="datasets.toml", prefix="dataset[0]")
    table = dataclasses.asdict(DATASETS[0])
    table["kind"] = "graph"
    with pytest.raises(ConfigError, match=r"dataset\[0\]\.kind = 'graph' is not allowed"):
        config_from_dict(DatasetInfo, table, source="datasets.toml", prefix="dataset[0]")
