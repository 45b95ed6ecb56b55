"""Where a plan's error is (``quantscope whatif``): the plan with each op kind it keeps
below 16 bit lifted to a16_w16, and the headroom (the plan's own error scaled down).

Moved here from ``quantscope.stages`` (which re-exports every name).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Any

from quantscope.analyze.incremental import IncrementalEngine
from quantscope.analyze.measure import evaluate_plans, headline
from quantscope.analyze.report import Figure
from quantscope.emulate.evaluate import run_model
from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.types import Dataset, Outputs, Plan, Precision, QuantscopeError, Stats

WHATIF_KEYS = ("embedding_cosine_mean", "recall@1", "sqnr_db")  # shown beside the metric
# factors the plan's own error is scaled by (whatif's headroom rows)
ERROR_SCALES = (0.7, 0.5, 0.35, 0.25, 0.18, 0.12, 0.08, 0.05)


def needed_scale(rows: Sequence[dict[str, Any]], metric: str, goal: float, at_one: float,
                 ) -> float | None:
    """The error scale at which ``metric`` reaches ``goal`` (higher is better), interpolated
    linearly in log(scale) between the measured rows (scale 1 is ``at_one``): 1.0 when the
    plan meets it already, None when even the smallest measured scale misses it."""
    pts = sorted([(1.0, at_one), *((float(r["scale"]), float(r[metric])) for r in rows)],
                 reverse=True)
    if at_one >= goal:
        return 1.0
    for (s0, v0), (s1, v1) in itertools.pairwise(pts):
        if v1 >= goal:
            t = 0.0 if v1 == v0 else (goal - v0) / (v1 - v0)
            return float(math.exp(math.log(s0) + t * (math.log(s1) - math.log(s0))))
    return None


def _g(key: str, v: float) -> str:
    return f"{v:g}"


def _headroom(plan_run: dict[str, Any], metric: str, goal: float | None,
              figure: Figure = _g) -> dict[str, Any] | None:
    rows = plan_run.get("error_scales")
    if not rows or metric not in rows[0]:
        return None
    keys = (metric, *(k for k in WHATIF_KEYS if k in rows[0] and k != metric))
    out: dict[str, Any] = {
        "rows": [{"scale": r["scale"], **{k: r[k] for k in keys}} for r in rows],
        "note": "the plan's own error in the task's outputs (FP32 + s x (plan - FP32)), s "
                "times as large: how far the goal is, in one number; a real fix leaves "
                "an error of another shape, so this is a yardstick, not a forecast"}
    if goal is not None:
        need = needed_scale(rows, metric, goal, plan_run["metrics"][metric])
        out.update(goal=goal, needed=need)
        out["sentence"] = headroom_sentence(metric, out, figure)
    return out


def whatif_families(model: Model, data: Dataset, stats: Stats, plan: Plan, *,
                    metric: str | None = None, method: str | None = None,
                    progress: bool = False,
                    reference_outputs: Outputs | None = None,
                    plan_result: dict[str, Any] | None = None,
                    goal: float | None = None, figure: Figure = _g) -> dict[str, Any]:
    """Where a plan's error is, measured: the plan, then the plan with every group of one
    op kind that it keeps below 16 bit lifted to a16_w16 (legality and cost aside), one
    kind at a time, then all of them at once (the plan's 16-bit ceiling).

    With task data, also the headroom: the metric with the plan's own error scaled by each
    of :data:`ERROR_SCALES` (no extra model run) and, with ``goal``, the scale at which the
    metric reaches it ("the error must shrink to 0.5x"; ``figure`` writes the goal in the
    sentence: the CLI passes ``report.fmt.value``, shares in percent). ``plan_result`` must then carry
    ``error_scales`` (evaluate it with ``error_scales=ERROR_SCALES``) or none are shown.

    One evaluation per kind (FP32 runs once; ``plan_result``: the plan's own evaluation on
    the same rows, when the caller has it, is not run again). The gains are not additive: a kind whose
    lift gains little is not what binds; when every kind gains little and all together gain
    much, the error is spread over the whole graph.
    """
    from quantscope.targets.profile import op_kind

    head = headline(data, metric)
    head.check_goal(goal)
    metric = head.metric
    low: dict[str, list[str]] = {}
    for g in find_groups(model).groups:
        p = plan.precision_of(g.name)
        if p.act_bits is None:
            continue  # float: nothing to lift
        if p.act_bits < 16 or (p.weight_bits is not None and p.weight_bits < 16):
            low.setdefault(op_kind(g), []).append(g.name)
    if not low:
        raise QuantscopeError("the plan keeps no group below 16 bit: nothing to lift")

    def lifted(names: list[str]) -> Plan:
        keep = [(n, q) for n, q in plan.overrides if n not in set(names)]
        return dataclasses.replace(plan, overrides=(*keep, *((n, Precision.A16_W16)
                                                             for n in names)))

    plans = {**{k: lifted(v) for k, v in sorted(low.items())},
             "all": lifted([n for v in low.values() for n in v])}
    # the plans share every segment a lifted kind leaves alone: run them incrementally
    engine = IncrementalEngine(model, data.evaluation, method=method)
    if plan_result is None:  # the plan itself, with its headroom rows
        reference_outputs = reference_outputs or run_model(
            model.proto, list(data.evaluation), label="fp32" if progress else "")
        plan_result = evaluate_plans(model, data, stats, {"plan": plan}, method=method,
                                     saturation=False, progress=progress,
                                     reference_outputs=reference_outputs,
                                     error_scales=ERROR_SCALES, engine=engine)["plan"]
    runs = evaluate_plans(model, data, stats, plans, method=method, saturation=False,
                          progress=progress, reference_outputs=reference_outputs, engine=engine)
    runs["plan"] = plan_result
    if metric not in runs["plan"]["metrics"]:
        raise QuantscopeError(f"metric '{metric}' is not measured on this data: use one of "
                              + ", ".join(sorted(runs["plan"]["metrics"])))

    def row(name: str) -> dict[str, Any]:
        m = runs[name]["metrics"]
        return {metric: m[metric], **{k: m[k] for k in WHATIF_KEYS if k in m and k != metric},
                "gain": m[metric] - runs["plan"]["metrics"][metric]}

    return {"metric": metric, "plan": row("plan"),
            "kinds": [{"kind": k, "groups": len(v), **row(k)} for k, v in sorted(low.items())],
            "all": {"groups": sum(len(v) for v in low.values()), **row("all")},
            "note": "legality and cost aside: each row lifts one op kind's groups below 16 "
                    "bit to a16_w16; gains are not additive",
            **({"headroom": h} if (h := _headroom(runs["plan"], metric, goal, figure)) else
               {"headroom_note": "the goal was not placed: how far it is needs task data "
                                 "(text pairs, faces); scaling a tensor model's error by s "
                                 "adds exactly 20*log10(1/s) dB of SQNR"}
               if goal is not None else {})}

def headroom_sentence(metric: str, h: dict[str, Any], figure: Figure = _g) -> str:
    """One line: how much smaller the plan's error must be for the goal (written by
    ``figure``: analyze sits below report, so the caller passes ``report.fmt.value``)."""
    need, goal = h.get("needed"), figure(metric, h["goal"])
    if need is None:
        return (f"{metric} {goal} is not reached even at x{h['rows'][-1]['scale']:g} of the "
                "plan's error")
    if need >= 1.0:
        return f"the plan meets {metric} {goal}"
    return (f"{metric} {goal} needs the plan's error at x{need:.2g} or less "
            f"({1 / need:.1f} times smaller; interpolated between measured scales)")
