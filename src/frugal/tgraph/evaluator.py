"""Link-prediction and node-classification metrics of the tgraph benchmark.

Global ROC-AUC / average precision over every positive and negative of a view (the primary
numbers), Benchtemp's per-batch means (a compatibility column), tie-aware ranking metrics (MRR,
Hits@k) against all candidate destinations, and one-vs-rest macro AUC for node classes.
scikit-learn is not a dependency, so the ranking-based formulas are implemented here and tested
against hand-computed values.

Shape legend: P positives, Q negatives, B batch, C candidates or classes.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from frugal._typing import F64

__all__ = [
    "average_precision",
    "link_prediction_metrics",
    "macro_auc",
    "per_batch_metrics",
    "rank_metrics",
    "roc_auc",
    "tie_aware_ranks",
]


def _check_binary(y_true: npt.ArrayLike, y_score: npt.ArrayLike) -> tuple[F64, F64]:
    truth = np.asarray(y_true, dtype=np.float64).ravel()
    score = np.asarray(y_score, dtype=np.float64).ravel()
    if truth.shape != score.shape:
        raise ValueError(
            f"y_true has {truth.size} values but y_score {score.size}; they must match"
        )
    if not np.isin(truth, (0.0, 1.0)).all():
        raise ValueError("y_true must hold only 0 and 1")
    if not np.isfinite(score).all():
        raise ValueError("y_score holds NaN or inf; scores must be finite")
    return truth, score


def roc_auc(y_true: npt.ArrayLike, y_score: npt.ArrayLike) -> float:
    """Area under the ROC curve, ties counted one half (Mann-Whitney U / (P * Q)).

    Args:
        y_true: 0/1 labels, shape (P + Q,).
        y_score: Scores (higher = more likely positive), same shape.

    Returns:
        The AUC in [0, 1], or NaN if one class is absent.

    Raises:
        ValueError: If shapes differ, labels are not 0/1 or scores are not finite.
    """
    truth, score = _check_binary(y_true, y_score)
    num_pos = float(truth.sum())
    num_neg = float(truth.size - num_pos)
    if num_pos == 0 or num_neg == 0:
        return float("nan")
    ranks = _average_ranks(score)
    return float((ranks[truth == 1].sum() - num_pos * (num_pos + 1) / 2) / (num_pos * num_neg))


def _average_ranks(score: F64) -> F64:
    """1-based ranks of `score` in ascending order, ties get their mean rank."""
    order = np.argsort(score, kind="mergesort")
    sorted_score = score[order]
    boundary = np.concatenate([[True], sorted_score[1:] != sorted_score[:-1]])
    group = np.cumsum(boundary) - 1
    starts = np.flatnonzero(boundary)
    ends = np.concatenate([starts[1:], [score.size]])
    mean_rank = (starts + 1 + ends) / 2.0  # mean of ranks starts+1 .. ends
    ranks = np.empty_like(score)
    ranks[order] = mean_rank[group]
    return ranks


def average_precision(y_true: npt.ArrayLike, y_score: npt.ArrayLike) -> float:
    """Average precision: sum over score thresholds of (R_n - R_{n-1}) * P_n.

    Tied scores form one threshold (scikit-learn's `average_precision_score` definition).

    Args:
        y_true: 0/1 labels, shape (P + Q,).
        y_score: Scores, same shape.

    Returns:
        AP in [0, 1], or NaN if there is no positive.

    Raises:
        ValueError: If shapes differ, labels are not 0/1 or scores are not finite.
    """
    truth, score = _check_binary(y_true, y_score)
    num_pos = truth.sum()
    if num_pos == 0:
        return float("nan")
    order = np.argsort(-score, kind="mergesort")
    sorted_score = score[order]
    tp = np.cumsum(truth[order])
    last_of_group = np.concatenate([sorted_score[1:] != sorted_score[:-1], [True]])
    tp = tp[last_of_group]
    seen = (np.flatnonzero(last_of_group) + 1).astype(np.float64)
    precision = tp / seen
    recall = tp / num_pos
    recall_step = np.diff(np.concatenate([[0.0], recall]))
    return float((recall_step * precision).sum())


def link_prediction_metrics(pos_score: npt.ArrayLike, neg_score: npt.ArrayLike) -> dict[str, float]:
    """Global AUC and AP over all positives and negatives of one view.

    Args:
        pos_score: Scores of the true events, shape (P,).
        neg_score: Scores of the negatives, shape (Q,).

    Returns:
        {"auc": ..., "ap": ...}.

    Raises:
        ValueError: If scores are not finite.
    """
    pos = np.asarray(pos_score, dtype=np.float64).ravel()
    neg = np.asarray(neg_score, dtype=np.float64).ravel()
    truth = np.concatenate([np.ones(pos.size), np.zeros(neg.size)])
    score = np.concatenate([pos, neg])
    return {"auc": roc_auc(truth, score), "ap": average_precision(truth, score)}


def per_batch_metrics(
    pos_score: npt.ArrayLike, neg_score: npt.ArrayLike, batch_size: int
) -> dict[str, float]:
    """Benchtemp's compatibility metric: the mean over eval batches of per-batch AUC and AP.

    Positive i and negative i belong to batch i // batch_size (one negative per positive).

    Args:
        pos_score: Scores of the true events, shape (P,).
        neg_score: Scores of their negatives, shape (P,).
        batch_size: Eval batch size, >= 1.

    Returns:
        {"auc_per_batch": ..., "ap_per_batch": ...}.

    Raises:
        ValueError: If the arrays differ in length or batch_size < 1.

    References:
        BenchTemp: A General Benchmark for Evaluating Temporal Graph Neural Networks,
        ICDE 2024, arXiv 2308.16385 (their `eval_edge_prediction`).
    """
    pos = np.asarray(pos_score, dtype=np.float64).ravel()
    neg = np.asarray(neg_score, dtype=np.float64).ravel()
    if pos.size != neg.size:
        raise ValueError(
            f"per-batch metrics need one negative per positive: {pos.size} != {neg.size}"
        )
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    aucs, aps = [], []
    for start in range(0, pos.size, batch_size):  # one iteration per batch, not per event
        metrics = link_prediction_metrics(
            pos[start : start + batch_size], neg[start : start + batch_size]
        )
        aucs.append(metrics["auc"])
        aps.append(metrics["ap"])
    if not aucs:
        return {"auc_per_batch": float("nan"), "ap_per_batch": float("nan")}
    return {"auc_per_batch": float(np.mean(aucs)), "ap_per_batch": float(np.mean(aps))}


def _rows_of(name: str, values: npt.ArrayLike, num_rows: int) -> F64:
    """`values` as a float64 (num_rows, C) array: one row of scores per query or node.

    Raises:
        ValueError: If `values` is not 2-D with `num_rows` rows (the message names `name`).
    """
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 2 or array.shape[0] != num_rows:
        raise ValueError(f"{name} has shape {array.shape}; expected ({num_rows}, C)")
    return array


def tie_aware_ranks(pos_score_B: npt.ArrayLike, cand_score_BC: npt.ArrayLike) -> F64:
    """Rank of each true score among its candidates: mean of optimistic and pessimistic rank.

    Args:
        pos_score_B: Score of each true destination, shape (B,).
        cand_score_BC: Scores of its (filtered) negative candidates, shape (B, C); NaN marks a
            candidate to skip (filtered out).

    Returns:
        Ranks >= 1, float64, shape (B,).

    Raises:
        ValueError: If shapes do not line up.
    """
    pos = np.asarray(pos_score_B, dtype=np.float64)
    cand = _rows_of("cand_score_BC", cand_score_BC, pos.shape[0])
    with np.errstate(invalid="ignore"):
        greater = (cand > pos[:, None]).sum(axis=1)
        equal = (cand == pos[:, None]).sum(axis=1)
    ranks: F64 = 1.0 + greater + equal / 2.0
    return ranks


def rank_metrics(ranks: npt.ArrayLike, ks: tuple[int, ...] = (1, 3, 10)) -> dict[str, float]:
    """MRR and Hits@k from tie-aware ranks.

    Args:
        ranks: Ranks >= 1, shape (P,).
        ks: Cut-offs for Hits@k.

    Returns:
        {"mrr": ..., "hits@1": ..., ...}; NaN values for an empty input.
    """
    values = np.asarray(ranks, dtype=np.float64)
    if values.size == 0:
        return {"mrr": float("nan"), **{f"hits@{k}": float("nan") for k in ks}}
    out = {"mrr": float((1.0 / values).mean())}
    for k in ks:
        out[f"hits@{k}"] = float((values <= k).mean())
    return out


def macro_auc(y_true: npt.ArrayLike, prob_NC: npt.ArrayLike) -> float:
    """One-vs-rest ROC-AUC averaged over classes present (binary: the AUC of class 1).

    Args:
        y_true: Class of each node in [0, C), shape (N,).
        prob_NC: Class scores, shape (N, C).

    Returns:
        The macro AUC, or NaN if fewer than two classes are present.

    Raises:
        ValueError: If shapes do not line up.
    """
    truth = np.asarray(y_true, dtype=np.int64)
    prob = _rows_of("prob_NC", prob_NC, truth.shape[0])
    if prob.shape[1] == 2:
        return roc_auc(truth == 1, prob[:, 1])
    present = [c for c in range(prob.shape[1]) if 0 < (truth == c).sum() < truth.size]
    if len(present) < 2:
        return float("nan")
    return float(np.mean([roc_auc(truth == c, prob[:, c]) for c in present]))
