"""The search's result: the chosen plan, the front, and why it is what it is.

=============  ====================================================================
front          the non-dominated greedy and pruned points (by prediction), with their
               measurement where the refinement made one
chosen         the point the budget asks for among the measured points, or else among
               the greedy and pruned ones (:func:`~quantscope.plan.pareto.select`)
choice         without a quality goal: how the best-quality rule chose among the measured
               points, with the noise interval that made a cheaper one a tie
               (:func:`~quantscope.plan.pareto.choice_record`; ``pareto["choice"]``)
reasons        per group: its promotion (predicted gain, cost), and the promotions a
               rule blocked when they would have gained more
blockers       per rule: the groups it blocked and the predicted gain left on the
               table, largest first (``max_cost`` for the cost cap)
binding        when the budget is not met: the blocking rule, the cost cap, or that
               the prediction met it and the measurement did not
=============  ====================================================================

Every plan in the result (chosen, front, trials) is emitted through
:func:`~quantscope.plan.start.emit`, which re-runs ``check``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from quantscope.plan.greedy import Move, Skip, Walk
from quantscope.plan.pareto import (
    Budget,
    FrontPoint,
    choice_record,
    pareto_front,
    point_to_dict,
    select,
)
from quantscope.plan.predict import ESTIMATE_NOTE, predicted_cost
from quantscope.plan.refine import BudgetStop
from quantscope.plan.start import EPS, RepairOption, Space, emit, repair_meta
from quantscope.types import Plan, Precision
from quantscope.units import gain, value

PLANNER = "quantscope.plan.search greedy+refine/1"


@dataclass(frozen=True)
class Blocker:
    rule: str  # a target rule id, "precision.not_allowed", or "max_cost"
    groups: tuple[str, ...]
    gain: float  # predicted gain it leaves on the table (sum over its groups)


@dataclass(frozen=True)
class SearchResult:
    plan: Plan
    cost: float
    predicted: float
    measured: float | None
    met: bool
    budget: Budget
    metric: str
    front: tuple[FrontPoint, ...]
    path: tuple[Move, ...]
    trials: tuple[FrontPoint, ...] = ()  # every measured plan, in measuring order
    skipped: tuple[Skip, ...] = ()
    blockers: tuple[Blocker, ...] = ()
    binding: str | None = None
    repairs: tuple[RepairOption, ...] = ()
    notes: tuple[str, ...] = ()
    time_budget: BudgetStop | None = None  # the time budget stopped the measuring
    # without a quality goal: the measured point chosen, the best one and the noise
    # interval between them (pareto.choice_record); None: a goal decided, or none measured
    choice: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The plan JSON's ``pareto`` entry (stable key order)."""
        return result_to_dict(self)


def result(
    space: Space,
    walk: Walk,
    pruned: tuple[FrontPoint, ...],
    trials: tuple[FrontPoint, ...],
    *,
    seed: int,
    stop: BudgetStop | None = None,
    measured_metric: str | None = None,
) -> SearchResult:
    """Choose, explain and emit (module table); ``measured_metric``: the metric the
    trials were measured in (the analysis' when None)."""
    candidates = walk.points + pruned
    measured = {t.key(): t for t in trials}
    front = tuple(measured.get(p.key(), p) for p in pareto_front(candidates, space.budget))
    chosen, met = select(trials or candidates, space.budget)
    predicted_ok = any(space.budget.meets(p) for p in candidates)
    prec = space.precisions(chosen)
    blockers = _blockers(space, walk.skips, prec)
    plan = emit(space, chosen, reasons=_reasons(space, walk.skips, prec),
                meta=_meta(space, chosen, seed))
    for p in (*front, *trials):
        emit(space, p, reasons=(), meta=())
    return SearchResult(
        plan=plan,
        cost=chosen.cost,
        predicted=chosen.predicted,
        measured=chosen.measured,
        met=met,
        budget=space.budget,
        metric=space.sens.metric,
        front=front,
        path=walk.moves,
        trials=trials,
        skipped=walk.skips,
        blockers=blockers,
        binding=None if met else _binding(space, chosen, blockers, predicted_ok=predicted_ok),
        repairs=tuple(r for r in space.repairs if r.name in chosen.repairs),
        notes=(*_notes(space), *((stop.note(),) if stop is not None else ())),
        time_budget=stop,
        choice=choice_record(trials, chosen, space.budget,
                             measured_metric or space.sens.metric) if trials else None,
    )


def _meta(space: Space, chosen: FrontPoint, seed: int) -> tuple[tuple[str, str], ...]:
    meta = (
        ("planner", PLANNER),
        ("metric", space.sens.metric),
        ("seed", str(seed)),
        ("budget", space.budget.describe()),
        ("cost", f"{chosen.cost:.6g}"),
        ("predicted", f"{chosen.predicted:.6g}"),
    )
    if chosen.measured is not None:
        meta += (("measured", f"{chosen.measured:.6g}"),)
    return meta + repair_meta(chosen)


def _reasons(
    space: Space, skips: tuple[Skip, ...], prec: dict[str, Precision]
) -> tuple[tuple[str, str], ...]:
    sens, start, out = space.sens, space.start, []
    for g in space.names:
        reached = sens.gain(g, prec[g]) or 0.0
        blocked = [s for s in skips if s.group == g and s.gain > reached + EPS]
        note = "; ".join(
            f"{s.precision} ({gain(sens.metric, s.gain, fine=True)} predicted) blocked by "
            f"{', '.join(s.rules)}"
            for s in blocked
        )
        if prec[g] != start[g]:
            dg = sens.delta(g, start[g], prec[g]) or 0.0
            dc = -space.table.delta(prec, g, start[g])
            text = (f"{prec[g]}: {gain(sens.metric, dg, fine=True)} {sens.metric} predicted, "
                    f"cost {dc:+.4g}")
        elif note:
            text = f"kept at {prec[g]}"
        else:
            continue
        out.append((g, f"{text}; {note}" if note else text))
    return tuple(out)


def _blockers(
    space: Space, skips: tuple[Skip, ...], prec: dict[str, Precision]
) -> tuple[Blocker, ...]:
    per_rule: dict[str, dict[str, float]] = {}
    for s in skips:
        left = s.gain - (space.sens.gain(s.group, prec[s.group]) or 0.0)
        for rule in s.rules if left > EPS else ():
            seen = per_rule.setdefault(rule, {})
            seen[s.group] = max(seen.get(s.group, 0.0), left)
    order = {g: i for i, g in enumerate(space.names)}
    out = [
        Blocker(r, tuple(sorted(gs, key=order.__getitem__)), sum(gs.values()))
        for r, gs in per_rule.items()
    ]
    return tuple(sorted(out, key=lambda b: (-b.gain, b.rule)))


def _binding(
    space: Space, chosen: FrontPoint, blockers: tuple[Blocker, ...], *, predicted_ok: bool
) -> str:
    budget, start_cost = space.budget, predicted_cost(space, space.start, ())
    if not budget.within_cost(start_cost):
        return (
            f"max_cost {budget.max_cost:g} is below the cost of the start plan ({start_cost:.4g})"
        )
    how = "predicted" if chosen.measured is None else "measured"
    metric = space.sens.metric
    goal = ", ".join(
        ([f"min_quality {value(metric, budget.min_quality)}"]
         if budget.min_quality is not None else [])
        + ([f"max_cost {budget.max_cost:g}"] if budget.max_cost is not None else []))
    parts = [
        f"{goal or budget.describe()} not met: the best legal plan found has {metric} "
        f"{value(metric, chosen.quality)} ({how}) at cost {chosen.cost:.4g}"
    ]
    rules = [b for b in blockers if b.rule != "max_cost"]
    if rules:
        b = rules[0]
        shown = ", ".join(b.groups[:3]) + (" …" if len(b.groups) > 3 else "")
        parts.append(
            f"binding rule: {b.rule} blocks {gain(metric, b.gain, fine=True)} predicted on "
            f"{len(b.groups)} group(s) ({shown})"
        )
        parts += [f"also {o.rule} ({gain(metric, o.gain, fine=True)})" for o in rules[1:3]]
    cap = next((b for b in blockers if b.rule == "max_cost"), None)
    if cap:
        parts.append(f"the cost cap binds: promotions worth {gain(metric, cap.gain, fine=True)} "
                     "predicted exceed it")
    if predicted_ok and chosen.measured is not None:
        parts.append("a predicted plan meets it, the measurement does not (gains are not additive)")
    elif not rules and not cap:
        parts.append("no legal promotion with a positive predicted gain is left")
    return "; ".join(parts)


def _notes(space: Space) -> tuple[str, ...]:
    known = set(space.names)
    named = [g for g, _ in space.sens.gains]
    missing = [g for g in space.names if g not in dict(space.sens.gains)]
    out = [*space.notes, ESTIMATE_NOTE]
    if any(g not in known for g in named):
        out.append(
            f"{sum(g not in known for g in named)} group(s) of the analysis are not "
            "groups of this model (ignored)"
        )
    if missing:
        out.append(f"{len(missing)} group(s) have no gain in the analysis and stay at start")
    if math.isnan(space.sens.base):  # every prediction is NaN: none ranks a promotion
        out.append(f"the analysis' {space.sens.metric} of uniform {space.sens.low.value} has "
                   "no value (NaN: its data holds nothing the figure counts, or that plan's "
                   "outputs went non-finite): the predictions rank nothing, a plan is chosen "
                   "by its measured figure, else the cheapest")
    return tuple(out)


def result_to_dict(r: SearchResult) -> dict[str, Any]:
    return {
        "metric": r.metric,
        "higher_is_better": r.budget.higher_is_better,
        "budget": {"min_quality": r.budget.min_quality, "max_cost": r.budget.max_cost},
        "met": r.met,
        "chosen": {
            "cost": round(r.cost, 6),
            "predicted": round(r.predicted, 6),
            "measured": None if r.measured is None else round(r.measured, 6),
        },
        "binding": r.binding,
        "blockers": [
            {"rule": b.rule, "gain": round(b.gain, 6), "groups": list(b.groups)} for b in r.blockers
        ],
        "points": [point_to_dict(p) for p in r.front],
        "trials": [point_to_dict(p) for p in r.trials],
        "skipped": [
            {
                "group": s.group,
                "precision": s.precision.value,
                "rules": list(s.rules),
                "gain": round(s.gain, 6),
                "severity": s.severity,
            }
            for s in r.skipped
        ],
        "notes": list(r.notes),
        **({"time_budget": r.time_budget.to_dict()} if r.time_budget is not None else {}),
        **({"choice": r.choice} if r.choice is not None else {}),
    }
