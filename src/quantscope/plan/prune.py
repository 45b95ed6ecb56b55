"""Pruning by prediction, for ``min_quality``: undo promotions a later one made redundant.

From the first greedy point that meets Q, revert one promotion at a time -- the one whose
reverted plan is cheapest (ties by group order) -- while the prediction still meets Q and
the plan stays legal (a group reverts with the groups reading its weight:
:meth:`Space.revert`). Each reverted plan is a point (origin ``pruned``, the step of that
first point). Without ``min_quality`` (or if no point meets it) nothing is pruned.
"""

from __future__ import annotations

from quantscope.plan.greedy import Walk
from quantscope.plan.pareto import FrontPoint
from quantscope.plan.predict import predict
from quantscope.plan.start import Space


def prune(space: Space, walk: Walk) -> tuple[FrontPoint, ...]:
    """Points with promotions dropped while the prediction allows (module docstring)."""
    budget = space.budget
    first = next((p for p in walk.points if budget.meets(p)), None)
    if budget.min_quality is None or first is None:
        return ()
    prec, out = space.precisions(first), []
    while True:
        options = []
        for i, g in enumerate(space.names):
            if prec[g] != space.start[g]:
                trial = {**prec, **space.revert(prec, g)}
                pt = predict(space, trial, first.repairs, "pruned", first.step)
                if budget.meets(pt):
                    options.append((pt.cost, i, trial, pt))
        legal = (o for o in sorted(options, key=lambda o: o[:2])
                 if not space.legal.blocking(space.plan(o[2])))
        nxt = next(legal, None)
        if nxt is None:
            return tuple(out)
        prec = nxt[2]
        out.append(nxt[3])
