"""Planning (``quantscope plan``): the search bound to real emulation and repairs, the
uniform shortcut, the fine-tune of the chosen plan, the goal verdict, one search per
sequence length.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from quantscope.analyze.incremental import IncrementalEngine, engines_counts, engines_made
from quantscope.analyze.measure import evaluate_plan, evaluate_plans, headline
from quantscope.emulate.evaluate import run_model
from quantscope.finetune.engine import RankEngine, resolve_engine
from quantscope.model.groups import find_groups
from quantscope.model.load import Model, load_proto
from quantscope.plan.accepted import accepted_record, with_accepted
from quantscope.progress import say
from quantscope.report import fmt
from quantscope.rewrites.registry import REWRITES, applied_rewrites, hint_for
from quantscope.stages.plan_measure import (  # noqa: F401 - re-exported
    _call,
    _measure_all,
    _plan_measure,
    _plan_repair,
    plan_evaluator,
    plan_repair_offer,
)
from quantscope.stages.rank import confirm_chosen, ranking_evaluator
from quantscope.tasks.headline import Headline
from quantscope.tasks.registry import at_length
from quantscope.types import Dataset, Plan, Precision, QuantscopeError, Stats

if TYPE_CHECKING:
    from quantscope.analyze.evalcache import EvalCache
    from quantscope.parallel import Executor
    from quantscope.plan.joint import Offer
    from quantscope.plan.refine import Evaluate
    from quantscope.plan.search import TimeBudget
    from quantscope.targets.profile import Target
    from quantscope.types import Sensitivity


def _keep_finetune(pareto: dict[str, Any]) -> bool:
    """Keep the fine-tuned plan only if it measured at least as well as the plan without
    it (the planner's measurement with its repairs, else the precisions alone) and its
    fine-tuned FP32 model, measured against the original, is at least as good as the
    fine-tuned plan itself (else the float model leans on the 8-bit grid and is no
    faithful fallback); records the decision in ``pareto["finetune"]``."""
    ft = pareto["finetune"]
    base = pareto.get("chosen", {}).get("measured")
    base = ft.get("before") if base is None else base
    after = ft.get("after")
    higher = pareto.get("higher_is_better", True)

    def at_least(a: Any, b: Any) -> bool:
        return a is None or b is None or (a >= b if higher else a <= b)

    drift = (ft.get("fp32_drift") or {}).get(ft.get("metric"))
    better, faithful = at_least(after, base), at_least(drift, after)
    keep = ft.get("skipped") is None and better and faithful
    ft["kept"] = keep
    m = str(ft.get("metric") or pareto.get("measured_metric"))  # the figures' metric
    if not keep and ft.get("skipped") is None:
        ft["dropped"] = (
            f"measured {fmt.value(m, after)} with finetune against {fmt.value(m, base)} "
            "without" if not better else
            f"its fine-tuned FP32 model measures {fmt.value(m, drift)} against the original, "
            f"worse than the fine-tuned plan's {fmt.value(m, after)}: the float model leans on "
            "the 8-bit grid and is no faithful fallback"
        ) + ": the plan returned is the one without it"
    return keep


def goal_verdict(result: dict[str, Any], metric: str | Headline, goal: float, *,
                 split: bool = False, chunked: bool = False,
                 done: Collection[str] = ()) -> dict[str, Any]:
    """Did the chosen plan reach ``goal`` (measured, in the metric's direction and unit);
    if not, which constraint binds (and the hint of the rewrite that answers it, from
    :data:`quantscope.rewrites.registry.REWRITES`, unless the model carries that rewrite
    already: ``done`` names them; ``split`` / ``chunked`` are the older spellings of
    headsplit / tokensplit in ``done``)."""
    from quantscope.tasks.headline import describe_metric

    h = describe_metric(metric) if isinstance(metric, str) else metric
    metric = h.metric
    best = result.get("chosen", {}).get("measured")
    ft = result.get("finetune") or {}
    tuned = ft.get("after") if ft.get("kept", True) else None
    if tuned is not None:  # the plan returned is the fine-tuned one
        best = tuned if best is None else (max if h.higher_is_better else min)(best, tuned)
    reached = h.reached(best, goal)
    said = fmt.goal(metric, goal, h.higher_is_better)
    blockers = result.get("blockers", [])
    if reached and result.get("uniform_meets_goal"):
        verdict = (f"goal {said} reached by uniform a8_w8 ({fmt.value(metric, best)}): no "
                   "promotion bought, the plan is uniform a8_w8")
    elif reached:
        verdict = f"goal {said} reached: {fmt.value(metric, best)}"
    elif best is None:
        verdict = f"goal {said} not checked: nothing was measured (give --data)"
    else:
        top = blockers[0] if blockers else None
        why = (f"binding: {top['rule']} blocks {len(top['groups'])} promotion(s) worth "
               f"{fmt.gain(str(result.get('metric', '')), top['gain'])} predicted (in the "
               "analysis' metric)" if top else "binding: no promotion left")
        verdict = f"goal {said} NOT reached: best legal plan {fmt.against(metric, best, goal)}; {why}"
    out = {"metric": metric, "unit": h.unit, "value": goal, "reached": reached,
           "verdict": verdict,
           "binding": None if reached or not blockers else blockers[0]["rule"]}
    done = {*done, *(("headsplit",) if split else ()), *(("tokensplit",) if chunked else ())}
    hint = hint_for(out["binding"] and str(out["binding"]), done)
    if hint is not None:
        out["hint"] = hint
    return out


# the goal verdict's hints, kept importable here: each rewrite's entry holds its own
TOKENSPLIT_HINT = REWRITES["tokensplit"].hint
HEADSPLIT_HINT = REWRITES["headsplit"].hint

@dataclass(frozen=True)
class PlanOptions:
    """What the plan search is asked for, besides the model, its analysis and the target.

    ``min_quality`` is in the analysis' predicted metric; ``goal`` is in the measured
    ``metric`` (needs data); ``repairs`` are measured, so they need data and statistics.
    """

    min_quality: float | None = None
    max_cost: float | None = None
    seq_len: int | None = None
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()  # --input-shape overrides
    metric: str | None = None  # None: the data's default (see default_metric)
    goal: float | None = None
    repairs: tuple[str, ...] = ()
    repair_batches: int = 8
    seed: int = 0
    rank_engine: str = "auto"  # who ranks the candidates (stages/rank.py); ORT measures
    budget: float | None = None  # seconds the search may spend measuring (None: no bound)
    race: float | None = None  # confidence of a race over the measured batch (None: off)
    # warning rule ids that block no move (--allow-warning: targets/accept.py)
    allowed_warnings: frozenset[str] = frozenset()

    def check_inputs(self, *, data: bool, stats: bool) -> None:
        """One-line errors for options the given data contradicts (call before opening it)."""
        if self.min_quality is not None and data:
            raise QuantscopeError(
                "--min-quality is in the analysis' predicted metric (output SQNR, dB) while "
                "--data measures the task metric: use --max-cost with --data, or --min-quality "
                "without --data"
            )
        if self.repairs and not (data and stats):
            raise QuantscopeError("--repairs needs --data and --stats: repairs are measured")
        if self.rank_engine != "auto":  # unknown, or torch asked for and not installed
            resolve_engine(self.rank_engine)


@dataclass(frozen=True)
class PlanResult:
    """A searched plan and the records its plan file keeps next to it."""

    plan: Plan
    pareto: dict[str, Any]  # the plan file's ``pareto`` entry (front, budget, blockers, goal)
    repairs: tuple[dict[str, Any], ...] = ()  # the repairs chosen, with their reasons
    offer: Offer | None = None  # every requested repair as measured alone (with --repairs)
    # what the measuring engine did this time (plans, segments run and skipped, fallbacks):
    # work, not result, so kept out of the plan file (``run`` puts it in run.json)
    work: dict[str, Any] | None = None

    def file_extra(self) -> dict[str, Any]:
        """The plan file's keys besides the plan itself (``write_plan``'s ``extra``)."""
        extra: dict[str, Any] = {"pareto": self.pareto}
        if self.repairs:
            extra["repairs"] = list(self.repairs)
        if self.offer is not None:
            extra["repair_offer"] = {"measured": list(self.offer.measured),
                                     "notes": list(self.offer.notes)}
        return extra


def _label_measured(plan: Plan, pareto: dict[str, Any], metric: str | None) -> Plan:
    """Say in which metric the search's measurements are: ``pareto["metric"]`` is the
    analysis' (what the predictions are in), and the measured figures are in the task's
    headline ``metric``, which may differ (e.g. ``sqnr_db`` predicted,
    ``sqnr_db_channel_min`` measured): ``measured_metric`` in the pareto and the plan's
    meta."""
    if metric is None:
        return plan
    pareto["measured_metric"] = metric
    return dataclasses.replace(plan, meta=(*plan.meta, ("measured_metric", metric)))


def _at_seq_len(data: Dataset | None, seq_len: int | None) -> tuple[str | None, Dataset | None]:
    """The data cut to what ``seq_len`` runs, and the note saying so (None: nothing cut)."""
    if data is None or seq_len is None:
        return None, data
    cut = at_length(data, seq_len)
    return (cut.notes[-1] if cut is not data else None), cut


def _without_finetune(options: PlanOptions) -> tuple[bool, PlanOptions]:
    """Whether ``finetune`` is among the repairs, and the options without it (it is no
    search move: :func:`plan_model` fine-tunes the chosen plan afterwards)."""
    if "finetune" not in options.repairs:
        return False, options
    return True, dataclasses.replace(
        options, repairs=tuple(r for r in options.repairs if r != "finetune"))


def plan_model(
    model: Model,
    analysis: Sensitivity,
    target: Target,
    options: PlanOptions = PlanOptions(),
    *,
    data: Dataset | None = None,
    stats: Stats | None = None,
    progress: bool = False,
    executor: Executor | None = None,
    cache: EvalCache | None = None,
    clock: Callable[[], float] | None = None,
) -> PlanResult:
    """Search a legal plan from an analysis; with ``data`` and ``stats`` the front is
    re-measured by real emulation and ``options.repairs`` are measured and searched too;
    ``executor`` (e.g. Ray) measures the batch of best-predicted points in parallel.
    ``cache``: every evaluation read from / written to it (:func:`plan_evaluator`);
    ``options.budget``: the seconds the refinement may measure, by ``clock`` (wall clock).

    ``finetune`` among the repairs is not a search move (one fine-tune costs minutes): the
    chosen plan, with its repairs, is fine-tuned and measured again, and
    ``pareto["finetune"]`` records both measurements, the fine-tuned FP32 model's own
    drift from the original and the time; the plan returned is the fine-tuned one (its
    learned ranges pinned, ``finetune`` in its repairs, so ``repair --plan`` rebuilds it)
    when it measured at least as well as the plan without it, else the plan without it
    (``kept``/``dropped`` say which).
    """
    from quantscope.model.shapes import given_shapes
    from quantscope.plan.search import plan_from_analysis

    options.check_inputs(data=data is not None, stats=stats is not None)
    head = headline(data, options.metric)
    if data is not None or options.metric:  # without data the goal is not measured
        head.check_goal(options.goal)  # before any work: a goal the metric cannot take
    if options.metric is None:
        options = dataclasses.replace(options, metric=head.metric)
    truncated, data = _at_seq_len(data, options.seq_len)  # measured on what that length runs
    finetune, options = _without_finetune(options)
    shapes = given_shapes(model, options.seq_len, options.input_shapes)
    evaluate, offer = None, None
    with engines_made() as engines:  # the measuring engines, for the record
        if data is not None and stats is not None:
            evaluate, offer = _plan_measurement(model, analysis, target, options, data, stats,
                                                shapes=shapes, progress=progress,
                                                cache=cache)
    if options.goal is not None and evaluate is not None:
        uniform = _uniform_if_enough(model, analysis, target, options, head, evaluate, shapes)
        if uniform is not None:  # uniform a8_w8 meets the goal: buy no cost
            uniform = dataclasses.replace(uniform, work=_record_engine(uniform.pareto, engines))
            if truncated:
                uniform.pareto["measured_on"] = truncated
            uniform.pareto["goal"] = goal_verdict(uniform.pareto, head, options.goal)
            return uniform
    engine, ranking, many, racer, raced = _search_tools(model, data, stats, target, options,
                                                        evaluate, executor, progress, engines)
    plan, extra = plan_from_analysis(
        model, analysis, target, min_quality=options.min_quality, max_cost=options.max_cost,
        shapes=shapes, evaluate=ranking, evaluate_many=many, seed=options.seed,
        repairs=offer.options if offer else (), time_budget=_time_budget(options, clock),
        progress=progress, race=racer, measured_metric=options.metric,
        goal=options.goal if evaluate is not None else None, allowed_warnings=options.allowed_warnings)
    pareto = extra["pareto"]
    if raced is not None:
        pareto["race"] = racer.record() if racer is not None else raced
    plan = _label_measured(plan, pareto, options.metric if evaluate is not None else None)
    if engine is not None and evaluate is not None:  # what torch ranked, measured in ORT
        plan = confirm_chosen(plan, pareto, engine, evaluate, progress=progress)
    work = _record_engine(pareto, engines)
    if truncated:
        pareto["measured_on"] = truncated
    if finetune and data is not None and stats is not None:
        tuned, pareto["finetune"] = finetune_chosen(model, data, stats, plan, target, options,
                                                    progress=progress)
        if _keep_finetune(pareto):
            plan = tuned
    if options.goal is not None:
        pareto["goal"] = goal_verdict(pareto, head, options.goal,
                                      done=applied_rewrites(model.proto))
    return PlanResult(plan=plan, pareto=pareto, repairs=tuple(extra.get("repairs", ())),
                      offer=offer, work=work)


def _search_tools(model: Model, data: Dataset | None, stats: Stats | None, target: Target,
                  options: PlanOptions, evaluate: Evaluate | None, executor: Executor | None,
                  progress: bool, engines: Sequence[IncrementalEngine] = ()
                  ) -> tuple[Any, Evaluate | None, Any, Any, Any]:
    """What the search measures with: the ranking engine and its evaluator
    (:func:`_ranking`), the batch measurer on ``executor`` (only when ORT ranks), and the
    race with its record (:func:`_plan_racer`; both None without ``--race``; it shares
    the segment sessions of the evaluator's incremental engine, of ``engines``)."""
    engine, ranking = _ranking(model, data, stats, target, options, evaluate, progress)
    many = (functools.partial(_measure_all, executor, evaluate, progress)
            if evaluate is not None and executor is not None and ranking is evaluate else None)
    racer, raced = (_plan_racer(model, target, options, data, stats, progress=progress,
                                engine=next((e for e in engines if e.model is model), None))
                    if evaluate is not None and options.race is not None else (None, None))
    return engine, ranking, many, racer, raced


INCREMENTAL_ENGINE = ("ort (incremental: each plan runs from its first changed segment; a "
                      "repaired model or one with no cut: a full pass)")


def _record_engine(pareto: dict[str, Any],
                   engines: Sequence[IncrementalEngine]) -> dict[str, Any] | None:
    """Say in the plan file which engine measures the search's plans (``engine``: the same
    text whether the figures were measured now or read from the evaluation cache, so a
    rerun writes the same file), and return what it did this time (its counts and the
    plans it ran in full, with why: :attr:`PlanResult.work`)."""
    if not engines:
        return None
    pareto["engine"] = INCREMENTAL_ENGINE
    counts = engines_counts(engines)
    notes = list(dict.fromkeys(n for e in engines for n in e.notes))
    return {**counts.to_dict(), "notes": notes}


def raced_plan(model: Model, analysis: Sensitivity, target: Target,
               options: PlanOptions = PlanOptions(), *, data: Dataset, stats: Stats,
               confidence: float = 0.95, progress: bool = False) -> PlanResult:
    """:func:`plan_model` with the race on at ``confidence`` (``plan --race``): the
    early-stopped search, for ``bench/search.py`` beside the naive and incremental ones
    (``pareto["race"]`` says what stopped where)."""
    return plan_model(model, analysis, target, dataclasses.replace(options, race=confidence),
                      data=data, stats=stats, progress=progress)


UNIFORM_PLANNER = "quantscope.stages uniform a8_w8 meets the goal/1"


def _time_budget(options: PlanOptions, clock: Callable[[], float] | None) -> TimeBudget | None:
    from quantscope.plan.search import TimeBudget

    if options.budget is None:
        return None
    return TimeBudget(options.budget) if clock is None else TimeBudget(options.budget, clock)


def _uniform_if_enough(model: Model, analysis: Sensitivity, target: Target,
                       options: PlanOptions, head: Headline, evaluate: Evaluate,
                       shapes: dict[str, tuple[int, ...]] | None) -> PlanResult | None:
    """Uniform a8_w8 as the plan when it is legal on ``target``, within ``max_cost`` and
    measures at the goal already (no promotion is bought then); else None (search)."""
    from quantscope.plan.check import check

    if options.max_cost is not None and options.max_cost < 1.0:
        return None
    plan = Plan(default=Precision.A8_W8, target=target.name)
    problems = check(plan, find_groups(model), model, target, shapes=shapes)
    if any(p.severity == "error" for p in problems):
        return None
    value = float(evaluate(plan))
    if not head.reached(value, float(options.goal)):  # type: ignore[arg-type]
        return None
    note = (f"uniform a8_w8 measures {head.metric} {fmt.value(head.metric, value)}, at the goal "
            f"({fmt.goal(head.metric, options.goal, head.higher_is_better)}): it is the plan, "
            "no promotion bought (the search was not run)")
    point = {"cost": 1.0, "predicted": round(analysis.base, 6), "measured": round(value, 6),
             "origin": "start", "step": 0, "groups": {}}
    pareto: dict[str, Any] = {
        "metric": analysis.metric, "higher_is_better": analysis.higher_is_better,
        "budget": {"min_quality": options.min_quality, "max_cost": options.max_cost},
        "met": True, "chosen": {k: point[k] for k in ("cost", "predicted", "measured")},
        "binding": None, "blockers": [], "points": [point], "trials": [point], "skipped": [],
        "notes": [note], "uniform_meets_goal": True,
    }
    meta = (("planner", UNIFORM_PLANNER), ("metric", head.metric),
            ("seed", str(options.seed)), ("cost", "1"), ("measured", f"{value:.6g}"),
            ("note", note))
    plan = Plan(default=Precision.A8_W8, target=target.name, meta=meta)
    # no promotion: an accepted warning lets no group through (said, not left out)
    plan = with_accepted(plan, accepted_record(
        target, {r: () for r in options.allowed_warnings}))
    return PlanResult(plan=plan, pareto=pareto)


def finetune_chosen(
    model: Model, data: Dataset, stats: Stats, plan: Plan, target: Target,
    options: PlanOptions, *, progress: bool = False,
) -> tuple[Plan, dict[str, Any]]:
    """The chosen plan's repairs plus ``finetune``, measured against the original FP32."""
    import time

    from quantscope.repair.apply import run_repairs

    chosen = [r for r in dict(plan.meta).get("repairs", "").split(",") if r]
    names = [*chosen, "finetune"]
    feeds = list(data.calibration)[: options.repair_batches]
    t0 = time.perf_counter()
    out = run_repairs(model, stats, plan, feeds, repairs=names, scheme=target.scheme,
                      task=data.task, progress=progress)
    tuned = load_proto(out.proto, f"{model.source} (repaired: {','.join(names)})")
    ref = run_model(model.proto, list(data.evaluation))
    runs = evaluate_plans(tuned, data, out.stats, {
        "plan": out.plan, "fp32": Plan.uniform(Precision.FLOAT)}, reference_outputs=ref,
        saturation=False, progress=progress)
    before = evaluate_plan(model, data, stats, plan, reference_outputs=ref,
                           saturation=False)["metrics"]
    keys = (options.metric, "embedding_cosine_mean", "recall@1", "sqnr_db")
    rec = next(r for r in out.records if r.name == "finetune")
    result = {
        "metric": options.metric, "repairs": names,
        "before": before.get(options.metric), "after": runs["plan"]["metrics"].get(options.metric),
        "before_metrics": {k: before[k] for k in keys if k in before},
        "after_metrics": {k: runs["plan"]["metrics"][k] for k in keys
                          if k in runs["plan"]["metrics"]},
        "fp32_drift": {k: runs["fp32"]["metrics"][k] for k in keys
                       if k in runs["fp32"]["metrics"]},
        "seconds": round(time.perf_counter() - t0, 1), "record": rec.reason,
        "skipped": rec.skipped,
    }
    meta = (*[(k, v) for k, v in out.plan.meta if k != "repairs"], ("repairs", ",".join(names)))
    return dataclasses.replace(out.plan, meta=meta), result


def plan_lengths(
    model: Model,
    analysis: Sensitivity,
    target: Target,
    options: PlanOptions,
    lengths: Sequence[int],
    *,
    data: Dataset | None = None,
    stats: Stats | None = None,
    progress: bool = False,
    executor: Executor | None = None,
    cache: EvalCache | None = None,
) -> PlanResult:
    """Sequence length as a decision: one search per allowed length (legality depends on
    it: super-defuse binds at 256, not at 128); the result is the best length's plan, and
    ``pareto["seq_lens"]`` has every length's chosen point, what binds there and, for
    text data, the fraction of texts that fit. Best = highest measured quality (predicted
    without data; lowest for a figure where lower is better), ties to the longer length."""
    rows, results = [], {}
    for n in lengths:
        r = plan_model(model, analysis, target, dataclasses.replace(options, seq_len=n),
                       data=data, stats=stats, progress=progress, executor=executor,
                       cache=cache)
        c = r.pareto.get("chosen", {})
        q = c.get("measured") if c.get("measured") is not None else c.get("predicted")
        rows.append({"seq_len": n, "cost": c.get("cost"), "predicted": c.get("predicted"),
                     "measured": c.get("measured"), "binding": r.pareto.get("binding"),
                     "promoted": len(r.plan.overrides), **_fit(data, n)})
        results[n] = (q, r)
    best = best_length({n: q for n, (q, _) in results.items()},
                       higher_is_better=analysis.higher_is_better)
    chosen = results[best][1]
    pareto = {**chosen.pareto, "seq_len": best, "seq_lens": rows}
    return dataclasses.replace(chosen, pareto=pareto)


def best_length(quality: Mapping[int, float | None], *, higher_is_better: bool) -> int:
    """The length whose chosen plan has the best figure (``higher_is_better`` or not); a
    length with no figure (None, or NaN: nothing it could rank) is the worst; ties go to
    the longer length. Before, the highest figure won whatever the metric's direction (a
    loss or a KL ranked backwards) and a NaN compared as neither better nor worse."""
    def rank(n: int) -> tuple[float, int]:
        q = quality[n]
        if q is None or math.isnan(q):
            return (-math.inf, n)
        return (q if higher_is_better else -q, n)
    return max(quality, key=rank)


def _fit(data: Dataset | None, n: int) -> dict[str, float]:
    lengths = None if data is None else data.token_lengths
    if lengths is None or len(lengths) == 0:
        return {}
    return {"texts_fit": float(np.mean(lengths <= n))}


def _ranking(model: Model, data: Dataset | None, stats: Stats | None, target: Target,
             options: PlanOptions, evaluate: Evaluate | None,
             progress: bool) -> tuple[RankEngine | None, Evaluate | None]:
    """The engine that ranks (``options.rank_engine`` resolved here) and its evaluator:
    ``evaluate`` itself for ORT, the torch ranker behind the same repairs otherwise;
    (None, None) when nothing is measured."""
    if evaluate is None:
        return None, None
    engine = resolve_engine(options.rank_engine)
    if engine.name == "ort" or data is None or stats is None:
        return engine, evaluate
    feeds = list(data.calibration)[: options.repair_batches] if options.repairs else ()
    return engine, ranking_evaluator(engine, model, data, stats, str(options.metric),
                                     target=target,
                                     repair=_plan_repair(feeds, target) if feeds else None,
                                     progress=progress)


def _plan_racer(model: Model, target: Target, options: PlanOptions, data: Dataset | None,
                stats: Stats | None, *, progress: bool,
                engine: IncrementalEngine | None = None) -> tuple[Any, dict[str, Any] | None]:
    """The race of ``plan --race`` (:mod:`quantscope.stages.race`) and the plan file's
    ``race`` entry when it cannot run (why, said on stderr too)."""
    from quantscope.plan.race import RaceRule
    from quantscope.stages.race import FULL_SET_NOTE, PlanRacer, race_unsupported

    assert options.metric is not None and options.race is not None
    why = race_unsupported(data, options.metric)
    if why is not None or data is None or stats is None:
        say(why or "race: needs --data and --stats", show=progress)
        return None, {"metric": options.metric, "confidence": options.race,
                      "unsupported": why, "note": FULL_SET_NOTE, "races": []}
    feeds = list(data.calibration)[: options.repair_batches] if options.repairs else []
    racer = PlanRacer(model, data, stats, options.metric, RaceRule(confidence=options.race),
                      scheme=target.scheme, repair=_plan_repair(feeds, target) if feeds else None,
                      progress=progress, engine=engine)
    return racer, {}


def _plan_measurement(
    model: Model,
    analysis: Sensitivity,
    target: Target,
    options: PlanOptions,
    data: Dataset,
    stats: Stats,
    *,
    shapes: dict[str, tuple[int, ...]] | None,
    progress: bool,
    cache: EvalCache | None = None,
) -> tuple[Any, Offer | None]:
    """The planner's real-emulation evaluator, and the measured repair offer if asked."""
    if not options.repairs:
        return plan_evaluator(model, data, stats, options.metric, target=target,
                              cache=cache), None
    ref = run_model(model.proto, list(data.evaluation), label="fp32" if progress else "")
    feeds = list(data.calibration)[: options.repair_batches]
    repair = _plan_repair(feeds, target)  # one for both: plan-free repair steps run once
    offer = plan_repair_offer(model, data, stats, analysis, target, list(options.repairs),
                              feeds, task_metric=options.metric, shapes=shapes,
                              reference_outputs=ref, progress=progress, cache=cache,
                              repair=repair)
    evaluate = plan_evaluator(model, data, stats, options.metric, feeds, target=target,
                              reference_outputs=ref, progress=progress, cache=cache,
                              repair=repair)
    return evaluate, offer
