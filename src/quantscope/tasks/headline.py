"""The headline metric: the one number a plan is judged by, decided by the data's task.

Every caller that needs "the" metric (``plan``'s measurement, ``run``'s verdict, the
analysis scorer, the fine-tune objective, ``route``) asks :func:`headline_of`; nothing
outside ``tasks/`` looks at a task's class to decide it.

=====================  ===============================================================
a task                 declares ``headline`` (a key of its metrics), ``higher_is_better``
                       and ``goal_range`` (the values a goal can take), and may give
                       ``row_scoring()`` (how the analysis scores reduced rows) and
                       ``objective()`` (what the fine-tune distils towards)
no task (tensor data)  :data:`TENSOR_HEADLINE` in dB, higher is better
``--metric NAME``      the named metric; its direction, range and unit from
                       :data:`KNOWN_METRICS` (a name ending in ``_db`` or holding
                       ``sqnr`` is in dB)
=====================  ===============================================================

A goal is refused before any work when it lies outside the metric's range, and, for a
metric in dB, when it is below :data:`MIN_DB_GOAL` (``--goal 0.97`` on tensor data is a
fraction typed where decibels are meant).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from quantscope.tasks.shares import ITEM_WORDS, clusters_key, items_key
from quantscope.types import PooledEmbedding, QuantscopeError, RowScoring, Task
from quantscope.units import is_db, one_per_sample

# The headline of tensor data with no task: the worst channel's SQNR in dB over every
# output (a mixed-scale output hides a lost channel in the whole-output ``sqnr_db``).
TENSOR_HEADLINE = "sqnr_db_channel_min"

MIN_DB_GOAL = 3.0  # a goal in dB below this looks like a fraction typed for an agreement

_UNIT = (-math.inf, math.inf)


@dataclass(frozen=True)
class Headline:
    """A metric as a goal is set in it: key, direction, range, unit."""

    metric: str
    higher_is_better: bool = True
    goal_range: tuple[float, float] = _UNIT
    unit: str = ""  # "dB", or "" for a fraction / correlation / ratio

    def reached(self, value: float | None, goal: float) -> bool:
        if value is None or math.isnan(value):
            return False
        return value >= goal if self.higher_is_better else value <= goal

    def check_goal(self, goal: float | None) -> None:
        """One-line error for a goal this metric cannot take (call before any work)."""
        if goal is None:
            return
        lo, hi = self.goal_range
        if not lo <= goal <= hi:
            raise QuantscopeError(
                f"--goal {goal:g} is outside the range of {self.metric} ({lo:g} to {hi:g}): "
                "give a goal in that range")
        if self.unit == "dB" and goal < MIN_DB_GOAL:
            raise QuantscopeError(
                f"--goal {goal:g}: the goal is in dB for this data (metric {self.metric}); a "
                f"goal below {MIN_DB_GOAL:g} dB looks like a fraction: give e.g. --goal 30 "
                "(dB), or --metric NAME for a metric in other units")


# metric key -> (higher is better, goal range); a key not listed: by its name (dB or any)
KNOWN_METRICS: dict[str, tuple[bool, tuple[float, float]]] = {
    "top1_agreement": (True, (0.0, 1.0)),
    "recall@1": (True, (0.0, 1.0)),
    "recall@5": (True, (0.0, 1.0)),
    "recall@10": (True, (0.0, 1.0)),
    "mrr": (True, (0.0, 1.0)),
    "tar_at_far": (True, (0.0, 1.0)),
    "decision_agreement": (True, (0.0, 1.0)),
    "exact_agreement": (True, (0.0, 1.0)),
    "score_agreement": (True, (-1.0, 1.0)),
    "spearman": (True, (-1.0, 1.0)),
    "embedding_cosine_mean": (True, (-1.0, 1.0)),
    "embedding_cosine_min": (True, (-1.0, 1.0)),
    "embedding_cosine_p01": (True, (-1.0, 1.0)),
    "cosine_mean": (True, (-1.0, 1.0)),
    "cosine_min": (True, (-1.0, 1.0)),
    "detection_f1": (True, (0.0, 1.0)),
    "mask_iou": (True, (0.0, 1.0)),
    "point_agreement": (True, (0.0, 1.0)),
    "point_flag_agreement": (True, (0.0, 1.0)),
    "point_agreement_flagged": (True, (0.0, 1.0)),
    "string_agreement": (True, (0.0, 1.0)),
    "char_error_rate": (False, (0.0, math.inf)),
    "class_iou_min": (True, (0.0, 1.0)),
    # the tasks' other figures a run may plan by: errors are lower-better ('goal
    # point_error_max >= 2 REACHED: 30.5' read a 30.5 px error as the goal met)
    "point_error_mean": (False, (0.0, math.inf)),
    "point_error_max": (False, (0.0, math.inf)),
    "point_error_mean_photo": (False, (0.0, math.inf)),  # photo=PX: pixels of the photo
    "point_error_max_photo": (False, (0.0, math.inf)),
    "score_abs_error_max": (False, (0.0, math.inf)),
    "score_abs_error_mean": (False, (0.0, math.inf)),
    "class_score_max_abs_error": (False, (0.0, math.inf)),
    "pixel_flip_share": (False, (0.0, 1.0)),
    "mask_iou_min": (True, (0.0, 1.0)),
    "box_iou_mean": (True, (0.0, 1.0)),
    "detection_precision": (True, (0.0, 1.0)),
    "detection_recall": (True, (0.0, 1.0)),
    "similarity_mae": (False, (0.0, 2.0)),
    # an image's and a depth map's (tasks/pictures.py, tasks/depth.py): '--metric
    # image_abs_error_mean' had been planned as higher-is-better, its largest error first
    "image_abs_error_mean": (False, (0.0, math.inf)),
    "image_abs_error_max": (False, (0.0, math.inf)),
    "image_outside_share": (False, (0.0, 1.0)),
    "ssim": (True, (-1.0, 1.0)),
    "ssim_min": (True, (-1.0, 1.0)),
    "depth_abs_rel": (False, (0.0, math.inf)),
    "depth_abs_rel_max": (False, (0.0, math.inf)),
    "depth_delta1": (True, (0.0, 1.0)),
    "map_abs_error_mean": (False, (0.0, math.inf)),
    "map_abs_error_max": (False, (0.0, math.inf)),
    "kl": (False, (0.0, math.inf)),
    # an embedder's pair decisions (tasks/verify.py) and a pitch tracker's (tasks/pitch.py)
    "true_accept_rate": (True, (0.0, 1.0)),
    "false_accept_rate": (False, (0.0, 1.0)),
    "equal_error_rate": (False, (0.0, 1.0)),
    "pitch_agreement": (True, (0.0, 1.0)),
    # an embedding judged by its neighbours (tasks/neighbours.py)
    "neighbour_agreement": (True, (0.0, 1.0)),
    "neighbour_label_agreement": (True, (0.0, 1.0)),
    "neighbour_top5_overlap": (True, (0.0, 1.0)),
    "voicing_agreement": (True, (0.0, 1.0)),
    "pitch_cents_error_mean": (False, (0.0, math.inf)),
    "pitch_cents_error_max": (False, (0.0, math.inf)),
}
# a key not listed whose name says it is an error or a divergence is lower-better too
_ERROR_WORDS = ("error", "_mae", "mse", "flip", "divergence")


def describe_metric(metric: str) -> Headline:
    """Direction, range and unit of a metric named by key (``--metric``)."""
    if metric in KNOWN_METRICS:
        higher, rng = KNOWN_METRICS[metric]
        return Headline(metric, higher, rng)
    if is_db(metric):  # per-output keys too: sqnr_db:1
        return Headline(metric, True, _UNIT, "dB")
    if any(w in metric.split(":")[0] for w in _ERROR_WORDS):
        return Headline(metric, False, (0.0, math.inf))
    return Headline(metric)


def headline_of(task: Task | None, metric: str | None = None) -> Headline:
    """The metric a plan on this data is judged by: ``metric`` when the user named one,
    else the task's headline, else :data:`TENSOR_HEADLINE`."""
    name = metric or getattr(task, "headline", None) or TENSOR_HEADLINE
    known = describe_metric(name)
    if task is None or name != getattr(task, "headline", None):
        return known
    return Headline(name, bool(getattr(task, "higher_is_better", True)),
                    tuple(getattr(task, "goal_range", known.goal_range)),  # type: ignore[arg-type]
                    known.unit)


def row_scoring_of(task: Task | None, output_names: Sequence[str] = ()) -> RowScoring | None:
    """How the analysis scores this task on reduced rows (None: every output's fidelity).

    A task without ``row_scoring`` whose metrics read each sample alone (``row_local``,
    e.g. the tensor-output tasks of ``--layout``) is scored by its own :meth:`metrics` on
    the outputs rebuilt from the rows (:func:`sample_row_scoring`), given the model's
    ``output_names``."""
    if task is None:
        return None
    fn = getattr(task, "row_scoring", None)
    if fn is not None:
        return fn(tuple(output_names))
    if getattr(task, "row_local", False) and getattr(task, "headline", None) and output_names:
        return sample_row_scoring(task, tuple(output_names))
    return None


def sample_row_scoring(task: Task, output_names: Sequence[str]) -> RowScoring:
    """The task's own metrics as the analysis' score, for a task that reads each sample
    alone: ``reduce`` puts every output sample-first (an output batched on another axis,
    ``--batch-axis``, as :func:`quantscope.types.sample_first` does for ``evaluate``) and
    keeps each one with the samples' count, flattened side by side (remembering each one's
    per-sample shape); ``score`` rebuilds those outputs and asks ``task.metrics``, so the
    analysis ranks groups by the very headline ``evaluate`` reports. Its figures on a
    subset of rows are comparable with the whole data's (``row_local``: the sweeps rank by
    them on their row subsets) unless the task says its figures read every sample against
    the others (``rows_alone`` False: an embedding's nearest neighbours, whose agreement on
    4 rows is no estimate of it on 33); such a task is ranked on subsets by the outputs'
    fidelity, and by its own figure only where every row is scored (``--proxy 1.0``)."""
    from quantscope.types import Outputs, sample_first

    layout: list[tuple[str, int, int, tuple[int, ...]]] = []  # name, start, stop, shape

    def reduce(outputs: Sequence[np.ndarray], feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        outputs = sample_first(outputs, feeds)
        n = len(outputs[0])
        parts, spans, at = [], [], 0
        for name, o in zip(output_names, outputs, strict=False):
            if np.ndim(o) < 1 or len(o) != n:
                continue
            flat = np.asarray(o, dtype=np.float32).reshape(n, -1)
            parts.append(flat)
            spans.append((name, at, at + flat.shape[1], tuple(np.shape(o)[1:])))
            at += flat.shape[1]
        if not layout:
            layout.extend(spans)
        return np.concatenate(parts, axis=1)

    def rebuild(rows: np.ndarray) -> Outputs:
        names = tuple(s[0] for s in layout)
        arrays = tuple(rows[:, a:b].reshape(len(rows), *shape) for _, a, b, shape in layout)
        return Outputs(names=names, batches=(arrays,))

    def score(ref: np.ndarray, test: np.ndarray) -> dict[str, float]:
        if not layout:
            return {}
        values = task.metrics(rebuild(ref), rebuild(test)).values
        return {k: float(v) for k, v in values.items()}

    return RowScoring(reduce=reduce, score=score, primary=task.headline,
                      higher_is_better=bool(getattr(task, "higher_is_better", True)),
                      row_local=bool(getattr(task, "rows_alone", True)))


def share_items(task: Task | None, metric: str, values: Mapping[str, float]
                ) -> tuple[int, str] | None:
    """How many items the share ``metric`` is over, and what they are, where the task or
    its figures tell (the binomial noise of a headline with no per-sample scores,
    :func:`quantscope.tasks.shares.share_noise`): the count the task gave beside the
    figure (``KEY_items``, :mod:`quantscope.tasks.shares`: a class output's top-1 picks,
    effective where positions cluster by sample, a score output's decisions, image views,
    a detection share's detections), a face verification's decision agreement over its
    pairs. None: not known (another metric, or a share whose items nothing counts)."""
    pairs = getattr(task, "pairs", None)
    if metric == "decision_agreement" and hasattr(pairs, "genuine"):
        return len(pairs.genuine), "verification pairs"  # type: ignore[union-attr]
    n = values.get(items_key(metric))
    if n is not None and np.isfinite(n) and n >= 1:
        what = ITEM_WORDS.get(metric.split(":")[0], "items")
        k = values.get(clusters_key(metric))
        if k is not None and np.isfinite(k) and not one_per_sample(metric, values):
            what += f" (effective count: positions clustered by their {int(k)} samples)"
        return int(n), what
    return None


def objective_of(task: Task | None) -> PooledEmbedding | None:
    """What the fine-tune distils towards (None: every float output)."""
    fn = getattr(task, "objective", None)
    return None if fn is None else fn()


# ---------------------------------------------------------------- row scorings of text tasks

def _pooled_rows(output_index: int, attention_mask: str) -> Any:
    from quantscope.tasks.text import pool

    def reduce(outputs: Sequence[np.ndarray], feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        return pool(outputs[output_index], feeds[attention_mask], normalize=False)

    return reduce


def retrieval_scoring(n_queries: int, order: np.ndarray, attention_mask: str,
                      output_index: int = 0) -> RowScoring:
    """Top-1 retrieval agreement for a text set laid out as ``queries + documents``.

    ``order`` is :attr:`quantscope.tasks.text.TextBatches.order` (rows in batch order ->
    input text index); texts ``[0, n_queries)`` are queries, the rest their documents.
    Reduce: mean pooling of the encoder output over ``attention_mask`` (not normalised, so
    the collapse detector sees the norms).
    """
    from quantscope.tasks.metrics import recall_at_k, top1_agreement

    def score(ref: np.ndarray, test: np.ndarray) -> dict[str, float]:
        r, t = np.empty_like(ref), np.empty_like(test)
        r[order], t[order] = ref, test
        q, d = slice(0, n_queries), slice(n_queries, None)
        return {
            "top1_agreement": top1_agreement(r[q], r[d], t[q], t[d]),
            "recall_at_1": recall_at_k(t[q], t[d], (1,))[1],
        }

    return RowScoring(reduce=_pooled_rows(output_index, attention_mask), score=score,
                      primary="top1_agreement", row_local=False)


def sts_scoring(n_pairs: int, order: np.ndarray, attention_mask: str,
                output_index: int = 0) -> RowScoring:
    """Sentence similarity laid out as ``first sentences + second sentences``: the
    Spearman correlation of the quantized pair cosines with FP32's (``score_agreement``).
    Reduce: mean pooling of the encoder output (not normalised)."""
    from quantscope.tasks.metrics import spearman

    def cosines(rows: np.ndarray) -> np.ndarray:
        r = np.empty_like(rows)
        r[order] = rows
        r /= np.maximum(np.linalg.norm(r, axis=1, keepdims=True), 1e-12)
        return np.sum(r[:n_pairs] * r[n_pairs:], axis=1)

    def score(ref: np.ndarray, test: np.ndarray) -> dict[str, float]:
        return {"score_agreement": spearman(cosines(test), cosines(ref))}

    return RowScoring(reduce=_pooled_rows(output_index, attention_mask), score=score,
                      primary="score_agreement", row_local=False)
