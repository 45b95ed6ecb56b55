"""The run's verdict (``verdict.json``, printed at the end) and its HTML report.

The verdict answers: was the goal reached on the held-out data by what ships (the
deployment of compiled lengths when the run measured one, else the single plan:
``headline``, ``ships``; ``cost`` is its cost, ``plan_cost`` and ``plan_reached`` the
single plan's); what binds; the plan's quality against uniform a8_w8 and FP32; the exact files for the vendor compiler; how to
feed the inputs and read the outputs (the io rows).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantscope import stages
from quantscope.export.formats import ALWAYS, FORMATS
from quantscope.export.hailo_alls import script_warnings
from quantscope.export.qnn_encodings import unencoded_line
from quantscope.pipeline import steps
from quantscope.pipeline.context import Context
from quantscope.pipeline.held_out import headline_left_out, headline_parts, worse_held_out
from quantscope.pipeline.manifest import unfinished_lines
from quantscope.pipeline.verdict_findings import (
    COMPARED,
    _channels_read,
    _data_notes,
    _gated,
    _left_out,
    _outputs_headline,
    _saturated_inside,
    _saturated_outputs,
    _says_little,
    _unscored,
    _unscored_figures,
)
from quantscope.plan.accepted import accepted_of
from quantscope.plan.op_support import CONDITIONAL as OP_CONDITIONAL
from quantscope.plan.op_support import RULES as OP_RULES
from quantscope.plan.op_support import UNSUPPORTED as OP_UNSUPPORTED
from quantscope.rewrites.registry import REWRITES
from quantscope.tasks.classes import AXIS_BY_DEFAULT
from quantscope.tasks.embedding_hint import MARK as EMBEDDING_MARK
from quantscope.tasks.layout_spec import image_ranges
from quantscope.tasks.pixels import pixels_note
from quantscope.tasks.points import ON_PHOTO
from quantscope.tasks.shares import clusters_key, items_key

if TYPE_CHECKING:
    from quantscope.targets.profile import Target



def _warned(problems: list[dict[str, Any]]) -> list[str]:
    """Each warned rule once, ``rule (N groups[, may not apply here])`` (an operator rule:
    ``rule (N op types)``, its problem's group lists them)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for p in problems:
        if p["severity"] == "warning":
            out.setdefault(p["rule"], []).append(p)

    def count(rule: str, ps: list[dict[str, Any]]) -> str:
        if rule in OP_RULES:
            n = sum(len(p["group"].split(", ")) for p in ps)
            return f"{n} op type{'s' * (n != 1)}"
        return f"{len(ps)} group{'s' * (len(ps) != 1)}"

    return [f"{rule} ({count(rule, ps)}"
            + (", may not apply here" if not any(p.get("applies", True) for p in ps) else "")
            + ")" for rule, ps in sorted(out.items())]


def _accepted(ctx: Context, chk: dict[str, Any]) -> dict[str, Any]:
    """``accepted_warnings``: the warning rules ``--allow-warning`` accepted, each with its
    reason and the groups it lets through (the final plan's record); ``rules_accepted``:
    those that warn on it (check.json: listed as accepted, not as passing)."""
    return {"accepted_warnings": accepted_of(stages.read_plan(ctx.path(steps.REPAIRED_PLAN))),
            "rules_accepted": sorted(r["rule"] for r in chk["rules"] if r.get("accepted"))}


def _operators(problems: list[dict[str, Any]], target: str) -> list[str]:
    """The operators the target does not take or no list names, each with its fix (the
    nodes and the source are in check.json)."""
    out = []
    for p in problems:
        if p["rule"] == OP_UNSUPPORTED:
            out.append(f"{p['reason']} ({p['rule']}; the source in check.json): {p['fix']}")
        elif p["rule"] == OP_CONDITIONAL:
            out.append(f"operators {target} takes in some forms only: {p['group']} "
                       f"({p['rule']}; the forms seen, their nodes and sources in "
                       f"check.json): {p['fix']}")
        elif p["rule"] in OP_RULES:
            out.append(f"operators in no list quantscope holds for {target}, not known to "
                       f"compile or to fail: {p['group']} ({p['rule']}; their nodes and the "
                       f"list consulted in check.json): {p['fix']}")
    return out


def _read(ctx: Context, name: str) -> Any:
    return stages.read_json_file(ctx.path(name), name)


def verdict(ctx: Context) -> dict[str, Any]:
    """The verdict from the run folder's files (no computation besides reading them)."""
    from quantscope.report.summary import headline

    ev, plan, chk, io = (_read(ctx, n) for n in (steps.EVALUATE, steps.PLAN, steps.CHECK,
                                                 steps.IO))
    metric, results = ev["metric"], ev["results"]
    # the items a share counts, where its task counts them (and the samples they cluster
    # in: per position, the items are an effective count of positions)
    counts = (items_key(metric), clusters_key(metric))
    quality = {label: {k: results[label]["metrics"].get(k) for k in (metric, "sqnr_db", *counts)
                       if k not in counts or k in results[label]["metrics"]}
               for label in COMPARED if label in results}
    goal = ctx.opts.goal
    higher = bool(ev.get("higher_is_better", True))
    pareto = plan.get("pareto", {})
    errors = [p for p in chk["problems"] if p["severity"] == "error"]
    plan_cost = pareto.get("chosen", {}).get("cost")
    summary = _summary_keys(ctx, ev, pareto, chk)
    # what ships: the deployment of compiled lengths when one was measured, else the plan
    head = headline({"metric": metric, "quality": quality, "legal": not errors,
                     "plan_cost": plan_cost, **summary})
    reached, plan_reached = (_reached(goal, x, higher) for x in (
        head["value"], quality.get("plan", {}).get(metric)))
    return {
        "metric": metric, "unit": ev.get("unit", ""), "higher_is_better": higher,
        "goal": goal, "reached": reached, "ships": head["ships"], "headline": head,
        "plan_reached": plan_reached,
        "worse_held_out": _worse(ev, head, quality, plan_cost, pareto),
        "uniform_meets_goal": bool(pareto.get("uniform_meets_goal")),
        "binding": _binding(pareto, reached),
        **({"ranking": pareto["engines"]} if pareto.get("engines") else {}),
        # how the search chose among its measured plans without a quality goal, with the
        # noise interval that made a cheaper plan a tie (plan.pareto.choice_record)
        **({"choice": pareto["choice"]} if pareto.get("choice") else {}),
        # the plan search stopped on --budget (absent when it did not bind)
        **({"time_budget": pareto["time_budget"]} if pareto.get("time_budget") else {}),
        # where the search's budget and repairs differ from --budget/--repairs (steps.plan_scope)
        **({"plan_scope": plan["scope"]} if plan.get("scope") else {}),
        # cost: what ships (the deployment's held-out mean cost, else the plan's), and
        # whether it is over --max-cost (a cap no plan meets ships the cheapest, said)
        "quality": quality, "cost": head["cost"], "plan_cost": plan_cost,
        "max_cost": ctx.opts.max_cost, "over_max_cost": _over(head["cost"], ctx.opts.max_cost),
        "evaluation": ev["data"]["split"],
        "legal": not errors, "rules_checked": len(chk["rules"]),
        "rules_failed": sorted({p["rule"] for p in errors}),
        # rules that warn on the plan (a target whose rules are warnings: legal, and said)
        "rules_warned": _warned(chk["problems"]), **_accepted(ctx, chk),
        "compiler_files": compiler_files(ctx.target()),
        "export_warnings": export_warnings(ctx),
        # every tensor the QNN file has no encoding for (export_warnings names the first)
        "qnn_unencoded": [{"tensor": t, "group": g} for t, g in qnn_unencoded(ctx)],
        # the single plan as its Hailo script carries it (NOT SET decisions at the default)
        **_as_scripted(ev, quality, goal, higher),
        "io": io["io"], "io_note": io["note"], "io_float": io.get("float_io") or [],
        "io_as_is": io.get("as_is_io") or [],
        "repairs": [r["name"] for r in _read(ctx, steps.REPAIRED_PLAN).get("repairs", [])
                    if not r.get("skipped")],
        **rewrite_notes(ctx),
        "whatif": _whatif(ev.get("whatif")),
        "not_like_fp32": _not_like(results, metric), "outputs_headline": _outputs_headline(results),
        "gated": _gated(results), "on_photo": _gated(results, ON_PHOTO),
        "says_little": _says_little(results), "channels_left_out": _left_out(results),
        "operators": _operators(chk["problems"], chk["target"]),
        "saturated_outputs": _saturated_outputs(
            results.get("plan", {}), [r for r in io["io"] if r["role"] == "output"],
            image_ranges(ctx.opts.layout)),
        # tensors inside the model whose calibrated range clips the plan's held-out values
        # (the outputs are saturated_outputs): in the held-out figure, said where it binds
        "saturated_inside": _saturated_inside(
            results.get("plan", {}), [r for r in io["io"] if r["role"] == "output"]),
        # outputs scored for fidelity only (not in the task's figures nor the headline)
        "unscored": _unscored(ev["data"]),
        # ... their held-out figures (plan, a8_w8); a worst-channel headline's, with the axis
        "unscored_figures": _unscored_figures(_unscored(ev["data"]), results),
        "channels_read": _channels_read(_unscored(ev["data"]), results, metric),
        "left_float": left_float(results.get("plan", {}).get("coverage")),
        **_model_and_data_findings(ctx, ev["data"]),
        **summary,
    }


def _worse(ev: dict[str, Any], head: dict[str, Any], quality: dict[str, Any],
           plan_cost: float | None, pareto: dict[str, Any]) -> dict[str, Any] | None:
    """The plan that ships worse held out than uniform a8_w8: said, with what to do
    (:mod:`quantscope.pipeline.held_out`); None when it is not, or a deployment ships."""
    if head["ships"] != "plan":
        return None
    return worse_held_out(ev["metric"], ev.get("unit", ""), quality, plan_cost,
                          higher=bool(ev.get("higher_is_better", True)),
                          uniform_meets_goal=bool(pareto.get("uniform_meets_goal")),
                          parts=headline_parts(ev["results"], ev["metric"]),
                          left=headline_left_out(ev["results"], ev["metric"]))


def _as_scripted(ev: dict[str, Any], quality: dict[str, Any], goal: float | None,
                 higher: bool) -> dict[str, Any]:
    """``evaluate.json``'s single plan as its script carries it, beside the plan, the goal
    judged on it ({} when the script carries every decision)."""
    sc = ev.get("as_scripted")
    if not sc:
        return {}
    value = sc["result"]["metrics"].get(ev["metric"])
    return {"as_scripted": {"script": sc["script"], "decisions": sc["decisions"],
                            "value": value, "plan": quality.get("plan", {}).get(ev["metric"]),
                            "reached": _reached(goal, value, higher)}}


def _reached(goal: float | None, value: float | None, higher: bool) -> bool | None:
    return None if goal is None or value is None else bool(
        value >= goal if higher else value <= goal)


def _summary_keys(ctx: Context, ev: dict[str, Any], pareto: dict[str, Any],
                  chk: dict[str, Any]) -> dict[str, Any]:
    """The short verdict's inputs: the held-out sample size, what binds as measured by the
    whatif, the host steps (from the compiled model's inputs and outputs)."""
    from quantscope.report import summary

    model = stages.open_model(ctx.path(steps.REPAIRED))

    def info(values: Any) -> list[dict[str, Any]]:
        return [{"name": t.name, "dtype": t.type.tensor_type.elem_type,
                 "dims": [d.dim_param if d.HasField("dim_param") else
                          (d.dim_value if d.HasField("dim_value") else None)
                          for d in t.type.tensor_type.shape.dim]} for t in values]

    graph = model.proto.graph
    inits = {i.name for i in graph.initializer}
    pooled = summary.task_kind(ev["data"].get("held_out", {}).get("task")) in (
        "retrieval", "sts")
    text = pooled or any(i.name in ("input_ids", "attention_mask") for i in graph.input)
    kinds = {}
    if ev.get("whatif") and "skipped" not in ev["whatif"]:
        from quantscope.targets.profile import op_kind

        kinds = {g.name: op_kind(g) for g in stages.find_groups(model).groups}
    lengths = ctx.path(steps.LENGTHS)
    return {
        "held_out": summary.held_out(ev),
        "deployment": summary.deployment(_read(ctx, steps.LENGTHS) if lengths.is_file()
                                         else None, ev["metric"]),
        "binds_measured": summary.binds_measured(ev.get("whatif"), pareto, kinds),
        "host_steps": summary.host_steps(
            info([i for i in graph.input if i.name not in inits]), info(graph.output),
            text=text, pooled=pooled, seq_len=chk.get("seq_len") or ctx.opts.seq_len,
            longest=max(ev["data"]["fit"].get("token_lengths") or [0]) or None,
            lookups=[r["host_lookup"] for r in _read(ctx, steps.IO).get("io", [])
                     if r.get("host_lookup")],
            prefixes=ctx.opts.prefixes.to_dict() if ctx.opts.prefixes else None,
            shapes=chk.get("input_shapes") or None,
            shapes_from_data=ctx.opts.input_shapes_from_data,
            measured_shapes=None if text else _measured_shapes(ctx, chk.get("input_shapes")),
            pixels=None if text or not ctx.opts.data else _pixels(ctx.opts.data, model)),
        "rewrites_applied": [rw.name for rw, _ in ctx.rewrite_configs()],
        # stages a process started and never finished (killed, interrupted), then resumed
        "resumed_after": unfinished_lines(ctx.folder),
        **({"rewrites_auto": summary.auto_rewrites(_read(ctx, steps.PLAN).get("rewrites"))}
           if ctx.opts.auto_rewrites else {}),
    }


def _pixels(data: str, model: Any) -> str | None:
    """How the data made images the input, for the host to repeat: ``quantscope images``'
    note of a ``.npz``, or the chips face data fed (:func:`~quantscope.tasks.verification.face_feed`)."""
    from quantscope.tasks.images import SMALL_SPEC, SPEC
    from quantscope.tasks.registry import is_face_spec
    from quantscope.tasks.verification import face_feed
    from quantscope.zoo.vit import PREPROCESS_NOTE

    if is_face_spec(data):
        return face_feed(data, model).pixels()
    if data in (SPEC, SMALL_SPEC):
        return f"the photos' views, {PREPROCESS_NOTE}"
    return pixels_note(data)


def _measured_shapes(ctx: Context, given: dict[str, list[int]] | None
                     ) -> dict[str, list[int]] | None:
    """The sizes the fit data gave the inputs ``--input-shape`` fixed otherwise (P-Net
    measured on 224 px photos, checked and compiled at 720 x 1280), else None."""
    if not given or ctx.opts.input_shapes_from_data:
        return None
    from quantscope.tasks.sizes import data_shapes

    fit = ctx.data().fit
    fixed, _ = data_shapes(ctx.model(), [*fit.calibration, *fit.evaluation])
    other = {k: list(v) for k, v in fixed if k in given and list(v) != list(given[k])}
    return other or None


def _not_like(results: dict[str, Any], metric: str = "") -> dict[str, str]:
    """Per compared result, its "NOT LIKE FP32" notes, each with the line after it naming
    where (a channel collapsed, a decision lost), when evaluate said so: every one, the
    task's own first (a landmark task's points lost beside a flag's fidelity loss were
    said as the flag's alone). A note's advice to plan by ``--metric M`` is dropped where
    ``metric`` (the run's) is M already."""
    out = {}
    for label in COMPARED:
        notes = [str(n) for n in results.get(label, {}).get("notes", [])]
        said = []
        for at, note in enumerate(notes):
            if not note.startswith("NOT LIKE FP32"):
                continue
            # a task's note names its output and what moved itself: the line after it is
            # another fact (the points' flags, the next output's range), not where
            where = notes[at + 1] if at + 1 < len(notes) and notes[at + 1].startswith(
                "output '") and not note.startswith("NOT LIKE FP32: output '") else ""
            said.append(note.replace(" (below)", "") + (f": {where}" if where else ""))
        if said:  # the fidelity judgement ('... (below)': the line after it) after the task's
            first = [n for n, raw in zip(said, (n for n in notes if n.startswith(
                "NOT LIKE FP32")), strict=True) if not raw.endswith("(below)")]
            text = "; ".join([*first, *(n for n in said if n not in first)])
            out[label] = re.sub(rf" \([^()]*--metric {re.escape(metric)} plans for [^()]*\)",
                                "", text) if metric else text
    return out


def _model_and_data_findings(ctx: Context, data: dict[str, Any]) -> dict[str, Any]:
    """What the analysis found in the model and what was said of it and of the data."""
    return {
        # class outputs read on axis 1 because the graph does not say where the classes are
        "class_axis_by_default": _data_notes(data, AXIS_BY_DEFAULT),
        # an L2-normalised embedding of tensor data: its decisions (verification) unscored
        "embedding_fidelity_only": _data_notes(data, EMBEDDING_MARK),
        # an input of one value on the data (a zero cache, a setting): others clip there
        "constant_inputs": _data_notes(data, stages.open.ONE_VALUE),
        "mixed_scales": _mixed_scales(ctx),
        # a Log reading a linear grid that loses the decades below one step (a spectrogram)
        "log_floors": _mixed_scales(ctx, "log_floor"),
        # a model input (a power spectrum) whose small values the grid reads 0
        "input_floors": _mixed_scales(ctx, "input_floor"),
        # NaN / inf FP32 met inside the graph on the fit data (left out of the ranges)
        "nan_inf_inside": _nonfinite(ctx),
        # what the loader changed to work on the model (a float16 model's float32 form, its
        # Constant weights made initializers): the FP32 reference and what ships are that
        "model_notes": list(ctx.model().notes),
        # every note on the data (fit and held out, once each): how it was read, made
        # (quantscope images) and run (a model that mixes its samples runs one per run)
        "data_notes": _data_notes(data, ""),
    }


def left_float(cov: dict[str, Any] | None) -> list[dict[str, Any]]:
    """What the measured plan left off the grid (its coverage), one row per op type and
    reason: the held-out figure does not include their error (an LSTM's or GRU's weights,
    control flow, a group the plan keeps float)."""
    rows: dict[tuple[str, str, str], int] = {}
    for what, items in (("weight", (cov or {}).get("weights_float") or []),
                        ("op", (cov or {}).get("ops_float") or [])):
        for item in items:
            key = (what, item["op_type"], item["why"])
            rows[key] = rows.get(key, 0) + 1
    return [{"kind": what, "op_type": op, "count": n, "why": why}
            for (what, op, why), n in rows.items()]


def _mixed_scales(ctx: Context, kind: str = "mixed_scale") -> list[str]:
    """The analysis' mixed-scale findings (one grid over tensors of different scales), or
    those of another ``kind`` (``log_floor``)."""
    from quantscope.analyze.report import mixed_scale_lines

    return mixed_scale_lines(_read(ctx, steps.ANALYSIS), kind)


def _nonfinite(ctx: Context) -> list[str]:
    """The calibration's NaN/inf inside the graph, one line (empty when none)."""
    from quantscope.calibrate.collect import nonfinite_note

    note = nonfinite_note(stages.read_stats(ctx.path(steps.STATS)))
    return [note] if note else []


def _whatif(w: dict[str, Any] | None) -> dict[str, Any] | None:
    """With ``--whatif``: the measured gain of lifting each op kind to 16 bit, largest first."""
    if w is None or "skipped" in w:
        return w
    m = w["metric"]
    kinds = sorted(w["kinds"], key=lambda r: -r["gain"])
    h = w.get("headroom") or {}
    return {"metric": m, "plan": w["plan"][m],
            "gains": {r["kind"]: r["gain"] for r in kinds}, "all": w["all"]["gain"],
            "note": w["note"],
            **({"error_needed": h["needed"], "headroom": h["sentence"]}
               if "goal" in h else {})}


def rewrite_notes(ctx: Context) -> dict[str, dict[str, Any] | None]:
    """Per registered rewrite (keys in ``verdict_rank`` order), what every stage (and the
    compiled model) worked on: its registry entry's verdict note and UNVERIFIED text, or
    None when the run did not apply it."""
    out: dict[str, dict[str, Any] | None] = {
        rw.name: None for rw in sorted(REWRITES.values(), key=lambda rw: rw.verdict_rank)}
    for rw, config in ctx.rewrite_configs():
        out[rw.name] = rw.verdict_of(config, ctx.opts.seq_len, steps.REPAIRED)
    return out


def _over(cost: float | None, cap: float | None) -> bool:
    """What ships costs more than ``--max-cost`` (no cap, or no cost: False)."""
    return cap is not None and cost is not None and cost > cap + 1e-12


def _binding(pareto: dict[str, Any], reached: bool | None) -> str | None:
    if reached:
        return None
    goal = pareto.get("goal") or {}
    if goal.get("binding"):
        return goal["binding"]
    if pareto.get("binding"):
        return str(pareto["binding"])
    blockers = pareto.get("blockers") or []
    # groups the search never tried (no gain in the analysis) stay low too: a rule's block
    # alone read as all that binds (BlazePose's segmentation head: ten groups at 8 bit
    # beside 'binds: hailo.maxpool_16bit', whose two MaxPools the analysis valued at 3 pts)
    idle = [str(n) for n in pareto.get("notes") or [] if "no gain in the analysis" in str(n)]
    said = [b["rule"] for b in blockers[:1]]
    return "; ".join(said + idle) or None


def compiler_files(target: Target | str) -> dict[str, str]:
    """File -> what it is for, in the order a user hands them over (each format's purpose
    from the export-format registry; the formats the target's profile takes)."""
    files = {steps.REPAIRED: "the FP32 model to compile (repairs applied; compile this, "
                             "not the original)"}
    for fmt, name in steps.formats(target):
        files[name] = FORMATS[fmt].purpose
    files[FORMATS[ALWAYS].file_name] = FORMATS[ALWAYS].purpose
    return files


def alls_files(ctx: Context) -> list[str]:
    """The Hailo scripts the run wrote: the single plan's, then each compiled length's
    (``deployment.json``), as paths in the run folder."""
    files = [steps.ALLS] if ctx.path(steps.ALLS).is_file() else []
    if ctx.path(steps.DEPLOYMENT).is_file():
        for b in _read(ctx, steps.DEPLOYMENT).get("buckets", []):
            name = f"{Path(b['model']).parent.as_posix()}/{steps.ALLS}"
            if ctx.path(name).is_file():
                files.append(name)
    return files


def export_warnings(ctx: Context) -> list[str]:
    """What the vendor files do not carry, each line led by its file: decisions with no
    layer name (``file: group: … NOT SET: …``), then which files have guessed names, then
    the tensors inside groups the QNN encodings file has no encoding for."""
    lines = script_warnings({n: ctx.path(n).read_text(encoding="utf-8")
                             for n in alls_files(ctx)})
    unencoded = unencoded_line(steps.QNN, qnn_unencoded(ctx))
    return lines + ([unencoded] if unencoded else [])


def qnn_unencoded(ctx: Context) -> list[tuple[str, str]]:
    """(tensor, group) for each tensor inside a group that the run's QNN encodings file has
    no encoding for (none without the file)."""
    if not ctx.path(steps.QNN).is_file():
        return []
    return stages.qnn_unencoded(steps.repaired(ctx)[0])


def format_verdict(v: dict[str, Any]) -> str:
    """The console form: at most ~8 lines a person reads at the end of the run (goal and
    the held-out figure, cost, what binds as measured, files, host steps); the details
    are in verdict.json and the report (:func:`format_verdict_details`)."""
    from quantscope.report.summary import format_short

    return "\n".join(format_short(v))


def format_verdict_details(v: dict[str, Any]) -> str:
    """Every line of the verdict: quality of each configuration, findings, rewrite notes,
    the whatif, the files and the device I/O formulas (the report folds them)."""
    from quantscope.report import fmt
    from quantscope.report.summary import choice_line, format_short, legality_text, ranking_line

    m = v["metric"]
    q = v["quality"]
    lines = format_short(v)[:1]
    if v.get("uniform_meets_goal"):
        lines.append("  the plan is uniform a8_w8: it met the goal on the fit data "
                     "already, so no promotion was bought")
    if v.get("binds_measured"):
        lines.append(f"  binds (measured, held out): {v['binds_measured']['sentence']}")
    if v["binding"]:
        lines.append(f"  the planner's binding (predicted, fit data): {v['binding']}")
    if ranking_line(v):
        lines.append(f"  {ranking_line(v)}")
    if choice_line(v, every=True):
        lines.append(f"  {choice_line(v, every=True)}")
    if v.get("time_budget"):
        lines.append(f"  budget: {v['time_budget']['note']}")
    lines.extend(f"  {line}" for line in v.get("plan_scope") or [])
    lines.append("  quality (" + m + ", output SQNR): " + "; ".join(
        f"{k} {fmt.value(m, r.get(m))}" + ("" if m == "sqnr_db" else
                                           f", {fmt.value('sqnr_db', r.get('sqnr_db'))}")
        for k, r in q.items()))
    for label, note in (v.get("not_like_fp32") or {}).items():
        lines.append(f"  {label}: {note}")
    for key, label in (("mixed_scales", "mixed scales"), ("log_floors", "log of a linear grid"),
                       ("input_floors", "an input read 0 below one step")):
        for line in v.get(key) or []:
            lines.append(f"  {label}: {line}" if not line.startswith("    fix:") else
                         f"  {line.strip()}")
    if v.get("ships") == "deployment":
        lines.append(f"  single plan (repaired.onnx, one model; not what ships): {m} "
                     f"{fmt.value(m, q.get('plan', {}).get(m))} held out, goal "
                     + ("not given" if v["plan_reached"] is None else
                        "reached" if v["plan_reached"] else "not reached"))
    lines.append(f"  plan cost {fmt.cost(v.get('plan_cost', v['cost']))} uniform a8_w8; repairs: "
                 f"{', '.join(v['repairs']) or 'none'}; legality: " + legality_text(v, "FAILS "))
    for name in REWRITES:  # in the order the run applied them
        if v.get(name):
            lines.append(f"  {name}: {v[name]['note']}")
    lines += [f"  {line}" for line in (v.get("rewrites_auto") or {}).get("lines", [])]
    w = v.get("whatif")
    if w and "skipped" in w:
        lines.append(f"  whatif: not measured: {w['skipped']}")
    elif w:
        wm = w["metric"]
        lines.append(f"  whatif ({wm} gained by lifting one op kind to a16_w16; "
                     "measured held out, legality and cost aside): "
                     + ", ".join(f"{k} {fmt.gain(wm, g)}" for k, g in w["gains"].items())
                     + f"; all at once {fmt.gain(wm, w['all'])}")
        if w.get("headroom"):
            lines.append(f"  headroom: {w['headroom']}")
    lines.append(f"  evaluation: {v['evaluation']}")
    lines.append("  hand to the compiler:")
    lines += [f"    {f}: {why}" for f, why in v["compiler_files"].items()]
    lines += [f"    warning: {w}" for w in v["export_warnings"]]
    lines.append("  feed / read the device (io.json, io_snippet.py):")
    for r in v["io"]:
        arrow = (f"q = clip(round(x / {r['scale']:.6g}) + {r['zero_point']}, {r['q_min']}, "
                 f"{r['q_max']})" if r["role"] == "input" else
                 f"x = (q - {r['zero_point']}) * {r['scale']:.6g}")
        lines.append(f"    {r['role']} {r['tensor']}: {r['stored_type']} "
                     f"({r['q_min']}..{r['q_max']}); {arrow}")
    lines += [f"    {f['role']} {f['tensor']}: float (the plan leaves it unquantized: no "
              "scale or zero point)" for f in v.get("io_float") or []]
    lines += [f"    {a['role']} {a['tensor']}: {a['dtype']}, as it is (not quantized: no scale "
              "or zero point)" for a in v.get("io_as_is") or []]
    if not v["io"] and not v.get("io_float") and not v.get("io_as_is"):
        lines.append("    no quantized input or output (they stay float)")
    lines.append(f"  note: {v['io_note']}")
    lines += [f"  host: {step}" for step in v.get("host_steps") or []]
    lines += [f"  {x}" for x in (v.get("deployment") or {}).get("lines", [])]
    return "\n".join(lines)


def run_report(ctx: Context) -> None:
    """Write ``verdict.json`` and the self-contained ``report.html``."""
    from quantscope.report import run_report_html

    v = verdict(ctx)
    stages.write_json(ctx.path(steps.VERDICT), v)
    docs = {n: _read(ctx, f) for n, f in (("evaluate", steps.EVALUATE), ("plan", steps.PLAN),
                                          ("analysis", steps.ANALYSIS), ("check", steps.CHECK),
                                          ("repaired_plan", steps.REPAIRED_PLAN))}
    if ctx.path(steps.LENGTHS).is_file():
        docs["lengths"] = _read(ctx, steps.LENGTHS)
    stats = stages.read_stats(ctx.path(steps.STATS))
    title = f"quantscope run: {ctx.opts.model} on {ctx.opts.target}"
    stages.write_text(ctx.path(steps.REPORT), run_report_html(
        title, verdict_text=format_verdict(v), details_text=format_verdict_details(v),
        verdict=v, stats=stats, **docs))


def report(ctx: Context) -> steps.Done:
    """The run's last step: the verdict and the report (here, not in ``steps``, so that
    ``steps`` never imports this module: it imports ``steps`` for the file names)."""
    run_report(ctx)
    return steps.Done((steps.VERDICT, steps.REPORT))
