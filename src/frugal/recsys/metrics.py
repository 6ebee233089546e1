"""Binary classification metrics: tie-aware ROC AUC and log loss (no scikit-learn needed)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["log_loss", "roc_auc"]


def _average_ranks(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """1-based ranks, tied values getting the mean of their ranks (scipy's rankdata)."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts_group = np.concatenate([[True], ordered[1:] != ordered[:-1]])
    starts = np.flatnonzero(starts_group)
    ends = np.append(starts[1:], len(values))  # exclusive
    mean_rank = (starts + 1 + ends) / 2.0  # mean of start + 1 .. end
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = mean_rank[np.cumsum(starts_group) - 1]
    return ranks


def roc_auc(labels: npt.ArrayLike, scores: npt.ArrayLike) -> float:
    """Area under the ROC curve, ties counted as half (Mann-Whitney U / (P * N)).

    Args:
        labels: 0/1 labels, shape (S,).
        scores: Real scores (higher = more likely 1), shape (S,).

    Returns:
        AUC in [0, 1].

    Raises:
        ValueError: If the shapes differ or only one class is present.
    """
    y = np.asarray(labels, dtype=np.float64).ravel()
    s = np.asarray(scores, dtype=np.float64).ravel()
    if y.shape != s.shape:
        raise ValueError(f"labels {y.shape} and scores {s.shape} must have the same shape")
    positives = int((y > 0.5).sum())
    negatives = len(y) - positives
    if positives == 0 or negatives == 0:
        raise ValueError(
            f"AUC needs both classes; got {positives} positives and {negatives} negatives"
        )
    ranks = _average_ranks(s)  # ties share their mean rank: a tied pair counts 1/2
    u = float(ranks[y > 0.5].sum()) - positives * (positives + 1) / 2.0
    return u / (positives * negatives)


def log_loss(labels: npt.ArrayLike, probabilities: npt.ArrayLike, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy in nats, probabilities clipped to [eps, 1 - eps].

    Raises:
        ValueError: If the shapes differ.
    """
    y = np.asarray(labels, dtype=np.float64).ravel()
    p = np.clip(np.asarray(probabilities, dtype=np.float64).ravel(), eps, 1.0 - eps)
    if y.shape != p.shape:
        raise ValueError(f"labels {y.shape} and probabilities {p.shape} must have the same shape")
    return float(-(y * np.log(p) + (1.0 - y) * np.log(1.0 - p)).mean())
