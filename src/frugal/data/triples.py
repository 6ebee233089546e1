"""Knowledge graphs: train/valid/test triples, a TSV reader and a Freebase-shaped stream.

`KnowledgeGraph` holds the triples with dense ids, `read_triples_tsv` reads your own graph,
`FreebaseLikeStream` is a seeded Freebase86m-shaped triple stream for scale.

A triple is (head, relation, tail), stored as int64 columns `[h, r, t]`. Entity and relation
ids are dense and 0-based: the bundled graphs number their names in sorted order (as PyKEEN's
`TriplesFactory` does), so ids do not depend on which split a name first appears in.

Shape legend: T triples, E entities, R relations.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from frugal._typing import I64
from frugal.data.synthetic import truncated_zipf_ranks

__all__ = ["FreebaseLikeStream", "KnowledgeGraph", "read_triples_tsv"]

_SPLITS = ("train", "valid", "test")


@dataclass(frozen=True, eq=False, slots=True)
class KnowledgeGraph:
    """A knowledge graph split into train, validation and test triples.

    Attributes:
        train: int64 (T_train, 3) columns head, relation, tail.
        valid: int64 (T_valid, 3).
        test: int64 (T_test, 3).
        entity_names: The name of each entity id, (E,).
        relation_names: The name of each relation id, (R,).
        name: Where the graph came from (a dataset id or a file path).

    Raises:
        ValueError: If a split is not (T, 3) int64 or holds an id outside [0, E) / [0, R).
    """

    train: I64
    valid: I64
    test: I64
    entity_names: tuple[str, ...]
    relation_names: tuple[str, ...]
    name: str = ""

    def __post_init__(self) -> None:
        for split in _SPLITS:
            triples = getattr(self, split)
            if not isinstance(triples, np.ndarray) or triples.dtype != np.int64:
                raise ValueError(f"{split} triples must be an int64 numpy array")
            if triples.ndim != 2 or triples.shape[1] != 3:
                raise ValueError(
                    f"{split} triples have shape {triples.shape}; expected (T, 3) columns "
                    "head, relation, tail"
                )
            if not len(triples):
                continue
            for column, bound, what in (
                (0, self.num_entities, "head"),
                (1, self.num_relations, "relation"),
                (2, self.num_entities, "tail"),
            ):
                values = triples[:, column]
                bad = np.flatnonzero((values < 0) | (values >= bound))
                if len(bad):
                    raise ValueError(
                        f"{split} triple {int(bad[0])} has {what} id {int(values[bad[0]])} "
                        f"outside [0, {bound}); {len(bad)} triples are out of range"
                    )

    @property
    def num_entities(self) -> int:
        """E, the number of entities."""
        return len(self.entity_names)

    @property
    def num_relations(self) -> int:
        """R, the number of relations."""
        return len(self.relation_names)

    @property
    def num_triples(self) -> int:
        """Triples over all three splits."""
        return len(self.train) + len(self.valid) + len(self.test)

    def all_triples(self) -> I64:
        """Train, valid and test stacked, (T, 3): the known facts filtered in evaluation."""
        return np.concatenate([self.train, self.valid, self.test])

    def sha256(self) -> str:
        """Digest of the three splits' ids and the names (identifies the graph in results)."""
        digest = hashlib.sha256()
        for split in _SPLITS:
            digest.update(getattr(self, split).tobytes())
        digest.update("\n".join(self.entity_names).encode())
        digest.update("\n".join(self.relation_names).encode())
        return digest.hexdigest()


def _read_tsv(path: Path) -> npt.NDArray[np.str_]:
    """(T, 3) names from a head<TAB>relation<TAB>tail file; a bad line is named by number."""
    rows: list[list[str]] = []
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            line = line.rstrip("\n").rstrip("\r")
            if not line.strip():
                continue
            parts = line.split("\t")
            if len(parts) != 3 or not all(parts):
                raise ValueError(
                    f"{path}:{number}: expected 'head<TAB>relation<TAB>tail', got {line[:80]!r} "
                    f"({len(parts)} tab-separated fields); fix or remove that line"
                )
            rows.append(parts)
    if not rows:
        raise ValueError(f"{path} holds no triples; expected head<TAB>relation<TAB>tail lines")
    return np.array(rows, dtype=str)


def _warn_about_splits(paths: list[Path], names: list[npt.NDArray[np.str_]]) -> None:
    """Warn about what PyKEEN and DGL-KE users expect flagged (the graph still loads)."""
    train = names[0]
    seen_entities = set(train[:, 0]) | set(train[:, 2])
    seen_relations = set(train[:, 1])
    known = {tuple(t) for t in train.tolist()}
    for path, part in zip(paths, names, strict=True):
        lines = [tuple(t) for t in part.tolist()]
        duplicates = len(lines) - len(set(lines))
        if duplicates:
            warnings.warn(
                f"{path}: {duplicates} duplicate triples (kept; deduplicate the file to train "
                "and rank each fact once)",
                stacklevel=3,
            )
        if path is paths[0]:
            continue
        unseen = set(part[:, 0]) | set(part[:, 2])
        unseen -= seen_entities
        new_relations = set(part[:, 1]) - seen_relations
        leaked = sum(1 for t in lines if t in known)
        if unseen or new_relations:
            example = sorted(unseen or new_relations)[0]
            warnings.warn(
                f"{path}: {len(unseen)} entities and {len(new_relations)} relations never occur "
                f"in {paths[0].name} (e.g. {example!r}); their rows stay untrained, so "
                "triples with them rank near chance (PyKEEN drops such triples)",
                stacklevel=3,
            )
        if leaked:
            warnings.warn(
                f"{path}: {leaked} triples are also in {paths[0].name} (a leak between the "
                "splits; filtered ranking removes them from the candidates only)",
                stacklevel=3,
            )


def read_triples_tsv(
    train: str | Path, valid: str | Path, test: str | Path, *, name: str = ""
) -> KnowledgeGraph:
    """Read a knowledge graph from three tab-separated files of (head, relation, tail) names.

    This is the layout of the PyKEEN, DGL-KE (`--format raw_udd_hrt`) and OpenKE benchmark files.
    Entities and relations are numbered in sorted name order over all three files. Names are
    taken as written (surrounding spaces included). A warning names duplicate triples,
    validation or test entities and relations that never occur in training, and triples that
    are in training too; the graph loads as given.

    Args:
        train: Training triples file.
        valid: Validation triples file.
        test: Test triples file.
        name: Stored as `KnowledgeGraph.name`; defaults to the training file's folder.

    Returns:
        The graph.

    Raises:
        FileNotFoundError: If a file is missing.
        ValueError: If a line does not hold three non-empty tab-separated fields (the message
            names the file and line), or a file holds no triples.
    """
    paths = [Path(p) for p in (train, valid, test)]
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"triples file {path} does not exist; give an existing file")
    names = [_read_tsv(path) for path in paths]
    _warn_about_splits(paths, names)
    stacked = np.concatenate(names)
    entities = np.unique(np.concatenate([stacked[:, 0], stacked[:, 2]]))
    relations = np.unique(stacked[:, 1])
    splits = []
    for part in names:
        ids = np.stack(
            [
                np.searchsorted(entities, part[:, 0]),
                np.searchsorted(relations, part[:, 1]),
                np.searchsorted(entities, part[:, 2]),
            ],
            axis=1,
        ).astype(np.int64)
        splits.append(ids)
    return KnowledgeGraph(
        train=splits[0],
        valid=splits[1],
        test=splits[2],
        entity_names=tuple(str(e) for e in entities),
        relation_names=tuple(str(r) for r in relations),
        name=name or str(paths[0].parent),
    )


_GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


def _coprime_multiplier(n: int, seed: int) -> int:
    """An odd multiplier coprime with n (a bijection i -> (a*i + b) mod n on [0, n))."""
    a = (seed * _GOLDEN + 0x632BE59BD9B4E019) & _MASK64
    a = a % n if n > 1 else 1
    a = max(a, 1)
    while math.gcd(a, n) != 1:
        a += 1
    return a


class FreebaseLikeStream:
    """A seeded triple stream shaped like Freebase86m: power-law entity degrees, many relations.

    Freebase86m (the largest graph of DGL-KE, PyTorch-BigGraph and MLKV) has 86M entities,
    14,824 relations and 339M triples, with heavy-tailed entity degrees. This stream draws
    heads from a truncated Zipf law over the entities (`alpha`), relations from a Zipf law over
    the relations, and the tail from the head's *community* under the relation: every entity
    has a latent community `c(e) = floor(e * K / E)` (K = `num_communities`; the ids of a
    community are contiguous, its members' degrees are not, since heads are drawn through a
    seeded permutation of the ids), relation r maps community c to
    `(c + shift_r) mod num_communities`, and the tail is a Zipf draw inside that community.
    Embedding models can learn that structure, so MRR rises above the random 1/E.

    Nothing is materialised: triple i is a pure function of (seed, i), generated in fixed
    chunks, so any slice is the same however the stream is cut, and 50M entities need only
    O(chunk) memory. Evaluation on such a stream is unfiltered (the fact set is never built).

    Example:
        >>> stream = FreebaseLikeStream(FreebaseLikeStream.Config(num_entities=1000, seed=0))
        >>> stream.triples(0, 4).shape
        (4, 3)
    """

    @dataclass(frozen=True, kw_only=True, slots=True)
    class Config:
        """Settings of the stream (Freebase86m: 86,054,151 entities, 14,824 relations)."""

        num_entities: int = 1_000_000
        """E, >= 2 (Freebase86m: 86,054,151)."""
        num_relations: int = 14_824
        """R, >= 1 (Freebase86m's count)."""
        num_communities: int = 1024
        """Latent communities tails are drawn from, in [1, E]."""
        alpha: float = 1.05
        """Zipf exponent of head and tail degrees, in (0, 4]."""
        relation_alpha: float = 1.2
        """Zipf exponent of relation frequencies, in (0, 4]."""
        seed: int = 0
        """Seed of the permutations and draws, >= 0."""
        chunk_triples: int = 65536
        """Triples generated per seeded chunk, >= 1; part of the stream's identity."""

        def __post_init__(self) -> None:
            for name in ("num_entities", "num_relations", "num_communities", "seed"):
                value = getattr(self, name)
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ValueError(f"{name}={value!r} must be an integer")
            if self.num_entities < 2:
                raise ValueError(f"num_entities={self.num_entities} must be >= 2")
            if self.num_relations < 1:
                raise ValueError(f"num_relations={self.num_relations} must be >= 1")
            if not 1 <= self.num_communities <= self.num_entities:
                raise ValueError(
                    f"num_communities={self.num_communities} must be in [1, num_entities="
                    f"{self.num_entities}]"
                )
            for name in ("alpha", "relation_alpha"):
                if not 0.0 < getattr(self, name) <= 4.0:
                    raise ValueError(f"{name}={getattr(self, name)} must be in (0, 4]")
            if self.seed < 0 or self.chunk_triples < 1:
                raise ValueError(
                    f"seed={self.seed} must be >= 0 and chunk_triples={self.chunk_triples} >= 1"
                )

    def __init__(self, config: Config) -> None:
        self.config = config
        n = config.num_entities
        # entity rank -> id: an affine bijection mod E, O(1) memory at any E.
        self._a = _coprime_multiplier(n, config.seed)
        self._b = (config.seed * 0xBF58476D1CE4E5B9) % n
        k = config.num_communities
        # community c holds ids [ceil(c*E/K), ceil((c+1)*E/K)): c(e) = floor(e*K/E), never empty
        rng = np.random.default_rng([config.seed, 0xC0FFEE])
        self._shift = rng.integers(0, k, size=config.num_relations, dtype=np.int64)
        self._last_chunk: tuple[int, I64] | None = None  # batches read a chunk in slices

    @property
    def num_entities(self) -> int:
        """E."""
        return self.config.num_entities

    @property
    def num_relations(self) -> int:
        """R."""
        return self.config.num_relations

    def _entity(self, rank: I64) -> I64:
        out: I64 = (rank * self._a + self._b) % self.config.num_entities
        return out

    def _chunk(self, chunk: int) -> I64:
        if self._last_chunk is not None and self._last_chunk[0] == chunk:
            return self._last_chunk[1]
        block = self._make_chunk(chunk)
        self._last_chunk = (chunk, block)
        return block

    def _make_chunk(self, chunk: int) -> I64:
        c = self.config
        rng = np.random.default_rng([c.seed, chunk])
        count = c.chunk_triples
        head_rank = truncated_zipf_ranks(rng.random(count), c.num_entities, c.alpha)
        heads = self._entity(head_rank)
        relations = truncated_zipf_ranks(rng.random(count), c.num_relations, c.relation_alpha)
        n, k = c.num_entities, c.num_communities
        community = (heads * k // n + self._shift[relations]) % k
        start = (community * n + k - 1) // k
        size = ((community + 1) * n + k - 1) // k - start
        # a Zipf rank inside the community, so tails are heavy-tailed too
        tail_rank = truncated_zipf_ranks(rng.random(count), -(-n // k), c.alpha)
        tails = start + tail_rank % size
        return np.stack([heads, relations, tails], axis=1).astype(np.int64)

    def triples(self, start: int, stop: int) -> I64:
        """Triples [start, stop) of the stream, int64 (stop - start, 3) columns h, r, t.

        Raises:
            ValueError: If not 0 <= start <= stop.
        """
        if not 0 <= start <= stop:
            raise ValueError(f"need 0 <= start <= stop, got start={start}, stop={stop}")
        size = self.config.chunk_triples
        parts = []
        for chunk in range(start // size, -(-stop // size)):
            block = self._chunk(chunk)
            lo = max(start - chunk * size, 0)
            hi = min(stop - chunk * size, size)
            parts.append(block[lo:hi])
        if not parts:
            return np.empty((0, 3), dtype=np.int64)
        return np.concatenate(parts)
