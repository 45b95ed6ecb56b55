"""The verdict's short form: what was measured held out, what binds as measured, what the
host must do. Plain dicts in (the run folder's files), plain dicts and lines out.

=================  ===============================================================
held_out           the held-out figure's sample size and what a sample is
binds_measured     with ``--whatif``: the op kind whose lift to a16_w16 gains the
                   most on the held-out data; the rule that refuses that lift (from
                   the planner's skipped promotions) is named only as the reason it
                   cannot be lifted
host_steps         what runs on the host: the text prefixes, the lookups the target
                   leaves to the host (the io rows' ``host_lookup``: one fact,
                   ``model/host_gather.py``) and the integer inputs fed as they are,
                   per-token outputs pooled and normalised, symbolic dims fixed
deployment         the compiled lengths (``lengths.json``): how many compiled models,
                   the held-out figure, the cost per query and per document, the
                   standard error of the mean cost, the cap and the margin it was
                   chosen with; switching is not modelled
headline           what ships and its held-out figure and cost: the deployment when
                   one was measured, else the single plan (``format_short`` leads with
                   it; the single plan's figure is then a detail line)
auto_rewrites      with ``--rewrites auto``: what was tried and kept, measured on the
                   fit data (one short phrase, a line per rewrite, the report's rows)
=================  ===============================================================
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from quantscope.export.hailo_alls import UNSET_DECISION, one_line
from quantscope.plan.accepted import accepted_lines
from quantscope.report import fmt
from quantscope.report.host_steps import host_steps as host_steps  # re-exported
from quantscope.tasks.shares import ITEM_WORDS, clusters_key, items_key
from quantscope.tasks.shares import judged_samples as share_judged
from quantscope.units import of, one_per_sample

KIND_NAMES = {"weighted": "weighted layers (Linear/Conv)",
              "matmul": "activation MatMuls (attention scores and context)",
              "softmax": "Softmax", "normalization": "normalisation layers"}


def kind_name(kind: str) -> str:
    return KIND_NAMES.get(kind, kind)


def task_kind(task: Any) -> str:
    """``retrieval`` of ``retrieval:stdlib-docs`` (a task's name is ``kind:source``)."""
    return str(task or "").split(":", 1)[0]


def sample_size(v: dict[str, Any]) -> str:
    """``n=16 held-out pairs`` (the held-out figures' sample size), or ``held out``; a
    share over items its task counts apart from the samples (detection F1: the
    detections) adds the plan's count: ``n=16 held-out samples, 167 detections of either
    model (a matched pair once)``; a share per position (a token classifier's) the
    effective count of its positions: ``n=16 held-out samples, an effective 150
    positions``; any other share over more or fewer items than samples, its items."""
    ho = v.get("held_out") or {}
    held = ho.get("held", True)  # False: data that cannot be split, evaluated on the fit
    m = v.get("metric", "")
    plan = (v.get("quality") or {}).get("plan") or {}
    unit = ('held-out ' if held else 'fit ') + ho.get('unit', 'samples')
    judged = judged_samples(v)
    n = (f"n={judged} of {of(ho['samples'], unit)} judged" if judged is not None else
         f"n={of(ho['samples'], unit)}" if ho.get("samples") else
         "held out" if held else "the fit data")
    if not held:
        n += ", NOT held out"
    items = plan.get(items_key(m))
    words = ITEM_WORDS.get(m.split(":")[0])
    if not isinstance(items, int | float) or not words or items != items or judged == 0:
        return n
    # a detection share's items are detections, which the samples do not tell; a share
    # per position counts positions as an effective count (clustered by sample)
    if clusters_key(m) in plan and not one_per_sample(m, plan):
        # a landmark task's items are its points, verify's decisions
        named = words.startswith("point") or words in ("decisions", "voiced frames", "frames")
        n += f", an effective {int(items)} {words if named else 'positions'}"
    elif "detections" in words or int(items) != ho.get("samples"):
        n += f", {int(items)} {words}"
    return n


def judged_samples(v: dict[str, Any]) -> int | None:
    """How many of the held-out samples the headline share judged, where fewer than all
    (None: all, or not counted; 0: none, the figure has no value): the plan's
    :func:`quantscope.tasks.shares.judged_samples`. The binomial noise counts the same
    items (``KEY_items``, the judged points)."""
    return share_judged(v.get("metric", ""), (v.get("quality") or {}).get("plan") or {},
                        (v.get("held_out") or {}).get("samples"))


def held_out(ev: dict[str, Any]) -> dict[str, Any]:
    """The held-out evaluation: its sample count and what one sample is (a retrieval
    pair is two texts, its query and its document)."""
    part = ev["data"].get("held_out") or {}
    rows = part.get("evaluation_samples")
    held = bool(ev["data"].get("is_held_out", True))  # an older evaluate.json: its split said
    if task_kind(part.get("task")) == "retrieval" and isinstance(rows, int):
        return {"samples": rows // 2, "unit": "pairs", "rows": rows, "source": part.get("name"),
                "held": held}
    return {"samples": rows, "unit": "samples", "rows": rows, "source": part.get("name"),
            "held": held}


def _fell(iv: dict[str, Any] | None) -> bool:
    """A tiebreak interval whose upper bound is below minus its margin: worse beyond noise."""
    return bool(iv) and iv.get("upper") is not None and \
        iv["upper"] < -float(iv.get("margin", 0.0))  # type: ignore[index]


def auto_rewrites(record: dict[str, Any] | None) -> dict[str, Any]:
    """``plan.json``'s ``rewrites`` record (what ``--rewrites auto`` tried and kept) as a
    short phrase for the verdict's cost line, a line per rewrite (details) and the
    report's table rows; every figure is the fit data's, with its sample size."""
    if not record:
        return {"short": "auto: no record", "lines": [], "rows": []}
    m, total = record["metric"], of(record.get("n"), record.get("unit", "fit samples"))
    # the samples the figure was computed on: of a gated share, those it judged
    n = f"n={total}" if record.get("judged") is None else f"n={record['judged']} of {total} judged"
    tried = list(dict.fromkeys(t["name"] for t in record["trials"] if t["tried"]))
    kept = list(dict.fromkeys(t["name"] for t in record["trials"] if t["kept"]))
    fixed = [r["name"] for r in record.get("repairs", []) if r.get("applied")]
    # dropped where neither figure could separate it from the model without it
    ties = list(dict.fromkeys(t["name"] for t in record["trials"]
                              if (t.get("tiebreak_interval") or {}).get("outcome") == "tie"
                              and (t.get("interval") or {}).get("outcome", "tie") == "tie"))
    # dropped as worse on the headline while the tiebreak rose beyond its noise (h31)
    split = list(dict.fromkeys(t["name"] for t in record["trials"] if not t["kept"]
                               and (t.get("interval") or {}).get("outcome") == "worse"
                               and (t.get("tiebreak_interval") or {}).get("outcome") == "better"))
    # ... and better on the headline while the tiebreak fell beyond its noise: not kept
    fell = list(dict.fromkeys(t["name"] for t in record["trials"] if not t["kept"]
                              and (t.get("interval") or {}).get("outcome") == "better"
                              and _fell(t.get("tiebreak_interval"))))
    named = record.get("tiebreak") or "the tiebreak"
    short = ((f"auto: kept {len(kept)} of {len(tried)} tried, {m} on {n}" if tried else
              "auto: none tried, nothing measured")
             + (f"; a tie on both figures, left out: {', '.join(ties)}" if ties else "")
             + (f"; dropped on {m} while {named} rose "
                f"beyond noise (the figures disagree): {', '.join(split)}" if split else "")
             + (f"; dropped though {m} rose: {named} fell beyond noise (the figures "
                f"disagree): {', '.join(fell)}" if fell else "")
             + (f"; applied for legality: {', '.join(fixed)}" if fixed else ""))
    rows, lines = [], [f"rewrites (auto; {m} of {record.get('measured_on', '')}, {n}; "
                       f"without rewrites {fmt.value(m, record.get('baseline'))}, kept "
                       f"{fmt.value(m, record.get('final'))}):"]
    for t in record["trials"]:
        word = "kept" if t["kept"] else "dropped" if t["tried"] else "not tried"
        delta = (fmt.gain(m, t["after"] - t["before"])
                 if t.get("after") is not None and t.get("before") is not None else "")
        iv = t.get("interval")
        if iv and delta:  # the paired interval over per-sample scores (fit data)
            delta += (f", {'tie within noise' if iv['outcome'] == 'tie' else iv['outcome']}"
                      f": {iv['confidence']:.0%} bounds {fmt.gain(m, iv['lower'])} .. "
                      f"{fmt.gain(m, iv['upper'])}")
        name = t["name"] + (" (round 2)" if t.get("round", 1) > 1 else "")
        rows.append({"rewrite": name, "decision": word,
                     "without": fmt.value(m, t.get("before")) if t["tried"] else "",
                     "with": fmt.value(m, t.get("after")) if t.get("after") is not None else "",
                     "change": delta, "why": t["reason"]})
        lines.append(f"  {name}: {word}" + (f" ({delta}, {n})" if delta else "")
                     + f": {t['reason']}")
    lines += [f"  repair {r['name']}: {'applied' if r.get('applied') else 'not applied'} "
              f"before planning: {r['reason']}" for r in record.get("repairs", [])]
    return {"short": short, "lines": lines, "rows": rows}


def binds_measured(whatif: dict[str, Any] | None, pareto: dict[str, Any],
                   group_kinds: dict[str, str]) -> dict[str, Any] | None:
    """The op kind the whatif measured to cost the most (largest gain when lifted), the
    other kinds' gains, and the rule (if any) that refused promoting that kind's groups."""
    if not whatif or "skipped" in whatif or not whatif.get("kinds"):
        return None
    m = whatif["metric"]
    kinds = sorted(whatif["kinds"], key=lambda r: -r["gain"])
    top = kinds[0]
    if not top["gain"] > 0:
        return {"metric": m, "kind": None, "gain": top["gain"], "rule": None,
                "sentence": f"no single op kind gains when lifted to a16_w16 (best: "
                            f"{kind_name(top['kind'])} {fmt.gain(m, top['gain'])})"}
    rules: Counter[str] = Counter()
    for s in pareto.get("skipped") or []:
        if group_kinds.get(s["group"]) == top["kind"] and s.get("severity", "error") == "error":
            rules.update(s.get("rules") or [])
    rule = rules.most_common(1)[0][0] if rules else None
    others = ", ".join(f"{kind_name(r['kind'])} {fmt.gain(m, r['gain'])}" for r in kinds[1:3])
    if rule == "max_cost":
        why = "the cost cap (--max-cost) keeps them at 8 bit"
    elif rule:
        why = f"{rule} refuses lifting them"
    else:
        why = "no rule refuses lifting them (the planner's prediction kept them low)"
    return {"metric": m, "kind": top["kind"], "gain": top["gain"], "rule": rule,
            "sentence": f"{kind_name(top['kind'])} cost the most: "
                        f"{fmt.gain(m, top['gain'])} if lifted to a16_w16"
                        + (f" ({others})" if others else "") + f"; {why}"}


def _worse_than_uniform(v: dict[str, Any]) -> str:
    """Said when the plan measures worse than uniform a8_w8 on the held-out data (the plan
    was chosen on the fit data; the held-out figure disagrees)."""
    m = v["metric"]
    plan = fmt.num(v["quality"].get("plan", {}).get(m))
    uni = fmt.num(v["quality"].get("a8_w8", {}).get(m))
    if plan is None or uni is None or v.get("uniform_meets_goal"):
        return ""
    if plan < uni if v.get("higher_is_better", True) else plan > uni:
        inside = v.get("saturated_inside") or []
        why = "" if not inside else (
            f"; {len(inside)} tensor(s) clip held-out values at their calibrated ranges "
            "(worst: " + ", ".join(f"{r['tensor']} {r['share']:.2%}" for r in inside[:3])
            + "; verdict.json saturated_inside): the fit data do not cover the held-out "
            "range, and promotion does not widen a range")
        worse = v.get("worse_held_out")  # with its noise, and what to do (pipeline.held_out)
        if worse:
            return f"{worse['line']}{why}"
        return (f"held out, the plan is {fmt.gain(m, plan - uni)} against uniform a8_w8 "
                f"(chosen on the fit data){why}")
    return ""


def ranking_line(v: dict[str, Any]) -> str | None:
    """Which engine ranked the plan search and which measured (with both figures of the
    chosen plan, fit data, when they differ in engine); None for older verdicts."""
    r = v.get("ranking")
    if not r:
        return None
    m = v["metric"]  # the search's metric is the headline's (ctx.metric)
    figures = (f": chosen plan {fmt.value(m, r['measured'])} in {r['measured_by']}, "
               f"{fmt.value(m, r['ranked'])} ranked by {r['ranked_by']} (fit data)"
               if r.get("ranked") is not None else "")
    return f"search: {r['line']}{figures}"


def choice_line(v: dict[str, Any], *, every: bool = False) -> str | None:
    """How the search chose among its measured plans without a quality goal, where the
    noise of the figure decided (``plan.json`` ``pareto.choice``); ``every``: also when
    there was no noise estimate (the report's details). None: nothing to say."""
    c = v.get("choice")
    if not c or (c.get("noise") is None and not every):
        return None
    return f"chosen (fit data): {c['line']}"


def deployment(doc: dict[str, Any] | None, metric: str) -> dict[str, Any] | None:
    """The compiled lengths of the run (``lengths.json``) for the verdict: None where the
    data has no token counts or ``--lengths off``; one line of reason where no
    deployment was measured; else its figures and two lines."""
    if not doc or not doc.get("considered"):
        return None
    d = doc.get("deployment")
    if not d:
        return {"models": 1, "measured": False, "lines": [f"compiled lengths: {doc['reason']}"]}
    held = d["held_out"]
    lens = d["seq_lens"]
    folders = ", ".join(f"len-{n}/" for n in lens)
    n = len(held["buckets"])
    legal = "legal at each length" if held["legal"] else "NOT legal at every length"
    head = (f"deployment: one compiled model at {lens[0]} tokens ({folders} deployment.json): "
            "as good as several compiled lengths on the fit texts" if d["kept_one"] else
            f"deployment: {n} compiled models at {', '.join(map(str, lens))} tokens ({folders} "
            "deployment.json; chosen on the fit texts, measured held out)")
    texts = sum(b["texts"] for b in held["buckets"])
    per = "" if d["cost_per_query"] is None else (
        f"cost per query {fmt.cost(d['cost_per_query'])}, per document "
        f"{fmt.cost(d['cost_per_document'])}, ")
    margin = d.get("cost_margin")
    cap = margin["cap"] if margin else None
    against = "" if cap is None else (
        f", within --max-cost {cap:g}" if d["cost_mean"] <= cap + 1e-12 else
        f", OVER --max-cost {cap:g} by {fmt.cost(d['cost_mean'] - cap)}")
    figures = (f"{metric} {fmt.value(metric, held['metrics'].get(metric))} held out "
               f"({texts} texts); {per}mean {fmt.cost(d['cost_mean'])} (standard error "
               f"{fmt.cost(d['cost_mean_se'])}) x uniform a8_w8 at {lens[-1]}, held out"
               f"{against}; {legal}; {d['switching']}")
    lines = [head, figures, f"why: {d['reason']}"]
    if margin:
        lines.append(f"cost margin: {margin['sentence']}")
    return {"models": n, "measured": True, "seq_lens": lens, "kept_one": d["kept_one"],
            "metric": metric, "value": held["metrics"].get(metric), "texts": texts,
            "cost_per_query": d["cost_per_query"], "cost_per_document": d["cost_per_document"],
            "cost_mean": d["cost_mean"], "cost_mean_se": d["cost_mean_se"],
            "max_cost": cap, "cost_margin": margin,
            "legal": held["legal"], "switching": d["switching"], "lines": lines,
            **_deployment_scripted(doc.get("as_scripted"), metric)}


def _deployment_scripted(sc: dict[str, Any] | None, metric: str) -> dict[str, Any]:
    """``lengths.json``'s deployment as its scripts carry it (pipeline/deploy.py): the
    decisions NOT SET per script and the held-out figure ({} when none is)."""
    if not sc:
        return {}
    return {"as_scripted": {"files": {f: len(g) for f, g in sc["groups"].items()},
                            "decisions": sum(len(g) for g in sc["groups"].values()),
                            "value": sc["metrics"].get(metric)}}


def headline(v: dict[str, Any]) -> dict[str, Any]:
    """What ships and its held-out figures: the deployment of compiled lengths when the
    run measured one (what ``deployment.json`` and the ``len-N/`` folders hold), else the
    single plan (``repaired.onnx``); ``n`` is the held-out sample size."""
    m = v["metric"]
    ho = v.get("held_out") or {}
    dep = v.get("deployment") or {}
    base = {"metric": m, "held_out": ho.get("held", True), "n": ho.get("samples"),
            "unit": ho.get("unit", "samples"),
            # the samples the headline judged, where fewer than n (a where= gate's)
            **({"judged": k} if (k := judged_samples(v)) is not None else {})}
    if dep.get("measured") and dep.get("value") is not None:
        return {**base, "ships": "deployment", "value": dep["value"],
                "cost": dep["cost_mean"], "cost_se": dep["cost_mean_se"],
                "models": dep["models"], "seq_lens": dep["seq_lens"],
                "legal": dep["legal"], "texts": dep.get("texts")}
    return {**base, "ships": "plan", "value": (v["quality"].get("plan") or {}).get(m),
            "cost": v.get("plan_cost", v.get("cost")), "cost_se": None, "models": 1,
            "legal": v["legal"]}


def _what_ships(v: dict[str, Any], h: dict[str, Any], dep: dict[str, Any] | None) -> str:
    """The verdict's first line after the figure: the deployment's compiled models and mean
    cost; the single plan says nothing more unless it costs more than --max-cost (a cap
    no plan meets: the cheapest ships), which both say here."""
    if dep is None:
        return (f" at cost {fmt.cost(h['cost'])}, OVER --max-cost {v['max_cost']:g}"
                if v.get("over_max_cost") else "")
    return (f" with {dep['models']} compiled model{'s' if dep['models'] > 1 else ''} "
            f"({', '.join(map(str, dep['seq_lens']))} tokens) at mean cost "
            f"{fmt.cost(dep['cost_mean'])} held out (standard error "
            f"{fmt.cost(dep['cost_mean_se'])})"
            + ("" if dep.get("max_cost") is None or dep["cost_mean"] <= dep["max_cost"] + 1e-12
               else f", OVER --max-cost {dep['max_cost']:g}"))


def format_short(v: dict[str, Any]) -> list[str]:
    """About 8 lines (and one per rewrite applied and host step): goal and the held-out figure of
    what ships (the deployment when one was measured, else the plan), its cost, the
    single plan's figure as a detail, what binds, files, host steps (each line one thing a
    person acts on; each one line, whatever the model's names hold)."""
    m = v["metric"]
    q = v["quality"]
    n = sample_size(v)
    h = v.get("headline") or headline(v)
    dep = v.get("deployment") if h["ships"] == "deployment" else None
    got = fmt.against(m, h["value"], v["goal"])  # 49.96 dB, not 50.0 dB, under a 50 dB goal
    if h.get("judged") == 0:  # no held-out sample judged: no figure, not a share of nothing
        got = "no figure"
    refs = "; ".join(f"{k} {fmt.value(m, r.get(m))}" for k, r in q.items() if k != "plan")
    what = _what_ships(v, h, dep)
    if v["goal"] is None:
        head = f"verdict: no --goal given; {m} {got} ({n}; {refs}){what}"
    else:
        reached = v["reached"] if "headline" in v else _reaches(v, h["value"])
        word = "REACHED" if reached else "NOT reached"
        said = fmt.goal(m, v["goal"], v.get("higher_is_better", True))
        on = "held-out data" if h.get("held_out", True) else "fit data"
        head = (f"verdict: goal {said} {word} on the {on}: "
                f"{got} ({n}; {refs}){what}")
    lines = [head]
    if dep is not None:
        lines += [f"  {dep['lines'][0]}", f"    {dep['lines'][1]}"]
    lines.append(_plan_line(v, n, shipped=dep is None))
    worse = _worse_than_uniform(v)
    if worse:
        lines[-1] += f"; {worse}"
    if ranking_line(v):
        lines.append(f"  {ranking_line(v)}")
    if choice_line(v):
        lines.append(f"  {choice_line(v)}")
    applied = [k for k in v.get("rewrites_applied", []) if k]
    # the compiled model is not the original: each rewrite's note (and caveat) is kept
    lines += [f"  {k}: {v[k]['note']}" for k in applied if isinstance(v.get(k), dict)]
    # the model worked on is the loader's form of the given one (float16 widened …)
    lines += [f"  note: {note}" for note in v.get("model_notes") or []]
    lines += [f"  note: resumed: {line}" for line in v.get("resumed_after") or []]
    if v.get("left_float"):  # the figure above does not include their error
        lines.append("  left float: " + "; ".join(
            f"{r['count']} {r['op_type']} {r['kind']}{'s' if r['count'] > 1 else ''}: "
            f"{r['why']}" for r in v["left_float"]))
    lines += _outputs_lines(v)
    if (v.get("not_like_fp32") or {}).get("plan"):
        lines.append(f"  plan: {v['not_like_fp32']['plan']}")
    lines += [f"  warning: {note}" for note in _warnings(v)]
    lines += [f"  {line}" for line in accepted_lines(v.get("accepted_warnings") or [])]
    bm = v.get("binds_measured") if not v.get("reached") else None
    if bm:
        lines.append(f"  binds (measured, held out): {bm['sentence']}")
    elif v.get("binding") and not v.get("reached"):
        lines.append(f"  binds: {v['binding']}")
    tb = v.get("time_budget")
    if tb:  # the search stopped on --budget: the plan is the best measured so far
        lines.append(f"  budget: {tb['note']}")
    lines.append(_compile_line(v, dep))
    unset = unset_line(v.get("export_warnings", []),
                       {"model.alls": "the single plan"} if dep is not None else {})
    if unset:  # the vendor file does not carry these decisions: the compile would not either
        lines.append(f"  {unset}")
    lines += _unencoded_lines(v)
    lines += _as_scripted_lines(v, h, dep)
    # every host step: each is one thing the deployment must do (the first three only
    # left the pooling out where text prefixes came first: h31, e5 with its prefixes)
    for step in v.get("host_steps", []):
        lines.append(f"  host: {step}")
    lines.append("  details: verdict.json, report.html")
    return [one_line(ln) for ln in lines]  # a name's newline never breaks a verdict line


def _as_scripted_lines(v: dict[str, Any], h: dict[str, Any], dep: dict[str, Any] | None
                       ) -> list[str]:
    """What the single plan measures as its vendor script is written (the goal: where it
    ships), and what ships, as its compiled lengths' scripts are written."""
    m, lines = v["metric"], []
    sc = v.get("as_scripted")
    if sc:
        lines.append(_scripted_line(m, f"the single plan as {sc['script']} is written",
                                    sc["decisions"], "", sc["value"], sc["plan"],
                                    None if dep is not None else sc.get("reached")))
    dsc = (dep or {}).get("as_scripted")
    if dsc:
        lines.append(_scripted_line(
            m, "the deployment as its scripts are written", dsc["decisions"],
            f" in {', '.join(dsc['files'])}", dsc["value"], h["value"],
            None if v["goal"] is None or dsc["value"] is None else _reaches(v, dsc["value"])))
    return lines


def _outputs_lines(v: dict[str, Any]) -> list[str]:
    """Whose figure the headline is when several outputs have it (each one's given), the
    points judged only where another output's score passes (``where=``): how many, each
    output's worst channel and the axis it is of where that is the headline, and the
    distances in pixels of the photo (``photo=PX``)."""
    return ([f"  outputs (plan, held out): {v['outputs_headline']}"]
            if v.get("outputs_headline") else []) + [
        f"  judged (plan, held out): {n}" for n in v.get("gated") or []] + [
        f"  channels (plan, held out): {n}" for n in v.get("channels_read") or []] + [
        f"  photo (plan, held out): {n}" for n in v.get("on_photo") or []
        if not v.get("outputs_headline")]  # which gives each output's photo figures


def _warnings(v: dict[str, Any]) -> list[str]:
    """The verdict's warnings: figures that say little, outputs no task scores (with their
    figures), a class axis taken by default, an embedding judged by fidelity alone,
    saturated outputs, NaN/inf inside, log floors
    (each with its fix)."""
    floors = (v.get("log_floors") or []) + (v.get("input_floors") or [])
    return ((v.get("operators") or []) + (v.get("says_little") or [])
            + (v.get("channels_left_out") or []) + (v.get("unscored") or [])
            + (v.get("unscored_figures") or []) + (v.get("class_axis_by_default") or [])
            + (v.get("embedding_fidelity_only") or []) + (v.get("constant_inputs") or [])
            + (v.get("saturated_outputs") or []) + (v.get("nan_inf_inside") or [])
            + [f"{line} ({fix.strip()})" for line, fix in
               zip(floors[::2], floors[1::2], strict=False)])


def _unencoded_lines(v: dict[str, Any]) -> list[str]:
    """The tensors the QNN converter encodes by itself (outside the emulated figures)."""
    unencoded = v.get("qnn_unencoded") or []
    return [f"  note: {len(unencoded)} tensor(s) inside groups have no QNN encoding (the "
            "converter picks its own for those it does not fuse; the emulated figures do "
            "not cover them): qnn_unencoded in verdict.json"] if unencoded else []


HN_FIX = "give the parsed HN (--hn) or set them by hand"


def legality_text(v: dict[str, Any], failed: str = "") -> str:
    """``all 9 rules pass``, or ``8 of 9 rules pass, R accepted by --allow-warning`` where
    a warning the user accepted warns on the plan (accepted, not passing); an illegal plan
    ``failed`` and its failed rules; then :func:`warned_text`."""
    accepted = v.get("rules_accepted") or []
    n = v["rules_checked"]
    if not v["legal"]:
        text = failed + ", ".join(v["rules_failed"])
    elif accepted:
        text = f"{n - len(accepted)} of {n} rules pass, {', '.join(accepted)} {fmt.ACCEPTED}"
    else:
        text = f"all {n} rules pass"
    return text + warned_text(v)


def warned_text(v: dict[str, Any]) -> str:
    """The rules that warn on the plan (a warning rule does not make it illegal, and is
    said): ``" (warns: rule (N groups), …; check.json)"``; empty when none."""
    warned = v.get("rules_warned") or []
    return f" (warns: {', '.join(warned)}; check.json)" if warned else ""


def unset_line(warnings: list[str], roles: dict[str, str] | None = None, *,
               listed: str = "the list is in verdict.json", fix: str = HN_FIX) -> str | None:
    """One line for the decisions the compiler files do not carry (the ``NOT SET`` lines of
    a verdict's ``export_warnings``, each led by its file): how many, in which file
    (``roles``: what a file is, e.g. the single plan), and which op kinds lack a layer
    name; ``listed``: where the user finds them, ``fix``: what to do; None when there are
    none."""
    unset = [(w, found[-1]) for w in warnings if (found := list(UNSET_DECISION.finditer(w)))]
    if not unset:
        return None
    files: Counter[str] = Counter()
    ops = {m["op"] for _, m in unset if m["op"]}
    for w, _ in unset:
        head = w.split(": ", 1)[0]
        if head.endswith(".alls"):
            files[head] += 1
    where = ", ".join(f"{f}{' (' + roles[f] + ')' if roles and f in roles else ''}: {n}"
                      for f, n in files.items())
    kinds = (f"no Hailo layer name is known for {', '.join(sorted(ops))} layers"
             if ops else "no vendor layer name is known for them")
    return (f"warning: {len(unset)} plan decision(s) NOT SET in the compiler file"
            + (f"s ({where})" if len(files) > 1 else f" ({where})" if files else "")
            + f": {kinds}, so the compiler would not apply them; {fix} ({listed})")


def _scripted_line(m: str, what: str, decisions: int, where: str, value: Any, against: Any,
                   reached: bool | None) -> str:
    """A figure measured as the Hailo scripts are written (the groups they leave NOT SET in
    the compiler's hands), beside the figure as planned; the goal judged on it if given."""
    return (f"    {what} ({decisions} groups NOT SET{where}: precision to the default, range "
            f"to the compiler's min/max): {fmt.value(m, value)} held out against its "
            f"{fmt.value(m, against)}" + ("" if reached is None else
                                          f"; the goal as scripted: "
                                          f"{'reached' if reached else 'MISSED'}"))


def _reaches(v: dict[str, Any], value: Any) -> bool:
    """The goal judged on ``value`` (a verdict.json written before ``headline`` judged
    the plan: what ships may be a deployment)."""
    x = fmt.num(value)
    if x is None:
        return False
    return x >= v["goal"] if v.get("higher_is_better", True) else x <= v["goal"]


def _plan_line(v: dict[str, Any], n: str, *, shipped: bool) -> str:
    """The single plan (``repaired.onnx``): its cost, legality, repairs and rewrites; when
    a deployment ships, also its own held-out figure (a detail, not the headline)."""
    m = v["metric"]
    legal = "legal: " + legality_text(v) if v["legal"] else legality_text(v, "NOT legal: ")
    applied = [k for k in v.get("rewrites_applied", []) if k]
    cost = fmt.cost(v.get("plan_cost", v.get("cost")))
    lead = (f"  cost {cost} uniform a8_w8" if shipped else
            f"  single plan (repaired.onnx, one model): "
            f"{fmt.value(m, (v['quality'].get('plan') or {}).get(m))} ({n}) at {cost}")
    return (f"{lead}; {legal}; repairs: {', '.join(v['repairs']) or 'none'}; rewrites: "
            f"{', '.join(applied) or 'none'}"
            + (f" ({v['rewrites_auto']['short']})" if v.get("rewrites_auto") else "")
            + ("; the plan is uniform a8_w8 (met the goal on the fit data)"
               if v.get("uniform_meets_goal") else ""))


def _compile_line(v: dict[str, Any], dep: dict[str, Any] | None) -> str:
    """The files to hand to the compiler: each ``len-N/`` folder's model and the target's
    formats when a deployment ships, else the single plan's; the device I/O."""
    files = list(v["compiler_files"])
    as_is = [a for a in v.get("io_as_is") or [] if a["role"] == "output"]  # inputs: host steps
    io = "; device I/O (io_snippet.py): " + ", ".join(
        [f"{r['role']} {r['tensor']} {r['stored_type']} ({r['q_min']}..{r['q_max']})"
         for r in v.get("io") or []]
        + [f"{f['role']} {f['tensor']} float (unquantized)" for f in v.get("io_float") or []]
        + [f"output {a['tensor']} {a['dtype']} as it is (not quantized)"
           for a in as_is]
    ) if v.get("io") or v.get("io_float") or as_is else ""
    if dep is None:
        return ("  compile: " + " + ".join(files[:-1])
                + f" ({files[-1]} is what was emulated){io}")
    each = " + ".join(["model.onnx", *files[1:-1]])
    return (f"  compile: in each of {', '.join(f'len-{s}/' for s in dep['seq_lens'])}: {each} "
            f"(deployment.json lists them; io_snippet.py route_text picks one per text){io}")
