"""run, route, buckets: model to device in one command, and deployments of length buckets."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from quantscope import stages
from quantscope.analyze.evalcache import EvalCache
from quantscope.analyze.prefix import with_head
from quantscope.cli.inputs import allowed_of, input_shapes, open_inputs, text_prefixes
from quantscope.cli.options import (
    METRIC_DEFAULT,
    add_layout,
    allow_warning_parent,
    budget_parent,
    cache_parent,
    calib_texts_parent,
    command,
    data_parent,
    method_parent,
    model_parent,
    option_kwargs,
    pairs_parent,
    race_parent,
    rank_engine_parent,
    seq_len_parent,
    target_parent,
    tokenizer_parent,
)
from quantscope.cli.types import (
    check_goal,
    count,
    data_spec,
    finite_float,
    fraction,
    input_file,
    lengths,
    merged_batch_axes,
    new_tokens,
    output_file,
    positive_float,
    positive_int,
    run_folder,
    run_repair_names,
)
from quantscope.pipeline import RunOptions, run_pipeline
from quantscope.pipeline.context import DEFAULT_BUDGET_S
from quantscope.pipeline.decoder import DECODER_STAGES
from quantscope.pipeline.verdict import format_verdict
from quantscope.plan.buckets import CHOICE_LENGTHS
from quantscope.plan.deployment import deployment_file
from quantscope.report.deployment import format_choice, format_deployment
from quantscope.rewrites.base import CliOption, Rewrite
from quantscope.rewrites.registry import REWRITES, parse_rewrites
from quantscope.stages import buckets, route
from quantscope.targets import load_target
from quantscope.tasks.layout import layout_tasks
from quantscope.types import QuantscopeError

RUN_STAGES = ("calibrate", "analyze", "plan", "repair", "check", "evaluate", "deploy", "export",
              "io", "report")
RUN_EXAMPLE = ("quantscope run minilm-l6 --data stdlib-docs --target hailo10h --goal 0.97 "
               "--max-cost 1.5 --out W")


SEQ_LEN_RUN = ("text pairs (stdlib-docs, a .jsonl) without --input-shape: the longest fit "
               "text's token count, said; else the shapes the model declares")


def add_run(sub: argparse._SubParsersAction, summary: str) -> None:
    ru = command(sub, "run", summary, example=RUN_EXAMPLE,
                 parents=(model_parent(), data_parent(), target_parent(help="target profile"),
                          seq_len_parent(default=SEQ_LEN_RUN),
                          method_parent("minmax"), tokenizer_parent(),
                          pairs_parent(300, "fitting the plan (and as many held out)"),
                          calib_texts_parent(),
                          rank_engine_parent(), budget_parent(DEFAULT_BUDGET_S),
                          race_parent("the plan search's best-predicted plans (retrieval data, by "
                                      "top1_agreement or recall@1)"),
                          allow_warning_parent("blocks no promotion of the plan search (nor "
                                               "of the compiled lengths' candidates; on a "
                                               "decoder, no candidate of either phase)")),
                 details="Every stage writes its file into the run folder; run it again and "
                 "the stages already done on the same inputs are skipped (--force STAGE "
                 "reruns from STAGE). The options, the model, the data and the target are "
                 "checked before any stage runs. A decoder LLM is a prefill/decode pair "
                 "(NAME.prefill.onnx) or a Hugging Face causal-LM export with its cache, "
                 "converted into the run folder's phases/ first.")
    add_layout(ru)
    ru.add_argument("--eval-data", type=data_spec, help="held-out evaluation data (default: "
                    "split DATA, or the pairs after --pairs for retrieval data)")
    ru.add_argument("--goal", type=finite_float, help="the measured metric to reach on the "
                    "held-out data (the verdict says if it is and what binds if not; default: "
                    "none: the verdict gives the metric without judging it)")
    ru.add_argument("--max-cost", type=positive_float, help="relative to uniform a8_w8 = 1.0 "
                    "(default: none: the best quality, whatever it costs)")
    ru.add_argument("--metric", help=f"the measured metric (default: {METRIC_DEFAULT})")
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
                    "the held-out data; one evaluation per kind): in the verdict and report; "
                    "on a decoder, each class (Linears, attention, KV cache …) lifted on both "
                    "phases and decode not quantized, each checked against the target, and "
                    "which of them reach --goal (about a minute per variant on smollm2-135m)")
    ru.add_argument("--proxy", type=fraction, default=0.125, help="analysis row budget (see "
                    "'quantscope analyze --help'; default 0.125)")
    ru.add_argument("--lengths", type=run_lengths, default="auto", metavar="off|auto|N,N…",
                    help="compiled lengths (text data): 'auto' (default) chooses several "
                    "only where the data has short texts and the cost depends on the length "
                    "(candidates per length chosen on the fit pairs, measured held out: "
                    "deployment.json, len-N/, a router in io_snippet.py), from 16, 24, … up "
                    "to the longest, candidates made at 64, 128 and the longest; 'off': one "
                    "model; or the lengths to choose from, e.g. 64,128")
    ru.add_argument("--finetune", choices=("auto", "off", "on"), default="auto",
                    help="fine-tune the final plan (PyTorch: pip install 'quantscope[finetune]'; "
                    "CUDA when it sees a GPU) within what the plan search left of --budget, "
                    "kept only when it measures better on the fit data by more than the "
                    "noise: 'auto' (default) when the plan misses --goal there and the run "
                    "ships one model (not where it chooses compiled lengths), 'on' always, "
                    "'off' never; a decoder LLM's: 'on' trains the weights both phase graphs "
                    "share for --budget (default 30m), kept when --metric measures better "
                    "by more than the noise and no other figure worse beyond it; 'auto' and "
                    "'off' do not train")
    ru.add_argument("--force", metavar="STAGE", choices=tuple(dict.fromkeys((*RUN_STAGES, *DECODER_STAGES))),
                    help=f"rerun from STAGE ({', '.join(RUN_STAGES)}; a decoder's: "
                    f"{', '.join(DECODER_STAGES)})")
    _add_decoder_options(ru)
    ru.add_argument("--out", dest="folder", type=run_folder, required=True,
                    help="run folder (created; every stage's file, run.json, report.html)")
    ru.set_defaults(run_parser=ru)


def _add_decoder_options(ru: argparse.ArgumentParser) -> None:
    """A decoder LLM's run (a prefill/decode pair such as smollm2-135m:
    :mod:`quantscope.pipeline.decoder`): the KV prefix and the amounts of text."""
    g = ru.add_argument_group("decoder LLMs (a prefill/decode pair, e.g. smollm2-135m)",
                              "--rewrites auto (default) is each MLP in token chunks in "
                              "prefill, so its gated product is 16 bit (gatedsplit; "
                              "measured best on smollm2-135m); a comma list of rotate, "
                              "smooth (SmoothQuant on the gated products) and gatedsplit "
                              "names the steps; --rewrites search "
                              "chooses among those three by measurement (all three, then "
                              "without each step in turn, each a plan search on the quick "
                              "amounts; a step kept only when better by more than one "
                              "standard error: rewrite.json, the verdict and the report list "
                              "the trials); --metric ppl_ratio (default), "
                              "top1_agreement, decode_top1 or greedy_agreement; --goal is "
                              "judged on it held out at the amounts below")
    g.add_argument("--prefix", choices=("auto", "none"), default="auto",
                   help="the constant KV prefix: 'auto' (default) the sink/outlier tokens "
                   "found from calibration, their FP32 keys/values in the cache; 'none'")
    g.add_argument("--prompt-head", metavar="TEXT",
                   help="the text every prompt of the deployment begins with (a chat "
                   "template's system part): it goes into the KV prefix after the document "
                   "token, in FP32, and the figures judge what follows it (FP32 reads it too)")
    g.add_argument("--w4", choices=("on", "off"), default="on",
                   help="also measure the chosen plan with its a8_w8 weights at a8_w4 "
                   "(GPTQ-rounded; decode reads every weight per token): 'on' (default), "
                   "'off'")
    g.add_argument("--phase", type=no_phase, help=argparse.SUPPRESS)
    g.add_argument("--phase-hn", action="append", type=phase_hn, metavar="PHASE=HN",
                   help="a phase graph's parsed HN JSON (exact Hailo layer names in that "
                   "phase's .alls): --phase-hn prefill=P.hn, --phase-hn decode=D.hn; "
                   "without it the names are guessed by op order and decisions on op kinds "
                   "no guess names (RMSNormalization, Neg) are NOT SET")
    for flag, value, what in (
            ("--lm-tokens", 20_000, "predicted tokens of held-out text for the prefill "
             "figures"),
            ("--prompts", 32, "greedy-generation prompts"),
            ("--new-tokens", 64, "greedy tokens generated per prompt"),
            ("--decode-steps", 256, "decode steps on the emulated KV cache")):
        g.add_argument(flag, type=new_tokens if flag == "--new-tokens" else positive_int,
                       default=value, help=f"{what} (default {value})")


# the decoder group's options: an encoder's run refuses them (given, not at the default)
DECODER_ONLY = frozenset({"prefix", "prompt_head", "w4", "lm_tokens", "prompts", "new_tokens",
                          "decode_steps", "phase_hn"})
# the run options a decoder's run reads; any other given (not at its default) is refused
DECODER_OPTIONS = frozenset({"model", "data", "target", "goal", "max_cost", "metric", "seq_len",
                             "rewrites", "prefix", "prompt_head", "lm_tokens", "prompts", "new_tokens",
                             "decode_steps", "w4", "phase_hn", "whatif", "force", "folder",
                             "allow_warning", "finetune", "budget", "help", "run_parser"})


def _cmd_run_decoder(args: argparse.Namespace, export: Path | None = None) -> int:
    """run on a decoder LLM (:mod:`quantscope.pipeline.decoder`); ``export``: a Hugging
    Face causal-LM export, converted into the run folder first
    (:mod:`quantscope.pipeline.hf_export`)."""
    from quantscope.pipeline.decoder import (
        DEFAULT_METRIC,
        DecoderOptions,
        format_decoder_verdict,
        run_decoder,
    )

    parser = args.run_parser
    allowed = DECODER_OPTIONS | ({"tokenizer"} if export is not None else set())
    given = list(dict.fromkeys(
        a.option_strings[0] for a in parser._actions
        if a.dest not in allowed and a.option_strings
        and getattr(args, a.dest, None) != parser.get_default(a.dest)))
    if given:
        what = "a Hugging Face decoder export" if export is not None else "a prefill/decode pair"
        raise QuantscopeError(f"{', '.join(given)}: not for a decoder LLM's run (model "
                              f"'{args.model}' is {what}): drop "
                              f"{'it' if len(given) == 1 else 'them'}")
    if str(args.data) != "stdlib-docs":
        raise QuantscopeError(f"--data {args.data}: a decoder's run measures on the built-in "
                              "stdlib-docs text only: give --data stdlib-docs")
    if export is not None:
        from quantscope.model.hf_phases import tokenizer_beside
        from quantscope.pipeline import _check_out
        from quantscope.pipeline.hf_export import phases_for_run

        _check_out(args.folder)
        tokenizer = tokenizer_beside(export, Path(args.tokenizer) if args.tokenizer else None)
        args.model = str(phases_for_run(export, Path(args.folder), tokenizer))
    search = args.rewrites == SEARCH
    rewrites = None if args.rewrites in (None, AUTO) or search else tuple(args.rewrites)
    opts = DecoderOptions(model=args.model, target=args.target, out=args.folder,
                          goal=args.goal, metric=args.metric or DEFAULT_METRIC,
                          max_cost=args.max_cost or 1.5, seq_len=args.seq_len,
                          rewrites=rewrites, search=search,
                          prefix=with_head(args.prefix, args.prompt_head), tokens=args.lm_tokens,
                          prompts=args.prompts, new_tokens=args.new_tokens,
                          decode_steps=args.decode_steps, w4=args.w4 == "on",
                          hn=tuple(args.phase_hn) if args.phase_hn else None,
                          whatif=args.whatif,
                          finetune=_decoder_finetune(args),
                          allow_warnings=tuple(sorted(set(args.allow_warning)))
                          if args.allow_warning else None)
    out = run_decoder(opts, force=args.force, progress=True)
    print(format_decoder_verdict(out.verdict))
    print(f"stages run: {', '.join(out.ran) or 'none'}; skipped (done): "
          f"{', '.join(out.skipped) or 'none'}; files in {out.folder}/ (report.html, "
          "verdict.txt, host.md, prefill/, decode/)")
    return 0


def _decoder_finetune(args: argparse.Namespace) -> float | None:
    """A decoder run's fine-tune budget in seconds (``--finetune on``), else None."""
    if args.finetune != "on":
        if args.budget != args.run_parser.get_default("budget"):
            raise QuantscopeError("--budget: a decoder LLM's run spends it on the fine-tune "
                                  "only: give --finetune on too, or drop --budget")
        return None
    if args.budget is None:
        raise QuantscopeError("--finetune on --budget none: a decoder's fine-tune needs a "
                              "time budget, e.g. --budget 30m")
    return float(args.budget)


def no_phase(text: str) -> str:
    """``run --phase``: refused with why (``plan``/``analyze`` take it; options are not
    abbreviated, so it would otherwise be only an unknown option)."""
    raise argparse.ArgumentTypeError(
        "run takes no --phase (a decoder's run measures prefill and decode itself: leave it "
        "out); --phase-hn gives a phase's parsed HN, e.g. prefill=prefill.hn")


def phase_hn(text: str) -> tuple[str, str]:
    """``--phase-hn PHASE=FILE``: (phase, path of an existing file)."""
    phase, sep, path = text.partition("=")
    if not sep or not path:
        raise argparse.ArgumentTypeError(f"'{text}' is not PHASE=HN: give e.g. "
                                         "prefill=prefill.hn")
    return phase.strip(), str(input_file("HN", "pass the phase's parsed .hn JSON")(path))


def run_lengths(text: str) -> str:
    """``run --lengths``: ``off``, ``auto`` or positive token counts (sorted, comma list)."""
    text = text.strip()
    if text in ("off", "auto"):
        return text
    try:
        return ",".join(map(str, sorted(set(lengths(text)))))
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"give off, auto or token counts: {e}") from None


AUTO = ("auto",)  # run --rewrites auto (the default): the run chooses by measurement
SEARCH = ("search",)  # run <decoder> --rewrites search: the recipe's steps by measurement


def rewrite_choice(text: str) -> tuple[str, ...]:
    """``run --rewrites``: ``auto`` (:data:`AUTO`), ``none`` or a comma list of registry
    names, in the registry's order (:func:`quantscope.rewrites.registry.parse_rewrites`)."""
    if text.strip() == "auto":
        return AUTO
    if text.strip() == "search":
        return SEARCH
    try:
        return parse_rewrites(text)
    except QuantscopeError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--rewrites: ")) from None


def _config_flag(rw: Rewrite, o: CliOption) -> tuple[str, str]:
    """(run flag, dest) of a rewrite's config option: ``--NAME-OPTION``; an option whose
    legacy run flag is that same flag, or that fills a :class:`RunOptions` field, keeps
    that field as its dest."""
    flag = f"--{rw.name}-{o.flags[0].lstrip('-')}"
    return flag, o.run_field or f"rewrite_{rw.name}_{o.dest}"


def _add_rewrite_options(ru: argparse.ArgumentParser) -> None:
    """run's rewrites (the model the stages work on, rewritten first; FP32 unchanged),
    generated from the registry: ``--rewrites``, a ``--NAME-OPTION`` flag per config
    option, and the legacy switches (``CliOption.run_flag``), aliases kept one release."""
    ru.add_argument("--rewrites", type=rewrite_choice, default=None,
                    metavar="auto|none|search|NAME[,NAME…]",
                    help="work on the model rewritten first (FP32 unchanged; unverified on a "
                    f"device): a comma list of {', '.join(REWRITES)}, applied in that order "
                    "whatever the order given ('quantscope NAME --help' says what each does), "
                    "'none', or 'auto' (the default without a rewrite flag): each rewrite "
                    "whose precondition holds and whose rule binds is tried in that order and "
                    "kept only if the plan --max-legal candidate measures better on the fit "
                    "data; with the default repairs, a repair answering a rule that refuses "
                    "the uniform a8_w8 plan is added (rank4 for qnn.linearclip_5d); "
                    "rewritten.json, plan.json, the verdict and the report say what was "
                    "tried and kept; 'search': a decoder LLM's only (below)")
    for rw in REWRITES.values():
        for o in rw.cli_options:
            if o.flags and o.dest:
                flag, dest = _config_flag(rw, o)
                text = o.run_help if o.run_flag == flag else f"with --rewrites {rw.name}: {o.help}"
                kw = {**option_kwargs(o), "help": text, "default": None}
                if o.kind == "flag":
                    kw["default"] = False
                else:
                    kw["metavar"] = o.metavar or o.dest.upper()
                ru.add_argument(flag, dest=dest, **kw)
        for o in rw.cli_options:
            if o.run_flag and o.run_field and not (o.flags and o.dest
                                                   and _config_flag(rw, o)[0] == o.run_flag):
                same = f" {_config_flag(rw, o)[0]} {o.metavar or ''}".rstrip() if o.dest else ""
                kw = option_kwargs(o) if o.kind != "flag" else {"action": "store_true"}
                ru.add_argument(o.run_flag, **{**kw, "dest": o.run_field,
                                               "help": f"alias of --rewrites {rw.name}{same} "
                                               f"(kept for one release): {o.run_help}"})


def run_rewrites(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`RunOptions` fields of the rewrites chosen, the same whichever way they
    were given: ``rewrites`` names every rewrite on (by ``--rewrites`` or a legacy switch
    that only turns one on), the config values go into the fields that carry them
    (``token_chunk``, ``token_linears``) or ``rewrite_options``."""
    asked = args.rewrites  # None: not given (auto unless a rewrite flag names one)
    if asked == SEARCH:
        raise QuantscopeError("--rewrites search chooses a decoder LLM's recipe steps (rotate, "
                              "smooth, gatedsplit) by measurement: for this model (not a "
                              "prefill/decode pair) --rewrites auto, the default, is the "
                              "choice by measurement")
    names = set() if asked in (None, AUTO) else set(asked)
    fields: dict[str, Any] = {}
    options = []
    for rw in REWRITES.values():
        for o in rw.cli_options:
            value = getattr(args, o.run_field, None) if o.run_field else None
            if o.switch and value not in (None, False):  # a switch turns the rewrite on
                names.add(rw.name)
            if o.dest and o.run_field:
                fields[o.run_field] = value
            elif o.dest and o.flags:
                given = getattr(args, _config_flag(rw, o)[1], None)
                if given is not None and not (o.kind == "flag" and given is False):
                    options.append((rw.name, o.dest, given))  # a flag not given: default
    fields["rewrites"] = tuple(n for n in REWRITES if n in names)
    fields["rewrite_options"] = tuple(options)
    # auto when asked, or by default when no rewrite is named by a flag or an option
    fields["auto_rewrites"] = asked == AUTO or (asked is None and not names and not options)
    return fields


def _run_imports() -> None:
    """What a ``run`` imports during its work, loaded before it to be frozen
    (emulate/release.freeze_imports): the report's matplotlib (every run), and the symbolic
    shape inference's sympy (where ONNX's own inference leaves a shape open: the acceptance
    run; a run that never needs it pays its import, about half a second, for nothing)."""
    from quantscope.model.symbolic import preload
    from quantscope.report.figures import pyplot

    preload()
    pyplot()


def cmd_run(args: argparse.Namespace) -> int:
    from quantscope.emulate.release import freeze_imports
    from quantscope.model.hf_phases import is_hf_export
    from quantscope.pipeline.decoder import is_decoder

    freeze_imports(_run_imports)

    if is_hf_export(args.model):
        return _cmd_run_decoder(args, export=Path(args.model))
    if is_decoder(args.model):
        return _cmd_run_decoder(args)
    parser = args.run_parser
    given = [a.option_strings[0] for a in parser._actions
             if a.dest in DECODER_ONLY and getattr(args, a.dest, None) != parser.get_default(a.dest)]
    if given:
        raise QuantscopeError(f"{', '.join(given)}: for a decoder LLM's run only (model "
                              f"'{args.model}' is not a prefill/decode pair): drop "
                              f"{'it' if len(given) == 1 else 'them'}")
    repairs = {} if args.repairs is None else {
        "repairs": () if args.repairs == "none" else tuple(args.repairs.split(",")),
        "repairs_given": True}
    opts = RunOptions(model=args.model, data=args.data, target=args.target, out=args.folder,
                      eval_data=args.eval_data, goal=args.goal, max_cost=args.max_cost,
                      seq_len=args.seq_len, input_shapes=input_shapes(args),
                      pairs=None if args.pairs == 0 else args.pairs,
                      metric=args.metric, tokenizer=args.tokenizer, hn=args.hn,
                      prefixes=text_prefixes(args), calib_texts=args.calib_texts,
                      method=args.method, proxy=args.proxy,
                      repair_batches=args.repair_batches, whatif=args.whatif,
                      rank_engine=args.rank_engine,
                      race=args.race,
                      layout=tuple(args.layout), lengths=args.lengths,
                      batch_axes=tuple(merged_batch_axes(args.batch_axis).items()),
                      budget=args.budget, finetune=args.finetune, **repairs,
                      allow_warnings=tuple(sorted(set(args.allow_warning or ()))),
                      **run_rewrites(args))
    opts.check()  # the rewrites' options together, before the model is opened
    if args.layout:  # checked against the model's outputs before the run folder is made
        # (an axis= against the output's sample axis once the data is read)
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
    deployment = route.read_deployment(args.deployment)
    inp = open_inputs(args, data=True)
    assert inp.data is not None
    # a goal the data's metric cannot take (97 for a share): refused before any model runs
    check_goal(stages.default_metric(inp.data), args.goal)
    result = route.evaluate_deployment(inp.model, inp.data, deployment, progress=True)
    result = result.with_verdict(route.deployment_verdict(result, max_cost=args.max_cost,
                                                          goal=args.goal))
    print(format_deployment(result))
    if args.json:
        stages.write_json(args.json, result.to_dict())
        print(f"wrote {args.json}")
    return 0


def add_buckets(sub: argparse._SubParsersAction, summary: str) -> None:
    bu = command(sub, "buckets", summary,
                 example="quantscope buckets minilm-l6 --data stdlib-docs --pairs 600 "
                 "--skip-pairs 300 --candidates candidates.json --max-cost 1.5 "
                 "--out deployment.json",
                 parents=(model_parent(), data_parent(), tokenizer_parent(),
                          pairs_parent(None, "loaded"),
                          cache_parent("each candidate's measurement on the selection "
                                       "texts"),
                          race_parent("the candidates (by each selection pair's 1 - cosine; "
                                      "only a rival no more expensive at any length may stop "
                                      "one)"),
                          allow_warning_parent("does not make a candidate illegal at a "
                                               "length")),
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
    candidates, target = buckets.read_candidates(args.candidates)
    for c in candidates:
        for key, p in c.paths:
            if Path(p).exists() and Path(p).resolve() == Path(args.out).resolve():
                raise QuantscopeError(f"--out '{args.out}' is the {key} of candidate "
                                      f"'{c.name}': write the deployment to another path "
                                      "(inputs are never overwritten)")
    allowed = allowed_of(args, load_target(target))
    inp = open_inputs(args, data=True)
    assert inp.data is not None
    cache = EvalCache(args.cache) if args.cache else None
    choice = buckets.choose_deployment(
        inp.model, inp.data, candidates, target, max_cost=args.max_cost,
        seq_lens=args.lengths or CHOICE_LENGTHS, max_buckets=args.max_buckets,
        skip_pairs=args.skip_pairs, progress=True, cache=cache, race=args.race,
        allowed=allowed)
    print(format_choice(choice))
    for line in (*cache.notes, cache.summary()) if cache is not None else ():
        print(line)
    stages.write_json(args.out, deployment_file(choice, args.out))
    print(f"wrote {args.out}")
    if args.json:
        stages.write_json(args.json, choice.to_dict())
        print(f"wrote {args.json}")
    return 0
