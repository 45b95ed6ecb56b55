"""The report of ``quantscope run``: one self-contained HTML file, in the order a person asks.

verdict · configurations (task metrics, every output) · per-layer noise · sensitivity ·
outliers · legality (every rule) · Pareto front · the plan against uniform a8_w8 ·
coverage · data provenance · host I/O. Inputs are the run folder's files as dicts (and
the statistics, for the per-channel ranges).
"""

from __future__ import annotations

import html
from typing import Any

from quantscope.report import plots
from quantscope.report.build import _table, io_section, prenorm_section, render
from quantscope.types import Stats

_e = html.escape


def run_report_html(title: str, *, verdict_text: str, verdict: dict[str, Any],
                    evaluate: dict[str, Any], plan: dict[str, Any], analysis: dict[str, Any],
                    check: dict[str, Any], repaired_plan: dict[str, Any],
                    stats: Stats | None = None) -> str:
    metric = verdict["metric"]
    sections = [
        verdict_section(verdict, verdict_text),
        configs_section(evaluate["results"], metric),
        prenorm_section(evaluate["results"]),
        noise_section(analysis),
        sensitivity_section(analysis),
        outliers_section(analysis, stats),
        legality_section(check),
        pareto_section(plan.get("pareto") or {}, metric),
        whatif_section(evaluate.get("whatif")),
        plan_diff_section(repaired_plan),
        coverage_section(evaluate["results"]),
        data_section(evaluate["data"]),
        io_section(verdict["io"]) + _io_bounds(verdict),
    ]
    return render(title, [s for s in sections if s])


def _h2(text: str, anchor: str) -> str:
    return f'<h2 id="{anchor}">{_e(text)}</h2>'


def verdict_section(v: dict[str, Any], text: str) -> str:
    if v["reached"] is None:
        badge, color = "no goal given", "#777"
    else:
        badge, color = ("goal reached", "#2e7d32") if v["reached"] else ("goal NOT reached",
                                                                         "#c62828")
    files = _table(["file", "what it is for"], [[f, why] for f, why in v["compiler_files"].items()])
    files += "".join(f"<p class=note>warning: {_e(w)}</p>" for w in v.get("export_warnings", []))
    return (_h2("Verdict", "verdict")
            + f'<p><span style="background:{color};color:#fff;padding:2px 8px;border-radius:3px">'
            + f"{_e(badge)}</span></p><pre>{_e(text)}</pre>"
            + "<h3>Hand these to the compiler</h3>" + files)


def configs_section(results: dict[str, dict[str, Any]], metric: str) -> str:
    keys = list(dict.fromkeys(k for r in results.values() for k, v in r["metrics"].items()
                              if plots.num(v) is not None))
    head = [metric, *[k for k in keys if k != metric]]
    rows = [[label, *[r["metrics"].get(k, "") for k in head]] for label, r in results.items()]
    out = [_h2("Configurations (held-out data)", "configs"),
           "<p>FP32, uniform a8_w8 and the plan (on the repaired model), each against the "
           "FP32 outputs of the original model.</p>", _table(["config", *head], rows),
           plots.config_plot(results, metric)]
    per_output = [[label, name, *[t.get(k, "") for k in ("sqnr_db", "cosine_mean",
                                                          "cosine_min")]]
                  for label, r in results.items() for name, t in r.get("outputs", {}).items()
                  if "sqnr_db" in t]
    if per_output:
        out.append("<h3>Every output</h3>" + _table(
            ["config", "output", "sqnr_db", "cosine_mean", "cosine_min"], per_output))
    notes = sorted({n for r in results.values() for n in r.get("notes", [])})
    out += [f"<p class=note>{_e(n)}</p>" for n in notes]
    return "".join(out)


def noise_section(a: dict[str, Any]) -> str:
    noise = a.get("noise") or []
    return (_h2("Per-layer noise", "noise")
            + f"<p>Output SQNR of every quantized tensor at {_e(str(a.get('low')))}: "
            "<i>isolated</i> with only that tensor quantized, <i>accumulated</i> with "
            "everything up to it quantized. Where the accumulated line falls while the "
            "isolated one stays high, noise is building up, not created there.</p>"
            + (plots.noise_plot(noise) or "<p>no tensor noise recorded</p>"))


def sensitivity_section(a: dict[str, Any]) -> str:
    method = a.get("method", {})
    rows = method.get("rows_per_sweep", {})
    primary = str(a.get("primary", "sqnr_db"))
    sens = a.get("sensitivity") or []
    metric = "sqnr_db" if any("sqnr_db" in r["disable_one"] for r in sens) else primary
    sizes = (f"enable-one measured on {rows.get('enable_one', '?')} rows, disable-one on "
             f"{rows.get('disable_one', '?')} rows, of {method.get('rows', '?')} "
             f"(sweep: {method.get('sweep', '?')}, row budget {method.get('proxy_fraction')})")
    table = _table(["group", "op", f"enable-one {metric}", f"disable-one {metric}"],
                   [[r["group"], r["op_type"], plots.num(r["enable_one"].get(metric)),
                     plots.num(r["disable_one"].get(metric))] for r in sens[:30]])
    return (_h2("Sensitivity ranking", "sensitivity")
            + f"<p>Row sample sizes: {_e(sizes)}. Disable-one: everything at "
            f"{_e(str(a.get('low')))} except this group at {_e(str(a.get('high')))} (higher "
            "= promoting it helps more); enable-one: only this group quantized.</p>"
            + plots.sensitivity_plot(sens, metric) + table)


def outliers_section(a: dict[str, Any], stats: Stats | None, top: int = 3) -> str:
    found = sorted(a.get("outliers") or [], key=lambda o: -(plots.num(o.get("ratio")) or 0))
    out = [_h2("Outliers", "outliers")]
    if found:
        out.append(_table(["tensor", "group", "max/median", "bits lost", "channels", "reason"],
                          [[o["tensor"], o.get("group") or "", plots.num(o["ratio"]),
                            plots.num(o["bits_lost"]), ", ".join(map(str, o["channels"][:12])),
                            o["reason"]] for o in found]))
    worst = [(o["tensor"], list(o["channels"])) for o in found if o["kind"] == "channels"]
    if stats is not None and len(worst) < top:
        worst += _widest(stats, {t for t, _ in worst}, top - len(worst))
    for tensor, channels in worst[:top]:
        ts = stats.tensors.get(tensor) if stats is not None else None
        if ts is not None:
            out.append(plots.outlier_plot(tensor, ts.channel_absmax, channels))
    if not found:
        out.append("<p>No channel dominates any tensor (max/median below the analysis' "
                   "threshold); the widest tensors are shown.</p>")
    return "".join(out)


def _widest(stats: Stats, skip: set[str], n: int) -> list[tuple[str, list[int]]]:
    """The tensors whose largest channel is furthest above their median channel."""
    import numpy as np

    scored = []
    for name, ts in stats.tensors.items():
        a = np.asarray(ts.channel_absmax, dtype=np.float64).ravel()
        if name in skip or a.size < 4 or not np.median(a) > 0:
            continue
        scored.append((float(a.max() / np.median(a)), name, [int(i) for i in np.argsort(-a)[:3]]))
    return [(name, ch) for _, name, ch in sorted(scored, reverse=True)[:n]]


def legality_section(chk: dict[str, Any]) -> str:
    rows = [["passed" if r["passed"] else f"FAILED ({len(r['groups'])} groups)", r["rule"],
             r["severity"], r["reason"], r["provenance"]] for r in chk["rules"]]
    problems = chk.get("problems") or []
    out = [_h2("Legality", "legality"),
           f"<p>Every rule of {_e(chk['target'])} ({_e(str(chk.get('sdk')))}) checked on the "
           f"final plan{'' if not chk.get('seq_len') else ' at sequence length ' + str(chk['seq_len'])}.</p>",
           _table(["result", "rule", "severity", "what it checks", "provenance"], rows)]
    if problems:
        out.append("<h3>Problems</h3>" + _table(
            ["severity", "rule", "group", "reason", "fix"],
            [[p["severity"], p["rule"], p["group"], p["reason"], p["fix"]] for p in problems]))
    return "".join(out)


def pareto_section(pareto: dict[str, Any], measured: str) -> str:
    if not pareto.get("points"):
        return ""
    pred = str(pareto.get("metric"))
    same = pred == measured or (pred, measured) == ("output_sqnr_db", "sqnr_db")
    unit = ("both in " + measured + " (output SQNR, dB)" if same else
            f"predicted in {pred} (the analysis' additive model), measured in {measured} "
            "(real emulation of each point, right axis)")
    c = pareto.get("chosen", {})
    return (_h2("Pareto front", "pareto")
            + f"<p>Cost against quality for the legal plans on the front; {_e(unit)}. "
            f"Chosen (dotted line): cost {c.get('cost')}, predicted {c.get('predicted')}, "
            f"measured {c.get('measured')}.</p>" + plots.pareto_plot(pareto, measured)
            + _table(["cost", f"predicted {pred}", f"measured {measured}", "promoted",
                      "repairs"],
                     [[p["cost"], p["predicted"], p.get("measured", ""), len(p.get("groups", {})),
                       ", ".join(p.get("repairs", []))] for p in pareto["points"]]))


def whatif_section(w: dict[str, Any] | None) -> str:
    """``run --whatif``: where the final plan's error is, measured per op kind."""
    if not w:
        return ""
    head = _h2("Where the plan's error is (whatif)", "whatif")
    if "skipped" in w:
        return head + f"<p class=note>not measured: {_e(w['skipped'])}</p>"
    m = w["metric"]
    rows = [[f"{r['kind']} at a16_w16", r["groups"], r[m], r["gain"]] for r in w["kinds"]]
    rows.append(["all of them at a16_w16", w["all"]["groups"], w["all"][m], w["all"]["gain"]])
    out = (head + f"<p class=note>{_e(w['note'])}. The plan: {m} {w['plan'][m]:.4g}.</p>"
           + plots.whatif_plot(w)
           + _table(["lifted", "groups", m, "gain"], [["the plan", "", w["plan"][m], 0.0],
                                                      *rows]))
    h = w.get("headroom")
    if h:
        keys = [k for k in h["rows"][0] if k != "scale"]
        out += ("<h3>How far the goal is</h3>"
                + (f"<p><b>{_e(h['sentence'])}</b></p>" if "sentence" in h else "")
                + f"<p class=note>{_e(h['note'])}.</p>"
                + plots.headroom_plot(m, w["plan"][m], h)
                + _table(["the plan's error x", *keys],
                         [[1.0, *(w["plan"].get(k, "") for k in keys)],
                          *([r["scale"], *(r[k] for k in keys)] for r in h["rows"])]))
    return out


def plan_diff_section(final: dict[str, Any]) -> str:
    reasons = final.get("reasons", {})
    changed = [[g, f"{final['default']} → {p}", reasons.get(g, "")]
               for g, p in final.get("groups", {}).items()]
    kept = [[g, "kept " + final["default"], why] for g, why in reasons.items()
            if g not in final.get("groups", {})]
    ranges = [[t, m] for t, m in final.get("ranges", {}).items()]
    repairs = [[r["name"], r.get("skipped") or r.get("reason", ""),
                ", ".join(r.get("changed", [])[:8])] for r in final.get("repairs", [])]
    out = [_h2("The plan against uniform a8_w8", "plan"),
           f"<p>Default {_e(final['default'])}"
           + ("" if final["default"] == "a8_w8" else " (itself a change from a8_w8)")
           + f"; {len(changed)} group(s) set otherwise, with the planner's reason; groups "
           "kept at the default where a promotion was considered say why.</p>"]
    if changed or kept:
        out.append(_table(["group", "precision", "why"], changed + kept))
    if repairs:
        out.append("<h3>Repairs applied</h3>" + _table(["repair", "what it did", "changed"],
                                                        repairs))
    if ranges:
        out.append("<h3>Range methods changed</h3>" + _table(["tensor", "range method"], ranges))
    return "".join(out)


def coverage_section(results: dict[str, dict[str, Any]]) -> str:
    cov = results.get("plan", {}).get("coverage")
    if not cov:
        return ""
    rows = ([["weight", r["tensor"], r["op_type"], r["why"]] for r in cov["weights_float"]]
            + [["op", r["node"], r["op_type"], r["why"]] for r in cov["ops_float"]]
            + [["lookup table", t, "", "activation evaluated in float (a LUT on the NPU)"]
               for t in cov["lookup_tables"]])
    return (_h2("Coverage: what stayed float", "coverage")
            + f"<p>{cov['weights_quantized']} weights and {cov['activations_quantized']} "
            "activations quantized under the plan.</p>"
            + (_table(["kind", "name", "op", "why"], rows) if rows else
               "<p>Nothing left float.</p>"))


def data_section(d: dict[str, Any]) -> str:
    out = [_h2("Data provenance", "data"), f"<p><b>{_e(d['split'])}</b></p>"]
    parts = [("fit (calibration, analysis, plan, repairs)", d["fit"]),
             ("held-out evaluation", d["held_out"])]
    out.append(_table(["part", "source", "calibration samples", "evaluation samples", "task"],
                      [[k, p["name"], p["calibration_samples"], p["evaluation_samples"],
                        p.get("task") or "fidelity only"] for k, p in parts]))
    for k, p in parts:
        out += [f"<p class=note>{_e(k)}: {_e(n)}</p>" for n in p.get("notes", [])]
        if p.get("token_lengths"):
            out.append(plots.length_plot(p["token_lengths"], k))
    return "".join(out)


def _io_bounds(v: dict[str, Any]) -> str:
    rows = [[r["role"], r["tensor"], r["stored_type"], f"{r['q_min']} … {r['q_max']}",
             f"{r['min']:.6g} … {r['max']:.6g}"] for r in v["io"]]
    return ("<h3>Clip bounds</h3>" + _table(["role", "tensor", "stored as", "codes",
                                              "real range"], rows)
            + f"<p class=note>{_e(v['io_note'])}. io_snippet.py has the host functions.</p>"
            if rows else "")
