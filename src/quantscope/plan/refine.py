"""Pruning (by prediction) and refinement (by measurement) of greedy points.

==============  ===================================================================
prune           for ``min_quality``: from the first greedy point that meets Q, revert
                promotions (cheapest resulting plan first) while the prediction still
                meets Q and the plan stays legal
refine          with ``evaluate(plan) -> float``: for ``min_quality`` search the
                greedy path for the first point whose measurement meets Q (the
                measurement is assumed to rise along the path; the probe starts at the
                first point predicted to meet it), and measure the pruned plan; else
                measure the best-predicted points within ``max_cost``
drop            from the best measured point, revert promotions with the least
                predicted gain per unit of cost saved; keep a revert when the
                measurement still meets Q (or, without Q, loses at most ``tol``);
                then try removing each chosen repair, kept out when the measurement
                is at least as good (repairs x precisions, measured jointly)
==============  ===================================================================

At most ``steps`` evaluations in all (:class:`Meter`); each plan is measured once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from quantscope.plan.greedy import EPS, PlannerError, Run, plan_from, prec_of
from quantscope.plan.pareto import FrontPoint, select
from quantscope.types import Plan

Evaluate = Callable[[Plan], float]


# ---------------------------------------------------------------- pruning and refinement


def prune(run: Run, path: list[FrontPoint]) -> list[FrontPoint]:
    """Drop promotions from the first point meeting the budget while the prediction allows."""
    first = next((p for p in path if run.budget.meets(p)), None)
    if first is None:
        return []
    prec, out = prec_of(run, first), []
    while True:
        options = []
        for i, g in enumerate(run.names):
            if prec[g] != run.start[g]:
                trial = {**prec, g: run.start[g]}
                pt = run.point(trial, first.repairs, "pruned")
                if run.budget.meets(pt):
                    options.append((pt.cost, i, trial, pt))
        nxt = next(
            (
                o
                for o in sorted(options, key=lambda o: o[:2])
                if not run.legal.blocking(run.plan(o[2]))
            ),
            None,
        )
        if nxt is None:
            return out
        prec = nxt[2]
        out.append(replace(nxt[3], step=first.step))


class Meter:
    """Measures points with ``evaluate``, at most ``steps`` times, caching by plan."""

    def __init__(self, run: Run, evaluate: Evaluate, steps: int) -> None:
        self.run, self.evaluate, self.left = run, evaluate, steps
        self.seen: dict[tuple, FrontPoint] = {}

    def measure(self, point: FrontPoint) -> FrontPoint | None:
        if point.key() in self.seen:
            return self.seen[point.key()]
        if self.left <= 0:
            return None
        self.left -= 1
        plan = emit(self.run, point, reasons=(), meta=repair_meta(point))
        done = replace(point, measured=float(self.evaluate(plan)))
        self.seen[point.key()] = done
        return done


def _first_meeting(meter: Meter, seq: list[FrontPoint]) -> None:
    """Find the first path point whose measurement meets Q (measurements assumed rising)."""
    budget = meter.run.budget
    lo, hi = 0, len(seq) - 1
    probe = next((i for i, p in enumerate(seq) if budget.meets(p)), hi)
    while lo <= hi:
        pt = meter.measure(seq[probe])
        if pt is None:
            return
        if budget.meets(pt):
            hi = probe - 1
        else:
            lo = probe + 1
        probe = (lo + hi) // 2


def refine(
    run: Run, path: list[FrontPoint], pruned: list[FrontPoint], meter: Meter, tol: float
) -> list[FrontPoint]:
    capped = [p for p in path if run.budget.within_cost(p.cost)]
    if not capped:
        return []
    if run.budget.min_quality is not None:
        _first_meeting(meter, capped)
        if pruned:
            meter.measure(pruned[-1])
    else:
        for p in reversed(capped[-max(1, meter.left // 2) :]):
            meter.measure(p)
    if meter.seen:
        _drop(run, meter, select(list(meter.seen.values()), run.budget)[0], tol)
    return list(meter.seen.values())


def _drop(run: Run, meter: Meter, current: FrontPoint, tol: float) -> None:
    """Revert promotions (least predicted gain per cost saved first) the measurement allows."""
    prec, budget = prec_of(run, current), run.budget
    sign = 1.0 if budget.higher_is_better else -1.0

    def worth(g: str) -> float:
        saved = -run.table.delta(prec, g, run.start[g])
        return (run.sens.delta(g, run.start[g], prec[g]) or 0.0) / max(saved, EPS)

    for g in sorted((g for g in run.names if prec[g] != run.start[g]), key=worth):
        trial = {**prec, g: run.start[g]}
        pt = run.point(trial, current.repairs, "dropped")
        if not budget.within_cost(pt.cost) or run.legal.blocking(run.plan(trial)):
            continue
        done = meter.measure(replace(pt, step=current.step))
        if done is None:
            return
        keep = (
            budget.meets(done)
            if budget.min_quality is not None
            else sign * (done.quality - current.quality) >= -tol
        )
        if keep:
            current, prec = done, trial
    for r in current.repairs:
        # a repair stays only if the measurement says it helps this plan
        rest = tuple(x for x in current.repairs if x != r)
        pt = run.point(prec, rest, "dropped")
        done = meter.measure(replace(pt, step=current.step))
        if done is None:
            return
        if sign * (done.quality - current.quality) >= 0 and (
            budget.min_quality is None or budget.meets(done)
        ):
            current = done


def repair_meta(point: FrontPoint) -> tuple[tuple[str, str], ...]:
    return (("repairs", ",".join(point.repairs)),) if point.repairs else ()


def emit(run: Run, point: FrontPoint, *, reasons: tuple, meta: tuple) -> Plan:
    """The plan of ``point``; raises :class:`PlannerError` if ``check`` reports an error."""
    plan = plan_from(run.legal.start, prec_of(run, point), run.names)
    plan = Plan(
        default=plan.default,
        overrides=plan.overrides,
        target=run.legal.target.name,
        reasons=reasons,
        meta=meta,
    )
    errors = [p for p in run.legal.problems(plan) if p.severity == "error"]
    if errors:
        raise PlannerError(
            f"internal error: the planner built a plan that fails check "
            f"({errors[0].group}: {errors[0].rule}); please report it"
        )
    return plan
