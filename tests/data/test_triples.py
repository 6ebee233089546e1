"""Knowledge graphs: the bundled PyKEEN graphs, the TSV reader and the Freebase-shaped stream."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from frugal.data import DataConfig, KnowledgeGraph, load_triples, verify_dataset
from frugal.data.triples import FreebaseLikeStream, read_triples_tsv


@pytest.mark.parametrize(
    ("name", "entities", "relations", "splits"),
    [
        ("kinships", 104, 25, (8544, 1068, 1074)),
        ("umls", 135, 46, (5216, 652, 661)),
        ("nations", 14, 55, (1592, 199, 201)),
    ],
)
def test_bundled_graphs_have_pykeens_counts(
    name: str, entities: int, relations: int, splits: tuple[int, int, int], tmp_path: Path
) -> None:
    # The counts PyKEEN's dataset docstrings state for the same files.
    graph = load_triples(name, DataConfig(cache_dir=str(tmp_path)))
    assert (graph.num_entities, graph.num_relations) == (entities, relations)
    assert (len(graph.train), len(graph.valid), len(graph.test)) == splits
    assert verify_dataset(name, DataConfig(cache_dir=str(tmp_path))).num_triples == splits
    assert list(graph.entity_names) == sorted(graph.entity_names)  # PyKEEN's numbering
    again = load_triples(name, DataConfig(cache_dir=str(tmp_path)))  # from the cache
    assert again.sha256() == graph.sha256()


def test_umls_first_triple_is_numbered_by_sorted_names() -> None:
    graph = load_triples("umls")
    h, r, t = graph.train[0]
    # the first line of umls/train.txt
    assert (graph.entity_names[h], graph.relation_names[r], graph.entity_names[t]) == (
        "acquired_abnormality",
        "location_of",
        "experimental_model_of_disease",
    )


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_read_triples_tsv_numbers_names_over_all_splits(tmp_path: Path) -> None:
    train = _write(tmp_path / "train.txt", ["b\tlikes\ta", "a\tlikes\tc"])
    valid = _write(tmp_path / "valid.txt", ["c\thates\tb"])
    test = _write(tmp_path / "test.txt", ["d\tlikes\ta"])
    graph = read_triples_tsv(train, valid, test, name="toy")
    assert graph.entity_names == ("a", "b", "c", "d")
    assert graph.relation_names == ("hates", "likes")
    assert graph.train.tolist() == [[1, 1, 0], [0, 1, 2]]
    assert graph.valid.tolist() == [[2, 0, 1]]
    assert graph.test.tolist() == [[3, 1, 0]]
    assert graph.all_triples().shape == (4, 3)


def test_a_bad_line_is_named_by_file_and_number(tmp_path: Path) -> None:
    train = _write(tmp_path / "train.txt", ["a\tr\tb", "a r b"])
    valid = _write(tmp_path / "valid.txt", ["a\tr\tb"])
    test = _write(tmp_path / "test.txt", ["a\tr\tb"])
    with pytest.raises(ValueError, match=r"train.txt:2: expected 'head<TAB>relation<TAB>tail'"):
        read_triples_tsv(train, valid, test)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_triples_tsv(train, valid, tmp_path / "missing.txt")


def test_knowledge_graph_refuses_out_of_range_ids() -> None:
    ok = np.array([[0, 0, 1]], dtype=np.int64)
    with pytest.raises(ValueError, match=r"train triple 0 has tail id 5 outside \[0, 2\)"):
        KnowledgeGraph(
            train=np.array([[0, 0, 5]], dtype=np.int64),
            valid=ok,
            test=ok,
            entity_names=("a", "b"),
            relation_names=("r",),
        )
    with pytest.raises(ValueError, match=r"shape \(1, 2\)"):
        KnowledgeGraph(
            train=np.array([[0, 0]], dtype=np.int64),
            valid=ok,
            test=ok,
            entity_names=("a", "b"),
            relation_names=("r",),
        )


def test_freebase_like_stream_is_the_same_however_cut() -> None:
    config = FreebaseLikeStream.Config(num_entities=5000, num_relations=40, chunk_triples=1000)
    stream = FreebaseLikeStream(config)
    whole = stream.triples(0, 3500)
    parts = np.concatenate(
        [stream.triples(0, 999), stream.triples(999, 2100), stream.triples(2100, 3500)]
    )
    assert np.array_equal(whole, parts)
    assert np.array_equal(FreebaseLikeStream(config).triples(0, 3500), whole)
    other = FreebaseLikeStream(
        FreebaseLikeStream.Config(num_entities=5000, num_relations=40, seed=1)
    )
    assert not np.array_equal(other.triples(0, 3500), whole)
    assert whole.min() >= 0 and whole[:, [0, 2]].max() < 5000 and whole[:, 1].max() < 40


def test_freebase_like_degrees_are_heavy_tailed_and_tails_follow_communities() -> None:
    config = FreebaseLikeStream.Config(num_entities=20_000, num_relations=100, num_communities=50)
    stream = FreebaseLikeStream(config)
    triples = stream.triples(0, 200_000)
    degree = np.bincount(np.concatenate([triples[:, 0], triples[:, 2]]), minlength=20_000)
    top = np.sort(degree)[::-1]
    # power law: the top 1% of entities hold far more than 1% of the endpoints
    assert top[:200].sum() > 0.3 * top.sum()
    assert np.median(degree) < np.mean(degree) / 2  # and most entities are rare
    community = np.asarray(triples) * 50 // 20_000  # c(e) = floor(e K / E)
    shift = (community[:, 2] - community[:, 0]) % 50
    # a relation maps the head's community to one tail community
    for r in range(5):
        assert len(np.unique(shift[triples[:, 1] == r])) == 1


def test_freebase_like_scales_to_50m_entities_without_materialising() -> None:
    stream = FreebaseLikeStream(FreebaseLikeStream.Config(num_entities=50_000_000))
    triples = stream.triples(10**9, 10**9 + 2048)  # far into the stream, O(chunk) memory
    assert triples.shape == (2048, 3)
    assert triples[:, [0, 2]].max() < 50_000_000
    assert len(np.unique(triples[:, 0])) > 1000  # heads spread over the 50M ids


def test_freebase_like_config_errors_name_the_value() -> None:
    with pytest.raises(ValueError, match="num_communities=10 must be in"):
        FreebaseLikeStream.Config(num_entities=5, num_communities=10)
    with pytest.raises(ValueError, match="num_entities=1 must be >= 2"):
        FreebaseLikeStream.Config(num_entities=1)
    with pytest.raises(ValueError, match="start <= stop"):
        FreebaseLikeStream(FreebaseLikeStream.Config(num_entities=10, num_communities=2)).triples(
            5, 2
        )


def test_suspicious_splits_are_named_in_warnings(tmp_path: Path) -> None:
    train = _write(tmp_path / "train.txt", ["a\tr\tb", "a\tr\tb", "b\tr\tc"])
    valid = _write(tmp_path / "valid.txt", ["b\tr\tc"])  # also in train
    test = _write(tmp_path / "test.txt", ["a\tnew\tz"])  # unseen entity and relation
    with pytest.warns(UserWarning, match="duplicate|never occur|also in") as caught:
        graph = read_triples_tsv(train, valid, test)
    messages = " | ".join(str(w.message) for w in caught)
    assert "train.txt: 1 duplicate triples" in messages
    assert "valid.txt: 1 triples are also in train.txt" in messages
    assert "test.txt: 1 entities and 1 relations never occur in train.txt" in messages
    assert graph.num_entities == 4 and len(graph.train) == 3  # loaded as given
