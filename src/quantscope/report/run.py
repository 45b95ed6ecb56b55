"""The report of ``quantscope run``: one self-contained HTML file, in the order a person asks.

verdict (short, every line folded below) · feeding and reading the device · configurations
(held out, with the sample size) · whatif (held out) · Pareto front (fit data, the chosen
plan marked) · the plan against uniform a8_w8 · legality (failures shown, passes folded) ·
per-layer noise · sensitivity (ranked by effect) · outliers (handled mask ranges folded) ·
coverage · data provenance. Inputs are the run folder's files as dicts (and the statistics,
for the per-channel ranges). Tables wrap long names to fit a 1400 px page; an absent value
is a ``—`` with a legend (:mod:`quantscope.report.fmt` has the one number format).
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Sequence
from typing import Any

from quantscope.report import fmt, plots, summary
from quantscope.report.build import (
    _table,
    details,
    io_section,
    outputs_details,
    prenorm_section,
    render,
)
from quantscope.report.console import race_lines
from quantscope.types import Stats

_e = html.escape
HEADLINE_KEYS = ("recall@1", "recall@1_fp32", "embedding_cosine_mean", "sqnr_db",
                 "sqnr_db_channel_min", "cosine_mean")
"""Shown first in the configurations table (after the run's metric); the rest folded."""
MAIN_ROWS = 6


def run_report_html(title: str, *, verdict_text: str, verdict: dict[str, Any],
                    evaluate: dict[str, Any], plan: dict[str, Any], analysis: dict[str, Any],
                    check: dict[str, Any], repaired_plan: dict[str, Any],
                    stats: Stats | None = None, details_text: str = "",
                    lengths: dict[str, Any] | None = None) -> str:
    """The page, verdict first: ``verdict_text`` is the short verdict, ``details_text``
    every line of it (folded)."""
    metric = verdict["metric"]
    n = _n(verdict)
    on = _on(verdict)
    sections = [
        verdict_section(verdict, verdict_text, details_text),
        io_section(verdict["io"]) + _io_bounds(verdict),
        configs_section(evaluate["results"], metric, n, on),
        lengths_section(lengths),
        rewrites_section(verdict.get("rewrites_auto")),
        prenorm_section(evaluate["results"]),
        whatif_section(evaluate.get("whatif"), n, on),
        pareto_section(plan.get("pareto") or {}, metric, verdict=verdict,
                       repaired_plan=repaired_plan,
                       offer_notes=(plan.get("repair_offer") or {}).get("notes") or ()),
        plan_diff_section(repaired_plan),
        legality_section(check),
        noise_section(analysis),
        sensitivity_section(analysis),
        outliers_section(analysis, stats),
        coverage_section(evaluate["results"]),
        data_section(evaluate["data"]),
    ]
    return render(title, [s for s in sections if s])


def lengths_section(doc: dict[str, Any] | None) -> str:
    """The compiled lengths the run chose (``lengths.json``): the deployment measured on
    the held-out texts and the choice on the fit texts, in their console forms
    (:mod:`quantscope.report.deployment`); the reason alone where none was measured."""
    if not doc or not doc.get("considered"):
        return ""
    from quantscope.plan.deployment_results import DeploymentChoice, RouteResult
    from quantscope.report.deployment import format_choice, format_deployment

    d = doc.get("deployment")
    head = _h2("Compiled lengths", "lengths") + f"<p>{_e(doc['reason'])}</p>"
    if not d:
        return head
    held = format_deployment(RouteResult.from_dict(d["held_out"]))
    fit = "\n\n".join(format_choice(DeploymentChoice.from_dict(d[k]))
                       for k in ("chosen_fit", "one_model_fit"))
    margin = d.get("cost_margin")
    head += f"<p>Cost cap: {_e(margin['sentence'])}.</p>" if margin else ""
    return (head + f"<p>{_e(d['reason'])}; {_e(d['switching'])}.</p>"
            + "<p><b>Held out</b> (the kept deployment, each text on its compiled model; "
            "route it again with <code>quantscope route MODEL --deployment "
            "deployment.json</code>):</p>" + f"<pre>{_e(held)}</pre>"
            + details("Chosen on the fit texts (not held out): the best with several lengths, "
                      "then the best single model", f"<pre>{_e(fit)}</pre>"))


def _h2(text: str, anchor: str) -> str:
    return f'<h2 id="{anchor}">{_e(text)}</h2>'


def _on(v: dict[str, Any]) -> str:
    """What the evaluation's figures are on: the held-out data, or the fit data where the
    data could not be split (the configurations and whatif sections had said "on the
    held-out data (n=6 fit pairs, NOT held out)")."""
    return "held-out data" if (v.get("held_out") or {}).get("held", True) else "fit data"


def _n(v: dict[str, Any]) -> str:
    """The held-out figures' sample size (:func:`summary.sample_size`)."""
    return summary.sample_size(v)


INLINE_WARNINGS = 5  # export warnings shown as they are; the rest folded under one line


def export_warnings_html(warnings: Sequence[str]) -> str:
    """The compiler files' warnings: the first :data:`INLINE_WARNINGS` as notes, the rest
    folded under a line that counts them (a head-split model's script leaves one NOT SET
    line per head and op: 158 on minilm-l6, which buried the compiler files' table)."""
    def note(w: str) -> str:
        return f"<p class=note>warning: {_e(w)}</p>"

    shown, rest = list(warnings[:INLINE_WARNINGS]), list(warnings[INLINE_WARNINGS:])
    return "".join(map(note, shown)) + details(
        f"{len(rest)} more warning{'s' if len(rest) > 1 else ''} ({len(warnings)} in all; "
        "verdict.json lists them)", "".join(map(note, rest)))


def verdict_section(v: dict[str, Any], text: str, details_text: str = "") -> str:
    if v["reached"] is None:
        badge, color = "no goal given", "#777"
    else:
        badge, color = ("goal reached", "#2e7d32") if v["reached"] else ("goal NOT reached",
                                                                         "#c62828")
    files = _table(["file", "what it is for"], [[f, why] for f, why in v["compiler_files"].items()])
    files += export_warnings_html(v.get("export_warnings", []))
    return (_h2("Verdict", "verdict")
            + f'<div class=verdict id="verdict-box"><p><span style="background:{color};'
            f'color:#fff;padding:2px 8px;border-radius:3px">{_e(badge)}</span></p>'
            + f"<pre>{_e(text)}</pre></div>"
            + details("Hand these to the compiler", files, open_=True)
            + details("Every line of the verdict (verdict.json has them all)",
                      f"<pre>{_e(details_text)}</pre>" if details_text else ""))


def configs_section(results: dict[str, dict[str, Any]], metric: str, n: str = "held out",
                    on: str = "held-out data") -> str:
    keys = list(dict.fromkeys(k for r in results.values() for k, v in r["metrics"].items()
                              if plots.num(v) is not None and not fmt.is_count(k)))
    first = [k for k in (metric, *HEADLINE_KEYS) if k in keys or k == metric]
    head = list(dict.fromkeys([*first, *keys]))
    # one row per metric, one column per configuration (a page wide for any metric count)
    rows = [[f"{fmt.label(k)} ({k})" if fmt.label(k) != k else k,
             *[fmt.counted(k, r["metrics"]) for r in results.values()]] for k in head]
    out = [_h2(f"Configurations ({n})", "configs"),
           "<p>FP32, uniform a8_w8 and the plan (on the repaired model), each against the "
           f"FP32 outputs of the original model, on the {on} ({_e(n)}); shares in "
           "percent, SQNR in dB.</p>", _table(["metric", *results], rows[:MAIN_ROWS]),
           details(f"The other {len(rows) - MAIN_ROWS} metrics",
                   _table(["metric", *results], rows[MAIN_ROWS:]) if len(rows) > MAIN_ROWS
                   else ""),
           plots.config_plot(results, metric, on)]
    out.append(outputs_details(results))
    out += [f"<p class=note>{_e(n)}</p>" for n in config_notes(results)]
    return "".join(out)


def config_notes(results: dict[str, dict[str, Any]]) -> list[str]:
    """The configurations' notes: one every configuration has, once; any other after the
    configurations that have it (``a8_w8: NOT LIKE FP32 ...``), in evaluate's order. Each
    row's figures are its own: fp32's row compares FP32 with itself (``distance to FP32's
    mean 0``), and a loss a8_w8 has is not the plan's."""
    has: dict[str, list[str]] = {}
    for label, r in results.items():
        for n in r.get("notes", []):
            has.setdefault(str(n), []).append(label)
    every = [n for n, labels in has.items() if len(set(labels)) == len(results)]
    own = [f"{', '.join(dict.fromkeys(labels))}: {n}" for label in results
           for n, labels in has.items() if labels[0] == label and n not in every]
    return every + own


def rewrites_section(auto: dict[str, Any] | None) -> str:
    """``--rewrites auto``: each rewrite tried, kept or not tried, with its figures (fit
    data) and why."""
    if not auto or not auto.get("rows"):
        return ""
    rows = [[r["rewrite"], r["decision"], r["without"], r["with"], r["change"], r["why"]]
            for r in auto["rows"]]
    return (_h2("Rewrites chosen by the run (auto, fit data)", "rewrites")
            + f"<p>{_e(auto['lines'][0])}</p>"
            + _table(["rewrite", "decision", "without", "with", "change", "why"], rows)
            + "".join(f"<p class=note>{_e(line.strip())}</p>" for line in auto["lines"][1:]
                      if line.strip().startswith("repair ")))


def noise_section(a: dict[str, Any]) -> str:
    noise = a.get("noise") or []
    masked = _masked(a)
    shown = [r["tensor"] for r in noise]
    short = [f"{i}: {n}" for i, n in enumerate(fmt.short_names(shown))]
    hit = [t for t in shown if t in masked]
    why = ("" if not hit else
           f" Not drawn (grey bands): {len(hit)} masked attention-score tensor(s), the "
           "additive attention mask's output. The mask constant (about -3e38) saturates to "
           "the grid's minimum by design, so that tensor's own SQNR reads about 0 dB, yet "
           "a masked token's Softmax weight stays about 0 (exp(-12) or less): the next "
           "tensor shows the real noise.")
    table = _table(["#", "tick label", "tensor", "isolated", "accumulated"],
                   [[i, short[i].split(": ", 1)[1], r["tensor"],
                     "masked" if r["tensor"] in masked else fmt.value("sqnr_db",
                                                                      r.get("sqnr_isolated_db")),
                     "masked" if r["tensor"] in masked else fmt.value(
                         "sqnr_db", r.get("sqnr_cumulative_db"))]
                    for i, r in enumerate(noise)])
    return (_h2("Per-layer noise", "noise")
            + f"<p>Output SQNR of every quantized tensor at {_e(str(a.get('low')))} on the fit "
            "data: <i>isolated</i> with only that tensor quantized, <i>accumulated</i> with "
            "everything up to it quantized. Where the accumulated line falls while the "
            "isolated one stays high, noise is building up, not created there. Tick labels "
            f"are shortened; the table below has every full name.{_e(why)}</p>"
            + (plots.noise_plot(noise, short, masked) or "<p>no tensor noise recorded</p>")
            + details(f"Every tensor's full name and SQNR ({len(noise)} rows)", table
                      if noise else ""))


def _masked(a: dict[str, Any]) -> set[str]:
    """Tensors holding an additive attention-mask constant (the analysis' mask ranges)."""
    return {o["tensor"] for o in a.get("outliers") or [] if o.get("kind") == "mask_range"}


def _by_unit(sens: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per swept candidate: the parts of a split layer swept as one unit
    (``unit``, ``unit_size``: analyze.report.GroupSensitivity) share its figures, shown once
    under the unit's name."""
    out, seen = [], set()
    for r in sens:
        unit = r.get("unit") or ""
        if not unit:
            out.append(r)
        elif unit not in seen:
            seen.add(unit)
            out.append({**r, "group": f"{unit} ({r.get('unit_size', '?')} parts)"})
    return out


def sensitivity_section(a: dict[str, Any], top: int = 10) -> str:
    method = a.get("method", {})
    rows = method.get("rows_per_sweep", {})
    primary = str(a.get("primary", "sqnr_db"))
    sens = _by_unit(a.get("sensitivity") or [])
    metric = "sqnr_db" if any("sqnr_db" in r["disable_one"] for r in sens) else primary
    ranked = sorted(sens, key=lambda r: -plots.rank_value(r["disable_one"].get(metric)))
    sizes = (f"enable-one measured on {rows.get('enable_one', '?')} rows, disable-one on "
             f"{rows.get('disable_one', '?')} rows, of {method.get('rows', '?')} fit rows "
             f"(sweep: {method.get('sweep', '?')}, row budget {method.get('proxy_fraction')})")

    def table(part: list[dict[str, Any]], first: int) -> str:
        return _table(["rank", "group", "op", f"disable-one {fmt.label(metric)}",
                       f"enable-one {fmt.label(metric)}"],
                      [[first + i + 1, r["group"], r["op_type"],
                        fmt.value(metric, plots.num(r["disable_one"].get(metric))),
                        fmt.value(metric, plots.num(r["enable_one"].get(metric)))]
                       for i, r in enumerate(part)])

    return (_h2("Sensitivity ranking", "sensitivity")
            + f"<p>Groups ranked by effect: disable-one (everything at "
            f"{_e(str(a.get('low')))} except this group at {_e(str(a.get('high')))}; higher "
            "= promoting it helps more), largest first; enable-one: only this group "
            f"quantized. Row sample sizes: {_e(sizes)}.</p>"
            + plots.sensitivity_plot(sens, metric, top=15) + table(ranked[:top], 0)
            + details(f"The other {len(ranked) - top} groups", table(ranked[top:], top)
                      if len(ranked) > top else ""))


# analyze's findings of a range, not of channels: their ratio is no channel's max/median
GRID_FINDINGS = {"mixed_scale": "mixed scales", "log_floor": "log of a linear grid",
                 "input_floor": "an input read 0 below one step"}


def outliers_section(a: dict[str, Any], stats: Stats | None, top: int = 3) -> str:
    found = sorted(a.get("outliers") or [], key=lambda o: -(plots.num(o.get("ratio")) or 0))
    masks = [o for o in found if o.get("kind") == "mask_range"]
    grids = [o for o in found if o.get("kind") in GRID_FINDINGS]
    chans = [o for o in found if o.get("kind") not in ("mask_range", *GRID_FINDINGS)]
    out = [_h2("Outliers", "outliers")]
    if grids:  # not channels: a range one grid cannot hold, its figures are no max/median
        out.append(f"<p><b>{len(grids)} range(s) one linear grid cannot hold</b>, with the "
                   "fix (analyze's findings; run's verdict says them too):</p>" + _table(
                       ["tensor", "group", "finding", "reason", "fix"],
                       [[o["tensor"], o.get("group") or "—", GRID_FINDINGS[o["kind"]],
                         o["reason"], "; ".join(o.get("remedies") or []) or "—"]
                        for o in grids]))
    if masks:
        out.append(
            f"<p><b>{len(masks)} attention-mask range(s), handled:</b> the additive mask "
            f"constant (|min| up to {fmt.plain(max(plots.num(o['ratio']) or 0 for o in masks))}"
            "x the largest real value) is in these "
            "tensors' ranges; the emulation takes their range from the unmasked scores and "
            "lets the constant saturate to the grid's minimum (a masked token's weight "
            "stays about 0). For the compiler: clamp the mask constant (e.g. -12) or keep "
            "it out of the calibrated range.</p>"
            + details(f"The {len(masks)} mask ranges", _table(
                ["tensor", "group", "|min| / max|x|", "reason"],
                [[o["tensor"], o.get("group") or "—", fmt.plain(plots.num(o["ratio"])),
                  o["reason"]] for o in masks])))
    if chans:
        head = ["tensor", "group", "max/median", "bits lost", "channels", "reason"]

        def rows(part: list[dict[str, Any]]) -> list[list[Any]]:
            return [[o["tensor"], o.get("group") or "—", plots.num(o["ratio"]),
                     plots.num(o["bits_lost"]), ", ".join(map(str, o["channels"][:12])),
                     o["reason"]] for o in part]

        out.append(f"<p>{len(chans)} tensor(s) with outlier channels (a few channels far above "
                   "the median channel's max|x|), worst first.</p>"
                   + _table(head, rows(chans[:5]))
                   + details(f"The other {len(chans) - 5}", _table(head, rows(chans[5:]))
                             if len(chans) > 5 else ""))
    worst = [(o["tensor"], list(o["channels"])) for o in chans]
    if stats is not None and len(worst) < top:
        worst += _widest(stats, {t for t, _ in worst} | {o["tensor"] for o in masks},
                         top - len(worst))
    for tensor, channels in worst[:top]:
        ts = stats.tensors.get(tensor) if stats is not None else None
        if ts is not None:
            out.append(plots.outlier_plot(tensor, ts.channel_absmax, channels))
    if not chans:
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
    accepted = [r for r in chk["rules"] if r.get("accepted")]  # --allow-warning: not passing
    failed = [r for r in chk["rules"] if not r["passed"] and not r.get("accepted")]
    passed = [r for r in chk["rules"] if r["passed"]]
    head = ["result", "rule", "severity", "what it checks", "provenance"]

    def result(r: dict[str, Any]) -> str:
        if r.get("accepted"):
            return f"{r['accepted']} ({len(r['groups'])} groups)"
        return "passed" if r["passed"] else f"FAILED ({len(r['groups'])} groups)"

    def rows(part: list[dict[str, Any]]) -> list[list[Any]]:
        return [[result(r), r["rule"], r["severity"], r["reason"], r["provenance"]]
                for r in part]

    problems = chk.get("problems") or []
    at = "" if not chk.get("seq_len") else f" at sequence length {chk['seq_len']}"
    out = [_h2("Legality", "legality"),
           f"<p>Every rule of {_e(chk['target'])} ({_e(str(chk.get('sdk')))}) checked on the "
           f"final plan{at}: {len(passed)} passed, {len(failed)} failed"
           + (f", {len(accepted)} warned and accepted by --allow-warning" if accepted else "")
           + ".</p>"]
    if failed or accepted:
        out.append(_table(head, rows(failed + accepted)))
    out.append(details(f"The {len(passed)} rules that pass", _table(head, rows(passed))
                       if passed else ""))
    if problems:
        out.append("<h3>Problems</h3>" + _table(
            ["severity", "rule", "group", "reason", "fix", "source"],
            [[p["severity"], p["rule"], p["group"], p["reason"], p["fix"],
              p.get("provenance", "")] for p in problems]))
    return "".join(out)


def pareto_section(pareto: dict[str, Any], measured: str, *, verdict: dict[str, Any] | None = None,
                   repaired_plan: dict[str, Any] | None = None,
                   offer_notes: Sequence[str] = ()) -> str:
    """The front; ``offer_notes``: why each requested repair was or was not offered to
    the search (the plan file's ``repair_offer``), one note each."""
    points = pareto.get("points") or []
    if not points:
        return ""
    pred = str(pareto.get("metric"))
    c = pareto.get("chosen", {})
    at = _chosen_index(points, c)
    applied = _applied(repaired_plan or {})
    if at is None:
        where = ("The chosen plan is not on the plotted front (the front is drawn by predicted "
                 "quality; the chosen plan is the best measured one within the budget): it is "
                 "the star.")
    else:
        where = f"The chosen plan is front row {at + 1} (the star)."
    held = ""
    if verdict is not None:
        got = (verdict.get("quality") or {}).get("plan", {}).get(measured)
        held = (f" Held out, the chosen plan measures {fmt.value(measured, got)} "
                f"({_e(_n(verdict))}; see the verdict)."
                + (" What ships is the deployment of compiled lengths (its held-out figure "
                   "leads the verdict; see Compiled lengths)."
                   if verdict.get("ships") == "deployment" else ""))
    on = pareto.get("measured_on") or "the fit data"
    rows = []
    for i, p in enumerate(points):
        mine = i == at
        reps = applied if mine else ("planned: " + ", ".join(p.get("repairs", []))
                                     if p.get("repairs") else "none")
        rows.append(["chosen" if mine else "", fmt.cost(p["cost"]), fmt.value(pred, p["predicted"]),
                     fmt.value(measured, p.get("measured")), len(p.get("groups", {})), reps])
    head = ["", "cost", f"predicted {fmt.label(pred)} (fit)", f"measured {fmt.label(measured)} "
            "(fit)", "promoted groups", "repairs"]
    if all(p.get("measured") is None for p in points):
        head.pop(3)
        rows = [r[:3] + r[4:] for r in rows]
    if at is None:  # no front row is the chosen plan (it is the star): no column to mark it
        head, rows = head[1:], [r[1:] for r in rows]
    return (_h2("Pareto front (fit data)", "pareto")
            + f"<p>Cost against quality for the legal plans on the front; predicted by the "
            f"analysis' additive model and measured on {_e(str(on))} (fit, not held out). "
            f"Chosen: cost {fmt.cost(c.get('cost'))}, predicted {fmt.value(pred, c.get('predicted'))}"
            f", measured on the fit data {fmt.value(measured, c.get('measured'))}. {where}"
            f"{held} Repairs: the chosen row lists those built and applied to the compiled "
            "model; other rows the repairs their plan would carry (not built).</p>"
            + plots.pareto_plot(pareto, measured) + _front_table(head, rows, points, at)
            + "".join(f"<p class=note>{_e(x)}</p>" for x in race_lines(pareto.get("race")))
            + "".join(f"<p class=note>{_e(x)}</p>" for x in offer_notes))


FRONT_ROWS = 12  # a longer front shows its key rows; every point folded below them


def _front_table(head: list[str], rows: list[list[Any]], points: list[dict[str, Any]],
                 at: int | None) -> str:
    """The front's table: whole when short; else its key rows (the start, the measured
    points, the chosen one, the dearest) and every point folded under a line that counts
    them (minilm-l6's front has hundreds of predicted-only points, a page of dashes)."""
    if len(rows) <= FRONT_ROWS:
        return _table(head, rows)
    key = [i for i, p in enumerate(points)
           if i in (0, len(points) - 1, at) or p.get("measured") is not None]
    return (_table(["row", *head], [[i + 1, *rows[i]] for i in key])
            + details(f"All {len(rows)} points of the front (the {len(key)} rows above are "
                      "the start, the measured points, the chosen one and the dearest)",
                      _table(["row", *head], [[i + 1, *r] for i, r in enumerate(rows)])))


def _chosen_index(points: list[dict[str, Any]], c: dict[str, Any]) -> int | None:
    for i, p in enumerate(points):
        if p["cost"] == c.get("cost") and (p.get("measured") == c.get("measured")
                                           or p["predicted"] == c.get("predicted")):
            return i
    return None


def _applied(repaired_plan: dict[str, Any]) -> str:
    """The repairs the repair stage built, and those it skipped with why."""
    done = [r["name"] for r in repaired_plan.get("repairs", []) if not r.get("skipped")]
    skipped = [f"{r['name']} ({r['skipped']})" for r in repaired_plan.get("repairs", [])
               if r.get("skipped")]
    return (", ".join(done) or "none") + (f"; skipped: {', '.join(skipped)}" if skipped else "")


def whatif_section(w: dict[str, Any] | None, n: str = "held out",
                   on: str = "held-out data") -> str:
    """``run --whatif``: where the final plan's error is, measured per op kind."""
    if not w:
        return ""
    head = _h2("Where the plan's error is (whatif, "
               + ("held out)" if on == "held-out data" else f"on the {on}, NOT held out)"),
               "whatif")
    if "skipped" in w:
        return head + f"<p class=note>not measured: {_e(w['skipped'])}</p>"
    m = w["metric"]
    rows = [[f"{r['kind']} at a16_w16", r["groups"], fmt.value(m, r[m]), fmt.gain(m, r["gain"])]
            for r in sorted(w["kinds"], key=lambda r: -(plots.num(r["gain"]) or 0.0))]
    rows.append(["all of them at a16_w16", w["all"]["groups"], fmt.value(m, w["all"][m]),
                 fmt.gain(m, w["all"]["gain"])])
    out = (head + f"<p class=note>{_e(w['note'])}; on the {on} ({_e(n)}). The plan: "
           f"{_e(fmt.label(m))} {fmt.value(m, w['plan'][m])}.</p>"
           + plots.whatif_plot(w, on)
           + _table(["lifted", "groups", fmt.label(m), "gain"],
                    [["the plan", "—", fmt.value(m, w["plan"][m]), fmt.gain(m, 0.0)], *rows]))
    h = w.get("headroom")
    if h:
        keys = [k for k in h["rows"][0] if k != "scale"]
        out += ("<h3>How far the goal is</h3>"
                + (f"<p><b>{_e(h['sentence'])}</b></p>" if "sentence" in h else "")
                + f"<p class=note>{_e(h['note'])}.</p>"
                + plots.headroom_plot(m, w["plan"][m], h)
                + _table(["the plan's error x", *[fmt.label(k) for k in keys]],
                         [[1.0, *(fmt.value(k, w["plan"].get(k)) for k in keys)],
                          *([r["scale"], *(fmt.value(k, r[k]) for k in keys)]
                            for r in h["rows"])]))
    return out


CHANGED_ROWS = 40  # more groups set otherwise: counted per change, the list folded


def plan_diff_section(final: dict[str, Any]) -> str:
    reasons = final.get("reasons", {})
    changed = [[g, f"{final['default']} → {p}", reasons.get(g, "")]
               for g, p in final.get("groups", {}).items()]
    kept = [[g, "kept " + final["default"], why] for g, why in reasons.items()
            if g not in final.get("groups", {})]
    ranges = [[t, m] for t, m in final.get("ranges", {}).items()]
    repairs = [[r["name"], f"skipped: {r['skipped']}" if r.get("skipped") else "applied",
                r.get("reason", ""), _changed(r.get("changed", []))]
               for r in final.get("repairs", [])]
    out = [_h2("The plan against uniform a8_w8", "plan"),
           f"<p>Default {_e(final['default'])}"
           + ("" if final["default"] == "a8_w8" else " (itself a change from a8_w8)")
           + f"; {len(changed)} group(s) set otherwise, with the planner's reason; groups "
           "kept at the default where a promotion was considered say why.</p>"]
    if len(changed) > CHANGED_ROWS:  # a head- and token-split model: hundreds of groups
        moves = Counter(p for _, p, _ in changed)
        out.append(_table(["precision", "groups"], [[p, n] for p, n in moves.most_common()])
                   + details(f"All {len(changed)} groups set otherwise, with the planner's "
                             "reason", _table(["group", "precision", "why"], changed)))
    elif changed:
        out.append(_table(["group", "precision", "why"], changed))
    out.append(details(f"{len(kept)} group(s) kept at {final['default']}, and why",
                       _table(["group", "precision", "why"], kept) if kept else ""))
    if repairs:
        out.append("<h3>Repairs</h3>" + _table(["repair", "result", "what it does",
                                                "changed"], repairs))
    out.append(details(f"Range methods changed ({len(ranges)} tensors)",
                       _table(["tensor", "range method"], ranges) if ranges else ""))
    return "".join(out)


def _changed(names: list[str], shown: int = 4) -> str:
    if not names:
        return "—"
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return f"{len(names)}: " + ", ".join(names[:shown]) + more


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
             ("held-out evaluation" if d.get("is_held_out", True) else
              "evaluation (the fit data, NOT held out)", d["held_out"])]
    out.append(_table(["part", "source", "calibration samples", "evaluation samples", "task"],
                      [[k, p["name"], p["calibration_samples"], p["evaluation_samples"],
                        p.get("task") or "fidelity only"] for k, p in parts]))
    for k, p in parts:
        out += [f"<p class=note>{_e(k)}: {_e(n)}</p>" for n in p.get("notes", [])]
        if p.get("faces"):  # face data: whose photos the part holds (split by person)
            f = p["faces"]
            out.append(f"<p class=note>{_e(k)}: {len(f['people'])} people, "
                       f"{f['chips']} chips, {f['pairs']} pairs ({f['genuine_pairs']} "
                       f"genuine); photos: {_e(', '.join(f['photos']))}</p>")
        if p.get("token_lengths"):
            out.append(plots.length_plot(p["token_lengths"], k))
    return "".join(out)


def _io_bounds(v: dict[str, Any]) -> str:
    rows = [[r["role"], r["tensor"], r["stored_type"], f"{r['q_min']} … {r['q_max']}",
             f"{r['min']:.6g} … {r['max']:.6g}"] for r in v["io"]]
    rows += [[f["role"], f["tensor"], "float (unquantized)", "—", "—"]
             for f in v.get("io_float") or []]
    return ("<h3>Clip bounds</h3>" + _table(["role", "tensor", "stored as", "codes",
                                              "real range"], rows)
            + f"<p class=note>{_e(v['io_note'])}. io_snippet.py has the host functions.</p>"
            if rows else "")
