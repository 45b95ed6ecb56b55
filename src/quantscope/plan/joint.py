"""Repairs x precisions: repairs offered to the search as moves, measured, applied when scored.

The search (:mod:`quantscope.plan.search`) takes :class:`~quantscope.plan.greedy.RepairOption`
moves next to the promotions. This module makes those options from real measurements and
scores plans that carry repairs:

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
                   after :func:`~quantscope.repair.apply.apply_repairs` for THAT plan
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

import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from quantscope.model.groups import find_groups
from quantscope.model.load import Model, load_proto
from quantscope.plan.cost import cost_breakdown
from quantscope.plan.greedy import RepairOption
from quantscope.plan.refine import Evaluate
from quantscope.plan.sensitivity import Sensitivity
from quantscope.targets.profile import Target
from quantscope.types import Plan, Precision, QuantscopeError, Stats

Batch = dict[str, np.ndarray]
# the analysis' predicted metric and the evaluation metrics that measure the same thing:
# with a task, the embeddings the analysis pooled; without one, the raw outputs
SAME_METRIC = {"output_sqnr_db": ("embedding_sqnr_db", "sqnr_db")}


@dataclass(frozen=True)
class Offer:
    """Repair options for the search plus what was measured for every requested repair."""

    options: tuple[RepairOption, ...]
    measured: tuple[dict[str, Any], ...]
    notes: tuple[str, ...]


def _repaired(model: Model, stats: Stats, plan: Plan, feeds: Sequence[Batch],
              names: Sequence[str], target: Target | None) -> tuple[Model, Stats, Plan, tuple]:
    from quantscope.repair.apply import apply_repairs

    scheme = None if target is None else target.scheme
    out = apply_repairs(model, stats, plan, feeds, repairs=names, scheme=scheme)
    repaired = load_proto(out.proto, f"{model.source} (repaired: {','.join(names)})")
    return repaired, out.stats, replace(out.plan, meta=plan.meta), out.records


def _cost_units(model: Model, plan: Plan, target: Target, shapes: dict | None) -> float:
    return float(sum(cost_breakdown(plan, find_groups(model), target, shapes,
                                    model=model).values()))


def repair_evaluator(
    model: Model,
    data: Any,
    stats: Stats,
    metric: str,
    feeds: Sequence[Batch] = (),
    *,
    target: Target | None = None,
    method: str | None = None,
    reference_outputs: Any = None,
    progress: bool = False,
) -> Evaluate:
    """``evaluate(plan) -> float``: real emulation, after the plan's repairs (meta ``repairs``).

    The FP32 reference is the original model (bias correction and AdaRound change the FP32
    function on purpose); its outputs are computed once. ``feeds``: the calibration
    batches the repairs use (needed only for plans that list repairs).
    """
    from quantscope.emulate.evaluate import run_model
    from quantscope.stages import evaluate_plan

    ref = reference_outputs or run_model(model.proto, list(data.evaluation))

    def run(plan: Plan) -> float:
        names = [n for n in dict(plan.meta).get("repairs", "").split(",") if n]
        m, s, p = model, stats, plan
        if names and not feeds:
            raise QuantscopeError("the plan lists repairs but no calibration feeds were given")
        if names:
            if progress:
                print(f"plan: measuring with repairs {','.join(names)} …", file=sys.stderr,
                      flush=True)
            m, s, p, _ = _repaired(model, stats, plan, feeds, names, target)
        metrics = evaluate_plan(m, data, s, p, method=method,
                                scheme=None if target is None else target.scheme,
                                reference_outputs=ref)["metrics"]
        if metric not in metrics:
            raise QuantscopeError(f"metric '{metric}' not among {', '.join(sorted(metrics))}")
        return float(metrics[metric])

    return run


def offer_repairs(
    model: Model,
    data: Any,
    stats: Stats,
    sens: Sensitivity,
    target: Target,
    names: Sequence[str],
    feeds: Sequence[Batch],
    *,
    task_metric: str,
    shapes: dict | None = None,
    method: str | None = None,
    reference_outputs: Any = None,
    progress: bool = False,
) -> Offer:
    """Measure every repair in ``names`` alone on uniform ``sens.low`` (module docstring)."""
    from quantscope.emulate.evaluate import run_model
    from quantscope.repair.apply import REPAIRS
    from quantscope.stages import evaluate_plan

    unknown = [n for n in names if n not in REPAIRS]
    if unknown:
        raise QuantscopeError(f"unknown repair '{unknown[0]}': use {', '.join(REPAIRS)}")
    ref = reference_outputs or run_model(model.proto, list(data.evaluation))
    start = Plan(default=sens.low, target=target.name)
    base = evaluate_plan(model, data, stats, start, method=method, scheme=target.scheme,
                         reference_outputs=ref)["metrics"]
    key = next((k for k in SAME_METRIC.get(sens.metric, (sens.metric,)) if k in base), "")
    if not key:
        raise QuantscopeError(
            f"the analysis predicts '{sens.metric}', which evaluation does not measure "
            f"(has {', '.join(sorted(base))}): plan without --repairs"
        )
    base_cost = _cost_units(model, start, target, shapes)
    a8 = _cost_units(model, Plan.uniform(Precision.A8_W8), target, shapes)
    sign = 1.0 if sens.higher_is_better else -1.0
    options, measured, notes = [], [], []
    for name in names:
        if progress:
            print(f"plan: measuring repair {name} on uniform {sens.low.value} …",
                  file=sys.stderr, flush=True)
        m, s, p, records = _repaired(model, stats, start, feeds, (name,), target)
        changed = [t for r in records for t in r["changed"]]
        if not changed:
            why = next((x for r in records for x in r["skipped"]), "no site")
            notes.append(f"repair {name}: changed nothing ({why})")
            measured.append({"name": name, "changed": 0, "note": why})
            continue
        after = evaluate_plan(m, data, s, p, method=method, scheme=target.scheme,
                              reference_outputs=ref)["metrics"]
        gain = sign * (after[key] - base[key])
        cost = (_cost_units(m, start, target, shapes) - base_cost) / a8 if a8 > 0 else 0.0
        row = {"name": name, "changed": len(changed), "gain": round(gain, 6),
               "cost": round(cost, 6), key: [round(base[key], 6), round(after[key], 6)]}
        if task_metric in after and task_metric != key:
            row[task_metric] = [round(base[task_metric], 6), round(after[task_metric], 6)]
        measured.append(row)
        reason = (f"measured on uniform {sens.low.value}: {key} {base[key]:.4g} -> "
                  f"{after[key]:.4g}" + (f", {task_metric} {base[task_metric]:.4g} -> "
                                          f"{after[task_metric]:.4g}"
                                          if task_metric in after and task_metric != key
                                          else "") + f"; {len(changed)} tensor(s) changed")
        if gain <= 0:
            notes.append(f"repair {name}: not offered, no measured gain ({reason})")
            continue
        options.append(RepairOption(name, gain=gain, cost=max(cost, 0.0), reason=reason))
    return Offer(tuple(options), tuple(measured), tuple(notes))
