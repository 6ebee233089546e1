"""Synthetic generators: Criteo-shaped Zipf ids and bursty recurrent temporal events."""

from __future__ import annotations

import numpy as np
import pytest

from frugal.data.synthetic import (
    CRITEO_KAGGLE_CARDINALITIES,
    CriteoZipfStream,
    TemporalStreamConfig,
    generate_temporal_events,
    truncated_zipf_ranks,
)


def test_criteo_cardinalities_sum_and_scaling() -> None:
    assert len(CRITEO_KAGGLE_CARDINALITIES) == 26
    assert sum(CRITEO_KAGGLE_CARDINALITIES) == 33_762_577
    # store.md: fields < 1000 kept whole, others ceil(card * scale).
    for scale, total in ((0.02, 676_951), (0.25, 8_441_945), (0.5, 16_882_156), (1.0, 33_762_577)):
        assert CriteoZipfStream(CriteoZipfStream.Config(scale=scale)).num_embeddings == total


def test_ids_stay_inside_their_field_and_slices_agree() -> None:
    stream = CriteoZipfStream(CriteoZipfStream.Config(scale=0.001, chunk_rows=1000, seed=3))
    ids = stream.ids(0, 2500)
    assert ids.shape == (2500, 26) and ids.dtype == np.int64
    low = stream.offsets
    high = stream.offsets + np.array(stream.cardinalities)
    assert np.all((ids >= low) & (ids < high))
    # Any cut of the stream gives the same rows (chunks are seeded by their index).
    pieces = np.concatenate([stream.ids(a, b) for a, b in ((0, 7), (7, 1999), (1999, 2500))])
    assert np.array_equal(pieces, ids)
    fresh = CriteoZipfStream(CriteoZipfStream.Config(scale=0.001, chunk_rows=1000, seed=3))
    assert np.array_equal(fresh.ids(1200, 1300), ids[1200:1300])
    other = CriteoZipfStream(CriteoZipfStream.Config(scale=0.001, chunk_rows=1000, seed=4))
    assert not np.array_equal(other.ids(0, 100), ids[:100])
    assert stream.ids(5, 5).shape == (0, 26)


def test_zipf_head_probability_matches_the_inverse_cdf() -> None:
    # Continuous truncated power law on [1, n + 1): P(rank 0) = P(x < 2)
    #   = (2^(1-a) - 1) / ((n+1)^(1-a) - 1); a = 1.05, n = 1000 -> 0.1166.
    n, alpha = 1000, 1.05
    expected = (2 ** (1 - alpha) - 1) / ((n + 1) ** (1 - alpha) - 1)
    assert expected == pytest.approx(0.1166, abs=1e-4)
    ranks = truncated_zipf_ranks(np.random.default_rng(0).random(200_000), n, alpha)
    assert ranks.min() >= 0 and ranks.max() < n
    assert np.mean(ranks == 0) == pytest.approx(expected, abs=0.004)  # 5 sigma = 0.0036
    # alpha = 1 uses the logarithmic branch: P(rank 0) = ln 2 / ln(n + 1) = 0.1003.
    ranks1 = truncated_zipf_ranks(np.random.default_rng(1).random(200_000), n, 1.0)
    assert np.mean(ranks1 == 0) == pytest.approx(np.log(2) / np.log(n + 1), abs=0.004)


def test_hot_ids_are_scattered_by_the_permutation() -> None:
    stream = CriteoZipfStream(CriteoZipfStream.Config(scale=0.01, seed=0))
    ids = stream.ids(0, 20_000)[:, 2] - stream.offsets[2]  # field C3, 101,313 ids
    values, counts = np.unique(ids, return_counts=True)
    hottest = values[np.argsort(-counts)[:10]]
    assert hottest.max() > 1000  # not simply the first rows of the field


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"scale": 0.0}, "scale=0.0 must be in"),
        ({"alpha": -1.0}, "alpha=-1.0"),
        ({"chunk_rows": 0}, "chunk_rows=0"),
        ({"cardinalities": (3, 0)}, "cardinalities"),
    ],
)
def test_bad_criteo_config(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        CriteoZipfStream.Config(**kwargs)  # type: ignore[arg-type]


def test_bad_ranges_and_sizes() -> None:
    stream = CriteoZipfStream(CriteoZipfStream.Config(scale=0.001))
    with pytest.raises(ValueError, match=r"rows \[5, 2\)"):
        stream.ids(5, 2)
    with pytest.raises(ValueError, match="num_ids=0"):
        truncated_zipf_ranks(np.zeros(2), 0, 1.1)


def test_temporal_events_recur_burst_and_follow_communities() -> None:
    config = TemporalStreamConfig(num_nodes=100, num_events=20_000, recurrence=0.5, seed=1)
    events = generate_temporal_events(config)
    again = generate_temporal_events(config)
    assert np.array_equal(events.src, again.src) and np.array_equal(events.t, again.t)
    assert np.all(events.src != events.dst)
    # At least `recurrence` of events repeat one of the last 50 edges (new draws may repeat too).
    pairs = events.src * 100 + events.dst
    repeats = np.mean([pairs[e] in pairs[max(0, e - 50) : e] for e in range(1, len(pairs))])
    assert repeats >= 0.48
    # Gaps are over-dispersed (bursty): coefficient of variation above 1 (Poisson: exactly 1).
    gaps = np.diff(events.t).astype(float)
    assert gaps.std() / gaps.mean() > 1.2
    assert events.node_label is not None
    same = np.mean(events.node_label[events.src] == events.node_label[events.dst])
    assert same > 0.7  # p_within = 0.8 of new edges, repeats copy them


def test_bad_temporal_config() -> None:
    with pytest.raises(ValueError, match="num_communities=7 must be in"):
        TemporalStreamConfig(num_nodes=5, num_communities=7)
    with pytest.raises(ValueError, match=r"recurrence=1\.0"):
        TemporalStreamConfig(recurrence=1.0)
