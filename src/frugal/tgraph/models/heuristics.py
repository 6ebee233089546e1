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

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from frugal._typing import F64, I64, Bool
from frugal.tgraph.models.registry import ModelInputs, register_model

__all__ = ["EdgeBank", "EdgeBankWindow", "HeuristicModel", "Popularity", "Recency"]


class HeuristicModel:
    """A parameter-free link scorer updated after each batch with the true events.

    The base keeps what every heuristic reads: the last time each (u, v) pair was seen and
    each destination's exponentially decayed degree. A subclass defines `score`.

    Args:
        num_nodes: N.
        window_s: Time window (EdgeBank-window) or decay constant (popularity), > 0.

    Raises:
        ValueError: On a non-positive window.
    """

    def __init__(self, num_nodes: int, window_s: float = 1.0) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s={window_s} must be > 0")
        self.num_nodes = num_nodes
        self.window_s = float(window_s)
        self.reset_state()

    def reset_state(self) -> None:
        """Forget every observed event."""
        self._pair_key: I64 = np.zeros(0, dtype=np.int64)
        self._pair_t: I64 = np.zeros(0, dtype=np.int64)
        self._pop = np.zeros(self.num_nodes, dtype=np.float64)
        self._pop_t = np.zeros(self.num_nodes, dtype=np.int64)

    def state(self) -> tuple[I64, I64, F64, I64]:
        """A copy of the state (for backup and restore between evaluation passes)."""
        return self._pair_key.copy(), self._pair_t.copy(), self._pop.copy(), self._pop_t.copy()

    def load_state(self, state: tuple[I64, I64, F64, I64]) -> None:
        """Restore a state from `state()`."""
        pair_key, pair_t, pop, pop_t = state
        self._pair_key, self._pair_t = pair_key.copy(), pair_t.copy()
        self._pop, self._pop_t = pop.copy(), pop_t.copy()

    def observe(self, src: I64, dst: I64, t: I64) -> None:
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
            decay = self._decay(dst, t)
            for_nodes, first = np.unique(dst, return_index=True)
            # Decay each node once to the batch's first event time of that node, then add.
            self._pop[for_nodes] *= decay[first]
            np.add.at(self._pop, dst, 1.0)
            last_t = np.full(self.num_nodes, np.iinfo(np.int64).min, dtype=np.int64)
            np.maximum.at(last_t, dst, t)
            self._pop_t[for_nodes] = last_t[for_nodes]

    def _last_seen(self, key: I64) -> tuple[Bool, I64]:
        """Whether each pair key was seen, and when last (0 where never).

        A flag, not a sentinel time: times are used only as differences, so any int64 time
        (negative ones included) is a valid time, and shifting a stream changes no score.
        """
        if len(self._pair_key) == 0:
            return np.zeros(key.shape, dtype=bool), np.zeros(key.shape, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self._pair_key, key), len(self._pair_key) - 1)
        seen = self._pair_key[pos] == key
        return seen, np.where(seen, self._pair_t[pos], 0)

    def _decay(self, node: I64, t: I64) -> F64:
        """exp(-(t - last event of node) / window_s); 0 for a node never seen (count 0)."""
        seen = self._pop[node] > 0
        age = np.where(seen, t - self._pop_t[node], 0).astype(np.float64)
        return np.where(seen, np.exp(-age / self.window_s), 0.0)

    def score(self, src: npt.ArrayLike, dst: npt.ArrayLike, t: npt.ArrayLike) -> F64:
        """Scores of (src, dst) at times t; arrays broadcast, e.g. (B, 1) x (B, C).

        Returns:
            float64 scores with the broadcast shape.
        """
        s, d, when = np.broadcast_arrays(
            np.asarray(src, np.int64), np.asarray(dst, np.int64), np.asarray(t, np.int64)
        )
        return self._score(s, d, when)

    def _score(self, src: I64, dst: I64, t: I64) -> F64:
        raise NotImplementedError


class EdgeBank(HeuristicModel):
    """1 if (u, v) was seen before, else 0 (EdgeBank with unlimited memory)."""

    def _score(self, src: I64, dst: I64, t: I64) -> F64:
        seen, _ = self._last_seen(src * self.num_nodes + dst)
        return seen.astype(np.float64)


class EdgeBankWindow(HeuristicModel):
    """1 if (u, v) was seen within the last `window_s` time units (EdgeBank, time window)."""

    def _score(self, src: I64, dst: I64, t: I64) -> F64:
        seen, last = self._last_seen(src * self.num_nodes + dst)
        return (seen & (t - last <= self.window_s)).astype(np.float64)


class Recency(HeuristicModel):
    """-(t - last time (u, v) was seen); -1e18 if never seen."""

    def _score(self, src: I64, dst: I64, t: I64) -> F64:
        seen, last = self._last_seen(src * self.num_nodes + dst)
        age = (t - last).astype(np.float64)
        return np.where(seen, -age, -np.inf).clip(min=-1e18)


class Popularity(HeuristicModel):
    """v's exponentially decayed degree, time constant `window_s`."""

    def _score(self, src: I64, dst: I64, t: I64) -> F64:
        decayed: F64 = self._pop[dst] * self._decay(dst, t)
        return decayed


def _heuristic(cls: type[HeuristicModel]) -> Callable[[ModelInputs], HeuristicModel]:
    def build(inputs: ModelInputs) -> HeuristicModel:
        return cls(inputs.num_nodes, window_s=inputs.window_s)

    return build


register_model("edgebank", _heuristic(EdgeBank), kind="heuristic",
               description="EdgeBank, unlimited memory (arXiv 2207.10128)")  # fmt: skip
register_model("edgebank_window", _heuristic(EdgeBankWindow), kind="heuristic",
               description="EdgeBank over the test split's time span")  # fmt: skip
register_model("recency", _heuristic(Recency), kind="heuristic",
               description="time since (u, v) was last seen (arXiv 2502.04910)")  # fmt: skip
register_model("popularity", _heuristic(Popularity), kind="heuristic",
               description="v's decayed recent degree (arXiv 2502.04910)")  # fmt: skip
