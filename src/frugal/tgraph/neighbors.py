"""A vectorised time-sorted neighbour finder (CSR over (node, event position)).

Every event (src, dst, t) is stored once per endpoint (once for a self-loop), in a CSR sorted
by (node, position): `indptr[u]:indptr[u+1]` lists u's events in time order. A query (u, cutoff)
asks for u's events at positions < cutoff; one `np.searchsorted` over the integer keys
`node * E + position` finds the end of each query's run, so a batch of queries costs
O(B log E + B k) with no Python loop per event.

Shape legend: E events, B queries, K neighbours per query.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from frugal._typing import F64, I64

__all__ = ["NeighborFinder", "NeighborStrategy", "Neighbors"]

NeighborStrategy = Literal["recent", "uniform"]
"""How neighbours are sampled: the K most recent, or K uniform draws from the past."""


@dataclass(frozen=True, slots=True)
class Neighbors:
    """The sampled temporal neighbourhood of a batch of queries.

    Attributes:
        nbr: Neighbour node ids (0 where masked), int64, shape (B, K).
        eid: Global event id of the connecting event (0 where masked), int64, (B, K).
        t: Time of the connecting event (0 where masked), int64, (B, K).
        mask: True where a neighbour exists, (B, K).
    """

    nbr: I64
    eid: I64
    t: I64
    mask: npt.NDArray[np.bool_]


class NeighborFinder:
    """Most-recent-k (or uniform) temporal neighbours before a cutoff, over a set of events.

    Args:
        src: Source of each event, shape (E,), int64.
        dst: Destination of each event, shape (E,), int64.
        t: Time of each event, non-decreasing, shape (E,), int64.
        eid: Global id of each event (increasing), shape (E,); defaults to arange(E).
        num_nodes: Number of nodes N (ids in [0, N)).

    Raises:
        ValueError: If the arrays differ in length, `t` decreases or ids are out of range.
    """

    def __init__(
        self,
        src: I64,
        dst: I64,
        t: I64,
        num_nodes: int,
        eid: I64 | None = None,
    ) -> None:
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        t = np.asarray(t, dtype=np.int64)
        num_events = len(src)
        eid = np.arange(num_events, dtype=np.int64) if eid is None else np.asarray(eid, np.int64)
        if not len(dst) == len(t) == len(eid) == num_events:
            raise ValueError("src, dst, t and eid must have the same length")
        if num_events and (t[1:] < t[:-1]).any():
            raise ValueError("t must be non-decreasing; sort events by time first")
        if num_events and (eid[1:] <= eid[:-1]).any():
            raise ValueError("eid must be strictly increasing (events in time order)")
        for name, arr in (("src", src), ("dst", dst)):
            if num_events and (arr.min() < 0 or arr.max() >= num_nodes):
                raise ValueError(f"{name} holds ids outside [0, num_nodes={num_nodes})")
        self.num_nodes = num_nodes
        self.num_events = num_events
        self._t = t
        self._eid = eid
        position = np.arange(num_events, dtype=np.int64)
        # A self-loop is one neighbour entry, not two.
        back = src != dst
        node = np.concatenate([src, dst[back]])
        other = np.concatenate([dst, src[back]])
        pos2 = np.concatenate([position, position[back]])
        stride = max(num_events, 1)
        key = node * stride + pos2
        order = np.argsort(key, kind="stable")
        self._key = key[order]
        self._nbr = other[order]
        self._pos = pos2[order]
        counts = np.bincount(node, minlength=num_nodes)
        self._indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._stride = stride
        self._log_prefix: dict[tuple[str, float], npt.NDArray[np.float64]] = {}

    def cutoff_before(self, t_B: I64, max_eid_B: I64 | None = None) -> I64:
        """Positions of the first event at time >= t (and with global id >= max_eid).

        A query at time t may see only events strictly before t; `max_eid` additionally
        hides the query's own batch (events with global id >= the batch's first id).

        Args:
            t_B: Query times, shape (B,).
            max_eid_B: Global event id bound per query, shape (B,), or None.

        Returns:
            Cutoff positions into this finder's events, shape (B,).
        """
        cut = np.searchsorted(self._t, np.asarray(t_B, dtype=np.int64), side="left")
        if max_eid_B is not None:
            by_id = np.searchsorted(self._eid, np.asarray(max_eid_B, dtype=np.int64), side="left")
            cut = np.minimum(cut, by_id)
        return cut.astype(np.int64)

    def sample(
        self,
        node_B: I64,
        cutoff_B: I64,
        num_neighbors: int,
        *,
        strategy: str = "recent",
        rng: np.random.Generator | None = None,
    ) -> Neighbors:
        """Neighbours of each query node among its events at positions < cutoff.

        Args:
            node_B: Query nodes, shape (B,).
            cutoff_B: Exclusive position bound per query (from `cutoff_before`), shape (B,).
            num_neighbors: K, >= 1.
            strategy: "recent" (the K most recent, oldest first, left-padded) or "uniform"
                (K draws with replacement among all earlier events; needs `rng`).
            rng: Random generator for "uniform".

        Returns:
            Neighbors with arrays of shape (B, K).

        Raises:
            ValueError: On an unknown strategy or K < 1.
        """
        if num_neighbors < 1:
            raise ValueError(f"num_neighbors={num_neighbors} must be >= 1")
        node = np.asarray(node_B, dtype=np.int64)
        cutoff = np.asarray(cutoff_B, dtype=np.int64)
        start = self._indptr[node]
        end = np.searchsorted(self._key, node * self._stride + cutoff, side="left")
        end = np.maximum(end, start)
        k = num_neighbors
        if strategy == "recent":
            idx = end[:, None] - k + np.arange(k)[None, :]
            mask = idx >= start[:, None]
        elif strategy == "uniform":
            if rng is None:
                raise ValueError("strategy='uniform' needs an rng")
            count = end - start
            idx = start[:, None] + np.floor(rng.random((len(node), k)) * count[:, None]).astype(
                np.int64
            )
            idx.sort(axis=1)
            mask = np.broadcast_to((count > 0)[:, None], idx.shape).copy()
        else:
            raise ValueError(f"strategy={strategy!r} must be 'recent' or 'uniform'")
        safe = np.where(mask, idx, 0)
        if len(self._nbr) == 0:
            zeros = np.zeros(safe.shape, np.int64)
            return Neighbors(zeros, zeros.copy(), zeros.copy(), np.zeros(safe.shape, bool))
        pos = self._pos[safe]
        nbr = np.where(mask, self._nbr[safe], 0)
        eid = np.where(mask, self._eid[pos], 0)
        t = np.where(mask, self._t[pos], 0)
        return Neighbors(nbr, eid, t, mask)

    def _running_log_sums(self, a: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Per-node running log-sum of exp(a) over each CSR row (a: one log-weight per entry).

        Entry i holds log(sum of exp(a_j) for j from its row's start to i), so the mass of a
        row's range [s, e) is exp(L[e-1]) - exp(L[s-1]) without overflow or underflow at any
        scale (t in seconds times alpha can exceed 700).
        """
        out = np.empty_like(a)
        # One accumulate per node with events: setup, once per (finder, bias), not per walk.
        for u in np.flatnonzero(np.diff(self._indptr)):  # one iteration per active node
            lo, hi = self._indptr[u], self._indptr[u + 1]
            out[lo:hi] = np.logaddexp.accumulate(a[lo:hi])
        return out

    def _log_cumulative_weights(self, alpha: float) -> npt.NDArray[np.float64]:
        """Running log-sums of exp(alpha * t) per CSR row (`_running_log_sums`), per alpha."""
        cached = self._log_prefix.get(("time", alpha))
        if cached is None:
            cached = self._running_log_sums(alpha * self._t[self._pos].astype(np.float64))
            self._log_prefix[("time", alpha)] = cached
        return cached

    def _log_cumulative_degree_weights(self, spatial_bias: float) -> npt.NDArray[np.float64]:
        """Running log-sums of exp(-spatial_bias / (d + 0.01)) per CSR row, per spatial_bias.

        d is the degree of the entry's neighbour at the entry's event: how many of the
        neighbour's events in this finder are strictly earlier (NeurTW's `find_before(ngh,
        ngh_ts, e_idx)`). Those events precede the entry itself, so the weight reads nothing
        a query that may see the entry could not.
        """
        cached = self._log_prefix.get(("degree", spatial_bias))
        if cached is None:
            first_at_t = np.searchsorted(self._t, self._t[self._pos], side="left")
            end = np.searchsorted(self._key, self._nbr * self._stride + first_at_t, side="left")
            degree = (end - self._indptr[self._nbr]).astype(np.float64)
            cached = self._running_log_sums(-spatial_bias / (degree + 0.01))
            self._log_prefix[("degree", spatial_bias)] = cached
        return cached

    @staticmethod
    def _invert_log_cdf(
        log_cum: npt.NDArray[np.float64], start: I64, last: I64, uniform_BK: F64
    ) -> I64:
        """Per draw, the first position of [start, last] whose running log-sum reaches its share.

        A query's range always starts at its row's start (the cutoff only ends it), so the
        target of uniform number u is L[last] + log(u): a binary search over the log-sums.
        """
        with np.errstate(divide="ignore"):
            target_BK = log_cum[last][:, None] + np.log(uniform_BK)
        b, k = uniform_BK.shape
        lo = np.broadcast_to(start[:, None], (b, k)).copy()
        hi = np.broadcast_to(last[:, None], (b, k)).copy()
        while True:  # O(log max degree) rounds over all B K draws at once
            open_ = lo < hi
            if not open_.any():
                break
            mid = (lo + hi) // 2
            right = log_cum[mid] < target_BK
            lo = np.where(open_ & right, mid + 1, lo)
            hi = np.where(open_ & ~right, mid, hi)
        return lo

    def sample_time_biased(
        self,
        node_B: I64,
        cutoff_B: I64,
        num_neighbors: int,
        *,
        alpha: float,
        rng: np.random.Generator,
        spatial_bias: float = 0.0,
    ) -> Neighbors:
        """K draws with replacement among each query's events before cutoff, P ~ exp(alpha t).

        The probability of an earlier event at time t' for a query at time t is
        exp(alpha (t' - t)) / sum over the query's earlier events, as CAW's temporal walk
        sampler (alpha = 0: uniform). With `spatial_bias` beta > 0 it is NeurTW's
        spatio-temporal mixture (P_time + P_degree) / 2, P_degree of an event to neighbour
        w proportional to exp(-beta / (d_w + 0.01)), d_w the number of w's events before that
        event (NeurTW's `get_temporal_neighbor` with `ee_bias` 0). Each draw inverts the
        cumulative weights of the query's range with one uniform number and a binary search
        over the running log-sums (`rng.random((B, K))`, in that order; draws of a query
        without earlier events are masked). Draws are sorted by position, as CAW's
        `np.sort(np.random.choice(...))`.

        Args:
            node_B: Query nodes, shape (B,).
            cutoff_B: Exclusive position bound per query (from `cutoff_before`), shape (B,).
            num_neighbors: K, >= 1.
            alpha: Recency bias alpha >= 0, per unit of t.
            rng: Random generator.
            spatial_bias: NeurTW's structural bias beta >= 0 (0: the time bias alone).

        Returns:
            Neighbors with arrays of shape (B, K).

        Raises:
            ValueError: If K < 1, alpha < 0 or spatial_bias < 0.

        References:
            Inductive Representation Learning in Temporal Networks via Causal Anonymous
            Walks, ICLR 2021, arXiv 2101.05974 (section 4.1, temporal walk sampling).
            Neural Temporal Walks: Motif-Aware Representation Learning on Continuous-Time
            Dynamic Graphs, NeurIPS 2022 (section 3.1, spatiotemporal-biased walks;
            reference code KimMeen/Neural-Temporal-Walks, `graph.py`).
        """
        if num_neighbors < 1:
            raise ValueError(f"num_neighbors={num_neighbors} must be >= 1")
        if not alpha >= 0 or not spatial_bias >= 0:
            raise ValueError(f"alpha={alpha} and spatial_bias={spatial_bias} must be >= 0")
        node = np.asarray(node_B, dtype=np.int64)
        cutoff = np.asarray(cutoff_B, dtype=np.int64)
        k = num_neighbors
        uniform_BK = rng.random((len(node), k))
        start = self._indptr[node]
        end = np.maximum(
            np.searchsorted(self._key, node * self._stride + cutoff, side="left"), start
        )
        has = end > start
        if len(self._nbr) == 0 or not has.any():
            zeros = np.zeros((len(node), k), np.int64)
            return Neighbors(zeros, zeros.copy(), zeros.copy(), np.zeros((len(node), k), bool))
        last = np.where(has, end - 1, 0)
        time_cum = self._log_cumulative_weights(float(alpha))
        if spatial_bias == 0:
            lo = self._invert_log_cdf(time_cum, start, last, uniform_BK)
        else:
            # The mixture (P_time + P_degree) / 2, one uniform number a draw: u < 1/2 picks
            # the time-biased half and inverts it with 2 u, else the degree-biased half with
            # 2 u - 1 (both exact in floating point, and each uniform on [0, 1)).
            degree_cum = self._log_cumulative_degree_weights(float(spatial_bias))
            by_degree = uniform_BK >= 0.5
            u_BK = np.where(by_degree, 2.0 * uniform_BK - 1.0, 2.0 * uniform_BK)
            lo = np.where(
                by_degree,
                self._invert_log_cdf(degree_cum, start, last, u_BK),
                self._invert_log_cdf(time_cum, start, last, u_BK),
            )
        idx = np.sort(lo, axis=1)
        mask = np.broadcast_to(has[:, None], idx.shape).copy()
        safe = np.where(mask, idx, 0)
        pos = self._pos[safe]
        nbr = np.where(mask, self._nbr[safe], 0)
        eid = np.where(mask, self._eid[pos], 0)
        t = np.where(mask, self._t[pos], 0)
        return Neighbors(nbr, eid, t, mask)
