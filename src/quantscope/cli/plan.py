"""plan, check, lint: a legal mixed-precision plan, and its preflights on a target."""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path
from typing import Any

from quantscope import stages, stages_llm
from quantscope.analyze.evalcache import EvalCache
from quantscope.analyze.figure_check import check_figure
from quantscope.analyze.measure import check_metric
from quantscope.analyze.phases import format_diagnosis
from quantscope.analyze.prefix import with_head
from quantscope.cli.inputs import (
    EXIT_PROBLEMS,
    allowed_of,
    executor,
    input_shapes,
    load_target,
    open_inputs,
    print_problems,
    read_hn,
    shapes,
)
from quantscope.cli.options import (
    DATA_HELP,
    METRIC_DEFAULT,
    PLAN_FIX,
    PROMOTION,
    allow_warning_parent,
    budget_parent,
    cache_parent,
    command,
    data_parent,
    hn_parent,
    model_parent,
    output_parent,
    pairs_parent,
    race_parent,
    rank_engine_parent,
    ray_parent,
    seq_len_parent,
    stats_parent,
    target_parent,
    tokenizer_parent,
)
from quantscope.cli.types import (
    check_goal,
    finite_float,
    input_file,
    new_tokens,
    non_negative_float,
    output_file,
    phases,
    positive_float,
    positive_int,
    repair_names,
)
from quantscope.export.alls_lint import lint
from quantscope.export.kv_prefix import host_snippet, prefix_files
from quantscope.model.groups import find_groups
from quantscope.model.shapes import given_shapes, shape_note
from quantscope.plan.accepted import accepted_lines, accepted_of
from quantscope.plan.check import check
from quantscope.plan.op_support import op_problems
from quantscope.report import fmt
from quantscope.serde import (
    bytes_writer,
    plan_writer,
    read_sensitivity,
    text_writer,
    write_atomic_set,
)
from quantscope.targets.profile import Target
from quantscope.types import QuantscopeError


def add_plan(sub: argparse._SubParsersAction, summary: str) -> None:
    pl = command(sub, "plan", summary,
                 example="quantscope plan minilm-l6 --analysis analysis.json --target hailo10h "
                 "--max-cost 1.5 --out plan.json",
                 parents=(model_parent(), target_parent(help="target profile"),
                          seq_len_parent(several=True), output_parent(),
                          data_parent(required=False, help="with --stats: refine the "
                                      "front by real emulation (" + DATA_HELP + ")"),
                          stats_parent(required=False, help="with --data: the stats "
                                       "file of the model"),
                          tokenizer_parent(), pairs_parent(300, "measured"),
                          ray_parent("the measurements of the best-predicted plans "
                                     "(with --data and --stats)"), rank_engine_parent(),
                          cache_parent("the plans' measurements (with --data and --stats)"),
                          budget_parent(None),
                          race_parent("the best-predicted plans (with --data and --stats; retrieval "
                                      "data, by top1_agreement or recall@1)"),
                          allow_warning_parent("blocks no promotion (and no group of "
                                               "--max-legal, no candidate of --phase)")))
    pl.add_argument("--analysis",
                    type=input_file("analysis", "run 'quantscope analyze' to make one"),
                    help="analysis JSON of 'quantscope analyze' (required, except with "
                    "--phase)")
    pl.add_argument("--phase", type=phases, metavar="prefill,decode",
                    help="a decoder LLM (e.g. smollm2-135m): search candidates legal on "
                    "every phase graph within --max-cost (default 1.5) at --seq-len, "
                    "measure them per phase on stdlib-docs text and keep the best (minutes)")
    _lm_options(pl, prefix=("none", "auto"), default="none",
                help="with --phase: 'auto' finds the sink/outlier tokens from calibration, "
                "puts their FP32 keys/values in the KV cache as a constant prefix that both "
                "phase graphs read, and plans and measures with it; writes OUT.prefix.npz "
                "and the host snippet OUT.prefix.py beside the plan (default: none)")
    budget = pl.add_mutually_exclusive_group()
    budget.add_argument("--min-quality", type=non_negative_float,
                        help="the least predicted quality (the analysis' metric, output SQNR "
                        "in dB); not with --data")
    budget.add_argument("--max-cost", type=positive_float, help="relative to uniform a8_w8 = "
                        "1.0 (default: none: the best quality, whatever it costs)")
    pl.add_argument("--metric", default=None,
                    help=f"with --data: the measured metric (default: {METRIC_DEFAULT})")
    pl.add_argument("--goal", type=finite_float,
                    help="with --data: the measured metric to reach; the output says whether "
                    "it was reached and which rule binds if not (default: none)")
    pl.add_argument("--repairs", type=repair_names,
                    help="with --data/--stats: comma list of repairs to search together with "
                    "the precisions (each measured; see docs/planner.md)")
    pl.add_argument("--repair-batches", type=positive_int, default=8,
                    help="calibration batches the repairs use (default 8)")
    pl.add_argument("--max-legal", action="store_true",
                    help=f"no search (and no --analysis): every group at {PROMOTION} except "
                    "those 'check' refuses at --seq-len, demoted to a8_w8 -- the most 16 bit "
                    "the target allows")
    pl.add_argument("--variants", action="store_true",
                    help="with --max-legal: also write the plan with Linear families (read "
                    "from the graph: query/key, value, attention output, FFN up/down) back at "
                    "a8_w8 beside --out (OUT.noqk.json, ...); with --stats also a candidates "
                    "file for 'quantscope buckets' (OUT.candidates.json)")
    pl.add_argument("--seed", type=int, default=0,
                    help="recorded in the plan (the search draws no random numbers yet; "
                    "default 0)")
    pl.add_argument("--out", type=output_file, required=True,
                    help="plan JSON to write (with the Pareto front)")


def _lm_options(parser: argparse.ArgumentParser, *, prefix: tuple[str, ...], default: str,
                help: str) -> None:
    """--prefix and the amounts of text of a decoder's per-phase measurement."""
    parser.add_argument("--prefix", choices=prefix, default=default, help=help)
    parser.add_argument("--prompt-head", metavar="TEXT",
                        help="with --phase: the text every prompt of the deployment begins "
                        "with (a chat template's system part): it goes into the KV prefix "
                        "after the document token, in FP32, and the figures judge what "
                        "follows it (FP32 reads it too)")
    for flag, value, what in (
            ("--lm-tokens", stages_llm.EVAL_TOKENS, "predicted tokens of evaluation text "
             "for the prefill figures (as many windows of --seq-len as that takes)"),
            ("--prompts", stages_llm.PROMPTS, "greedy-generation prompts"),
            ("--new-tokens", stages_llm.NEW_TOKENS, "greedy tokens generated per prompt"),
            ("--decode-steps", stages_llm.DECODE_STEPS, "decode steps on the emulated KV "
             "cache (8 per evaluation window)")):
        parser.add_argument(flag, type=new_tokens if flag == "--new-tokens" else positive_int,
                            default=value,
                            help=f"with --phase: {what} (default {value})")


def _lm_setup(args: argparse.Namespace, seq_len: int | None) -> stages_llm.LmSetup:
    return stages_llm.LmSetup.at(seq_len, tokens=args.lm_tokens, prompts=args.prompts,
                                 new_tokens=args.new_tokens, decode_steps=args.decode_steps)


def cmd_plan(args: argparse.Namespace) -> int:
    if getattr(args, "phase", None):
        return _plan_phases(args)
    if getattr(args, "prompt_head", None) is not None:
        raise QuantscopeError("--prompt-head is a decoder's KV prefix: give --phase too")
    if args.max_legal or args.variants:
        return _plan_max_legal(args)
    if not args.analysis:
        raise QuantscopeError("plan: the following arguments are required: --analysis "
                              "(see 'quantscope plan --help')")
    lengths = args.seq_len or ()
    options = stages.PlanOptions(
        min_quality=args.min_quality, max_cost=args.max_cost,
        seq_len=lengths[0] if len(lengths) == 1 else None, input_shapes=input_shapes(args),
        metric=args.metric, goal=args.goal, seed=args.seed,
        repairs=tuple(args.repairs.split(",")) if args.repairs else (),
        repair_batches=args.repair_batches, rank_engine=args.rank_engine, budget=args.budget,
        race=args.race)
    options.check_inputs(data=bool(args.data), stats=bool(args.stats))
    if args.metric:
        check_goal(args.metric, args.goal)
    analysis = read_sensitivity(args.analysis)
    measure = bool(args.data and args.stats)
    inp = open_inputs(args, target=True, data=measure, stats=measure)
    options = dataclasses.replace(options, allowed_warnings=allowed_of(args, inp.target))
    if not args.metric and measure:
        options = dataclasses.replace(options, metric=stages.default_metric(inp.data))
        check_goal(options.metric, args.goal)
    elif measure:  # a --metric the data's task does not give: refused before any work
        check_metric(inp.model, inp.data, args.metric)
    if measure:  # a figure with no value on the data cannot rank plans: refused now
        check_figure(inp.model, inp.data, str(options.metric), what=f"--data {args.data}")
    pool = executor(args.ray) if measure else None
    cache = EvalCache(args.cache) if args.cache and measure else None
    try:
        if len(lengths) > 1:
            out = stages.plan_lengths(inp.model, analysis, inp.target, options, lengths,
                                      data=inp.data, stats=inp.stats, progress=True,
                                      executor=pool, cache=cache)
        else:
            out = stages.plan_model(inp.model, analysis, inp.target, options, data=inp.data,
                                    stats=inp.stats, progress=True, executor=pool, cache=cache)
    finally:
        if pool is not None:
            pool.close()
    for line in (*cache.notes, cache.summary()) if cache is not None else ():
        print(line)
    if out.work is not None:  # what the measuring engine did this time
        print(f"measured by {out.work['engine']}"
              + "".join(f"; {n}" for n in out.work.get("notes", [])))
    if out.offer is not None:
        for row in out.offer.measured:
            print(f"  repair {row['name']:<9} {_offer_row(row)}")
        for note in out.offer.notes:
            print(f"  {note}")
    stages.write_plan(args.out, out.plan, out.file_extra())
    print(stages.format_search(out.pareto))
    for line in accepted_lines(accepted_of(out.plan)):
        print(line)
    _say_operators(inp.model, inp.target, given_shapes(inp.model, options.seq_len,
                                                       options.input_shapes))
    print(f"wrote {args.out}")
    return 0


def _say_operators(model: stages.Model, target: Target, given: dict | None) -> None:
    """The model's operators the target does not take or no list names: the search judges
    precisions, and no precision changes these (plan/op_support.py)."""
    for p in op_problems(model, target, given):
        print(f"{p.severity}: [{p.rule}] {p.group}: {p.reason}")
        print(f"    fix: {p.fix}    (source: {p.provenance})")


def _plan_max_legal(args: argparse.Namespace) -> int:
    """plan --max-legal [--variants]: candidate plans made by rule (plan/candidates.py)."""
    from quantscope.plan.candidates import max_legal, variants

    if not args.max_legal:
        raise QuantscopeError("--variants needs --max-legal (the variants are made from it)")
    if args.analysis or args.data or args.goal is not None or args.max_cost is not None:
        raise QuantscopeError("plan --max-legal searches nothing: give no --analysis, --data, "
                              "--goal or --max-cost")
    lengths = args.seq_len or ()
    if len(lengths) > 1:
        raise QuantscopeError("plan --max-legal takes one --seq-len (legality depends on it)")
    inp = open_inputs(args, target=True)
    allowed = allowed_of(args, inp.target)
    shapes = given_shapes(inp.model, lengths[0] if lengths else None, input_shapes(args))
    base = max_legal(inp.model, inp.target, shapes, allowed=allowed)
    made = [base]
    notes: tuple[str, ...] = ()
    if args.variants:
        more, notes = variants(inp.model, inp.target, shapes, base, allowed=allowed)
        made.extend(more)
    out = Path(args.out)
    files = [(out if c is base else out.with_name(f"{out.stem}.{c.name}.json"), c) for c in made]
    for path, c in files:
        stages.write_plan(path, c.plan)
        print(f"{c.name:<10} {c.note}: wrote {path}")
        for line in accepted_lines(accepted_of(c.plan)):
            print(f"  {line}")
    for note in notes:
        print(f"  {note}")
    _say_operators(inp.model, inp.target, shapes)
    if args.variants and args.stats:
        folder = out.parent.resolve()

        def rel(p: str | Path) -> str:
            q = Path(p)
            return str(q) if not q.exists() else os.path.relpath(q.resolve(), folder)

        entries = [{"name": c.name, "model": rel(args.model), "stats": rel(args.stats),
                    "plan": path.name} for path, c in files]
        cands = out.with_name(f"{out.stem}.candidates.json")
        stages.write_json(cands, {"candidates": entries})
        print(f"wrote {cands} ({len(entries)} candidates for 'quantscope buckets')")
    return 0


def _plan_phases(args: argparse.Namespace) -> int:
    """plan --phase: a plan legal on every phase graph of a decoder, measured per phase."""
    if args.min_quality is not None or args.data or args.stats or args.analysis:
        raise QuantscopeError("plan --phase measures candidates itself: give --max-cost, "
                              "not --min-quality, --data, --stats or --analysis")
    if args.seq_len and len(args.seq_len) > 1:
        raise QuantscopeError("plan --phase takes one --seq-len")
    allowed = allowed_of(args, load_target(args.target))  # refused in one line, before work
    setup = _lm_setup(args, args.seq_len[0] if args.seq_len else None)
    out = stages_llm.plan_phases(args.model, args.target,
                                 max_cost=args.max_cost or 1.5, setup=setup, phases=args.phase,
                                 prefix=with_head(args.prefix, args.prompt_head),
                                 allowed=allowed)
    print("\n".join(format_diagnosis(out.diagnosis)))
    print("\n".join(stages_llm.format_phase_plan(out)))
    if out.prefix is None:
        stages.write_plan(args.out, out.plan())
        print(f"wrote {args.out}")
        return 0
    rec = out.prefix.to_dict()
    npz, snippet = prefix_files(args.out)
    write_atomic_set([(args.out, plan_writer(out.plan())),
                      (npz, bytes_writer(out.prefix.kv.to_bytes())),
                      (snippet, text_writer(host_snippet(args.out, rec["tokens"], rec["text"])))])
    print(f"wrote {args.out}, {npz} (the KV prefix) and {snippet} (the host loads it)")
    return 0


def add_check(sub: argparse._SubParsersAction, summary: str) -> None:
    k = command(sub, "check", summary,
                example="quantscope check --model minilm-l6 --target hailo10h --seq-len 128 "
                "plan.json",
                parents=(model_parent(option=True), target_parent(), seq_len_parent(),
                          allow_warning_parent("the plan's author accepted: its warnings are "
                                               "listed as 'accepted by --allow-warning', not "
                                               "as passing")))
    k.add_argument("plan", type=input_file("plan", PLAN_FIX), help="plan JSON to check")
    k.add_argument("--phase", type=phases, metavar="prefill,decode",
                   help="a decoder LLM (e.g. smollm2-135m): check the plan on each phase's "
                   "graph (same layer names) and print each phase's cost")
    k.add_argument("--quality", action="store_true",
                   help="with --phase: also measure next-token quality per phase on "
                   "stdlib-docs text (top-1 agreement, KL, perplexity ratio; minutes)")
    _lm_options(k, prefix=("plan", "auto", "none"), default="plan",
                help="with --phase --quality: the constant KV prefix to measure with: 'plan' "
                "the tokens the plan records (none if it records none), 'auto' found anew "
                "from calibration, 'none' (default: plan)")


def cmd_check(args: argparse.Namespace) -> int:
    if getattr(args, "phase", None):
        return _check_phases(args)
    if getattr(args, "quality", False) or getattr(args, "prompt_head", None) is not None:
        raise QuantscopeError("--quality and --prompt-head measure each phase of a decoder: "
                              "give --phase too")
    inp = open_inputs(args, target=True, plan=True)
    allowed = allowed_of(args, inp.target)
    stages.check_plan_target(inp.plan, inp.target.name if inp.target else None,
                             plan_name=f"plan '{args.plan}'")
    given = shapes(args, inp.model)
    problems = op_problems(inp.model, inp.target, given) + check(
        inp.plan, find_groups(inp.model), inp.model, inp.target, shapes=given)
    note = shape_note(inp.model, given)
    if note:
        print(f"note: {note}")
    _say_unaccepted(args.plan, inp.plan, allowed)
    return print_problems(problems, f"check {args.plan} on {inp.target.name}",
                          allowed=allowed)


def _say_unaccepted(name: str, plan: stages.Plan, allowed: frozenset[str]) -> None:
    """The rules the plan's record says its author accepted and this check does not."""
    unsaid = [r["rule"] for r in accepted_of(plan) if r["rule"] not in allowed]
    if unsaid:
        print(f"note: plan '{name}' was made accepting {', '.join(unsaid)} "
              f"(--allow-warning): give {' '.join('--allow-warning ' + r for r in unsaid)} "
              "to list their warnings as accepted")


def _check_phases(args: argparse.Namespace) -> int:
    """check --phase: the plan on each phase graph of a decoder (legality, cost, quality)."""
    plan = stages.read_plan(args.plan)
    if args.target:
        stages.check_plan_target(plan, load_target(args.target).name,
                                 plan_name=f"plan '{args.plan}'")
    target = args.target or plan.target
    tgt = load_target(target) if target else None
    allowed = allowed_of(args, tgt)  # refused in one line, before the graphs open
    if tgt is not None:
        plan = dataclasses.replace(plan, target=tgt.name)
    checks = stages_llm.check_plan_phases(args.model, plan, args.phase, args.seq_len, allowed)
    _say_unaccepted(args.plan, plan, allowed)
    print("\n".join(stages_llm.format_phase_checks(checks)))
    if args.quality:
        prefix = (stages_llm.recorded_prefix(plan)
                  if args.prefix == "plan" and args.prompt_head is None
                  else with_head(args.prefix, args.prompt_head))
        result = stages_llm.lm_quality(args.model, {Path(args.plan).stem: plan},
                                       _lm_setup(args, args.seq_len), prefix)
        print("\n".join(stages_llm.format_lm_quality(result)))
    errors = sum(c.errors for c in checks)
    print(f"check {args.plan} on {target}, phases {','.join(args.phase)}: {errors} error(s)")
    return EXIT_PROBLEMS if errors else 0


def add_lint(sub: argparse._SubParsersAction, summary: str) -> None:
    li = command(sub, "lint", summary,
                 example="quantscope lint --model minilm-l6 --target hailo10h --seq-len 128 "
                 "model.alls",
                 parents=(model_parent(option=True), target_parent(), hn_parent(),
                          seq_len_parent()))
    li.add_argument("script", type=input_file("model script", "check the path"),
                    help="Hailo model script (.alls) to lint")


def cmd_lint(args: argparse.Namespace) -> int:
    inp = open_inputs(args, target=True)
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
    hn = read_hn(args)
    problems = lint(text, inp.model, find_groups(inp.model), inp.target, hn=hn,
                    shapes=shapes(args, inp.model))
    return print_problems(problems, f"lint {args.script} on {inp.target.name}")


def _folds(metric: str, v: dict[str, Any]) -> str:
    """An out-of-sample figure's folds and the noise of their mean, in its unit."""
    noise = (v.get("noise") or {}).get("half_width")
    folds = ", ".join(fmt.gain(metric, g, fine=True) for g in v["folds"])
    if noise is None:  # no estimate, or a file from before h61
        return folds
    n, unit = v["noise"].get("n"), v["noise"].get("unit")  # absent before h66
    over = f" over {' + '.join(str(k) for k in n)} {unit}" if n and unit else ""
    return f"{folds}; noise {fmt.gain(metric, noise, fine=True).lstrip('+')}{over}"


def _judged(v: dict[str, Any]) -> str:
    """The pooled figure that judged a worst-column offer (``judged_by``), in words."""
    p = v.get("pooled")
    if not p:
        return ""
    m = p["metric"]
    return (f"; judged by {m} {fmt.gain(m, p['mean'], fine=True)}, folds "
            + _folds(m, p).replace("; noise", ", noise"))


def _offer_row(row: dict[str, Any]) -> str:
    """A measured repair offer in words: what it changed, each figure before -> after in
    its unit, and its out-of-sample gain where it was judged there."""
    parts = []
    for k, v in row.items():
        if k == "out_of_sample":
            m = v.get("metric", "")
            by = " by person" if (v.get("folded") or {}).get("by") == "person" else ""
            parts.append(f"out of sample {fmt.gain(m, v['mean'], fine=True)} (folds{by} "
                         + _folds(m, v) + _judged(v)
                         + f"{'' if v['offered'] else '; not offered'})")
        elif isinstance(v, list | tuple) and len(v) == 2:
            parts.append(f"{k} {fmt.value(k, v[0])} -> {fmt.value(k, v[1])}")
        elif k not in ("name", "gain"):
            parts.append(f"{k} {fmt.plain(v)}")
    return ", ".join(parts)
