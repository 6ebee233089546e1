"""AUC and log loss against hand-computed values and a brute-force pair count."""

from __future__ import annotations

import math

import numpy as np
import pytest

from frugal.recsys.metrics import log_loss, roc_auc


def test_auc_hand_computed() -> None:
    # positives 0.35, 0.8 vs negatives 0.1, 0.4: pairs won 1 + 0 + 1 + 1 = 3 of 4
    assert roc_auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == 0.75
    # ties count half: pos 0.5 vs negs 0.5, 0.5 -> 0.5 + 0.5; pos 0.9 wins 2 -> 3 / 4
    assert roc_auc([0, 1, 0, 1], [0.5, 0.5, 0.5, 0.9]) == 0.75


def test_auc_equals_brute_force_pair_count() -> None:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 300)
    scores = np.round(rng.random(300), 1)  # many ties
    pos, neg = scores[labels == 1], scores[labels == 0]
    diff = pos[:, None] - neg[None, :]
    want = ((diff > 0).sum() + 0.5 * (diff == 0).sum()) / diff.size
    assert roc_auc(labels, scores) == pytest.approx(want, abs=1e-12)


def test_auc_needs_both_classes() -> None:
    with pytest.raises(ValueError, match="both classes"):
        roc_auc([1, 1], [0.2, 0.3])


def test_log_loss_hand_computed() -> None:
    want = -(math.log(0.8) + math.log(0.6)) / 2
    assert log_loss([1, 0], [0.8, 0.4]) == pytest.approx(want, rel=1e-12)
