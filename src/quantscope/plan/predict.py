"""What the planner predicts for a candidate plan: its cost and its quality.

=============  ====================================================================
gain           the sum over groups of ``sens.delta(g, start[g], prec[g])`` (the gain
               of each group measured alone, from the analysis) plus the ``gain`` of
               each chosen repair: ADDED, an estimate, not a measurement
quality        ``sens.quality(gain)``: base + gain (sign by the metric's direction),
               clipped to the reference
cost           ``CostTable.total`` (= ``plan_cost``) plus each chosen repair's cost
=============  ====================================================================

Every stage ranks candidates by these numbers; only the refinement measures.
"""

from __future__ import annotations

from collections.abc import Sequence

from quantscope.plan.pareto import FrontPoint
from quantscope.plan.start import Precisions, Space

ESTIMATE_NOTE = "predicted quality adds per-group gains measured one group at a time: an estimate"


def predicted_gain(space: Space, prec: Precisions, applied: Sequence[str]) -> float:
    sens = space.sens
    total = sum(sens.delta(g, space.start[g], prec[g]) or 0.0 for g in space.names)
    return total + sum(r.gain for r in space.repairs if r.name in applied)


def predicted_cost(space: Space, prec: Precisions, applied: Sequence[str]) -> float:
    return space.table.total(prec) + sum(r.cost for r in space.repairs if r.name in applied)


def predict(
    space: Space, prec: Precisions, applied: Sequence[str], origin: str, step: int
) -> FrontPoint:
    """The unmeasured point of the plan with ``prec`` and the repairs ``applied``."""
    return FrontPoint(
        cost=predicted_cost(space, prec, applied),
        predicted=space.sens.quality(predicted_gain(space, prec, applied)),
        measured=None,
        overrides=space.plan(prec).overrides,
        origin=origin,
        step=step,
        repairs=tuple(applied),
    )
