"""Start of the search: everything the later stages share, checked and built once.

==============  ===================================================================
start plan      uniform ``low`` (or a given legal ``start`` plan); where uniform
                ``low`` breaks a rule, :func:`legal_start` raises each offending
                group to its cheapest precision that passes (``float`` last) and
                the result says so; a :class:`PlannerError` if none does
candidates      precisions above ``low`` the target allows on some op kind (or given)
cost table      :func:`~quantscope.plan.cost.cost_table` for every precision in play
legality        :class:`Legality`: ``check`` on the start plan with one group
                changed, memoised for rules whose verdict depends only on that group
                (:data:`~quantscope.plan.check.LOCAL_CHECKS`); every plan a stage
                accepts is verified by ``check`` on the whole plan
==============  ===================================================================

:class:`Space` is frozen; the stages after it (greedy, prune, refine, result) are
functions of it. :func:`emit` turns a point into a :class:`~quantscope.types.Plan` and
re-runs ``check`` on it: every emitted plan passes, or the planner has a bug.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from quantscope.model.load import Model
from quantscope.model.shapes import Shapes
from quantscope.plan.accepted import accepted_record, with_accepted
from quantscope.plan.check import (
    BUILTIN_RULES,
    LOCAL_CHECKS,
    Prepared,
    blocker_label,
    check,
    prepare,
)
from quantscope.plan.cost import CostTable, cost_table
from quantscope.plan.pareto import Budget, FrontPoint
from quantscope.plan.shared_weight import RULE as SHARED_WEIGHT
from quantscope.plan.shared_weight import shared_weight_problems, sharers
from quantscope.targets.profile import Target, op_kind
from quantscope.types import (
    PRECISION_ORDER,
    Groups,
    Plan,
    Precision,
    Problem,
    QuantscopeError,
    Sensitivity,
)

EPS = 1e-12
Precisions = Mapping[str, Precision]  # group -> precision, every group of the model


class PlannerError(QuantscopeError):
    """The planner would emit a plan that fails ``check`` (a bug), or cannot start."""


@dataclass(frozen=True)
class RepairOption:
    """A repair offered to the search as one more move (see :mod:`quantscope.plan.joint`).

    Its legality and its ``gain``/``cost`` are established by whoever offers it; the
    search only ranks it with the promotions. Chosen repairs are listed in the plan's
    meta (``repairs``) so that an ``evaluate`` callable can apply them.
    """

    name: str
    gain: float
    cost: float = 0.0
    reason: str = ""


def _sig(p: Problem) -> tuple[str, str, str]:
    return (p.group, p.rule, p.severity)


def _with_precisions(plan: Plan, changes: Precisions) -> Plan:
    """``plan`` with the groups in ``changes`` set (an override only where not default)."""
    over = dict(plan.overrides)
    for g, p in changes.items():
        if p == plan.default:
            over.pop(g, None)
        else:
            over[g] = p
    return replace(plan, overrides=tuple(over.items()))


def blocks(p: Problem, allowed: frozenset[str] = frozenset()) -> bool:
    """Whether ``p`` makes a plan illegal: an error, or a warning whose rule applies here
    (``Problem.applies``) and is not in ``allowed`` (``--allow-warning``). The one rule
    of legality; :class:`Legality` adds that the start plan's own problems block nothing."""
    if p.severity == "error":
        return True
    return p.severity == "warning" and p.applies and p.rule not in allowed


def lets_through(p: Problem, allowed: frozenset[str]) -> bool:
    """Whether ``p`` is what ``--allow-warning`` lets through: a warning that applies here
    and whose rule is in ``allowed`` (it would block without it: :func:`blocks`)."""
    return p.severity == "warning" and p.applies and p.rule in allowed


@dataclass(frozen=True, eq=False)
class Legality:
    """Screens moves with ``check`` (memoised for local rules) and verifies whole plans."""

    start: Plan
    groups: Groups
    model: Model
    target: Target
    shapes: Shapes | None
    # warning rule ids the user accepts (``--allow-warning``: targets/accept.py)
    allowed: frozenset[str]
    baseline: frozenset[tuple[str, str, str]]  # problems of the start plan (allowed)
    local: frozenset[str]  # rule ids whose verdict depends only on the group
    memo: dict[tuple[str, Precision], tuple[Problem, ...]] = field(default_factory=dict)
    prepared: Prepared | None = None  # check's plan-free part (plan.check.prepare)

    def problems(self, plan: Plan) -> list[Problem]:
        return check(plan, self.groups, self.model, self.target, shapes=self.shapes,
                     prepared=self.prepared)

    def blocking(self, plan: Plan) -> tuple[Problem, ...]:
        """Errors, and warnings not in the start plan unless their rule is allowed (but
        not a warning whose rule may not apply here: ``Problem.applies``)."""
        return tuple(p for p in self.problems(plan) if self.refuses(p))

    def refuses(self, p: Problem) -> bool:
        """Whether ``p`` blocks here: :func:`blocks` with the accepted rules, and not a
        problem the start plan already has."""
        return blocks(p, self.allowed) and _sig(p) not in self.baseline

    def accepted(self, problems: Sequence[Problem]) -> dict[str, tuple[str, ...]]:
        """Allowed rule -> the groups of ``problems`` (a plan's) whose warning of that rule
        applies and the start plan does not carry: what ``--allow-warning`` lets through."""
        out: dict[str, list[str]] = {r: [] for r in sorted(self.allowed)}
        for p in problems:
            if (lets_through(p, self.allowed) and _sig(p) not in self.baseline
                    and p.group not in out[p.rule]):
                out[p.rule].append(p.group)
        return {r: tuple(gs) for r, gs in out.items()}

    def screen(self, plan: Plan, group: str, precision: Precision) -> tuple[Problem, ...]:
        """Problems blocking ``group`` at ``precision`` on top of ``plan``."""
        return self.screen_move(plan, {group: precision})

    def screen_move(self, plan: Plan, changes: Precisions) -> tuple[Problem, ...]:
        """Problems blocking the groups of ``changes``, moved together, on top of ``plan``."""
        found: list[Problem] = []
        for key in changes.items():
            if key not in self.memo:
                self.memo[key] = self.blocking(_with_precisions(self.start, dict([key])))
            found += self.memo[key]
        if not found or all(p.rule in self.local for p in found):
            return tuple(found)
        moved = _with_precisions(plan, changes)
        if all(p.rule in self.local or p.rule == SHARED_WEIGHT for p in found):
            # the shared-weight rule reads only the precisions of the groups sharing the
            # weight: judged on this plan alone, not by a whole check per move (a check of
            # a tokensplit encoder's ~1,000 groups quantizes every 16-bit weight again)
            return tuple(p for p in found if p.rule != SHARED_WEIGHT) + tuple(
                p for p in shared_weight_problems(moved, self.groups) if p.group in changes)
        return self.blocking(moved)


def legality(
    start: Plan, groups: Groups, model: Model, target: Target, shapes: Shapes | None,
    *, allowed: frozenset[str] = frozenset(),
) -> Legality:
    """The legality screen of a search from ``start``; raises if ``start`` is not legal."""
    prepared = prepare(groups, model, target, shapes)
    problems = check(start, groups, model, target, prepared=prepared)
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        listed = "; ".join(f"{p.group}: {p.rule}" for p in errors[:5])
        raise PlannerError(
            f"the start plan (default {start.default}) is not legal on {target.name}: "
            f"{listed}{' …' if len(errors) > 5 else ''}; pass a legal start plan or "
            "another --low precision"
        )
    local = {r.id for r in target.rules if r.check in LOCAL_CHECKS} | BUILTIN_RULES
    return Legality(start=start, groups=groups, model=model, target=target, shapes=shapes,
                    allowed=frozenset(allowed), baseline=frozenset(map(_sig, problems)),
                    local=frozenset(local), prepared=prepared)


@dataclass(frozen=True, eq=False)
class Space:
    """What every stage of one search reads: frozen, built by :func:`start_search`."""

    names: tuple[str, ...]  # group order: every tie is broken by it
    start: Precisions  # the start plan's precision of every group
    sens: Sensitivity
    table: CostTable
    legal: Legality
    candidates: tuple[Precision, ...]
    budget: Budget
    repairs: tuple[RepairOption, ...]
    notes: tuple[str, ...] = ()  # what the start had to do (e.g. a raised legal start)
    # group -> the other groups reading its weight (plan.shared_weight: moved together)
    sharers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def plan(self, prec: Precisions) -> Plan:
        """The plan with these precisions (overrides in group order, no reasons or meta)."""
        base = self.legal.start
        over = tuple((g, prec[g]) for g in self.names if prec[g] != base.default)
        return replace(base, overrides=over, reasons=(), meta=())

    def precisions(self, point: FrontPoint) -> dict[str, Precision]:
        over = dict(point.overrides)
        return {g: over.get(g, self.legal.start.default) for g in self.names}

    def promotion(self, prec: Precisions, group: str, precision: Precision) -> dict[str, Precision]:
        """``group`` at ``precision`` with each group reading its weight at other weight
        bits promoted with it (one tensor has one encoding: ``plan.shared_weight``); alone
        where ``precision`` is no promotion for one of them (the screen then refuses it)."""
        rank = PRECISION_ORDER.index
        others = [s for s in self.sharers.get(group, ())
                  if prec[s].weight_bits != precision.weight_bits]
        if any(rank(precision) <= rank(prec[s]) for s in others):
            return {group: precision}
        return {group: precision, **dict.fromkeys(others, precision)}

    def revert(self, prec: Precisions, group: str) -> dict[str, Precision]:
        """``group`` back at its start precision, with each group reading its weight at
        other weight bits back at its start too (the start plan is legal)."""
        bits = self.start[group].weight_bits
        return {group: self.start[group], **{
            s: self.start[s] for s in self.sharers.get(group, ()) if prec[s].weight_bits != bits}}

    def gain(self, prec: Precisions, changes: Precisions) -> float | None:
        """Predicted gain of ``changes`` over ``prec``: None where the first group's is
        unknown; another group's unknown gain counts 0 (it moves only to stay legal)."""
        out = 0.0
        for i, (g, p) in enumerate(changes.items()):
            d = self.sens.delta(g, prec[g], p)
            if d is None and i == 0:
                return None
            out += d or 0.0
        return out

    def cost(self, prec: Precisions, changes: Precisions) -> float:
        """Cost delta of ``changes`` over ``prec`` (applied in order: edges see each)."""
        now, out = dict(prec), 0.0
        for g, p in changes.items():
            out += self.table.delta(now, g, p)
            now[g] = p
        return out


def legal_start(
    groups: Groups, model: Model, target: Target, shapes: Shapes | None, low: Precision
) -> tuple[Plan, tuple[str, ...]]:
    """Uniform ``low``, with every group that breaks a rule raised to its cheapest
    precision (in ``PRECISION_ORDER``, ``float`` last) that clears its errors."""
    plan = Plan(default=low, target=target.name)
    raised: dict[str, tuple[Precision, str]] = {}
    prepared = prepare(groups, model, target, shapes)
    for _ in range(len(groups.groups) + 1):
        errors = [p for p in check(plan, groups, model, target, prepared=prepared)
                  if p.severity == "error"]
        if not errors:
            break
        unknown = [p for p in errors if blocker_label(p) != p.rule]
        if unknown:  # raising a group would not settle an unknown size: say what to give
            p = unknown[0]
            raise PlannerError(f"uniform {low} on {target.name}: rule {p.rule} cannot be "
                               f"evaluated on {p.group}: {p.reason.split(' (')[0]}; {p.fix}")
        plan = _raise_groups(plan, errors, groups, model, target, prepared, raised)
    else:
        raise PlannerError(f"no legal start plan on {target.name} was found")
    if not raised:
        return plan, ()
    rules = sorted({r for _, r in raised.values()})
    kept = sorted({p.value for p, _ in raised.values()})
    note = (f"uniform {low} is not legal on {target.name} ({', '.join(rules)}): the start "
            f"plan raises {len(raised)} group(s) to their cheapest legal precision "
            f"({', '.join(kept)}); the predicted gains of those groups are not in the estimate")
    return plan, (note,)


def _raise_groups(plan: Plan, errors: list[Problem], groups: Groups, model: Model,
                  target: Target, prepared: Prepared,
                  raised: dict[str, tuple[Precision, str]]) -> Plan:
    names = set(groups.names())
    todo = list(dict.fromkeys(p.group for p in errors if p.group in names))
    if not todo:
        raise PlannerError(f"the start plan breaks {errors[0].rule} on {target.name}, which "
                           "no precision of one group can clear")
    rank = PRECISION_ORDER.index
    for g in todo:
        rule = next(p.rule for p in errors if p.group == g)
        for prec in [p for p in PRECISION_ORDER if rank(p) > rank(plan.precision_of(g))]:
            trial = _with_precisions(plan, {g: prec})
            if not any(p.group == g and p.severity == "error"
                       for p in check(trial, groups, model, target, prepared=prepared)):
                plan, raised[g] = trial, (prec, rule)
                break
        else:
            raise PlannerError(_no_precision(g, rule, plan.precision_of(g), groups, target))
    return plan


def _no_precision(g: str, rule: str, start: Precision, groups: Groups, target: Target) -> str:
    """Why no precision from ``start`` up clears ``rule`` on ``g``; where the target allows
    one below the start (a8_w4 alone on weighted groups), say so and how to start there."""
    kind = op_kind(groups.by_name()[g])
    rank = PRECISION_ORDER.index
    below = [p.value for p in target.allowed(kind) if rank(p) < rank(start)]
    if not below:
        return f"group {g} breaks {rule} on {target.name} at every precision"
    return (f"group {g} breaks {rule} on {target.name} at {start} and every precision above "
            f"it; {target.name} allows only {', '.join(below)} below it on {kind} groups: "
            f"start there ('quantscope analyze --low {below[0]}', then plan from that "
            "analysis)")


def default_candidates(target: Target, low: Precision) -> tuple[Precision, ...]:
    """Precisions above ``low`` that the target allows on at least one op kind."""
    allowed = {p for _, ps in target.precisions for p in ps}
    rank = PRECISION_ORDER.index
    return tuple(p for p in PRECISION_ORDER if rank(p) > rank(low) and p in allowed)


def start_search(
    groups: Groups,
    sens: Sensitivity,
    target: Target,
    model: Model,
    *,
    low: Precision | None,
    candidates: Sequence[Precision] | None,
    budget: Budget,
    shapes: Shapes | None,
    start: Plan | None,
    repairs: Sequence[RepairOption],
    allowed: frozenset[str] = frozenset(),
) -> Space:
    """The :class:`Space` of a search (see the module table)."""
    low = low or sens.low
    if low != sens.low:
        raise QuantscopeError(
            f"the analysis measured gains over {sens.low}, "
            f"the search starts from {low}: use the same precision"
        )
    notes: tuple[str, ...] = ()
    if start is None:
        start, notes = legal_start(groups, model, target, shapes, low)
    cands = tuple(candidates) if candidates is not None else default_candidates(target, low)
    legal = legality(start, groups, model, target, shapes, allowed=allowed)
    names = groups.names()
    used = {low, *cands, *(start.precision_of(g) for g in names)}
    table = cost_table(groups, target, model, sorted(used, key=PRECISION_ORDER.index), shapes)
    first = MappingProxyType({g: start.precision_of(g) for g in names})
    return Space(names=names, start=first, sens=sens, table=table, legal=legal,
                 candidates=cands, budget=budget, repairs=tuple(repairs), notes=notes,
                 sharers=MappingProxyType(sharers(groups)))


def repair_meta(point: FrontPoint) -> tuple[tuple[str, str], ...]:
    return (("repairs", ",".join(point.repairs)),) if point.repairs else ()


def emit(space: Space, point: FrontPoint, *, reasons: tuple, meta: tuple) -> Plan:
    """The plan of ``point``; raises :class:`PlannerError` if ``check`` reports an error."""
    plan = space.plan(space.precisions(point))
    plan = Plan(default=plan.default, overrides=plan.overrides, target=space.legal.target.name,
                reasons=reasons, meta=meta)
    problems = space.legal.problems(plan)
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        raise PlannerError(
            f"internal error: the planner built a plan that fails check "
            f"({errors[0].group}: {errors[0].rule}); please report it"
        )
    legal = space.legal
    return with_accepted(plan, accepted_record(legal.target, legal.accepted(problems)))
