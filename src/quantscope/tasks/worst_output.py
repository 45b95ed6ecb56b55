"""The note that names, for several outputs judged by the same headline (MTCNN's O-Net:
``boxes`` and ``landmarks``, both ``points``), which output the headline figure is (the
worst one's: :class:`quantscope.tasks.layout.OutputTasks`) and each output's own figure,
in its task's words where it has them (a points task's pixels: ``PointsTask.figure``).
``run``'s verdict repeats it for the plan (:data:`MARK` finds it among the notes)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from quantscope.units import value

MARK = "headline over several outputs: "


def worst_output_note(headline: str, tasks: Sequence[object],
                      per_task: Sequence[Mapping[str, float]], worst: float | None) -> str:
    """``MARK`` + which output the unprefixed ``headline`` is and each output's figure;
    empty when fewer than two outputs have the headline."""
    rows = [(t, v) for t, v in zip(tasks, per_task, strict=True) if headline in v]
    if len(rows) < 2:
        return ""

    def figure(task: object, values: Mapping[str, float]) -> str:
        own = getattr(task, "figure", None)
        return own(values) if own is not None else value(headline, values[headline])

    named = [getattr(t, "output", "") for t, v in rows
             if worst is not None and not math.isnan(worst) and v[headline] == worst]
    tied = f" (tied with {', '.join(repr(o) for o in named[1:])})" if len(named) > 1 else ""
    which = (f"the worst output's, '{named[0]}''s{tied}" if named else
             "no output's alone (a figure is not a number)")
    each = "; ".join(f"'{getattr(t, 'output', '')}' {figure(t, v)}" for t, v in rows)
    return f"{MARK}{headline} (the figure without an output name) is {which}: {each}"
