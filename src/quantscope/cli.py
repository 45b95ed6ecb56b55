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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from quantscope import __version__, stages
from quantscope.types import Plan, Precision, QuantscopeError, Stats

if TYPE_CHECKING:
    from quantscope.targets import Target

EXIT_USER, EXIT_INTERNAL, EXIT_PROBLEMS = 2, 3, 1


METHODS = ("minmax", "percentile", "mse")
DATA_HELP = (".npy/.npz file or folder, JSONL query/document pairs, a text file, a face "
             "folder, or a built-in data name (stdlib-docs, faces)")


# ---------------------------------------------------------------- shared options
# One parent parser per input a command can read; each is declared here once, with its help.
# Factories, not shared objects: argparse shares a parent's actions with every child, so a
# per-command default (e.g. --pairs) needs its own parent.


def _parent() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(add_help=False)


def _model_parent(*, option: bool = False) -> argparse.ArgumentParser:
    p, what = _parent(), "ONNX file or built-in model name (see 'quantscope models')"
    if option:
        p.add_argument("--model", required=True, help=what)
    else:
        p.add_argument("model", help=what)
    return p


def _data_parent(*, required: bool = True, help: str = DATA_HELP) -> argparse.ArgumentParser:
    p = _parent()
    p.add_argument("--data", required=required, help=help)
    return p


def _stats_parent(*, required: bool = True, help: str | None = None) -> argparse.ArgumentParser:
    p = _parent()
    p.add_argument("--stats", required=required,
                   help=help or "stats file written by 'quantscope calibrate' (.npz)")
    return p


def _plan_parent() -> argparse.ArgumentParser:
    p = _parent()
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--precision", help="uniform precision: " + ", ".join(x.value for x in Precision))
    g.add_argument("--plan", help="plan JSON (group name -> precision, with a default)")
    return p


def _target_parent(*, required: bool = True, help: str = "") -> argparse.ArgumentParser:
    from quantscope.targets import BUILTIN_TARGETS

    names = ", ".join(n.replace("_", "-") for n in BUILTIN_TARGETS)
    p = _parent()
    p.add_argument("--target", required=required,
                   help=f"{help}{': ' if help else ''}{names} or a target TOML file")
    return p


def _tokenizer_parent() -> argparse.ArgumentParser:
    p = _parent()
    p.add_argument("--tokenizer", help="tokenizer.json or Hugging Face model folder (text "
                   "models; default: the packaged uncased BERT tokenizer of the built-in "
                   "MiniLMs)")
    return p


def _pairs_parent(default: int | None, what: str) -> argparse.ArgumentParser:
    p = _parent()
    p.add_argument("--pairs", type=int, default=default,
                   help=f"retrieval pairs {what} (text retrieval data; "
                   f"default: {default or 'all'}; 0 = all)")
    return p


def _seq_len_parent() -> argparse.ArgumentParser:
    p = _parent()
    p.add_argument("--seq-len", type=int,
                   help="sequence length for symbolic token dims (rules and costs that "
                   "depend on the tensor size)")
    return p


def _method_parent(default: str | None) -> argparse.ArgumentParser:
    p = _parent()
    p.add_argument("--method", default=default, choices=METHODS,
                   help=f"activation range setting (default: {default})" if default else
                   "activation range setting (default: the one the stats were made with)")
    return p


def _hn_parent() -> argparse.ArgumentParser:
    p = _parent()
    p.add_argument("--hn", help="parsed model HN JSON (exact Hailo layer names)")
    return p


# ---------------------------------------------------------------- opening the inputs


@dataclass(frozen=True)
class _Inputs:
    model: stages.Model
    data: stages.Dataset | None
    stats: Stats | None
    target: Target | None
    plan: Plan | None


def _open(args: argparse.Namespace, *, data: bool = False, stats: bool = False,
          target: bool = False, plan: bool = False) -> _Inputs:
    """Open what the command's parent parsers named, in this order (cheap checks first)."""
    model = stages.open_model(args.model)
    tgt = _target(args.target) if target and args.target else None
    ds = stages.open_data(args.data, model, tokenizer=args.tokenizer,
                          max_pairs=getattr(args, "pairs", None)) if data else None
    st = stages.read_stats(args.stats) if stats else None
    return _Inputs(model, ds, st, tgt, _plan_from_args(args) if plan else None)


def _plan_from_args(args: argparse.Namespace) -> Plan:
    if getattr(args, "plan", None):
        return stages.read_plan(args.plan)
    return Plan.uniform(Precision.parse(args.precision))


def cmd_calibrate(args: argparse.Namespace) -> int:
    inp = _open(args, data=True)
    stats = stages.calibrate_model(inp.model, inp.data, method=args.method, progress=True)
    stages.write_stats(args.out, stats)
    print(f"wrote {args.out}: {len(stats.tensors)} tensors, {stats.num_samples} samples, "
          f"{stats.num_batches} batches, method {stats.method}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    inp = _open(args, data=True, stats=True, plan=True)
    result = stages.evaluate_plan(inp.model, inp.data, inp.stats, inp.plan, method=args.method,
                                  progress=True)
    print(stages.format_result(result))
    if args.json:
        stages.write_json(args.json, result)
        print(f"wrote {args.json}")
    return 0


def cmd_export_qdq(args: argparse.Namespace) -> int:
    inp = _open(args, stats=True, plan=True)
    proto, notes = stages.qdq_for_plan(inp.model, inp.stats, inp.plan, method=args.method)
    stages.write_onnx(args.out, proto)
    for note in notes:
        print(f"note: {note}")
    print(f"wrote {args.out} ({len(proto.graph.node)} nodes, opset {stages.opset_of(proto)})")
    return 0


def cmd_groups(args: argparse.Namespace) -> int:
    rows = stages.describe_groups(_open(args).model)
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

    inp = _open(args, data=True, stats=True, target=True)
    result = analyze(inp.model, find_groups(inp.model), inp.stats, list(inp.data.evaluation),
                     scorer=stages.scorer_for(inp.data), low=Precision.parse(args.low),
                     high=Precision.parse(args.high), target=inp.target,
                     proxy_fraction=args.proxy, progress=True)
    print(summary_text(result))
    stages.write_json(args.out, analysis_to_dict(result))
    print(f"wrote {args.out}")
    return 0


def _target(name: str) -> Target:
    from quantscope.targets import load_target

    return load_target(name)


def cmd_plan(args: argparse.Namespace) -> int:
    options = stages.PlanOptions(
        min_quality=args.min_quality, max_cost=args.max_cost, seq_len=args.seq_len,
        metric=args.metric, goal=args.goal, seed=args.seed,
        repairs=tuple(args.repairs.split(",")) if args.repairs else (),
        repair_batches=args.repair_batches)
    options.check_inputs(data=bool(args.data), stats=bool(args.stats))
    analysis = stages.read_json_file(args.analysis, "analysis")
    measure = bool(args.data and args.stats)
    inp = _open(args, target=True, data=measure, stats=measure)
    out = stages.plan_model(inp.model, analysis, inp.target, options, data=inp.data,
                            stats=inp.stats, progress=True)
    if out.offer is not None:
        for row in out.offer.measured:
            print(f"  repair {row['name']:<9} " + ", ".join(
                f"{k} {v}" for k, v in row.items() if k != "name"))
        for note in out.offer.notes:
            print(f"  {note}")
    stages.write_plan(args.out, out.plan, out.file_extra())
    print(stages.format_search(out.pareto))
    print(f"wrote {args.out}")
    return 0


def cmd_io(args: argparse.Namespace) -> int:
    from quantscope.export.device_io import format_device_io

    inp = _open(args, stats=True, plan=True)
    print(format_device_io(stages.device_io_rows(inp.model, inp.stats, inp.plan)))
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
    from quantscope.plan.check import seq_len_shapes

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

    inp = _open(args, target=True, plan=True)
    problems = check(inp.plan, find_groups(inp.model), inp.model, inp.target,
                     shapes=_shapes(args, inp.model))
    return _print_problems(problems, f"check {args.plan} on {inp.target.name}")


def cmd_lint(args: argparse.Namespace) -> int:
    from quantscope.export.alls_lint import lint
    from quantscope.model.groups import find_groups

    inp = _open(args, target=True)
    text = stages.read_text(args.script, "model script")
    hn = stages.read_json_file(args.hn, "HN") if args.hn else None
    problems = lint(text, inp.model, find_groups(inp.model), inp.target, hn=hn,
                    shapes=_shapes(args, inp.model))
    return _print_problems(problems, f"lint {args.script} on {inp.target.name}")


def cmd_export(args: argparse.Namespace) -> int:
    inp = _open(args, stats=True, plan=True)
    hn = stages.read_json_file(args.hn, "HN") if args.hn else None
    written = stages.export_plan(inp.model, inp.stats, inp.plan, fmt=args.format, out=args.out,
                                 hn=hn, qnn_version=args.qnn_version)
    print(f"wrote {written}")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from quantscope.zoo import model_status
    from quantscope.zoo.cache import cache_dir

    rows = model_status()
    width = max(len(f"{r.spec.package} {r.spec.version}") for r in rows)
    print(f"{'name':<10} {'package':<{width}} {'licence':<10} built")
    for r in rows:
        if r.cached:
            built = f"yes: {r.cached}"
        elif r.missing:
            built = (f"no; needs {', '.join(r.missing)}: "
                     f"pip install 'quantscope[{r.spec.extra}]'")
        else:
            built = "no (built once on first use)"
        package = f"{r.spec.package} {r.spec.version}"
        print(f"{r.name:<10} {package:<{width}} {r.spec.licence:<10} {built}")
        print(f"{'':<10} {r.spec.summary}")
    if args.json:
        stages.write_json(args.json, [
            {"name": r.name, "package": r.spec.package, "version": r.spec.version,
             "licence": r.spec.licence, "task": r.spec.task, "summary": r.spec.summary,
             "cached": str(r.cached) if r.cached else None, "missing": list(r.missing)}
            for r in rows])
        print(f"wrote {args.json}")
    print(f"{len(rows)} built-in models; cache {cache_dir()}")
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="quantscope",
        description="Emulate INT8/INT16 quantization of an ONNX model for edge NPUs, "
        "measure task quality, diagnose layers, plan and export mixed precision.",
    )
    p.add_argument("--version", action="version", version=f"quantscope {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    _add_stage_commands(sub)
    _add_planning_commands(sub)
    _add_output_commands(sub)
    return p


def _add_stage_commands(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("calibrate", help="stream data through the model, write a stats file",
                       parents=[_model_parent(), _data_parent(), _method_parent("minmax"),
                                _tokenizer_parent()])
    c.add_argument("--out", required=True, help="stats file to write (.npz)")
    c.set_defaults(func=cmd_calibrate)

    e = sub.add_parser("evaluate", help="emulate a precision/plan and measure fidelity to FP32",
                       parents=[_model_parent(), _data_parent(), _stats_parent(), _plan_parent(),
                                _method_parent(None), _tokenizer_parent(),
                                _pairs_parent(None, "evaluated")])
    e.add_argument("--json", help="also write the result as JSON")
    e.set_defaults(func=cmd_evaluate)

    x = sub.add_parser("export-qdq", help="write the ONNX QDQ model that emulation runs",
                       parents=[_model_parent(), _stats_parent(), _plan_parent(),
                                _method_parent(None)])
    x.add_argument("--out", required=True, help="QDQ model to write (.onnx)")
    x.set_defaults(func=cmd_export_qdq)

    g = sub.add_parser("groups", help="list the decision groups of a model",
                       parents=[_model_parent()])
    g.add_argument("--json", help="also write the groups as JSON")
    g.set_defaults(func=cmd_groups)

    m = sub.add_parser("models", help="list the built-in models: package, version, licence, "
                       "and whether each is built (cached) yet")
    m.add_argument("--json", help="also write the list as JSON")
    m.set_defaults(func=cmd_models)

    d = sub.add_parser("demo", help="the main job: FP32 vs a8_w8/a16_w8/a16_w16 on the "
                       "built-in sentence encoder and retrieval task",
                       parents=[_method_parent("minmax"), _pairs_parent(1000, "evaluated")])
    d.add_argument("--model", default="minilm-l6",
                   help="built-in model name or ONNX file (default: minilm-l6)")
    d.add_argument("--data", default="stdlib-docs",
                   help="built-in retrieval data or a JSONL pairs file (default: stdlib-docs)")
    d.add_argument("--json", help="also write the table and all metrics as JSON")
    d.add_argument("--report", help="also write a self-contained HTML report")
    d.set_defaults(func=cmd_demo)


def _add_planning_commands(sub: argparse._SubParsersAction) -> None:
    rp = sub.add_parser("repair", help="repairs without 16 bit: equalisation, outlier "
                        "smoothing, bias correction, per-tensor ranges",
                        parents=[_model_parent(), _data_parent(), _stats_parent(),
                                 _plan_parent(), _tokenizer_parent(),
                                 _pairs_parent(1000, "evaluated")])
    rp.add_argument("--repairs", default=None,
                    help="comma list of equalize, smooth, split, bias, adaround, ranges; "
                    "default: the repairs the plan lists (from `plan --repairs`), else "
                    "equalize,smooth,bias,ranges (split is never a default: it widens layers)")
    rp.add_argument("--proxy", default="local", choices=["local", "output"],
                    help="range choice by local histogram error (fast) or output error")
    rp.add_argument("--batches", type=int, default=8, help="calibration batches used")
    rp.add_argument("--no-evaluate", action="store_true",
                    help="skip measuring the metrics before and after the repairs")
    rp.add_argument("--out-model", required=True,
                    help="repaired FP32 model to write (.onnx, for the vendor compiler)")
    rp.add_argument("--out-stats", required=True, help="stats of the repaired model to write")
    rp.add_argument("--out-plan", required=True,
                    help="plan to write, with the chosen ranges and the repairs applied")
    rp.set_defaults(func=cmd_repair)

    an = sub.add_parser("analyze", help="which layers break the low precision, and why",
                        parents=[_model_parent(), _data_parent(), _stats_parent(),
                                 _target_parent(required=False, help="target profile (its "
                                                "quantization scheme is used)"),
                                 _tokenizer_parent(), _pairs_parent(128, "analysed")])
    an.add_argument("--low", default="a8_w8", help="the precision to diagnose (default a8_w8)")
    an.add_argument("--high", default="a16_w16",
                    help="the precision a promoted group gets (default a16_w16)")
    an.add_argument("--proxy", type=float, default=0.125,
                    help="row-cost budget of the sweeps: enable-one on every "
                    "round(2/PROXY)-th row, disable-one on the noisiest rows worth PROXY of "
                    "the row cost (1.0 = exact, every row, task metric per candidate)")
    an.add_argument("--out", required=True, help="analysis JSON to write")
    an.set_defaults(func=cmd_analyze)
    _add_plan_command(sub)


def _add_plan_command(sub: argparse._SubParsersAction) -> None:
    pl = sub.add_parser("plan", help="search a legal mixed-precision plan (Pareto front)",
                        parents=[_model_parent(), _target_parent(help="target profile"),
                                 _seq_len_parent(),
                                 _data_parent(required=False, help="with --stats: refine the "
                                              "front by real emulation (" + DATA_HELP + ")"),
                                 _stats_parent(required=False, help="with --data: the stats "
                                               "file of the model"),
                                 _tokenizer_parent(), _pairs_parent(300, "measured")])
    pl.add_argument("--analysis", required=True, help="analysis JSON of 'quantscope analyze'")
    budget = pl.add_mutually_exclusive_group()
    budget.add_argument("--min-quality", type=float,
                        help="the least predicted quality (the analysis' metric, output SQNR "
                        "in dB); not with --data")
    budget.add_argument("--max-cost", type=float, help="relative to uniform a8_w8 = 1.0")
    pl.add_argument("--metric", default="top1_agreement",
                    help="with --data: the measured metric (default top1_agreement)")
    pl.add_argument("--goal", type=float, help="with --data: the measured metric to reach; "
                    "the output says whether it was reached and which rule binds if not")
    pl.add_argument("--repairs", help="with --data/--stats: comma list of repairs to search "
                    "together with the precisions (each measured; see docs/planner.md)")
    pl.add_argument("--repair-batches", type=int, default=8,
                    help="calibration batches the repairs use")
    pl.add_argument("--seed", type=int, default=0,
                    help="recorded in the plan (the search draws no random numbers yet)")
    pl.add_argument("--out", required=True, help="plan JSON to write (with the Pareto front)")
    pl.set_defaults(func=cmd_plan)

    k = sub.add_parser("check", help="legality preflight of a plan on a target",
                       parents=[_model_parent(option=True), _target_parent(),
                                _seq_len_parent()])
    k.add_argument("plan", help="plan JSON to check")
    k.set_defaults(func=cmd_check)

    li = sub.add_parser("lint", help="preflight of a Hailo model script (.alls)",
                        parents=[_model_parent(option=True), _target_parent(), _hn_parent(),
                                 _seq_len_parent()])
    li.add_argument("script", help="Hailo model script (.alls) to lint")
    li.set_defaults(func=cmd_lint)


def _add_output_commands(sub: argparse._SubParsersAction) -> None:
    io_ = sub.add_parser("io", help="how to feed and read the deployed model (scale, zero "
                         "point, stored type of every quantized input/output)",
                         parents=[_model_parent(), _stats_parent(), _plan_parent()])
    io_.set_defaults(func=cmd_io)

    r = sub.add_parser("report", help="one self-contained HTML report from result files",
                       parents=[_stats_parent(required=False, help="with --model and "
                                              "--plan: the stats file of the model"),
                                _seq_len_parent()])
    r.add_argument("--out", required=True, help="HTML file to write")
    r.add_argument("--results", nargs="*", help="demo/evaluate JSON files")
    r.add_argument("--plan", help="plan JSON (Pareto front, decisions)")
    r.add_argument("--analysis", help="analysis JSON")
    r.add_argument("--model", help="with --stats and --plan: device I/O and legality")
    r.add_argument("--title", default="quantscope report", help="title of the page")
    r.set_defaults(func=cmd_report)

    ex = sub.add_parser("export", help="export a plan: Hailo .alls, QNN encodings, ONNX QDQ",
                        parents=[_model_parent(option=True), _stats_parent(), _hn_parent()])
    ex.add_argument("plan", help="plan JSON to export")
    ex.add_argument("--format", required=True, choices=["alls", "qnn", "qdq"],
                    help="alls: Hailo model script; qnn: QNN/AIMET encodings JSON; qdq: ONNX")
    ex.add_argument("--qnn-version", default="1.0.0", choices=["1.0.0", "0.6.1"],
                    help="QNN encodings file version (default 1.0.0)")
    ex.add_argument("--out", required=True, help="file to write")
    ex.set_defaults(func=cmd_export)


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

