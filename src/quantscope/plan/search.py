"""Mixed-precision search over legal plans only: one pipeline of pure stages.

::

    start_search ─► Space ─► greedy ─► Walk ─► prune ─► refine ─► result ─► SearchResult
     start.py               greedy.py         prune.py   refine.py   result.py

==============  ===================================================================
start           uniform ``low`` (or a given legal ``start`` plan), candidates, the
                cost table and the legality screen; an error if the start plan does
                not pass :func:`~quantscope.plan.check.check`
greedy          the legal move (one promotion, or one offered repair) with the best
                predicted gain per unit of added cost, until no move helps (or every
                move would break ``max_cost``); a move whose plan gets a ``check``
                error (or a new warning, unless its rule is allowed: ``--allow-warning``;
                not one whose rule may not apply: ``Problem.applies``) is skipped,
                its rule ids recorded
prune           for ``min_quality``: promotions dropped from the first point that
                meets Q, cheapest result first, while the prediction still meets Q
refine          with ``evaluate(plan) -> float``: measure path points near the budget,
                then drop the promotions (and repairs) the measurement does not
                support (AIMET AMP phase 3); ``refine_steps`` evaluations in all
                (with ``race``, the batch of points is raced on data prefixes first)
result          the front, the chosen point, reasons, blockers and the binding
                constraint when the budget is not met
==============  ===================================================================

Predictions (:mod:`.predict`) add per-group gains: an estimate, not a measurement. Every
plan in a :class:`SearchResult` (chosen, front, trials) has passed ``check`` with no
error; :func:`search` raises :class:`PlannerError` otherwise. Same inputs and seed give
the same result: ties are broken by group order, then precision order (the seed is
recorded; no step draws random numbers yet).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.model.shapes import Shapes
from quantscope.plan.greedy import greedy
from quantscope.plan.pareto import Budget
from quantscope.plan.prune import prune
from quantscope.plan.race import RacePlans
from quantscope.plan.refine import Evaluate, EvaluateMany, TimeBudget, refine_run
from quantscope.plan.result import Blocker, SearchResult, result
from quantscope.plan.start import PlannerError, RepairOption, start_search
from quantscope.targets import load_target
from quantscope.targets.profile import Target
from quantscope.types import Groups, Plan, Precision, QuantscopeError, Sensitivity

__all__ = [
    "Blocker",
    "Evaluate",
    "PlannerError",
    "RepairOption",
    "SearchResult",
    "TimeBudget",
    "plan_from_analysis",
    "search",
]


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
    shapes: Shapes | None = None,
    evaluate: Evaluate | None = None,
    evaluate_many: EvaluateMany | None = None,
    refine_steps: int = 12,
    seed: int = 0,
    start: Plan | None = None,
    repairs: Sequence[RepairOption] = (),
    allowed_warnings: frozenset[str] = frozenset(),
    drop_tolerance: float = 0.0,
    time_budget: TimeBudget | None = None,
    progress: bool = False,
    race: RacePlans | None = None,
    measured_metric: str | None = None,
    goal: float | None = None,
) -> SearchResult:
    """Search a legal mixed-precision plan under a budget (see the module docstring);
    ``time_budget`` bounds the refinement's measuring (:class:`TimeBudget`);
    ``measured_metric``: what ``evaluate`` measures, for the choice's record; ``goal``: the
    user's goal in it, which the noise rule keeps (:attr:`Budget.floor`);
    ``allowed_warnings``: the warning rule ids the user accepts (``--allow-warning``:
    :func:`quantscope.targets.accept.allowed_warnings`), which then block no move; every
    emitted plan records what they let through (:mod:`quantscope.plan.accepted`)."""
    budget = Budget(min_quality, max_cost, higher_is_better=sensitivity.higher_is_better,
                    floor=goal)
    space = start_search(groups, sensitivity, target, model, low=low, candidates=candidates,
                         budget=budget, shapes=shapes, start=start, repairs=repairs,
                         allowed=allowed_warnings)
    walk = greedy(space)
    pruned = prune(space, walk)
    refined = refine_run(space, walk, pruned, evaluate, steps=refine_steps, tol=drop_tolerance,
                         evaluate_many=evaluate_many, race=race, budget=time_budget,
                         progress=progress)
    return result(space, walk, pruned, refined.trials, seed=seed, stop=refined.stop,
                  measured_metric=measured_metric)


def plan_from_analysis(
    model: Model,
    sensitivity: Sensitivity,
    target: Target | str,
    *,
    min_quality: float | None = None,
    max_cost: float | None = None,
    shapes: Shapes | None = None,
    evaluate: Evaluate | None = None,
    evaluate_many: EvaluateMany | None = None,
    seed: int = 0,
    repairs: Sequence[RepairOption] = (),
    time_budget: TimeBudget | None = None,
    progress: bool = False,
    race: RacePlans | None = None,
    measured_metric: str | None = None,
    goal: float | None = None,
    allowed_warnings: frozenset[str] = frozenset(),
) -> tuple[Plan, dict[str, Any]]:
    """For the CLI: the plan and the plan JSON's extra keys (``pareto``, ``repairs``).

    ``sensitivity``: the analysis as :func:`quantscope.serde.read_sensitivity` reads it.
    """
    tgt = load_target(target) if isinstance(target, str) else target
    groups = find_groups(model)
    if sensitivity.gains and not set(dict(sensitivity.gains)) & set(groups.names()):
        raise QuantscopeError(
            "no group of the analysis is a group of this model: "
            "was the analysis made for another model?"
        )
    r = search(groups, sensitivity, tgt, model, min_quality=min_quality, max_cost=max_cost,
               shapes=shapes, evaluate=evaluate, evaluate_many=evaluate_many, seed=seed,
               repairs=repairs, time_budget=time_budget, progress=progress, race=race,
               measured_metric=measured_metric, goal=goal, allowed_warnings=allowed_warnings)
    extra: dict[str, Any] = {"pareto": r.to_dict()}
    if r.repairs:
        extra["repairs"] = [{"name": x.name, "reason": x.reason} for x in r.repairs]
    return r.plan, extra
