"""The verdict and the host's steps of a decoder LLM's ``run`` (:mod:`.decoder`), as data
and as text: the figures measured held out, the goal judged on ``--metric`` with its
standard error, each phase's cost, the a8_w4 variant, and what the host does."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantscope.analyze.prefix import after_text, prefix_words
from quantscope.plan.accepted import META as ACCEPTED
from quantscope.plan.accepted import accepted_lines
from quantscope.report import fmt
from quantscope.report.summary import unset_line
from quantscope.types import Plan


@dataclass(frozen=True)
class Metric:
    phase: str  # the figure's row in lm_quality's result
    key: str
    higher: bool  # higher is better
    words: str


# --metric for a decoder: the figure the goal is about
METRICS: dict[str, Metric] = {
    "ppl_ratio": Metric("prefill", "ppl_ratio", False, "prefill perplexity ratio to FP32"),
    "top1_agreement": Metric("prefill", "top1_agreement", True,
                             "prefill next-token top-1 agreement with FP32"),
    "decode_top1": Metric("decode_emu_kv", "top1_agreement", True,
                          "decode top-1 agreement with FP32 on the emulated KV cache"),
    "greedy_agreement": Metric("greedy", "greedy_agreement", True,
                               "greedy tokens matching FP32's (matched prefix)"),
}
DEFAULT_METRIC = "ppl_ratio"
WHATIF_FIGURES = ("ppl_ratio", "top1_agreement", "decode_top1")  # --whatif: no greedy prompts


def goal_margin(metric: str, value: float, goal: float) -> float:
    """How far ``value`` of ``metric`` is past ``goal`` (>= 0: reached), in its unit."""
    return (value - goal) if METRICS[metric].higher else (goal - value)


def _fig(name: str, f: dict[str, Any]) -> str:
    """A figure ± its standard error in its unit (shares in percent, :mod:`~quantscope.
    report.fmt`)."""
    return fmt.with_se(name, f["value"], f["se"])


def _goal_value(metric: str, goal: float) -> str:
    """The goal in the unit of its metric (``90.0 %``; a perplexity ratio as given)."""
    return fmt.value(metric, goal) if fmt.is_share(metric) else f"{goal:g}"


def candidates_doc(out: Any) -> dict[str, Any]:
    """Every candidate of the plan stage (``out``: a :class:`quantscope.stages_llm.
    PhasePlan`): its 16-bit groups, cost and errors per phase, the rules that block it
    (a warning's marked, :func:`quantscope.report.phase_plan.blocking_rules`), whether it
    was kept, and the kept ones' figures on the ranking amounts."""
    from quantscope.report.phase_plan import blocking_rules

    rows = []
    for c in out.candidates:
        q = out.quality["plans"].get(c.label)
        rows.append({"label": c.label, "default": c.plan.default.value,
                     "overrides": len(c.plan.overrides),
                     "costs": {k.phase: k.cost for k in c.checks},
                     "errors": {k.phase: k.errors for k in c.checks},
                     "rules": blocking_rules(c.checks),
                     "kept": c.kept(out.max_cost),
                     "figures": {k: v for k, v in q.items() if k != "time"} if q else None})
    return {"chosen": out.chosen.label, "max_cost": out.max_cost,
            "setup": out.quality["setup"], "candidates": rows,
            **({"accepted_warnings": list(out.accepted)} if out.accepted else {})}


def _goal_fig(metric: str, f: dict[str, Any]) -> str:
    return fmt.with_se(metric, f["value"], f["se"], bracket=True)


def decoder_verdict(opts: Any, plan_doc: dict[str, Any], evaluation: dict[str, Any],
                    rewrites: dict[str, Any], w4_doc: dict[str, Any] | None = None,
                    finetune_doc: dict[str, Any] | None = None) -> dict[str, Any]:
    """The figures the evaluate stage measured (``opts``: the run's :class:`.decoder.
    DecoderOptions`), or the fine-tune's when it was kept (``finetune_doc``: what ships),
    the goal judged on ``opts.metric`` (with its standard error: reached, missed, or
    within the noise), each phase's cost."""
    meta = dict(plan_doc.get("meta") or {})
    results = json.loads(meta.get("phase_results", "{}"))
    tuned = bool(finetune_doc and finetune_doc.get("kept"))
    res = finetune_doc["figures"] if finetune_doc and tuned else evaluation["plans"]["plan"]
    figures = {}
    for name, m in METRICS.items():
        row = res[m.phase]
        figures[name] = {"value": row[m.key], "se": row.get(f"{m.key}_se", 0.0),
                         "words": m.words}
    costs = {p: c["cost"] for p, c in results.get("checks", {}).items()}
    errors = sum(c["errors"] for c in results.get("checks", {}).values())
    out: dict[str, Any] = {
        "kind": "decoder", "model": opts.model, "target": opts.target, "metric": opts.metric,
        "goal": opts.goal, "max_cost": opts.max_cost, "rewrites": rewrites.get("rewrites", []),
        # --rewrites search: its trials (decoder_search.Search.to_dict); None: not searched
        "rewrite_search": rewrites.get("search"),
        "candidate": meta.get("candidate"), "costs": costs, "errors": errors,
        # --allow-warning: each accepted rule, its reason and the groups it lets through
        **({"accepted_warnings": json.loads(meta[ACCEPTED])} if meta.get(ACCEPTED) else {}),
        **_counts(plan_doc, json.loads(meta.get("phase_overrides") or "{}")),
        "prefix": json.loads(meta["kv_prefix"]) if meta.get("kv_prefix") else None,
        "figures": figures, "data": evaluation["data"], "setup": evaluation["setup"],
        **({"greedy_reading": _reading(res["greedy"])} if "greedy_stepwise" in res["greedy"]
           else {}),
        "ranked_by": "onnxruntime (the plan stage, on " + _amounts(json.loads(
            meta.get("lm_setup") or "{}")) + ")",
        "measured_by": "onnxruntime", "seconds": evaluation.get("seconds")}
    if opts.goal is not None:
        f = figures[opts.metric]
        margin = goal_margin(opts.metric, f["value"], opts.goal)
        met = margin >= 0
        within = abs(margin) <= 2 * f["se"]
        out["goal_met"] = met
        out["goal_text"] = (
            f"{'reached' if met else 'missed'}: {opts.metric} {_goal_fig(opts.metric, f)} "
            f"against the goal {_goal_value(opts.metric, opts.goal)}"
            + (" (within 2 standard errors: not decided by this amount of text)" if within
               else ""))
    out["w4"] = _w4_summary(w4_doc or {"asked": False})
    out["finetune"] = _finetune_summary(finetune_doc or {"asked": False})
    if tuned:
        out["measured_by"] = "onnxruntime (the fine-tuned graphs against the original FP32)"
    over = {p: c for p, c in costs.items() if c > opts.max_cost + 1e-9}
    out["cost_text"] = ", ".join(f"{p} {c:.2f}x" for p, c in costs.items()) + (
        f" (over the cap {opts.max_cost:g}x: {', '.join(over)})" if over
        else f" (within {opts.max_cost:g}x)")
    return out


def _finetune_summary(doc: dict[str, Any]) -> dict[str, Any]:
    """``finetune.json`` for the verdict: asked, kept, why, and the training in brief."""
    if not doc.get("asked"):
        return {"asked": False}
    t = doc["training"]
    return {"asked": True, "kept": doc["kept"], "why": doc["why"], "steps": t["steps"],
            "seconds": t["seconds"], "windows": t["windows"], "trained_by": doc["trained_by"],
            "chosen_on": doc["chosen_on"]}


def finetune_lines(f: dict[str, Any]) -> list[str]:
    """The verdict's lines on the fine-tune (none when it was not asked)."""
    if not f.get("asked"):
        return []
    return [f"  fine-tune: {f['steps']} steps on {f['windows']} training windows in "
            f"{f['seconds']:.0f} s by {f['trained_by']}; "
            + ("kept: the figures above are the fine-tuned graphs'" if f["kept"]
               else "not kept: the figures above are the untuned plan's"),
            f"    {f['why']} (chosen on {f['chosen_on']})"]


def whatif_summary(doc: dict[str, Any], opts: Any) -> dict[str, Any]:
    """``whatif.json`` for the verdict, with which variants reach ``--goal`` on
    ``--metric`` (a whatif figure) and which of those ship (legal on both phases within
    the cap)."""
    if not doc.get("variants"):
        return {"asked": False}
    out = {**doc, "reach": None}
    if opts.goal is not None and opts.metric in WHATIF_FIGURES:
        hit = [r for r in doc["variants"]
               if goal_margin(opts.metric, r["figures"][opts.metric]["value"], opts.goal) >= 0]
        out["reach"] = {"metric": opts.metric, "goal": opts.goal,
                        "reach": [r["label"] for r in hit],
                        "ship": [r["label"] for r in hit if r["ships"]]}
    return out


def _scripted_lines(w: dict[str, Any], goal: float | None, metric: str) -> list[str]:
    """The plan as its phase scripts carry it (``as-scripted``, measured by every run whose
    scripts leave a decision NOT SET), beside the plan on the same windows."""
    rows = {r["label"]: r for r in w.get("variants", [])}
    if "as-scripted" not in rows:
        return []
    got, plan, s = rows["as-scripted"], rows["plan"], w["setup"]
    n = sum(got["changed"].values())
    figs = ", ".join(f"{k} {_fig(k, got['figures'][k])} "
                     f"(plan {fmt.fixed(k, plan['figures'][k]['value'])})" for k in got["figures"])
    out = [f"  as the phase scripts are written ({n} groups NOT SET: precision to the plan's "
           f"default, range to the compiler's min/max; {s['evaluation']} windows, "
           f"{s['evaluation'] * s['steps']} decode steps): {figs}"]
    if goal is not None and metric in got["figures"]:
        f = got["figures"][metric]
        margin = goal_margin(metric, f["value"], goal)
        out.append(f"    the goal as scripted: {'reached' if margin >= 0 else 'MISSED'} "
                   f"({metric} {_fig(metric, f)}"
                   + ("; within 2 standard errors: not decided by this amount of text"
                      if abs(margin) <= 2 * f["se"] else "")
                   + "); the figures above assume those decisions are applied: give "
                   "--phase-hn or set them by hand")
    return out


def _whatif_lines(w: dict[str, Any]) -> list[str]:
    """The verdict's whatif table: per variant its figures (± standard error) and whether
    it ships (legal on both phases within the cap), then who reaches the goal."""
    if not w.get("asked"):
        return []
    s = w["setup"]
    lines = [f"  whatif (--whatif, {s['evaluation']} windows, {s['evaluation'] * s['steps']} "
             "decode steps; each variant checked, not required to pass; ± one standard error):"]
    for r in w["variants"]:
        figs = "  ".join(f"{k} {_fig(k, f)}" for k, f in r["figures"].items())
        cost = fmt.phase_costs(r["costs"])
        status = ("ships" if r["ships"] else f"illegal ({', '.join(r['rules'])})" if r["rules"]
                  else f"over {w['max_cost']:g}x")
        lines.append(f"    {r['label']:<23} {figs}  {status}, cost {cost}")
    lines.append("    (" + "; ".join(f"{r['label']}: {r['what']}" for r in w["variants"][1:]) + ")")
    reach = w.get("reach")
    if reach:
        ship = reach["ship"]
        said = fmt.goal(reach["metric"], reach["goal"], METRICS[reach["metric"]].higher)
        lines.append(f"    goal {said}: "
                     + ("reached by no variant" if not reach["reach"] else
                        f"reached by {', '.join(reach['reach'])}; "
                        + (f"of them {', '.join(ship)} ship{'s' if len(ship) == 1 else ''} "
                           "(legal on both phases within the cap)" if ship
                           else "none of them is legal on both phases within the cap")))
    return lines


def _reading(g: dict[str, float]) -> dict[str, Any]:
    """FP32's reading of the plan's greedy tokens (:class:`quantscope.tasks.lm.Greedy`):
    the share it picks itself after the same tokens, their perplexity ratio, each ± SE."""
    return {k: {"value": g[k], "se": g.get(f"{k}_se", 0.0)}
            for k in ("greedy_stepwise", "greedy_ppl_ratio")}


def reading_line(r: dict[str, Any]) -> str:
    """The verdict's line on FP32's reading of the greedy tokens."""
    step, ratio = r["greedy_stepwise"], r["greedy_ppl_ratio"]
    return (f"read by FP32, the plan's greedy tokens are its own next pick at "
            f"{fmt.with_se('greedy_stepwise', step['value'], step['se'])} of steps, at "
            f"{ratio['value']:.3f}x (± {ratio['se']:.3f}) the perplexity of FP32's own greedy "
            "tokens (the matched prefix ends at the first step that differs)")


def _w4_summary(doc: dict[str, Any]) -> dict[str, Any]:
    """The a8_w4 variant's checks and figures (``w4.json``) for the verdict."""
    if not doc.get("asked"):
        return {"asked": False}
    out = {"asked": True, "layers": doc["layers"], "measured": doc["measured"],
           "checks": doc["checks"]}
    if doc["measured"]:
        q = doc["quality"]
        out["figures"] = {name: {"value": q[m.phase][m.key],
                                 "se": q[m.phase].get(f"{m.key}_se", 0.0)}
                          for name, m in METRICS.items()}
        out["gptq"] = doc["gptq"]["effect"]
    return out


def _amounts(s: dict[str, Any]) -> str:
    """An :class:`~quantscope.stages_llm.LmSetup`'s amounts of text, in words."""
    if not s:
        return "?"
    steps = s["steps"] * (s.get("decode_windows") or s["evaluation"])
    return (f"{s['evaluation']} windows of {s['seq_len']} tokens, {s['prompts']} prompts x "
            f"{s['new_tokens']} greedy tokens, {steps} decode steps")


def _counts(plan_doc: dict[str, Any], own: dict[str, dict[str, str]]) -> dict[str, Any]:
    """Groups above the default: shared (``overrides``, with the units a prefill split
    names per phase, ``split`` of them) and per phase only (``phase_only``)."""
    from quantscope.plan.phase_search import unit_of

    per = {p: {unit_of(n) for n in g} for p, g in own.items()}
    both = set.intersection(*per.values()) if len(per) > 1 else set()
    shared = sum(1 for v in (plan_doc.get("groups") or {}).values()
                 if v != plan_doc.get("default"))
    return {"overrides": shared + len(both), "split": len(both),
            "phase_only": {p: len(u - both) for p, u in per.items() if u - both}}


def format_decoder_verdict(v: dict[str, Any]) -> str:
    s = v["setup"]
    lines = [f"verdict: {v['model']} on {v['target']} (decoder: prefill and decode graphs)",
             f"  plan: {v['candidate']} ({v['overrides']} groups at 16 bit"
             + (f", {v['split']} of them in token chunks in prefill" if v.get("split") else "")
             + "".join(f", {n} more in {p} only" for p, n in (v.get("phase_only") or {}).items())
             + "), cost "
             f"{v['cost_text']}, {v['errors']} legality error(s) on the two phases",
             *(f"    {line}" for line in accepted_lines(v.get("accepted_warnings") or [])),
             "  rewrites: " + (", ".join(v["rewrites"]) or "none")
             + (" (chosen by --rewrites search)" if v.get("rewrite_search") else "")]
    if v.get("rewrite_search"):
        lines += search_lines(v["rewrite_search"])
    p = v["prefix"]
    lines.append("  KV prefix: " + (f"tokens {p['tokens']} ({prefix_words(p)}) in FP32 in "
                                    "the cache" if p else "none"))
    if p and after_text(p):
        lines.append(f"    {after_text(p)}")
    lines.append(f"  measured held out on {v['data']}: {_amounts(s)}:")
    for name, f in v["figures"].items():
        lines.append(f"    {name:<17} {fmt.fixed(name, f['value']):>8} "
                     f"(± {fmt.spread(name, f['se'])})  {f['words']}")
    if v.get("greedy_reading"):
        lines.append(f"    {reading_line(v['greedy_reading'])}")
    if v.get("goal_text"):
        lines.append(f"  goal: {v['goal_text']}")
        if v.get("goal_met") is False and not (v.get("whatif") or {}).get("asked"):
            lines.append("    what would reach it: rerun with --whatif (the plan with each "
                         "class lifted, each checked against the target; the other stages "
                         "are kept)")
    lines += _scripted_lines(v.get("whatif") or {}, v.get("goal"), v["metric"])
    lines += finetune_lines(v.get("finetune") or {"asked": False})
    lines += _w4_lines(v.get("w4") or {"asked": False})
    lines += _whatif_lines(v.get("whatif") or {"asked": False})
    unset = unset_line(v.get("export_warnings") or [], fix=(
        "give each phase's parsed HN (--phase-hn prefill=P.hn --phase-hn decode=D.hn) or "
        "set them by hand"))
    if unset:  # the compiler files do not carry these decisions
        lines.append(f"  {unset}")
    lines += _unencoded_lines(v)  # ... nor the QNN files these tensors' encodings
    lines.append(f"  ranked by {v['ranked_by']}; measured by {v['measured_by']}")
    return "\n".join(lines)


def phase_export_warnings(folder: Path, alls: Sequence[str]) -> dict[str, Any]:
    """The verdict's ``export_warnings`` of a decoder run (``folder``: the run folder;
    ``alls``: its per-phase Hailo scripts): what the scripts do not carry, then per phase
    the tensors inside groups that its QNN encodings file has no encoding for (one line
    each, as the encoder run's), and those tensors as ``qnn_unencoded`` rows."""
    import onnx

    from quantscope.export.formats import FORMATS
    from quantscope.export.hailo_alls import script_warnings
    from quantscope.export.qnn_encodings import unencoded_line
    from quantscope.model.load import Model
    from quantscope.stages import qnn_unencoded

    lines = script_warnings({n: (folder / n).read_text(encoding="utf-8") for n in alls
                             if (folder / n).is_file()}, hn_option="--phase-hn")
    rows: list[dict[str, str]] = []
    for phase in ("prefill", "decode"):
        name = f"{phase}/{FORMATS['qnn'].file_name}"
        if not (folder / name).is_file():
            continue
        graph = folder / phase / "model.onnx"  # the graph the file was written for
        tensors = qnn_unencoded(Model(proto=onnx.load(str(graph), load_external_data=False),
                                      source=str(graph)))
        lines += [ln for ln in (unencoded_line(name, tensors),) if ln]
        rows += [{"phase": phase, "tensor": t, "group": g} for t, g in tensors]
    return {"export_warnings": lines, "qnn_unencoded": rows}


def _unencoded_lines(v: dict[str, Any]) -> list[str]:
    """The verdict's ``export_warnings`` lines about the QNN encodings files."""
    from quantscope.export.formats import FORMATS

    qnn = FORMATS["qnn"].file_name
    return [f"  warning: {w}" for w in v.get("export_warnings") or []
            if w.split(": ", 1)[0].endswith(f"/{qnn}")]


def search_lines(search: dict[str, Any]) -> list[str]:
    """``--rewrites search``'s trials (:mod:`.decoder_search`) as the verdict's lines."""
    lines = [f"  rewrites searched (backward from the recipe; {search['metric']} of the "
             f"plan chosen per trial, measured by {search['measured_by']} on "
             f"{search['measured_on']}):"]
    for t in search["trials"]:
        f = t["figure"]
        fig = (f"{fmt.fixed(search['metric'], f['value'])} "
               f"(± {fmt.spread(search['metric'], f['se'])}), cost " + " / ".join(
            f"{p} {c:.2f}x" for p, c in f["costs"].items()) if f else "not planned")
        lines.append(f"    {', '.join(t['steps']) or 'no step':<26} {fig}"
                     + ("  <- kept" if t["kept"] else ""))
    lines += [f"    {step}: {why}" for step, why in search["decisions"].items()]
    return lines


def _w4_lines(w: dict[str, Any]) -> list[str]:
    if not w["asked"]:
        return ["  a8_w4 weights: not asked (--w4 off)"]
    c = w["checks"]
    head = (f"  the same plan with its {w['layers']} a8_w8 weighted layers at a8_w4 (GPTQ): "
            f"cost prefill {c['w4.prefill']['cost']:.2f}x, decode {c['w4.decode']['cost']:.2f}x; "
            f"decode weights {c['w4.decode']['weight_mb']:.4g} MB "
            f"(8-bit weights: {c['w8.decode']['weight_mb']:.4g} MB)")
    if not w["measured"]:
        rules = sorted({r for k, x in c.items() if k.startswith("w4.") for r in x["rules"]})
        return [head, "    not legal on the target (" + (", ".join(rules) or "no layer to "
                                                          "take") + "): not measured"]
    return [head, "    measured: " + ", ".join(
        f"{name} {fmt.fixed(name, f['value'])} (± {fmt.spread(name, f['se'])})"
        for name, f in w["figures"].items())]


def _first_sink_lines(after: dict[str, Any] | None) -> list[str]:
    """Host step 2's warning: the tokens that become a second sink as a prompt's first."""
    if not after or not after["first_sinks"]:
        return []
    sinks = ", ".join(repr(t) for _, t, _ in after["first_sinks"])
    worst = max(r for _, _, r in after["first_sinks"])
    seen = (f"the calibration saw {after['over']} window(s) with such an outlier and sized "
            "the residual grids for it (coarser for every prompt)" if after["over"] else
            "the calibration saw none, so such a token's values are clipped")
    return [f"   A prompt that begins with one of {sinks} makes that token a second sink "
            f"(up to {worst:.0f}x the median position), run through the quantized graph: "
            f"{seen}. Where the application allows, start prompts with another token "
            "(e.g. strip leading newlines and punctuation)."]


def host_doc(plan: Plan, decode: Path, io: dict[str, Any], *, tokenizer: str,
             files: tuple[str, str], seq: int) -> dict[str, Any]:
    """``host.json``: the tokenizer file, the KV prefix ``plan`` records (its ``files``: the
    prefix's ``.npz`` and loader), the KV cache's layout as the exported ``decode`` graph
    reads it (its weights not loaded; a V cache rotated by vrotate said), the prefill graph's
    ``seq`` prompt tokens, and each phase's quantized I/O ``io``."""
    import onnx

    from quantscope.export import device_io as dio
    from quantscope.repair.rotate_heads import METADATA_KEY as VALUES_KEY
    from quantscope.repair.rotate_heads import ROTATED_VALUES

    prefix = json.loads(dict(plan.meta).get("kv_prefix") or "null")
    (prefix or {}).get("after", {}).pop("profile", None)  # the report's, not the host's
    proto = onnx.load(str(decode), load_external_data=False)
    cache = [{"name": i.name, "shape": [d.dim_param or d.dim_value
                                        for d in i.type.tensor_type.shape.dim],
              "dtype": onnx.helper.tensor_dtype_to_np_dtype(
                  i.type.tensor_type.elem_type).name}
             for i in proto.graph.input if i.name.startswith("past.")]
    rotated = any(p.key == VALUES_KEY for p in proto.metadata_props)  # vrotate (R2)
    del proto
    n = len(prefix["tokens"]) if prefix else 0
    return {
        "tokenizer": tokenizer,
        "prefix": ({**{k: prefix[k] for k in ("tokens", "text", "decoded", "why") if k in prefix},
                    "file": files[0], "loader": files[1],
                    **({"after": after} if (after := prefix.get("after")) else {})}
                   if prefix else None),
        "kv_cache": {"inputs": cache, "prefix_slots": n, "first_prompt_position": n,
                     "compiled_prompt_tokens": seq,
                     "layout": "past.{i}.key / past.{i}.value [batch, kv_heads, positions, "
                               "head_dim] per layer; the decode graph returns present.{i}.* "
                               "with one position more: feed them back as past.{i}.*"
                               + (ROTATED_VALUES if rotated else "")},
        "io": io, "io_note": dio.PROVENANCE}


def host_text(doc: dict[str, Any]) -> str:
    kv = doc["kv_cache"]
    lines = ["# Host steps for the deployed decoder (quantscope run)", "",
             f"1. Tokenize with `{doc['tokenizer']}` (the model's own tokenizer; do not add "
             "special tokens the prefix already holds)."]
    p = doc["prefix"]
    if p:
        lines.append(f"2. Load the constant KV prefix: `{p['loader']}` reads `{p['file']}` "
                     f"(tokens {p['tokens']}: {prefix_words(p)}) into cache slots "
                     f"0..{kv['prefix_slots'] - 1}. "
                     "These tokens are never run on the device: their FP32 keys and values "
                     "are the cache's first positions, quantized on the way in as every "
                     "past.* input is (the decode graph's input transform below).")
        lines += _first_sink_lines(p.get("after"))
    else:
        lines.append("2. No KV prefix: the prompt starts at cache position 0.")
    lines += [f"3. Prompt positions start at {kv['first_prompt_position']}; the prefill graph "
              f"was compiled for {kv['compiled_prompt_tokens']} prompt tokens; decode then "
              "runs one token per call.",
              f"4. KV cache: {kv['layout']}. Inputs of the decode graph:"]
    lines += [f"   - `{c['name']}` {c['shape']} {c['dtype']}" for c in kv["inputs"]]
    lines.append("5. Quantized inputs and outputs per phase (scale, zero point: "
                 "prefill/io_snippet.py, decode/io_snippet.py):")
    for phase, rows in doc["io"].items():
        for r in rows:
            lines.append(f"   - {phase} {r['role']} `{r['tensor']}`: {r['stored_type']}, scale "
                         f"{r['scale']:.8g}, zero point {r['zero_point']} (real range "
                         f"{r['min']:.6g} .. {r['max']:.6g})")
    lines.append(f"\n{doc['io_note']}")
    return "\n".join(lines) + "\n"


__all__ = ["DEFAULT_METRIC", "METRICS", "Metric", "decoder_verdict", "format_decoder_verdict",
           "host_doc", "host_text", "phase_export_warnings", "search_lines"]
