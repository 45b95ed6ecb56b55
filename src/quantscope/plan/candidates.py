"""Candidate plans made by rule, not by search: the highest legal precision everywhere, and
the same with whole Linear families back at 8 bit.

===============  =======================================================================
``max_legal``    every group at ``high`` (the target's ``[promotion]``, else a16_w16), then
                 every group a rule blocks demoted to its precision in the planner's
                 start plan (``low``, a8_w8, or what :func:`~quantscope.plan.start.legal_start`
                 raised it to), until none is: the most 16 bit the target allows at this
                 length. "Blocks" is the planner's own screen
                 (:meth:`~quantscope.plan.start.Legality.blocking`): an error, or a warning
                 that applies here, that the start plan does not already carry and whose
                 rule ``allowed`` (``--allow-warning``) does not accept (a
                 16-bit tensor over super-defuse's estimated size, a conv whose 16-bit
                 weights leave a channel's low byte empty). Before, only errors were
                 demoted, so this plan could hold what the planner never emits (human's
                 ``faceres`` on hailo8l: every group at a16_w16 "all legal", 52 of its
                 86 groups under such warnings). Only what a rule blocks is demoted.
``variants``     ``max_legal`` with Linear families (:mod:`quantscope.model.families`, read
                 from the graph) back at ``low``: ``noqk`` (query/key), ``noqkv`` (+ value),
                 ``noqkvao`` (+ attention output), ``onlyup`` (every Linear but the FFN
                 up-projection), ``nolin`` (every Linear). Each is checked again: a
                 variant that is not legal is left out with the rule that refuses it.
===============  =======================================================================

Cost rises from ``nolin`` to ``max_legal``; which one a length affords is the bucket
solver's choice (``quantscope buckets``), each measured on the fit pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

from quantscope.model.families import linear_families
from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.model.shapes import Shapes
from quantscope.plan.accepted import accepted_record, with_accepted
from quantscope.plan.start import Legality, legal_start, legality
from quantscope.targets.profile import Target
from quantscope.types import Plan, Precision, Problem, QuantscopeError

# variant name -> the Linear families it puts back at the low precision
VARIANTS: dict[str, tuple[str, ...]] = {
    "noqk": ("qk",),
    "noqkv": ("qk", "v", "qkv"),
    "noqkvao": ("qk", "v", "qkv", "ao"),
    "onlyup": ("qk", "v", "qkv", "ao", "down"),
    "nolin": ("qk", "v", "qkv", "ao", "down", "up"),
}
ROUNDS = 10  # demotion rounds before giving up (a rule whose verdict moves with others)


@dataclass(frozen=True)
class Candidate:
    """One rule-made plan and what made it."""

    name: str
    plan: Plan
    note: str


def _screen(model: Model, target: Target, shapes: Shapes | None,
            low: Precision, allowed: frozenset[str]) -> Legality:
    """The planner's legality screen from its start plan (uniform ``low``, raised where a
    rule refuses it), with the warning rules ``allowed``: what blocks a plan here blocks
    it in the search."""
    groups = find_groups(model)
    start, _ = legal_start(groups, model, target, shapes, low)
    return legality(start, groups, model, target, shapes, allowed=allowed)


def _recorded(legal: Legality, plan: Plan) -> Plan:
    """``plan`` with what the allowed warnings let through in it (none allowed: as is)."""
    if not legal.allowed:
        return plan
    found = legal.accepted(legal.problems(plan))
    return with_accepted(plan, accepted_record(legal.target, found))


def _rules(problems: list[Problem] | tuple[Problem, ...]) -> set[str]:
    return {p.rule if p.severity == "error" else f"{p.rule} (warning)" for p in problems}


def max_legal(model: Model, target: Target, shapes: Shapes | None, *,
              high: Precision | None = None, low: Precision = Precision.A8_W8,
              allowed: frozenset[str] = frozenset()) -> Candidate:
    """Every group at ``high`` (default: the target's :attr:`~Target.promote`) except those
    a rule blocks (see the module table), each demoted to its start-plan precision;
    ``allowed``: warning rules that block nothing (``--allow-warning``), recorded in the
    plan with the groups they let through (:mod:`quantscope.plan.accepted`)."""
    high = target.promote if high is None else high
    legal = _screen(model, target, shapes, low, allowed)
    over: dict[str, Precision] = {}
    rules: set[str] = set()
    for _ in range(ROUNDS):
        plan = Plan(default=high, overrides=tuple(sorted(over.items())), target=target.name)
        bad = legal.blocking(plan)
        if not bad:
            note = (f"every group at {high} but {len(over)} that {', '.join(sorted(rules))} "
                    f"refuse(s) at {low}" if over else f"every group at {high}: all legal")
            return Candidate("max_legal", _recorded(legal, plan), note)
        fresh = {p.group for p in bad} - set(over)
        if not fresh:  # a rule that demoting the named groups does not settle
            raise QuantscopeError(
                f"no legal plan near {high} on {target.name}: {bad[0].rule} on {bad[0].group} "
                f"stays after demoting it to {low}: {bad[0].fix}")
        over.update({g: legal.start.precision_of(g) for g in fresh})
        rules.update(_rules(bad))
    raise QuantscopeError(f"no legal plan near {high} on {target.name} after {ROUNDS} rounds "
                          "of demotion")


def variants(model: Model, target: Target, shapes: Shapes | None, base: Candidate, *,
             low: Precision = Precision.A8_W8, allowed: frozenset[str] = frozenset(),
             ) -> tuple[tuple[Candidate, ...], tuple[str, ...]]:
    """The family variants of ``base`` that are legal, and a note for each one left out
    (no Linear of its families, or a rule refuses it)."""
    families = linear_families(model)
    groups = find_groups(model)
    legal = _screen(model, target, shapes, low, allowed)
    out, notes = [], []
    for name, fams in VARIANTS.items():
        lowered = {g: legal.start.precision_of(g) for g, f in families.items() if f in fams}
        if not lowered:
            notes.append(f"{name}: the model has no Linear of families {', '.join(fams)}")
            continue
        over = {**dict(base.plan.overrides), **lowered}
        plan = Plan(default=base.plan.default, overrides=tuple(sorted(over.items())),
                    target=target.name)
        bad = legal.blocking(plan)
        if bad:
            notes.append(f"{name}: not legal ({bad[0].rule} on {bad[0].group})")
            continue
        out.append(Candidate(name, _recorded(legal, plan), f"{base.name} with {len(lowered)} Linear(s) "
                             f"({', '.join(fams)}) at {low}"))
    unknown = sum(1 for g in groups.groups
                  if g.op_type in ("MatMul", "Gemm") and g.kind.value == "weighted"
                  and g.name not in families)
    if unknown:
        notes.append(f"{unknown} Linear(s) of no family (not in an attention or FFN pattern) "
                     f"stay as in {base.name}")
    return tuple(out), tuple(notes)


__all__ = ["VARIANTS", "Candidate", "max_legal", "variants"]
