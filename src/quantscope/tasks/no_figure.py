"""Why a task's headline has no value (NaN) on some data, in the task's own words.

A task gives no figure (NaN) when the data holds nothing it counts: a ``points`` output
gated by ``where=`` whose score passes nowhere, a verification with no same/different
pairs, a depth map with no positive value. Scored FP32 against itself, such a figure has
no value for any plan either, so a plan search cannot rank plans by it: its measurements
are all NaN, and a NaN gain or figure compares as neither better nor worse (h62: a gate
that kept no point on the fit data made the planner buy 7.03x for nothing). A task that
gives no figure returns only the notes that say why; :func:`no_figure_notes` collects
them (of each output's task whose figure is missing, for several outputs).
"""

from __future__ import annotations

import math
from typing import Any

from quantscope.types import Outputs


def no_figure_notes(task: Any, metric: str, ref: Outputs) -> tuple[str, ...] | None:
    """None when ``metric`` has a value with FP32's outputs ``ref`` scored against
    themselves by ``task`` (or is no figure of the task: output fidelity has one); else the
    notes of the task (of each output's task without it) saying why it has none."""
    value = task.metrics(ref, ref).values.get(metric)
    if value is None or not math.isnan(value):
        return None
    key, _, output = metric.partition(":")
    notes: list[str] = []
    for t in getattr(task, "tasks", (task,)):
        if output and getattr(t, "output", None) != output:
            continue
        got = t.metrics(ref, ref)
        if math.isnan(got.values.get(key, 0.0)):
            notes.extend(n for n in got.notes if n not in notes)
    return tuple(notes)
