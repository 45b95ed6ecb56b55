"""``run --whatif`` on a decoder: where the chosen plan's error is, and what, if anything,
would reach the goal. Each variant is the plan with one class of groups changed on both
phase graphs, measured like the plan and checked against the target, so the verdict can
say which variants reach the goal and whether any of them is legal within ``--max-cost``.

=====================  ==================================================================
variants               ``plan`` (the chosen plan, measured at these amounts for the
                       comparison); ``as-scripted`` (a target whose compiler reads a Hailo
                       script): the decisions the phase scripts leave NOT SET (no layer
                       name) as the compiler would apply them: precision at the plan's
                       default, range at its own calibrated min/max;
                       ``+CLASS``: the plan with every group of the class
                       (:data:`quantscope.model.lm_classes.CLASS_WORDS`) at a16_w16 on
                       both phases, where it has a group below that; ``all16``: every
                       group at a16_w16; ``decode-float``: decode not quantized (what the
                       prefill's emulated KV cache alone leaves); ``prefill16-decode-float``
                       both (what 16-bit prefill's cache leaves)
amounts                the evaluate stage's decode windows (``--decode-steps`` / 8, 32 by
                       default) for prefill and decode alike, ``steps`` decode steps each,
                       no greedy prompts: about a minute per variant on smollm2-135m on
                       2 cores; each figure with its standard error (differences under
                       about two of them are not decided by this amount of text)
changed                per variant and phase: the groups at another precision or output
                       range method than in the plan
checks                 per variant and phase: the target's rules (errors, and the rules
                       that block it: an error, or a warning ``--allow-warning`` does not
                       accept, :class:`~quantscope.plan.phases.PhaseScreen`) and the cost
                       against uniform a8_w8 (float groups are errors on an integer
                       target); a variant "ships" when nothing blocks it on both phases
                       and it is within ``--max-cost``
figures                ONNX Runtime, the same emulation, calibration and KV prefix as the
                       plan's (:func:`quantscope.stages_llm.lm_quality`)
=====================  ==================================================================
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from quantscope.model.groups import find_groups
from quantscope.model.lm_classes import CLASS_WORDS, members
from quantscope.pipeline.decoder_report import METRICS, WHATIF_FIGURES
from quantscope.types import PHASE_OVERRIDES, PHASE_RANGES, Group, Plan, Precision

PHASES = ("prefill", "decode")
LIFT = Precision.A16_W16


def _flat(plan: Plan, phase: str) -> Plan:
    """The phase's plan with its own overrides applied and no phase entries left (so a
    second ``for_phase`` does not undo a variant's change)."""
    own = plan.for_phase(phase)
    meta = tuple((k, v) for k, v in own.meta if k not in (PHASE_OVERRIDES, PHASE_RANGES))
    return dataclasses.replace(own, meta=meta)


def _changed(plan: Plan, base: Plan, groups: tuple[Group, ...]) -> int:
    """How many of ``groups`` run otherwise under ``plan`` than under ``base``: another
    precision, or an output's other range method or pinned range."""
    ranges, pins = (dict(plan.ranges), dict(base.ranges)), (dict(plan.pinned), dict(base.pinned))
    return sum(plan.precision_of(g.name) is not base.precision_of(g.name) or any(
        ranges[0].get(t) != ranges[1].get(t) or pins[0].get(t) != pins[1].get(t)
        for t in g.outputs) for g in groups)


def _set(plan: Plan, groups: list[str], precision: Precision) -> Plan:
    return dataclasses.replace(plan, overrides=tuple(
        {**dict(plan.overrides), **{g: precision for g in groups}}.items()))


def variants(plan: Plan, names: dict[str, list[str]],
             scripted: dict[str, Plan] | None = None
             ) -> list[tuple[str, str, dict[str, Plan]]]:
    """(label, what it is, per phase plan) for each variant (module docstring); ``names``:
    each phase graph's group names; ``scripted``: per phase, the plan as its compiler
    script carries it (:func:`~quantscope.export.plan_export.scripted_plan`), the
    ``as-scripted`` variant where it differs from the plan."""
    base = {p: _flat(plan, p) for p in PHASES}
    out = [("plan", "the chosen plan", base)]
    if scripted and any(scripted[p] != base[p] for p in PHASES):
        out.append(("as-scripted", "the decisions the phase scripts leave NOT SET as the "
                    "compiler would apply them (precision at the plan's default, range at its "
                    "min/max)", scripted))
    for cls, words in CLASS_WORDS.items():
        below = {p: [g for g in members(names[p], cls)
                     if base[p].precision_of(g) is not LIFT] for p in PHASES}
        if any(below.values()):
            out.append((f"+{cls}", f"{words} at a16_w16",
                        {p: _set(base[p], below[p], LIFT) for p in PHASES}))
    every = {p: _set(base[p], names[p], LIFT) for p in PHASES}
    out.append(("all16", "every group at a16_w16", every))
    float_decode = _set(base["decode"], names["decode"], Precision.FLOAT)
    out.append(("decode-float", "decode not quantized (the emulated prefill cache alone)",
                {"prefill": base["prefill"], "decode": float_decode}))
    out.append(("prefill16-decode-float", "prefill at a16_w16, decode not quantized",
                {"prefill": every["prefill"], "decode": float_decode}))
    return out


def measure_whatif(spec: str, plan: Plan, stats: dict[str, Any], run_setup: Any, *,
                   target: str, max_cost: float, hn: dict[str, Any] | None = None,
                   asked: bool = True, say: Any = print,
                   allowed: frozenset[str] = frozenset(),
                   emulated_spec: str | None = None) -> dict[str, Any]:
    """Every variant checked and measured (the run folder's ``whatif.json``): on the graphs
    that read the plan's KV prefix, as the plan stage checked and measured the plan. For a
    target whose compiler reads a Hailo script, ``as-scripted`` too (``hn``: per phase the
    parsed HN the export stage names the layers from). Not ``asked``: the plan and
    ``as-scripted`` only, when the scripts leave a decision that matters NOT SET (what
    every run says), else nothing measured. ``allowed``: the warning rules the run
    accepts (``--allow-warning``). ``emulated_spec``: the graphs the variants quantize when
    they are not ``spec``'s (a fine-tune's, with their own prefix; ``stats`` theirs):
    ``spec`` stays the FP32 reference."""
    from quantscope.analyze.prefix import prefixed_opener
    from quantscope.emulate.release import release_memory
    from quantscope.export.plan_export import scripted_plan
    from quantscope.pipeline.steps import formats
    from quantscope.plan.phases import check_phases, phase_screen
    from quantscope.report.phase_plan import blocking_rules
    from quantscope.stages_llm import LmSetup, lm_prefix, lm_text, open_phase, recorded_prefix
    from quantscope.targets import load_target
    from quantscope.tasks.lm_phases import evaluate_lm_plans

    alls = any(fmt == "alls" for fmt, _ in formats(target))
    if not asked and not alls:  # no script that could drop a decision: nothing to measure
        return {"asked": False}
    n = run_setup.decode_windows or run_setup.evaluation
    setup = LmSetup(seq_len=run_setup.seq_len, calibration=run_setup.calibration,
                    evaluation=n, steps=run_setup.steps, prompts=0, decode_windows=n)
    windows, _ = lm_text(spec, setup)
    kv = lm_prefix(spec, recorded_prefix(plan), windows)
    opener = prefixed_opener(lambda phase: open_phase(spec, phase), kv.kv if kv else None)
    emulated = opener
    if emulated_spec is not None:
        own = lm_prefix(emulated_spec, recorded_prefix(plan), windows)
        emulated = prefixed_opener(lambda phase: open_phase(emulated_spec, phase),
                                   own.kv if own else None)
    models = {p: emulated(p) for p in PHASES}
    groups = {p: find_groups(m) for p, m in models.items()}
    scripted = {p: scripted_plan(models[p], _flat(plan, p), hn=(hn or {}).get(p))[0]
                for p in PHASES} if alls else None
    todo = variants(plan, {p: [x.name for x in g.groups] for p, g in groups.items()}, scripted)
    if not asked:
        todo = [v for v in todo if v[0] in ("plan", "as-scripted")]
        if len(todo) == 1:
            return {"asked": False}
    tgt = load_target(target)
    legal = phase_screen(models, tgt, setup.seq_len, allowed)
    checks = {label: [c for p in PHASES for c in check_phases(
        dataclasses.replace(per[p], target=target), {p: models[p]}, tgt, setup.seq_len, legal)]
        for label, _, per in todo}
    del models
    release_memory()
    rows, start = [], time.perf_counter()
    for i, (label, what, per_phase) in enumerate(todo):
        left = (time.perf_counter() - start) / i * (len(todo) - i) if i else None
        say(f"[whatif] {i + 1}/{len(todo)} {label}: {what}"
            + (f", about {left:.0f} s left" if left is not None else "") + " …")
        result = evaluate_lm_plans(opener, stats, {label: per_phase}, windows,
                                   steps=setup.steps, decode_windows=n,
                                   emulated=emulated)[label]
        figures = {}
        for name in WHATIF_FIGURES:
            m = METRICS[name]
            figures[name] = {"value": result[m.phase][m.key],
                             "se": result[m.phase].get(f"{m.key}_se", 0.0)}
        costs = {c.phase: c.cost for c in checks[label]}
        errors = {c.phase: c.errors for c in checks[label]}
        base = todo[0][2]
        changed = {p: _changed(per_phase[p], base[p], groups[p].groups) for p in PHASES}
        rows.append({"label": label, "what": what, "changed": changed, "figures": figures,
                     "costs": costs, "errors": errors,
                     "rules": blocking_rules(tuple(checks[label])),
                     "ships": not any(c.blocking for c in checks[label])
                     and all(c <= max_cost + 1e-9 for c in costs.values())})
    return {"asked": asked, "setup": setup.__dict__, "max_cost": max_cost, "variants": rows,
            "seconds": round(time.perf_counter() - start, 1)}


__all__ = ["measure_whatif", "variants"]
