"""Greedy promotion over legal plans: the path from the start plan.

=============  ====================================================================
move           promote one group to a higher candidate precision with a positive
               predicted gain (with the groups reading its weight, which one
               encoding binds to its weight bits: :meth:`Space.promotion`), or
               apply one offered repair
rank           best predicted gain per unit of added cost first; ties by group order,
               then precision order (repairs rank before promotions on equal score)
screen         a promotion is screened by :meth:`Legality.screen`; one that makes
               ``check`` report an error (or a new warning, unless allowed) is
               skipped and its rule ids recorded (:class:`Skip`); one that would
               break ``max_cost`` is skipped as ``max_cost``
take           the best move, after ``check`` on the whole plan; a refused move is
               not offered again until another promotion is taken
stop           when no move is left
=============  ====================================================================

Deterministic: no step draws random numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from quantscope.plan.check import blocker_label
from quantscope.plan.pareto import FrontPoint
from quantscope.plan.predict import predict
from quantscope.plan.start import EPS, Precisions, Space
from quantscope.types import PRECISION_ORDER, Precision, Problem


@dataclass(frozen=True)
class Move:
    group: str  # group name, or "repair:<name>"
    precision: Precision | None  # None for a repair
    gain: float
    cost: float
    reason: str
    also: tuple[str, ...] = ()  # groups moved with it (they read its weight)


@dataclass(frozen=True)
class Skip:
    """A promotion (or repair) the search could not take, and why."""

    group: str
    precision: Precision
    rules: tuple[str, ...]  # rule ids, or "max_cost"
    gain: float  # predicted gain of the promotion over the start precision
    severity: str = "error"


@dataclass(frozen=True)
class Walk:
    """The greedy path: the start point, then one point per accepted move."""

    points: tuple[FrontPoint, ...]
    moves: tuple[Move, ...]
    skips: tuple[Skip, ...]  # the first refusal of each (group, precision), in order


Ranked = tuple[tuple, Move]


def _rank(p: Precision) -> int:
    return PRECISION_ORDER.index(p)


def _skip(space: Space, group: str, p: Precision, problems: Sequence[Problem] | None) -> Skip:
    """``problems`` None: skipped for ``max_cost``."""
    if problems is None:
        rules, sev = ("max_cost",), "error"
    else:
        rules = tuple(dict.fromkeys(blocker_label(x) for x in problems))
        sev = "error" if any(x.severity == "error" for x in problems) else "warning"
    return Skip(group, p, rules, space.sens.gain(group, p) or 0.0, sev)


def _promotions(
    space: Space, prec: Precisions, cost_now: float, refused: set[tuple[str, Precision]]
) -> tuple[list[Ranked], list[Skip]]:
    ranked, skips = [], []
    plan = space.plan(prec)
    for gi, g in enumerate(space.names):
        cur = prec[g]
        for p in space.candidates:
            if _rank(p) <= _rank(cur) or (g, p) in refused:
                continue
            changes = space.promotion(prec, g, p)
            dg = space.gain(prec, changes)
            if dg is None or dg <= EPS:
                continue
            bad = space.legal.screen_move(plan, changes)
            if bad:
                skips.append(_skip(space, g, p, bad))
                continue
            dc = space.cost(prec, changes)
            if not space.budget.within_cost(cost_now + dc):
                skips.append(_skip(space, g, p, None))
                continue
            score = dg / dc if dc > EPS else math.inf
            also = tuple(changes)[1:]
            ranked.append(((-score, -dg, gi, _rank(p)), Move(g, p, dg, dc, "", also)))
    return ranked, skips


def _repair_moves(space: Space, applied: Sequence[str], cost_now: float) -> list[Ranked]:
    out = []
    for i, r in enumerate(space.repairs):
        if r.name in applied or r.gain <= EPS or not space.budget.within_cost(cost_now + r.cost):
            continue
        score = r.gain / r.cost if r.cost > EPS else math.inf
        out.append(
            ((-score, -r.gain, -1, i), Move(f"repair:{r.name}", None, r.gain, r.cost, r.reason))
        )
    return out


def greedy(space: Space) -> Walk:
    """Take the best legal move until none is left (see the module table)."""
    prec: dict[str, Precision] = dict(space.start)
    applied: tuple[str, ...] = ()
    moves: list[Move] = []
    skips: dict[tuple[str, Precision], Skip] = {}
    refused: set[tuple[str, Precision]] = set()
    points = [predict(space, prec, applied, "start", 0)]
    while True:
        cost_now = points[-1].cost
        ranked, skipped = _promotions(space, prec, cost_now, refused)
        for s in skipped:
            skips.setdefault((s.group, s.precision), s)
        options = sorted(ranked + _repair_moves(space, applied, cost_now), key=lambda m: m[0])
        if not options:
            return Walk(tuple(points), tuple(moves), tuple(skips.values()))
        move = options[0][1]
        if move.precision is None:
            applied = (*applied, move.group.removeprefix("repair:"))
        else:
            key = (move.group, move.precision)
            new = {**prec, move.group: move.precision, **dict.fromkeys(move.also, move.precision)}
            bad = space.legal.blocking(space.plan(new))
            if bad:
                skips.setdefault(key, _skip(space, *key, bad))
                refused.add(key)
                continue
            prec = new
            refused.clear()
        moves.append(move)
        points.append(predict(space, prec, applied, "greedy", len(moves)))
