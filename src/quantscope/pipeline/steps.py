"""The run's stages: each reads its inputs from the run folder (or the model and data),
calls the stage functions of :mod:`quantscope.stages`, and writes files under stable names.

Wall-clock timings never go into a stage's files (they would make two runs on the same
inputs differ); the runner keeps them in ``run.json``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from quantscope import stages
from quantscope.emulate.release import STAGE_RELEASE_GROWTH, release_memory
from quantscope.export.formats import ALWAYS, FORMATS
from quantscope.export.qnn_encodings import unencoded_line
from quantscope.pipeline.context import Context
from quantscope.pipeline.held_out import keep_powers
from quantscope.plan.accepted import accepted_lines, accepted_of
from quantscope.report.fmt import value as figure_text
from quantscope.results import CheckResult, DeviceIOResult, RunEvaluation
from quantscope.targets import Target, load_target
from quantscope.tasks.left_out import share_left_out
from quantscope.types import Plan, Precision, QuantscopeError
from quantscope.units import is_db

# stable file names in the run folder (an export format's: its registry entry)
STATS, ANALYSIS, PLAN = "stats.npz", "analysis.json", "plan.json"
REPAIRED, REPAIRED_STATS, REPAIRED_PLAN = "repaired.onnx", "repaired.stats.npz", "repaired.plan.json"
CHECK, EVALUATE, QDQ = "check.json", "evaluate.json", FORMATS[ALWAYS].file_name
ALLS, QNN = FORMATS["alls"].file_name, FORMATS["qnn"].file_name
IO, SNIPPET, REPORT, VERDICT = "io.json", "io_snippet.py", "report.html", "verdict.json"
EVALS = "evals"  # the plan search's evaluation cache (analyze/evalcache.py), a folder
LENGTHS, DEPLOYMENT = "lengths.json", "deployment.json"  # the deploy stage's (pipeline/deploy.py)


@dataclass(frozen=True)
class Done:
    files: tuple[str, ...]
    timings: dict[str, Any] = dataclasses.field(default_factory=dict)


def _say(ctx: Context, text: str) -> None:
    from quantscope.progress import say

    say(text, show=ctx.progress)


def calibrate(ctx: Context) -> Done:
    stats = stages.calibrate_model(ctx.model(), ctx.data().fit, method=ctx.opts.method,
                                   progress=ctx.progress)
    stages.write_stats(ctx.path(STATS), stats)
    if ctx.opts.calib_texts:  # a choice that moves every figure: said where it is made
        _say(ctx, f"calibrate: {stats.num_samples} calibration texts (--calib-texts "
             f"{ctx.opts.calib_texts})")
    return Done((STATS,))


def analyze(ctx: Context) -> Done:
    from quantscope.analyze import analysis_to_dict
    from quantscope.analyze import analyze as run_analysis
    from quantscope.model.groups import find_groups
    from quantscope.stages.usable import unusable_groups

    model, fit = ctx.model(), ctx.data().fit
    groups = find_groups(model)
    scorer = stages.scorer_for(fit, model, ctx.opts.metric)  # ranks by what plan judges
    high = ctx.target().promote  # a16_w16, or the target's [promotion]
    skip = unusable_groups(model, ctx.target(), low=Precision.A8_W8, high=high,
                           groups=groups, seq_len=ctx.opts.seq_len,
                           input_shapes=ctx.opts.input_shapes)  # only what plan can use
    result = run_analysis(model, groups, stages.read_stats(ctx.path(STATS)),
                          list(fit.evaluation), scorer=scorer, high=high,
                          target=ctx.target(), proxy_fraction=ctx.opts.proxy,
                          progress=ctx.progress, skip=skip)
    doc = analysis_to_dict(result)
    seconds = doc["method"].pop("sweep_seconds", None)
    stages.write_json(ctx.path(ANALYSIS), doc)
    return Done((ANALYSIS,), {"sweep_seconds": seconds})


# the plan search's measuring time when the deploy stage chooses compiled lengths: the
# deployment is chosen among the deploy stage's own candidates (max-legal and its variants
# per length), of which the searched plan is one. On minilm-l3, minilm-l6 and mpnet-base
# (stop 40/41) none of the six compiled models was the searched plan, and mpnet-base's
# search took 21.6 of its run's minutes
LENGTHS_SEARCH_S = 300.0


@dataclass(frozen=True)
class PlanScope:
    """What the plan search may do in this run: measure for ``budget`` seconds (None: no
    bound) and offer ``repairs``; ``lines`` say where these differ from ``--budget`` and
    ``--repairs``."""

    budget: float | None
    repairs: tuple[str, ...]
    lines: tuple[str, ...] = ()


def plan_scope(ctx: Context) -> PlanScope:
    """``--budget`` and ``--repairs``, except where the deploy stage will choose compiled
    lengths (:func:`quantscope.pipeline.tune.lengths_decided`): the search measures for at
    most :data:`LENGTHS_SEARCH_S` (``none`` and a smaller budget stand), and offers no
    repair unless ``--repairs`` was given. The deploy stage's own candidates are plans of
    the calibrated model without repairs, and each repair offer is measured by full passes
    before the search starts (on mpnet-base, 4 of the plan stage's 14.6 minutes, and every
    plan with repairs then ran in full: no incremental evaluation)."""
    from quantscope.pipeline.tune import lengths_decided

    o = ctx.opts
    cap = o.budget is not None and o.budget > LENGTHS_SEARCH_S
    drop = bool(o.repairs) and not o.repairs_given
    why = lengths_decided(ctx) if cap or drop else None
    if why is None:
        return PlanScope(o.budget, o.repairs)
    lines = []
    if cap:
        lines.append(
            f"plan: the search measures for at most {LENGTHS_SEARCH_S / 60:.0f} min of the "
            f"{o.budget / 60:.0f} min --budget: the deploy stage chooses compiled lengths "
            f"({why}) among its own candidates, of which this plan is one")
    if drop:
        lines.append(
            "plan: no repair offered (the deploy stage's candidates at each compiled length "
            "carry none; give --repairs to offer them): "
            f"{', '.join(o.repairs)} not measured")
    return PlanScope(LENGTHS_SEARCH_S if cap else o.budget, () if drop else o.repairs,
                     tuple(lines))


def plan(ctx: Context) -> Done:
    """The plan search on the fit data, every evaluation kept in ``evals/`` (a rerun, or
    one with a larger ``--budget``, reads them back); the budget is the seconds the search
    may measure (:func:`plan_scope`: ``RunOptions.budget``, less where the deploy stage
    chooses compiled lengths)."""
    from quantscope.analyze.evalcache import EvalCache
    from quantscope.serde import read_sensitivity

    o = ctx.opts
    record = _auto_record(ctx)
    scope = plan_scope(ctx)
    for line in scope.lines:
        _say(ctx, line)
    options = stages.PlanOptions(max_cost=o.max_cost, seq_len=o.seq_len,
                                 input_shapes=o.input_shapes, metric=ctx.metric(),
                                 goal=o.goal, repairs=scope.repairs,
                                 repair_batches=o.repair_batches, rank_engine=o.rank_engine,
                                 budget=scope.budget, race=o.race,
                                 allowed_warnings=ctx.allowed_warnings())
    cache = EvalCache(ctx.path(EVALS))
    out = stages.plan_model(ctx.model(), read_sensitivity(ctx.path(ANALYSIS)), ctx.target(),
                            options, data=ctx.data().fit,
                            stats=stages.read_stats(ctx.path(STATS)), progress=ctx.progress,
                            cache=cache)
    for line in (*cache.notes, cache.summary()):
        _say(ctx, f"plan: {line}")
    for line in accepted_lines(accepted_of(out.plan)):
        _say(ctx, f"plan: {line}")
    for note in out.offer.notes if out.offer is not None else ():  # why a repair is not used
        _say(ctx, f"plan: {note}")
    said = {"scope": list(scope.lines)} if scope.lines else {}
    extra, timings = _untimed({**out.file_extra(), **record, **said})
    stages.write_plan(ctx.path(PLAN), out.plan, extra)
    work = {} if out.work is None else {"measuring_engine": out.work}
    return Done((PLAN,), {**timings, "evaluation_cache": cache.counts(), **work})


def plan_rules(ctx: Context) -> dict[str, str]:
    """The rules the plan stage's result follows beyond its options, for its key: where
    repairs are offered, the version of their out-of-sample check
    (:data:`quantscope.stages.offer_holdout.CHECK_KEY`), so a run folder whose offers were
    kept or withdrawn under an older check (or none) plans again."""
    from quantscope.stages.offer_holdout import CHECK_KEY

    return {**({"offer_check": CHECK_KEY} if ctx.opts.repairs else {}), **noise_rules(ctx)}


def noise_rules(ctx: Context) -> dict[str, str]:
    """On face data, the units a figure's noise counts
    (:data:`quantscope.tasks.left_out.UNITS_KEY`: people, a dB figure's since h69, a
    share's since h71), in the keys of the plan stage (its no-goal choice) and the
    evaluate stage (the held-out check's powers and left-out shares): a folder whose noise
    counted photos or pairs runs them again; other data's keys unchanged."""
    from quantscope.tasks.left_out import UNITS_KEY
    from quantscope.tasks.registry import is_face_spec

    o = ctx.opts
    faces = any(is_face_spec(d) for d in (o.data, o.eval_data) if d)
    return {"noise_units": UNITS_KEY} if faces else {}


def plan_budget_grew(ctx: Context) -> bool:
    """Whether a finished plan stage must run again for this run's ``--budget``: its
    search was stopped by a smaller budget (the plan file's ``time_budget``) and this run
    gives more (or none); a smaller or equal budget reuses the plan. The evaluations done
    are in ``evals/``, so the search continues where it stopped."""
    import json

    try:
        doc = json.loads(ctx.path(PLAN).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    tb = (doc.get("pareto") or {}).get("time_budget") if isinstance(doc, dict) else None
    if not isinstance(tb, dict) or not tb.get("bound"):
        return False
    budget = plan_scope(ctx).budget
    return budget is None or budget > float(tb.get("budget_s", 0.0))


def _auto_record(ctx: Context) -> dict[str, Any]:
    """With ``--rewrites auto``, the record for ``plan.json`` (``rewrites``: what auto
    tried and kept, and the legality repairs it applied before planning:
    :mod:`quantscope.pipeline.auto`)."""
    choice = ctx.auto_choice()
    return {} if choice is None else {"rewrites": choice.to_dict()}


def _untimed(obj: Any, where: str = "") -> tuple[Any, dict[str, Any]]:
    """``obj`` without its ``seconds`` entries, and those entries by JSON path."""
    timings: dict[str, Any] = {}
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k == "seconds":
                timings[where or "/"] = v
                continue
            out[k], sub = _untimed(v, f"{where}/{k}")
            timings.update(sub)
        return out, timings
    if isinstance(obj, list | tuple):
        parts = [_untimed(v, f"{where}/{i}") for i, v in enumerate(obj)]
        for _, sub in parts:
            timings.update(sub)
        return [p for p, _ in parts], timings
    return obj, timings


def repair(ctx: Context) -> Done:
    """The plan's repairs, then the run's fine-tune of the result (``--finetune``:
    :mod:`quantscope.pipeline.tune`): ``repaired.*`` hold what the compiler gets, the
    fine-tuned model when it was kept; its record is the ``finetune`` entry of
    ``repairs``."""
    from quantscope.pipeline.tune import tune
    from quantscope.repair.apply import run_repairs

    model, plan_ = ctx.model(), stages.read_plan(ctx.path(PLAN))
    chosen = [n for n in dict(plan_.meta).get("repairs", "").split(",") if n]
    feeds = list(ctx.data().fit.calibration)[: ctx.opts.repair_batches]
    _say(ctx, f"repairs chosen by the plan: {', '.join(chosen) or 'none'}")
    out = run_repairs(model, stages.read_stats(ctx.path(STATS)), plan_, feeds, repairs=chosen,
                      scheme=ctx.target().scheme, progress=ctx.progress)
    done = tune(ctx, out, feeds)
    stages.write_onnx(ctx.path(REPAIRED), out.proto if done.model is None else done.model.proto)
    stages.write_stats(ctx.path(REPAIRED_STATS), done.stats)
    extra, timings = _untimed({"repairs": [r.to_json() for r in out.records]
                               + [done.record.to_dict()]})
    stages.write_plan(ctx.path(REPAIRED_PLAN), done.plan, extra)
    return Done((REPAIRED, REPAIRED_STATS, REPAIRED_PLAN), {**timings, **done.timings})


def repaired(ctx: Context) -> tuple[stages.Model, stages.Stats, Plan]:
    """The repaired model (what the compiler gets), its stats and the final plan. When no
    repair changed the model the run works on (``repaired.onnx`` holds the same proto as
    :meth:`Context.model`'s, once a stage has loaded that), the proto is held once: loading
    is idempotent, so the repaired model is the working model under the name
    ``repaired.onnx`` (mpnet-base's rewritten graph is 438 MB, held twice by every stage
    from check to io before). The working model is not loaded here for this: ``check``
    and ``export`` read only the repaired one."""
    working = ctx._cache.get("model")
    held = ctx._cache.get("repaired")
    if held is None:
        final = stages.read_plan(ctx.path(REPAIRED_PLAN))
        stages.check_plan_target(final, ctx.target().name, plan_name=REPAIRED_PLAN)
        raw = _read_onnx(ctx.path(REPAIRED))
        model = (stages.Model(proto=working.proto, source=REPAIRED)
                 if working is not None and raw == working.proto
                 else stages.load_proto(raw, REPAIRED))
        del raw
        ctx._cache["repaired_compared"] = None if working is None else working.proto
        held = ctx._cache["repaired"] = (model, stages.read_stats(ctx.path(REPAIRED_STATS)),
                                         final)
    elif (working is not None and held[0].proto is not working.proto
          and ctx._cache.get("repaired_compared") is not working.proto):
        ctx._cache["repaired_compared"] = working.proto  # compared once, not every stage
        if held[0].proto == working.proto:  # loaded apart by a stage before the model
            held = ctx._cache["repaired"] = (
                stages.Model(proto=working.proto, source=REPAIRED), *held[1:])
    return held


def _read_onnx(path: Any) -> Any:
    import onnx

    return onnx.load(str(path))


def check(ctx: Context) -> Done:
    from quantscope.plan.check import BUILTIN_RULES
    from quantscope.plan.op_support import CONDITIONAL as OPS_CONDITIONAL
    from quantscope.plan.op_support import UNLISTED as OPS_UNLISTED
    from quantscope.plan.op_support import UNSUPPORTED as OPS_UNSUPPORTED

    model, _, final = repaired(ctx)
    problems = stages.plan_problems(model, final, seq_len=ctx.opts.seq_len,
                                    input_shapes=ctx.opts.input_shapes)
    target = ctx.target()
    allowed = ctx.allowed_warnings()
    rules = [{"rule": r, "severity": "error", "reason": "built-in plan check",
              "provenance": "quantscope"} for r in sorted(BUILTIN_RULES)]
    rules += [{"rule": r.id, "severity": r.severity, "reason": r.reason,
               "provenance": r.provenance} for r in target.rules]
    if target.ops is not None and not target.ops.takes_all:
        rules += [{"rule": OPS_UNSUPPORTED, "severity": "error",
                   "reason": "an operator the target's compiler does not take ([ops])",
                   "provenance": target.ops.source},
                  {"rule": OPS_UNLISTED, "severity": "warning",
                   "reason": "an operator no list of the target names ([ops]): not guessed",
                   "provenance": target.ops.source}]
        if any(e.status == "conditional" for e in target.ops.entries):
            rules.append({"rule": OPS_CONDITIONAL, "severity": "warning",
                          "reason": "an operator the target's compiler takes in some forms "
                          "only ([ops] 'conditional')", "provenance": target.ops.source})
    for r in rules:
        hits = [p for p in problems if p["rule"] == r["rule"]]
        r["passed"] = not hits
        r["groups"] = [p["group"] for p in hits]
        if hits and r["rule"] in allowed:  # listed as accepted, not as passing
            r["accepted"] = "accepted by --allow-warning"
    stages.write_json(ctx.path(CHECK), CheckResult(
        target=target.name, sdk=target.sdk, seq_len=ctx.opts.seq_len,
        input_shapes={k: list(v) for k, v in ctx.opts.input_shapes},
        shape_note=stages.shape_note(model, ctx.opts.seq_len, ctx.opts.input_shapes),
        rules=rules, problems=problems).to_dict())
    return Done((CHECK,))


def evaluate(ctx: Context) -> Done:
    """FP32, uniform a8_w8 and the final plan on the held-out data, against FP32."""
    from quantscope.emulate.evaluate import run_model
    from quantscope.pipeline.data import provenance

    model, rd, scheme = ctx.model(), ctx.data(), ctx.target().scheme
    held = rd.held_out
    ref = run_model(model.proto, list(held.evaluation), label="fp32" if ctx.progress else "")
    # each pass's session and arena given back before the next
    release_memory(growth=STAGE_RELEASE_GROWTH)
    stats = stages.read_stats(ctx.path(STATS))
    uniform = {"fp32": Plan.uniform(Precision.FLOAT), "a8_w8": Plan.uniform(Precision.A8_W8)}
    head = ctx.headline()
    # a headline in dB: its per-sample powers too, the noise of the plan's held-out
    # difference from a8_w8 (same samples: paired; pipeline.held_out)
    powers = head.unit == "dB" or is_db(head.metric)
    # a share on face data: its value with each held-out person left out (the noise of the
    # plan's difference from a8_w8 over people, not pairs: pipeline.held_out)
    shares = share_left_out(held.task, head.metric)
    results = stages.evaluate_plans(model, held, stats, uniform, scheme=scheme,
                                    progress=ctx.progress, reference_outputs=ref,
                                    own_outputs=True,  # ref is the model's own: fp32 row
                                    sample_parts=powers, left_out=shares)
    release_memory(growth=STAGE_RELEASE_GROWTH)
    rmodel, rstats, final = repaired(ctx)
    results.update(stages.evaluate_plans(
        rmodel, held, rstats, {"plan": final}, progress=ctx.progress, reference_outputs=ref,
        error_scales=stages.ERROR_SCALES if ctx.opts.whatif else (), sample_parts=powers,
        left_out=shares))
    release_memory(growth=STAGE_RELEASE_GROWTH)
    keep_powers(results, head.metric)
    for r in results.values():
        r["model"] = ctx.opts.model if r["model"] != REPAIRED else REPAIRED
    doc = {"metric": head.metric, "unit": head.unit, "higher_is_better": head.higher_is_better,
           "results": results, "data": provenance(rd)}
    if any(fmt == "alls" for fmt, _ in formats(ctx.target())):  # what the script carries
        hn = stages.read_json_file(ctx.opts.hn, "HN") if ctx.opts.hn else None
        scripted, lost = stages.scripted_plan(rmodel, final, hn=hn)
        if lost:
            doc["as_scripted"] = {"script": ALLS, "decisions": len(lost), "groups": list(lost),
                                  "result": stages.evaluate_plans(
                                      rmodel, held, rstats, {"as_scripted": scripted},
                                      progress=ctx.progress,
                                      reference_outputs=ref)["as_scripted"]}
    if ctx.opts.whatif:
        try:
            doc["whatif"] = stages.whatif_families(rmodel, held, rstats, final,
                                                   metric=ctx.metric(), progress=ctx.progress,
                                                   reference_outputs=ref,
                                                   plan_result=results["plan"],
                                                   goal=ctx.opts.goal, figure=figure_text)
        except QuantscopeError as e:  # e.g. nothing below 16 bit: said, not fatal
            doc["whatif"] = {"skipped": str(e)}
    stages.write_json(ctx.path(EVALUATE), RunEvaluation.of(doc).to_dict())
    return Done((EVALUATE,))


def export(ctx: Context) -> Done:
    model, stats, final = repaired(ctx)
    written = [QDQ]
    stages.export_plan(model, stats, final, fmt=ALWAYS, out=ctx.path(QDQ))
    hn = stages.read_json_file(ctx.opts.hn, "HN") if ctx.opts.hn else None
    for fmt, name in formats(ctx.target()):
        export_file(model, stats, final, fmt, ctx.path(name), hn=hn, label=name,
                    say=lambda text: _say(ctx, f"export: {text}"))
        written.append(name)
    for f in FORMATS.values():  # another target's file from an earlier run in this folder
        if f.file_name not in written:  # (a stale model.alls would be handed over and read)
            ctx.path(f.file_name).unlink(missing_ok=True)
    return Done(tuple(written))


def export_file(model: Any, stats: Any, plan: Plan, fmt: str, out: Any, *, hn: Any,
                label: str, say: Callable[[str], None]) -> None:
    """One compiler file of ``plan`` (``export_plan``) and its console warning, for the
    encoder run's export and each phase of the decoder's: a QNN encodings file names the
    tensors inside groups it has no encoding for (:func:`unencoded_line`, ``label`` the
    file's name in the run folder; also in verdict.json's ``export_warnings`` and
    ``qnn_unencoded``, and the report)."""
    stages.export_plan(model, stats, plan, fmt=fmt, out=out, hn=hn)
    unencoded = unencoded_line(label, stages.qnn_unencoded(model)) if fmt == "qnn" else None
    if unencoded:
        say(f"warning: {unencoded}")


def formats(target: Target | str) -> list[tuple[str, str]]:
    """The export formats of a target besides the QDQ model (always written): (format,
    file name), as its profile lists them (``formats`` in its TOML). A name that is no
    built-in target (a profile from a file, given by name) has none here: pass the
    :class:`Target`."""
    if isinstance(target, str):
        try:
            target = load_target(target)
        except QuantscopeError:
            return []
    return [(f, FORMATS[f].file_name) for f in target.formats if f != ALWAYS]


def io(ctx: Context) -> Done:
    from quantscope.export import device_io as dio

    model, stats, plan = repaired(ctx)
    rows = stages.device_io_rows(model, stats, plan)
    floats = stages.float_io_rows(model, plan)
    as_is = dio.as_is_io(model, rows)
    stages.write_json(ctx.path(IO), DeviceIOResult(io=rows, note=dio.PROVENANCE,
                                                   float_io=floats or None,
                                                   as_is_io=as_is or None).to_dict())
    snippet = dio.python_snippet(rows, floats, as_is)
    if ctx.opts.prefixes:  # the host must put the same text before queries and documents
        snippet += "\n" + dio.text_snippet(ctx.opts.prefixes.query, ctx.opts.prefixes.document)
    lengths = ctx.path(LENGTHS)
    doc = stages.read_json_file(lengths, LENGTHS) if lengths.is_file() else {}
    if doc.get("deployment"):  # several compiled lengths (or one kept): the host's router
        buckets = [(n, f"len-{n}/model.onnx") for n in doc["deployment"]["seq_lens"]]
        snippet += "\n" + dio.router_snippet(buckets, doc["inputs"], doc["pad_id"])
    stages.write_text(ctx.path(SNIPPET), snippet)
    return Done((IO, SNIPPET))



Step = Callable[[Context], Done]
