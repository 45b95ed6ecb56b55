"""One plan, every phase graph of a decoder: legality and cost per phase.

A plan names groups by layer name; the prefill and decode graphs have the same names,
so the same plan applies to both. Legality differs by phase: a 16-bit activation tensor
is N x hidden values in prefill but 1 x hidden in decode (``hailo.super_defuse``), and
the KV cache is N tokens long in both. The cost is each phase's own (relative to that
phase's uniform a8_w8); decode reads every weight for one token, so its cost also
charges the weight bytes at the plan's precisions (:data:`WEIGHT_BOUND_PHASES`): 4-bit
weights (a8_w4) halve them.

What makes a plan illegal on a phase is the planner's one rule
(:func:`quantscope.plan.start.blocks`: an error, or a warning that applies and whose
rule ``--allow-warning`` does not accept), screened by :class:`PhaseScreen`: as the
encoder search's start plan's own problems (:meth:`quantscope.plan.start.Legality.refuses`),
a warning the uniform a8_w8 plan already carries in that phase (the model's ``ops.*``
notes, which no plan changes) blocks nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from quantscope.model.groups import check_plan_names, find_groups
from quantscope.model.load import Model
from quantscope.model.phases import phase_shapes
from quantscope.plan.accepted import accepted_record
from quantscope.plan.check import check
from quantscope.plan.cost import plan_cost, weight_bytes
from quantscope.plan.op_support import op_problems
from quantscope.plan.start import blocks, lets_through
from quantscope.targets.profile import Target
from quantscope.types import Plan, Precision, Problem

# phases that read every weight for one token: their cost charges the weight bytes
# (``plan_cost(weight_reads=True)``, the target's ``cost.weight_byte_macs``)
WEIGHT_BOUND_PHASES = frozenset({"decode"})

Sig = tuple[str, str, str]  # (group, rule, severity): one problem, whatever its words


def _sig(p: Problem) -> Sig:
    return (p.group, p.rule, p.severity)


@dataclass(frozen=True)
class PhaseScreen:
    """Whether a problem makes a plan illegal on a phase graph (see the module docstring).
    ``allowed``: the warning rule ids the user accepts (``--allow-warning``:
    :func:`quantscope.targets.accept.allowed_warnings`); ``baseline``: per phase, the
    problems of the uniform a8_w8 plan there."""

    allowed: frozenset[str] = frozenset()
    baseline: Mapping[str, frozenset[Sig]] = field(default_factory=dict)

    def refuses(self, phase: str, p: Problem) -> bool:
        """An error always; a warning by :func:`blocks` with the accepted rules, unless the
        uniform a8_w8 plan carries it in ``phase``."""
        if p.severity == "error":
            return True
        return blocks(p, self.allowed) and _sig(p) not in self.baseline.get(phase, ())

    def accepts(self, phase: str, p: Problem) -> bool:
        """Whether ``p`` is what ``--allow-warning`` lets through in ``phase`` (it would
        block without it)."""
        return lets_through(p, self.allowed) and _sig(p) not in self.baseline.get(phase, ())


@dataclass(frozen=True)
class PhaseCheck:
    phase: str
    seq_len: int
    problems: tuple[Problem, ...]
    cost: float  # relative to this phase's uniform a8_w8
    weight_bytes: float = 0.0  # the weighted groups' weights at the plan's precisions
    # warnings that block the plan here (:meth:`PhaseScreen.refuses`), and those
    # ``--allow-warning`` let through (:meth:`PhaseScreen.accepts`)
    warned: tuple[Problem, ...] = ()
    accepted: tuple[Problem, ...] = ()

    @property
    def errors(self) -> int:
        return sum(p.severity == "error" for p in self.problems)

    @property
    def blocked(self) -> tuple[Problem, ...]:
        """What makes the plan illegal here: its errors, then its blocking warnings."""
        return (*(p for p in self.problems if p.severity == "error"), *self.warned)

    @property
    def blocking(self) -> int:
        return len(self.blocked)


def _problems(plan: Plan, model: Model, phase: str, target: Target, seq_len: int
              ) -> list[Problem]:
    """``plan``'s own precisions on one phase graph: the model's operators the target
    does not take, then :func:`check`."""
    groups = find_groups(model)
    shapes = phase_shapes(model, phase, seq_len)
    return op_problems(model, target, shapes) + check(plan.for_phase(phase), groups, model,
                                                      target, shapes=shapes)


def phase_screen(models: Mapping[str, Model], target: Target, seq_len: int,
                 allowed: frozenset[str] = frozenset()) -> PhaseScreen:
    """The screen of plans on ``models``' phase graphs at ``seq_len`` with the warning
    rules ``allowed``: the uniform a8_w8 plan's problems in each phase are its baseline."""
    start = Plan(default=Precision.A8_W8, target=target.name)
    return PhaseScreen(frozenset(allowed), {
        phase: frozenset(map(_sig, _problems(start, m, phase, target, seq_len)))
        for phase, m in models.items()})


def check_phases(plan: Plan, models: dict[str, Model], target: Target,
                 seq_len: int, screen: PhaseScreen | None = None) -> tuple[PhaseCheck, ...]:
    """Check ``plan`` on each phase graph at ``seq_len`` prompt / cache tokens (each phase
    with its own overrides, :meth:`quantscope.types.Plan.for_phase`), each problem
    screened by ``screen`` (None: :func:`phase_screen` with no warning rule accepted)."""
    if screen is None:
        screen = phase_screen(models, target, seq_len)
    out = []
    for phase, model in models.items():
        own = plan.for_phase(phase)
        groups = find_groups(model)
        check_plan_names(own, groups)
        shapes = phase_shapes(model, phase, seq_len)
        problems = _problems(plan, model, phase, target, seq_len)
        cost = plan_cost(own, groups, target, shapes, model=model,
                         weight_reads=phase in WEIGHT_BOUND_PHASES)
        out.append(PhaseCheck(
            phase, seq_len, tuple(problems), cost, weight_bytes(own, groups, model),
            warned=tuple(p for p in problems
                         if p.severity != "error" and screen.refuses(phase, p)),
            accepted=tuple(p for p in problems if screen.accepts(phase, p))))
    return tuple(out)


def accepted_groups(checks: tuple[PhaseCheck, ...], allowed: frozenset[str]
                    ) -> dict[str, tuple[str, ...]]:
    """Per accepted rule (each of ``allowed``, none included), the groups of ``checks``'
    plan it lets through in some phase, in phase order: what
    :func:`quantscope.plan.accepted.accepted_record` records."""
    out: dict[str, list[str]] = {r: [] for r in sorted(allowed)}
    for c in checks:
        for p in c.accepted:
            if p.group not in out.setdefault(p.rule, []):
                out[p.rule].append(p.group)
    return {r: tuple(gs) for r, gs in out.items()}


def phase_accepted(target: Target, checks: tuple[PhaseCheck, ...], allowed: frozenset[str]
                   ) -> list[dict[str, Any]]:
    """The plan's accepted record (:func:`~quantscope.plan.accepted.accepted_record`) with
    each rule's groups per phase, so each phase's compiler script says its own."""
    return accepted_record(target, accepted_groups(checks, allowed),
                           {c.phase: accepted_groups((c,), allowed) for c in checks})


__all__ = ["WEIGHT_BOUND_PHASES", "PhaseCheck", "PhaseScreen", "accepted_groups",
           "check_phases", "phase_accepted", "phase_screen"]
