"""Mixed-precision search over legal plans only. Pure: no ONNX Runtime (``evaluate`` aside).

==============  ===================================================================
start           uniform ``low`` (or a given legal ``start`` plan); an error if it
                does not pass :func:`~quantscope.plan.check.check`
move            promote one group to a higher candidate precision (or apply one
                offered repair, see :class:`~quantscope.plan.greedy.RepairOption`)
gain            predicted metric gain from the :class:`Sensitivity`: the gain of a
                group at precision p minus its gain at its current precision; gains
                of different groups are ADDED -- an estimate, not a measurement
cost            plan cost delta (``plan_cost`` units, precision boundaries included)
greedy          the legal move with the best gain per unit of added cost, until no
                move helps (or every move would break ``max_cost``); a move whose
                plan gets a ``check`` error (or a new warning, unless allowed) is
                skipped and its rule ids recorded
front           every prefix of the greedy path is a point; non-dominated ones kept
pruned          for ``min_quality``: promotions dropped from the first point that
                meets Q, cheapest result first, while the prediction still meets Q
refine          with ``evaluate(plan) -> float``: measure path points near the budget
                (a search for the first point whose measurement meets Q, or the
                best-predicted points within C), then try dropping the promotions
                least justified by prediction and keep a drop when the measurement
                allows it (AIMET AMP phase 3); ``refine_steps`` evaluations in all
binding         when the budget is not met: the rules that blocked the most predicted
                gain (e.g. ``hailo.attention_16bit`` on Softmax), or the cost cap
==============  ===================================================================

Every plan in a :class:`SearchResult` (chosen, front, trials) has passed ``check`` with
no error; :func:`search` raises :class:`PlannerError` otherwise. Same inputs and seed
give the same result: ties are broken by group order, then precision order (the seed is
recorded; no step draws random numbers yet).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from quantscope.model.load import Model
from quantscope.plan.greedy import (
    EPS,
    Legality,
    Move,
    PlannerError,
    RepairOption,
    Run,
    Shapes,
    Skip,
    build_cost_table,
    greedy,
    prec_of,
)
from quantscope.plan.pareto import Budget, FrontPoint, pareto_front, point_to_dict, select
from quantscope.plan.refine import Evaluate, Meter, emit, prune, refine, repair_meta
from quantscope.plan.sensitivity import Sensitivity, load_sensitivity, sensitivity_from_dict
from quantscope.targets.profile import Target
from quantscope.types import PRECISION_ORDER, Groups, Plan, Precision, QuantscopeError

PLANNER = "quantscope.plan.search greedy+refine/1"
ESTIMATE_NOTE = "predicted quality adds per-group gains measured one group at a time: an estimate"

__all__ = [
    "Blocker",
    "PlannerError",
    "RepairOption",
    "SearchResult",
    "Sensitivity",
    "evaluator",
    "plan_from_analysis",
    "search",
    "sensitivity_from_dict",
]


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

    def to_dict(self) -> dict[str, Any]:
        """The plan JSON's ``pareto`` entry (stable key order)."""
        return result_to_dict(self)


def default_candidates(target: Target, low: Precision) -> tuple[Precision, ...]:
    """Precisions above ``low`` that the target allows on at least one op kind."""
    allowed = {p for _, ps in target.precisions for p in ps}
    rank = PRECISION_ORDER.index
    return tuple(p for p in PRECISION_ORDER if rank(p) > rank(low) and p in allowed)


def search(
    groups: Groups,
    sensitivity: Sensitivity,
    target: Target,
    model: Model,
    *,
    low: Precision | None = None,
    candidates: Sequence[Precision] | None = None,
    min_quality: float | None = None,
    max_cost: float | None = None,
    shapes: Shapes = None,
    evaluate: Evaluate | None = None,
    refine_steps: int = 12,
    seed: int = 0,
    start: Plan | None = None,
    repairs: Sequence[RepairOption] = (),
    allow_warnings: bool = False,
    drop_tolerance: float = 0.0,
) -> SearchResult:
    """Search a legal mixed-precision plan under a budget (see the module docstring)."""
    low = low or sensitivity.low
    if low != sensitivity.low:
        raise QuantscopeError(
            f"the analysis measured gains over {sensitivity.low}, "
            f"the search starts from {low}: use the same precision"
        )
    start = start or Plan(default=low, target=target.name)
    cands = tuple(candidates) if candidates is not None else default_candidates(target, low)
    budget = Budget(min_quality, max_cost, higher_is_better=sensitivity.higher_is_better)
    legal = Legality(start, groups, model, target, shapes, allow_warnings=allow_warnings)
    used = {low, *cands, *(start.precision_of(g) for g in groups.names())}
    table = build_cost_table(groups, target, model, sorted(used, key=PRECISION_ORDER.index), shapes)
    run = Run(groups, sensitivity, table, legal, cands, budget, tuple(repairs))
    path = greedy(run)
    pruned = prune(run, path) if min_quality is not None else []
    trials = []
    if evaluate is not None and refine_steps > 0:
        trials = refine(run, path, pruned, Meter(run, evaluate, refine_steps), drop_tolerance)
    return _result(run, path, pruned, trials, seed, _notes(run, groups))


# ---------------------------------------------------------------- result


def _reasons(run: Run, prec: dict[str, Precision]) -> tuple[tuple[str, str], ...]:
    out = []
    for g in run.names:
        reached = run.sens.gain(g, prec[g]) or 0.0
        blocked = [s for s in run.skips.values() if s.group == g and s.gain > reached + EPS]
        note = "; ".join(
            f"{s.precision} (+{s.gain:.3g} predicted) blocked by {', '.join(s.rules)}"
            for s in blocked
        )
        if prec[g] != run.start[g]:
            dg = run.sens.delta(g, run.start[g], prec[g]) or 0.0
            dc = -run.table.delta(prec, g, run.start[g])
            text = f"{prec[g]}: {dg:+.4g} {run.sens.metric} predicted, cost {dc:+.4g}"
        elif note:
            text = f"kept at {prec[g]}"
        else:
            continue
        out.append((g, f"{text}; {note}" if note else text))
    return tuple(out)


def _blockers(run: Run, prec: dict[str, Precision]) -> tuple[Blocker, ...]:
    per_rule: dict[str, dict[str, float]] = {}
    for s in run.skips.values():
        left = s.gain - (run.sens.gain(s.group, prec[s.group]) or 0.0)
        for rule in s.rules if left > EPS else ():
            seen = per_rule.setdefault(rule, {})
            seen[s.group] = max(seen.get(s.group, 0.0), left)
    order = {g: i for i, g in enumerate(run.names)}
    out = [
        Blocker(r, tuple(sorted(gs, key=order.__getitem__)), sum(gs.values()))
        for r, gs in per_rule.items()
    ]
    return tuple(sorted(out, key=lambda b: (-b.gain, b.rule)))


def _binding(
    run: Run, chosen: FrontPoint, blockers: tuple[Blocker, ...], *, predicted_ok: bool
) -> str:
    budget, start_cost = run.budget, run.cost(run.start, ())
    if not budget.within_cost(start_cost):
        return (
            f"max_cost {budget.max_cost:g} is below the cost of the start plan ({start_cost:.4g})"
        )
    how = "predicted" if chosen.measured is None else "measured"
    parts = [
        f"{budget.describe()} not met: the best legal plan found has {run.sens.metric} "
        f"{chosen.quality:.4g} ({how}) at cost {chosen.cost:.4g}"
    ]
    rules = [b for b in blockers if b.rule != "max_cost"]
    if rules:
        b = rules[0]
        shown = ", ".join(b.groups[:3]) + (" …" if len(b.groups) > 3 else "")
        parts.append(
            f"binding rule: {b.rule} blocks +{b.gain:.4g} predicted on "
            f"{len(b.groups)} group(s) ({shown})"
        )
        parts += [f"also {o.rule} (+{o.gain:.4g})" for o in rules[1:3]]
    cap = next((b for b in blockers if b.rule == "max_cost"), None)
    if cap:
        parts.append(f"the cost cap binds: promotions worth +{cap.gain:.4g} predicted exceed it")
    if predicted_ok and chosen.measured is not None:
        parts.append("a predicted plan meets it, the measurement does not (gains are not additive)")
    elif not rules and not cap:
        parts.append("no legal promotion with a positive predicted gain is left")
    return "; ".join(parts)


def _notes(run: Run, groups: Groups) -> tuple[str, ...]:
    known = set(groups.names())
    named = [g for g, _ in run.sens.gains]
    missing = [g for g in groups.names() if g not in dict(run.sens.gains)]
    out = [ESTIMATE_NOTE]
    if any(g not in known for g in named):
        out.append(
            f"{sum(g not in known for g in named)} group(s) of the analysis are not "
            "groups of this model (ignored)"
        )
    if missing:
        out.append(f"{len(missing)} group(s) have no gain in the analysis and stay at start")
    return tuple(out)


def _result(
    run: Run,
    path: list[FrontPoint],
    pruned: list[FrontPoint],
    trials: list[FrontPoint],
    seed: int,
    notes: tuple[str, ...],
) -> SearchResult:
    measured = {t.key(): t for t in trials}
    front = tuple(measured.get(p.key(), p) for p in pareto_front(path + pruned, run.budget))
    chosen, met = select(trials or path + pruned, run.budget)
    predicted_ok = any(run.budget.meets(p) for p in path + pruned)
    prec = prec_of(run, chosen)
    blockers = _blockers(run, prec)
    meta = (
        ("planner", PLANNER),
        ("metric", run.sens.metric),
        ("seed", str(seed)),
        ("budget", run.budget.describe()),
        ("cost", f"{chosen.cost:.6g}"),
        ("predicted", f"{chosen.predicted:.6g}"),
    )
    if chosen.measured is not None:
        meta += (("measured", f"{chosen.measured:.6g}"),)
    plan = emit(run, chosen, reasons=_reasons(run, prec), meta=meta + repair_meta(chosen))
    for p in (*front, *trials):
        emit(run, p, reasons=(), meta=())
    return SearchResult(
        plan=plan,
        cost=chosen.cost,
        predicted=chosen.predicted,
        measured=chosen.measured,
        met=met,
        budget=run.budget,
        metric=run.sens.metric,
        front=front,
        path=tuple(run.path),
        trials=tuple(trials),
        skipped=tuple(run.skips.values()),
        blockers=blockers,
        binding=None if met else _binding(run, chosen, blockers, predicted_ok=predicted_ok),
        repairs=tuple(r for r in run.repairs if r.name in chosen.repairs),
        notes=notes,
    )


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
    }


# ---------------------------------------------------------------- entry points


def plan_from_analysis(
    model: Model,
    analysis: dict[str, Any],
    target: Target | str,
    *,
    min_quality: float | None = None,
    max_cost: float | None = None,
    shapes: Shapes = None,
    evaluate: Evaluate | None = None,
    seed: int = 0,
    repairs: Sequence[RepairOption] = (),
) -> tuple[Plan, dict[str, Any]]:
    """For the CLI: the plan and the plan JSON's extra keys (``pareto``, ``repairs``)."""
    from quantscope.model.groups import find_groups
    from quantscope.targets import load_target

    tgt = load_target(target) if isinstance(target, str) else target
    sens = load_sensitivity(analysis)
    groups = find_groups(model)
    if not set(dict(sens.gains)) & set(groups.names()):
        raise QuantscopeError(
            "no group of the analysis is a group of this model: "
            "was the analysis made for another model?"
        )
    r = search(
        groups,
        sens,
        tgt,
        model,
        min_quality=min_quality,
        max_cost=max_cost,
        shapes=shapes,
        evaluate=evaluate,
        seed=seed,
        repairs=repairs,
    )
    extra: dict[str, Any] = {"pareto": r.to_dict()}
    if r.repairs:
        extra["repairs"] = [{"name": x.name, "reason": x.reason} for x in r.repairs]
    return r.plan, extra


def evaluator(
    model: Model,
    data: Any,
    stats: Any,
    metric: str,
    *,
    target: Target | None = None,
    method: str | None = None,
) -> Evaluate:
    """``evaluate(plan) -> float``: real emulation of ``plan`` scored by ``metric``.

    The FP32 reference outputs are computed once and reused for every plan measured; the
    same evaluation as :func:`quantscope.plan.joint.repair_evaluator`, without repairs.
    """
    from quantscope.plan.joint import repair_evaluator

    return repair_evaluator(model, data, stats, metric, target=target, method=method)
