"""repair: repairs without 16 bit (equalisation, smoothing, bias correction, ranges)."""

from __future__ import annotations

import argparse

from quantscope import serde, stages
from quantscope.cli.inputs import open_dataset, plan_of
from quantscope.cli.options import (
    command,
    data_parent,
    model_parent,
    output_parent,
    pairs_parent,
    plan_parent,
    stats_parent,
    tokenizer_parent,
)
from quantscope.cli.types import output_file, positive_int, repair_names
from quantscope.emulate.evaluate import run_model
from quantscope.repair.apply import run_repairs
from quantscope.repair.registry import DEFAULT_REPAIRS, REGISTRY
from quantscope.report import fmt


def add_repair(sub: argparse._SubParsersAction, summary: str) -> None:
    rp = command(sub, "repair", summary,
                 example="quantscope repair minilm-l6 --data stdlib-docs --stats stats.npz "
                 "--precision a8_w8 --out-model r.onnx --out-stats r.npz --out-plan r.json",
                 parents=(model_parent(), data_parent(), output_parent(), stats_parent(),
                          plan_parent(), tokenizer_parent(), pairs_parent(1000, "evaluated")))
    rp.add_argument("--repairs", default=None, type=repair_names,
                    help=f"comma list of {', '.join(REGISTRY)}; default: the repairs the "
                    f"plan lists (from `plan --repairs`), else {','.join(DEFAULT_REPAIRS)} "
                    "(split is never a default: it widens layers)")
    rp.add_argument("--proxy", default="local", choices=["local", "output"],
                    help="range choice by local histogram error (fast) or output error "
                    "(default: local)")
    rp.add_argument("--repair-batches", "--batches", dest="batches", type=positive_int,
                    default=8, help="calibration batches the repairs use (default 8)")
    rp.add_argument("--no-evaluate", action="store_true",
                    help="skip measuring the metrics before and after the repairs")
    rp.add_argument("--out-model", type=output_file, required=True,
                    help="repaired FP32 model to write (.onnx, for the vendor compiler)")
    rp.add_argument("--out-stats", type=output_file, required=True,
                    help="stats of the repaired model to write")
    rp.add_argument("--out-plan", type=output_file, required=True,
                    help="plan to write, with the chosen ranges and the repairs applied")


def cmd_repair(args: argparse.Namespace) -> int:
    model = stages.open_model(args.model)
    data = open_dataset(args, model)
    stats = stages.read_stats(args.stats)
    plan = plan_of(args)
    feeds, data, split_note = stages.held_out(data, args.batches)
    for note in (*model.notes, split_note):  # the loader's form (float16 widened …) first
        if note:
            print(f"note: {note}")
    names = args.repairs or dict(plan.meta).get("repairs") or ",".join(DEFAULT_REPAIRS)
    out = run_repairs(model, stats, plan, feeds, repairs=names.split(","),
                      proxy=args.proxy, scheme=stages.scheme_for(plan), progress=True,
                      task=data.task)
    for r in out.records:
        fp32 = "" if r.fp32_check is None else f"  fp32 max|diff| {r.fp32_check:.2g}"
        print(f"{r.name:<9} {r.seconds:6.1f} s  changed {len(r.changed):3d}  "
              + (f"skipped: {r.skipped}" if r.skipped else f"{r.reason}{fp32}"))
    repaired = stages.load_proto(out.proto, f"{model.source} (repaired)")
    if not args.no_evaluate:
        ref = run_model(model.proto, list(data.evaluation), label="fp32")
        before = stages.evaluate_plan(model, data, stats, plan, progress=True,
                                      reference_outputs=ref)
        after = stages.evaluate_plan(repaired, data, out.stats, out.plan, progress=True,
                                     reference_outputs=ref)
        for key in sorted(set(before["metrics"]) & set(after["metrics"])):
            print(f"  {key:<24} {fmt.value(key, before['metrics'][key]):>10} -> "
                  f"{fmt.value(key, after['metrics'][key])}")  # shares in percent
    serde.write_atomic_set([
        (args.out_model, serde.onnx_writer(out.proto)),
        (args.out_stats, serde.stats_writer(out.stats)),
        (args.out_plan, serde.plan_writer(out.plan,
                                          {"repairs": [r.to_json() for r in out.records]})),
    ])
    print(f"wrote {args.out_model} (repaired FP32 model for the vendor compiler), "
          f"{args.out_stats}, {args.out_plan}")
    return 0
