"""Pareto front of plans: cost against quality, and picking one point under a budget.

=============  ================================================================
point          one plan: relative cost (uniform a8_w8 = 1.0), predicted quality
               (additive estimate from the sensitivity), measured quality (real
               emulation; ``None`` if not measured), the overrides, and where it
               came from (``greedy`` path prefix, ``pruned``, ``dropped``)
quality        the measured value where there is one, else the predicted one
dominated      another point is no more expensive and no worse, and better in one
budget         ``min_quality``: the cheapest point whose quality meets Q;
               ``max_cost``: the best quality at cost <= C; both: the cheapest
               point meeting Q within C; none: the best quality (then cheapest)
=============  ================================================================

Quality comparisons follow the metric's direction (``higher_is_better``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from quantscope.types import Precision

COST_TOL = 1e-9
QUALITY_TOL = 1e-9  # sums of gains are floats: 0.7 + 0.05 + 0.05 < 0.8


@dataclass(frozen=True)
class FrontPoint:
    cost: float
    predicted: float
    measured: float | None
    overrides: tuple[tuple[str, Precision], ...]
    origin: str = "greedy"  # "start" | "greedy" | "pruned" | "dropped" | "residual"
    step: int = 0  # greedy moves taken to reach it
    repairs: tuple[str, ...] = ()

    @property
    def quality(self) -> float:
        return self.predicted if self.measured is None else self.measured

    def key(self) -> tuple:
        return (self.overrides, self.repairs)


@dataclass(frozen=True)
class Budget:
    min_quality: float | None = None
    max_cost: float | None = None
    higher_is_better: bool = True

    def better(self, a: float, b: float) -> bool:
        """Is quality ``a`` strictly better than ``b``?"""
        return a > b if self.higher_is_better else a < b

    def meets_quality(self, quality: float) -> bool:
        if self.min_quality is None:
            return True
        q = self.min_quality
        if self.higher_is_better:
            return quality >= q - QUALITY_TOL
        return quality <= q + QUALITY_TOL

    def within_cost(self, cost: float) -> bool:
        return self.max_cost is None or cost <= self.max_cost + COST_TOL

    def meets(self, point: FrontPoint) -> bool:
        return self.within_cost(point.cost) and self.meets_quality(point.quality)

    def describe(self) -> str:
        parts = []
        if self.min_quality is not None:
            parts.append(f"min_quality {self.min_quality:g}")
        if self.max_cost is not None:
            parts.append(f"max_cost {self.max_cost:g}")
        return ", ".join(parts) or "none (best quality)"


def _sign(budget: Budget) -> float:
    return 1.0 if budget.higher_is_better else -1.0


def dominates(a: FrontPoint, b: FrontPoint, budget: Budget, *, measured: bool = False) -> bool:
    """``a`` dominates ``b`` on (cost, quality); ``measured=False`` compares predictions."""
    qa = a.quality if measured else a.predicted
    qb = b.quality if measured else b.predicted
    no_worse = a.cost <= b.cost + COST_TOL and not budget.better(qb, qa)
    strictly = a.cost < b.cost - COST_TOL or budget.better(qa, qb)
    return no_worse and strictly


def pareto_front(points: Iterable[FrontPoint], budget: Budget) -> tuple[FrontPoint, ...]:
    """Non-dominated points (by predicted quality), sorted by cost; duplicates dropped."""
    unique: dict[tuple, FrontPoint] = {}
    for p in points:
        unique.setdefault(p.key(), p)
    pts = list(unique.values())
    keep = [p for p in pts if not any(dominates(o, p, budget) for o in pts if o is not p)]
    return tuple(sorted(keep, key=lambda p: (p.cost, -_sign(budget) * p.predicted, p.step)))


def select(points: Sequence[FrontPoint], budget: Budget) -> tuple[FrontPoint, bool]:
    """The point the budget asks for, and whether it meets the budget (see module table)."""
    s = _sign(budget)
    capped = [p for p in points if budget.within_cost(p.cost)]
    if not capped:
        return min(points, key=lambda p: (p.cost, p.step)), False
    ok = [p for p in capped if budget.meets_quality(p.quality)]
    if budget.min_quality is not None and ok:
        return min(ok, key=lambda p: (p.cost, -s * p.quality, p.step)), True
    best = min(capped, key=lambda p: (-s * p.quality, p.cost, p.step))
    return best, budget.min_quality is None


def _round(x: float | None) -> float | None:
    return None if x is None else round(float(x), 6)


def point_to_dict(p: FrontPoint) -> dict[str, Any]:
    out: dict[str, Any] = {
        "cost": _round(p.cost),
        "predicted": _round(p.predicted),
        "measured": _round(p.measured),
        "origin": p.origin,
        "step": p.step,
        "groups": {g: prec.value for g, prec in p.overrides},
    }
    if p.repairs:
        out["repairs"] = list(p.repairs)
    return out
