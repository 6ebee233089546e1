"""Temporal walks backwards in time and their set-based anonymisation (CAW's hitting counts).

`sample_walks` draws M walks of L steps from each query node, every step to an earlier
event of the current node with probability proportional to exp(alpha (t' - t)) (with
`spatial_bias`, NeurTW's mixture of that and a bias towards neighbours of higher degree),
vectorised over queries x walks (one `NeighborFinder.sample_time_biased` call per step).
`hitting_counts` replaces each node on a pair's walks by how often it occupies each walk
position in the source's and in the destination's walk set. `sample_walks_loop` is the
per-walk Python reference of the sampler, kept for the tests and the speed comparison
(`benchmarks/tgraph/walk_sampler_speed.py`).

Shape legend: Q queries (walk sets), M walks per set, L steps per walk (L + 1 nodes with the
start), P pairs.

References:
    Inductive Representation Learning in Temporal Networks via Causal Anonymous Walks, ICLR
    2021, arXiv 2101.05974 (section 4.1 sampling, section 4.2 set-based anonymisation);
    reference code snap-stanford/CAW, `graph.py` (`NeighborFinder.find_k_hop`) and
    `module.py` (`PositionEncoder.collect_pos_mapping_ptree_sample`, `enc='lp'`).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from frugal._typing import I64
from frugal.tgraph.neighbors import NeighborFinder

__all__ = ["TemporalWalks", "hitting_counts", "sample_walks", "sample_walks_loop"]


@dataclass(frozen=True, slots=True)
class TemporalWalks:
    """M temporal walks of L steps from each of Q start nodes, backwards in time.

    Position 0 is the start node at the query time; position i >= 1 the node reached over
    the i-th sampled event. A walk that finds no earlier event stops: its later positions
    are null (node -1, eid 0, t 0, mask False).

    Attributes:
        node: Node at each position, (Q, M, L + 1), -1 where null.
        eid: Global id of the event taken into each position (0 at position 0 and null),
            (Q, M, L + 1).
        t: Time of that event (the query time at position 0; 0 where null), (Q, M, L + 1).
        mask: True where the position holds a node, (Q, M, L + 1).
    """

    node: I64
    eid: I64
    t: I64
    mask: npt.NDArray[np.bool_]


def sample_walks(
    finder: NeighborFinder,
    node: I64,
    t: I64,
    max_eid: I64,
    *,
    num_walks: int,
    walk_length: int,
    alpha: float,
    rng: np.random.Generator,
    spatial_bias: float = 0.0,
) -> TemporalWalks:
    """M walks of L steps backwards in time from each query (node, t), no event at or after t.

    Step 1 draws M events of the start node strictly before t (and with id < max_eid);
    step i > 1 draws one event of the walk's current node strictly before the time of the
    event taken at step i - 1 (CAW's `find_k_hop` with n_degree [M, 1, ..., 1]). Each draw
    is proportional to exp(alpha (t' - t_ref)), t_ref the current node's time on the walk;
    with `spatial_bias` > 0, NeurTW's spatio-temporal mixture of that and a bias towards
    neighbours of higher degree (`NeighborFinder.sample_time_biased`). The uniform numbers
    are `rng.random((Q, M))` per step, step 1 first.

    Args:
        finder: Neighbour finder over the events the walks may use.
        node: Start nodes, (Q,).
        t: Query times, (Q,).
        max_eid: Global event id bound per query: nothing with an id at or after it is
            used, (Q,).
        num_walks: M >= 1.
        walk_length: L >= 1.
        alpha: Recency bias alpha >= 0 per unit of t.
        rng: Random generator.
        spatial_bias: NeurTW's structural bias >= 0 (0, CAW's sampler: time bias alone).

    Returns:
        The walks.

    Raises:
        ValueError: If num_walks or walk_length < 1, or a bias < 0.
    """
    if num_walks < 1 or walk_length < 1:
        raise ValueError(f"num_walks={num_walks} and walk_length={walk_length} must be >= 1")
    node = np.asarray(node, dtype=np.int64)
    t = np.asarray(t, dtype=np.int64)
    max_eid = np.asarray(max_eid, dtype=np.int64)
    q, m, length = len(node), num_walks, walk_length + 1
    node_QML = np.full((q, m, length), -1, dtype=np.int64)
    eid_QML = np.zeros((q, m, length), dtype=np.int64)
    t_QML = np.zeros((q, m, length), dtype=np.int64)
    mask_QML = np.zeros((q, m, length), dtype=bool)
    node_QML[:, :, 0] = node[:, None]
    t_QML[:, :, 0] = t[:, None]
    mask_QML[:, :, 0] = True
    biases = {"alpha": alpha, "spatial_bias": spatial_bias}
    first = finder.sample_time_biased(node, finder.cutoff_before(t, max_eid), m, rng=rng, **biases)
    node_QML[:, :, 1] = np.where(first.mask, first.nbr, -1)
    eid_QML[:, :, 1], t_QML[:, :, 1], mask_QML[:, :, 1] = first.eid, first.t, first.mask
    bound_QM = np.broadcast_to(max_eid[:, None], (q, m)).ravel()
    for step in range(2, length):  # one vectorised draw per walk step (L - 1 rounds)
        alive = mask_QML[:, :, step - 1].ravel()
        current = np.where(alive, node_QML[:, :, step - 1].ravel(), 0)
        cutoff = finder.cutoff_before(t_QML[:, :, step - 1].ravel(), bound_QM)
        drawn = finder.sample_time_biased(current, cutoff, 1, rng=rng, **biases)
        ok = drawn.mask[:, 0] & alive
        node_QML[:, :, step] = np.where(ok, drawn.nbr[:, 0], -1).reshape(q, m)
        eid_QML[:, :, step] = np.where(ok, drawn.eid[:, 0], 0).reshape(q, m)
        t_QML[:, :, step] = np.where(ok, drawn.t[:, 0], 0).reshape(q, m)
        mask_QML[:, :, step] = ok.reshape(q, m)
    return TemporalWalks(node_QML, eid_QML, t_QML, mask_QML)


def sample_walks_loop(
    src: I64,
    dst: I64,
    t_events: I64,
    node: I64,
    t: I64,
    max_eid: I64,
    *,
    num_walks: int,
    walk_length: int,
    alpha: float,
    rng: np.random.Generator,
    spatial_bias: float = 0.0,
) -> TemporalWalks:
    """The per-walk Python reference of `sample_walks` (slow; for tests and the speed check).

    Walks per-node adjacency lists (global ids = positions) as CAW's `get_temporal_neighbor`
    does, one query and one walk at a time: the current node's events strictly before the
    reference time and with id < max_eid, weights exp(alpha (t' - t_ref)) normalised (with
    `spatial_bias` beta > 0, averaged with exp(-beta / (d + 0.01)) normalised, d the
    neighbour's number of events before the event, as NeurTW's `get_temporal_neighbor`),
    inverse-CDF draw with the same uniform numbers as `sample_walks` (so the two return
    the same walks up to floating-point ties), M draws sorted for step 1.

    Args:
        src: Source of every event, (E,).
        dst: Destination of every event, (E,).
        t_events: Time of every event, non-decreasing, (E,).
        node: Start nodes, (Q,).
        t: Query times, (Q,).
        max_eid: Event id bound per query, (Q,).
        num_walks: M.
        walk_length: L.
        alpha: Recency bias.
        rng: Random generator.
        spatial_bias: NeurTW's structural bias (0: none).

    Returns:
        The walks, as `sample_walks` returns them.
    """
    q, m, length = len(node), num_walks, walk_length + 1
    out_node = np.full((q, m, length), -1, dtype=np.int64)
    out_eid = np.zeros((q, m, length), dtype=np.int64)
    out_t = np.zeros((q, m, length), dtype=np.int64)
    mask = np.zeros((q, m, length), dtype=bool)
    uniforms = [rng.random((q, m)) for _ in range(walk_length)]
    # Per-node time-sorted adjacency lists, as CAW's `NeighborFinder.init_off_set`.
    adjacency: dict[int, list[tuple[int, int, int]]] = {}
    for e, (a, b, te) in enumerate(zip(src.tolist(), dst.tolist(), t_events.tolist(), strict=True)):
        adjacency.setdefault(a, []).append((b, e, te))
        if b != a:
            adjacency.setdefault(b, []).append((a, e, te))
    times = {u: [x[2] for x in rows] for u, rows in adjacency.items()}
    ids = {u: [x[1] for x in rows] for u, rows in adjacency.items()}

    def history(u: int, before_t: int, bound: int) -> list[tuple[int, int, int]]:
        """(neighbour, event id, time) of u's events before before_t and bound, time order."""
        if u not in adjacency:
            return []
        cut = min(bisect_left(times[u], before_t), bisect_left(ids[u], bound))  # CAW: find_before
        return adjacency[u][:cut]

    def draw(events: list[tuple[int, int, int]], t_ref: int, r: float) -> int:
        at = np.array([e[2] for e in events], dtype=np.float64)
        weight = np.exp(alpha * (at - t_ref))
        if spatial_bias > 0 and r >= 0.5:  # the degree-biased half of the mixture, as 2 r - 1
            r = 2.0 * r - 1.0
            degree = np.array([bisect_left(times[w], te) for w, _, te in events], np.float64)
            weight = np.exp(-spatial_bias / (degree + 0.01))
        elif spatial_bias > 0:
            r = 2.0 * r
        cdf = np.cumsum(weight / weight.sum())
        return min(int(np.searchsorted(cdf, r, side="right")), len(events) - 1)

    for i in range(q):  # one iteration per query
        out_node[i, :, 0], out_t[i, :, 0], mask[i, :, 0] = node[i], t[i], True
        events = history(int(node[i]), int(t[i]), int(max_eid[i]))
        if not events:
            continue
        picks = sorted(draw(events, int(t[i]), float(r)) for r in uniforms[0][i])
        for w in range(m):  # one iteration per walk
            nbr, e, te = events[picks[w]]
            out_node[i, w, 1], out_eid[i, w, 1], out_t[i, w, 1], mask[i, w, 1] = nbr, e, te, True
            for step in range(2, length):  # one iteration per further step
                here = history(int(out_node[i, w, step - 1]), int(out_t[i, w, step - 1]),
                               int(max_eid[i]))  # fmt: skip
                if not here:
                    break
                nbr, e, te = here[draw(here, int(out_t[i, w, step - 1]), uniforms[step - 1][i, w])]
                out_node[i, w, step], out_eid[i, w, step] = nbr, e
                out_t[i, w, step], mask[i, w, step] = te, True
    return TemporalWalks(out_node, out_eid, out_t, mask)


def hitting_counts(src_node: I64, dst_node: I64) -> tuple[I64, I64]:
    """CAW's set-based anonymisation: each walk node's position counts in both walk sets.

    For pair p with source walk set S (M walks) and destination walk set D, a node w is
    replaced by [I(w; S) || I(w; D)], I(w; S)[i] = |{walks W in S : W[i] = w}| for
    positions i = 0..L (CAW section 4.2). The reference code feeds I / M (landing
    probabilities, `enc='lp'`; the start node's 1 at position 0 is M / M). Null positions
    (-1) get zeros, as CAW's null node.

    Args:
        src_node: Nodes of each pair's source walks, (P, M, L + 1), -1 where null.
        dst_node: Nodes of each pair's destination walks, (P, M, L + 1).

    Returns:
        (counts of the source walks' nodes, counts of the destination walks' nodes), each
        (P, M, L + 1, 2, L + 1): [..., 0, i] = count at position i in S, [..., 1, i] in D.

    Shapes:
        src_node, dst_node: (P, M, L + 1) -> 2 x (P, M, L + 1, 2, L + 1), int64.
    """
    p, _, length = src_node.shape
    if dst_node.shape != src_node.shape:
        raise ValueError(
            f"src_node has shape {src_node.shape} but dst_node {dst_node.shape}; they must match"
        )
    both = np.stack([src_node, dst_node], axis=1)  # (P, 2, M, L+1): set 0 = S, set 1 = D
    valid = both >= 0
    # Key of (pair, node): nodes are re-indexed per call so keys stay small.
    _, node_index = np.unique(np.where(valid, both, -1), return_inverse=True)
    node_index = node_index.reshape(both.shape)
    num_ids = int(node_index.max()) + 1
    pair = np.arange(p)[:, None, None, None]
    key = pair * num_ids + node_index  # (P, 2, M, L+1)
    unique_keys, slot = np.unique(key, return_inverse=True)
    slot = slot.reshape(both.shape)
    which = np.arange(2)[None, :, None, None]
    position = np.arange(length)[None, None, None, :]
    cell = (slot * 2 + which) * length + position  # (slot, set, position)
    table = np.bincount(cell[valid], minlength=len(unique_keys) * 2 * length)
    counts = table.reshape(len(unique_keys), 2, length)[slot]  # (P, 2, M, L+1, 2, L+1)
    counts[~valid] = 0
    return counts[:, 0], counts[:, 1]
