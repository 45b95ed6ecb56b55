"""GPTQ vs round to nearest for a decoder's 4-bit weights, per phase (issue 33 item 3).

    python bench/gptq_llm.py [MODEL] [--plan w4|act16w4] [--prefix none|auto]
                             [--seq-len 64] [--calibration 16] [--evaluation 8] [--steps 8]
                             [--prompts 4] [--new-tokens 32] [--max-cost 1.5] [--json OUT]

MODEL defaults to the built-in smollm2-135m, the target is hailo10h. Plans:

- ``w4``: every weighted layer (the 210 Linears and the LM head) at a8_w4, the rest a8_w8
  (the docs' "a8_w8 with all weights a8_w4" row);
- ``act16w4``: the planner's ``act16+w16`` candidate (:func:`~quantscope.plan.phase_search.
  candidate_plans` at ``--max-cost``, on the graphs with ``--prefix``), every weighted
  layer it leaves at a8_w8 set to a8_w4.

Steps: the text and the KV prefix as ``check --phase --quality`` makes them
(:func:`~quantscope.stages_llm.lm_text`, :func:`~quantscope.stages_llm.lm_prefix`); both
phase graphs calibrated; the plan checked on both (legality, cost, weight bytes); round to
nearest measured; ``gptq`` (:func:`quantscope.repair.gptq.gptq`) run on the prefill graph
(the layers' inputs on the calibration windows, the prefix in the cache when given) and its
weights written into **both** phase graphs (the same initializers by name); both graphs
calibrated again on the repaired weights (as ``run_repairs`` does after a graph edit);
GPTQ measured. The **FP32 reference of both measurements is the original model**: the
evaluation's ``emulated`` opener gives the repaired graphs, its first the reference. The
prefix's K/V are the original model's (FP32 constants, computed once).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np
from llm_args import lm_parser, lm_setup
from onnx import numpy_helper

from quantscope.analyze.prefix import prefixed_opener
from quantscope.emulate.release import release_memory
from quantscope.model.groups import find_groups
from quantscope.model.load import Model, with_initializers
from quantscope.plan.phase_search import candidate_plans, rank_by_range
from quantscope.plan.phases import check_phases
from quantscope.repair.gptq import gptq
from quantscope.stages_llm import format_lm_quality, lm_prefix, lm_text, open_phase
from quantscope.targets import load_target
from quantscope.tasks.lm_phases import calibrate_phases, evaluate_lm_plans
from quantscope.types import GroupKind, Plan, Precision

TARGET = "hailo10h"


def _rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _plan(kind: str, opener, stats, seq_len: int, max_cost: float) -> tuple[Plan, dict]:
    """The plan to measure and its checks on both phase graphs."""
    models = {p: opener(p) for p in ("prefill", "decode")}
    groups = find_groups(models["prefill"])
    weighted = [g.name for g in groups.groups if g.kind is GroupKind.WEIGHTED]
    base: dict[str, Precision] = {}
    if kind == "act16w4":
        tgt = load_target(TARGET)
        ranked = rank_by_range(groups, list(stats.values()))
        cand = candidate_plans(models, tgt, ranked, seq_len, max_cost)["act16+w16"]
        base = dict(cand.overrides)
    over = {**{n: Precision.A8_W4 for n in weighted if n not in base}, **base}
    plan = Plan(default=Precision.A8_W8, target=TARGET, overrides=tuple(over.items()))
    checks = check_phases(plan, models, load_target(TARGET), seq_len)
    a8 = check_phases(Plan(default=Precision.A8_W8, target=TARGET), models,
                      load_target(TARGET), seq_len)
    info = {"weighted": len(weighted), "w4": sum(p is Precision.A8_W4 for p in over.values()),
            "16bit": len(base),
            "checks": {c.phase: {"cost": c.cost, "errors": c.errors,
                                 "rules": sorted({p.rule for p in c.problems
                                                  if p.severity == "error"}),
                                 "weight_mb": c.weight_bytes / 1e6} for c in checks},
            "a8_w8_weight_mb": {c.phase: c.weight_bytes / 1e6 for c in a8}}
    del models
    release_memory()
    return plan, info


def _with_weights(model: Model, arrays: dict[str, np.ndarray], what: str) -> Model:
    """``model`` with the named initializers replaced in place
    (:func:`quantscope.model.load.with_initializers`)."""
    return with_initializers(model, arrays, what)


def main() -> None:
    ap = lm_parser(__doc__.splitlines()[0])
    ap.add_argument("--plan", choices=("w4", "act16w4"), default="w4")
    ap.add_argument("--prefix", choices=("none", "auto"), default="none")
    ap.add_argument("--max-cost", type=float, default=1.5)
    ap.add_argument("--json", type=Path)
    a: argparse.Namespace = ap.parse_args()
    setup = lm_setup(a)
    t_all = time.perf_counter()
    windows, prompts = lm_text(a.model, setup)
    kv = lm_prefix(a.model, a.prefix, windows)
    prefix = kv.kv if kv else None
    base = prefixed_opener(lambda p: open_phase(a.model, p), prefix)
    stats = calibrate_phases(base, windows, steps=setup.steps)
    plan, info = _plan(a.plan, base, stats, setup.seq_len, a.max_cost)
    print(f"plan {a.plan}: {info['w4']} of {info['weighted']} weighted layers at a8_w4, "
          f"{info['16bit']} groups at 16 bit; prefix {a.prefix}; {json.dumps(info)}", flush=True)
    amounts = {"prompts": prompts, "steps": setup.steps, "new_tokens": setup.new_tokens,
               "decode_windows": setup.decode_windows}
    t0 = time.perf_counter()
    rtn = evaluate_lm_plans(base, stats, {f"{a.plan} RTN": plan}, windows, **amounts)
    rtn_s = time.perf_counter() - t0
    out = {"data": windows.source, "setup": setup.__dict__, "plans": rtn,
           **({"prefix": kv.to_dict()} if kv else {})}
    print("\n".join(format_lm_quality(out)), flush=True)

    t0 = time.perf_counter()
    rep = gptq(base("prefill"), [{"input_ids": w[None]} for w in windows.calibration], plan,
               stats=stats["prefill"])
    gptq_s, gptq_rss = time.perf_counter() - t0, _rss_gb()
    names = {c.tensor for c in rep.changes}
    arrays = {t.name: numpy_helper.to_array(t) for t in rep.proto.graph.initializer
              if t.name in names}
    effect, skipped, reason = rep.effect_dict(), rep.skipped, rep.reason
    del rep
    release_memory()
    print(f"gptq: {gptq_s:.0f} s peak RSS "
          f"{gptq_rss:.2f} GB; {effect}; {len(skipped)} left alone "
          f"({'; '.join(f'{n}: {w}' for n, w in skipped[:3])}); {reason}", flush=True)

    repaired = prefixed_opener(lambda p: _with_weights(open_phase(a.model, p), arrays, "gptq"),
                               prefix)
    stats = calibrate_phases(repaired, windows, steps=setup.steps)
    t0 = time.perf_counter()
    got = evaluate_lm_plans(base, stats, {f"{a.plan} GPTQ": plan}, windows, **amounts,
                            emulated=repaired)
    gptq_eval_s = time.perf_counter() - t0
    out["plans"].update(got)
    print("\n".join(format_lm_quality(out)))
    total = time.perf_counter() - t_all
    print(f"total {total:.0f} s (RTN evaluation {rtn_s:.0f} s, GPTQ {gptq_s:.0f} s, GPTQ "
          f"evaluation {gptq_eval_s:.0f} s); peak RSS {_rss_gb():.2f} GB")
    if a.json:
        a.json.write_text(json.dumps({**out, "plan": a.plan, "info": info, "gptq": {
            "seconds": gptq_s, "effect": effect, "skipped": [list(s) for s in skipped],
            "reason": reason, "rss_gb": gptq_rss}, "total_s": total, "peak_rss_gb": _rss_gb()},
            indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())
