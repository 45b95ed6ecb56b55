"""Which groups the planner can use an analysis' gain of: the analysis sweeps only those.

The planner reads one number per group from the analysis: the gain of promoting that
group alone from ``low`` to ``high`` (the disable-one sweep; ``serde.read_sensitivity``).
It cannot use that gain when

=====================  ================================================================
``high`` is illegal    a local rule of the target (one whose verdict depends only on the
                       group and its precision: ``plan.check.LOCAL_CHECKS``, or the
                       target's precision table) refuses the group at ``high``: the
                       planner never makes that move
``low`` is illegal     a local rule refuses the group at ``low``: the planner's legal
                       start raises it, and a gain measured over ``low`` is no gain over
                       the precision it starts at
=====================  ================================================================

A rule that cannot be evaluated for want of a size (no ``--seq-len``) skips nothing: only
certain refusals leave a group out. Both are found with one ``check`` of the uniform plan
at each precision (a local rule's verdict on a group does not depend on the others).
"""

from __future__ import annotations

from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.model.shapes import given_shapes
from quantscope.plan.check import BUILTIN_RULES, LOCAL_CHECKS, blocker_label, check
from quantscope.targets import Target
from quantscope.types import Groups, Plan, Precision


def unusable_groups(
    model: Model,
    target: Target | None,
    *,
    low: Precision,
    high: Precision,
    groups: Groups | None = None,
    seq_len: int | None = None,
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = (),
) -> dict[str, str]:
    """Group -> why the planner cannot use its gain (module docstring); empty without a
    target."""
    if target is None:
        return {}
    groups = groups or find_groups(model)
    shapes = given_shapes(model, seq_len, input_shapes)
    local = {r.id for r in target.rules if r.check in LOCAL_CHECKS} | BUILTIN_RULES
    out: dict[str, str] = {}
    for prec, why in ((low, f"{low} is illegal on {target.name}, the planner starts it "
                            "higher"),
                      (high, f"{high} is illegal on {target.name}")):
        plan = Plan.uniform(prec)
        for p in check(plan, groups, model, target, shapes=shapes):
            if (p.severity == "error" and p.rule in local and blocker_label(p) == p.rule
                    and p.group not in out):
                out[p.group] = f"{why} ({p.rule})"
    return out
