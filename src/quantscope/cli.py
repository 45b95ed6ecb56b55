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

