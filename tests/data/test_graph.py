"""`Graph` (CSR with labels and splits) and the ogbn-papers100M-shaped generator."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from frugal.data import load_events
from frugal.data.graph import GRAPH_FILES, Graph, split_nodes
from frugal.data.papers_like import PapersLikeConfig, papers_like


def _graph(**changes: object) -> Graph:
    fields: dict[str, object] = {
        "indptr": np.array([0, 1, 3, 4]),
        "indices": np.array([1, 0, 2, 1]),
        "num_nodes": 3,
        "labels": np.array([0, 1, -1]),
        "train_ids": np.array([0]),
        "val_ids": np.array([1]),
        "test_ids": np.array([], dtype=np.int64),
    }
    fields.update(changes)
    return Graph(**fields)  # type: ignore[arg-type]


def test_from_edges_builds_the_csr_worked_by_hand() -> None:
    # Edges 0-1, 1-2, a self-loop 2-2 and 0-1 again, undirected: row 0 = [1], row 1 = [0, 2],
    # row 2 = [1] (the duplicate merges, the self-loop is dropped).
    graph = Graph.from_edges(
        [0, 1, 2, 0],
        [1, 2, 2, 1],
        3,
        [0, 1, -1],
        train_ids=[0],
        val_ids=[1],
        test_ids=[],
    )
    assert graph.indptr.tolist() == [0, 1, 3, 4]
    assert graph.indices.tolist() == [1, 0, 2, 1]
    assert graph.degrees().tolist() == [1, 2, 1]
    assert (graph.num_edges, graph.num_classes, graph.num_features) == (4, 2, 0)
    directed = Graph.from_edges(
        [0, 1], [1, 2], 3, [0, 1, 1], train_ids=[0], val_ids=[], test_ids=[], undirected=False
    )
    assert directed.indptr.tolist() == [0, 0, 1, 2] and directed.indices.tolist() == [0, 1]


@pytest.mark.parametrize(
    ("changes", "error", "fragment"),
    [
        ({"indices": np.array([1, 0, 2, 3])}, ValueError, r"node id 3, outside \[0, num_nodes=3\)"),
        ({"indices": np.array([1, -4, 2, 1])}, ValueError, "negative node id -4"),
        ({"indptr": np.array([0, 1, 4])}, ValueError, "needs 4"),
        ({"indptr": np.array([0, 3, 1, 4])}, ValueError, "decreases at node 1"),
        ({"indptr": np.array([0, 1, 3, 5])}, ValueError, "len\\(indices\\)=4"),
        ({"labels": np.array([0, 1])}, ValueError, "labels has 2 entries but num_nodes=3"),
        ({"test_ids": np.array([2])}, ValueError, "test_ids holds node 2, which has no label"),
        ({"train_ids": np.array([7])}, ValueError, r"train_ids holds node id 7"),
        ({"indices": np.array([1.0, 0, 2, 1])}, TypeError, "indices must be integers"),
        ({"features": np.zeros((3, 2))}, TypeError, "float32"),
        ({"features": np.zeros((2, 2), np.float32)}, ValueError, r"\(num_nodes=3, F\)"),
        ({"num_classes": 1}, ValueError, "labels reach 1; raise num_classes"),
    ],
)
def test_bad_graphs_name_the_value_and_the_fix(
    changes: dict[str, object], error: type[Exception], fragment: str
) -> None:
    with pytest.raises(error, match=fragment):
        _graph(**changes)


def test_from_edges_checks_lengths_and_ranges() -> None:
    with pytest.raises(ValueError, match="src has 2 edges but dst has 1"):
        Graph.from_edges([0, 1], [1], 2, [0, 0], train_ids=[], val_ids=[], test_ids=[])
    with pytest.raises(ValueError, match=r"dst holds node id 5, outside \[0, num_nodes=2\)"):
        Graph.from_edges([0], [5], 2, [0, 0], train_ids=[], val_ids=[], test_ids=[])


def test_split_nodes_is_seeded_and_disjoint() -> None:
    train, val, test = split_nodes(np.arange(100), (0.6, 0.2, 0.2), seed=4)
    assert (len(train), len(val), len(test)) == (60, 20, 20)
    assert len(np.unique(np.concatenate([train, val, test]))) == 100
    again = split_nodes(np.arange(100), (0.6, 0.2, 0.2), seed=4)
    assert all(np.array_equal(a, b) for a, b in zip((train, val, test), again, strict=True))
    with pytest.raises(ValueError, match="sum to"):
        split_nodes(np.arange(10), (0.6, 0.3, 0.2), seed=0)


def test_pubmed_graph_has_the_published_counts() -> None:
    graph = Graph.from_events(load_events("pubmed"), seed=0)
    # 19,717 nodes, 44,324 distinct undirected citations -> 88,648 neighbour entries; every
    # node is labelled (classes 4,103 / 7,875 / 7,739), split 60/20/20.
    assert (graph.num_nodes, graph.num_classes, graph.num_edges) == (19_717, 3, 88_648)
    assert np.bincount(graph.labels).tolist() == [4103, 7875, 7739]
    assert (len(graph.train_ids), len(graph.val_ids), len(graph.test_ids)) == (11830, 3943, 3943)
    assert graph.features is None  # the bundled files hold ids and labels, no word vectors


def test_save_and_load_round_trip_memory_mapped(tmp_path: Path) -> None:
    graph = _graph(features=np.arange(6, dtype=np.float32).reshape(3, 2))
    graph.save(tmp_path / "g")
    loaded = Graph.load(tmp_path / "g")
    assert isinstance(loaded.features, np.memmap)
    assert isinstance(loaded.indices.base, np.memmap)  # a view of the map, not a copy
    for name in ("indptr", "indices", "labels", "train_ids", "val_ids", "test_ids", "features"):
        assert np.array_equal(getattr(loaded, name), getattr(graph, name)), name
    (tmp_path / "g" / "labels.npy").unlink()
    with pytest.raises(FileNotFoundError, match=r"labels\.npy"):
        Graph.load(tmp_path / "g")


def _folder_sha(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


SMALL = PapersLikeConfig(num_nodes=20_000, num_classes=8, seed=7, chunk_nodes=4096)


def test_papers_like_is_deterministic(tmp_path: Path) -> None:
    papers_like(tmp_path / "a", SMALL)
    papers_like(tmp_path / "b", SMALL)
    assert _folder_sha(tmp_path / "a") == _folder_sha(tmp_path / "b")
    other = PapersLikeConfig(num_nodes=20_000, num_classes=8, seed=8, chunk_nodes=4096)
    papers_like(tmp_path / "c", other)
    assert _folder_sha(tmp_path / "a") != _folder_sha(tmp_path / "c")
    with pytest.raises(ValueError, match="not empty"):
        papers_like(tmp_path / "a", SMALL)


def test_papers_like_is_heavy_tailed_homophilous_and_as_large_as_estimated(
    tmp_path: Path,
) -> None:
    graph = papers_like(tmp_path / "g", SMALL)
    degrees = graph.degrees()
    in_degrees = np.bincount(graph.indices, minlength=graph.num_nodes)
    # Pareto(5, 1.5) lengths: median about 5 x 2^(1/1.5) = 7.9, floored -> 7, mean about 14,
    # and a few nodes with hundreds; a Poisson graph of that mean would top out near 30.
    assert np.median(degrees) <= 8 and degrees.max() > 300
    assert 13 < degrees.mean() < 16
    # In-degree by popularity: the top 1% of nodes hold far more than 1% of the entries.
    top = np.sort(in_degrees)[-graph.num_nodes // 100 :].sum() / in_degrees.sum()
    assert top > 0.05 and in_degrees.max() > 20 * np.median(in_degrees)
    assert not (graph.indices == np.repeat(np.arange(graph.num_nodes), degrees)).any()
    # p_within = 0.7 of the draws stay in the class; the rest hit it 1/8 of the time.
    same = graph.labels[graph.indices] == np.repeat(graph.labels, degrees)
    assert 0.70 < same.mean() < 0.77
    assert graph.features is not None and graph.features.shape == (20_000, 128)
    assert graph.features.dtype == np.float32 and graph.num_classes == 8
    written = sum(p.stat().st_size for p in (tmp_path / "g").iterdir())
    assert abs(written - SMALL.expected_disk_bytes()) < 0.03 * written
    assert set(GRAPH_FILES) <= {p.name for p in (tmp_path / "g").iterdir()}


def test_papers_like_size_at_20m_nodes_without_generating_it() -> None:
    config = PapersLikeConfig(num_nodes=20_000_000)
    # Mean length = sum_k min(1, (5/k)^1.5) for k <= 10,000: 5 + sum_{k>5} (5/k)^1.5, about
    # 5 + 5^1.5 x (zeta(1.5) - H_5(1.5) - tail) = 14.30. Bytes: features 20M x 128 x 4 =
    # 10.24 GB, indices 20M x 14.30 x 8 = 2.29 GB, indptr + labels 0.32 GB, splits 2.2 MB.
    assert 14.2 < config.expected_mean_degree() < 14.4
    expected = 8 * 20_000_001 + 8 * config.expected_num_edges() + 4 * 20_000_000 * 128
    expected += 8 * 20_000_000 + 8 * round(20_000_000 * 0.0139) + 128 * 8
    assert config.expected_disk_bytes() == expected
    assert 12.8e9 < config.expected_disk_bytes() < 12.9e9


def test_bad_papers_like_settings() -> None:
    with pytest.raises(ValueError, match="num_classes=9 must be in"):
        PapersLikeConfig(num_nodes=8, num_classes=9)
    with pytest.raises(ValueError, match=r"degree_exponent=1\.0 must be > 1"):
        PapersLikeConfig(degree_exponent=1.0)
    with pytest.raises(ValueError, match="split="):
        PapersLikeConfig(split=(0.8, 0.2, 0.1))


_PEAK_RSS_CHILD = """
import resource, sys
from frugal.data.papers_like import PapersLikeConfig, papers_like
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
graph = papers_like(sys.argv[1], PapersLikeConfig(num_nodes=2_000_000))
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(before // 1024, after // 1024, graph.num_edges)
"""


@pytest.mark.slow
def test_papers_like_holds_one_chunk_at_a_time(tmp_path: Path) -> None:
    # 2M nodes write 1.3 GB; the peak RSS of the writer stays a few hundred MB (the written
    # pages of the memory maps are file-backed and count only while resident).
    out = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS_CHILD, str(tmp_path / "g")],
        capture_output=True,
        text=True,
        check=True,
    )
    before_mib, after_mib, num_edges = (int(v) for v in out.stdout.split())
    assert num_edges > 25_000_000
    assert after_mib - before_mib < 600, out.stdout


def test_a_node_in_two_splits_is_refused_with_the_nodes() -> None:
    with pytest.raises(ValueError, match=r"train_ids and test_ids share 1 nodes, e\.g\. \[2\]"):
        Graph.from_edges([0, 1], [1, 2], 3, [0, 1, 0], train_ids=[0, 2], val_ids=[1], test_ids=[2])
