"""`quantscope plan --phase` with the amounts of text chosen: a plan for both phase graphs.

    python bench/llm_plan.py [MODEL] [--seq-len 64] [--calibration 16] [--evaluation 8]
                             [--steps 8] [--prompts 4] [--new-tokens 32] [--max-cost 1.5]
                             [--target hailo10h] [--out plan.json] [--json OUT]

MODEL defaults to the built-in smollm2-135m. The same library call as the CLI
(:func:`quantscope.stages_llm.plan_phases`): the per-phase diagnosis, the candidates'
cost and legality per phase, the kept ones' quality per phase, the chosen plan (written
to --out with its per-phase results in ``meta``), plus wall time and peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path

from llm_args import lm_parser, lm_setup

from quantscope.analyze.phases import format_diagnosis
from quantscope.serde import write_plan
from quantscope.stages_llm import format_phase_plan, plan_phases


def _args() -> argparse.Namespace:
    ap = lm_parser(__doc__.splitlines()[0])
    ap.add_argument("--max-cost", type=float, default=1.5)
    ap.add_argument("--target", default="hailo10h")
    ap.add_argument("--out", type=Path, default=Path("llm-plan.json"))
    ap.add_argument("--json", type=Path, help="the measurements and the table as JSON")
    return ap.parse_args()


def main() -> None:
    a = _args()
    setup = lm_setup(a)
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    out = plan_phases(a.model, a.target, max_cost=a.max_cost, setup=setup)
    total_s = time.perf_counter() - t0
    rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print("\n".join(format_diagnosis(out.diagnosis)))
    print("\n".join(format_phase_plan(out)))
    write_plan(a.out, out.plan())
    print(f"wrote {a.out}; {total_s:.0f} s, peak RSS {rss_gb:.2f} GB, load average "
          f"{load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    if a.json:
        table = [{"label": c.label, "kept": c.kept(a.max_cost), "overrides": len(c.plan.overrides),
                  "checks": [{"phase": k.phase, "cost": k.cost, "errors": k.errors,
                              "rules": sorted({p.rule for p in k.problems
                                               if p.severity == "error"})}
                             for k in c.checks]} for c in out.candidates]
        a.json.write_text(json.dumps({"quality": out.quality, "candidates": table,
                                      "chosen": out.chosen.label, "total_s": total_s,
                                      "peak_rss_gb": rss_gb}, indent=1, default=str))


if __name__ == "__main__":
    main()
