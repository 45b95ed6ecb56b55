"""A headline with no value on the data a plan is searched on is refused before any work.

The plan search ranks plans by the headline measured on the fit data. Where the data
holds nothing the headline counts (a ``where=`` gate no FP32 score passes, a verification
with no same/different pair), every plan's figure is NaN, FP32's against itself too: the
search cannot rank them, and a NaN compares as neither better nor worse, so it bought
cost for nothing (h62: 7.03x for a tiny P-Net-like model at ``where=prob:1>0.999``).
:func:`check_figure` scores FP32 against itself on the data, as :func:`quantscope.analyze.
measure.check_metric` does for a ``--metric``, and refuses in one line naming the metric,
the task's own words for why it has none (:mod:`quantscope.tasks.no_figure`) and the fix.
"""

from __future__ import annotations

import numpy as np

from quantscope.emulate.evaluate import kept, run_model
from quantscope.model.load import Model
from quantscope.tasks.no_figure import no_figure_notes
from quantscope.tasks.registry import text_task
from quantscope.types import Dataset, QuantscopeError

FIX = "give fit data where it has a value, or rank by another figure with --metric"


def check_figure(model: Model, data: Dataset, metric: str, *, what: str = "the fit data"
                 ) -> None:
    """Refuse ``metric`` when FP32 scored against itself on ``data.evaluation`` gives it no
    value (see the module docstring). A task that reads each sample alone is scored on the
    first batch, and on every batch only when that one gives none; text pairs (retrieval,
    STS: a figure over every pair) are not checked."""
    task = data.task
    if task is None or text_task(task) is not None:
        return
    batches = list(data.evaluation)
    keep = getattr(task, "keep", None)
    first = batches[:1] if getattr(task, "row_local", False) and len(batches) > 1 else []
    why: tuple[str, ...] | None = ()
    for part in (first, batches) if first else (batches,):
        ref = kept(run_model(model.proto, part), part, keep)
        with np.errstate(all="ignore"):
            why = no_figure_notes(task, metric, ref)
        if why is None:
            return
    said = f" ({'; '.join(why)})" if why else ""
    raise QuantscopeError(
        f"{metric} has no value on {what}, not even FP32's against itself{said}: the plan "
        f"search cannot rank plans by it (every plan's figure is NaN); {FIX}")
