"""`NeighborSampler`: seeded numpy fan-out sampling of mini-batches (GraphSAGE's sampler).

For every batch of seed nodes the sampler draws, hop by hop, up to `fanouts[h]` distinct
neighbours of every node reached so far (all of them when a node has fewer), as DGL's
`MultiLayerNeighborSampler` with `replace=False`. A batch's draws depend only on the seed,
the epoch and the batch's position, so iterating ahead (to hint a store) changes nothing.

References:
    Inductive Representation Learning on Large Graphs (GraphSAGE), NeurIPS 2017,
    arXiv 1706.02216, Algorithm 2 (minibatch forward propagation with sampled neighbourhoods).

Shape legend: B seed nodes, S sampled nodes (seeds first), E sampled edges of one block.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from frugal._typing import I64
from frugal.data.graph import Graph

__all__ = ["Block", "NeighborSampler", "SampledBatch"]


@dataclass(frozen=True, eq=False)
class Block:
    """One layer's sampled edges, src -> dst, in local ids of the batch's `n_id`.

    The dst nodes are `n_id[:num_dst]` and the src nodes `n_id[:num_src]` (dst nodes come
    first among the src nodes, as in DGL's message-flow graphs and PyG's NeighborLoader).

    Attributes:
        src: Local id of each edge's source (a sampled neighbour), in [0, num_src).
        dst: Local id of each edge's destination, in [0, num_dst), non-decreasing.
        num_src: Nodes this layer reads.
        num_dst: Nodes this layer writes.

    Shapes:
        src, dst: (E,).
    """

    src: I64
    dst: I64
    num_src: int
    num_dst: int


@dataclass(frozen=True, eq=False)
class SampledBatch:
    """A mini-batch: its seed nodes, every node it reads and one block per layer.

    Attributes:
        step: Position of the batch in the sampler's stream (0, 1, ...).
        seeds: Global ids of the seed (output) nodes.
        n_id: Global ids of all sampled nodes, unique, `seeds` first; the rows to read.
        blocks: One block per layer, from the input layer to the output layer (the last
            block's dst nodes are the seeds).
        sample_s: Seconds spent sampling this batch.

    Shapes:
        seeds: (B,); n_id: (S,).
    """

    step: int
    seeds: I64
    n_id: I64
    blocks: tuple[Block, ...]
    sample_s: float = 0.0


def _sample_positions(degrees: I64, fanout: int, rng: np.random.Generator) -> tuple[I64, I64]:
    """For each node, min(fanout, degree) distinct positions in [0, degree), uniformly.

    Nodes with degree <= fanout take every position; the others run Robert Floyd's algorithm
    (a uniform k-subset in k steps, vectorised over nodes).

    Returns:
        (node, position): the index of the node each draw belongs to (non-decreasing) and the
        position drawn within that node's neighbour list.
    """
    take_all = degrees <= fanout
    counts = np.where(take_all, degrees, fanout)
    node = np.repeat(np.arange(len(degrees), dtype=np.int64), counts)
    starts = np.cumsum(counts) - counts
    position = np.arange(len(node), dtype=np.int64) - np.repeat(starts, counts)
    big = np.flatnonzero(~take_all)
    if len(big) and fanout > 0:
        n = degrees[big]
        picks = np.empty((len(big), fanout), dtype=np.int64)
        draws = rng.random((len(big), fanout))
        for i in range(fanout):
            j = n - fanout + i
            t = np.minimum((draws[:, i] * (j + 1)).astype(np.int64), j)
            seen = (picks[:, :i] == t[:, None]).any(axis=1)
            picks[:, i] = np.where(seen, j, t)
        picks.sort(axis=1)
        rows = np.repeat(starts[big], fanout) + np.tile(np.arange(fanout), len(big))
        position[rows] = picks.ravel()
    return node, position


class NeighborSampler:
    """Seeded mini-batches of a graph's nodes with fan-out neighbour sampling.

    Iterating gives one epoch: the nodes shuffled (seeded by `seed` and the epoch number, set
    with `set_epoch`), cut into batches of `batch_size` (the last may be smaller), each
    sampled hop by hop. `sample(seeds, step)` samples any given seeds.

    Args:
        graph: The graph; its CSR may be memory-mapped.
        fanouts: Neighbours drawn per node at each hop, from the seeds outwards (PyG's
            `num_neighbors` order; DGL lists them input layer first); one per layer, each
            >= 0 (MLKV's DGL setup: 5, 5, 5).
        batch_size: Seed nodes per batch, >= 1 (MLKV: 1024).
        seed: Seed of the shuffles and the draws.
        nodes: The node ids to batch (default: `graph.train_ids`).
        shuffle: Shuffle the nodes every epoch (off: in the given order).

    Raises:
        ValueError: If a fanout is negative, batch_size < 1, or a node id is out of range.
    """

    def __init__(
        self,
        graph: Graph,
        fanouts: tuple[int, ...] = (5, 5, 5),
        batch_size: int = 1024,
        *,
        seed: int = 0,
        nodes: npt.ArrayLike | None = None,
        shuffle: bool = True,
    ) -> None:
        fanouts = tuple(fanouts)
        if not fanouts or any(
            isinstance(f, bool) or not isinstance(f, (int, np.integer)) or f < 0 for f in fanouts
        ):
            raise ValueError(
                f"fanouts={fanouts} must be one integer >= 0 per layer, e.g. (5, 5, 5)"
            )
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be an integer >= 1")
        ids = graph.train_ids if nodes is None else np.asarray(nodes)
        if ids.dtype == np.bool_ or not np.issubdtype(ids.dtype, np.integer) or ids.ndim != 1:
            raise TypeError(f"nodes must be a 1-D integer array, got {ids.dtype} {ids.shape}")
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= graph.num_nodes):
            bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
            raise ValueError(
                f"nodes holds id {bad}, outside [0, num_nodes={graph.num_nodes}); pass ids of "
                "this graph"
            )
        if len(np.unique(ids)) != len(ids):
            raise ValueError("nodes repeats an id; pass each seed node once")
        self.graph = graph
        self.fanouts = tuple(int(f) for f in fanouts)
        self.batch_size = batch_size
        self.seed = seed
        self.nodes: I64 = ids.astype(np.int64)
        self.shuffle = shuffle
        self.epoch = 0

    def __len__(self) -> int:
        """Batches per epoch."""
        return -(-len(self.nodes) // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose shuffle and draws the next iteration uses."""
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[SampledBatch]:
        """Yield the batches of the current epoch, in order."""
        order = self.nodes
        if self.shuffle:
            order = order[np.random.default_rng([self.seed, self.epoch, 0]).permutation(len(order))]
        for index, start in enumerate(range(0, len(order), self.batch_size)):
            yield self.sample(order[start : start + self.batch_size], index)

    def sample(self, seeds: npt.ArrayLike, step: int) -> SampledBatch:
        """Sample the blocks of one batch of seed nodes.

        The draws come from a generator seeded by (seed, epoch, step), so the same call gives
        the same batch whenever it is made.

        Args:
            seeds: Unique global node ids (B,).
            step: The batch's position in the stream (seeds the draws).

        Returns:
            The batch; its `n_id` starts with `seeds` in the given order.

        Raises:
            ValueError: If a seed is out of range or repeats.
        """
        start_s = time.perf_counter()
        seeds_B = np.asarray(seeds, dtype=np.int64)
        if seeds_B.size and (int(seeds_B.min()) < 0 or int(seeds_B.max()) >= self.graph.num_nodes):
            raise ValueError(
                f"seeds reach outside [0, num_nodes={self.graph.num_nodes}); pass this graph's ids"
            )
        if len(np.unique(seeds_B)) != len(seeds_B):
            raise ValueError("seeds repeat a node; a batch lists each seed once")
        rng = np.random.default_rng([self.seed, self.epoch, 1, step])
        indptr, indices = self.graph.indptr, self.graph.indices
        n_id = seeds_B.copy()
        blocks: list[Block] = []
        for fanout in self.fanouts:
            num_dst = len(n_id)
            start = indptr[n_id]
            node, position = _sample_positions(indptr[n_id + 1] - start, fanout, rng)
            neighbour = np.asarray(indices[start[node] + position], dtype=np.int64)
            # Local ids: known nodes keep theirs, new ones are appended in first-seen order.
            sorter = np.argsort(n_id, kind="stable")
            where = np.searchsorted(n_id, neighbour, sorter=sorter)
            where = np.minimum(where, len(n_id) - 1)
            known = n_id[sorter[where]] == neighbour
            local = np.empty(len(neighbour), dtype=np.int64)
            local[known] = sorter[where[known]]
            new_ids, first, inverse = np.unique(
                neighbour[~known], return_index=True, return_inverse=True
            )
            rank = np.empty(len(new_ids), dtype=np.int64)
            rank[np.argsort(first, kind="stable")] = np.arange(len(new_ids))
            local[~known] = num_dst + rank[inverse.ravel()]
            appended = np.empty(len(new_ids), dtype=np.int64)
            appended[rank] = new_ids
            n_id = np.concatenate([n_id, appended])
            blocks.append(Block(src=local, dst=node, num_src=len(n_id), num_dst=num_dst))
        return SampledBatch(
            step=step,
            seeds=seeds_B,
            n_id=n_id,
            blocks=tuple(reversed(blocks)),
            sample_s=time.perf_counter() - start_s,
        )
