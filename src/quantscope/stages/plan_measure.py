"""The planner's measurements (moved out of :mod:`.plan`, which re-exports them): a plan
measured by real emulation after its repairs (``plan_evaluator``), the measured repair
offer (``plan_repair_offer``), both through the evaluation cache when one is given, and
the best-predicted plans measured as parallel tasks (``_measure_all``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from quantscope.analyze.incremental import IncrementalEngine
from quantscope.analyze.measure import evaluate_plan, reference_kept_outputs, scored_alone
from quantscope.emulate.evaluate import kept, run_model
from quantscope.model.load import Model, load_proto
from quantscope.plan.refine import Figure
from quantscope.progress import say
from quantscope.stages.offer_holdout import check_offer
from quantscope.tasks.db_noise import LeftOut, Parts, WithParts
from quantscope.tasks.left_out import (
    UNITS_KEY,
    left_out_of,
    left_out_record,
    share_left_out,
    unit_parts,
)
from quantscope.types import Batch, Dataset, Outputs, Plan, QuantscopeError, Stats

if TYPE_CHECKING:
    from quantscope.analyze.evalcache import EvalCache
    from quantscope.parallel import Executor
    from quantscope.plan.joint import Measure, Offer, Repair
    from quantscope.plan.refine import Evaluate
    from quantscope.targets.profile import Target
    from quantscope.types import Sensitivity


def _plan_measure(model: Model, data: Dataset, target: Target | None, method: str | None,
                  reference_outputs: Outputs | None, only: str | None = None) -> Measure:
    """``measure(model, stats, plan) -> metrics``; ``only``: just that metric where the task
    scores it alone (what a ranking reads: ``evaluate_plan``'s ``only``), against FP32's
    outputs as the task keeps them (pooled rows: no per-token reference held), and the
    per-sample powers of a dB figure beside the figures (``parts``: the noise of the
    planner's choice, :class:`quantscope.tasks.db_noise.WithParts`)."""
    alone = only is not None and scored_alone(data, only) is not None
    ref = reference_outputs
    if ref is None and not alone:
        ref = run_model(model.proto, list(data.evaluation))
    ref_kept = None
    if alone:
        ref_kept = (reference_kept_outputs(model, data) if ref is None
                    else kept(ref, list(data.evaluation), getattr(data.task, "keep", None)))
    scheme = None if target is None else target.scheme
    # one incremental evaluator for every plan of the search (its runner made on first use)
    engine = IncrementalEngine(model, list(data.evaluation), method=method)
    # a share on face data: its value with each person left out (its noise over people)
    left_out = share_left_out(data.task, only) if only is not None else ()

    def measure(m: Model, s: Stats, p: Plan) -> dict[str, float]:
        got = evaluate_plan(m, data, s, p, method=method, scheme=scheme,
                            reference_outputs=ref, saturation=False, engine=engine,
                            only=only, reference_kept=ref_kept, sample_parts=only is not None,
                            left_out=left_out)
        # a dB figure's per-sample powers ride beside the figures: its noise in the choice
        return WithParts(got["metrics"], got.get("sample_parts") or {}, got.get("left_out"))

    return measure


def _plan_repair(feeds: Sequence[Batch], target: Target | None) -> Repair:
    """The search's repair: each plan's repairs run for it, the leading steps that never
    read the plan (equalize, smooth, split) once per model for the whole search."""
    from quantscope.plan.joint import Repaired
    from quantscope.repair.apply import RepairMemo, run_repairs

    scheme = None if target is None else target.scheme
    feeds, memo = list(feeds), RepairMemo()

    def repair(m: Model, s: Stats, p: Plan, names: Sequence[str]) -> Repaired:
        out = run_repairs(m, s, p, feeds, repairs=names, scheme=scheme, memo=memo)
        label = f"{m.source} (repaired: {','.join(names)})"
        return Repaired(load_proto(out.proto, label), out.stats, out.plan, out.records)

    return repair


def plan_evaluator(model: Model, data: Dataset, stats: Stats, metric: str,
                   feeds: Sequence[Batch] = (), *, target: Target | None = None,
                   method: str | None = None, reference_outputs: Outputs | None = None,
                   progress: bool = False, cache: EvalCache | None = None,
                   repair: Repair | None = None) -> Evaluate:
    """``evaluate(plan) -> float`` for the planner: ``metric`` of the plan by real emulation,
    after the plan's repairs (meta ``repairs``; they need the calibration ``feeds``),
    against the FP32 outputs of the original ``model`` (computed once), scored for that
    metric alone where the task can (the plan's other figures come from ``evaluate``).
    With ``cache``,
    each plan's figure is read from it when an earlier evaluation of the same model
    content, statistics, plan, scheme, method, data, metric (and, for a plan that lists
    repairs, calibration feeds) stored it, and stored there when measured now.
    ``repair``: the search's :func:`_plan_repair` on ``feeds`` (shared with the repair
    offer, so its plan-free steps run once); made here when not given."""
    from quantscope.plan.joint import repair_evaluator

    if repair is None and feeds:
        repair = _plan_repair(feeds, target)
    evaluate = repair_evaluator(model, stats, metric,
                                measure=_plan_measure(model, data, target, method,
                                                      reference_outputs, only=metric),
                                repair=repair, progress=progress)
    if cache is None:
        return evaluate
    return _cached(evaluate, cache, model, data, stats, metric, feeds, target, method)


def _cached(evaluate: Evaluate, cache: EvalCache, model: Model, data: Dataset, stats: Stats,
            metric: str, feeds: Sequence[Batch], target: Target | None,
            method: str | None) -> Evaluate:
    """``evaluate`` read from and written to ``cache`` (digests computed once, lazily)."""
    import time

    from quantscope.analyze import evalcache as ec

    fixed: dict[str, Any] = {}

    def key(plan: Plan) -> str:
        if not fixed:
            fixed.update(model=ec.model_digest(model.proto), stats=ec.stats_digest(stats),
                         data=ec.data_digest(data), metric=metric, method=method,
                         scheme=None if target is None else target.scheme,
                         # a share on face data: an entry stored before h71 holds no values
                         # per person, so it is measured again (a resumed run chooses as a
                         # fresh one); other data's keys unchanged
                         **({"units": UNITS_KEY} if share_left_out(data.task, metric) else {}))
        repairs = dict(plan.meta).get("repairs")
        if repairs and "feeds" not in fixed:
            fixed["feeds"] = ec.content_digest(list(feeds))
        return ec.evaluation_key(plan=ec.plan_digest(plan), **(
            fixed if repairs else {k: v for k, v in fixed.items() if k != "feeds"}))

    def run(plan: Plan) -> float:
        k = key(plan)
        hit = cache.get_measured(k)
        if hit is not None:
            value, measure.seconds, what = hit  # what it cost when measured
            measure.items = what.get("items")  # the items its share is over, if counted
            measure.parts = _cached_parts(cache, k, what, data.task)
            # a share's values with each person left out (an entry without them: the
            # binomial over its items, which the plan's record says)
            measure.left = left_out_of(what.get("left_out"), metric)
            return value
        t0 = time.perf_counter()
        value = float(evaluate(plan))
        measure.seconds = time.perf_counter() - t0
        measure.items = getattr(evaluate, "items", None)
        measure.parts = getattr(evaluate, "parts", None)
        measure.left = getattr(evaluate, "left", None)
        parts, left = measure.parts, measure.left
        cache.put(k, value, seconds=measure.seconds,
                  what={"metric": metric, "model": model.source,
                        "overrides": len(plan.overrides),
                        "repairs": dict(plan.meta).get("repairs", ""),
                        **({"items": measure.items} if measure.items is not None else {}),
                        **({"parts": parts.unit} if parts is not None else {}),
                        **({"left_out": left_out_record(left, metric)}
                           if isinstance(left, LeftOut) else {})},
                  arrays=None if parts is None else {"signal": parts.signal,
                                                     "noise": parts.noise})
        return value

    measure = _Charged(run)
    return measure


def _cached_parts(cache: EvalCache, key: str, what: dict[str, Any], task: Any
                  ) -> Parts | None:
    """The per-sample powers stored with a cached figure (None: none stored, or their
    arrays unreadable: the choice then says it had no noise estimate), summed per unit of
    ``task``'s data as a measurement now sums them (an entry stored before h69 holds a
    face verification's per face: :func:`quantscope.tasks.left_out.unit_parts`)."""
    if not isinstance(what.get("parts"), str):
        return None
    got = cache.arrays(key)
    if got is None or {"signal", "noise"} - set(got):
        return None
    return unit_parts(Parts(got["signal"], got["noise"], what["parts"]), task)


class _Charged:
    """An evaluator that says what its last evaluation cost (``seconds``: measured now, or
    as recorded when it was read from the evaluation cache), so that a time budget charges
    a cached figure what measuring it took and a resumed search measures what a clean one
    would (``plan/refine.py``'s meter), and the items its figure is a share over
    (``items``, kept in the cache entry: a figure read back has the same noise), and the
    per-sample powers of its dB figure (``parts``: the entry's arrays) and a share's
    values with each person left out (``left``: the entry's ``left_out``)."""

    def __init__(self, run: Callable[[Plan], float]) -> None:
        self.run, self.seconds = run, 0.0
        self.items: float | None = None
        self.parts: Parts | None = None
        self.left: LeftOut | None = None

    def __call__(self, plan: Plan) -> float:
        return self.run(plan)


def plan_repair_offer(model: Model, data: Dataset, stats: Stats, sens: Sensitivity,
                      target: Target, names: Sequence[str],
                      feeds: Sequence[Batch], *, task_metric: str,
                      shapes: dict[str, tuple[int, ...]] | None = None,
                      method: str | None = None, reference_outputs: Outputs | None = None,
                      progress: bool = False, cache: EvalCache | None = None,
                      repair: Repair | None = None) -> Offer:
    """:func:`quantscope.plan.joint.offer_repairs` with real emulation and repairs (each
    measurement read from / kept in ``cache`` when given; ``repair`` as in
    :func:`plan_evaluator`); where ``data`` evaluates on its calibration batches, each
    offered repair also judged out of sample (:mod:`.offer_holdout`)."""
    from quantscope.plan.joint import offer_repairs
    from quantscope.repair.apply import REPAIRS

    unknown = [n for n in names if n not in REPAIRS]
    if unknown:
        raise QuantscopeError(f"unknown repair '{unknown[0]}': use {', '.join(REPAIRS)}")
    measure = _plan_measure(model, data, target, method, reference_outputs)
    if cache is not None:
        measure = _cached_measure(measure, cache, data, target, method)
    offer = offer_repairs(model, stats, sens, target, names, measure=measure,
                          repair=repair or _plan_repair(feeds, target), task_metric=task_metric,
                          shapes=shapes, progress=progress)
    # measured on its own calibration batches (tensor data): each offer judged out of
    # sample too, by 2-fold cross validation over the repair feeds (offer_holdout.py)
    return check_offer(offer, model, data, stats, sens, target, feeds, method=method,
                       progress=progress)


def _cached_measure(measure: Measure, cache: EvalCache, data: Dataset, target: Target | None,
                    method: str | None) -> Measure:
    """``measure`` (every metric of a plan on a possibly repaired model) through ``cache``:
    keyed by that model's content, its stats, the plan, the data, scheme and method."""
    import time

    from quantscope.analyze import evalcache as ec

    fixed: dict[str, Any] = {}

    def run(m: Model, s: Stats, p: Plan) -> dict[str, float]:
        if not fixed:
            fixed.update(data=ec.data_digest(data), method=method,
                         scheme=None if target is None else target.scheme)
        key = ec.evaluation_key(kind="metrics", model=ec.model_digest(m.proto),
                                stats=ec.stats_digest(s), plan=ec.plan_digest(p), **fixed)
        hit = cache.get_what(key)
        if hit is not None and isinstance(hit.get("metrics"), dict):
            return {k: float(v) for k, v in hit["metrics"].items()}
        t0 = time.perf_counter()
        metrics = dict(measure(m, s, p))
        if all(isinstance(v, int | float) for v in metrics.values()):
            cache.put(key, 0.0, seconds=time.perf_counter() - t0,
                      what={"metrics": {k: float(v) for k, v in metrics.items()}})
        return metrics

    return run

def _call(fn: Callable[[Any], Any], item: Any) -> Figure:
    """``fn(item)`` with what its noise needs (the evaluator's ``items``, ``parts`` and
    ``left`` after the call), so a figure measured as a parallel task keeps its noise."""
    value = float(fn(item))
    return Figure(value, getattr(fn, "items", None), getattr(fn, "parts", None),
                  getattr(fn, "left", None))


def _measure_all(executor: Executor, evaluate: Callable[[Plan], float], progress: bool,
                 plans: Sequence[Plan]) -> list[float | Figure]:
    """Each plan measured by ``evaluate`` as one task of ``executor`` (results in order,
    each with its items and per-sample powers: :class:`quantscope.plan.refine.Figure`)."""
    say(f"plan: measuring {len(plans)} plan(s) as {executor.workers}-way parallel tasks",
        show=progress)
    return list(executor.map(_call, evaluate, list(plans)))
