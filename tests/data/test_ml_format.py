"""The ml_NAME files: write, read back, and strict errors on bad files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from frugal.data import TemporalEvents, load_events
from frugal.data.ml_format import read_ml, write_ml


def _events() -> TemporalEvents:
    return TemporalEvents(
        src=np.array([0, 2, 1], dtype=np.int64),
        dst=np.array([1, 0, 2], dtype=np.int64),
        t=np.array([10, 10, 30], dtype=np.int64),
        num_nodes=4,
        msg=np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], dtype=np.float32),
        node_label=np.array([0, 1, 0, -1], dtype=np.int64),
        label_names=("a", "b"),
    )


def test_written_files_follow_the_ml_layout(tmp_path: Path) -> None:
    paths = write_ml(_events(), "toy", tmp_path, feature_dim=3)
    assert [p.name for p in paths] == [
        "ml_toy.csv",
        "ml_toy.npy",
        "ml_toy_node.npy",
        "ml_toy_node_label.csv",
    ]
    # 1-based ids, idx 1..E, label 0 when the events have none.
    assert (tmp_path / "ml_toy.csv").read_text().splitlines() == [
        "u,i,ts,label,idx",
        "1,2,10,0,1",
        "3,1,10,0,2",
        "2,3,30,0,3",
    ]
    edge = np.load(tmp_path / "ml_toy.npy")
    assert edge.shape == (4, 2) and edge.dtype == np.float32
    assert edge[0].tolist() == [0, 0] and edge[3].tolist() == [5, 6]
    node = np.load(tmp_path / "ml_toy_node.npy")
    assert node.shape == (5, 3) and not node.any()
    labels = pd.read_csv(tmp_path / "ml_toy_node_label.csv", keep_default_na=False)
    assert labels["class"].tolist() == ["a", "b", "a", ""]


def test_round_trip(tmp_path: Path) -> None:
    events = _events()
    write_ml(events, "toy", tmp_path)
    back = read_ml("toy", tmp_path)
    assert np.array_equal(back.src, events.src) and np.array_equal(back.dst, events.dst)
    assert np.array_equal(back.t, events.t)
    assert back.msg is not None and events.msg is not None
    assert np.array_equal(back.msg, events.msg)
    assert back.num_nodes == 4  # from the node-feature rows, though node 3 has no event


def test_benchtemp_unnamed_index_column_is_accepted(tmp_path: Path) -> None:
    (tmp_path / "ml_b.csv").write_text(",u,i,ts,label,idx\n0,1,2,5,0,1\n1,2,1,6,1,2\n")
    events = read_ml("b", tmp_path)
    assert events.src.tolist() == [0, 1] and events.label is not None
    assert events.label.tolist() == [0, 1]


@pytest.mark.parametrize(
    ("csv", "fragment"),
    [
        ("u,i,ts,label,idx\n1,2,9,0,1\n2,1,5,0,2\n", "row 2, ts = 5 is earlier"),
        ("u,i,ts,label,idx\n0,2,5,0,1\n", "row 1, u = 0 < 1"),
        ("u,i,ts,label,idx\n1,2,nan,0,1\n", "row 1, column ts"),
        ("u,i,ts,label,idx\n1,2,5,0,1\n2,1,6,0,5\n", "row 2, idx = 5, expected 2"),
        ("u,i,ts,idx\n1,2,5,1\n", r"missing column\(s\) \['label'\]"),
    ],
)
def test_bad_csv_names_file_row_and_constraint(tmp_path: Path, csv: str, fragment: str) -> None:
    (tmp_path / "ml_bad.csv").write_text(csv)
    with pytest.raises(ValueError, match=fragment) as error:
        read_ml("bad", tmp_path)
    assert "ml_bad.csv" in str(error.value)


def test_feature_rows_must_match_events(tmp_path: Path) -> None:
    (tmp_path / "ml_f.csv").write_text("u,i,ts,label,idx\n1,2,5,0,1\n2,1,6,0,2\n")
    np.save(tmp_path / "ml_f.npy", np.zeros((2, 4), np.float32))  # needs E+1 = 3 rows
    with pytest.raises(ValueError, match=r"shape \(2, 4\) does not match 2 events"):
        read_ml("f", tmp_path)
    bad = np.zeros((3, 4), np.float32)
    bad[2, 1] = np.inf
    np.save(tmp_path / "ml_f.npy", bad)
    with pytest.raises(ValueError, match="row 2 holds NaN or inf"):
        read_ml("f", tmp_path)


def test_write_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="feature_dim=0"):
        write_ml(_events(), "x", tmp_path, feature_dim=0)
    with pytest.raises(ValueError, match="plain file-name part"):
        write_ml(_events(), "../x", tmp_path)


def test_real_dataset_exports_and_reads_back(tmp_path: Path) -> None:
    events = load_events("sp_hospital")
    write_ml(events, "sp_hospital", tmp_path)
    back = read_ml("sp_hospital", tmp_path)
    assert back.num_events == 32_424 and back.num_nodes == 75
    assert np.array_equal(back.src, events.src) and np.array_equal(back.t, events.t)
    assert back.msg is None  # zero features (width 172) are read as "no features"


@pytest.mark.parametrize(
    ("csv", "fragment"),
    [
        ("", "empty file"),
        ("u,i,ts,label,idx\n1,2,99999999999999999999,0,1\n", "at most 18 digits"),
        ("u,i,ts,label,idx\n1,2,3.5,0,1\n", "row 1, column ts = '3.5'"),
    ],
)
def test_unparseable_values_are_value_errors(tmp_path: Path, csv: str, fragment: str) -> None:
    (tmp_path / "ml_v.csv").write_text(csv)
    with pytest.raises(ValueError, match=fragment):
        read_ml("v", tmp_path)


def test_node_labels_round_trip(tmp_path: Path) -> None:
    write_ml(_events(), "toy", tmp_path, feature_dim=2)
    back = read_ml("toy", tmp_path)
    assert back.label_names == ("a", "b")
    assert back.node_label is not None
    assert back.node_label.tolist() == [0, 1, 0, -1]


def test_nonzero_padding_row_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "ml_p.csv").write_text("u,i,ts,label,idx\n1,2,5,0,1\n")
    np.save(tmp_path / "ml_p.npy", np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="row 0 is not zeros"):
        read_ml("p", tmp_path)


def test_exported_files_are_readable_by_others(tmp_path: Path) -> None:
    paths = write_ml(_events(), "toy", tmp_path)
    assert all(p.stat().st_mode & 0o044 == 0o044 for p in paths)  # not mkstemp's 0600
