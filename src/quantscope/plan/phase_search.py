"""A plan for a decoder's phases: candidates legal on every phase graph, the best by measure.

==================  ==================================================================
ranking             group outputs by their calibrated range (the widest of the phases),
                    widest first; masked-score tensors (range >= 1e30) are left out
candidates          ``a8_w8``, ``a16_w8`` and ``a16_w16`` uniform; ``residual16``:
                    the residual Adds (:func:`~quantscope.analyze.phases.residual_groups`)
                    at a16_w16; ``act16``: the activation (not weighted) groups legal at
                    a16_w16 in every phase, widest first, each kept when every phase's
                    cost stays within the cap (one that does not fit is skipped and the
                    next tried: a 16-bit KV cache is cheap in prefill, N times its token
                    in decode); ``act16+w16``: ``act16`` plus weighted layers at
                    a16_w16, widest output first, within the cap the same way. A
                    candidate equal to an earlier one is left out
legal at 16 bit     the groups with no error when the whole graph is at a16_w16, in every
                    phase; a candidate still erroring loses its erroring groups (twice)
kept                no error in any phase and every phase's cost <= the cap
chosen              of the kept candidates, measured: the lowest prefill KL, ties by the
                    lowest KL of decode fed the emulated KV cache
==================  ==================================================================
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from quantscope.analyze.phases import residual_groups
from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.model.phases import phase_shapes
from quantscope.plan.check import check
from quantscope.plan.cost import CostTable, cost_table
from quantscope.plan.phases import WEIGHT_BOUND_PHASES, PhaseCheck, check_phases
from quantscope.targets.profile import Target
from quantscope.types import (
    PHASE_OVERRIDES,
    GroupKind,
    Groups,
    Plan,
    Precision,
    QuantscopeError,
    Stats,
)

A16 = Precision.A16_W16
SELECTION = "lowest prefill KL, ties by the KL of decode fed the emulated KV cache"
Quality = Mapping[str, Mapping[str, Mapping[str, float]]]  # plan -> LM phase -> metric


@dataclass(frozen=True)
class PhaseCandidate:
    label: str
    plan: Plan
    checks: tuple[PhaseCheck, ...]

    @property
    def errors(self) -> int:
        return sum(c.errors for c in self.checks)

    @property
    def cost(self) -> float:
        """The highest phase cost."""
        return max(c.cost for c in self.checks)

    def kept(self, max_cost: float) -> bool:
        return self.errors == 0 and self.cost <= max_cost


@dataclass(frozen=True)
class _Phase:
    groups: Groups
    model: Model
    shapes: dict[str, tuple[int, ...]]
    costs: CostTable


def rank_by_range(groups: Groups, stats: Sequence[Stats]) -> tuple[str, ...]:
    """Group names, widest calibrated output range (over ``stats``' phases) first."""
    widest: dict[str, float] = {}
    for g in groups.groups:
        for s in stats:
            t = s.tensors.get(g.outputs[0]) if g.outputs else None
            if t is not None and t.max - t.min < 1e30:
                widest[g.name] = max(widest.get(g.name, 0.0), t.max - t.min)
    return tuple(sorted(widest, key=lambda n: -widest[n]))


def _promote(target: str, names: Sequence[str], why: str) -> Plan:
    return Plan(default=Precision.A8_W8, target=target, overrides=tuple((n, A16) for n in names),
                reasons=tuple((n, why) for n in names))


def _erroring(plan: Plan, phases: Mapping[str, _Phase], target: Target) -> set[str]:
    return {p.group for ph in phases.values()
            for p in check(plan, ph.groups, ph.model, target, shapes=ph.shapes)
            if p.severity == "error"}


def _layouts(models: Mapping[str, Model], target: Target, seq_len: int) -> dict[str, _Phase]:
    out = {}
    for phase, m in models.items():
        groups = find_groups(m)
        shapes = phase_shapes(m, phase, seq_len)
        out[phase] = _Phase(groups, m, shapes, cost_table(
            groups, target, m, (A16,), shapes, weight_reads=phase in WEIGHT_BOUND_PHASES))
    return out


def _fill(start: list[str], weighted: Sequence[str], phases: Mapping[str, _Phase],
          max_cost: float) -> list[str]:
    """``start`` plus each of ``weighted`` (in order) that keeps every phase within the cap."""
    chosen = list(start)
    for name in weighted:
        trial = {n: A16 for n in [*chosen, name]}
        costs = [ph.costs.total({g.name: trial.get(g.name, Precision.A8_W8)
                                 for g in ph.groups.groups}) for ph in phases.values()]
        if max(costs) <= max_cost:
            chosen.append(name)
    return chosen


def candidate_plans(models: Mapping[str, Model], target: Target, ranked: Sequence[str],
                    seq_len: int, max_cost: float) -> dict[str, Plan]:
    """Named candidate plans (see the module docstring), before they are screened."""
    phases = _layouts(models, target, seq_len)
    first = next(iter(phases.values())).groups
    kinds = {g.name: g for g in first.groups}
    ranked = [n for n in ranked if n in kinds] + [n for n in kinds if n not in set(ranked)]
    bad = _erroring(Plan(default=A16, target=target.name), phases, target)
    act = [n for n in ranked if kinds[n].kind is not GroupKind.WEIGHTED]
    adds = {g.name for g in residual_groups(first)}
    residual = [n for n in act if n in adds]
    legal = _fill([], [n for n in act if n not in bad], phases, max_cost)
    for _ in range(2):  # rules that judge a group with its neighbours
        wrong = _erroring(_promote(target.name, legal, ""), phases, target)
        legal = [n for n in legal if n not in wrong]
    weighted = [n for n in ranked if kinds[n].kind is GroupKind.WEIGHTED and n not in bad]
    filled = _fill(legal, weighted, phases, max_cost)
    plans = {p.value: Plan(default=p, target=target.name)
             for p in (Precision.A8_W8, Precision.A16_W8, Precision.A16_W16)}
    for label, names, why in (
            ("residual16", residual, "residual stream (Add) at 16 bit"),
            ("act16", legal, "activation group legal at 16 bit in every phase"),
            ("act16+w16", filled, "legal at 16 bit; weighted layers widest output first "
             "within the cost cap")):
        if names and {frozenset(p.overrides) for p in plans.values()}.isdisjoint(
                [frozenset((n, A16) for n in names)]):
            plans[label] = _promote(target.name, names, why)
            own = _phase_only(names, [n for n in act if n in bad], phases, target, max_cost)
            if own:
                plans[f"{label}+{'+'.join(PHASE_TAGS.get(p, p) for p in own)}"] = \
                    _with_phase_overrides(plans[label], own)
    return plans


PHASE_TAGS = {"prefill": "pre16", "decode": "dec16"}  # candidate label suffixes


def _phase_only(shared: Sequence[str], act: Sequence[str], phases: Mapping[str, _Phase],
                target: Target, max_cost: float) -> dict[str, list[str]]:
    """Per phase: those of ``act`` (activation groups refused at 16 bit in some phase;
    never weighted ones: the phases share one set of weights) that are legal at 16 bit
    in that phase graph, added to ``shared`` within the cap there. A decoder's prefill
    and decode are compiled apart, so their activation precisions may differ: decode's
    1-token tensors are under size limits that prefill's are not."""
    if len(phases) < 2:
        return {}
    out = {}
    for phase, ph in phases.items():
        one = {phase: ph}
        bad = _erroring(Plan(default=A16, target=target.name), one, target)
        extra = [n for n in act if n not in bad and n not in set(shared)]
        chosen = _fill(list(shared), extra, one, max_cost)[len(shared):]
        for _ in range(2):  # rules that judge a group with its neighbours
            wrong = _erroring(_promote(target.name, [*shared, *chosen], ""), one, target)
            chosen = [n for n in chosen if n not in wrong]
        if chosen:
            out[phase] = chosen
    return out


def _with_phase_overrides(plan: Plan, own: Mapping[str, Sequence[str]]) -> Plan:
    why = {n: f"legal at 16 bit in the {phase} graph only (the other phase keeps it lower)"
           for phase, names in own.items() for n in names}
    over = {phase: {n: A16.value for n in names} for phase, names in own.items()}
    return dataclasses.replace(plan, reasons=(*plan.reasons, *why.items()),
                               meta=(*plan.meta, (PHASE_OVERRIDES, json.dumps(over))))


def screen(plans: Mapping[str, Plan], models: Mapping[str, Model], target: Target,
           seq_len: int) -> tuple[PhaseCandidate, ...]:
    """Every plan checked on every phase graph (legality and cost per phase)."""
    return tuple(PhaseCandidate(label, plan, check_phases(plan, dict(models), target, seq_len))
                 for label, plan in plans.items())


def kept_plans(candidates: Sequence[PhaseCandidate], max_cost: float) -> dict[str, Plan]:
    """The candidates to measure: no error in any phase, every phase within the cap."""
    kept = {c.label: c.plan for c in candidates if c.kept(max_cost)}
    if not kept:
        raise QuantscopeError(f"no candidate plan is legal on every phase within {max_cost}x "
                              "a8_w8: raise --max-cost or shorten --seq-len")
    return kept


def choose(candidates: Sequence[PhaseCandidate], quality: Quality,
           max_cost: float) -> PhaseCandidate:
    """The kept, measured candidate with the lowest prefill KL (ties: decode, emulated KV)."""
    kept = [c for c in candidates if c.label in kept_plans(candidates, max_cost)
            and c.label in quality]
    if not kept:
        raise QuantscopeError("no kept candidate plan was measured")

    def key(c: PhaseCandidate) -> tuple[float, float]:
        q = quality[c.label]
        return (_finite(q["prefill"]["kl"]), _finite(q["decode_emu_kv"]["kl"]))

    return min(kept, key=key)


def _finite(x: float) -> float:
    return x if math.isfinite(x) else math.inf


__all__ = ["SELECTION", "PhaseCandidate", "candidate_plans", "choose", "kept_plans",
           "rank_by_range", "screen"]
