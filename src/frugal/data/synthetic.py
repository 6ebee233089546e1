"""Deterministic synthetic data for scale and tests.

- `CriteoZipfStream`: a click-log id stream shaped like Criteo-Kaggle (26 categorical fields
  with the real cardinalities), each field drawn from a truncated Zipf law. Rows are generated
  in fixed chunks seeded by (seed, field, chunk index), so any slice [start, stop) is the same
  however the stream is cut.
- `generate_temporal_events`: a temporal graph with communities, edge recurrence and bursts.

Shape legend: B rows of a slice, F fields.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from frugal.data.events import TemporalEvents

__all__ = [
    "CRITEO_KAGGLE_CARDINALITIES",
    "CriteoZipfStream",
    "TemporalStreamConfig",
    "generate_temporal_events",
    "truncated_zipf_ranks",
]

CRITEO_KAGGLE_CARDINALITIES: tuple[int, ...] = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip
"""Distinct values of the 26 categorical fields C1..C26 of the Criteo Display Advertising
Challenge (Kaggle 2014) training set, as used by DLRM and Persia; sum 33,762,577."""

_SMALL_FIELD_ROWS = 1000  # fields below this many ids are kept at full size when scaling
_MAX_SLICE_ROWS = 1 << 24  # 16.8M rows x 26 fields x 8 B = 3.5 GB per call at most


def truncated_zipf_ranks(
    uniform: npt.NDArray[np.float64], num_ids: int, alpha: float
) -> npt.NDArray[np.int64]:
    """Map uniform draws to 0-based ranks of a Zipf law truncated to `num_ids` values.

    Uses the inverse CDF of the continuous power law p(x) ~ x^-alpha on [1, num_ids + 1),
    floored: rank 0 is the most frequent value. O(1) memory in `num_ids`.

    Args:
        uniform: Draws in [0, 1).
        num_ids: Number of distinct values, >= 1.
        alpha: Zipf exponent, > 0 (Criteo's fields are near 1.05-1.2).

    Returns:
        Ranks in [0, num_ids).

    Raises:
        ValueError: If `num_ids` < 1 or `alpha` <= 0.

    Shapes:
        uniform: any; returns the same shape.
    """
    if num_ids < 1:
        raise ValueError(f"num_ids={num_ids} must be >= 1")
    if alpha <= 0:
        raise ValueError(f"alpha={alpha} must be > 0")
    upper = num_ids + 1.0
    if math.isclose(alpha, 1.0):
        x = np.exp(uniform * math.log(upper))
    else:
        one_minus = 1.0 - alpha
        x = (1.0 + uniform * (upper**one_minus - 1.0)) ** (1.0 / one_minus)
    return np.minimum(np.floor(x).astype(np.int64) - 1, num_ids - 1)


class CriteoZipfStream:
    """A Criteo-shaped categorical id stream: F fields, truncated Zipf per field.

    Field f has `cardinalities[f]` ids; a row's id for field f is drawn as a Zipf rank, mapped
    through a seeded random permutation of the field (so hot ids are scattered, not the first
    rows of the table), and offset so ids of all fields share one table:
    global id = `offsets[f]` + local id.

    Example:
        >>> stream = CriteoZipfStream(CriteoZipfStream.Config(scale=0.001, seed=0))
        >>> stream.ids(0, 4).shape
        (4, 26)
    """

    @dataclass(frozen=True, kw_only=True, slots=True)
    class Config:
        """Settings of the stream."""

        scale: float = 0.02
        """Fraction of each large field's cardinality kept (fields < 1000 ids stay whole);
        in (0, 1]. 0.02 -> 676,951 ids in all, 0.25 -> 8,441,945."""
        alpha: float = 1.05
        """Zipf exponent of every field, in (0, 4]."""
        seed: int = 0
        """Seed of the permutations and the draws, >= 0."""
        chunk_rows: int = 65536
        """Rows generated per seeded chunk, >= 1; part of the stream's identity."""
        cardinalities: tuple[int, ...] = CRITEO_KAGGLE_CARDINALITIES
        """Full-size cardinality of each field, each >= 1."""

        def __post_init__(self) -> None:
            for name in ("scale", "alpha"):
                value = getattr(self, name)
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ValueError(f"{name}={value!r} must be a number")
            if any(isinstance(c, bool) or not isinstance(c, int) for c in self.cardinalities):
                raise ValueError(f"cardinalities={self.cardinalities} must be integers")
            if not 0.0 < self.scale <= 1.0:
                raise ValueError(f"scale={self.scale} must be in (0, 1]; e.g. scale=0.02")
            if not 0.0 < self.alpha <= 4.0:
                raise ValueError(f"alpha={self.alpha} must be in (0, 4]; Criteo is near 1.05")
            if self.seed < 0:
                raise ValueError(f"seed={self.seed} must be >= 0")
            if self.chunk_rows < 1:
                raise ValueError(f"chunk_rows={self.chunk_rows} must be >= 1")
            if not self.cardinalities or min(self.cardinalities) < 1:
                raise ValueError(
                    f"cardinalities={self.cardinalities} must be a non-empty tuple of ints >= 1"
                )

    def __init__(self, config: Config) -> None:
        self.config = config
        self.cardinalities: tuple[int, ...] = tuple(
            c if c < _SMALL_FIELD_ROWS else math.ceil(c * config.scale)
            for c in config.cardinalities
        )
        self.offsets: npt.NDArray[np.int64] = np.concatenate(
            [[0], np.cumsum(self.cardinalities)[:-1]]
        ).astype(np.int64)
        self._permutations: dict[int, npt.NDArray[np.int64]] = {}
        self._last_chunk: tuple[int, npt.NDArray[np.int64]] | None = None

    @property
    def num_fields(self) -> int:
        """Number of fields F."""
        return len(self.cardinalities)

    @property
    def num_embeddings(self) -> int:
        """Number of ids over all fields (rows of one shared embedding table)."""
        return int(sum(self.cardinalities))

    def _permutation(self, field: int) -> npt.NDArray[np.int64]:
        perm = self._permutations.get(field)
        if perm is None:
            rng = np.random.default_rng([self.config.seed, 1, field])
            perm = rng.permutation(self.cardinalities[field]).astype(np.int64)
            self._permutations[field] = perm
        return perm

    def ids(self, start: int, stop: int) -> npt.NDArray[np.int64]:
        """Return the global ids of rows [start, stop).

        Args:
            start: First row, >= 0.
            stop: One past the last row, >= start.

        Returns:
            int64 ids; column f lies in [offsets[f], offsets[f] + cardinalities[f]).

        Raises:
            ValueError: If the range is invalid.

        Shapes:
            returns: (B, F) with B = stop - start.
        """
        if stop - start > _MAX_SLICE_ROWS:
            raise ValueError(
                f"rows [{start}, {stop}) is {stop - start:,} rows; read at most "
                f"{_MAX_SLICE_ROWS:,} at a time (slices of one stream agree however it is cut)"
            )
        if start < 0 or stop < start:
            raise ValueError(
                f"rows [{start}, {stop}) are not a valid range; need 0 <= start <= stop"
            )
        chunk_rows = self.config.chunk_rows
        out_BF = np.empty((stop - start, self.num_fields), dtype=np.int64)
        if stop == start:
            return out_BF
        for chunk in range(start // chunk_rows, (stop - 1) // chunk_rows + 1):
            chunk_start = chunk * chunk_rows
            lo, hi = max(start, chunk_start), min(stop, chunk_start + chunk_rows)
            rows_BF = self._chunk(chunk)
            out_BF[lo - start : hi - start] = rows_BF[lo - chunk_start : hi - chunk_start]
        return out_BF

    def _chunk(self, chunk: int) -> npt.NDArray[np.int64]:
        """Return all rows of one seeded chunk; the last chunk is kept for sequential reads."""
        if self._last_chunk is not None and self._last_chunk[0] == chunk:
            return self._last_chunk[1]
        rows_BF = np.empty((self.config.chunk_rows, self.num_fields), dtype=np.int64)
        for field in range(self.num_fields):
            rng = np.random.default_rng([self.config.seed, 2, field, chunk])
            ranks = truncated_zipf_ranks(
                rng.random(self.config.chunk_rows), self.cardinalities[field], self.config.alpha
            )
            rows_BF[:, field] = self._permutation(field)[ranks] + self.offsets[field]
        self._last_chunk = (chunk, rows_BF)
        return rows_BF


@dataclass(frozen=True, kw_only=True, slots=True)
class TemporalStreamConfig:
    """Settings of `generate_temporal_events`."""

    num_nodes: int = 200
    """Number of nodes, >= 2."""
    num_events: int = 5000
    """Number of events, in [1, 1e9]."""
    num_communities: int = 4
    """Communities (also the node classes), in [1, num_nodes]."""
    p_within: float = 0.8
    """Probability that a new edge stays inside the source's community, in [0, 1]."""
    recurrence: float = 0.5
    """Probability that an event repeats one of the last `recency_window` edges, in [0, 1)."""
    recency_window: int = 50
    """How many recent edges a recurrent event chooses from, >= 1."""
    burst_probability: float = 0.3
    """Probability that an inter-event gap is a short in-burst gap, in [0, 1]."""
    burst_gap_s: float = 2.0
    """Mean in-burst gap in seconds, > 0."""
    quiet_gap_s: float = 120.0
    """Mean gap between bursts in seconds, > 0."""
    activity_alpha: float = 1.2
    """Zipf exponent of source activity (few nodes send most messages), > 0."""
    seed: int = 0
    """Seed, >= 0."""

    def __post_init__(self) -> None:
        checks = [
            (self.num_nodes >= 2, f"num_nodes={self.num_nodes} must be >= 2"),
            (1 <= self.num_events <= 10**9, f"num_events={self.num_events} must be in [1, 1e9]"),
            (
                1 <= self.num_communities <= self.num_nodes,
                f"num_communities={self.num_communities} must be in [1, {self.num_nodes}]",
            ),
            (0 <= self.p_within <= 1, f"p_within={self.p_within} must be in [0, 1]"),
            (0 <= self.recurrence < 1, f"recurrence={self.recurrence} must be in [0, 1)"),
            (self.recency_window >= 1, f"recency_window={self.recency_window} must be >= 1"),
            (
                0 <= self.burst_probability <= 1,
                f"burst_probability={self.burst_probability} must be in [0, 1]",
            ),
            (0 < self.burst_gap_s <= 1e6, f"burst_gap_s={self.burst_gap_s} must be in (0, 1e6]"),
            (0 < self.quiet_gap_s <= 1e6, f"quiet_gap_s={self.quiet_gap_s} must be in (0, 1e6]"),
            (self.activity_alpha > 0, f"activity_alpha={self.activity_alpha} must be > 0"),
            (self.seed >= 0, f"seed={self.seed} must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


def generate_temporal_events(config: TemporalStreamConfig) -> TemporalEvents:
    """Generate a temporal graph with communities, recurring edges and bursty timing.

    Each event either repeats one of the last `recency_window` edges (probability
    `recurrence`) or draws a new one: the source by Zipf activity, the destination uniformly
    inside the source's community (probability `p_within`) or anywhere else. Gaps between
    events are exponential, short inside bursts and long between them, rounded to seconds.
    Node classes (`node_label`) are the communities.

    Args:
        config: The generator's settings.

    Returns:
        Events sorted by t; deterministic for a given config.
    """
    rng = np.random.default_rng([config.seed, 3])
    n = config.num_nodes
    community = np.arange(n, dtype=np.int64) % config.num_communities
    members = [np.flatnonzero(community == c) for c in range(config.num_communities)]
    activity_rank = truncated_zipf_ranks(rng.random(config.num_events), n, config.activity_alpha)
    activity_nodes = rng.permutation(n).astype(np.int64)
    recurrent = rng.random(config.num_events) < config.recurrence
    within = rng.random(config.num_events) < config.p_within
    pick = rng.random(config.num_events)
    back = rng.integers(1, config.recency_window + 1, config.num_events)
    src = np.empty(config.num_events, np.int64)
    dst = np.empty(config.num_events, np.int64)
    # Sequential by nature (event e may repeat any earlier event), but cheap: O(E) scalar work.
    for e in range(config.num_events):
        if recurrent[e] and e > 0:
            j = e - min(int(back[e]), e)
            src[e], dst[e] = src[j], dst[j]
            continue
        u = int(activity_nodes[activity_rank[e]])
        pool = members[community[u]] if within[e] else None
        if pool is None or len(pool) < 2:
            v = int(pick[e] * (n - 1))
            v = v + 1 if v >= u else v
        else:
            others = pool[pool != u]
            v = int(others[int(pick[e] * len(others))])
        src[e], dst[e] = u, v
    in_burst = rng.random(config.num_events) < config.burst_probability
    gaps = np.where(
        in_burst,
        rng.exponential(config.burst_gap_s, config.num_events),
        rng.exponential(config.quiet_gap_s, config.num_events),
    )
    t = np.round(np.cumsum(gaps)).astype(np.int64)
    return TemporalEvents(
        src=src,
        dst=dst,
        t=t,
        num_nodes=n,
        time_unit="s",
        node_ids=np.arange(n, dtype=np.int64),
        node_label=community,
        label_names=tuple(f"community{c}" for c in range(config.num_communities)),
    )
