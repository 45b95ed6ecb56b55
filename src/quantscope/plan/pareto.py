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
noise          without ``min_quality``, where the measured figure has a noise (a share
               over counted items, ``items``: detection F1 over the detections, a class
               output's top-1 picks, text retrieval's queries; a dB figure with its
               per-sample powers, ``parts``: an output SQNR, a worst channel's, a text
               retrieval's embedding SQNR per pair, a picture's PSNR and an image
               output's ``psnr_db:OUTPUT`` per sample, a face verification's and image
               views' embedding SQNR per person and per photo, an embedding's per sample:
               the task's ``sample_parts``, the powers ``run``'s held-out check reads,
               :func:`quantscope.analyze.measure.figure_parts`, one place since h58):
               the cheapest measured point not worse than the
               best measured one beyond the one-sided 95 % noise of their difference
               (:func:`noise`: a share's binomial noise,
               :func:`quantscope.tasks.shares.share_noise`, on face data the jackknife
               of the paired difference over people, each left out in turn
               (:func:`quantscope.tasks.db_noise.left_out_noise`: a person's pairs err
               together), the binomial only where those values are not at hand (said;
               an evaluation cache entry stored without them is not read: its key
               names the units); a dB figure's jackknife bound
               of the paired difference, :func:`quantscope.tasks.db_noise.db_noise`; the
               rules ``run --rewrites auto`` decides by too): cost is not bought on a
               difference the data cannot tell from sampling noise; never a plan below
               the user's goal (``floor``) for one that meets it. Without either (a
               worst sample's ``psnr_min_db``: no pooled ratio of per-sample powers,
               and a minimum's jackknife is no estimate of its noise; a figure read from an evaluation cache entry that lost its
               powers): the best quality, then the cheapest, and :func:`choice_record`
               says there was no noise estimate
=============  ================================================================

Quality comparisons follow the metric's direction (``higher_is_better``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from quantscope.tasks.db_noise import LeftOut, Parts, db_noise, left_out_noise
from quantscope.tasks.shares import share_noise
from quantscope.types import Precision
from quantscope.units import gain, is_db, is_share, value

COST_TOL = 1e-9
QUALITY_TOL = 1e-9  # sums of gains are floats: 0.7 + 0.05 + 0.05 < 0.8
# a no-goal choice that gives up this much measured quality to the noise is said as a
# warning (h71: 1.6 pts given up within ±3.0 over 12 people; 4.4 pts lower held out)
GIVEN_UP = {"share": 0.01, "dB": 0.5}  # 1 point of a share; 0.5 dB


@dataclass(frozen=True)
class FrontPoint:
    cost: float
    predicted: float
    measured: float | None
    overrides: tuple[tuple[str, Precision], ...]
    origin: str = "greedy"  # "start" | "greedy" | "pruned" | "dropped" | "residual"
    step: int = 0  # greedy moves taken to reach it
    repairs: tuple[str, ...] = ()
    # the measured figure is a share over this many items (its task counts them:
    # ``KEY_items``); None: not a counted share, or not measured
    items: float | None = None
    # a dB figure's per-sample signal and noise powers (its evaluator keeps them: the
    # jackknife noise of a difference, :func:`noise`); None: not kept, or not measured
    parts: Parts | None = field(default=None, compare=False, repr=False)
    # a share's value with each unit of its data left out, where they are not its items
    # (face data: a person's pairs err together; the jackknife noise of a difference,
    # :func:`noise`); None: not computed (other data), or not measured
    left: LeftOut | None = field(default=None, compare=False, repr=False)

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
    # the user's goal in the measured metric (``run --goal`` where the search still asks
    # for the best quality): the noise rule never trades a measured plan that meets it for
    # one that does not
    floor: float | None = None

    def keeps_floor(self, point: FrontPoint, reference: FrontPoint) -> bool:
        """``point`` meets :attr:`floor` wherever ``reference`` does (measured figures)."""
        if self.floor is None:
            return True
        def meets(q: float) -> bool:
            return q >= self.floor - QUALITY_TOL if self.higher_is_better \
                else q <= self.floor + QUALITY_TOL  # type: ignore[operator]
        return meets(point.quality) or not meets(reference.quality)

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


def _rank(p: FrontPoint, budget: Budget) -> float:
    """``p``'s quality as the choice ranks it, higher better: a figure with no value (NaN:
    the data held nothing it counts, or the plan's outputs went non-finite) as the worst,
    so it never wins over one with a value nor buys cost (a NaN compares as neither
    better nor worse: ``min`` kept whichever came first)."""
    q = p.quality
    return -math.inf if math.isnan(q) else _sign(budget) * q


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


def noise(reference: FrontPoint, other: FrontPoint) -> tuple[float, str] | None:
    """The one-sided 95 % noise of the difference of two measured figures, and its words
    (:func:`noise_from` says which)."""
    got = noise_from(reference, other)
    return None if got is None else (got[0], got[1])


def noise_from(reference: FrontPoint, other: FrontPoint) -> tuple[float, str, str] | None:
    """The one-sided 95 % noise of the difference of two measured figures, its words and
    where it comes from: two shares with their values per unit left out (face data's
    people: :attr:`FrontPoint.left`), the jackknife of the paired difference
    (``jackknife``, :func:`quantscope.tasks.db_noise.left_out_noise`); else two shares
    each over its own counted items, the binomial noise (``binomial``,
    :func:`quantscope.tasks.shares.share_noise`; on face data only where a figure's
    values per person are not at hand, which the words say); two dB figures with
    per-sample powers on the same units, the jackknife bound of the paired difference
    (``jackknife``, :func:`quantscope.tasks.db_noise.db_noise`, the rule ``run
    --rewrites auto``'s tiebreak reads). None when none applies (no estimate)."""
    if reference.measured is None or other.measured is None:
        return None
    if reference.left is not None and other.left is not None:
        got = left_out_noise(reference.left, other.left)
        if got is not None:
            return (*got, "jackknife")
    if reference.items and other.items:
        got = share_noise(reference.measured, other.measured, int(reference.items), "items",
                          n_after=int(other.items))
        if got is None:
            return None
        return got[0], got[1] + _binomial_why(reference, other), "binomial"
    if reference.parts is not None and other.parts is not None:
        got = db_noise(reference.parts, other.parts)
        return None if got is None else (*got, "jackknife")
    return None


def _binomial_why(reference: FrontPoint, other: FrontPoint) -> str:
    """Why a share on data with units other than its items has the binomial noise, in
    words ("" where no figure has its values per unit: other data)."""
    lefts = [p.left for p in (reference, other)]
    if all(lo is None for lo in lefts):
        return ""
    unit = next(lo.unit for lo in lefts if lo is not None)
    if any(lo is None for lo in lefts):
        return (f" (not over {unit}: one figure's values with each of its {unit} left "
                "out are not at hand)")
    return (f" (not over {unit}: under 3 {unit}, {unit} that differ, or a figure not "
            "finite with one left out)")


def not_worse(point: FrontPoint, reference: FrontPoint, budget: Budget) -> bool:
    """``point`` is not worse than ``reference`` beyond the noise of their difference
    (:func:`noise`); without a noise estimate, at least as good."""
    half = noise(reference, point)
    margin = 0.0 if half is None else half[0]
    return _sign(budget) * (point.quality - reference.quality) >= -margin - QUALITY_TOL \
        and budget.keeps_floor(point, reference)


def lowest_kept(reference: FrontPoint, like: FrontPoint, budget: Budget) -> float | None:
    """The worst figure a point like ``like`` (its ``items``; only ``measured`` varies)
    may measure and still be :func:`not_worse` than ``reference``: the noise rule's own
    allowance, found by bisection on that rule. None where the rule has no noise estimate
    for the two (then only a figure as good as ``reference`` is kept). A race must not
    stop a candidate that could still land above it (``plan/refine.py``)."""
    if reference.measured is None or noise(reference, replace(like, measured=reference.quality)
                                           ) is None:
        return None
    s = _sign(budget)

    def kept(q: float) -> bool:
        return not_worse(replace(like, measured=q), reference, budget)

    good, span = reference.quality, 1.0
    bad = good - s * span
    while kept(bad):  # widen until the rule refuses (a share's noise is below 1)
        if span > 1e6:
            return bad
        span *= 2.0
        bad = good - s * span
    for _ in range(60):  # to well below the figures' printed precision
        mid = (good + bad) / 2
        good, bad = (mid, bad) if kept(mid) else (good, mid)
    return good


def best_measured(points: Sequence[FrontPoint], budget: Budget) -> FrontPoint | None:
    """The measured point of the best quality within the cost cap (then the cheapest)."""
    done = [p for p in points if p.measured is not None and budget.within_cost(p.cost)]
    return min(done, key=lambda p: (-_rank(p, budget), p.cost, p.step)) if done else None


def select(points: Sequence[FrontPoint], budget: Budget) -> tuple[FrontPoint, bool]:
    """The point the budget asks for, and whether it meets the budget (see module table)."""
    s = _sign(budget)
    capped = [p for p in points if budget.within_cost(p.cost)]
    if not capped:
        return min(points, key=lambda p: (p.cost, p.step)), False
    ok = [p for p in capped if budget.meets_quality(p.quality)]
    if budget.min_quality is not None and ok:
        return min(ok, key=lambda p: (p.cost, -s * p.quality, p.step)), True
    best = min(capped, key=lambda p: (-_rank(p, budget), p.cost, p.step))
    if budget.min_quality is None and best.measured is not None:
        ties = [p for p in capped if p.measured is not None and noise(best, p) is not None
                and not_worse(p, best, budget)]
        best = min([best, *ties], key=lambda p: (p.cost, -s * p.quality, p.step))
    return best, budget.min_quality is None


def choice_record(points: Sequence[FrontPoint], chosen: FrontPoint, budget: Budget,
                  metric: str) -> dict[str, Any] | None:
    """How the best-quality rule (no ``min_quality``) chose among the measured points, for
    the plan file: the best measured point, the chosen one and the interval that made
    them a tie (``noise``: half width and words), or that there was no noise estimate;
    ``line`` says it in words. None: a quality goal decided, or nothing was measured."""
    best = best_measured(points, budget)
    if budget.min_quality is not None or best is None or chosen.measured is None:
        return None
    rule = ("the cheapest measured plan not worse than the best measured one beyond the "
            "one-sided 95 % noise of their difference (a share: binomial, each figure over "
            "its own counted items, or on face data the jackknife of the paired difference "
            "over people, each left out in turn; a dB figure: the jackknife over its "
            "per-unit powers, paired; a difference within it buys no cost)")
    half = noise_from(best, chosen)
    doc: dict[str, Any] = {"rule": rule, "best": _brief(best), "chosen": _brief(chosen)}
    if math.isnan(best.quality):  # no measured plan has a value: none could be ranked
        doc["noise"] = None
        doc["line"] = (f"no measured plan has a value of {metric} (NaN: the data holds "
                       "nothing it counts, or every plan's outputs went non-finite), so none "
                       f"could be ranked: the cheapest measured plan, {chosen.cost:.3f}x, no "
                       "cost bought for a figure")
        return doc
    if half is None:
        doc["noise"] = None
        doc["line"] = (f"the best measured plan ({metric} {value(metric, best.quality)} at "
                       f"{best.cost:.3f}x): {_no_estimate(best, chosen)}, so no noise "
                       "estimate; the best quality, then the cheapest")
        return doc
    runner = _closest_cheaper(points, best, budget) if chosen.key() == best.key() else None
    half = half if runner is None else noise_from(best, runner) or half
    doc["noise"] = {"half_width": round(half[0], 6), "words": half[1], "from": half[2]}
    if chosen.key() == best.key():
        doc["line"] = (f"the best measured plan ({metric} {value(metric, best.quality)} at "
                       f"{best.cost:.3f}x); no cheaper measured plan within its noise")
        if runner is not None:
            doc["closest"] = _brief(runner)
            doc["line"] += (f": the closest, {value(metric, runner.quality)} at "
                            f"{runner.cost:.3f}x, is "
                            f"{_signed_gain(metric, best.quality - runner.quality, budget)[1:]} "
                            f"below it (noise ±{gain(metric, half[0])[1:]})")
    else:
        would = _signed_gain(metric, best.quality - chosen.quality, budget)
        fine = value(metric, chosen.quality) == value(metric, best.quality)  # 9.51 vs 9.54 dB
        doc["line"] = (f"{value(metric, chosen.quality, fine=fine)} at {chosen.cost:.3f}x, "
                       f"within noise of the best measured "
                       f"{value(metric, best.quality, fine=fine)} at {best.cost:.3f}x: "
                       f"the cheaper plan; {best.cost:.2f}x would gain {would}, within its "
                       f"noise (±{gain(metric, half[0])[1:]}: {half[1]})")
        wide = given_up(metric, _sign(budget) * (best.quality - chosen.quality), half[0])
        if wide:
            doc["warning"] = wide
            doc["line"] += f". WARNING: {wide}"
    return doc


def given_up(metric: str, forgone: float, half_width: float) -> str | None:
    """Words when a no-goal choice took a cheaper plan measured at least
    :data:`GIVEN_UP` below the best (``forgone``, in the metric's better direction)
    because its noise (``half_width``) is wider still: the data's units are too few to
    tell them apart (on face data, its people), so the noise decided, not the quality.
    None for a smaller difference, or a metric that is neither a share nor in dB."""
    unit = "share" if is_share(metric) else "dB" if is_db(metric) else None
    if unit is None or forgone < GIVEN_UP[unit]:
        return None
    return (f"the choice gave up a measured {gain(metric, forgone)} to a noise of "
            f"±{gain(metric, half_width)[1:]}: this data cannot tell the two plans apart, "
            "so the noise decided, not the quality; give --goal to choose by quality, or "
            "more data (more units: on face data, more people) to narrow the noise")


def _closest_cheaper(points: Sequence[FrontPoint], best: FrontPoint, budget: Budget
                     ) -> FrontPoint | None:
    """The best measured point cheaper than ``best`` whose difference to it has a noise
    estimate: the one the choice passed over by the least (None: none)."""
    s = _sign(budget)
    cheaper = [p for p in points if p.measured is not None and p.cost < best.cost - COST_TOL
               and noise(best, p) is not None]
    return min(cheaper, key=lambda p: (-s * p.quality, p.cost, p.step)) if cheaper else None


def _signed_gain(metric: str, difference: float, budget: Budget) -> str:
    """A difference of the metric as a gain in its direction (``+0.1 dB``)."""
    return gain(metric, _sign(budget) * difference)


def _no_estimate(best: FrontPoint, chosen: FrontPoint) -> str:
    """Why two measured figures have no noise estimate, in words."""
    if not (best.items or best.parts is not None):
        return "its figure counts no items and keeps no per-sample scores"
    if not (chosen.items or chosen.parts is not None):
        return "the chosen plan's figure counts no items and keeps no per-sample scores"
    return ("their per-sample scores give no estimate (fewer than 3 samples, unequal "
            "samples, or a sample with no signal or no noise)")


def _brief(p: FrontPoint) -> dict[str, Any]:
    """A point as the choice's record names it (its groups are in the trials)."""
    out = {k: v for k, v in point_to_dict(p).items() if k != "groups"}
    return {**out, "promoted": len(p.overrides)}


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
    if p.items is not None:
        out["items"] = _round(p.items)
    return out
