"""Greedy promotion over legal plans: cost table, legality screen, the greedy path.

Used by :func:`quantscope.plan.search.search` (see its module docstring for the whole
algorithm). Everything here is deterministic: ties are broken by group order, then
precision order.

=============  ====================================================================
CostTable      per-group cost at each precision and per-edge boundary cost, built
               from ``cost_breakdown``; ``total`` equals ``plan_cost`` (tested)
Legality       ``check`` on the start plan with one group changed, cached for rules
               whose verdict depends only on that group; every accepted move is
               verified by ``check`` on the whole plan
greedy         best predicted gain per unit of added cost first; a move that makes
               ``check`` report an error (or a new warning, unless allowed) is
               skipped and its rule ids recorded (:class:`Skip`)
=============  ====================================================================
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from quantscope.model.load import Model
from quantscope.plan.check import check, group_edges, resolve_shapes
from quantscope.plan.cost import cost_breakdown
from quantscope.plan.pareto import Budget, FrontPoint
from quantscope.plan.sensitivity import Sensitivity
from quantscope.targets.profile import Target
from quantscope.types import PRECISION_ORDER, Groups, Plan, Precision, Problem, QuantscopeError

EPS = 1e-12
Shapes = dict[str, tuple[int, ...]] | None

# checks whose verdict on a group depends only on that group and its precision
LOCAL_CHECKS = frozenset(
    {"act16_on_kinds", "a16_low_sublayer", "act16_wide_non_conv", "quant_bias_add_rank"}
)
BUILTIN_RULES = frozenset({"precision.not_allowed", "plan.unknown_group"})


class PlannerError(QuantscopeError):
    """The planner would emit a plan that fails ``check`` (a bug), or cannot start."""


@dataclass(frozen=True)
class RepairOption:
    """Hook for issue 6: a repair offered to the search as one more move.

    Its legality and its ``gain``/``cost`` are established by whoever offers it; the
    search only ranks it with the promotions. Chosen repairs are listed in the plan's
    meta (``repairs``) so that an ``evaluate`` callable can apply them.
    """

    name: str
    gain: float
    cost: float = 0.0
    reason: str = ""


@dataclass(frozen=True)
class Move:
    group: str  # group name, or "repair:<name>"
    precision: Precision | None  # None for a repair
    gain: float
    cost: float
    reason: str


@dataclass(frozen=True)
class Skip:
    """A promotion (or repair) the search could not take, and why."""

    group: str
    precision: Precision
    rules: tuple[str, ...]  # rule ids, or "max_cost"
    gain: float  # predicted gain of the promotion over the start precision
    severity: str = "error"


# ---------------------------------------------------------------- cost table


@dataclass(frozen=True, eq=False)
class CostTable:
    """Per-group cost at each precision and per-edge boundary cost, as ``plan_cost`` does.

    ``total(prec)`` equals ``plan_cost`` of the plan (tested); ``delta`` is the change
    of one group's precision, its boundaries included.
    """

    group: dict[str, dict[Precision, float]]
    edges: dict[str, tuple[tuple[str, float], ...]]  # group -> (neighbour, boundary cost)
    all_edges: tuple[tuple[str, str, float], ...]
    base: float

    def total(self, prec: dict[str, Precision]) -> float:
        work = sum(self.group[g][p] for g, p in prec.items())
        bnd = sum(c for a, b, c in self.all_edges if prec[a].act_bits != prec[b].act_bits)
        return (work + bnd) / self.base

    def delta(self, prec: dict[str, Precision], group: str, new: Precision) -> float:
        old = prec[group]
        d = self.group[group][new] - self.group[group][old]
        for other, c in self.edges[group]:
            was = old.act_bits != prec[other].act_bits
            now = new.act_bits != prec[other].act_bits
            d += c * (int(now) - int(was))
        return d / self.base


def _frame_values(shape: tuple | None) -> float:
    if not shape:
        return 1.0
    dims = shape[1:] if len(shape) >= 2 else shape
    return float(math.prod(d if isinstance(d, int) and d > 0 else 1 for d in dims))


def build_cost_table(
    groups: Groups, target: Target, model: Model, precisions: Sequence[Precision], shapes: Shapes
) -> CostTable:
    table: dict[str, dict[Precision, float]] = {g: {} for g in groups.names()}
    for p in dict.fromkeys([Precision.A8_W8, *precisions]):
        bd = cost_breakdown(Plan.uniform(p), groups, target, shapes, model=model)
        for g in table:
            table[g][p] = bd[g]
    base = sum(
        cost_breakdown(Plan.uniform(Precision.A8_W8), groups, target, shapes, model=model).values()
    )
    tensor_shapes = resolve_shapes(model, shapes)
    all_edges = tuple(
        (a, b, _frame_values(tensor_shapes.get(t)) * target.cost.boundary_macs)
        for a, b, t in group_edges(groups)
    )
    edges: dict[str, list[tuple[str, float]]] = {g: [] for g in table}
    for a, b, c in all_edges:
        edges[a].append((b, c))
        edges[b].append((a, c))
    return CostTable(table, {g: tuple(v) for g, v in edges.items()}, all_edges, base or math.inf)


# ---------------------------------------------------------------- legality


def _sig(p: Problem) -> tuple[str, str, str]:
    return (p.group, p.rule, p.severity)


class Legality:
    """Screens moves with ``check`` (cached for local rules) and verifies whole plans."""

    def __init__(
        self,
        start: Plan,
        groups: Groups,
        model: Model,
        target: Target,
        shapes: Shapes,
        *,
        allow_warnings: bool,
    ) -> None:
        self.groups, self.model, self.target, self.shapes = groups, model, target, shapes
        self.allow_warnings = allow_warnings
        self.start = start
        self.baseline = {_sig(p) for p in self.problems(start)}
        errors = [p for p in self.problems(start) if p.severity == "error"]
        if errors:
            listed = "; ".join(f"{p.group}: {p.rule}" for p in errors[:5])
            raise PlannerError(
                f"the start plan (default {start.default}) is not legal on {target.name}: "
                f"{listed}{' …' if len(errors) > 5 else ''}; pass a legal start plan or "
                "another --low precision"
            )
        local = {r.id for r in target.rules if r.check in LOCAL_CHECKS} | BUILTIN_RULES
        self.local = frozenset(local)
        self.cache: dict[tuple[str, Precision], tuple[Problem, ...]] = {}

    def problems(self, plan: Plan) -> list[Problem]:
        return check(plan, self.groups, self.model, self.target, shapes=self.shapes)

    def blocking(self, plan: Plan) -> tuple[Problem, ...]:
        """Errors, and warnings not in the start plan unless warnings are allowed."""
        out = []
        for p in self.problems(plan):
            if p.severity == "error" or (
                p.severity == "warning" and not self.allow_warnings and _sig(p) not in self.baseline
            ):
                out.append(p)
        return tuple(out)

    def screen(self, plan: Plan, group: str, precision: Precision) -> tuple[Problem, ...]:
        """Problems blocking ``group`` at ``precision`` on top of ``plan``."""
        key = (group, precision)
        if key not in self.cache:
            isolated = _with(self.start, {group: precision})
            self.cache[key] = self.blocking(isolated)
        found = self.cache[key]
        if found and all(p.rule in self.local for p in found):
            return found
        return self.blocking(_with(plan, {group: precision})) if found else ()


def _with(plan: Plan, changes: dict[str, Precision]) -> Plan:
    over = dict(plan.overrides)
    for g, p in changes.items():
        if p == plan.default:
            over.pop(g, None)
        else:
            over[g] = p
    return replace(plan, overrides=tuple(over.items()))


# ---------------------------------------------------------------- greedy


def _rank(p: Precision) -> int:
    return PRECISION_ORDER.index(p)


class Run:
    """Mutable state of one search (internal; results are frozen values)."""

    def __init__(
        self,
        groups: Groups,
        sens: Sensitivity,
        table: CostTable,
        legal: Legality,
        candidates: tuple[Precision, ...],
        budget: Budget,
        repairs: tuple[RepairOption, ...],
    ) -> None:
        self.names = groups.names()
        self.sens, self.table, self.legal, self.budget = sens, table, legal, budget
        self.candidates, self.repairs = candidates, repairs
        self.start = {g: legal.start.precision_of(g) for g in self.names}
        self.prec = dict(self.start)
        self.applied: list[str] = []
        self.path: list[Move] = []
        self.skips: dict[tuple[str, str], Skip] = {}
        self.refused: set[tuple[str, Precision]] = set()

    def plan(self, prec: dict[str, Precision]) -> Plan:
        return plan_from(self.legal.start, prec, self.names)

    def gain(self, prec: dict[str, Precision], applied: Sequence[str]) -> float:
        total = sum(self.sens.delta(g, self.start[g], prec[g]) or 0.0 for g in self.names)
        return total + sum(r.gain for r in self.repairs if r.name in applied)

    def cost(self, prec: dict[str, Precision], applied: Sequence[str]) -> float:
        return self.table.total(prec) + sum(r.cost for r in self.repairs if r.name in applied)

    def point(self, prec: dict[str, Precision], applied: Sequence[str], origin: str) -> FrontPoint:
        return FrontPoint(
            cost=self.cost(prec, applied),
            predicted=self.sens.quality(self.gain(prec, applied)),
            measured=None,
            overrides=self.plan(prec).overrides,
            origin=origin,
            step=len(self.path),
            repairs=tuple(applied),
        )

    def skip(self, group: str, p: Precision, problems: Sequence[Problem] | None) -> None:
        rules = (
            ("max_cost",) if problems is None else tuple(dict.fromkeys(x.rule for x in problems))
        )
        sev = (
            "error"
            if problems is None or any(x.severity == "error" for x in problems)
            else ("warning")
        )
        gain = self.sens.gain(group, p) or 0.0
        self.skips.setdefault((group, p.value), Skip(group, p, rules, gain, sev))


def plan_from(start: Plan, prec: dict[str, Precision], names: Sequence[str]) -> Plan:
    over = tuple((g, prec[g]) for g in names if prec[g] != start.default)
    return replace(start, overrides=over, reasons=(), meta=())


def _promotions(run: Run, cost_now: float) -> list[tuple[tuple, Move]]:
    out = []
    for gi, g in enumerate(run.names):
        cur = run.prec[g]
        for p in run.candidates:
            dg = run.sens.delta(g, cur, p) if _rank(p) > _rank(cur) else None
            if dg is None or dg <= EPS or (g, p) in run.refused:
                continue
            bad = run.legal.screen(run.plan(run.prec), g, p)
            if bad:
                run.skip(g, p, bad)
                continue
            dc = run.table.delta(run.prec, g, p)
            if not run.budget.within_cost(cost_now + dc):
                run.skip(g, p, None)
                continue
            score = dg / dc if dc > EPS else math.inf
            out.append(((-score, -dg, gi, _rank(p)), Move(g, p, dg, dc, "")))
    return out


def _repair_moves(run: Run, cost_now: float) -> list[tuple[tuple, Move]]:
    out = []
    for i, r in enumerate(run.repairs):
        if r.name in run.applied or r.gain <= EPS or not run.budget.within_cost(cost_now + r.cost):
            continue
        score = r.gain / r.cost if r.cost > EPS else math.inf
        out.append(
            ((-score, -r.gain, -1, i), Move(f"repair:{r.name}", None, r.gain, r.cost, r.reason))
        )
    return out


def _take(run: Run, move: Move) -> bool:
    """Apply ``move`` if the whole plan stays legal; record the refusal otherwise."""
    if move.precision is None:
        run.applied.append(move.group.removeprefix("repair:"))
    else:
        new = {**run.prec, move.group: move.precision}
        bad = run.legal.blocking(run.plan(new))
        if bad:
            run.skip(move.group, move.precision, bad)
            run.refused.add((move.group, move.precision))
            return False
        run.prec = new
        run.refused.clear()
    run.path.append(move)
    return True


def greedy(run: Run) -> list[FrontPoint]:
    """The greedy path: the start point, then one point per accepted move."""
    points = [run.point(run.prec, run.applied, "start")]
    while True:
        cost_now = points[-1].cost
        moves = sorted(
            _promotions(run, cost_now) + _repair_moves(run, cost_now), key=lambda m: m[0]
        )
        if not moves:
            return points
        if _take(run, moves[0][1]):
            points.append(run.point(run.prec, run.applied, "greedy"))


def prec_of(run: Run, point: FrontPoint) -> dict[str, Precision]:
    over = dict(point.overrides)
    return {g: over.get(g, run.legal.start.default) for g in run.names}
