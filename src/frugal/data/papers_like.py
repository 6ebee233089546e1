"""`papers_like`: a deterministic graph shaped like ogbn-papers100M, written in chunks to disk.

ogbn-papers100M (OGB, Hu et al., NeurIPS 2020, arXiv 2005.00687) has 111M papers, 1.6B citation
edges (14.4 per node), 128-dim float32 features and 172 classes, with about 1.1% of the nodes
labelled for training. This generator keeps that shape at any size, from a few hundred nodes to
tens of millions, holding one chunk of nodes in memory at a time (about 100 MB at the defaults):

- Neighbour-list lengths follow a discrete Pareto law: deg = min(floor(X), max_degree) with
  P(X >= x) = (degree_min / x)^degree_exponent, mean about 14.6 at the defaults.
- Neighbours are drawn by popularity (a truncated Zipf law over a seeded permutation, so a few
  nodes are cited very often: heavy-tailed in-degree), inside the node's class with
  probability `p_within` (homophily), else from the whole graph.
- Classes are planted: node v is in class v % num_classes and its features are
  `feature_signal` x the class centroid + standard normal noise, so accuracy is learnable
  from features and improves by aggregating same-class neighbours.

Rows may repeat a neighbour (a multigraph) but never hold the node itself.
Shape legend: N nodes, E neighbour entries, F features, C classes.
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from frugal._typing import I64
from frugal.data.graph import GRAPH_FILES, Graph
from frugal.data.synthetic import truncated_zipf_ranks

__all__ = ["PapersLikeConfig", "papers_like"]

_NPY_HEADER_BYTES = 128  # numpy's .npy header for these shapes (format 1.0, padded to 64)
_PERMUTATION_BASE = 0x9E3779B97F4A7C15 % (1 << 40)  # odd multiplier of the affine permutations


@dataclass(frozen=True, kw_only=True, slots=True)
class PapersLikeConfig:
    """Settings of `papers_like`; together with the seed they fix every byte written."""

    num_nodes: int = 100_000
    """Nodes N, in [2, 2^31] (ogbn-papers100M: 111,059,956)."""
    seed: int = 0
    """Seed of everything drawn, >= 0."""
    num_features: int = 128
    """Feature width F (ogbn-papers100M: 128), in [1, 4096]."""
    num_classes: int = 172
    """Classes C (ogbn-papers100M: 172), in [2, N]."""
    degree_min: float = 5.0
    """Pareto scale of neighbour-list lengths, > 0 (the bulk of nodes has this many)."""
    degree_exponent: float = 1.5
    """Pareto tail exponent of neighbour-list lengths, > 1 (smaller: heavier tail)."""
    max_degree: int = 10_000
    """Longest neighbour list, >= 1 (capped at N - 1)."""
    popularity_alpha: float = 0.5
    """Zipf exponent of how often a node is chosen as a neighbour, in (0, 2]; 0.5 gives an
    in-degree tail P(in-degree > d) ~ d^-2, as in citation graphs."""
    p_within: float = 0.7
    """Probability that a neighbour is drawn from the node's own class, in [0, 1]."""
    feature_signal: float = 0.5
    """Scale of the class centroid in the features (unit-variance noise), >= 0."""
    split: tuple[float, float, float] = (0.0109, 0.0011, 0.0019)
    """(train, val, test) shares of the nodes (ogbn-papers100M's: 1.2M, 125k, 214k of 111M)."""
    chunk_nodes: int = 1 << 17
    """Nodes generated per seeded chunk, >= 1; part of the graph's identity."""

    def __post_init__(self) -> None:
        checks = [
            (2 <= self.num_nodes <= 1 << 31, f"num_nodes={self.num_nodes} must be in [2, 2^31]"),
            (self.seed >= 0, f"seed={self.seed} must be >= 0"),
            (
                1 <= self.num_features <= 4096,
                f"num_features={self.num_features} must be in [1, 4096]",
            ),
            (
                2 <= self.num_classes <= self.num_nodes,
                f"num_classes={self.num_classes} must be in [2, num_nodes={self.num_nodes}]",
            ),
            (self.degree_min > 0, f"degree_min={self.degree_min} must be > 0"),
            (self.degree_exponent > 1, f"degree_exponent={self.degree_exponent} must be > 1"),
            (self.max_degree >= 1, f"max_degree={self.max_degree} must be >= 1"),
            (
                0 < self.popularity_alpha <= 2,
                f"popularity_alpha={self.popularity_alpha} must be in (0, 2]",
            ),
            (0 <= self.p_within <= 1, f"p_within={self.p_within} must be in [0, 1]"),
            (self.feature_signal >= 0, f"feature_signal={self.feature_signal} must be >= 0"),
            (
                len(self.split) == 3
                and all(0 <= f <= 1 for f in self.split)
                and sum(self.split) <= 1,
                f"split={self.split} must be three shares in [0, 1] summing to <= 1",
            ),
            (self.chunk_nodes >= 1, f"chunk_nodes={self.chunk_nodes} must be >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def effective_max_degree(self) -> int:
        """The cap on neighbour-list lengths: min(max_degree, N - 1)."""
        return min(self.max_degree, self.num_nodes - 1)

    def expected_mean_degree(self) -> float:
        """E[deg] = sum over k in 1..max of P(X >= k) = min(1, (degree_min / k)^exponent)."""
        k = np.arange(1, self.effective_max_degree + 1, dtype=np.float64)
        tail = np.minimum(1.0, (self.degree_min / k) ** self.degree_exponent)
        return float(tail.sum())

    def expected_num_edges(self) -> int:
        """Expected E (the realised count differs by sampling noise, ~0.1% at 1M nodes)."""
        return round(self.num_nodes * self.expected_mean_degree())

    def expected_disk_bytes(self) -> int:
        """Expected bytes of the folder `papers_like` writes (files plus headers).

        indptr 8(N+1) + indices 8E + features 4NF + labels 8N + split ids 8N(sum of shares),
        each file with a 128-byte .npy header, plus `graph.json` (< 128 bytes).
        """
        n = self.num_nodes
        data = (
            8 * (n + 1)
            + 8 * self.expected_num_edges()
            + 4 * n * self.num_features
            + 8 * n
            + 8 * round(n * sum(self.split))
        )
        return data + _NPY_HEADER_BYTES * (len(GRAPH_FILES) + 1) + 128


def _coprime_multiplier(modulus: int) -> int:
    """An odd multiplier coprime with `modulus` (an affine map mod it is then a bijection)."""
    a = _PERMUTATION_BASE % max(modulus, 1) or 1
    while math.gcd(a, modulus) != 1:
        a += 1
    return a


def _node_degrees(config: PapersLikeConfig, chunk: int, count: int) -> I64:
    rng = np.random.default_rng([config.seed, chunk, 1])
    u = rng.random(count)
    x = config.degree_min * (1.0 - u) ** (-1.0 / config.degree_exponent)
    return np.minimum(np.floor(x), config.effective_max_degree).astype(np.int64)


def papers_like(folder: str | Path, config: PapersLikeConfig | None = None) -> Graph:
    """Write an ogbn-papers100M-shaped graph to `folder` and return it memory-mapped.

    A first pass over chunks of `chunk_nodes` nodes counts the neighbour entries; the second
    draws each chunk's lengths again, its neighbours, features, labels and split, and appends
    them to the `.npy` files with plain writes (no writable map keeps pages resident). Every
    chunk has its own seeded generator, so the bytes depend only on the config. At 20M nodes
    the folder holds about 12.85 GB (`PapersLikeConfig.expected_disk_bytes`).

    Args:
        folder: A folder to create or an empty one.
        config: The settings; default `PapersLikeConfig()` (100k nodes).

    Returns:
        `Graph.load(folder)`: arrays memory-mapped read-only.

    Raises:
        ValueError: If `folder` holds files already.
    """
    config = config or PapersLikeConfig()
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    if any(path.iterdir()):
        raise ValueError(f"{path} is not empty; give papers_like a new folder")
    n, c, step = config.num_nodes, config.num_classes, config.chunk_nodes
    chunks = list(enumerate(range(0, n, step)))
    total = sum(int(_node_degrees(config, i, min(step, n - s)).sum()) for i, s in chunks)
    centroids_CF = (
        np.random.default_rng([config.seed, 0, 5])
        .standard_normal((c, config.num_features))
        .astype(np.float32)
    )
    # Popularity ranks map to nodes through affine permutations: one over all nodes, one per
    # class over its members v = class + C * j, j in [0, M_class). Classes below n % C have
    # one member more than the others, so there are two class sizes.
    class_sizes = np.array([(n - k + c - 1) // c for k in range(c)], dtype=np.int64)
    class_mult = np.array([_coprime_multiplier(int(m)) for m in class_sizes], dtype=np.int64)
    global_mult = _coprime_multiplier(n)
    offset_rng = np.random.default_rng([config.seed, 0, 6])
    global_shift = int(offset_rng.integers(0, n))
    class_shift = offset_rng.integers(0, 1 << 30, size=c) % class_sizes
    splits: list[list[I64]] = [[], [], []]
    cut = np.cumsum(config.split)
    with contextlib.ExitStack() as files:
        indptr_out = files.enter_context(_NpyWriter(path / "indptr.npy", np.int64, (n + 1,)))
        indices_out = files.enter_context(_NpyWriter(path / "indices.npy", np.int64, (total,)))
        features_out = files.enter_context(
            _NpyWriter(path / "features.npy", np.float32, (n, config.num_features))
        )
        labels_out = files.enter_context(_NpyWriter(path / "labels.npy", np.int64, (n,)))
        indptr_out.write(np.zeros(1, dtype=np.int64))
        written = 0
        for index, start in chunks:
            count = min(step, n - start)
            degrees = _node_degrees(config, index, count)
            indptr_out.write(written + np.cumsum(degrees))
            written += int(degrees.sum())
            rng = np.random.default_rng([config.seed, index, 2])
            nodes = np.arange(start, start + count, dtype=np.int64)
            owner = np.repeat(nodes, degrees)
            owner_class = owner % c
            within = rng.random(len(owner)) < config.p_within
            draws = rng.random(len(owner))
            neighbours = np.empty(len(owner), dtype=np.int64)
            # Within the class: a popularity rank among its members, permuted.
            for size in np.unique(class_sizes):
                pick = within & (class_sizes[owner_class] == size)
                rank = truncated_zipf_ranks(draws[pick], int(size), config.popularity_alpha)
                k = owner_class[pick]
                neighbours[pick] = k + c * ((rank * class_mult[k] + class_shift[k]) % size)
            # Anywhere: a popularity rank among all N nodes, permuted.
            rank = truncated_zipf_ranks(draws[~within], n, config.popularity_alpha)
            neighbours[~within] = (rank * global_mult + global_shift) % n
            self_loop = neighbours == owner
            neighbours[self_loop] = (neighbours[self_loop] + 1) % n
            indices_out.write(neighbours)
            node_class = nodes % c
            features_BF = rng.standard_normal((count, config.num_features), dtype=np.float32)
            features_BF += np.float32(config.feature_signal) * centroids_CF[node_class]
            features_out.write(features_BF)
            labels_out.write(node_class)
            share = rng.random(count)
            for part in range(3):
                low = cut[part - 1] if part else 0.0
                splits[part].append(nodes[(share >= low) & (share < cut[part])])
    for name, pieces in zip(GRAPH_FILES[3:], splits, strict=True):
        np.save(path / name, np.concatenate(pieces))
    meta = {"num_nodes": n, "num_edges": total, "num_classes": c}
    (path / "graph.json").write_text(json.dumps(meta) + "\n")
    return Graph.load(path)


class _NpyWriter:
    """Writes a `.npy` file front to back: the header for the final shape, then chunks."""

    def __init__(self, path: Path, dtype: type[np.generic], shape: tuple[int, ...]) -> None:
        self.path = path
        self.dtype = np.dtype(dtype)
        self.expected_bytes = int(np.prod(shape)) * self.dtype.itemsize
        self.written_bytes = 0
        self.file = path.open("wb")
        header = {
            "descr": np.lib.format.dtype_to_descr(self.dtype),
            "fortran_order": False,
            "shape": shape,
        }
        np.lib.format.write_array_header_1_0(self.file, header)

    def write(self, array: np.ndarray) -> None:
        data = np.ascontiguousarray(array, dtype=self.dtype)
        self.file.write(data.tobytes())
        self.written_bytes += data.nbytes

    def __enter__(self) -> _NpyWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()
        # An internal invariant: the chunks add up to the shape in the header.
        assert exc[0] is not None or self.written_bytes == self.expected_bytes, self.path
