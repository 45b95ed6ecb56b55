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
legal at 16 bit     the groups nothing blocks when the whole graph is at a16_w16, in every
                    phase; a candidate still blocked loses its blocked groups (twice).
                    Blocks: :class:`~quantscope.plan.phases.PhaseScreen`, the planner's
                    one rule (an error; a warning that applies, whose rule
                    ``--allow-warning`` does not accept and that uniform a8_w8 does not
                    carry there)
kept                nothing blocking in any phase and every phase's cost <= the cap
chosen              of the kept candidates, measured: the lowest prefill KL, ties by the
                    lowest KL of decode fed the emulated KV cache
output ranges       then the chosen plan with its Linears' outputs and its KV cache
                    ranged by ``mse`` (:func:`with_output_ranges`: the clip range of
                    least expected squared error on each tensor's calibrated histogram,
                    per phase; a 16-bit tensor keeps min/max; the Linear whose output is
                    the model's output, the LM head, keeps min/max) is measured too,
                    ``<label>+mse``, and chosen by the same rule; legality and cost are
                    the chosen plan's
units               a group split along the tokens in one phase graph only (prefill's
                    MLPs, :func:`quantscope.repair.gated.split_gated`: ``<g>/tok<i>``
                    and ``<g>/concat``) is one unit with the whole ``<g>`` of the other
                    phase (:func:`unit_of`): promoted, legal and costed together, so the
                    phases' shared weights get one precision; a unit's names that are
                    not in every phase graph go to each phase's own overrides
==================  ==================================================================
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from quantscope.analyze.phases import kv_cache_outputs, residual_groups
from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.model.phases import phase_shapes
from quantscope.plan.check import check
from quantscope.plan.cost import CostTable, cost_table
from quantscope.plan.phases import (
    WEIGHT_BOUND_PHASES,
    PhaseCheck,
    PhaseScreen,
    check_phases,
    phase_screen,
)
from quantscope.targets.profile import Target
from quantscope.types import (
    PHASE_OVERRIDES,
    PHASE_RANGES,
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
    def blocking(self) -> int:
        """Errors and blocking warnings over the phases (:attr:`PhaseCheck.blocked`)."""
        return sum(c.blocking for c in self.checks)

    @property
    def cost(self) -> float:
        """The highest phase cost."""
        return max(c.cost for c in self.checks)

    def kept(self, max_cost: float) -> bool:
        return self.blocking == 0 and self.cost <= max_cost


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


_PART = re.compile(r"/(tok\d+|concat)$")  # a token-split group's chunk or its Concat

Units = Mapping[str, Mapping[str, Sequence[str]]]  # unit -> phase -> its group names there


def unit_of(name: str) -> str:
    """The unit a group belongs to: ``<g>`` for ``<g>/tok<i>`` and ``<g>/concat``."""
    return _PART.sub("", name)


def phase_units(phases: Mapping[str, Groups]) -> dict[str, dict[str, list[str]]]:
    """Per unit (:func:`unit_of`) and phase: the group names of that unit in that graph."""
    out: dict[str, dict[str, list[str]]] = {}
    for phase, groups in phases.items():
        for g in groups.groups:
            out.setdefault(unit_of(g.name), {}).setdefault(phase, []).append(g.name)
    return out


def unit_plan(target: str, names: Sequence[str], why: str, units: Units,
              precision: Precision = A16) -> Plan:
    """``names`` (units) at ``precision``: a unit with the same single group in every
    phase graph in the shared overrides, any other unit's groups in each phase's own."""
    shared: list[str] = []
    own: dict[str, dict[str, str]] = {}
    for n in names:
        per = units.get(n, {})
        if per and all(list(v) == [n] for v in per.values()) and len(per) == len(
                {p for u in units.values() for p in u}):
            shared.append(n)
            continue
        for phase, members in per.items():
            own.setdefault(phase, {}).update(dict.fromkeys(members, precision.value))
    meta = ((PHASE_OVERRIDES, json.dumps(own)),) if own else ()
    return Plan(default=Precision.A8_W8, target=target,
                overrides=tuple((n, precision) for n in shared),
                reasons=tuple((n, why) for n in names), meta=meta)


def with_units(plan: Plan, names: Sequence[str], precision: Precision, units: Units
               ) -> Plan:
    """``plan`` with ``names`` (units) at ``precision`` too, as :func:`unit_plan` places
    them (shared or per phase); a split group's Concat is left as it was below 16 bit."""
    add = unit_plan(plan.target or "", names, "", units, precision)
    own = {phase: {k: v.value for k, v in extra.items()}
           for phase, extra in plan.phase_overrides().items()}
    for phase, extra in add.phase_overrides().items():
        own.setdefault(phase, {}).update(
            {k: v.value for k, v in extra.items()
             if (precision.act_bits or 32) >= 16 or not k.endswith("/concat")})
    meta = tuple((k, v) for k, v in plan.meta if k != PHASE_OVERRIDES)
    return dataclasses.replace(
        plan, overrides=tuple({**dict(plan.overrides), **dict(add.overrides)}.items()),
        meta=(*meta, *(((PHASE_OVERRIDES, json.dumps(own)),) if own else ())))


def _promote(target: str, names: Sequence[str], why: str, units: Units | None = None
             ) -> Plan:
    if units is not None:
        return unit_plan(target, names, why, units)
    return Plan(default=Precision.A8_W8, target=target, overrides=tuple((n, A16) for n in names),
                reasons=tuple((n, why) for n in names))


def _erroring(plan: Plan, phases: Mapping[str, _Phase], target: Target,
              legal: PhaseScreen) -> set[str]:
    """The units ``legal`` refuses in some phase (each phase checked with its own
    overrides): an error, or a warning not accepted."""
    return {unit_of(p.group) for phase, ph in phases.items()
            for p in check(plan.for_phase(phase), ph.groups, ph.model, target,
                           shapes=ph.shapes)
            if legal.refuses(phase, p)}


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
        costs = [ph.costs.total({g.name: trial.get(unit_of(g.name), Precision.A8_W8)
                                 for g in ph.groups.groups}) for ph in phases.values()]
        if max(costs) <= max_cost:
            chosen.append(name)
    return chosen


def candidate_plans(models: Mapping[str, Model], target: Target, ranked: Sequence[str],
                    seq_len: int, max_cost: float, legal: PhaseScreen | None = None
                    ) -> dict[str, Plan]:
    """Named candidate plans (see the module docstring), before they are screened;
    ``legal``: what blocks a group (None: :func:`phase_screen`, no warning accepted)."""
    phases = _layouts(models, target, seq_len)
    legal = legal or phase_screen(models, target, seq_len)
    first = next(iter(phases.values())).groups
    units = phase_units({p: ph.groups for p, ph in phases.items()})
    kinds = {}
    for ph in reversed(list(phases.values())):  # a unit's kind: its first phase's group
        kinds.update({unit_of(g.name): g for g in ph.groups.groups
                      if not g.name.endswith("/concat")})
    ranked = list(dict.fromkeys(unit_of(n) for n in ranked if unit_of(n) in kinds))
    ranked += [n for n in kinds if n not in set(ranked)]
    bad = _erroring(Plan(default=A16, target=target.name), phases, target, legal)
    act = [n for n in ranked if kinds[n].kind is not GroupKind.WEIGHTED]
    adds = {g.name for g in residual_groups(first)}
    residual = [n for n in act if n in adds]
    act16 = _fill([], [n for n in act if n not in bad], phases, max_cost)
    for _ in range(2):  # rules that judge a group with its neighbours
        wrong = _erroring(_promote(target.name, act16, "", units), phases, target, legal)
        act16 = [n for n in act16 if n not in wrong]
    weighted = [n for n in ranked if kinds[n].kind is GroupKind.WEIGHTED and n not in bad]
    filled = _fill(act16, weighted, phases, max_cost)
    plans = {p.value: Plan(default=p, target=target.name)
             for p in (Precision.A8_W8, Precision.A16_W8, Precision.A16_W16)}
    seen: set[frozenset[str]] = {frozenset()}
    for label, names, why in (
            ("residual16", residual, "residual stream (Add) at 16 bit"),
            ("act16", act16, "activation group legal at 16 bit in every phase"),
            ("act16+w16", filled, "legal at 16 bit; weighted layers widest output first "
             "within the cost cap")):
        if names and frozenset(names) not in seen:
            seen.add(frozenset(names))
            plans[label] = _promote(target.name, names, why, units)
            own = _phase_only(names, [n for n in act if n in bad], phases, target, max_cost,
                              legal, units)
            if own:
                plans[f"{label}+{'+'.join(PHASE_TAGS.get(p, p) for p in own)}"] = \
                    _with_phase_overrides(plans[label], own, units)
    return plans


PHASE_TAGS = {"prefill": "pre16", "decode": "dec16"}  # candidate label suffixes


def _phase_only(shared: Sequence[str], act: Sequence[str], phases: Mapping[str, _Phase],
                target: Target, max_cost: float, legal: PhaseScreen,
                units: Units | None = None) -> dict[str, list[str]]:
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
        bad = _erroring(Plan(default=A16, target=target.name), one, target, legal)
        extra = [n for n in act if n not in bad and n not in set(shared)]
        chosen = _fill(list(shared), extra, one, max_cost)[len(shared):]
        for _ in range(2):  # rules that judge a group with its neighbours
            wrong = _erroring(_promote(target.name, [*shared, *chosen], "", units), one,
                              target, legal)
            chosen = [n for n in chosen if n not in wrong]
        if chosen:
            out[phase] = chosen
    return out


def _with_phase_overrides(plan: Plan, own: Mapping[str, Sequence[str]],
                          units: Units | None = None) -> Plan:
    why = {n: f"legal at 16 bit in the {phase} graph only (the other phase keeps it lower)"
           for phase, names in own.items() for n in names}
    over = {phase: {k: v.value for k, v in extra.items()}
            for phase, extra in plan.phase_overrides().items()}
    for phase, names in own.items():
        members = [m for n in names for m in ((units or {}).get(n, {}).get(phase) or [n])]
        over.setdefault(phase, {}).update(dict.fromkeys(members, A16.value))
    meta = tuple((k, v) for k, v in plan.meta if k != PHASE_OVERRIDES)
    return dataclasses.replace(plan, reasons=(*plan.reasons, *why.items()),
                               meta=(*meta, (PHASE_OVERRIDES, json.dumps(over))))


def screen(plans: Mapping[str, Plan], models: Mapping[str, Model], target: Target,
           seq_len: int, legal: PhaseScreen | None = None) -> tuple[PhaseCandidate, ...]:
    """Every plan checked on every phase graph (legality by ``legal``, cost per phase)."""
    legal = legal or phase_screen(models, target, seq_len)
    return tuple(PhaseCandidate(label, plan, check_phases(plan, dict(models), target, seq_len,
                                                          legal))
                 for label, plan in plans.items())


def kept_plans(candidates: Sequence[PhaseCandidate], max_cost: float) -> dict[str, Plan]:
    """The candidates to measure: no error in any phase, every phase within the cap."""
    kept = {c.label: c.plan for c in candidates if c.kept(max_cost)}
    if not kept:
        warned = sorted({p.rule for c in candidates if c.cost <= max_cost and not c.errors
                         for k in c.checks for p in k.warned})
        raise QuantscopeError(f"no candidate plan is legal on every phase within {max_cost}x "
                              "a8_w8: raise --max-cost or shorten --seq-len"
                              + (" (or accept the warning rule(s) that block them: "
                                 + " ".join(f"--allow-warning {r}" for r in warned) + ")"
                                 if warned else ""))
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


LAYOUT_OPS = frozenset({"Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze",
                        "Flatten"})
RANGE_METHOD = "mse"  # the range method :func:`with_output_ranges` tries (Linears, KV cache)


def _model_outputs(model: Model) -> set[str]:
    """The tensors that reach a model output through layout ops only."""
    graph = model.proto.graph
    made = {o: n for n in graph.node for o in n.output}
    out, todo = set(), [o.name for o in graph.output]
    while todo:
        t = todo.pop()
        if t in out:
            continue
        out.add(t)
        node = made.get(t)
        if node is not None and node.op_type in LAYOUT_OPS and node.input:
            todo.append(node.input[0])
    return out


def output_range_tensors(model: Model) -> list[str]:
    """The tensors :func:`with_output_ranges` ranges by :data:`RANGE_METHOD`: the outputs
    of ``model``'s weighted groups (its Linears) that are not a model output (the LM
    head's logits keep min/max: a clipped logit changes the answer), and the KV cache
    (the ``present.*`` outputs, read again by the next step)."""
    final = _model_outputs(model)
    groups = find_groups(model)
    linears = [t for g in groups.groups if g.kind is GroupKind.WEIGHTED
               for t in g.outputs if t not in final]
    return [*linears, *(t for _, t in kv_cache_outputs(groups, model.output_names()))]


def with_output_ranges(plan: Plan, tensors: Mapping[str, Sequence[str]],
                       method: str = RANGE_METHOD) -> Plan:
    """``plan`` with ``tensors`` (phase -> its Linears' outputs and KV cache,
    :func:`output_range_tensors`) ranged by ``method`` in each phase graph
    (``meta['phase_ranges']``: the phases name some tensors apart and have their own
    calibration). The range method only sets where a tensor's 8-bit grid clips; a 16-bit
    tensor keeps min/max (:mod:`quantscope.emulate.ranges`), so legality and cost are
    ``plan``'s."""
    own = {phase: {**plan.phase_ranges().get(phase, {}), **dict.fromkeys(names, method)}
           for phase, names in tensors.items()}
    meta = tuple((k, v) for k, v in plan.meta if k != PHASE_RANGES)
    return dataclasses.replace(plan, meta=(*meta, (PHASE_RANGES, json.dumps(own))))


def ranged_candidate(best: PhaseCandidate, tensors: Mapping[str, Sequence[str]]
                     ) -> PhaseCandidate:
    """``best`` with ``tensors`` ranged by :data:`RANGE_METHOD` (:func:`with_output_ranges`)
    as the candidate ``<label>+mse``: the same checks, since a range method moves no bit
    width; measured and chosen by the same rule as the others."""
    return dataclasses.replace(best, label=f"{best.label}+{RANGE_METHOD}",
                               plan=with_output_ranges(best.plan, tensors))


def _finite(x: float) -> float:
    return x if math.isfinite(x) else math.inf


__all__ = ["RANGE_METHOD", "SELECTION", "PhaseCandidate", "candidate_plans", "choose",
           "kept_plans", "output_range_tensors", "phase_units", "rank_by_range",
           "ranged_candidate", "screen", "unit_of", "unit_plan", "with_output_ranges",
           "with_units"]
