"""One plan, every phase graph of a decoder: legality and cost per phase.

A plan names groups by layer name; the prefill and decode graphs have the same names,
so the same plan applies to both. Legality differs by phase: a 16-bit activation tensor
is N x hidden values in prefill but 1 x hidden in decode (``hailo.super_defuse``), and
the KV cache is N tokens long in both. The cost is each phase's own (relative to that
phase's uniform a8_w8); decode reads every weight for one token, so its cost also
charges the weight bytes at the plan's precisions (:data:`WEIGHT_BOUND_PHASES`): 4-bit
weights (a8_w4) halve them.
"""

from __future__ import annotations

from dataclasses import dataclass

from quantscope.model.groups import check_plan_names, find_groups
from quantscope.model.load import Model
from quantscope.model.phases import phase_shapes
from quantscope.plan.check import check
from quantscope.plan.cost import plan_cost, weight_bytes
from quantscope.plan.op_support import op_problems
from quantscope.targets.profile import Target
from quantscope.types import Plan, Problem

# phases that read every weight for one token: their cost charges the weight bytes
# (``plan_cost(weight_reads=True)``, the target's ``cost.weight_byte_macs``)
WEIGHT_BOUND_PHASES = frozenset({"decode"})


@dataclass(frozen=True)
class PhaseCheck:
    phase: str
    seq_len: int
    problems: tuple[Problem, ...]
    cost: float  # relative to this phase's uniform a8_w8
    weight_bytes: float = 0.0  # the weighted groups' weights at the plan's precisions

    @property
    def errors(self) -> int:
        return sum(p.severity == "error" for p in self.problems)


def check_phases(plan: Plan, models: dict[str, Model], target: Target,
                 seq_len: int) -> tuple[PhaseCheck, ...]:
    """Check ``plan`` on each phase graph at ``seq_len`` prompt / cache tokens (each phase
    with its own overrides, :meth:`quantscope.types.Plan.for_phase`)."""
    out = []
    for phase, model in models.items():
        own = plan.for_phase(phase)
        groups = find_groups(model)
        check_plan_names(own, groups)
        shapes = phase_shapes(model, phase, seq_len)
        problems = op_problems(model, target, shapes) + check(own, groups, model, target,
                                                              shapes=shapes)
        cost = plan_cost(own, groups, target, shapes, model=model,
                         weight_reads=phase in WEIGHT_BOUND_PHASES)
        out.append(PhaseCheck(phase, seq_len, tuple(problems), cost,
                              weight_bytes(own, groups, model)))
    return tuple(out)


__all__ = ["WEIGHT_BOUND_PHASES", "PhaseCheck", "check_phases"]
