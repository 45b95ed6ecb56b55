"""Per-sample scores of a task metric on a prefix of retrieval pairs: what a race
(:mod:`quantscope.plan.race`) compares candidates by.

=================  ===================================================================
sample             a query of the prefix: pairs ``0 .. n-1``, each query ranked against
                   the prefix's own ``n`` documents (a prefix is a smaller pool: every
                   candidate and FP32 are scored on the SAME prefix, never a prefix
                   against the full set)
``top1_agreement`` 1 where the query's top-1 document is FP32's top-1 document on the
                   same prefix, else 0 (:func:`~quantscope.tasks.metrics.top1_matches`;
                   the mean over all pairs is the metric ``evaluate`` reports)
``recall@1``       1 where the query's own document ranks first, else 0
                   (:func:`~quantscope.tasks.metrics.retrieval_ranks`)
=================  ===================================================================

A metric not in :data:`SAMPLE_SCORES` has no per-sample form here (the race says so and
measures every candidate in full). Add one: a function and an entry.

On every pair (:func:`whole_set_score`), the mean of the per-query scores IS the metric
``evaluate`` reports, float for float: what a ranking needs of a plan without the rest of
the task's figures (``evaluate_plan(..., only=metric)``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from quantscope.tasks import metrics as M

Embeddings = tuple[np.ndarray, np.ndarray]  # (queries [n, dim], documents [n, dim])
SampleScore = Callable[[Embeddings, Embeddings], np.ndarray]


def top1_samples(ref: Embeddings, test: Embeddings) -> np.ndarray:
    """1.0 per query whose top-1 document is FP32's, on the same pool."""
    return M.top1_matches(ref[0], ref[1], test[0], test[1]).astype(np.float64)


def recall1_samples(ref: Embeddings, test: Embeddings) -> np.ndarray:
    """1.0 per query whose own document ranks first (FP32's embeddings are not read)."""
    del ref
    return (M.retrieval_ranks(test[0], test[1]) == 0).astype(np.float64)


SAMPLE_SCORES: dict[str, SampleScore] = {
    "top1_agreement": top1_samples,
    "recall@1": recall1_samples,
}
"""metric -> its per-query score on a prefix of pairs (higher is better)."""


def prefix_samples(metric: str, ref: Embeddings, test: Embeddings, n: int) -> np.ndarray:
    """``metric``'s per-query scores on the first ``n`` pairs (queries and documents of
    those pairs only, for FP32 and the candidate alike)."""
    fn = SAMPLE_SCORES[metric]
    return fn((ref[0][:n], ref[1][:n]), (test[0][:n], test[1][:n]))


def whole_set_score(metric: str, ref: Embeddings, test: Embeddings) -> float:
    """``metric`` on every pair: the mean of its per-query scores, the figure the task's
    ``metrics`` reports for it (the same functions on the same embeddings)."""
    return float(np.mean(SAMPLE_SCORES[metric](ref, test)))


def whole_set_figures(metric: str, ref: Embeddings, test: Embeddings) -> dict[str, float]:
    """:func:`whole_set_score` and the queries it is a share over (``KEY_items``: every
    per-query score is 0 or 1), as the task's ``metrics`` gives them."""
    from quantscope.tasks.shares import items_key

    scores = SAMPLE_SCORES[metric](ref, test)
    return {metric: float(np.mean(scores)), items_key(metric): float(len(scores))}
