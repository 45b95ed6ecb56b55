"""A decoder plan's a8_w8 weights at a8_w4, rounded by GPTQ and measured: ``run``'s w4 stage.

Kept apart from ``stages_llm.py`` (one layer above it, beside ``stages_lora``): it opens
the phase graphs, the text and the KV prefix through that module and screens both plans
as the phase search does (:class:`~quantscope.plan.phases.PhaseScreen`)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from quantscope.analyze.prefix import prefixed_opener
from quantscope.emulate.release import release_memory
from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.model.phases import PHASES
from quantscope.plan.phase_search import phase_units, unit_of, with_units
from quantscope.plan.phases import check_phases, phase_screen
from quantscope.stages_llm import LmSetup, _opener, lm_prefix, lm_text, open_phase
from quantscope.targets import load_target
from quantscope.tasks.lm_phases import calibrate_phases, evaluate_lm_plans
from quantscope.types import PHASE_OVERRIDES, PHASE_RANGES, Plan, Precision, Stats


def w4_variant(spec: str | Path, plan: Plan, setup: LmSetup, prefix: tuple[int, ...] = (),
               stats: dict[str, Stats] | None = None, allowed: frozenset[str] = frozenset(),
               emulated_spec: str | Path | None = None) -> dict[str, Any]:
    """``plan`` with every weighted layer it leaves at a8_w8 at a8_w4 (its 16-bit layers
    kept), checked on both phases (cost, weight bytes: decode reads every weight per
    token), its 4-bit weights rounded by GPTQ (:func:`quantscope.repair.gptq.gptq`, on the
    prefill graph's calibration windows with the prefix in the cache; the same
    initializers written into both graphs), both graphs calibrated again and measured
    at ``setup`` against the unrepaired graphs as FP32. Not legal on a phase: the checks
    only (``measured`` False): an error, or a warning that blocks the phase search
    (``allowed``: those ``--allow-warning`` accepts, :class:`~quantscope.plan.phases.
    PhaseScreen`). ``stats``: the unrepaired graphs' calibration, when made (as
    :func:`quantscope.stages_llm.lm_quality`'s). ``emulated_spec``: the graphs the plan
    quantizes when they are not ``spec``'s (a fine-tune's: GPTQ rounds their weights, with
    their own prefix; ``spec`` stays the FP32 reference, ``stats`` theirs). Returns the
    plan, checks, GPTQ's effect and the figures."""
    from onnx import numpy_helper

    from quantscope.repair.gptq import gptq
    from quantscope.types import GroupKind

    windows, prompts = lm_text(spec, setup)
    kv = lm_prefix(spec, prefix, windows)
    base = _opener(spec, kv)
    own_spec = emulated_spec or spec
    own_kv = lm_prefix(own_spec, prefix, windows) if emulated_spec else kv
    own = _opener(own_spec, own_kv) if emulated_spec else base
    if stats is None:
        stats = calibrate_phases(own, windows, steps=setup.steps)
    models = {p: own(p) for p in PHASES}
    units = phase_units({p: find_groups(m) for p, m in models.items()})  # a split: one unit
    over = dict(plan.for_phase("prefill").overrides)
    w4 = list(dict.fromkeys(unit_of(g.name) for g in find_groups(models["prefill"]).groups
                            if g.kind is GroupKind.WEIGHTED
                            and over.get(g.name, plan.default) is Precision.A8_W8))
    plan4 = with_units(plan, w4, Precision.A8_W4, units)
    plan4 = dataclasses.replace(plan4, meta=(
        ("planner", "quantscope run: the plan's a8_w8 weights at a8_w4 (GPTQ)"),
        *((k, v) for k, v in plan4.meta if k in (PHASE_OVERRIDES, PHASE_RANGES))))
    tgt = load_target(plan.target)
    checks: dict[str, dict[str, Any]] = {}
    legal = phase_screen(models, tgt, setup.seq_len, allowed)  # once for both plans
    for key, p_ in (("w4", plan4), ("w8", plan)):
        for c in check_phases(p_, models, tgt, setup.seq_len, legal):
            checks[f"{key}.{c.phase}"] = {
                "cost": c.cost, "errors": c.errors, "weight_mb": c.weight_bytes / 1e6,
                "blocking": c.blocking, "rules": sorted({x.rule for x in c.blocked})}
    del models
    release_memory()
    out: dict[str, Any] = {"plan": plan4, "layers": len(w4), "checks": checks,
                           "measured": not any(checks[f"w4.{p}"]["blocking"] for p in PHASES)}
    if not out["measured"] or not w4:
        out["measured"] = False
        return out
    start = time.perf_counter()
    rep = gptq(own("prefill"), [{"input_ids": w[None]} for w in windows.calibration], plan4.for_phase("prefill"),
               stats=stats["prefill"])
    names = {c.tensor for c in rep.changes}
    arrays = {t.name: numpy_helper.to_array(t) for t in rep.proto.graph.initializer
              if t.name in names}
    out["gptq"] = {"effect": rep.effect_dict(), "reason": rep.reason,
                   "left_alone": [list(x) for x in rep.skipped],
                   "seconds": round(time.perf_counter() - start, 1)}
    del rep
    release_memory()

    def repaired(phase: str) -> Model:
        m = open_phase(own_spec, phase)
        for t in m.graph.initializer:
            if t.name in arrays:
                t.CopyFrom(numpy_helper.from_array(arrays[t.name], t.name))
        return Model(proto=m.proto, source=f"{m.source} + GPTQ a8_w4")

    emulated = prefixed_opener(repaired, own_kv.kv if own_kv else None)
    stats4 = calibrate_phases(emulated, windows, steps=setup.steps)
    out["quality"] = evaluate_lm_plans(base, stats4, {"w4": plan4}, windows, prompts=prompts,
                                       steps=setup.steps, new_tokens=setup.new_tokens,
                                       decode_windows=setup.decode_windows,
                                       emulated=emulated)["w4"]
    return out


__all__ = ["w4_variant"]
