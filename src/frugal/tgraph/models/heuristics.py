"""Heuristic floors: EdgeBank (unlimited, time window), recency and popularity.

They learn nothing and run in one pass; every leaderboard table shows them so that a TGNN's
score reads against what memorising edges already achieves.

Shape legend: B batch, C candidates, P stored (src, dst) pairs.

References:
    Towards Better Evaluation for Dynamic Link Prediction, NeurIPS 2022 Datasets and
    Benchmarks, arXiv 2207.10128 (EdgeBank, section 4).
    On the Power of Heuristics in Temporal Graphs, ICLR 2025 workshop, arXiv 2502.04910
    (recency and popularity baselines).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

__all__ = ["HeuristicModel", "HeuristicName"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
HeuristicName = Literal["edgebank", "edgebank_window", "recency", "popularity"]


class HeuristicModel:
    """A parameter-free link scorer updated after each batch with the true events.

    - edgebank: 1 if (u, v) was seen before, else 0.
    - edgebank_window: 1 if (u, v) was seen within the last `window_s` time units.
    - recency: -(t - last time (u, v) was seen), very low if never seen.
    - popularity: v's exponentially decayed degree, time constant `window_s`.

    Args:
        name: The heuristic.
        num_nodes: N.
        window_s: Time window (edgebank_window) or decay constant (popularity), > 0.

    Raises:
        ValueError: On an unknown name or a non-positive window.
    """

    def __init__(self, name: HeuristicName, num_nodes: int, window_s: float = 1.0) -> None:
        if name not in ("edgebank", "edgebank_window", "recency", "popularity"):
            raise ValueError(f"unknown heuristic {name!r}")
        if window_s <= 0:
            raise ValueError(f"window_s={window_s} must be > 0")
        self.name = name
        self.num_nodes = num_nodes
        self.window_s = float(window_s)
        self.reset_state()

    def reset_state(self) -> None:
        """Forget every observed event."""
        self._pair_key: IntArray = np.zeros(0, dtype=np.int64)
        self._pair_t: IntArray = np.zeros(0, dtype=np.int64)
        self._pop = np.zeros(self.num_nodes, dtype=np.float64)
        self._pop_t = np.zeros(self.num_nodes, dtype=np.int64)

    def state(self) -> tuple[IntArray, IntArray, FloatArray, IntArray]:
        """A copy of the state (for backup and restore between evaluation passes)."""
        return self._pair_key.copy(), self._pair_t.copy(), self._pop.copy(), self._pop_t.copy()

    def load_state(self, state: tuple[IntArray, IntArray, FloatArray, IntArray]) -> None:
        """Restore a state from `state()`."""
        pair_key, pair_t, pop, pop_t = state
        self._pair_key, self._pair_t = pair_key.copy(), pair_t.copy()
        self._pop, self._pop_t = pop.copy(), pop_t.copy()

    def observe(self, src: IntArray, dst: IntArray, t: IntArray) -> None:
        """Add true events (time-sorted), shape (B,) each."""
        key = np.concatenate([self._pair_key, src * self.num_nodes + dst])
        when = np.concatenate([self._pair_t, t])
        # Keep the last time of every pair: stable sort by key, take each run's last entry.
        order = np.argsort(key, kind="stable")
        key, when = key[order], when[order]
        last = np.concatenate([key[1:] != key[:-1], [True]]) if len(key) else np.zeros(0, bool)
        self._pair_key, self._pair_t = key[last], when[last]
        # Popularity: decayed count per destination; events in time order within the batch.
        if len(dst):
            decay = np.exp(-(t - self._pop_t[dst]) / self.window_s)
            for_nodes, first = np.unique(dst, return_index=True)
            # Decay each node once to the batch's first event time of that node, then add.
            self._pop[for_nodes] *= decay[first]
            np.add.at(self._pop, dst, 1.0)
            last_t = np.zeros(self.num_nodes, dtype=np.int64)
            np.maximum.at(last_t, dst, t)
            self._pop_t[for_nodes] = last_t[for_nodes]

    def _last_seen(self, key: IntArray) -> IntArray:
        """Last time each pair key was seen, -1 if never."""
        if len(self._pair_key) == 0:
            return np.full(key.shape, -1, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self._pair_key, key), len(self._pair_key) - 1)
        return np.where(self._pair_key[pos] == key, self._pair_t[pos], -1)

    def score(self, src: npt.ArrayLike, dst: npt.ArrayLike, t: npt.ArrayLike) -> FloatArray:
        """Scores of (src, dst) at times t; arrays broadcast, e.g. (B, 1) x (B, C).

        Returns:
            float64 scores with the broadcast shape.
        """
        s, d, when = np.broadcast_arrays(
            np.asarray(src, np.int64), np.asarray(dst, np.int64), np.asarray(t, np.int64)
        )
        if self.name == "popularity":
            decayed: FloatArray = self._pop[d] * np.exp(-(when - self._pop_t[d]) / self.window_s)
            return decayed
        last = self._last_seen(s * self.num_nodes + d)
        seen = last >= 0
        if self.name == "edgebank":
            return seen.astype(np.float64)
        if self.name == "edgebank_window":
            return (seen & (when - last <= self.window_s)).astype(np.float64)
        age = (when - last).astype(np.float64)
        return np.where(seen, -age, -np.inf).clip(min=-1e18)
