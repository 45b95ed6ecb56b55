"""Refinement by measurement: ``evaluate(plan) -> float`` on points of the greedy path.

==============  ===================================================================
probe           for ``min_quality``: search the greedy path (within ``max_cost``)
                for the first point whose measurement meets Q (the measurement is
                assumed to rise along the path; the probe starts at the first point
                predicted to meet it), and measure the last pruned plan; else
                measure the best-predicted points within ``max_cost``
repairs         first, from the best measured point: try removing each chosen repair,
                kept out when the measurement (the user's metric) is at least as
                good. Repairs are offered by the analysis' metric (output SQNR) on
                uniform ``low``; a repair can raise the SQNR and still lower top-1
                agreement on the plan chosen, so the measurement decides. These
                few measurements come before any other drop, so the step budget
                cannot run out before them (repairs x precisions, measured jointly;
                AIMET AMP phase 3)
residual        the residual stream (residual Adds + the normalisations reading them +
                the elementwise layers on their skip branch, e.g. ``outscale``'s and
                ``peel``'s) promoted wherever legal within ``max_cost``, with the repairs
                kept, measured as one more candidate (``residual_point``)
between         the weightless layers (Resize, Concat, pooling) left below both their
                neighbours in the best measured plan, promoted to their width where
                legal within ``max_cost``: one more candidate (``plan/between.py``)
widest          with no cost cap: every group at its widest legal
                precision within ``max_cost``, one more candidate (``plan/widest.py``)
start           without ``min_quality``, when the measured figures are shares over
                counted items (``FrontPoint.items``) or dB figures with per-sample
                powers (``FrontPoint.parts``): their noise is known: the start
                plan (uniform ``low``) is measured too, after the batch: a bought
                cost must gain beyond noise over it
drop            from the chosen measured point, revert promotions with the least
                predicted gain per unit of cost saved; keep a revert when the
                measurement still meets Q (or, without Q, loses at most ``tol``; for a
                figure with a noise estimate, is not worse than the best measured point
                beyond the noise of their difference,
                :func:`quantscope.plan.pareto.not_worse`: measured against that one
                point, so reverts within noise cannot add up to more than it)
==============  ===================================================================

At most ``steps`` evaluations in all; each plan is measured once. The result is every
measured point, in measuring order. A :class:`TimeBudget` (seconds by a clock passed in:
the wall clock, or any count such as evaluations made) stops the measuring when it is
spent: the first point is always measured, no new one is started once the budget is used,
and :func:`refine_run` says so in a :class:`BudgetStop` (how much was spent, how many
were measured, how many more evaluations the refinement could still have made). The
budgeted batch of best-predicted points is measured in order of expected gain per second
(predicted gain over the start point / seconds one evaluation of its kind took so far),
one at a time, with progress and an ETA. With ``evaluate_many`` (plans -> values, e.g. fanned
out on Ray), the best-predicted points of the plain budget are measured as one batch; the
probe and the drops depend on earlier measurements and stay one at a time. The values,
and so the result, are the serial ones. With ``race`` (:mod:`quantscope.plan.race`), that
batch is raced on prefixes of the data first: a point worse than the leader by more than
its interval stops there (it counts as a step, is not measured and cannot be chosen); the
survivors are measured in full. A stopped point met again (a drop back to it) is not
measured: it counts as worse than any measured point, as a measured point is met again
for free. The one-at-a-time drops are raced too, each against the incumbent (a race of
two plans: the drop stops when it is worse than the incumbent by more than its interval;
it then counts as a step, is not measured and is not taken), where the keep rule compares
the two (no ``min_quality``, no tolerance); a drop that survives is measured in full, so
every taken drop is measured. Every race goes into the race's record (``plan.json``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from quantscope.analyze.phases import NORM_OPS, residual_groups
from quantscope.plan.between import between_point
from quantscope.plan.greedy import Walk
from quantscope.plan.pareto import (
    Budget,
    FrontPoint,
    best_measured,
    lowest_kept,
    noise,
    not_worse,
    select,
)
from quantscope.plan.predict import predict
from quantscope.plan.race import RacePlans
from quantscope.plan.start import EPS, Space, emit, repair_meta
from quantscope.plan.widest import widest_fill, widest_point
from quantscope.progress import say
from quantscope.tasks.db_noise import LeftOut, Parts
from quantscope.types import Group, GroupKind, Groups, Plan

Evaluate = Callable[[Plan], float]
class Figure(NamedTuple):
    """A measured figure with what its noise needs (the ``items`` its share is over, the
    per-sample ``parts`` of a dB figure; None: not said): what an ``EvaluateMany`` task
    returns beside a bare float (``plan --ray``: each worker's evaluator says them)."""

    value: float
    items: float | None = None
    parts: Parts | None = None
    left: LeftOut | None = None  # a share's values with each unit (person) left out


EvaluateMany = Callable[[Sequence[Plan]], list[float | Figure]]


@dataclass(frozen=True)
class TimeBudget:
    """How long the refinement may measure: ``seconds`` as ``clock`` counts them from the
    refinement's start (``time.monotonic``; a test passes a counter of evaluations made)."""

    seconds: float
    clock: Callable[[], float] = time.monotonic


@dataclass(frozen=True)
class BudgetStop:
    """The budget stopped the measuring: ``left`` more evaluations were within ``steps``."""

    seconds: float  # the budget
    spent: float  # by its clock when it stopped
    measured: int  # points measured (cached ones included)
    left: int  # evaluations the refinement could still have made

    def to_dict(self) -> dict[str, Any]:
        """The plan file's ``time_budget`` (``seconds``: what was spent, a wall-clock figure
        that ``run`` keeps in ``run.json``, not in its files)."""
        return {"bound": True, "budget_s": round(self.seconds, 3),
                "seconds": round(self.spent, 3), "measured": self.measured,
                "candidates_left": self.left, "note": self.note()}

    def note(self) -> str:
        return (f"the time budget ({self.seconds:.4g} s) bound after {self.measured} candidate "
                f"evaluation(s), with up to {self.left} more left: the plan is the best legal "
                "plan measured so far; a rerun with a larger --budget continues from the "
                "evaluation cache")


def _count(items: Any) -> float | None:
    """A count of items as a figure's noise reads it (None: none, or under one)."""
    return float(items) if isinstance(items, int | float) and items >= 1 else None


@dataclass(frozen=True)
class Refined:
    """Every measured point, in measuring order, and the budget's stop (None: not bound)."""

    trials: tuple[FrontPoint, ...]
    stop: BudgetStop | None = None


class _Meter:
    """Measures points with ``evaluate``, at most ``steps`` times, memoised by plan, while
    the time ``budget`` (if any) is not spent."""

    def __init__(self, space: Space, evaluate: Evaluate, steps: int,
                 budget: TimeBudget | None = None, progress: bool = False) -> None:
        self.space, self.evaluate, self.left = space, evaluate, steps
        self.seen: dict[tuple, FrontPoint] = {}
        self.budget, self.progress = budget, progress
        self.began = budget.clock() if budget is not None else 0.0
        self.took: dict[tuple[str, ...], list[float]] = {}  # seconds per evaluation, by repairs
        self.stop: BudgetStop | None = None
        self.stopped: set[tuple] = set()  # points a race stopped (never measured)
        self.race: RacePlans | None = None  # set: the drops are raced against the incumbent
        self.charged = 0.0  # cached figures' recorded seconds beyond the time they took

    def spent(self) -> bool:
        """The budget is used (never before the first measurement); records the stop."""
        if self.budget is None or not self.seen:
            return False
        used = self.budget.clock() - self.began + self.charged
        if used < self.budget.seconds:
            return False
        if self.stop is None:
            self.stop = BudgetStop(self.budget.seconds, used, len(self.seen), self.left)
            say(f"plan: {self.stop.note()} ({used:.4g} s spent)", show=self.progress)
        return True

    def seconds(self, repairs: tuple[str, ...]) -> float:
        """Seconds one evaluation of a plan with these repairs took so far (else any)."""
        own = self.took.get(repairs) or [t for ts in self.took.values() for t in ts]
        return sum(own) / len(own) if own else 1.0

    def measure(self, point: FrontPoint) -> FrontPoint | None:
        if point.key() in self.seen:
            return self.seen[point.key()]
        if point.key() in self.stopped:  # lost its race: worse than any measured point
            worst = -math.inf if self.space.budget.higher_is_better else math.inf
            return replace(point, measured=worst)
        if self.left <= 0 or self.spent():
            return None
        self.left -= 1
        plan = emit(self.space, point, reasons=(), meta=repair_meta(point))
        t0 = time.perf_counter()
        done = replace(point, measured=float(self.evaluate(plan)), items=self._items(),
                       parts=self._parts(), left=self._left())
        took = self._charge(time.perf_counter() - t0)
        self.took.setdefault(point.repairs, []).append(took)
        self.seen[point.key()] = done
        self._tell(took)
        return done

    def raced_out(self, incumbent: FrontPoint, point: FrontPoint,
                  reference: FrontPoint | None) -> bool:
        """Race ``point`` against ``incumbent`` on prefixes (when a race is set): True when
        it stopped (it counts as a step, is never measured and counts as worse). It stops
        only where the drop's keep rule (:func:`_keeps` against the best measured
        ``reference``) could not keep it: worse than the incumbent by more than the
        rule's noise allowance (:func:`drop_margin`)."""
        key = point.key()
        if self.race is None or key in self.seen or key in self.stopped or self.left <= 0 \
                or self.spent():
            return key in self.stopped
        plans = [emit(self.space, p, reasons=(), meta=repair_meta(p)) for p in (incumbent, point)]
        room = drop_margin(incumbent, reference, self.space.budget)
        if not self.race(plans, margin=lambda _a, _b, _n: room).entries[1].stopped:
            return False
        self.left -= 1
        self.stopped.add(key)
        return True

    def batch_margin(self, mean: float, rival: float, total: int) -> float:
        """How far below the batch's leader a candidate may be and still be chosen (the
        noise rule's ties, :func:`quantscope.plan.pareto.select`): the noise of the two
        figures as shares over the ``total`` queries, at the prefix's means (0 with a
        quality goal; for a figure the evaluator gives no items, as recall@1, the
        allowance is still given: the race stops less, never a plan the rule would take)."""
        if self.space.budget.min_quality is not None:
            return 0.0
        like = FrontPoint(cost=0.0, predicted=rival, measured=rival, overrides=(),
                          items=float(total))
        half = noise(like, replace(like, measured=mean))
        return 0.0 if half is None else half[0]

    def _items(self) -> float | None:
        """The items the figure just measured is a share over, where the evaluator says
        (its ``items`` after each call: the task's ``KEY_items``); None: not said."""
        return _count(getattr(self.evaluate, "items", None))

    def _parts(self) -> Parts | None:
        """The per-sample powers of the dB figure just measured, where the evaluator keeps
        them (its ``parts`` after each call); None: not kept."""
        parts = getattr(self.evaluate, "parts", None)
        return parts if isinstance(parts, Parts) else None

    def _left(self) -> LeftOut | None:
        """The share just measured with each unit (face data's person) left out, where the
        evaluator computed it (its ``left`` after each call); None: not computed."""
        left = getattr(self.evaluate, "left", None)
        return left if isinstance(left, LeftOut) else None

    def _charge(self, took: float) -> float:
        """The seconds an evaluation counts for: what it took, or, for a figure the
        evaluator read from its cache (``evaluate.seconds``), what measuring it took then,
        on a wall-clock budget (the default clock): a killed search resumed, or rerun, then
        measures and orders as the clean one did, and a larger budget continues it."""
        recorded = getattr(self.evaluate, "seconds", None)
        wall = self.budget is None or self.budget.clock is time.monotonic
        if recorded is None or not wall or recorded <= took:
            return took
        self.charged += recorded - took
        return float(recorded)

    def _tell(self, took: float) -> None:
        if not self.progress:
            return
        each = [t for ts in self.took.values() for t in ts]
        mean = sum(each) / len(each)
        text = (f"plan: candidate {len(self.seen)} measured ({took:.1f} s; {mean:.1f} s "
                f"each so far); up to {self.left} more, ETA {self.left * mean:.0f} s")
        if self.budget is not None:
            used = self.budget.clock() - self.began + self.charged
            text += f"; budget {max(self.budget.seconds - used, 0.0):.4g} of " \
                    f"{self.budget.seconds:.4g} left"
        say(text)

    def best_per_second(self, points: Sequence[FrontPoint]) -> FrontPoint:
        """The point with the most predicted gain over the start point per second of one
        evaluation (:meth:`seconds`, as measured so far); ties: the first."""
        sign = 1.0 if self.space.budget.higher_is_better else -1.0
        base = predict(self.space, dict(self.space.start), (), "start", 0).predicted

        def rate(p: FrontPoint) -> float:
            return sign * (p.predicted - base) / max(self.seconds(p.repairs), EPS)

        return max(points, key=rate)

    def measure_by_rate(self, points: Sequence[FrontPoint]) -> None:
        """Each point measured, the best expected gain per second next, until the budget is
        spent; the measured ones are then kept in ``points``' order (a plan file does not
        depend on the timings unless the budget binds)."""
        left = list(points)
        while left:
            p = self.best_per_second(left)
            left.remove(p)
            if self.measure(p) is None and self.stop is not None:
                break
        order = {p.key(): i for i, p in enumerate(points)}
        self.seen = dict(sorted(self.seen.items(), key=lambda kv: order.get(kv[0], -1)))

    def measure_all(self, points: Sequence[FrontPoint], many: EvaluateMany | None,
                    race: RacePlans | None = None) -> None:
        """``measure`` of each point in order; with ``many``, the new ones in one batch
        (with a time budget one at a time, by expected gain per second); with ``race``,
        the new ones raced on prefixes first and only the survivors measured (each raced
        point counts as a step, measured or stopped; a raced batch is measured whole,
        and a time budget binds from the next measurement on)."""
        if self.budget is not None and race is None:
            self.measure_by_rate(points)
            return
        if many is None and race is None:
            for p in points:
                self.measure(p)
            return
        todo: dict[tuple, FrontPoint] = {}
        for p in points:
            if p.key() not in self.seen and p.key() not in todo and len(todo) < self.left:
                todo[p.key()] = p
        plans = [emit(self.space, p, reasons=(), meta=repair_meta(p)) for p in todo.values()]
        kept = range(len(plans))
        if race is not None and len(plans) > 1:
            kept = race(plans, margin=self.batch_margin).survivors
        items = [item for i, item in enumerate(todo.items()) if i in kept]
        self.stopped |= {key for i, key in enumerate(todo) if i not in kept}
        chosen = [plans[i] for i in kept]
        # what each figure's noise needs: items, per-sample powers, values per unit left out
        noises: list[tuple[float | None, Parts | None, LeftOut | None]] = []
        if many is not None:
            got = [v if isinstance(v, Figure) else Figure(float(v))
                   for v in (many(chosen) if chosen else [])]
            values = [g.value for g in got]
            noises = [(_count(g.items), g.parts, g.left) for g in got]
        else:
            values = []
            for plan in chosen:
                values.append(self.evaluate(plan))
                noises.append((self._items(), self._parts(), self._left()))
        self.left -= len(plans)
        for (key, p), v, (n, parts, left) in zip(items, values, noises, strict=True):
            self.seen[key] = replace(p, measured=float(v), items=n, parts=parts, left=left)


def refine(
    space: Space,
    walk: Walk,
    pruned: tuple[FrontPoint, ...],
    evaluate: Evaluate | None,
    *,
    steps: int,
    tol: float,
    evaluate_many: EvaluateMany | None = None,
    race: RacePlans | None = None,
) -> tuple[FrontPoint, ...]:
    """Every point measured (module docstring); none without ``evaluate`` or ``steps``;
    ``race``: the batch of best-predicted points is raced first (only the survivors are
    measured, in full)."""
    return refine_run(space, walk, pruned, evaluate, steps=steps, tol=tol,
                      evaluate_many=evaluate_many, race=race).trials


def refine_run(
    space: Space,
    walk: Walk,
    pruned: tuple[FrontPoint, ...],
    evaluate: Evaluate | None,
    *,
    steps: int,
    tol: float,
    evaluate_many: EvaluateMany | None = None,
    race: RacePlans | None = None,
    budget: TimeBudget | None = None,
    progress: bool = False,
) -> Refined:
    """:func:`refine` within a time ``budget``: the points measured and the budget's stop."""
    capped = [p for p in walk.points if space.budget.within_cost(p.cost)]
    if evaluate is None or steps <= 0 or not capped:
        return Refined(())
    meter = _Meter(space, evaluate, steps, budget, progress)
    if race is not None and space.budget.min_quality is None and tol <= 0:
        meter.race = race  # the drops' keep rule compares with the incumbent: race them
    if space.budget.min_quality is not None:
        _first_meeting(space, meter, capped)
        if pruned:
            meter.measure(pruned[-1])
    else:
        meter.measure_all(list(reversed(capped[-max(1, meter.left // 2) :])), evaluate_many,
                          race)
        _measure_start(meter, capped[0])
    if not meter.seen:
        return Refined(())
    best = _drop_repairs(space, meter, select(list(meter.seen.values()), space.budget)[0])
    stream = residual_point(space, best.repairs)
    if stream is not None:
        meter.measure(stream)
    between = between_point(space, select(list(meter.seen.values()), space.budget)[0])
    if between is not None:
        meter.measure(between)
    # with no cost cap only: under a cap the widest fill in group order is a poor guess
    # that takes a measurement from the drops (minilm-l6 at --max-cost 1.5: 76.3 % at 1.03x,
    # and in a loaded run the time budget then bound before any drop)
    if space.budget.max_cost is None:
        wide = widest_point(space, best.repairs)
        if wide is not None:
            meter.measure(wide)
    _drop(space, meter, select(list(meter.seen.values()), space.budget)[0], tol)
    return Refined(tuple(meter.seen.values()), meter.stop)


def residual_point(space: Space, repairs: tuple[str, ...]) -> FrontPoint | None:
    """A structural candidate measured beside the greedy path (origin ``residual``): the
    residual stream — every residual Add, every normalisation that reads one and the
    elementwise layers on its skip branch (:func:`_skip_branch`) — at the
    widest candidate precision each may legally take, in group order, while the plan stays
    within the cost cap; None if no such group can be promoted.

    The greedy path follows per-group predictions; where the low precision breaks the
    model everywhere (a 12-layer encoder at a8_w8: cosine 0.16), every single promotion
    measures as noise and the path never reaches the stream as a whole, which may still
    be cheap (activation ops) and legal (short sequences)."""
    groups = space.legal.groups
    adds = residual_groups(groups)
    outs = {g.outputs[0] for g in adds}
    members = {g.name for g in adds} | {
        g.name for g in groups.groups
        if g.op_type in NORM_OPS and g.inputs and g.inputs[0] in outs}
    members |= _skip_branch(groups, adds)
    return widest_fill(space, [n for n in space.names if n in members], repairs, "residual")


SKIP_OPS = frozenset({"Add", "Sub", "Mul", "Div"})


def _skip_branch(groups: Groups, adds: Sequence[Group]) -> set[str]:
    """Elementwise layers that feed a residual Add, back to the Linears and norms: the skip
    branch the stream's rewrites add (``outscale``'s ``x / s`` Mul, ``peel``'s Add). At low
    precision they would carry the stream's error; none exist in an unrewritten encoder."""
    producer = {t: g for g in groups.groups for t in g.outputs}
    found: set[str] = set()
    todo = [t for g in adds for t in g.inputs]
    while todo:
        g = producer.get(todo.pop())
        if g is None or g.name in found or g.kind is not GroupKind.ACTIVATION \
                or g.op_type not in SKIP_OPS:
            continue
        found.add(g.name)
        todo.extend(g.inputs)
    return found


def _measure_start(meter: _Meter, start: FrontPoint) -> None:
    """The start plan measured as well when the measured figures have a noise (shares over
    counted items, dB figures with per-sample powers): the best-quality rule then buys cost only for a gain beyond noise over
    it (:func:`quantscope.plan.pareto.select`). Without a noise estimate it would win only
    on a strictly better figure, so it is not measured (the batch's steps are the path's)."""
    if start.origin != "start" or start.key() in meter.seen:
        return
    if any(p.items is not None or p.parts is not None for p in meter.seen.values()):
        meter.measure(start)


def _keeps(done: FrontPoint, current: FrontPoint, reference: FrontPoint | None,
           budget: Budget, tol: float) -> bool:
    """Whether a measured revert (``done``, from ``current``) is kept without a quality
    goal: not worse than the best measured ``reference`` beyond the noise of their
    difference where the two figures have one (:func:`quantscope.plan.pareto.noise`:
    counted items, or per-sample powers; :func:`not_worse`), else losing at
    most ``tol`` against ``current``."""
    sign = 1.0 if budget.higher_is_better else -1.0
    if sign * (done.quality - current.quality) >= -tol:
        return True
    return reference is not None and noise(reference, done) is not None \
        and not_worse(done, reference, budget)


def drop_margin(incumbent: FrontPoint, reference: FrontPoint | None, budget: Budget) -> float:
    """How far below the (measured) ``incumbent`` a drop may measure and still be kept by
    :func:`_keeps` at no tolerance: the distance to the lowest figure the noise rule keeps
    against the best measured ``reference`` (:func:`quantscope.plan.pareto.lowest_kept`,
    for a drop over the incumbent's items), 0 where that is above the incumbent or there
    is no noise estimate (then only a drop at least as good as the incumbent is kept)."""
    if reference is None:
        return 0.0
    low = lowest_kept(reference, incumbent, budget)
    if low is None:
        return 0.0
    sign = 1.0 if budget.higher_is_better else -1.0
    return max(sign * (incumbent.quality - low), 0.0)


def _first_meeting(space: Space, meter: _Meter, seq: list[FrontPoint]) -> None:
    """Find the first path point whose measurement meets Q (measurements assumed rising)."""
    budget = space.budget
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


def _drop(space: Space, meter: _Meter, current: FrontPoint, tol: float) -> None:
    """Revert promotions (least predicted gain per cost saved first) the measurement allows."""
    prec, budget, start = space.precisions(current), space.budget, space.start
    reference = best_measured(list(meter.seen.values()), budget)

    def worth(g: str) -> float:
        saved = -space.table.delta(prec, g, start[g])
        return (space.sens.delta(g, start[g], prec[g]) or 0.0) / max(saved, EPS)

    for g in sorted((g for g in space.names if prec[g] != start[g]), key=worth):
        if prec[g] == start[g]:  # reverted with a group reading its weight
            continue
        trial = {**prec, **space.revert(prec, g)}
        pt = predict(space, trial, current.repairs, "dropped", current.step)
        if not budget.within_cost(pt.cost) or space.legal.blocking(space.plan(trial)):
            continue
        if meter.raced_out(current, pt, reference):  # clearly worse on a prefix: not taken
            continue
        done = meter.measure(pt)
        if done is None:
            return
        keep = (
            budget.meets(done)
            if budget.min_quality is not None
            else _keeps(done, current, reference, budget, tol)
        )
        if keep:
            current, prec = done, trial
    _drop_repairs(space, meter, current)


def _drop_repairs(space: Space, meter: _Meter, current: FrontPoint) -> FrontPoint:
    """Remove each repair of ``current`` whose removal measures at least as well (without
    a quality goal, for a share over counted items: not worse than the best measured
    point beyond noise, as :func:`_drop` keeps a revert)."""
    budget, prec = space.budget, space.precisions(current)
    reference = best_measured(list(meter.seen.values()), budget)
    for r in current.repairs:
        # a repair stays only if the measurement says it helps this plan
        rest = tuple(x for x in current.repairs if x != r)
        done = meter.measure(predict(space, prec, rest, "dropped", current.step))
        if done is None:
            break
        sign = 1.0 if budget.higher_is_better else -1.0
        if budget.min_quality is not None:
            keep = sign * (done.quality - current.quality) >= 0 and budget.meets(done)
        else:
            keep = _keeps(done, current, reference, budget, 0.0)
        if keep:
            current = done
    return current
