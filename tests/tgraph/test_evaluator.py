"""Metrics against hand-computed values and brute-force references."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from frugal.tgraph.evaluator import (
    average_precision,
    link_prediction_metrics,
    macro_auc,
    per_batch_metrics,
    rank_metrics,
    roc_auc,
    tie_aware_ranks,
)


def test_auc_and_ap_by_hand() -> None:
    # Scores desc: 0.9 (+), 0.8 (-), 0.3 (+), 0.1 (-).
    # AUC: pos-neg pairs won: (0.9,0.8) (0.9,0.1) (0.3,0.1) = 3 of 4 -> 0.75.
    # AP: recall 0.5 at precision 1/1, recall 1.0 at precision 2/3 -> 0.5 + 0.5 * 2/3.
    y = [1, 0, 1, 0]
    s = [0.9, 0.8, 0.3, 0.1]
    assert roc_auc(y, s) == pytest.approx(0.75)
    assert average_precision(y, s) == pytest.approx(0.5 + 1 / 3)


def test_ties_count_half_and_form_one_threshold() -> None:
    # One positive and one negative with equal scores: AUC 1/2; AP: one threshold with
    # precision 1/2 at recall 1 -> 0.5.
    assert roc_auc([1, 0], [0.5, 0.5]) == pytest.approx(0.5)
    assert average_precision([1, 0], [0.5, 0.5]) == pytest.approx(0.5)


def _brute_auc(y: np.ndarray, s: np.ndarray) -> float:
    pos, neg = s[y == 1], s[y == 0]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


def _brute_ap(y: np.ndarray, s: np.ndarray) -> float:
    total, prev_recall = 0.0, 0.0
    for threshold in sorted(set(s.tolist()), reverse=True):
        chosen = s >= threshold
        tp = (y[chosen] == 1).sum()
        recall = tp / (y == 1).sum()
        total += (recall - prev_recall) * tp / chosen.sum()
        prev_recall = recall
    return float(total)


def test_auc_and_ap_match_brute_force_with_ties() -> None:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 300)
    s = rng.integers(0, 20, 300) / 20.0  # many ties
    assert roc_auc(y, s) == pytest.approx(_brute_auc(y, s))
    assert average_precision(y, s) == pytest.approx(_brute_ap(y, s))


def test_metrics_reject_bad_input() -> None:
    with pytest.raises(ValueError, match="must match"):
        roc_auc([1, 0], [0.5])
    with pytest.raises(ValueError, match="only 0 and 1"):
        roc_auc([2, 0], [0.5, 0.1])
    with pytest.raises(ValueError, match="NaN"):
        average_precision([1, 0], [np.nan, 0.1])
    assert np.isnan(roc_auc([1, 1], [0.2, 0.3]))


def test_per_batch_differs_from_global() -> None:
    # Batch 1: pos .9 .1 vs neg .2 .3 -> wins (.9>.2, .9>.3) = 2/4 = 0.5.
    # Batch 2: pos .8 .7 vs neg .9 .1 -> wins (.8>.1, .7>.1) = 2/4 = 0.5.
    pos = [0.9, 0.1, 0.8, 0.7]
    neg = [0.2, 0.3, 0.9, 0.1]
    assert per_batch_metrics(pos, neg, 2)["auc_per_batch"] == pytest.approx(0.5)
    # Globally: 0.9 beats .2 .3 .1 and ties .9 (3.5); .1 ties .1 (0.5); .8 and .7 beat
    # .2 .3 .1 (3 each) -> 10 / 16.
    assert link_prediction_metrics(pos, neg)["auc"] == pytest.approx(10 / 16)


def test_tie_aware_rank_and_mrr() -> None:
    # True score 0.5 vs candidates 0.9 (above), 0.5 (tie), 0.1, NaN (filtered):
    # optimistic rank 2, pessimistic 3 -> 2.5.
    ranks = tie_aware_ranks(np.array([0.5, 1.0]), np.array([[0.9, 0.5, 0.1, np.nan], [0.1] * 4]))
    assert ranks.tolist() == [2.5, 1.0]
    metrics = rank_metrics(ranks)
    assert metrics["mrr"] == pytest.approx((1 / 2.5 + 1) / 2)
    assert metrics["hits@1"] == pytest.approx(0.5)
    assert metrics["hits@3"] == pytest.approx(1.0)


def test_macro_auc_is_mean_of_one_vs_rest() -> None:
    truth = np.array([0, 0, 1, 1, 2, 2])
    prob = np.array(
        [[0.8, 0.1, 0.1], [0.4, 0.5, 0.1], [0.3, 0.6, 0.1], [0.5, 0.4, 0.1], [0.2, 0.2, 0.6],
         [0.1, 0.1, 0.8]]
    )  # fmt: skip
    # Class 0: pos .8 .4 vs neg .3 .5 .2 .1 -> wins 4 + 3 = 7 / 8.
    # Class 1: pos .6 .4 vs neg .1 .5 .2 .1 -> wins 4 + 3 = 7 / 8 (0.4 loses to .5 only).
    # Class 2: pos .6 .8 vs neg all .1 -> 1.
    assert macro_auc(truth, prob) == pytest.approx((7 / 8 + 7 / 8 + 1) / 3)
    binary = np.array([[0.7, 0.3], [0.2, 0.8]])
    assert macro_auc(np.array([0, 1]), binary) == pytest.approx(1.0)


def test_score_matrices_must_have_one_row_per_query() -> None:
    # 2 true scores but 3 candidate rows; 3 labels but a 1-D score vector.
    with pytest.raises(ValueError, match=r"cand_score_BC has shape \(3, 4\); expected \(2, C\)"):
        tie_aware_ranks(np.zeros(2), np.zeros((3, 4)))
    with pytest.raises(ValueError, match=r"prob_NC has shape \(3,\); expected \(3, C\)"):
        macro_auc(np.array([0, 1, 1]), np.zeros(3))
