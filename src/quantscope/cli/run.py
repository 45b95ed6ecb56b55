"""run, route, buckets: model to device in one command, and deployments of length buckets."""

from __future__ import annotations

import argparse
from pathlib import Path

from quantscope import stages, stages_route
from quantscope.cli.inputs import input_shapes, open_inputs
from quantscope.cli.options import (
    add_layout,
    command,
    data_parent,
    method_parent,
    model_parent,
    pairs_parent,
    seq_len_parent,
    target_parent,
    tokenizer_parent,
)
from quantscope.cli.types import (
    count,
    data_spec,
    finite_float,
    fraction,
    input_file,
    lengths,
    merged_batch_axes,
    output_file,
    positive_float,
    positive_int,
    run_folder,
    run_repair_names,
)
from quantscope.pipeline import RunOptions, run_pipeline
from quantscope.pipeline.verdict import format_verdict
from quantscope.tasks.layout import layout_tasks
from quantscope.types import QuantscopeError

RUN_STAGES = ("calibrate", "analyze", "plan", "repair", "check", "evaluate", "export", "io",
              "report")
RUN_EXAMPLE = ("quantscope run minilm-l6 --data stdlib-docs --target hailo10h --goal 0.97 "
               "--max-cost 1.5 --out W")


def add_run(sub: argparse._SubParsersAction, summary: str) -> None:
    ru = command(sub, "run", summary, example=RUN_EXAMPLE,
                 parents=(model_parent(), data_parent(), target_parent(help="target profile"),
                          seq_len_parent(), method_parent("minmax"), tokenizer_parent(),
                          pairs_parent(300, "fitting the plan (and as many held out)")),
                 details="Every stage writes its file into the run folder; run it again and "
                 "the stages already done on the same inputs are skipped (--force STAGE "
                 "reruns from STAGE). The options, the model, the data and the target are "
                 "checked before any stage runs.")
    add_layout(ru)
    ru.add_argument("--eval-data", type=data_spec, help="held-out evaluation data (default: "
                    "split DATA, or the pairs after --pairs for retrieval data)")
    ru.add_argument("--goal", type=finite_float, help="the measured metric to reach on the "
                    "held-out data (the verdict says if it is and what binds if not; default: "
                    "none: the verdict gives the metric without judging it)")
    ru.add_argument("--max-cost", type=positive_float, help="relative to uniform a8_w8 = 1.0 "
                    "(default: none: the best quality, whatever it costs)")
    ru.add_argument("--metric", help="the measured metric (default: the task's: "
                    "top1_agreement for retrieval, decision_agreement for faces, else "
                    "sqnr_db, the output SQNR in dB)")
    ru.add_argument("--repairs", type=run_repair_names, help="repairs the plan search may "
                    "choose, comma list, or 'none' (default: the default repairs of "
                    "'quantscope repair')")
    ru.add_argument("--hn", type=input_file("HN", "pass the parsed model's .hn JSON"),
                    help="parsed model HN JSON (exact Hailo layer names in the .alls)")
    ru.add_argument("--repair-batches", type=positive_int, default=8,
                    help="calibration batches the repairs use (default 8)")
    _add_rewrite_options(ru)
    ru.add_argument("--whatif", action="store_true",
                    help="also measure where the final plan's error is ('quantscope whatif': "
                    "the plan with each op kind it keeps below 16 bit lifted to a16_w16, on "
                    "the held-out data; one evaluation per kind): in the verdict and report")
    ru.add_argument("--proxy", type=fraction, default=0.125, help="analysis row budget (see "
                    "'quantscope analyze --help'; default 0.125)")
    ru.add_argument("--force", metavar="STAGE", choices=RUN_STAGES, help="rerun from STAGE "
                    "(calibrate, analyze, plan, repair, check, evaluate, export, io, report)")
    ru.add_argument("--out", dest="folder", type=run_folder, required=True,
                    help="run folder (created; every stage's file, run.json, report.html)")


def _add_rewrite_options(ru: argparse.ArgumentParser) -> None:
    """run's rewrites: the model the stages work on, rewritten first (FP32 unchanged)."""
    ru.add_argument("--tokensplit", dest="token_chunk", type=positive_int, metavar="N",
                    help="work on the model with its LayerNorms and residual Adds split into "
                    "layers of N tokens (below --seq-len; 'quantscope tokensplit'): 16 bit on "
                    "them then fits hailo.super_defuse (unverified on a device)")
    ru.add_argument("--tokensplit-linears", dest="token_linears", action="store_true",
                    help="with --tokensplit: the token-wise Linears in chunks too "
                    "('quantscope tokensplit --linears')")
    ru.add_argument("--headsplit", dest="heads", action="store_true",
                    help="work on the model with each attention head a layer of its own "
                    "('quantscope headsplit'): every head's 8-bit scores, Softmax and "
                    "context get their own grid (unverified on a device)")
    ru.add_argument("--rowscale", action="store_true",
                    help="work on the model with each attention's 8-bit weights scaled per "
                    "row before the context MatMul and the context divided by their sum "
                    "('quantscope rowscale', after --headsplit): plan '<Softmax>/w' at 8 "
                    "bit (unverified on a device)")
    ru.add_argument("--outscale", action="store_true",
                    help="work on the model with its residual-branch Linears writing "
                    "equalized output channels ('quantscope outscale'; calibrates the given "
                    "model first): plan the new skip-branch Muls at 16 bit (unverified on a "
                    "device)")
    ru.add_argument("--peel", action="store_true",
                    help="work on the model with each FFN's outlier hidden channels in a "
                    "small FFN of their own ('quantscope peel'; calibrates the given model "
                    "first, once with --outscale): plan the new '<Add>/peel' groups at 16 "
                    "bit (unverified on a device)")


def cmd_run(args: argparse.Namespace) -> int:
    repairs = {} if args.repairs is None else {
        "repairs": () if args.repairs == "none" else tuple(args.repairs.split(","))}
    opts = RunOptions(model=args.model, data=args.data, target=args.target, out=args.folder,
                      eval_data=args.eval_data, goal=args.goal, max_cost=args.max_cost,
                      seq_len=args.seq_len, input_shapes=input_shapes(args),
                      pairs=None if args.pairs == 0 else args.pairs,
                      metric=args.metric, tokenizer=args.tokenizer, hn=args.hn,
                      method=args.method, proxy=args.proxy,
                      repair_batches=args.repair_batches, token_chunk=args.token_chunk,
                      token_linears=args.token_linears, heads=args.heads,
                      outscale=args.outscale, peel=args.peel, rowscale=args.rowscale,
                      whatif=args.whatif, layout=tuple(args.layout),
                      batch_axes=tuple(merged_batch_axes(args.batch_axis).items()),
                      **repairs)
    if args.layout:  # checked against the model's outputs before the run folder is made
        layout_tasks(stages.open_model(args.model), tuple(args.layout), args.data)
    out = run_pipeline(opts, force=args.force, progress=True)
    print(format_verdict(out.verdict))
    print(f"stages run: {', '.join(out.ran) or 'none'}; skipped (done): "
          f"{', '.join(out.skipped) or 'none'}; files in {out.folder}/ (report.html)")
    return 0


def add_route(sub: argparse._SubParsersAction, summary: str) -> None:
    ro = command(sub, "route", summary,
                 example="quantscope route minilm-l6 --data stdlib-docs --pairs 600 "
                 "--deployment deployment.json --max-cost 1.5 --goal 0.97",
                 parents=(model_parent(), data_parent(), tokenizer_parent(),
                          pairs_parent(None, "evaluated")),
                 details="MODEL is the FP32 reference (the metrics compare with "
                 "it; its uniform a8_w8 at the longest bucket is the cost unit). Each "
                 "bucket is a model file (the reference or a rewrite of it: tokensplit, "
                 "headsplit, ...), its stats and its plan, checked at its own length. "
                 "The deployment file: {\"buckets\": [{\"seq_len\": 128, \"model\": "
                 "\"m.onnx\", \"stats\": \"m.npz\", \"plan\": \"p128.json\"}, ...]} "
                 "(paths relative to its folder).")
    ro.add_argument("--deployment", type=input_file("deployment", "write the buckets file "
                    "(see 'quantscope route --help')"), required=True,
                    help="deployment JSON: the buckets")
    ro.add_argument("--max-cost", type=positive_float,
                    help="say whether the mean cost is within this (x uniform a8_w8; "
                    "default: none, not judged)")
    ro.add_argument("--goal", type=finite_float,
                    help="say whether the routed top-1 agreement (retrieval) reaches this "
                    "(default: none, not judged)")
    ro.add_argument("--json", type=output_file, help="also write the result as JSON")


def cmd_route(args: argparse.Namespace) -> int:
    deployment = stages_route.read_deployment(args.deployment)
    inp = open_inputs(args, data=True)
    assert inp.data is not None
    result = stages_route.evaluate_deployment(inp.model, inp.data, deployment, progress=True)
    verdict = stages_route.deployment_verdict(result, max_cost=args.max_cost, goal=args.goal)
    if verdict is not None:
        result["verdict"] = verdict
    print(stages_route.format_deployment(result))
    if args.json:
        stages.write_json(args.json, result)
        print(f"wrote {args.json}")
    return 0


def add_buckets(sub: argparse._SubParsersAction, summary: str) -> None:
    bu = command(sub, "buckets", summary,
                 example="quantscope buckets minilm-l6 --data stdlib-docs --pairs 600 "
                 "--skip-pairs 300 --candidates candidates.json --max-cost 1.5 "
                 "--out deployment.json",
                 parents=(model_parent(), data_parent(), tokenizer_parent(),
                          pairs_parent(None, "loaded")),
                 details="MODEL is the FP32 reference. Every candidate (a model "
                 "file: the reference or a rewrite of it, its stats and a plan) runs "
                 "once on the texts of the pairs after the first --skip-pairs; the "
                 "choice minimises their mean 1 - cosine to FP32 with the mean cost "
                 "(x the reference's uniform a8_w8 at the longest length, weighted by "
                 "those texts) within --max-cost, each bucket legal at its length. The "
                 "candidates file: {\"candidates\": [{\"name\": \"all16\", \"model\": "
                 "\"m.onnx\", \"stats\": \"m.npz\", \"plan\": \"p.json\"}, ...]} (paths "
                 "relative to its folder). Measure the result on the held-out pairs: "
                 "'quantscope route MODEL --data D --pairs N --deployment OUT'.")
    bu.add_argument("--candidates", type=input_file("candidates", "write the candidates file "
                    "(see 'quantscope buckets --help')"), required=True,
                    help="candidates JSON: model, stats and plan per candidate")
    bu.add_argument("--max-cost", type=positive_float, required=True,
                    help="the mean cost allowed (x uniform a8_w8 of the reference at the "
                    "longest length)")
    bu.add_argument("--max-buckets", type=positive_int, default=6,
                    help="at most this many compiled lengths (default 6)")
    bu.add_argument("--seq-len", "--lengths", dest="lengths", type=lengths, default=None,
                    metavar="N[,N…]",
                    help="compiled lengths to choose from, comma-separated; the longest is "
                    "always a bucket (default 16,24,32,40,48,56,64,80,96,112,128,160,192,224,256)")
    bu.add_argument("--skip-pairs", type=count, default=0,
                    help="choose on the pairs after the first N (keep those for route; "
                    "default 0)")
    bu.add_argument("--out", type=output_file, required=True,
                    help="deployment JSON to write (route --deployment)")
    bu.add_argument("--json", type=output_file, help="also write the choice as JSON")


def cmd_buckets(args: argparse.Namespace) -> int:
    candidates, target = stages_route.read_candidates(args.candidates)
    for c in candidates:
        for key, p in c.paths:
            if Path(p).exists() and Path(p).resolve() == Path(args.out).resolve():
                raise QuantscopeError(f"--out '{args.out}' is the {key} of candidate "
                                      f"'{c.name}': write the deployment to another path "
                                      "(inputs are never overwritten)")
    inp = open_inputs(args, data=True)
    assert inp.data is not None
    choice = stages_route.choose_deployment(
        inp.model, inp.data, candidates, target, max_cost=args.max_cost,
        seq_lens=args.lengths or stages_route.CHOICE_LENGTHS, max_buckets=args.max_buckets,
        skip_pairs=args.skip_pairs, progress=True)
    print(stages_route.format_choice(choice))
    stages.write_json(args.out, stages_route.deployment_file(choice, args.out))
    print(f"wrote {args.out}")
    if args.json:
        stages.write_json(args.json, choice)
        print(f"wrote {args.json}")
    return 0
