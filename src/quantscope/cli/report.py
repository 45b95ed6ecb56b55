"""report, demo: one self-contained HTML page from result files, and the main job's table."""

from __future__ import annotations

import argparse
from pathlib import Path

import quantscope.report as html
from quantscope import serde, stages
from quantscope.cli.inputs import input_shapes
from quantscope.cli.options import (
    PLAN_FIX,
    command,
    method_parent,
    pairs_parent,
    seq_len_parent,
    stats_parent,
)
from quantscope.cli.types import check_demo_data, data_spec, input_file, model_spec, output_file
from quantscope.demo import format_table, run_demo
from quantscope.report.inputs import check_io_options, require_kind, results_of
from quantscope.types import QuantscopeError


def add_report(sub: argparse._SubParsersAction, summary: str) -> None:
    r = command(sub, "report", summary,
                example="quantscope report --results result.json --plan plan.json "
                "--analysis analysis.json --out report.html",
                parents=(stats_parent(required=False, help="with --model and --plan: the "
                                      "stats file of the model"), seq_len_parent()))
    r.add_argument("--out", type=output_file, required=True, help="HTML file to write")
    r.add_argument("--results", nargs="*", type=input_file("results", "check the path"),
                   help="demo/evaluate JSON files")
    r.add_argument("--plan", type=input_file("plan", PLAN_FIX),
                   help="plan JSON (Pareto front, decisions)")
    r.add_argument("--analysis", type=input_file("analysis", "check the path"),
                   help="analysis JSON")
    r.add_argument("--model", type=model_spec,
                   help="with --stats and --plan: device I/O and legality")
    r.add_argument("--title", default="quantscope report",
                   help="title of the page (default: quantscope report)")


def cmd_report(args: argparse.Namespace) -> int:
    check_io_options(model=bool(args.model), stats=bool(args.stats), plan=bool(args.plan))

    def read(path: str | None, kind: str) -> dict | None:
        return require_kind(stages.read_json_file(path, kind), kind, path) if path else None

    results: dict = {}
    for path in args.results or []:
        results.update(results_of(read(path, "results"), Path(path).stem))
    plan, analysis = read(args.plan, "plan"), read(args.analysis, "analysis")
    io_rows = problems = None
    if args.model:
        model = stages.open_model(args.model)
        parsed = stages.read_plan(args.plan)
        io_rows = stages.device_io_rows(model, stages.read_stats(args.stats), parsed)
        problems = stages.plan_problems(model, parsed, seq_len=args.seq_len,
                                        input_shapes=input_shapes(args))
    if not (results or plan or analysis):
        raise QuantscopeError("nothing to report: give --results, --plan and/or --analysis")
    stages.write_text(args.out, html.report_html(args.title, results=results or None,
                                                 plan=plan, analysis=analysis,
                                                 io_rows=io_rows, problems=problems))
    print(f"wrote {args.out}")
    return 0


def add_demo(sub: argparse._SubParsersAction, summary: str) -> None:
    d = command(sub, "demo", summary, example="quantscope demo --json demo.json",
                parents=(method_parent("minmax"), pairs_parent(1000, "evaluated")))
    d.add_argument("--model", default="minilm-l6", type=model_spec,
                   help="built-in model name or ONNX file (default: minilm-l6)")
    d.add_argument("--data", default="stdlib-docs", type=data_spec,
                   help="built-in retrieval data or a JSONL pairs file (default: stdlib-docs)")
    d.add_argument("--json", type=output_file,
                   help="also write the table and all metrics as JSON")
    d.add_argument("--report", type=output_file,
                   help="also write a self-contained HTML report")


def cmd_demo(args: argparse.Namespace) -> int:
    check_demo_data(args.data)
    out = run_demo(args.model, args.data, method=args.method,
                   max_pairs=None if args.pairs == 0 else args.pairs)
    print(f"\nquantscope demo: {out['model']} on {out['data']} "
          f"(calibration: {out['calibration_samples']} texts, {out['method']}; "
          f"{out['seconds']} s)\n")
    print(format_table(out["results"]))
    for note in out["notes"]:
        print(f"note: {note}")
    files = [(args.json, serde.json_writer(out))] if args.json else []
    if args.report:
        files.append((args.report, serde.text_writer(html.report_html(
            f"quantscope demo: {out['model']} on {out['data']}", results=out["results"]))))
    for path in serde.write_atomic_set(files):  # both or neither
        print(f"wrote {path}")
    return 0
