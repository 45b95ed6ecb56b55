"""Measure a fine-tune saved with ``finetune.py --save-delta`` again, in ONNX Runtime.

    PYTHONPATH=src python bench/finetune_apply.py DELTA_DIR --model M --stats S --plan P
        [--pairs 1000] [--seq-len 256] [--json out.json] [--out-model M2 --out-plan P2]

For a fine-tune run elsewhere (a GPU machine): its weights (the original FP32 weights plus
the saved differences) are written back by name, its learned ranges pinned in the
plan, and the QDQ graph the writer builds is measured on the evaluation pairs, with the
rebuilt FP32 model against the original, as ``finetune.py`` does after training.
"""

from __future__ import annotations

import argparse
import sys
import time
from types import SimpleNamespace

from finetune import KEYS
from finetune_report import load_delta

from quantscope.emulate.evaluate import run_model
from quantscope.finetune.apply import finetuned_model, finetuned_plan, fp32_weights
from quantscope.serde import read_plan, write_onnx, write_plan
from quantscope.stages import at_length, evaluate_plans, open_data, open_model, read_stats
from quantscope.targets import load_target
from quantscope.tasks.text import STDLIB_DOCS
from quantscope.types import Plan, Precision


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("delta")
    p.add_argument("--model", required=True)
    p.add_argument("--stats", required=True)
    p.add_argument("--plan", required=True)
    p.add_argument("--pairs", type=int, default=1000)
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--json")
    p.add_argument("--out-model", help="also write the fine-tuned FP32 model (.onnx)")
    p.add_argument("--out-plan", help="also write the plan with the learned ranges pinned")
    args = p.parse_args()
    if bool(args.out_model) != bool(args.out_plan):
        p.error("--out-model and --out-plan go together (the plan pins the model's ranges)")
    t0 = time.perf_counter()
    model = open_model(args.model)
    data = open_data(STDLIB_DOCS, model, max_pairs=args.pairs)
    if args.seq_len:
        data = at_length(data, args.seq_len)
    stats, plan = read_stats(args.stats), read_plan(args.plan)
    weights, ranges = load_delta(args.delta, fp32_weights(model))
    res = SimpleNamespace(weights=weights, ranges=ranges,
                          summary=lambda: f"fine-tune read from {args.delta}")
    ft_model, ft_plan = finetuned_model(model, res), finetuned_plan(plan, res)  # type: ignore[arg-type]
    if args.out_model:
        write_onnx(args.out_model, ft_model.proto)
        write_plan(args.out_plan, ft_plan)
        print(f"wrote {args.out_model} and {args.out_plan}")
    scheme = load_target(plan.target or "hailo10h").scheme
    ref = run_model(model.proto, list(data.evaluation))
    out = evaluate_plans(ft_model, data, stats, {"after": ft_plan, "fp32": Plan.uniform(
        Precision.FLOAT)}, scheme=scheme, reference=model, reference_outputs=ref)
    pick = {k: {m: round(float(out[k]["metrics"][m]), 5) for m in KEYS
                if m in out[k]["metrics"]} for k in ("after", "fp32")}
    print(f"after: {pick['after']}\nfine-tuned FP32 vs original: {pick['fp32']}\n"
          f"{len(weights)} weights, {len(ranges)} ranges; wall {time.perf_counter() - t0:.0f} s")
    if args.json:
        import json

        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"delta": args.delta, "after": pick["after"],
                       "finetuned_fp32_vs_original": pick["fp32"]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
