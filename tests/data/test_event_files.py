"""A user's events file: both layouts read to the expected events, and bad files are named."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from frugal.config import ConfigError
from frugal.data import TemporalEvents, load_events
from frugal.data.event_files import is_event_file, read_event_file
from frugal.data.ml_format import write_ml


def test_is_event_file_tells_paths_from_bundled_ids() -> None:
    assert is_event_file("events.csv") and is_event_file("EVENTS.CSV")
    assert is_event_file("data/events") and is_event_file("./ml_wiki.csv")
    assert not is_event_file("collegemsg") and not is_event_file("sp_hospital")


def test_plain_csv_loads_sorted_with_dense_ids_labels_and_features(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    # Line 4 is blank; the rows are out of time order and t goes negative.
    path.write_text("src,dst,t,label,w1,w2\n10,20,5,0,0.5,1\n20,30,3,1,1.5,2\n\n10,30,-4,0,2.5,3\n")
    file = read_event_file(path)
    events = file.events
    # Stable sort by t: rows (t=-4), (t=3), (t=5). Ids factorise [sources, then destinations]
    # in sorted-row order: src 10, 20, 10 -> 0, 1, 0; dst 30, 30, 20 -> 2, 2, 1.
    np.testing.assert_array_equal(events.t, [-4, 3, 5])
    np.testing.assert_array_equal(events.src, [0, 1, 0])
    np.testing.assert_array_equal(events.dst, [2, 2, 1])
    np.testing.assert_array_equal(events.node_ids, [10, 20, 30])
    assert events.label is not None
    np.testing.assert_array_equal(events.label, [0, 1, 0])
    assert events.msg is not None and events.msg.dtype == np.float32
    np.testing.assert_array_equal(events.msg, [[2.5, 3.0], [1.5, 2.0], [0.5, 1.0]])
    assert file.resorted and file.layout == "csv" and events.num_nodes == 3
    assert file.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert file.key == f"mine.csv@{file.sha256[:16]}"
    # load_events takes the path where it takes a bundled id.
    np.testing.assert_array_equal(load_events(str(path)).src, events.src)


def test_plain_csv_without_label_or_features_and_sorted_rows(tmp_path: Path) -> None:
    path = tmp_path / "plain.csv"
    path.write_text("t,dst,src\n1,2,0\n1,0,2\n")  # columns by name, in any order
    file = read_event_file(path)
    assert file.events.msg is None and file.events.label is None and not file.resorted
    np.testing.assert_array_equal(file.events.node_ids, [0, 2])  # sources 0, 2 first
    # 19-digit ids (tweet ids) and nanosecond times fit in int64: read exactly
    path.write_text("src,dst,t\n1500000000000000006,9223372036854775807,1700000000000000000\n")
    file = read_event_file(path)
    np.testing.assert_array_equal(file.events.node_ids, [1500000000000000006, 9223372036854775807])
    assert int(file.events.t[0]) == 1700000000000000000


def test_ml_file_written_by_write_ml_reads_back_through_the_path(tmp_path: Path) -> None:
    events = TemporalEvents(
        src=np.array([0, 2, 1], dtype=np.int64),
        dst=np.array([1, 0, 2], dtype=np.int64),
        t=np.array([10, 10, 30], dtype=np.int64),
        num_nodes=3,
        msg=np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], dtype=np.float32),
        label=np.array([0, 1, 0], dtype=np.int64),
    )
    write_ml(events, "toy", tmp_path, feature_dim=2)
    file = read_event_file(tmp_path / "ml_toy.csv")
    assert file.layout == "ml" and [f.name for f in file.files] == [
        "ml_toy.csv",
        "ml_toy.npy",
        "ml_toy_node.npy",
    ]
    for name in ("src", "dst", "t", "label", "msg"):
        np.testing.assert_array_equal(getattr(file.events, name), getattr(events, name))
    # The digest covers the feature file: new features, new digest.
    before = file.sha256
    changed = events.msg + 1  # type: ignore[operator]  # msg is set above
    write_ml(
        TemporalEvents(
            src=events.src, dst=events.dst, t=events.t, num_nodes=3, msg=changed, label=events.label
        ),
        "toy",
        tmp_path,
        feature_dim=2,
    )
    assert read_event_file(tmp_path / "ml_toy.csv").sha256 != before


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty file"),
        ("src,dst,t\n", "a header but no events"),
        ("src,dst\n1,2\n", "line 1: missing column(s) t"),
        ("src,dst,t\n1,2,3\n1,2,x\n", "line 3: t = 'x' is not an integer"),
        ("src,dst,t\n1,2,nan\n", "line 2: t = 'nan' is not an integer"),
        ("src,dst,t\n1,2,inf\n", "line 2: t = 'inf' is not an integer"),
        ("src,dst,t\n1,2,3.5\n", "line 2: t = '3.5' is not an integer"),
        ("src,dst,t\n\n1,-2,3\n", "line 3: dst = -2 is negative; node ids must be integers >= 0"),
        ("src,dst,t\n1.5,2,3\n", "line 2: src = '1.5' is not an integer"),
        ("src,dst,t,label\n1,2,3,1\n1,2,3,2\n", "line 3: label = 2 is not 0 or 1"),
        ("src,dst,t,label\n1,2,3,yes\n", "line 2: label = 'yes' is not an integer"),
        ("src,dst,t,f\n1,2,3,0.5\n1,2,4,nan\n", "line 3: feature column 'f' = 'nan' is not a"),
        ("src,dst,t,f\n1,2,3,\n", "line 2: feature column 'f' = '' is not a finite"),
        ("src,dst,t,f\n1,2,3,abc\n", "line 2: feature column 'f' = 'abc'"),
        ("src,dst,t,t\n1,2,3,4\n", "line 1: column(s) t appear more than once in the header"),
        ("src,src,dst,t\n1,1,2,3\n", "line 1: column(s) src appear more than once"),
        (
            "src,dst,t\n9223372036854775808,2,3\n",
            "line 2: src = '9223372036854775808' does not fit in a 64-bit integer",
        ),
        ("src,dst,t\n1,2,99999999999999999999\n", "line 2: t = '99999999999999999999' is not an"),
    ],
)
def test_bad_csv_names_the_file_line_and_value(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        read_event_file(path)
    assert str(path) in str(caught.value) and message in str(caught.value)


def test_missing_file_unsorted_ml_and_other_suffixes_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        read_event_file(tmp_path / "absent.csv")
    with pytest.raises(ConfigError, match=r"is a \.csv"):
        read_event_file(tmp_path / "events.txt")
    (tmp_path / "ml_x.csv").write_text("u,i,ts,label,idx\n1,2,5,0,1\n2,1,4,0,2\n")
    with pytest.raises(ConfigError, match=r"row 2, ts = 4 is earlier.*ml layout"):
        read_event_file(tmp_path / "ml_x.csv")
    (tmp_path / "ml_y.csv").write_text("src,dst,t\n1,2,3\n")  # a plain CSV named ml_*
    with pytest.raises(ConfigError, match=r"missing column.*rename it if it is a plain CSV"):
        read_event_file(tmp_path / "ml_y.csv")


def test_a_changed_file_gets_another_digest_and_key(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    path.write_text("src,dst,t\n0,1,1\n1,2,2\n")
    first = read_event_file(path)
    path.write_text("src,dst,t\n0,1,1\n1,2,3\n")  # one timestamp differs
    second = read_event_file(path)
    assert first.sha256 != second.sha256 and first.key != second.key
    assert first.key.startswith("mine.csv@")
