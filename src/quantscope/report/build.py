"""One self-contained HTML report (plots embedded as PNG data URIs, no external assets).

Sections, each present when its input is given:

=============  ==============================================================
demo/evaluate  per-config table of task metrics + bar chart of top-1 agreement
               and embedding cosine
plan           the Pareto front (cost vs quality, predicted and measured), the
               chosen plan's decisions with reasons, legality problems
analysis       the worst groups by sensitivity and the per-group SQNR profile
route          a deployment of several compiled lengths (``quantscope route``): per
               bucket its share of the texts, cost and legality; routed metrics
               against the longest bucket alone
device I/O     how to feed and read the deployed model: per input/output the
               stored type, scale, zero-point and the two formulas (the unsigned
               16-bit misreading of the field reports)
=============  ==============================================================
"""

from __future__ import annotations

import html
import re
from typing import Any

from quantscope.emulate.class_axes import read_words
from quantscope.report import fmt
from quantscope.report.figures import log_scale
from quantscope.report.figures import png_uri as _png
from quantscope.report.figures import pyplot as _plt
from quantscope.report.plots import prenorm_plot

EMULATION_NOTE = (
    "The emulator reproduces each target's quantization grid (scale, zero-point, bits, "
    "per-channel weights) with ONNX Runtime Q/DQ nodes, not the vendor's integer "
    "arithmetic bit for bit (accumulators, requantization rounding, lookup-table "
    "activations). bench/fidelity.py measures the gap to ORT's own integer kernels."
)


def _table(headers: list[Any], rows: list[list[Any]]) -> str:
    """A table that fits the page (long names wrap); an absent value (None, NaN) is a
    ``—`` and the table then says what ``—`` means. A header is a string, or (label, key):
    the key (a JSON metric key) is the header's tooltip."""
    head = "".join(f'<th title="{html.escape(h[1])}">{html.escape(h[0])}</th>'
                   if isinstance(h, tuple) else f"<th>{html.escape(str(h))}</th>"
                   for h in headers)
    cells = [[_fmt(c) for c in row] for row in rows]
    body = "".join(
        "<tr>" + "".join(f"<td>{_breakable(c)}</td>" for c in row) + "</tr>" for row in cells
    )
    legend = (f"<p class=legend>{html.escape(fmt.DASH_LEGEND)}</p>"
              if any(c == fmt.DASH for row in cells for c in row) else "")
    return (f"<div class=tw><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody>"
            f"</table></div>{legend}")


def _fmt(v: Any) -> str:
    return fmt.plain(v)


_LONG = re.compile(r"\S{25,}")


def _breakable(text: str) -> str:
    """``text`` escaped, long names given break points after ``/ . _ ,`` (``<wbr>``), so a
    graph path wraps at its parts instead of widening the table or breaking mid-word."""
    out, at = [], 0
    for m in _LONG.finditer(text):
        out.append(html.escape(text[at:m.start()]))
        out.append(re.sub(r"([/._,:])(?=.)", r"\1<wbr>", html.escape(m.group())))
        at = m.end()
    out.append(html.escape(text[at:]))
    return "".join(out)


def details(summary: str, body: str, *, open_: bool = False) -> str:
    """``body`` folded under a one-line ``summary`` (HTML ``<details>``)."""
    if not body:
        return ""
    return (f"<details{' open' if open_ else ''}><summary>{html.escape(summary)}</summary>"
            f"{body}</details>")


NEXT_STEPS = (
    "quantscope run MODEL --data DATA --target TARGET --goal G --max-cost C --out W: "
    "calibrates, finds what breaks, plans per-layer precisions for the target, checks them "
    "against its rules, measures the plan on held-out data and writes the compiler's files",
    "quantscope analyze / plan / check: one step at a time (which layers break, a plan, "
    "its legality on the target)",
)


def demo_section(results: dict[str, dict[str, Any]], title: str = "Precision configurations") -> str:
    keys = ["top1_agreement", "recall@1", "embedding_cosine_mean", "embedding_cosine_min",
            "norm_cv", "collapsed", "cosine_mean", "sqnr_db"]
    present = [k for k in keys if any(k in r["metrics"] for r in results.values())]
    rows = [[label, *[_demo_cell(k, r["metrics"].get(k)) for k in present]]
            for label, r in results.items()]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(results) + 1))
    labels = list(results)
    metric = "top1_agreement" if "top1_agreement" in present else "cosine_mean"
    share = fmt.is_share(metric)
    vals = [fmt.num(results[x]["metrics"].get(metric)) or 0.0 for x in labels]
    vals = [100 * v if share else v for v in vals]
    ax.barh(labels, vals, color="#4a7ab5")
    ax.set_xlim(0, 100 if share else 1)
    ax.set_xlabel(fmt.label(metric) + (" (%)" if share else ""))
    ax.invert_yaxis()
    for i, v in enumerate(vals):
        ax.text(min(v, 90 if share else 0.9), i, f" {v:.1f} %" if share else f" {v:.4f}",
                va="center")
    notes = sorted({n for r in results.values() for n in r.get("notes", [])})
    n = _sample_size(results)
    return (f"<h2>{html.escape(title)}</h2>"
            + (f"<p>Each configuration against FP32 on {html.escape(n)}; shares in percent, "
               "cosines to 4 decimals.</p>" if n else "")
            + _table(["configuration", *[(fmt.label(k), k) for k in present]], rows)
            + f'<img alt="{html.escape(fmt.label(metric))} per configuration" src="{_png(fig)}">'
            + "".join(f"<p class=note>{html.escape(x)}</p>" for x in notes)
            + "<h3>What to do next</h3>" + _demo_gap(results, metric) + "<ul>"
            + "".join(f"<li><code>{html.escape(x.split(': ', 1)[0])}</code>"
                      + (f": {html.escape(x.split(': ', 1)[1])}" if ": " in x else "")
                      + "</li>" for x in NEXT_STEPS) + "</ul>")


def _demo_gap(results: dict[str, dict[str, Any]], metric: str) -> str:
    """One sentence from the table: what uniform 8 bit loses and what 16 bit gets back."""
    got = {k: fmt.num((results.get(k) or {}).get("metrics", {}).get(metric))
           for k in ("fp32", "a8_w8", "a16_w16")}
    if got["a8_w8"] is None or got["fp32"] is None:
        return ""
    lost = fmt.gain(metric, got["a8_w8"] - got["fp32"])
    back = ("" if got["a16_w16"] is None else
            f", uniform a16_w16 {fmt.value(metric, got['a16_w16'])}")
    return (f"<p>Uniform a8_w8 gives {fmt.label(metric)} {fmt.value(metric, got['a8_w8'])} "
            f"({lost} against FP32){back}. A plan keeps most layers at 8 bit and lifts "
            "the ones that break, within a cost budget, legal on the target:</p>")


def _demo_cell(key: str, v: Any) -> str:
    if key == "collapsed":
        return "YES" if v else "no"
    if key in ("norm_cv",):
        return fmt.plain(v)
    if fmt.is_share(key) or fmt.is_db(key):
        return fmt.value(key, v)
    return fmt.DASH if fmt.num(v) is None else f"{v:.4f}"


def _sample_size(results: dict[str, dict[str, Any]]) -> str:
    """How many samples the metrics are on, when the results say (``pairs``/``samples``)."""
    for r in results.values():
        for key, unit in (("pairs", "pairs"), ("samples", "samples"), ("n", "samples")):
            v = r.get(key, (r.get("metrics") or {}).get(key))
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return f"{v} {unit}"
    return ""


OUTPUT_COLUMNS = {"sqnr_db": "output SQNR", "cosine_mean": "cosine (mean)",
                  "cosine_min": "cosine (min)", "sqnr_db_channel_min": "worst-channel SQNR",
                  "collapsed_channels": "collapsed channels"}


def outputs_details(results: dict[str, dict[str, Any]]) -> str:
    """The configurations' "Every output" fold: per configuration and output its figures
    (:data:`OUTPUT_COLUMNS`), then, once per output, the axis its per-channel figures are
    over (the entry's one line, :func:`quantscope.emulate.class_axes.read_words`)."""
    rows = [[label, name, *[fmt.value(k, t.get(k)) for k in OUTPUT_COLUMNS]]
            for label, r in results.items() for name, t in r.get("outputs", {}).items()
            if "sqnr_db" in t]
    if not rows:
        return ""
    reads: dict[str, str] = {}
    for r in results.values():
        for name, t in r.get("outputs", {}).items():
            if read_words(t):
                reads.setdefault(name, read_words(t))
    return details(f"Every output ({len(rows)} rows)", _table(
        ["config", "output", *OUTPUT_COLUMNS.values()], rows) + "".join(
        f"<p class=note>output {html.escape(repr(name))}: {html.escape(words)}</p>"
        for name, words in reads.items()))


def prenorm_section(results: dict[str, dict[str, Any]]) -> str:
    """Face verification: match rate by pre_norm (the INT8 cliff), when the results have it."""
    img = prenorm_plot(results)
    if not img:
        return ""
    return ("<h2>Match rate by embedding pre_norm</h2><p>Genuine pairs binned by the "
            "pre-normalisation norm of their embeddings; below a configuration's gate its "
            "matches are unreliable (field report 002: a cliff at pre_norm 10 on the "
            "device).</p>" + img)


def plan_section(plan: dict[str, Any], problems: list[dict[str, Any]] | None = None) -> str:
    out = [f"<h2>Plan for {html.escape(str(plan.get('target', '')))}</h2>",
           f"<p>default <b>{html.escape(plan['default'])}</b>, "
           f"{len(plan.get('groups', {}))} overrides</p>"]
    front = plan.get("pareto", {}).get("points") if isinstance(plan.get("pareto"), dict) else None
    if front:
        plt = _plt()
        fig, ax = plt.subplots(figsize=(6, 3.5))
        kp, pred = fmt.axis(str(plan["pareto"].get("metric", "quality")))
        kq, measured = fmt.axis(str(plan["pareto"].get("measured_metric", "")),
                                "measured task metric")
        ax.plot([p["cost"] for p in front], [kp * p["predicted"] for p in front], "o-",
                label="predicted")
        meas = [(p["cost"], kq * p["measured"]) for p in front if p.get("measured") is not None]
        if meas:
            ax2 = ax.twinx()
            ax2.plot(*zip(*meas, strict=True), "s", color="#c0392b", label="measured")
            ax2.set_ylabel(measured, color="#c0392b")
        ax.set_xlabel("relative cost (uniform a8_w8 = 1)")
        ax.set_ylabel(pred)
        ax.legend()
        out.append(f'<img alt="Pareto front" src="{_png(fig)}">')
    reasons = plan.get("reasons", {})
    rows = [[g, p, reasons.get(g, "")] for g, p in plan.get("groups", {}).items()]
    if rows:
        out.append(_table(["group", "precision", "reason"], rows))
    if problems:
        out.append("<h3>Legality problems</h3>" + _table(
            ["severity", "rule", "group", "reason", "fix", "source"],
            [[p["severity"], p["rule"], p["group"], p["reason"], p["fix"],
              p.get("provenance", "")] for p in problems]))
    return "".join(out)


def route_section(label: str, result: dict[str, Any]) -> str:
    """A ``quantscope route`` result: per bucket its share of the texts and its cost (chart
    and table), the routed metrics against the longest bucket alone on every text."""
    buckets = result["buckets"]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3))
    names = [str(b["seq_len"]) for b in buckets]
    x = range(len(buckets))
    ax.bar([i - 0.2 for i in x], [b["share"] for b in buckets], width=0.4, color="#4a7ab5",
           label="share of the texts")
    ax.set_ylabel("share of the texts")
    ax2 = ax.twinx()
    ax2.bar([i + 0.2 for i in x], [b["cost"] for b in buckets], width=0.4, color="#c0392b",
            label="cost (x the longest's uniform a8_w8)")
    ax2.axhline(result["cost_mean"], color="#c0392b", ls="--", lw=1)
    ax2.set_ylabel("cost", color="#c0392b")
    ax.set_xticks(list(x), names)
    ax.set_xlabel("compiled sequence length (tokens)")
    fig.legend(loc="upper left", fontsize=8)
    keys = ["top1_agreement", "recall@1", "recall@1_fp32", "embedding_cosine_mean"]
    alone = result["longest_alone"]
    def cells(m: dict[str, Any]) -> list[str]:  # each in its unit: shares in percent
        return [fmt.value(k, m[k]) if k in m else "" for k in keys]

    rows = [[f"routed ({len(buckets)} lengths)", result["cost_mean"], *cells(result["metrics"])],
            [f"seq {alone['seq_len']} alone", alone["cost"], *cells(alone["metrics"])]]
    verdict = result.get("verdict")

    def said(k: str, v: Any) -> str:  # the verdict's figures in the metric's unit
        m = str(verdict.get("metric")) if verdict else ""
        if k in ("value", "goal"):
            return f"{k} {fmt.value(m, v)}"
        return f"{k} {fmt.gain(m, v).lstrip('+')}" if k == "short_by" else f"{k} {v}"

    line = "" if not verdict else (
        f"<p><b>{'MET' if verdict['met'] else 'NOT MET'}</b>: "
        + html.escape(", ".join(said(k, v) for k, v in verdict.items() if k != "met")) + "</p>")
    return (f"<h2>Length buckets: {html.escape(label)} on {html.escape(result['target'])}</h2>"
            "<p>Each text runs on the shortest compiled length that holds it; costs are "
            "relative to the reference's uniform a8_w8 at the longest length, the mean "
            "(dashed) weights each bucket by its share of the evaluation texts.</p>"
            + line + _table(["deployment", "cost", *keys], rows)
            + f'<img alt="buckets" src="{_png(fig)}">'
            + _table(["seq_len", "share", "texts", "cost (own a8_w8)", "cost", "legal", "model"],
                     [[b["seq_len"], b["share"], b["texts"], b["cost_own"], b["cost"],
                       "yes" if b["legal"] else f"NO: {b['problems'][0]['rule']}", b["model"]]
                      for b in buckets])
            + "".join(f"<p class=note>bucket {b['seq_len']}: {html.escape(n)}</p>"
                      for b in buckets for n in b.get("notes", [])))


def choice_section(label: str, choice: dict[str, Any]) -> str:
    """A ``quantscope buckets`` choice: the chosen compiled lengths (share of the texts it
    chose on, cost, candidate, predicted cosine) and every candidate's error and cost at
    the longest length (chart)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3))
    cands = choice["candidates"]
    for name, c in cands.items():
        ax.scatter(c["cost_at_longest"], 1.0 - c["cosine_mean"], color="#4a7ab5")
        ax.annotate(name, (c["cost_at_longest"], 1.0 - c["cosine_mean"]), fontsize=7)
    ax.scatter(choice["cost_mean"], 1.0 - choice["cosine_mean"], color="#c0392b", marker="*",
               s=120, label="the chosen deployment (mean)")
    ax.axvline(choice["max_cost"], color="#c0392b", ls="--", lw=1)
    log_scale(ax)
    ax.set_xlabel(f"cost (x the reference's uniform a8_w8 at {choice['lengths'][-1]})")
    ax.set_ylabel("1 - cosine to FP32")
    ax.legend(fontsize=8)
    return (f"<h2>Buckets chosen: {html.escape(label)} on {html.escape(choice['target'])}</h2>"
            f"<p>Chosen on {choice['texts']} texts within {choice['max_cost']:g}x, at most "
            f"{choice['max_buckets']} compiled lengths: mean cost {choice['cost_mean']:.3f}x, "
            f"embedding cosine {choice['cosine_mean']:.5f}"
            + "".join(f", {html.escape(k)} {fmt.value(k, v)}"  # shares in percent
                      for k, v in (choice.get("selection_metrics") or {}).items())
            + " on those texts (not held out). Each candidate alone at the "
            "longest length (dots) against the chosen deployment (star); measure the "
            "deployment on held-out pairs with <code>quantscope route</code>.</p>"
            + f'<img alt="candidates" src="{_png(fig)}">'
            + _table(["seq_len", "share", "texts", "candidate", "cost", "cosine", "legal"],
                     [[b["seq_len"], b["share"], b["texts"], b["candidate"], b["cost"],
                       "" if b["cosine_mean"] is None else b["cosine_mean"],
                       "yes" if b["legal"] else "NO"] for b in choice["buckets"]])
            + "".join(f"<p class=note>{html.escape(n)}</p>" for n in choice["notes"]))


def io_section(rows: list[dict[str, Any]]) -> str:
    """Device I/O: ``rows`` of {tensor, role, bits, signed, scale, zero_point}."""
    body = []
    for r in rows:
        kind = f"{'int' if r['signed'] else 'uint'}{r['bits']}"
        body.append([r["role"], r["tensor"], kind, r["scale"], r["zero_point"],
                     f"x_dev = round(x / {r['scale']:.6g}) + {r['zero_point']}",
                     f"x = (x_dev - {r['zero_point']}) * {r['scale']:.6g}"])
    head = "<h2>Feeding and reading the device</h2>"
    if not body:  # every input and output float, or fed and read as it is (uint8 io)
        return head + ("<p>No model input or output is quantized by the plan: each is fed "
                       "and read as the model declares it (the verdict's details list "
                       "them).</p>")
    return (head + "<p>Every quantized value is stored as the "
            "integer type below; a 16-bit unsigned tensor shows 0…65535, not ±32767. Use "
            "the zero-point and scale of <i>each</i> tensor (or let the runtime do it with "
            "float32 streams).</p>"
            + _table(["role", "tensor", "stored as", "scale", "zero point", "to device",
                      "from device"], body))


def analysis_section(analysis: dict[str, Any], top: int = 15) -> str:
    """Offenders (``quantscope.analysis/1``): bar chart of recovered SQNR, reasons, recovery."""
    # a group whose promotion alone gains nothing is no offender (analysis.json keeps it)
    offenders = [o for o in analysis.get("offenders", [])
                 if isinstance(o.get("score_db"), (int, float)) and o["score_db"] > 0][:top]
    out = [f"<h2>Per-layer diagnosis ({html.escape(str(analysis.get('low')))} → "
           f"{html.escape(str(analysis.get('high')))})</h2>"]
    base = analysis.get("baselines", {})
    if base:
        keys = sorted({k for m in base.values() for k in m if not fmt.is_count(k)})
        out.append(_table(["uniform", *keys], [[p, *[fmt.counted(k, m) if k in m else ""
                                                     for k in keys]]  # shares in percent
                                                for p, m in base.items()]))
    if offenders:
        plt = _plt()
        fig, ax = plt.subplots(figsize=(7, 0.3 * len(offenders) + 1))
        ax.barh([o["group"][-45:] for o in offenders], [o.get("score_db", 0.0) for o in offenders])
        ax.invert_yaxis()
        ax.set_xlabel("output SQNR recovered by promoting the group alone (dB)")
        out.append(f'<img alt="offenders" src="{_png(fig)}">')
        out.append(_table(["group", "recovered dB", "reasons"],
                          [[o["group"], o.get("score_db", ""), " · ".join(o.get("reasons", []))]
                           for o in offenders]))
    rec = analysis.get("recovery", [])
    if rec:
        out.append("<h3>Recovery by promoting the worst groups</h3>" + _table(
            ["promoted", "precision", "metrics"],
            [[len(r["promoted"]), r["precision"],
              ", ".join(f"{k} {fmt.counted(k, r['metrics'])}" for k, v in r["metrics"].items()
                        if isinstance(v, int | float) and not fmt.is_count(k))] for r in rec]))
    return "".join(out)


def render(title: str, sections: list[str]) -> str:
    css = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;"
           "padding:0 1em;color:#222}"
           ".tw{max-width:100%;overflow-x:auto;margin:1em 0}"
           "table{border-collapse:collapse;font-size:13px;table-layout:auto;max-width:100%}"
           "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top;"
           "overflow-wrap:break-word}"
           "th{background:#f0f3f7}.note,.legend{color:#555;font-size:13px}"
           "img{max-width:100%;height:auto}"
           "pre{white-space:pre-wrap;overflow-wrap:anywhere;background:#f7f7f7;padding:.6em}"
           "details{margin:.6em 0}summary{cursor:pointer;color:#234}"
           ".verdict{font-size:15px;border-left:4px solid #888;padding:.2em .8em}")
    return (f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)}</title>"
            f"<style>{css}</style></head><body><h1>{html.escape(title)}</h1>"
            + "".join(sections) + f"<p class=note>{html.escape(EMULATION_NOTE)}</p></body></html>")
