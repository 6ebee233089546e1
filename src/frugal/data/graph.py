"""`Graph`: a static graph in CSR form with node labels and train/val/test node ids.

The container every node-classification consumer in frugal reads (the GNN workload of
`frugal.store.gnn`). Row v of the CSR lists the neighbours v aggregates from:
`indices[indptr[v]:indptr[v + 1]]`. Arrays may be memory-mapped `.npy` files (`Graph.load`),
so a graph larger than RAM is sampled without being read whole.

Shape legend: N nodes, E stored neighbour entries (directed; an undirected edge counts twice).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from frugal._typing import F32, I64
from frugal.data.events import TemporalEvents

__all__ = ["GRAPH_FILES", "Graph", "split_nodes"]

GRAPH_FILES: tuple[str, ...] = (
    "indptr.npy",
    "indices.npy",
    "labels.npy",
    "train_ids.npy",
    "val_ids.npy",
    "test_ids.npy",
)
"""The `.npy` files of a graph folder (`Graph.save`/`Graph.load`); `features.npy` (float32,
(N, F)) is optional, and `graph.json` holds `num_nodes`, `num_edges` and `num_classes`."""


def _as_int64(name: str, value: Any) -> I64:
    array = np.asarray(value)
    if array.size == 0 and array.ndim == 1:  # [] parses as float64
        return np.zeros(0, dtype=np.int64)
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{name} must be integers, got dtype {array.dtype}; pass an int64 array")
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {array.shape}")
    out: I64 = array if array.dtype == np.int64 else array.astype(np.int64)
    return out


def _check_ids(name: str, ids: I64, num_nodes: int) -> None:
    if ids.size == 0:
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0:
        raise ValueError(
            f"{name} holds the negative node id {low}; node ids must be in [0, "
            f"num_nodes={num_nodes}); re-index the nodes"
        )
    if high >= num_nodes:
        raise ValueError(
            f"{name} holds node id {high}, outside [0, num_nodes={num_nodes}); re-index the "
            "nodes or raise num_nodes"
        )


def split_nodes(
    candidates: npt.ArrayLike, fractions: tuple[float, float, float], seed: int
) -> tuple[I64, I64, I64]:
    """Split node ids into train/val/test by a seeded permutation.

    Args:
        candidates: The node ids to split (e.g. the labelled ones).
        fractions: (train, val, test) shares, each in [0, 1], summing to at most 1 (the rest
            is left out).
        seed: Permutation seed.

    Returns:
        Sorted train, val and test ids (disjoint).

    Raises:
        ValueError: If a fraction is outside [0, 1] or they sum to more than 1.
    """
    if len(fractions) != 3 or any(not 0.0 <= f <= 1.0 for f in fractions):
        raise ValueError(f"fractions={fractions} must be three shares in [0, 1]")
    if sum(fractions) > 1.0 + 1e-9:
        raise ValueError(f"fractions={fractions} sum to {sum(fractions)} > 1")
    ids = _as_int64("candidates", candidates)
    order = np.random.default_rng([seed, 7]).permutation(len(ids))
    num_train = round(fractions[0] * len(ids))
    num_val = round(fractions[1] * len(ids))
    num_test = min(round(fractions[2] * len(ids)), len(ids) - num_train - num_val)
    cut = np.cumsum([num_train, num_val, num_test])
    parts = np.split(ids[order], cut)[:3]
    train, val, test = (np.sort(p) for p in parts)
    return train, val, test


@dataclass(frozen=True, eq=False)
class Graph:
    """A static graph in CSR form with node labels and train/val/test node ids.

    Attributes:
        indptr: CSR row pointers, int64, non-decreasing, indptr[0] = 0, indptr[N] = E.
        indices: Neighbour ids, int64 in [0, num_nodes); row v is
            indices[indptr[v]:indptr[v + 1]] (a node may repeat in a row: a multigraph).
        num_nodes: N, >= 1.
        labels: Class of every node, int64 in [-1, num_classes) (-1: unlabelled).
        train_ids: Training node ids (labelled, in [0, N)).
        val_ids: Validation node ids.
        test_ids: Test node ids.
        features: Node features, float32, or None (a graph without input features).
        num_classes: Number of classes; default max(labels) + 1.

    Raises:
        ValueError: On construction, if lengths mismatch, `indptr` is not a valid CSR pointer
            array, an id is negative or >= num_nodes, or a split node is unlabelled.
        TypeError: If ids are not integers or features are not float32.

    Shapes:
        indptr: (N + 1,); indices: (E,); labels: (N,); features: (N, F).
    """

    indptr: I64
    indices: I64
    num_nodes: int
    labels: I64
    train_ids: I64
    val_ids: I64
    test_ids: I64
    features: F32 | None = None
    num_classes: int = -1

    def __post_init__(self) -> None:
        if isinstance(self.num_nodes, bool) or not isinstance(self.num_nodes, (int, np.integer)):
            raise TypeError(f"num_nodes={self.num_nodes!r} must be an integer")
        if self.num_nodes < 1:
            raise ValueError(f"num_nodes={self.num_nodes} must be >= 1")
        n = int(self.num_nodes)
        object.__setattr__(self, "num_nodes", n)
        for name in ("indptr", "indices", "labels", "train_ids", "val_ids", "test_ids"):
            object.__setattr__(self, name, _as_int64(name, getattr(self, name)))
        if len(self.indptr) != n + 1:
            raise ValueError(
                f"indptr has {len(self.indptr)} entries but num_nodes={n} needs {n + 1} "
                "(one row pointer per node plus the end)"
            )
        if int(self.indptr[0]) != 0 or int(self.indptr[-1]) != len(self.indices):
            raise ValueError(
                f"indptr runs from {int(self.indptr[0])} to {int(self.indptr[-1])} but must run "
                f"from 0 to len(indices)={len(self.indices)}"
            )
        if n > 1 and bool((np.diff(self.indptr) < 0).any()):
            row = int(np.flatnonzero(np.diff(self.indptr) < 0)[0])
            raise ValueError(f"indptr decreases at node {row}; row pointers must not decrease")
        _check_ids("indices", self.indices, n)
        if len(self.labels) != n:
            raise ValueError(f"labels has {len(self.labels)} entries but num_nodes={n}")
        if self.labels.size and int(self.labels.min()) < -1:
            raise ValueError(
                f"labels holds {int(self.labels.min())}; classes are >= 0, -1 marks unlabelled"
            )
        top = int(self.labels.max()) + 1 if self.labels.size else 0
        if self.num_classes == -1:
            object.__setattr__(self, "num_classes", max(top, 1))
        elif self.num_classes < top:
            raise ValueError(
                f"num_classes={self.num_classes} but labels reach {top - 1}; raise num_classes"
            )
        for name in ("train_ids", "val_ids", "test_ids"):
            ids = getattr(self, name)
            _check_ids(name, ids, n)
            if ids.size and bool((self.labels[ids] < 0).any()):
                bad = int(ids[self.labels[ids] < 0][0])
                raise ValueError(f"{name} holds node {bad}, which has no label (-1)")
        for first, second in (("train_ids", "val_ids"), ("train_ids", "test_ids"),
                              ("val_ids", "test_ids")):  # fmt: skip
            common = np.intersect1d(getattr(self, first), getattr(self, second))
            if common.size:
                raise ValueError(
                    f"{first} and {second} share {common.size} nodes, e.g. "
                    f"{common[:5].tolist()}; give each node one split (a test node trained on "
                    "inflates the accuracy)"
                )
        if self.features is not None:
            if not isinstance(self.features, np.ndarray) or self.features.dtype != np.float32:
                raise TypeError("features must be a float32 numpy array (N, F) or None")
            if self.features.ndim != 2 or len(self.features) != n:
                raise ValueError(
                    f"features has shape {self.features.shape} but must be (num_nodes={n}, F)"
                )

    @property
    def num_edges(self) -> int:
        """E, the stored neighbour entries (an undirected edge counts twice)."""
        return len(self.indices)

    @property
    def num_features(self) -> int:
        """F, the width of `features` (0 without features)."""
        return 0 if self.features is None else int(self.features.shape[1])

    def degrees(self) -> I64:
        """Neighbour-list length of every node, (N,)."""
        out: I64 = np.diff(self.indptr)
        return out

    @classmethod
    def from_edges(
        cls,
        src: npt.ArrayLike,
        dst: npt.ArrayLike,
        num_nodes: int,
        labels: npt.ArrayLike,
        *,
        train_ids: npt.ArrayLike,
        val_ids: npt.ArrayLike,
        test_ids: npt.ArrayLike,
        features: F32 | None = None,
        undirected: bool = True,
    ) -> Graph:
        """Build the CSR from an edge list (duplicates and self-loops dropped).

        Args:
            src: Source node of every edge.
            dst: Destination node of every edge, same length.
            num_nodes: N; ids must lie in [0, N).
            labels: Class of every node (-1: unlabelled).
            train_ids: Training node ids.
            val_ids: Validation node ids.
            test_ids: Test node ids.
            features: Optional float32 node features (N, F).
            undirected: Add every edge in both directions (as DGL's `to_bidirected`).

        Returns:
            The graph; row v lists the sources of edges into v (sorted).

        Raises:
            ValueError: If src and dst differ in length or an id is out of range.
            TypeError: If ids are not integers.
        """
        s, d = _as_int64("src", src), _as_int64("dst", dst)
        if len(s) != len(d):
            raise ValueError(f"src has {len(s)} edges but dst has {len(d)}; pass equal lengths")
        _check_ids("src", s, num_nodes)
        _check_ids("dst", d, num_nodes)
        if undirected:
            s, d = np.concatenate([s, d]), np.concatenate([d, s])
        keep = s != d
        key = np.unique(d[keep] * num_nodes + s[keep])  # sorted by (dst, src), deduplicated
        rows, neighbours = key // num_nodes, key % num_nodes
        indptr = np.zeros(num_nodes + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=num_nodes), out=indptr[1:])
        return cls(
            indptr=indptr,
            indices=neighbours.astype(np.int64),
            num_nodes=num_nodes,
            labels=_as_int64("labels", labels),
            train_ids=_as_int64("train_ids", train_ids),
            val_ids=_as_int64("val_ids", val_ids),
            test_ids=_as_int64("test_ids", test_ids),
            features=features,
        )

    @classmethod
    def from_events(
        cls,
        events: TemporalEvents,
        *,
        split: tuple[float, float, float] = (0.6, 0.2, 0.2),
        seed: int = 0,
    ) -> Graph:
        """The static, undirected graph of a temporal graph's events, labelled by node class.

        Edges keep no time (duplicates merge); labelled nodes are split by `split_nodes`.
        PubMed (`load_events("pubmed")`) gives 19,717 nodes and 3 classes; its bundled files
        hold no word features, so the graph has none.

        Args:
            events: Events with static node classes (`node_label`).
            split: (train, val, test) shares of the labelled nodes; the default 60/20/20 is
                the random full-supervised split of Geom-GCN (ICLR 2020) on PubMed.
            seed: Split seed.

        Returns:
            The graph.

        Raises:
            ValueError: If the events carry no node classes, or `split` is invalid.
        """
        if events.node_label is None:
            raise ValueError(
                "these events carry no node classes (node_label is None); node "
                "classification needs a dataset with labels, e.g. 'pubmed'"
            )
        labels = events.node_label.astype(np.int64)
        train, val, test = split_nodes(np.flatnonzero(labels >= 0), split, seed)
        return cls.from_edges(
            events.src,
            events.dst,
            events.num_nodes,
            labels,
            train_ids=train,
            val_ids=val,
            test_ids=test,
        )

    def save(self, folder: str | Path) -> Path:
        """Write the graph as `.npy` files plus `graph.json` into `folder` (created).

        Returns:
            The folder.
        """
        path = Path(folder)
        path.mkdir(parents=True, exist_ok=True)
        arrays = (
            self.indptr,
            self.indices,
            self.labels,
            self.train_ids,
            self.val_ids,
            self.test_ids,
        )
        for name, array in zip(GRAPH_FILES, arrays, strict=True):
            np.save(path / name, array)
        if self.features is not None:
            np.save(path / "features.npy", self.features)
        meta = {
            "num_nodes": self.num_nodes,
            "num_edges": self.num_edges,
            "num_classes": self.num_classes,
        }
        (path / "graph.json").write_text(json.dumps(meta, indent=1) + "\n")
        return path

    @classmethod
    def load(cls, folder: str | Path, *, mmap: bool = True) -> Graph:
        """Read a graph folder written by `save` or `frugal.data.papers_like`.

        Args:
            folder: The folder.
            mmap: Memory-map the CSR and features (read-only) instead of reading them.

        Returns:
            The graph (validated; with `mmap` the O(E) checks touch every page once).

        Raises:
            FileNotFoundError: If a file of `GRAPH_FILES` or `graph.json` is missing.
            ValueError: If the arrays do not form a valid graph.
        """
        path = Path(folder)
        missing = [n for n in (*GRAPH_FILES, "graph.json") if not (path / n).is_file()]
        if missing:
            raise FileNotFoundError(
                f"{path} lacks {missing}; write the folder with Graph.save or papers_like"
            )
        mode: Literal["r"] | None = "r" if mmap else None
        arrays = [np.load(path / name, mmap_mode=mode, allow_pickle=False) for name in GRAPH_FILES]
        meta = json.loads((path / "graph.json").read_text())
        feature_path = path / "features.npy"
        features = (
            np.load(feature_path, mmap_mode=mode, allow_pickle=False)
            if feature_path.is_file()
            else None
        )
        return cls(
            indptr=arrays[0],
            indices=arrays[1],
            num_nodes=int(meta["num_nodes"]),
            labels=arrays[2],
            train_ids=arrays[3],
            val_ids=arrays[4],
            test_ids=arrays[5],
            features=features,
            num_classes=int(meta["num_classes"]),
        )
