"""The planner's ranking engine (``--rank-engine``): which engine's figures the search's
refine/compare decisions use, and the chosen plan confirmed in ONNX Runtime.

=============  ======================================================================
ort            the planner's evaluator as it is (``plan_evaluator``): ORT ranks and
               measures; plan.json's ``pareto.engines`` says "ranked and measured by
               onnxruntime"
torch          the search's ``evaluate`` is :class:`quantscope.finetune.rank.TorchMeasure`
               behind the same repair wrapper (``plan.joint.repair_evaluator``), one
               plan at a time (no Ray fan-out); then the chosen plan, with its repairs,
               is measured by the ORT evaluator: ``pareto.chosen.measured`` and the
               plan's meta ``measured`` are ORT's figure, ``pareto.chosen.ranked`` and
               every trial's ``ranked`` torch's, ``pareto.engines`` has both figures
               for the chosen plan and their difference (the ranking's fidelity)
=============  ======================================================================

Torch is imported only when it ranks (or ``auto`` asks whether CUDA is there).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from quantscope import units
from quantscope.finetune.engine import RankEngine
from quantscope.progress import say

if TYPE_CHECKING:
    from quantscope.model.load import Model
    from quantscope.plan.joint import JointRepair
    from quantscope.plan.refine import Evaluate
    from quantscope.targets.profile import Target
    from quantscope.types import Dataset, Outputs, Plan, Stats


def ranking_evaluator(engine: RankEngine, model: Model, data: Dataset, stats: Stats,
                      metric: str, *, target: Target | None, method: str | None = None,
                      repair: JointRepair | None = None,
                      reference_outputs: Outputs | None = None,
                      progress: bool = False) -> Evaluate:
    """``evaluate(plan) -> float`` ranked by torch on ``engine.device`` (``engine`` must be
    torch's): ``metric`` of the plan after its repairs, against the original FP32."""
    from quantscope.finetune.rank import TorchMeasure
    from quantscope.plan.joint import repair_evaluator

    say(f"plan: candidates {engine.line}", show=progress)
    measure = TorchMeasure(model, data, scheme=None if target is None else target.scheme,
                           device=str(engine.device), method=method,
                           reference_outputs=reference_outputs)
    return repair_evaluator(model, stats, metric, measure=measure, repair=repair,
                            progress=progress)


def _point_ranked(point: dict[str, Any]) -> None:
    """A trial's figure came from the ranking engine: ``ranked``, not ``measured``."""
    if point.get("measured") is not None:
        point["ranked"] = point["measured"]
        point["measured"] = None


def confirm_chosen(plan: Plan, pareto: dict[str, Any], engine: RankEngine,
                   measure: Evaluate, *, progress: bool = False) -> Plan:
    """Record ``engine`` in ``pareto["engines"]``; when torch ranked, measure the chosen
    ``plan`` with ``measure`` (ORT) and make that the reported figure (module docstring).
    Returns the plan with its meta ``measured`` (ORT's) and ``ranked`` (torch's)."""
    pareto["engines"] = engine.to_dict()
    chosen = pareto.get("chosen", {})
    ranked = chosen.get("measured")
    if engine.name == "ort" or ranked is None:
        return plan
    say(f"plan: measuring the chosen plan in onnxruntime (ranked by {engine.ranked_by})",
        show=progress)
    value = round(float(measure(plan)), 6)
    for key in ("points", "trials"):
        for p in pareto.get(key, []):
            mine = p.get("measured") == ranked and p.get("cost") == chosen.get("cost")
            _point_ranked(p)
            if mine:
                p["measured"] = value
    diff = round(ranked - value, 6)
    chosen.update(measured=value, ranked=ranked)
    pareto["engines"].update(ranked=ranked, measured=value, difference=diff)
    m = str(pareto.get("measured_metric") or pareto.get("metric") or "")  # their unit
    pareto.setdefault("notes", []).append(
        f"{engine.line}: the chosen plan measures {units.value(m, value, fine=True)} in "
        f"onnxruntime, {units.value(m, ranked, fine=True)} ranked by {engine.ranked_by} "
        f"(difference {units.gain(m, diff, fine=True)}); the other "
        "trials' figures are the ranking engine's ('ranked')")
    meta = tuple((k, v) for k, v in plan.meta if k not in ("measured", "ranked", "ranked_by"))
    meta += (("measured", f"{value:.6g}"), ("ranked", f"{ranked:.6g}"),
             ("ranked_by", engine.ranked_by))
    return dataclasses.replace(plan, meta=meta)

