"""export, export-qdq, io: a plan in a vendor's format, and how to feed the device.

``export --format`` takes the formats of the registry (:data:`quantscope.export.formats.
FORMATS`); ``io --json`` writes :class:`quantscope.results.DeviceIOResult` (tagged)."""

from __future__ import annotations

import argparse
import dataclasses

from quantscope import stages
from quantscope.cli.inputs import load_target, open_inputs, read_hn
from quantscope.cli.options import (
    PLAN_FIX,
    command,
    hn_parent,
    method_parent,
    model_parent,
    plan_parent,
    stats_parent,
    target_parent,
)
from quantscope.cli.types import input_file, mapping, output_file
from quantscope.export import device_io as dio
from quantscope.export.formats import FORMATS
from quantscope.export.hailo_alls import unset_decisions
from quantscope.export.qnn_encodings import unencoded_line
from quantscope.report.summary import unset_line
from quantscope.results import DeviceIOResult
from quantscope.types import Plan

TARGET_HELP = ("the plan's target (default: the one the plan names); give a profile file the "
               "plan was made with, which a plan names by its 'name' alone")


def _plan_target(args: argparse.Namespace, plan: Plan, plan_name: str) -> Plan:
    """``--target``: loaded (a profile file: then known by its name) and the plan's own;
    a plan that names no target (written by hand) is given it: its scheme is the grid
    written and its vendor the formats' (not the default scheme, silently)."""
    if not args.target:
        return plan
    name = load_target(args.target).name
    stages.check_plan_target(plan, name, plan_name=plan_name)
    return plan if plan.target else dataclasses.replace(plan, target=name)


def add_export(sub: argparse._SubParsersAction, summary: str) -> None:
    ex = command(sub, "export", summary,
                 example="quantscope export --model minilm-l6 --stats stats.npz plan.json "
                 "--format alls --out model.alls",
                 parents=(model_parent(option=True), stats_parent(), hn_parent(),
                          target_parent(required=False, help=TARGET_HELP)))
    ex.add_argument("plan", type=input_file("plan", PLAN_FIX), help="plan JSON to export")
    ex.add_argument("--format", required=True, choices=list(FORMATS),
                    help="; ".join(f"{f.name}: {f.purpose.split(':')[0].split(' (')[0]}"
                                   for f in FORMATS.values()))
    ex.add_argument("--qnn-version", default="1.0.0", choices=["1.0.0", "0.6.1"],
                    help="QNN encodings file version (default 1.0.0)")
    ex.add_argument("--out", type=output_file, required=True, help="file to write")


def cmd_export(args: argparse.Namespace) -> int:
    inp = open_inputs(args, stats=True, plan=True)
    plan = _plan_target(args, inp.plan, f"plan '{args.plan}'")
    stages.check_plan_format(plan, args.format, plan_name=f"plan '{args.plan}'",
                             given=plan is not inp.plan)
    hn = read_hn(args)
    written = stages.export_plan(inp.model, inp.stats, plan, fmt=args.format, out=args.out,
                                 hn=hn, qnn_version=args.qnn_version)
    print(f"wrote {written}")
    for note in inp.model.notes:  # what the file is of (a float16 model's float32 form …)
        print(f"note: {note}")
    if args.format == "alls":  # decisions the script cannot carry are said, not only written
        unset = unset_line([f"{written.name}: {ln}" for ln in
                            unset_decisions(written.read_text(encoding="utf-8"))],
                           listed="the '# ... NOT SET' lines of the file")
        if unset:
            print(unset)
    if args.format == "qnn":  # tensors the file leaves to the converter are said
        unencoded = unencoded_line(written.name, stages.qnn_unencoded(inp.model))
        if unencoded:
            print(f"warning: {unencoded}")
    return 0


def add_export_qdq(sub: argparse._SubParsersAction, summary: str) -> None:
    x = command(sub, "export-qdq", summary,
                example="quantscope export-qdq minilm-l6 --stats stats.npz --plan plan.json "
                "--out qdq.onnx",
                parents=(model_parent(), stats_parent(), plan_parent(), method_parent(None)))
    x.add_argument("--out", type=output_file, required=True,
                   help="QDQ model to write (.onnx)")


def cmd_export_qdq(args: argparse.Namespace) -> int:
    inp = open_inputs(args, stats=True, plan=True)
    proto, notes = stages.qdq_for_plan(inp.model, inp.stats, inp.plan, method=args.method)
    stages.write_onnx(args.out, proto)
    for note in (*inp.model.notes, *notes):
        print(f"note: {note}")
    print(f"wrote {args.out} ({len(proto.graph.node)} nodes, opset {stages.opset_of(proto)})")
    return 0


def add_io(sub: argparse._SubParsersAction, summary: str) -> None:
    io = command(sub, "io", summary,
                 example="quantscope io minilm-l6 --stats stats.npz --plan plan.json "
                 "--out-snippet io.py",
                 parents=(model_parent(), stats_parent(), plan_parent(),
                          target_parent(required=False, help=TARGET_HELP)))
    io.add_argument("--json", type=output_file,
                    help="write the I/O table (and mapping checks) as JSON")
    io.add_argument("--check-mapping", action="append", metavar="TENSOR=CODE:VALUE,…",
                    type=mapping, help="a hand-written code<->value mapping to check "
                    "against the correct transform, e.g. 'out=0:-1,127:0,255:1' (TENSOR may "
                    "be *; one holding ',' or '=' is read up to the last '=', or quote it: "
                    "'\"a,b=c\"=0:-1,255:1'); repeatable")
    io.add_argument("--out-snippet", "--snippet", dest="out_snippet", metavar="FILE.py",
                    type=output_file,
                    help="write host-side to_device/from_device functions to paste")


def cmd_io(args: argparse.Namespace) -> int:
    mappings = list(args.check_mapping or [])
    inp = open_inputs(args, stats=True, plan=True)
    plan = _plan_target(args, inp.plan, "the plan")
    rows = stages.device_io_rows(inp.model, inp.stats, plan)
    floats = stages.float_io_rows(inp.model, plan)
    as_is = dio.as_is_io(inp.model, rows)
    print(dio.format_device_io(rows, floats, as_is))
    checks = dio.check_mapping(rows, mappings) if mappings else []
    if checks:
        print("manual mappings against the correct transform:")
        print(dio.format_mapping_check(checks))
    if args.out_snippet:
        stages.write_text(args.out_snippet, dio.python_snippet(rows, floats, as_is))
        print(f"wrote {args.out_snippet} (host-side to_device/from_device functions)")
    if args.json:
        stages.write_json(args.json, DeviceIOResult(io=rows, mapping_checks=checks,
                                                    float_io=floats or None,
                                                    as_is_io=as_is or None,
                                                    note=dio.PROVENANCE).to_dict())
        print(f"wrote {args.json}")
    return 0
