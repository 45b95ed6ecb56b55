"""A decoder LLM per phase: next-token quality of uniform plans, and time per phase.

    python bench/llm.py [MODEL] [--seq-len 64] [--calibration 16] [--evaluation 8]
                        [--steps 8] [--prompts 4] [--new-tokens 32]
                        [--plans a8_w8,a16_w8,a16_w16] [--plan-file P.json ...] [--json OUT]

MODEL defaults to the built-in smollm2-135m. Prints, per plan and phase (prefill,
decode fed the FP32 KV cache, decode fed the emulated KV cache), top-1 agreement with
FP32, KL and the perplexity ratio, greedy agreement over --new-tokens tokens, the cost
and legality on hailo10h per phase, the time per phase (emulated and FP32, in the same
process: FP32 prefill = the reference runs of each plan's scoring, FP32 decode = the
greedy-generation steps) and the peak RSS.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import time
from pathlib import Path

from llm_args import lm_parser, lm_setup

from quantscope.emulate.release import release_memory
from quantscope.plan.phases import check_phases
from quantscope.serde import read_plan
from quantscope.stages_llm import format_lm_quality, lm_quality, open_phase_models
from quantscope.targets import load_target
from quantscope.types import Plan, Precision


def _args() -> argparse.Namespace:
    ap = lm_parser(__doc__.splitlines()[0])
    ap.add_argument("--plans", default="a8_w8,a16_w8,a16_w16")
    ap.add_argument("--plan-file", action="append", default=[], help="a plan JSON (repeatable)")
    ap.add_argument("--target", default="hailo10h")
    ap.add_argument("--json", type=Path)
    return ap.parse_args()


def main() -> None:
    a = _args()
    plans = {p: Plan(default=Precision.parse(p), target=a.target) for p in a.plans.split(",") if p}
    plans.update({Path(f).stem: read_plan(f) for f in a.plan_file})
    setup = lm_setup(a)
    t0 = time.perf_counter()
    result = lm_quality(a.model, plans, setup)
    total_s = time.perf_counter() - t0
    eval_rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print("\n".join(format_lm_quality(result)), flush=True)
    if a.json:  # the measurements first: the checks below load both graphs again
        a.json.write_text(json.dumps(result, indent=1, default=str))
    release_memory()
    t0 = time.perf_counter()
    models = open_phase_models(a.model)  # once: shape inference caches by model
    target = load_target(a.target)
    checks = {label: [c.__dict__ | {"problems": len(c.problems), "errors": c.errors,
                                    "rules": sorted({p.rule for p in c.problems
                                                     if p.severity == "error"})}
                      for c in check_phases(plan, models, target, a.seq_len)]
              for label, plan in plans.items()}
    check_s = time.perf_counter() - t0
    rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"{a.model} on {platform.processor() or platform.machine()}, {result['data']}, "
          f"setup {setup}")
    print("\n".join(format_lm_quality(result)))
    for label, res in result["plans"].items():
        t = res["time"]
        cost = ", ".join(f"{c['phase']} {c['cost']:.2f}x ({c['errors']} errors {c['rules']})"
                         for c in checks[label])
        print(f"{label}: prefill {t['prefill_s'] / a.evaluation:.2f} s/window of {a.seq_len} "
              f"(FP32 {t['fp32_prefill_s'] / a.evaluation:.2f}), decode "
              f"{t['decode_s'] / max(t['decode_steps'], 1) * 1000:.0f} ms/step (FP32 "
              f"{t['fp32_decode_s'] / max(t['fp32_decode_steps'], 1) * 1000:.0f}); "
              f"hailo10h cost {cost}")
    print(f"calibrate+evaluate {total_s:.0f} s (peak RSS {eval_rss_gb:.2f} GB), checks "
          f"{check_s:.0f} s (peak RSS then {rss_gb:.2f} GB)")
    if a.json:
        a.json.write_text(json.dumps({**result, "checks": checks, "peak_rss_gb": rss_gb,
                                      "eval_peak_rss_gb": eval_rss_gb, "check_s": check_s,
                                      "total_s": total_s}, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())
