"""Command line: one subcommand per stage, reading and writing the stages' files.

Every user error is one line on stderr and exit code 2; outputs are written atomically,
so a failed command leaves no file behind.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from quantscope import stages
from quantscope.types import Plan, Precision, QuantscopeError

EXIT_USER, EXIT_INTERNAL, EXIT_PROBLEMS = 2, 3, 1


def _add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="ONNX file or built-in model name (see 'quantscope models')")


def _add_plan_choice(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    g = p.add_mutually_exclusive_group(required=required)
    g.add_argument("--precision", help="uniform precision: " + ", ".join(x.value for x in Precision))
    g.add_argument("--plan", help="plan JSON (group name -> precision, with a default)")


def _plan_from_args(args: argparse.Namespace) -> Plan:
    if getattr(args, "plan", None):
        return stages.read_plan(args.plan)
    return Plan.uniform(Precision.parse(args.precision))


def cmd_calibrate(args: argparse.Namespace) -> int:
    model = stages.open_model(args.model)
    data = stages.open_data(args.data, model, tokenizer=args.tokenizer)
    stats = stages.calibrate_model(model, data, method=args.method, progress=True)
    stages.write_stats(args.out, stats)
    print(f"wrote {args.out}: {len(stats.tensors)} tensors, {stats.num_samples} samples, "
          f"{stats.num_batches} batches, method {stats.method}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    model = stages.open_model(args.model)
    data = stages.open_data(args.data, model, tokenizer=args.tokenizer)
    stats = stages.read_stats(args.stats)
    plan = _plan_from_args(args)
    result = stages.evaluate_plan(model, data, stats, plan, method=args.method, progress=True)
    print(stages.format_result(result))
    if args.json:
        stages.write_json(args.json, result)
        print(f"wrote {args.json}")
    return 0


def cmd_export_qdq(args: argparse.Namespace) -> int:
    model = stages.open_model(args.model)
    stats = stages.read_stats(args.stats)
    plan = _plan_from_args(args)
    proto, notes = stages.qdq_for_plan(model, stats, plan, method=args.method)
    stages.write_onnx(args.out, proto)
    for note in notes:
        print(f"note: {note}")
    print(f"wrote {args.out} ({len(proto.graph.node)} nodes, opset {stages.opset_of(proto)})")
    return 0


def cmd_groups(args: argparse.Namespace) -> int:
    model = stages.open_model(args.model)
    rows = stages.describe_groups(model)
    if args.json:
        stages.write_json(args.json, rows)
    for r in rows:
        print(f"{r['kind']:<10} {r['op_type']:<20} {r['name']}  shape={r['output_shape']}")
    print(f"{len(rows)} groups")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from quantscope.demo import format_table, run_demo

    out = run_demo(args.model, args.data, method=args.method,
                   max_pairs=None if args.pairs == 0 else args.pairs)
    print(f"\nquantscope demo: {out['model']} on {out['data']} "
          f"(calibration: {out['calibration_samples']} texts, {out['method']}; "
          f"{out['seconds']} s)\n")
    print(format_table(out["results"]))
    for note in out["notes"]:
        print(f"note: {note}")
    if args.json:
        stages.write_json(args.json, out)
        print(f"wrote {args.json}")
    if args.report:
        from quantscope.report import report_html

        stages.write_text(args.report, report_html(
            f"quantscope demo: {out['model']} on {out['data']}", results=out["results"]))
        print(f"wrote {args.report}")
    return 0


def cmd_repair(args: argparse.Namespace) -> int:
    from quantscope.repair.apply import DEFAULT_REPAIRS, apply_repairs

    model = stages.open_model(args.model)
    data = stages.open_data(args.data, model, tokenizer=args.tokenizer, max_pairs=args.pairs)
    stats = stages.read_stats(args.stats)
    plan = _plan_from_args(args)
    feeds = list(data.calibration)[: args.batches]
    names = args.repairs or dict(plan.meta).get("repairs") or ",".join(DEFAULT_REPAIRS)
    out = apply_repairs(model, stats, plan, feeds, repairs=names.split(","),
                        proxy=args.proxy, scheme=stages.scheme_for(plan), progress=True)
    for r in out.records:
        print(f"{r['name']:<16} {r['seconds']:6.1f} s  changed {len(r['changed']):3d}  "
              f"{r['reason']}")
    repaired = stages.load_proto(out.proto, f"{model.source} (repaired)")
    if not args.no_evaluate:
        from quantscope.emulate.evaluate import run_model

        ref = run_model(model.proto, list(data.evaluation), label="fp32")
        before = stages.evaluate_plan(model, data, stats, plan, progress=True,
                                      reference_outputs=ref)
        after = stages.evaluate_plan(repaired, data, out.stats, out.plan, progress=True,
                                     reference_outputs=ref)
        for key in sorted(set(before["metrics"]) & set(after["metrics"])):
            print(f"  {key:<24} {before['metrics'][key]:>10.4g} -> {after['metrics'][key]:.4g}")
    stages.write_onnx(args.out_model, out.proto)
    stages.write_stats(args.out_stats, out.stats)
    stages.write_plan(args.out_plan, out.plan, {"repairs": list(out.records)})
    print(f"wrote {args.out_model} (repaired FP32 model for the vendor compiler), "
          f"{args.out_stats}, {args.out_plan}")
    return 0


def cmd_analyze(args: argparse.Namespace) -> int:
    from quantscope.analyze import analysis_to_dict, analyze, summary_text
    from quantscope.model.groups import find_groups

    model = stages.open_model(args.model)
    data = stages.open_data(args.data, model, tokenizer=args.tokenizer, max_pairs=args.pairs)
    stats = stages.read_stats(args.stats)
    target = _target(args.target) if args.target else None
    result = analyze(model, find_groups(model), stats, list(data.evaluation),
                     scorer=stages.scorer_for(data), low=Precision.parse(args.low),
                     high=Precision.parse(args.high), target=target,
                     proxy_fraction=args.proxy, progress=True)
    print(summary_text(result))
    stages.write_json(args.out, analysis_to_dict(result))
    print(f"wrote {args.out}")
    return 0


def _target(name: str) -> object:
    from quantscope.targets import load_target

    return load_target(name)


def cmd_plan(args: argparse.Namespace) -> int:
    from quantscope.plan.search import plan_from_analysis
    from quantscope.serde import read_sensitivity

    model = stages.open_model(args.model)
    target = _target(args.target)
    sens = read_sensitivity(args.analysis)
    evaluate = None
    if args.min_quality is not None and args.data:
        raise QuantscopeError(
            "--min-quality is in the analysis' predicted metric (output SQNR, dB) while "
            "--data measures the task metric: use --max-cost with --data, or --min-quality "
            "without --data"
        )
    if args.repairs and not (args.data and args.stats):
        raise QuantscopeError("--repairs needs --data and --stats: repairs are measured")
    offer = None
    if args.data and args.stats:
        data = stages.open_data(args.data, model, tokenizer=args.tokenizer, max_pairs=args.pairs)
        stats = stages.read_stats(args.stats)
        if args.repairs:
            from quantscope.emulate.evaluate import run_model

            ref = run_model(model.proto, list(data.evaluation), label="fp32")
            feeds = list(data.calibration)[: args.repair_batches]
            offer = stages.plan_repair_offer(model, data, stats, sens, target,
                                             args.repairs.split(","), feeds,
                                             task_metric=args.metric, shapes=_shapes(args, model),
                                             reference_outputs=ref, progress=True)
            evaluate = stages.plan_evaluator(model, data, stats, args.metric, feeds,
                                             target=target, reference_outputs=ref, progress=True)
        else:
            evaluate = stages.plan_evaluator(model, data, stats, args.metric, target=target)
    plan, extra = plan_from_analysis(model, sens, target, min_quality=args.min_quality,
                                     max_cost=args.max_cost, shapes=_shapes(args, model),
                                     evaluate=evaluate, seed=args.seed,
                                     repairs=offer.options if offer else ())
    if offer is not None:
        extra["repair_offer"] = {"measured": list(offer.measured), "notes": list(offer.notes)}
        for row in offer.measured:
            print(f"  repair {row['name']:<9} " + ", ".join(
                f"{k} {v}" for k, v in row.items() if k != "name"))
        for note in offer.notes:
            print(f"  {note}")
    if args.goal is not None:
        extra["pareto"]["goal"] = stages.goal_verdict(extra["pareto"], args.metric, args.goal)
    stages.write_plan(args.out, plan, extra)
    front = extra["pareto"]
    print(stages.format_search(front))
    print(f"wrote {args.out}")
    return 0


def cmd_io(args: argparse.Namespace) -> int:
    from quantscope.export.device_io import format_device_io

    model = stages.open_model(args.model)
    stats = stages.read_stats(args.stats)
    plan = _plan_from_args(args)
    print(format_device_io(stages.device_io_rows(model, stats, plan)))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from quantscope.report import report_html

    results: dict = {}
    for path in args.results or []:
        obj = stages.read_json_file(path, "results")
        results.update(obj["results"] if "results" in obj else {Path(path).stem: obj})
    plan = stages.read_json_file(args.plan, "plan") if args.plan else None
    analysis = stages.read_json_file(args.analysis, "analysis") if args.analysis else None
    io_rows = problems = None
    if args.model and args.stats and args.plan:
        model = stages.open_model(args.model)
        parsed = stages.read_plan(args.plan)
        io_rows = stages.device_io_rows(model, stages.read_stats(args.stats), parsed)
        problems = stages.plan_problems(model, parsed, seq_len=args.seq_len)
    if not (results or plan or analysis):
        raise QuantscopeError("nothing to report: give --results, --plan and/or --analysis")
    stages.write_text(args.out, report_html(args.title, results=results or None, plan=plan,
                                            analysis=analysis, io_rows=io_rows,
                                            problems=problems))
    print(f"wrote {args.out}")
    return 0


def _shapes(args: argparse.Namespace, model: stages.Model) -> dict | None:
    from quantscope.model.shapes import seq_len_shapes

    return seq_len_shapes(model, args.seq_len) if args.seq_len else None


def _print_problems(problems: list, what: str) -> int:
    errors = [p for p in problems if p.severity == "error"]
    for p in problems:
        print(f"{p.severity}: [{p.rule}] {p.group}: {p.reason}")
        print(f"    fix: {p.fix}    (source: {p.provenance})")
    print(f"{what}: {len(errors)} error(s), {len(problems) - len(errors)} warning(s)")
    return EXIT_PROBLEMS if errors else 0


def cmd_check(args: argparse.Namespace) -> int:
    from quantscope.model.groups import find_groups
    from quantscope.plan.check import check
    from quantscope.targets import load_target

    model = stages.open_model(args.model)
    target = load_target(args.target)
    plan = stages.read_plan(args.plan)
    problems = check(plan, find_groups(model), model, target, shapes=_shapes(args, model))
    return _print_problems(problems, f"check {args.plan} on {target.name}")


def cmd_lint(args: argparse.Namespace) -> int:
    from quantscope.export.alls_lint import lint
    from quantscope.model.groups import find_groups
    from quantscope.targets import load_target

    model = stages.open_model(args.model)
    target = load_target(args.target)
    text = stages.read_text(args.script, "model script")
    hn = stages.read_json_file(args.hn, "HN") if args.hn else None
    problems = lint(text, model, find_groups(model), target, hn=hn, shapes=_shapes(args, model))
    return _print_problems(problems, f"lint {args.script} on {target.name}")


def cmd_export(args: argparse.Namespace) -> int:
    model = stages.open_model(args.model)
    stats = stages.read_stats(args.stats)
    plan = stages.read_plan(args.plan)
    hn = stages.read_json_file(args.hn, "HN") if args.hn else None
    written = stages.export_plan(model, stats, plan, fmt=args.format, out=args.out, hn=hn,
                                 qnn_version=args.qnn_version)
    print(f"wrote {written}")
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="quantscope",
        description="Emulate INT8/INT16 quantization of an ONNX model for edge NPUs, "
        "measure task quality, diagnose layers, plan and export mixed precision.",
    )
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("calibrate", help="stream data through the model, write a stats file")
    _add_model(c)
    c.add_argument("--data", required=True, help=".npy/.npz/folder, or a built-in data name")
    c.add_argument("--out", required=True, help="stats file to write (.npz)")
    c.add_argument("--method", default="minmax", choices=["minmax", "percentile", "mse"])
    c.add_argument("--tokenizer", help="tokenizer.json or HF folder (text models)")
    c.set_defaults(func=cmd_calibrate)

    e = sub.add_parser("evaluate", help="emulate a precision/plan and measure fidelity to FP32")
    _add_model(e)
    e.add_argument("--data", required=True)
    e.add_argument("--stats", required=True)
    _add_plan_choice(e)
    e.add_argument("--method", choices=["minmax", "percentile", "mse"],
                   help="range setting (default: the one the stats were made with)")
    e.add_argument("--json", help="also write the result as JSON")
    e.add_argument("--tokenizer")
    e.set_defaults(func=cmd_evaluate)

    x = sub.add_parser("export-qdq", help="write the ONNX QDQ model that emulation runs")
    _add_model(x)
    x.add_argument("--stats", required=True)
    _add_plan_choice(x)
    x.add_argument("--method", choices=["minmax", "percentile", "mse"])
    x.add_argument("--out", required=True)
    x.set_defaults(func=cmd_export_qdq)

    g = sub.add_parser("groups", help="list the decision groups of a model")
    _add_model(g)
    g.add_argument("--json")
    g.set_defaults(func=cmd_groups)
    d = sub.add_parser("demo", help="the main job: FP32 vs a8_w8/a16_w8/a16_w16 on the "
                       "built-in sentence encoder and retrieval task")
    d.add_argument("--model", default="minilm-l6")
    d.add_argument("--data", default="stdlib-docs")
    d.add_argument("--method", default="minmax", choices=["minmax", "percentile", "mse"])
    d.add_argument("--pairs", type=int, default=1000, help="retrieval pairs (0 = all)")
    d.add_argument("--json", help="also write the table and all metrics as JSON")
    d.add_argument("--report", help="also write a self-contained HTML report")
    d.set_defaults(func=cmd_demo)

    rp = sub.add_parser("repair", help="repairs without 16 bit: equalisation, outlier "
                        "smoothing, bias correction, per-tensor ranges")
    _add_model(rp)
    rp.add_argument("--data", required=True)
    rp.add_argument("--stats", required=True)
    _add_plan_choice(rp)
    rp.add_argument("--repairs", default=None,
                    help="comma list of equalize, smooth, split, bias, adaround, ranges; "
                    "default: the repairs the plan lists (from `plan --repairs`), else "
                    "equalize,smooth,bias,ranges (split is never a default: it widens layers)")
    rp.add_argument("--proxy", default="local", choices=["local", "output"],
                    help="range choice by local histogram error (fast) or output error")
    rp.add_argument("--batches", type=int, default=8, help="calibration batches used")
    rp.add_argument("--no-evaluate", action="store_true")
    rp.add_argument("--pairs", type=int, default=1000, help="retrieval pairs evaluated")
    rp.add_argument("--tokenizer")
    rp.add_argument("--out-model", required=True)
    rp.add_argument("--out-stats", required=True)
    rp.add_argument("--out-plan", required=True)
    rp.set_defaults(func=cmd_repair)

    an = sub.add_parser("analyze", help="which layers break the low precision, and why")
    _add_model(an)
    an.add_argument("--data", required=True)
    an.add_argument("--stats", required=True)
    an.add_argument("--target", help="target profile (its quantization scheme is used)")
    an.add_argument("--low", default="a8_w8")
    an.add_argument("--high", default="a16_w16")
    an.add_argument("--pairs", type=int, default=128, help="retrieval pairs analysed")
    an.add_argument("--proxy", type=float, default=0.125,
                    help="row-cost budget of the sweeps: enable-one on every "
                    "round(2/PROXY)-th row, disable-one on the noisiest rows worth PROXY of "
                    "the row cost (1.0 = exact, every row, task metric per candidate)")
    an.add_argument("--tokenizer")
    an.add_argument("--out", required=True)
    an.set_defaults(func=cmd_analyze)

    pl = sub.add_parser("plan", help="search a legal mixed-precision plan (Pareto front)")
    _add_model(pl)
    pl.add_argument("--analysis", required=True)
    pl.add_argument("--target", required=True)
    budget = pl.add_mutually_exclusive_group()
    budget.add_argument("--min-quality", type=float)
    budget.add_argument("--max-cost", type=float, help="relative to uniform a8_w8 = 1.0")
    pl.add_argument("--seq-len", type=int, help="sequence length for symbolic token dims")
    pl.add_argument("--data", help="with --stats: refine the front by real emulation")
    pl.add_argument("--stats")
    pl.add_argument("--metric", default="top1_agreement")
    pl.add_argument("--goal", type=float, help="with --data: the measured metric to reach; "
                    "the output says whether it was reached and which rule binds if not")
    pl.add_argument("--pairs", type=int, default=300)
    pl.add_argument("--repairs", help="with --data/--stats: comma list of repairs to search "
                    "together with the precisions (each measured; see docs/planner.md)")
    pl.add_argument("--repair-batches", type=int, default=8,
                    help="calibration batches the repairs use")
    pl.add_argument("--seed", type=int, default=0)
    pl.add_argument("--tokenizer")
    pl.add_argument("--out", required=True)
    pl.set_defaults(func=cmd_plan)

    io_ = sub.add_parser("io", help="how to feed and read the deployed model (scale, zero "
                         "point, stored type of every quantized input/output)")
    _add_model(io_)
    io_.add_argument("--stats", required=True)
    _add_plan_choice(io_)
    io_.set_defaults(func=cmd_io)

    r = sub.add_parser("report", help="one self-contained HTML report from result files")
    r.add_argument("--out", required=True)
    r.add_argument("--results", nargs="*", help="demo/evaluate JSON files")
    r.add_argument("--plan", help="plan JSON (Pareto front, decisions)")
    r.add_argument("--analysis", help="analysis JSON")
    r.add_argument("--model", help="with --stats and --plan: device I/O and legality")
    r.add_argument("--stats")
    r.add_argument("--seq-len", type=int)
    r.add_argument("--title", default="quantscope report")
    r.set_defaults(func=cmd_report)

    k = sub.add_parser("check", help="legality preflight of a plan on a target")
    k.add_argument("plan")
    k.add_argument("--model", required=True)
    k.add_argument("--target", required=True, help="hailo8, hailo8l, hailo10h, qnn-htp-v73, "
                   "ort-cpu or a TOML file")
    k.add_argument("--seq-len", type=int, help="sequence length for symbolic token dims")
    k.set_defaults(func=cmd_check)

    li = sub.add_parser("lint", help="preflight of a Hailo model script (.alls)")
    li.add_argument("script")
    li.add_argument("--model", required=True)
    li.add_argument("--target", required=True)
    li.add_argument("--hn", help="parsed model HN JSON (exact layer-name mapping)")
    li.add_argument("--seq-len", type=int)
    li.set_defaults(func=cmd_lint)

    ex = sub.add_parser("export", help="export a plan: Hailo .alls, QNN encodings, ONNX QDQ")
    ex.add_argument("plan")
    ex.add_argument("--model", required=True)
    ex.add_argument("--stats", required=True)
    ex.add_argument("--format", required=True, choices=["alls", "qnn", "qdq"])
    ex.add_argument("--qnn-version", default="1.0.0", choices=["1.0.0", "0.6.1"])
    ex.add_argument("--hn", help="parsed model HN JSON for exact Hailo layer names")
    ex.add_argument("--out", required=True)
    ex.set_defaults(func=cmd_export)
    return p


def _run(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    try:
        return func(args)
    except QuantscopeError as exc:
        print(f"quantscope: error: {exc}", file=sys.stderr)
        return EXIT_USER
    except KeyboardInterrupt:
        print("quantscope: interrupted", file=sys.stderr)
        return 130
    except MemoryError:
        print("quantscope: error: out of memory: use fewer or smaller batches", file=sys.stderr)
        return EXIT_USER
    except Exception as exc:  # last resort: one line, never a traceback unless asked
        if os.environ.get("QUANTSCOPE_DEBUG"):
            traceback.print_exc()
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        print(f"quantscope: internal error: {type(exc).__name__}: {first} "
              "(set QUANTSCOPE_DEBUG=1 for the traceback and report it)", file=sys.stderr)
        return EXIT_INTERNAL


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return _run(args.func, args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

