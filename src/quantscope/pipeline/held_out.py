"""Whether the held-out data contradict the plan's price: the plan that ships measured
worse held out than uniform a8_w8 (the cost unit, never dearer) beyond the noise of the
difference, which ``run``'s verdict says with what to do.

============  ==============================================================================
chosen on     the FIT data, always: choosing between the plan and a8_w8 on the held-out
              data would make the held-out figure of what ships no longer held out (the
              choice would be fitted to it), so the held-out data only *contradict*
compared     the plan's and uniform a8_w8's held-out figure of the headline metric, in its
              direction; only where the plan costs more than a8_w8 (1.0x) and the search
              did not find a8_w8 enough for the goal already (then the plan is a8_w8)
noise         a share the task counts items for (``KEY_items`` in both figures): the
              one-sided 95 % binomial noise of the difference
              (:func:`quantscope.tasks.shares.share_noise`); a figure in dB: the 0.1 dB
              margin the auto rewrites use (:data:`quantscope.rewrites.tie.TIE_MARGIN`; no
              noise estimate without per-sample figures, said); any other figure: none
said          ``verdict.json`` ``worse_held_out`` (figures, margin, ``beyond_noise``, line)
              and the verdict's plan line: "held out, the plan is worse than uniform a8_w8
              by X (...; beyond noise: ...): ship uniform a8_w8 or add data"; worse within
              noise is said with its noise
============  ==============================================================================
"""

from __future__ import annotations

from typing import Any

from quantscope.rewrites.tie import TIE_MARGIN
from quantscope.tasks.shares import items_key, share_noise
from quantscope.units import gain, is_db, value

UNIFORM_COST = 1.0  # uniform a8_w8: the cost unit


def worse_held_out(metric: str, unit: str, quality: dict[str, dict[str, Any]],
                   plan_cost: float | None, *, higher: bool,
                   uniform_meets_goal: bool) -> dict[str, Any] | None:
    """The record when the plan, dearer than uniform a8_w8, is worse held out
    (``beyond_noise``: by more than the margin, module table), else None."""
    plan, uni = (quality.get(k, {}) for k in ("plan", "a8_w8"))
    p, u = plan.get(metric), uni.get(metric)
    if p is None or u is None or plan_cost is None or uniform_meets_goal \
            or plan_cost <= UNIFORM_COST + 1e-9:
        return None
    margin, noise = _margin(metric, unit, plan, uni)
    worse_by = (u - p) if higher else (p - u)
    if not worse_by > 0:
        return None
    if not worse_by > margin:
        return {"plan": p, "a8_w8": u, "worse_by": worse_by, "margin": margin, "noise": noise,
                "plan_cost": plan_cost, "beyond_noise": False,
                "line": f"held out, the plan is {gain(metric, p - u)} against uniform "
                        f"a8_w8 (chosen on the fit data; within {noise})"}
    line = (f"held out, the plan is worse than uniform a8_w8 by "
            f"{gain(metric, worse_by).lstrip('+')} "
            f"({value(metric, p)} at {plan_cost:.3f}x against {value(metric, u)} at 1x; "
            f"beyond {noise}): ship uniform a8_w8 or add data (the plan was chosen "
            "on the fit data; choosing on the held-out data would leave no held-out figure)")
    return {"plan": p, "a8_w8": u, "worse_by": worse_by, "margin": margin, "noise": noise,
            "plan_cost": plan_cost, "beyond_noise": True, "line": line}


def _margin(metric: str, unit: str, plan: dict[str, Any], uni: dict[str, Any]
            ) -> tuple[float, str]:
    """(how much worse is still noise, its words) for this metric's two held-out figures."""
    key = items_key(metric)
    if plan.get(key) and uni.get(key):
        half = share_noise(float(uni[metric]), float(plan[metric]), int(uni[key]), "items",
                           n_after=int(plan[key]))
        if half is not None:
            return half
    if unit == "dB" or is_db(metric):
        return TIE_MARGIN, (f"the {TIE_MARGIN:g} dB margin, no noise estimate of a figure in "
                            "dB")
    return 0.0, "any difference: no noise estimate of this figure"
