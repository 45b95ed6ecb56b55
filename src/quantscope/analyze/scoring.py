"""The scorer interface: how an analysis turns model outputs into task metrics.

A sweep evaluates hundreds of plans and must not keep every raw output, so scoring has
two steps:

============  =========================================================================
``reduce``    ``reduce(outputs, feeds) -> rows``: one batch's model outputs (graph
              output order) and its feeds -> a ``[B, D]`` float array, e.g. mean-pooled
              token embeddings. Rows of all batches are concatenated in batch order.
``score``     ``score(ref_rows, test_rows) -> {metric: value}``: FP32 rows vs emulated
              rows of the whole data set, e.g. top-1 retrieval agreement
``primary``   the key of ``score``'s dict that names "the" task metric
``higher``    True when a larger primary value is better (agreement, cosine)
``row_local`` True when ``score`` is valid on any subset of rows (fidelity metrics):
              the sweeps then rank with it even on their row subsets
============  =========================================================================

Every evaluation also gets two task-independent metrics of the reduced rows, computed by
:func:`fidelity`: ``cosine_mean`` (mean per-row cosine to FP32) and ``sqnr_db``. Sweeps
that run on a proxy subset of rows use only these (a retrieval metric needs every row).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from quantscope.numerics import channel_sqnr_db, default_channel_axis, row_cosines, sqnr_db

Reduce = Callable[[Sequence[np.ndarray], Mapping[str, np.ndarray]], np.ndarray]
Score = Callable[[np.ndarray, np.ndarray], dict[str, float]]


def first_output_rows(outputs: Sequence[np.ndarray], feeds: Mapping[str, np.ndarray]) -> np.ndarray:
    """Default reduce: the first output, one flattened row per sample."""
    del feeds
    out = np.asarray(outputs[0], dtype=np.float32)
    return out.reshape(len(out), -1)


def fidelity(ref: np.ndarray, test: np.ndarray) -> dict[str, float]:
    """Task-independent metrics of reduced rows: mean row cosine and SQNR (dB)."""
    return {"cosine_mean": float(row_cosines(ref, test).mean()), "sqnr_db": sqnr_db(ref, test)}


@dataclass(frozen=True)
class Scorer:
    """Task scoring for sweeps (see the module docstring)."""

    score: Score = fidelity
    primary: str = "cosine_mean"
    reduce: Reduce = first_output_rows
    higher_is_better: bool = True
    row_local: bool = True

    def __call__(self, ref: np.ndarray, test: np.ndarray) -> dict[str, float]:
        """Fidelity metrics plus the task metrics of reduced rows."""
        return {**fidelity(ref, test), **self.score(ref, test)}


def text_retrieval_scorer(n_queries: int, order: np.ndarray, attention_mask: str) -> Scorer:
    """Top-1 retrieval agreement for a text set laid out as ``queries + documents``.

    ``order`` is :attr:`quantscope.tasks.text.TextBatches.order` (rows in batch order ->
    input text index); texts ``[0, n_queries)`` are queries, the rest their documents.
    Reduce: mean pooling of the first output over ``attention_mask`` (not normalised, so
    the collapse detector sees the norms).
    """
    from quantscope.tasks.metrics import recall_at_k, top1_agreement
    from quantscope.tasks.text import pool

    def reduce(outputs: Sequence[np.ndarray], feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        return pool(outputs[0], feeds[attention_mask], normalize=False)

    def score(ref: np.ndarray, test: np.ndarray) -> dict[str, float]:
        r, t = np.empty_like(ref), np.empty_like(test)
        r[order], t[order] = ref, test
        q, d = slice(0, n_queries), slice(n_queries, None)
        return {
            "top1_agreement": top1_agreement(r[q], r[d], t[q], t[d]),
            "recall_at_1": recall_at_k(t[q], t[d], (1,))[1],
        }

    return Scorer(score=score, primary="top1_agreement", reduce=reduce, row_local=False)


def sts_scorer(n_pairs: int, order: np.ndarray, attention_mask: str) -> Scorer:
    """Sentence similarity laid out as ``first sentences + second sentences``: the
    Spearman correlation of the quantized pair cosines with FP32's (``score_agreement``).
    Reduce: mean pooling of the first output (not normalised)."""
    from quantscope.tasks.metrics import spearman
    from quantscope.tasks.text import pool

    def reduce(outputs: Sequence[np.ndarray], feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        return pool(outputs[0], feeds[attention_mask], normalize=False)

    def cosines(rows: np.ndarray) -> np.ndarray:
        r = np.empty_like(rows)
        r[order] = rows
        r /= np.maximum(np.linalg.norm(r, axis=1, keepdims=True), 1e-12)
        return np.sum(r[:n_pairs] * r[n_pairs:], axis=1)

    def score(ref: np.ndarray, test: np.ndarray) -> dict[str, float]:
        return {"score_agreement": spearman(cosines(test), cosines(ref))}

    return Scorer(score=score, primary="score_agreement", reduce=reduce, row_local=False)


def outputs_scorer(*, only: int | None = None,
                   channel_axes: Mapping[int, int] | None = None) -> Scorer:
    """Every model output scored; the worst one is the metric (tensor models).

    Reduce: each output flattened per sample (outputs whose first axis is not the batch
    are left out), concatenated. Score: ``cosine_mean`` and ``sqnr_db`` of each output's
    columns, the minimum over outputs as the unprefixed value (so a degraded second head
    cannot hide behind a clean first one), and each output's own as ``sqnr_db:<k>``.
    ``sqnr_db_channel_min``: the worst channel's SQNR over every output with channels (a
    channel: one index of the output's channel axis, every sample and position; the axis
    from ``channel_axes``, graph output index -> axis, else
    :func:`quantscope.numerics.default_channel_axis`; one-value outputs have none), so a
    class row that one grid shared with box coordinates rounds to 0 shows, while the
    whole-output SQNR does not move (:mod:`quantscope.emulate.channels`).
    ``only``: the index of the one output to score (``--output``).
    """
    spans: list[tuple[int, int]] = []
    shapes: list[tuple[int, ...]] = []
    kept: list[int] = []

    def reduce(outputs: Sequence[np.ndarray], feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        del feeds
        n = len(outputs[0])
        take = [k for k, o in enumerate(outputs) if np.ndim(o) >= 1 and len(o) == n]
        parts = [np.asarray(outputs[k], dtype=np.float32).reshape(n, -1) for k in take]
        if not spans:
            edges = np.cumsum([0] + [p.shape[1] for p in parts])
            spans.extend(zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True))
            shapes.extend(tuple(np.shape(outputs[k])[1:]) for k in take)
            kept.extend(take)
        return np.concatenate(parts, axis=1)

    def channel_min(ref: np.ndarray, test: np.ndarray, k: int) -> float | None:
        shape = shapes[k] if k < len(shapes) else (ref.shape[1],)
        if int(np.prod(shape)) != ref.shape[1] or int(np.prod(shape)) <= 1:
            return None  # a row layout this scorer did not see, or one value per sample
        full = (len(ref), *shape)
        given = (channel_axes or {}).get(kept[k]) if k < len(kept) else None
        axis = default_channel_axis(full) if given is None else given % len(full)
        if axis is None or axis == 0:
            return None
        return float(channel_sqnr_db(ref.reshape(full), test.reshape(full), axis).min())

    def score(ref: np.ndarray, test: np.ndarray) -> dict[str, float]:
        cols = list(enumerate(spans or [(0, ref.shape[1])]))
        if only is not None and only < len(cols):
            cols = [cols[only]]
        per = [fidelity(ref[:, a:b], test[:, a:b]) for _, (a, b) in cols]
        out = {"cosine_mean": min(p["cosine_mean"] for p in per),
               "sqnr_db": min(p["sqnr_db"] for p in per)}
        if len(per) > 1:
            out.update({f"sqnr_db:{k}": p["sqnr_db"] for k, p in enumerate(per)})
        chan = [c for k, (a, b) in cols
                if (c := channel_min(ref[:, a:b], test[:, a:b], k)) is not None]
        if chan:
            out["sqnr_db_channel_min"] = min(chan)
        return out

    return Scorer(score=score, primary="cosine_mean", reduce=reduce)
