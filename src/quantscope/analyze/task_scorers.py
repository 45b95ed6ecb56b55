"""Analysis scorers for tensor data whose outputs have a task (``--layout`` or a detected
detection head, :mod:`quantscope.tasks.layout`).

The sweeps score hundreds of plans from reduced rows (:mod:`quantscope.analyze.scoring`).
Here ``reduce`` keeps every output whose first axis is the samples, flattened and side by
side (remembering each one's per-sample shape), and ``score`` rebuilds those outputs and
asks the task itself: the analysis ranks groups by the very metric ``evaluate`` reports
(``detection_f1``, ``mask_iou``, ``decision_agreement``), not by an SQNR that a mix of
scales can fool. These tasks read each sample alone, so any subset of rows is scored alike
(``row_local``).

Wiring (the caller picks the scorer from the data's task)::

    task = data.task
    if getattr(task, "row_local", False) and hasattr(task, "headline"):
        return layout_scorer(task, model.output_names())
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from quantscope.analyze.scoring import Scorer
from quantscope.types import Outputs


def layout_scorer(task: Any, output_names: Sequence[str]) -> Scorer:
    """A :class:`Scorer` whose primary metric is ``task.headline``, computed by
    ``task.metrics`` on the outputs rebuilt from the reduced rows (an F1 where FP32 keeps
    no detection is NaN, as in ``evaluate``: the task's note says why)."""
    layout: list[tuple[str, int, int, tuple[int, ...]]] = []  # name, start, stop, shape

    def reduce(outputs: Sequence[np.ndarray], feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        del feeds
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

    return Scorer(score=score, primary=task.headline, reduce=reduce,
                  higher_is_better=task.higher_is_better, row_local=True)


def detection_scorer(task: Any, output_names: Sequence[str]) -> Scorer:
    """:func:`layout_scorer` for a :class:`quantscope.tasks.detection.DetectionTask`
    (primary ``detection_f1``)."""
    return layout_scorer(task, output_names)


def map_scorer(task: Any, output_names: Sequence[str]) -> Scorer:
    """:func:`layout_scorer` for a :class:`quantscope.tasks.maps.MapTask` (``mask_iou``)
    or :class:`~quantscope.tasks.maps.ScoreTask` (``decision_agreement``)."""
    return layout_scorer(task, output_names)
