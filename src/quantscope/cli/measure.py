"""calibrate, evaluate, whatif: a model's ranges, and a plan measured by emulation.

``evaluate --json`` and ``whatif --json`` write :class:`quantscope.results.EvaluateResult`
and :class:`quantscope.results.WhatifResult` (tagged; :func:`quantscope.serde.read_result`
reads them back)."""

from __future__ import annotations

import argparse

from quantscope import stages
from quantscope.analyze.measure import check_metric
from quantscope.cli.inputs import Inputs, open_inputs
from quantscope.cli.options import (
    METRIC_DEFAULT,
    calib_texts_parent,
    command,
    data_parent,
    method_parent,
    model_parent,
    output_parent,
    pairs_parent,
    plan_parent,
    stats_parent,
    tokenizer_parent,
)
from quantscope.cli.types import finite_float, output_file, seq_len
from quantscope.report import fmt
from quantscope.results import EvaluateResult, WhatifResult


def add_calibrate(sub: argparse._SubParsersAction, summary: str) -> None:
    c = command(sub, "calibrate", summary,
                example="quantscope calibrate minilm-l6 --data stdlib-docs --out stats.npz",
                parents=(model_parent(), data_parent(), method_parent("minmax"),
                         tokenizer_parent(), calib_texts_parent()))
    c.add_argument("--out", type=output_file, required=True,
                   help="stats file to write (.npz)")


def cmd_calibrate(args: argparse.Namespace) -> int:
    inp = open_inputs(args, data=True)
    stats = stages.calibrate_model(inp.model, inp.data, method=args.method, progress=True)
    stages.write_stats(args.out, stats)
    print(f"wrote {args.out}: {len(stats.tensors)} tensors, {stats.num_samples} samples, "
          f"{stats.num_batches} batches, method {stats.method}")
    from quantscope.calibrate.collect import nonfinite_note

    note = nonfinite_note(stats)  # NaN/inf inside the graph: left out of the ranges, said
    if note:
        print(f"warning: {note}")
    from quantscope.emulate.ranges import lookup_note

    looked = lookup_note(stats.tensors)  # a lookup's range is its table's: said
    if looked:
        print(f"note: {looked}")
    return 0


def _measured_parents() -> tuple[argparse.ArgumentParser, ...]:
    return (model_parent(), data_parent(), output_parent(), stats_parent(), plan_parent(),
            method_parent(None), tokenizer_parent(), pairs_parent(None, "evaluated"))


def add_evaluate(sub: argparse._SubParsersAction, summary: str) -> None:
    e = command(sub, "evaluate", summary,
                example="quantscope evaluate minilm-l6 --data stdlib-docs --stats stats.npz "
                "--plan plan.json --json result.json",
                parents=_measured_parents())
    e.add_argument("--seq-len", type=seq_len, metavar="N",
                   help="text data: measure on the texts truncated at N tokens, as a "
                   "deployment at sequence length N runs them (against FP32 at the same "
                   "length; default: the texts whole)")
    e.add_argument("--json", type=output_file, help="also write the result as JSON")


def _measured_inputs(args: argparse.Namespace) -> tuple[Inputs, stages.Dataset]:
    """evaluate / whatif: model, data, stats and plan; the data at ``--seq-len`` if given.
    evaluate prints the data's notes with its result (once): they are not said here."""
    said = args.command != "evaluate"
    inp = open_inputs(args, data=True, stats=True, plan=True, show=said)
    assert inp.data is not None
    data = inp.data
    if args.seq_len:
        data = stages.at_length(data, args.seq_len)
        if data is not inp.data and said:
            print(f"note: {data.notes[-1]}")
    return inp, data


def cmd_evaluate(args: argparse.Namespace) -> int:
    inp, data = _measured_inputs(args)
    result = stages.evaluate_plan(inp.model, data, inp.stats, inp.plan, method=args.method,
                                  progress=True)
    print(stages.format_result(result))
    if args.json:
        stages.write_json(args.json, EvaluateResult.of(result).to_dict())
        print(f"wrote {args.json}")
    return 0


def add_whatif(sub: argparse._SubParsersAction, summary: str) -> None:
    w = command(sub, "whatif", summary,
                example="quantscope whatif minilm-l6 --data stdlib-docs --stats stats.npz "
                "--plan plan.json --goal 0.97",
                parents=_measured_parents(),
                details="One evaluation per op kind (FP32 runs once). A kind "
                "whose lift gains little is not what binds; when every kind gains "
                "little and all together gain much, the error is spread over the graph. "
                "Task data also gets the headroom: the metric with the plan's own error "
                "scaled down (0.7x ... 0.05x), and with --goal the scale that reaches it.")
    w.add_argument("--seq-len", type=seq_len, metavar="N",
                   help="text data: measure on the texts truncated at N tokens (default: "
                   "the texts whole)")
    w.add_argument("--metric", help=f"the metric the gains are in (default: {METRIC_DEFAULT})")
    w.add_argument("--goal", type=finite_float, help="task data: the metric to reach; says "
                   "how much smaller the plan's error must be for it (default: none)")
    w.add_argument("--json", type=output_file, help="also write the result as JSON")


def cmd_whatif(args: argparse.Namespace) -> int:
    inp, data = _measured_inputs(args)
    if args.metric:  # a --metric the data's task does not give: refused before any work
        check_metric(inp.model, data, args.metric)
    result = stages.whatif_families(inp.model, data, inp.stats, inp.plan, metric=args.metric,
                                    method=args.method, progress=True, goal=args.goal,
                                    figure=fmt.value)
    print(stages.format_whatif(result))
    if args.json:
        stages.write_json(args.json, WhatifResult.of(result).to_dict())
        print(f"wrote {args.json}")
    return 0
