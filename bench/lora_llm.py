"""A LoRA adapter on a decoder: merged before quantization vs kept beside the base at 16
bit (issue 33 item 6; field report 004's choice).

    python bench/lora_llm.py [MODEL] --out DIR [--rank 8] [--strength 0.1]
        [--kinds q_proj,v_proj] [--max-cost 1.5] [--seq-len 64] [--lm-tokens 20000]
        [--prompts 32] [--new-tokens 64] [--decode-steps 256] [--json OUT]

MODEL defaults to the built-in smollm2-135m, the target is hailo10h. Steps:

1. a synthetic adapter (:func:`quantscope.model.lora.synthetic_adapter`: no adapter ships
   in a registry package) on the ``--kinds`` Linears of every layer, ``DIR/adapter.npz``;
2. both phase graphs with it **merged** and **attached** (``lora_a``, ``lora_b``,
   ``lora_add`` beside each adapted Linear; checked to be the merged function in FP32);
3. **merged**: ``quantscope run`` on the merged pair (``DIR/run-merged``; its recipe, plan
   search, KV prefix and evaluation at the given amounts; ``--w4 off``);
4. **separate**: the attached pair rewritten by the same recipe, the merged run's plan with
   the adapter's groups at a16_w16 (and, for reference, at a8_w8), checked on both phases
   and measured at the same amounts with the merged run's prefix tokens. Each variant's
   FP32 reference is its own graph (the same function).

Prints one row per variant (cost per phase, decode weight bytes, the four figures with
their standard errors), the wall time of each part and the peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

from quantscope.model.groups import find_groups
from quantscope.model.lora import synthetic_adapter
from quantscope.pipeline.decoder import DecoderOptions, run_decoder
from quantscope.pipeline.decoder_report import METRICS
from quantscope.serde import read_plan
from quantscope.stages_llm import (
    RECIPE,
    LmSetup,
    check_plan_phases,
    lm_quality,
    open_phase,
    recipe_phase_files,
    recorded_prefix,
)
from quantscope.stages_lora import adapter_phase_files, separate_plan
from quantscope.types import Precision

TARGET = "hailo10h"


def _rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _row(label: str, costs: dict, weight_mb: float, res: dict) -> dict:
    figs = {n: (res[m.phase][m.key], res[m.phase].get(f"{m.key}_se", 0.0))
            for n, m in METRICS.items()}
    print(f"{label:<26} cost {costs['prefill']:.3f}x / {costs['decode']:.3f}x  decode weights "
          f"{weight_mb:.1f} MB  " + "  ".join(f"{n} {v:.4f} (± {se:.4f})"
                                              for n, (v, se) in figs.items()), flush=True)
    return {"costs": costs, "weight_mb": weight_mb, "figures": figs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="smollm2-135m")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--strength", type=float, default=0.1)
    ap.add_argument("--kinds", default="q_proj,v_proj")
    ap.add_argument("--max-cost", type=float, default=1.5)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--lm-tokens", type=int, default=20_000)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--decode-steps", type=int, default=256)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}

    t0 = time.perf_counter()
    adapter = synthetic_adapter(open_phase(a.model, "prefill").proto,
                                kinds=tuple(a.kinds.split(",")), rank=a.rank,
                                strength=a.strength)
    adapter.save(a.out / "adapter.npz")
    merged, attached = a.out / "merged.prefill.onnx", a.out / "separate.prefill.onnx"
    notes = {"merged": adapter_phase_files(a.model, adapter, merged, merged=True),
             "separate": adapter_phase_files(a.model, adapter, attached, merged=False)}
    times["adapter files"] = time.perf_counter() - t0
    print(f"adapter: rank {a.rank} on {len(adapter.layers)} Linears ({a.kinds}), "
          f"|dW| = {a.strength} |W|; {json.dumps(notes)}", flush=True)

    t0 = time.perf_counter()
    opts = DecoderOptions(model=str(merged), target=TARGET, out=str(a.out / "run-merged"),
                          max_cost=a.max_cost, seq_len=a.seq_len, tokens=a.lm_tokens,
                          prompts=a.prompts, new_tokens=a.new_tokens,
                          decode_steps=a.decode_steps, w4=False)
    verdict = run_decoder(opts, progress=True).verdict
    times["merged: run"] = time.perf_counter() - t0
    plan_m = read_plan(a.out / "run-merged" / "plan.json")
    evaluated = json.loads((a.out / "run-merged" / "evaluate.json").read_text())
    m_checks = {c.phase: c for c in check_plan_phases(merged, plan_m, ("prefill", "decode"),
                                                       a.seq_len)}
    rows = {"merged (run's plan)": _row(
        "merged (run's plan)", verdict["costs"], m_checks["decode"].weight_bytes / 1e6,
        evaluated["plans"]["plan"])}

    t0 = time.perf_counter()
    sep = a.out / "sep" / "model.prefill.onnx"
    sep.parent.mkdir(exist_ok=True)
    recipe_phase_files(attached, RECIPE, sep, seq_len=a.seq_len, prefix="auto")
    times["separate: rewrite"] = time.perf_counter() - t0
    groups = find_groups(open_phase(sep, "prefill")).names()
    plans, costs, weights = {}, {}, {}
    for label, prec in (("separate, adapter a16_w16", Precision.A16_W16),
                        ("separate, adapter a8_w8", Precision.A8_W8)):
        plan = separate_plan(plan_m, groups, adapter, prec)
        checks = check_plan_phases(sep, plan, ("prefill", "decode"), a.seq_len)
        errors = sum(c.errors for c in checks)
        costs[label] = {c.phase: c.cost for c in checks}
        weights[label] = next(c.weight_bytes for c in checks if c.phase == "decode") / 1e6
        print(f"{label}: {errors} legality error(s) "
              + "; ".join(f"{p.rule} {p.group}" for c in checks for p in c.problems
                          if p.severity == "error")[:300], flush=True)
        if not errors:
            plans[label] = plan
    setup = LmSetup.at(a.seq_len, tokens=a.lm_tokens, prompts=a.prompts,
                       new_tokens=a.new_tokens, decode_steps=a.decode_steps)
    t0 = time.perf_counter()
    got = lm_quality(sep, plans, setup, recorded_prefix(plan_m))
    times["separate: measure"] = time.perf_counter() - t0
    for label, res in got["plans"].items():
        rows[label] = _row(label, costs[label], weights[label], res)
    print("times: " + ", ".join(f"{k} {v:.0f} s" for k, v in times.items())
          + f"; peak RSS {_rss_gb():.2f} GB")
    if a.json:
        a.json.write_text(json.dumps({"rows": rows, "times": times, "peak_rss_gb": _rss_gb(),
                                      "setup": setup.__dict__, "rank": a.rank,
                                      "strength": a.strength, "kinds": a.kinds,
                                      "prefix": recorded_prefix(plan_m)}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
