"""Repairs x precisions: repairs offered to the search as moves, measured, applied when scored.

The search (:mod:`quantscope.plan.search`) takes :class:`~quantscope.plan.start.RepairOption`
moves next to the promotions. This module makes those options from real measurements and
scores plans that carry repairs. It measures and repairs only through the two callables
its caller passes in (:class:`Measure`, :class:`JointRepair`; :mod:`quantscope.stages` binds
them to ``evaluate_plan`` and ``run_repairs``), so the planner imports neither
evaluation nor the repairs:

=================  ===================================================================
offer              each requested repair is applied alone to the start plan (uniform
                   ``low``) and measured with real emulation against the ORIGINAL FP32
                   model; its ``gain`` is the measured change of the analysis' metric
                   (output SQNR of the embeddings, dB, for ``quantscope analyze``
                   files), its ``cost`` the change of the target's cost model on the
                   repaired graph (non-zero only when a repair widens layers:
                   ``split``); a repair that changes nothing or does not help is not
                   offered, and the output says why
greedy             repairs and promotions compete by predicted gain per unit of cost
                   (a zero-cost repair with a gain goes first)
score              :func:`repair_evaluator`: a plan whose meta lists repairs is scored
                   after ``repair`` for THAT plan
                   (bias correction, AdaRound and range choice depend on the
                   precisions), on the repaired model, against the original FP32
drop               the refinement also tries removing each chosen repair and keeps the
                   removal when the measurement does not get worse
=================  ===================================================================

So the chosen plan is the best measured (precisions, repairs) pair the search visited.
``check`` runs on every emitted plan against the ORIGINAL graph: repairs keep op types and
names, but ``split`` widens a few layers by some channels, which size-based rules
(super-defuse) do not see there; run ``quantscope check`` on the repaired model too.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.model.shapes import Shapes
from quantscope.plan.cost import cost_breakdown
from quantscope.plan.refine import Evaluate
from quantscope.plan.start import RepairOption
from quantscope.progress import say
from quantscope.targets.profile import Target
from quantscope.tasks.db_noise import LeftOut, Parts
from quantscope.tasks.shares import items_key
from quantscope.types import Plan, Precision, QuantscopeError, Sensitivity, Stats
from quantscope.units import value

# the analysis' predicted metric and the evaluation metrics that measure the same thing:
# with a task, the embeddings the analysis pooled; without one, the raw outputs
SAME_METRIC = {"output_sqnr_db": ("embedding_sqnr_db", "sqnr_db")}


class Measure(Protocol):
    """Metrics of ``plan`` on ``model`` (with ``stats``) by real emulation, against the
    ORIGINAL model's FP32 outputs; the caller binds the data and that reference."""

    def __call__(self, model: Model, stats: Stats, plan: Plan) -> Mapping[str, float]: ...


@dataclass(frozen=True, eq=False)
class Repaired:
    """A repaired FP32 model with its statistics and plan, and what each repair did."""

    model: Model
    stats: Stats
    plan: Plan
    records: tuple[RepairRecordLike, ...]


class RepairRecordLike(Protocol):
    """What the offer reads of a repair's record (``repair.apply.RepairRecord``)."""

    changed: tuple[str, ...]
    skipped: str | None


class JointRepair(Protocol):
    """The repairs ``names`` applied to ``model`` for ``plan``; the caller binds the
    calibration feeds and the quantization scheme."""

    def __call__(
        self, model: Model, stats: Stats, plan: Plan, names: Sequence[str]
    ) -> Repaired: ...


# the old name, kept for ``stages/plan.py`` (``repair.Repair`` is the graph repair; this
# is the callable the joint search is given): use :class:`JointRepair`
Repair = JointRepair


@dataclass(frozen=True)
class Offer:
    """Repair options for the search plus what was measured for every requested repair."""

    options: tuple[RepairOption, ...]
    measured: tuple[dict[str, Any], ...]
    notes: tuple[str, ...]


def _repaired(repair: JointRepair, model: Model, stats: Stats, plan: Plan,
              names: Sequence[str]) -> Repaired:
    out = repair(model, stats, plan, names)
    return replace(out, plan=replace(out.plan, meta=plan.meta))


def _cost_units(model: Model, plan: Plan, target: Target, shapes: Shapes | None) -> float:
    return float(sum(cost_breakdown(plan, find_groups(model), target, shapes,
                                    model=model).values()))


def _say(progress: bool, text: str) -> None:
    say(f"plan: {text}", show=progress)


def repair_evaluator(
    model: Model,
    stats: Stats,
    metric: str,
    *,
    measure: Measure,
    repair: JointRepair | None = None,
    progress: bool = False,
) -> Evaluate:
    """``evaluate(plan) -> float``: ``metric`` of ``plan``, after its repairs (meta
    ``repairs``; ``repair`` is needed only for plans that list some). After each call its
    ``items`` is the count of the items the figure is a share over, where the task counts
    them (``KEY_items``: the noise of the figure, :func:`quantscope.plan.pareto.noise`),
    else None; its ``parts`` the per-sample powers of a dB figure where the measurement
    kept them (:func:`sample_parts`), else None."""

    start, done = time.perf_counter(), [0]

    def run(plan: Plan) -> float:
        each = f", {(time.perf_counter() - start) / done[0]:.1f} s per plan" if done[0] else ""
        done[0] += 1
        _say(progress, f"measuring plan {done[0]}{each}")
        names = [n for n in dict(plan.meta).get("repairs", "").split(",") if n]
        m, s, p = model, stats, plan
        if names and repair is None:
            raise QuantscopeError("the plan lists repairs but no calibration feeds were given")
        if names and repair is not None:
            _say(progress, f"measuring with repairs {','.join(names)}")
            out = _repaired(repair, model, stats, plan, names)
            m, s, p = out.model, out.stats, out.plan
        metrics = measure(m, s, p)
        if metric not in metrics:
            raise QuantscopeError(f"--metric '{metric}' is no figure of this data's task: "
                                  f"use one of {', '.join(sorted(metrics))}")
        evaluate.items = metrics.get(items_key(metric))
        evaluate.parts = sample_parts(metrics, metric)
        left = getattr(metrics, "left", None)
        evaluate.left = left.get(metric) if isinstance(left, Mapping) else None
        return float(metrics[metric])

    evaluate = Counted(run)
    return evaluate


def sample_parts(metrics: Mapping[str, Any], metric: str) -> Parts | None:
    """The per-sample powers of ``metric`` that a measurement kept beside its figures
    (``metrics.parts``, a mapping metric -> :class:`quantscope.tasks.db_noise.Parts`:
    :func:`quantscope.analyze.measure.evaluate_plans` with ``sample_parts``); None: none."""
    parts = getattr(metrics, "parts", None)
    got = parts.get(metric) if isinstance(parts, Mapping) else None
    return got if isinstance(got, Parts) else None


class Counted:
    """An evaluator that says the items its last figure is a share over (``items``: the
    task's ``KEY_items``; None: not counted) and the per-sample powers of its last dB
    figure (``parts``; None: not kept) and a share's values with each unit left out
    (``left``: face data's people; None: not computed), which the refinement reads after
    each call."""

    def __init__(self, run: Evaluate) -> None:
        self.run, self.items = run, None
        self.parts: Parts | None = None
        self.left: LeftOut | None = None

    def __call__(self, plan: Plan) -> float:
        return self.run(plan)


@dataclass(frozen=True)
class _Baseline:
    start: Plan
    metrics: Mapping[str, float]
    key: str  # the evaluation metric that measures the analysis' metric
    cost: float  # cost units of the start plan on the original model
    unit: float  # cost units of uniform a8_w8 on the original model


def _offer_one(
    name: str, base: _Baseline, model: Model, stats: Stats, sens: Sensitivity, target: Target,
    *, measure: Measure, repair: JointRepair, task_metric: str, shapes: Shapes | None,
) -> tuple[dict[str, Any], RepairOption | None, str | None]:
    """What ``name`` alone does to uniform ``low``: the row, the option or why not."""
    out = _repaired(repair, model, stats, base.start, (name,))
    changed = [t for r in out.records for t in r.changed]
    if not changed:
        why = next((r.skipped for r in out.records if r.skipped), "no site")
        note = f"repair {name}: changed nothing ({why})"
        return {"name": name, "changed": 0, "note": why}, None, note
    key, before, after = base.key, base.metrics, measure(out.model, out.stats, out.plan)
    gain = (1.0 if sens.higher_is_better else -1.0) * (after[key] - before[key])
    units = _cost_units(out.model, base.start, target, shapes)
    cost = (units - base.cost) / base.unit if base.unit > 0 else 0.0
    row = {"name": name, "changed": len(changed), "gain": round(gain, 6),
           "cost": round(cost, 6), key: [round(before[key], 6), round(after[key], 6)]}
    shown = [key]
    if task_metric in after and task_metric != key:
        row[task_metric] = [round(before[task_metric], 6), round(after[task_metric], 6)]
        shown.append(task_metric)
    reason = (f"measured on uniform {sens.low.value}: "
              + ", ".join(f"{k} {value(k, before[k])} -> {value(k, after[k])}" for k in shown)
              + f"; {len(changed)} tensor(s) changed")
    if gain <= 0:
        return row, None, f"repair {name}: not offered, no measured gain ({reason})"
    return row, RepairOption(name, gain=gain, cost=max(cost, 0.0), reason=reason), None


def offer_repairs(
    model: Model,
    stats: Stats,
    sens: Sensitivity,
    target: Target,
    names: Sequence[str],
    *,
    measure: Measure,
    repair: JointRepair,
    task_metric: str,
    shapes: Shapes | None = None,
    progress: bool = False,
) -> Offer:
    """Measure every repair in ``names`` alone on uniform ``sens.low`` (module docstring)."""
    start = Plan(default=sens.low, target=target.name)
    metrics = measure(model, stats, start)
    key = next((k for k in SAME_METRIC.get(sens.metric, (sens.metric,)) if k in metrics), "")
    if not key:
        raise QuantscopeError(
            f"the analysis predicts '{sens.metric}', which evaluation does not measure "
            f"(has {', '.join(sorted(metrics))}): plan without --repairs"
        )
    base = _Baseline(start, metrics, key, _cost_units(model, start, target, shapes),
                     _cost_units(model, Plan.uniform(Precision.A8_W8), target, shapes))
    options, measured, notes = [], [], []
    for name in names:
        _say(progress, f"measuring repair {name} on uniform {sens.low.value}")
        row, option, note = _offer_one(name, base, model, stats, sens, target, measure=measure,
                                       repair=repair, task_metric=task_metric, shapes=shapes)
        measured.append(row)
        options += [option] if option else []
        notes += [note] if note else []
    return Offer(tuple(options), tuple(measured), tuple(notes))
