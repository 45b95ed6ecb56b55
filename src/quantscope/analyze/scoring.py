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

from quantscope.emulate.class_axes import read_axis
from quantscope.emulate.exact import is_exact
from quantscope.numerics import (
    channel_rows,
    row_cosines,
    sqnr_db,
    worst_channel_sqnr_db,
)
from quantscope.types import QuantscopeError, RowScoring, sample_first

Reduce = Callable[[Sequence[np.ndarray], Mapping[str, np.ndarray]], np.ndarray]
Score = Callable[[np.ndarray, np.ndarray], dict[str, float]]


def first_output_rows(outputs: Sequence[np.ndarray], feeds: Mapping[str, np.ndarray]) -> np.ndarray:
    """Default reduce: the first output, one flattened row per sample (sample axis first,
    :func:`quantscope.types.sample_first`)."""
    out = np.asarray(sample_first(outputs, feeds)[0], dtype=np.float32)
    return out.reshape(len(out), -1)


def fidelity(ref: np.ndarray, test: np.ndarray) -> dict[str, float]:
    """Task-independent metrics of reduced rows: mean row cosine and SQNR (dB). Rows of one
    value (a score per sample) have no cosine: a one-value row's cosine is its sign
    agreement (0 where a small score rounds to 0), which said 'NOT LIKE FP32 (mean cosine
    0.205)' of openWakeWord's alexa head whose every decision agreed."""
    if np.ndim(ref) == 2 and np.shape(ref)[1] == 1:
        return {"sqnr_db": sqnr_db(ref, test)}
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


def task_scorer(scoring: RowScoring) -> Scorer:
    """The scorer of a task's row scoring (``Task.row_scoring()``)."""
    return Scorer(score=scoring.score, primary=scoring.primary, reduce=scoring.reduce,
                  higher_is_better=scoring.higher_is_better, row_local=scoring.row_local)


def text_retrieval_scorer(n_queries: int, order: np.ndarray, attention_mask: str) -> Scorer:
    """Top-1 retrieval agreement for a text set laid out as ``queries + documents``
    (:func:`quantscope.tasks.headline.retrieval_scoring`)."""
    from quantscope.tasks.headline import retrieval_scoring

    return task_scorer(retrieval_scoring(n_queries, order, attention_mask))


def sts_scorer(n_pairs: int, order: np.ndarray, attention_mask: str) -> Scorer:
    """Sentence similarity laid out as ``first sentences + second sentences``
    (:func:`quantscope.tasks.headline.sts_scoring`)."""
    from quantscope.tasks.headline import sts_scoring

    return task_scorer(sts_scoring(n_pairs, order, attention_mask))


def _refuse_varying(first: list[tuple[int, ...]], now: list[tuple[int, ...]], take: list[int],
                    names: Sequence[str]) -> None:
    """One line when an output's shape per sample is not the first batch's."""
    for k, a, b in zip(take, first, now, strict=True):
        if a != b:
            name = repr(names[k]) if k < len(names) else f"{k}"
            raise QuantscopeError(
                f"output {name} is {list(a)} per sample on one batch and {list(b)} on another "
                "(its length follows the data: frames, tokens): the analysis and run's plan "
                "search compare each output value by value over a fixed shape, so they cannot "
                "score it; 'quantscope evaluate' measures it (its length read as positions), "
                "or cut the model before the op that sets the length and analyse the part "
                "whose outputs keep one shape")


def outputs_scorer(*, only: int | None = None, channel_axes: Mapping[int, int] | None = None,
                   names: Sequence[str] = (),
                   symbolic_axes: Mapping[int, Mapping[int, str]] | None = None) -> Scorer:
    """Every model output scored; the worst one is the metric (tensor models).

    Reduce: each output flattened per sample (outputs whose first axis is not the batch
    are left out), concatenated. Score: ``cosine_mean`` and ``sqnr_db`` of each output's
    columns, the minimum over outputs as the unprefixed value (so a degraded second head
    cannot hide behind a clean first one), and each output's own as ``sqnr_db:<k>``.
    ``sqnr_db_channel_min``: the worst channel's SQNR over every output with channels (a
    channel: one index of the output's channel axis, every sample and position; the axis
    from ``channel_axes``, graph output index -> axis, else the default, off the axes
    ``symbolic_axes`` gives (index -> sample-first axis -> dim name): evaluate's rule,
    :func:`quantscope.emulate.class_axes.read_axis`; one-value outputs and outputs read
    as positions have none), so a class row that one grid shared with box coordinates
    rounds to 0 shows, while the whole-output SQNR does not move
    (:mod:`quantscope.emulate.channels`); channels FP32 holds at 0 on every row are left
    out of it and counted (``channels_left_out``, only when some are:
    :func:`quantscope.numerics.worst_channel_sqnr_db`).
    ``only``: the index of the one output to score (``--output``). An output whose shape
    per sample changes between batches (a TTS's frames, ``f0 [1, F]``) has no fixed
    columns to compare: refused in one line naming it (``names``: the graph outputs'
    names, to say which), where concatenating the rows was an internal error."""
    spans: list[tuple[int, int]] = []
    shapes: list[tuple[int, ...]] = []
    kept: list[int] = []

    def reduce(outputs: Sequence[np.ndarray], feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        outputs = sample_first(outputs, feeds)  # outputs batched on another axis than 0
        n = len(outputs[0])
        take = [k for k, o in enumerate(outputs)  # an int output (a label) has no noise power
                if np.ndim(o) >= 1 and len(o) == n and not is_exact(np.asarray(o))]
        parts = [np.asarray(outputs[k], dtype=np.float32).reshape(n, -1) for k in take]
        if not spans:
            edges = np.cumsum([0] + [p.shape[1] for p in parts])
            spans.extend(zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True))
            shapes.extend(tuple(np.shape(outputs[k])[1:]) for k in take)
            kept.extend(take)
        elif take == kept:
            _refuse_varying(shapes, [tuple(np.shape(outputs[k])[1:]) for k in take], take, names)
        return np.concatenate(parts, axis=1)

    def channel_min(ref: np.ndarray, test: np.ndarray, k: int) -> tuple[float, int] | None:
        shape = shapes[k] if k < len(shapes) else (ref.shape[1],)
        if int(np.prod(shape)) != ref.shape[1] or int(np.prod(shape)) <= 1:
            return None  # a row layout this scorer did not see, or one value per sample
        full = (len(ref), *shape)
        key = kept[k] if k < len(kept) else -1  # the graph output's index
        got = read_axis(full, (channel_axes or {}).get(key), None, (symbolic_axes or {}).get(key))
        if (axis := got.axis) is None or axis == 0 or got.positions:
            return None
        r, t = channel_rows(ref.reshape(full), axis), channel_rows(test.reshape(full), axis)
        worst, _, left_out = worst_channel_sqnr_db(np.sum(r * r, axis=1),
                                                   np.sum((r - t) ** 2, axis=1))
        return worst, left_out

    def score(ref: np.ndarray, test: np.ndarray) -> dict[str, float]:
        cols = list(enumerate(spans or [(0, ref.shape[1])]))
        if only is not None and only in kept:  # the graph output's column (ints left out)
            cols = [cols[kept.index(only)]]
        elif only is not None and only < len(cols):
            cols = [cols[only]]
        per = [fidelity(ref[:, a:b], test[:, a:b]) for _, (a, b) in cols]
        out = {"sqnr_db": min(p["sqnr_db"] for p in per)}
        cosines = [p["cosine_mean"] for p in per if "cosine_mean" in p]  # none of a score
        if cosines:
            out = {"cosine_mean": min(cosines), **out}
        if len(per) > 1:
            out.update({f"sqnr_db:{k}": p["sqnr_db"] for k, p in enumerate(per)})
        # an output without channels (one value per sample) is its own one channel
        chan = [c if (c := channel_min(ref[:, a:b], test[:, a:b], k)) is not None
                else (p["sqnr_db"], 0) for (k, (a, b)), p in zip(cols, per, strict=True)]
        out["sqnr_db_channel_min"] = min(c for c, _ in chan)
        if left_out := sum(n for _, n in chan):  # channels with no FP32 signal, said
            out["channels_left_out"] = float(left_out)
        return out

    # the primary is the tensor headline (tasks.headline.TENSOR_HEADLINE): what run and
    # plan judge tensor data by, so the analysis ranks and recovers in the same figure
    return Scorer(score=score, primary="sqnr_db_channel_min", reduce=reduce)
