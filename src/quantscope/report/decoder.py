"""The HTML report of a decoder LLM's ``run`` (``report.html``): the verdict first, then the
candidates the plan stage weighed (cost per phase against the prefill perplexity ratio,
plotted), the chosen plan's figures held out beside its a8_w4 variant (plotted with their
standard errors), the KV prefix's effect on the residual peaks by position (plotted, where
the plan recorded the scans), the diagnosis and the host's steps with each phase's device
I/O."""

from __future__ import annotations

import html
import math
from typing import Any

from quantscope.report import fmt
from quantscope.report.build import _table, details, io_section, render
from quantscope.report.figures import log_scale, png_uri, pyplot

METRIC_LABELS = {"ppl_ratio": "prefill perplexity ratio", "top1_agreement": "prefill top-1",
                 "decode_top1": "decode top-1 (emulated KV)",
                 "greedy_agreement": "greedy matched prefix"}


def _img(fig: Any, alt: str) -> str:
    return f'<img src="{png_uri(fig)}" alt="{html.escape(alt)}">'


def candidates_plot(cands: dict[str, Any], verdict: dict[str, Any]) -> str:
    """Prefill cost against the prefill perplexity ratio (log) of every measured candidate
    (ranking amounts), the chosen plan and its a8_w4 variant held out (± 2 SE)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    points: dict[tuple[float, float], list[str]] = {}  # a +dec16 candidate shares its
    for c in cands["candidates"]:                        # base's prefill point
        f = c.get("figures")
        if f:
            xy = (round(c["costs"].get("prefill", math.nan), 4),
                  round(f["prefill"]["ppl_ratio"], 6))
            points.setdefault(xy, []).append(c["label"])
    for (x, y), labels in points.items():
        ax.scatter([x], [y], color="#d62728" if cands["chosen"] in labels else "#1f77b4")
        ax.annotate(", ".join(labels), (x, y), textcoords="offset points", xytext=(4, 4),
                    fontsize=8)
    held = verdict["figures"]["ppl_ratio"]
    x = verdict["costs"].get("prefill", math.nan)
    ax.errorbar([x], [held["value"]], yerr=[2 * held["se"]], fmt="s", color="#d62728",
                capsize=3, label=f"chosen, held out ({verdict['setup']['evaluation']} windows)")
    w4 = verdict.get("w4") or {}
    if w4.get("measured"):
        f = w4["figures"]["ppl_ratio"]
        ax.errorbar([w4["checks"]["w4.prefill"]["cost"]], [f["value"]], yerr=[2 * f["se"]],
                    fmt="D", color="#2ca02c", capsize=3, label="chosen with a8_w4 weights")
    if verdict.get("metric") == "ppl_ratio" and verdict.get("goal"):
        ax.axhline(verdict["goal"], color="#888", ls="--", lw=1, label="goal")
    ax.axvline(verdict["max_cost"], color="#bbb", ls=":", lw=1, label="cost cap")
    log_scale(ax)
    ax.set_xlabel("prefill cost (x uniform a8_w8)")
    ax.set_ylabel("prefill perplexity / FP32's")
    ax.legend(fontsize=8)
    return _img(fig, "candidates: prefill cost vs perplexity ratio")


def figures_plot(verdict: dict[str, Any]) -> str:
    """The four figures of the chosen plan and of its a8_w4 variant, ± 2 SE."""
    plt = pyplot()
    names = list(METRIC_LABELS)
    fig, axes = plt.subplots(1, len(names), figsize=(10, 2.8))
    w4 = verdict.get("w4") or {}
    for ax, name in zip(axes, names, strict=True):
        rows = [("plan", verdict["figures"][name])]
        if w4.get("measured"):
            rows.append(("a8_w4", w4["figures"][name]))
        k, title = fmt.axis(name, METRIC_LABELS[name])
        ax.bar([r[0] for r in rows], [k * r[1]["value"] for r in rows],
               yerr=[2 * k * r[1]["se"] for r in rows], color=["#1f77b4", "#2ca02c"][:len(rows)],
               capsize=3)
        if verdict.get("metric") == name and verdict.get("goal"):
            ax.axhline(k * verdict["goal"], color="#888", ls="--", lw=1)
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=8)
    fig.tight_layout()
    return _img(fig, "held-out figures of the plan and its a8_w4 variant")


def prefix_section(prefix: dict[str, Any] | None) -> str:
    """The residual peaks by position (FP32, the calibration windows; per position the
    largest over the windows of its peak over its window's median position) without the
    prefix and after it, against the outlier threshold; '' where the plan recorded no scan
    (``--prefix none``, given tokens, a folder from before the profiles)."""
    if not prefix:
        return ""
    before = prefix.get("profile_before") or []
    after = (prefix.get("after") or {}).get("profile") or []
    if not before and not after:
        return ""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 3.4))
    n = len(prefix["tokens"])
    if before:
        ax.plot(range(len(before)), before, "o-", ms=3, color="#d62728",
                label="without the prefix (position 0: the window's first token)")
    if after:
        ax.plot(range(len(after)), after, "o-", ms=3, color="#1f77b4",
                label=f"after the {n}-token prefix (position 0: the first token after it)")
    ax.axhline(prefix["threshold"], color="#888", ls="--", lw=1,
               label=f"outlier: > {prefix['threshold']:g}x the median position")
    log_scale(ax)
    ax.set_xlabel("position in the calibration window")
    ax.set_ylabel("residual peak / median position")
    ax.legend(fontsize=8)
    fig.tight_layout()
    windows = (prefix.get("after") or {}).get("windows")
    over = (prefix.get("after") or {}).get("over")
    left = (f" After it, {over} of {windows} window(s) still have an outlier position."
            if after and windows else "")
    return ("<h2>KV prefix</h2><p>The largest residual activation at each position over the "
            "median position of its window (FP32 prefill on the calibration windows, the "
            "largest over the windows): the prefix's tokens run in FP32 on the host, so "
            "what stays over the threshold after it still sizes the 8-bit residual grids."
            f"{html.escape(left)}</p>"
            + _img(fig, "residual peaks by position, without and after the KV prefix"))


def search_section(search: dict[str, Any]) -> str:
    """``--rewrites search``'s trials (:mod:`quantscope.pipeline.decoder_search`): the
    steps, each phase's cost, the figure ± its standard error, kept or not, why."""
    rows = []
    for t in search["trials"]:
        f = t["figure"]
        rows.append([", ".join(t["steps"]) or "no step", t["question"],
                     *((f"{f['costs'].get(p, math.nan):.2f}x" if f else None)
                       for p in ("prefill", "decode")),
                     fmt.with_se(search["metric"], f["value"], f["se"]) if f else "not planned",
                     f["candidate"] if f else None, "yes" if t["kept"] else "no", t["reason"]])
    return (f"<h2>Rewrites searched</h2><p>{html.escape(search['method'])}: "
            f"{html.escape(search['metric'])} of the plan chosen per trial, measured by "
            f"{html.escape(search['measured_by'])} on {html.escape(search['measured_on'])}; "
            f"{html.escape(search['keep_rule'])}. Chosen: "
            f"{html.escape(', '.join(search['chosen']) or 'no step')}.</p>"
            + _table(["steps", "trial", "prefill cost", "decode cost", search["metric"],
                      "plan", "kept", "why"], rows))


def whatif_section(w: dict[str, Any], verdict: dict[str, Any]) -> str:
    """``--whatif``: each variant's figures (± 2 SE; green: legal on both phases within the
    cap), the goal where its metric is one of them, and the table."""
    plt = pyplot()
    rows = w["variants"]
    names = list(rows[0]["figures"])
    fig, axes = plt.subplots(1, len(names), figsize=(10, 0.45 * len(rows) + 1.2), sharey=True)
    for ax, name in zip(axes, names, strict=True):
        k, title = fmt.axis(name, METRIC_LABELS[name])
        ax.barh([r["label"] for r in rows], [k * r["figures"][name]["value"] for r in rows],
                xerr=[2 * k * r["figures"][name]["se"] for r in rows], capsize=3,
                color=["#2ca02c" if r["ships"] else "#aaaaaa" for r in rows])
        if verdict.get("metric") == name and verdict.get("goal"):
            ax.axvline(k * verdict["goal"], color="#d62728", ls="--", lw=1)
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=8)
    axes[0].invert_yaxis()
    fig.tight_layout()
    s = w["setup"]
    table = _table(["variant", "what", *names, "costs (prefill / decode)", "ships"], [
        [r["label"], r["what"], *(fmt.with_se(n, r["figures"][n]["value"], r["figures"][n]["se"])
                                  for n in names),
         fmt.phase_costs(r["costs"]),
         "yes" if r["ships"] else ", ".join(r["rules"]) or f"over {w['max_cost']:g}x"]
        for r in rows])
    return (f"<h2>What if</h2><p>The plan with one class of groups changed on both phases, "
            f"measured on {s['evaluation']} windows and {s['evaluation'] * s['steps']} decode "
            "steps (± 2 standard errors) and checked against the target; green: legal on "
            "both phases within the cost cap.</p>"
            + _img(fig, "whatif: each variant's figures") + table)


def decoder_report_html(verdict_text: str, verdict: dict[str, Any],
                        cands: dict[str, Any] | None, plan_text: str, host: dict[str, Any],
                        host_text: str) -> str:
    """The page (:func:`quantscope.report.build.render`); ``cands`` None: a plan stage that
    wrote no candidates file (said on the page)."""
    sections = [f'<div id=verdict class=verdict><pre>{html.escape(verdict_text)}</pre></div>']
    sections.append("<h2>Held out</h2>" + figures_plot(verdict))
    if (prefix := prefix_section(verdict.get("prefix"))):
        sections.append(prefix)
    if (verdict.get("whatif") or {}).get("asked"):
        sections.append(whatif_section(verdict["whatif"], verdict))
    if verdict.get("rewrite_search"):
        sections.append(search_section(verdict["rewrite_search"]))
    if cands is None:
        sections.append("<h2>Candidates</h2><p class=note>This run's plan stage recorded no "
                        "candidates (a folder from before candidates.json): plan.txt below "
                        "lists them.</p>")
    else:
        rows = []
        for c in cands["candidates"]:
            f = c.get("figures") or {}
            rows.append([c["label"] + (" (chosen)" if c["label"] == cands["chosen"] else ""),
                         "all" if c.get("default", "a8_w8") != "a8_w8" else c["overrides"],
                         *(f"{c['costs'].get(p, math.nan):.2f}x"
                                           for p in ("prefill", "decode")),
                         sum(c["errors"].values()), ", ".join(c["rules"]) or "-",
                         "yes" if c["kept"] else "no",
                         *((fmt.fixed(k, f[p][k]) if f else "not measured")
                           for p, k in (("prefill", "ppl_ratio"), ("prefill", "top1_agreement"),
                                        ("decode_emu_kv", "top1_agreement")))])
        sections.append(
            "<h2>Candidates</h2><p>Ranked on the plan stage's quick amount of text; the "
            "chosen one is measured held out above.</p>" + candidates_plot(cands, verdict)
            + _table(["candidate", "16-bit groups", "prefill cost", "decode cost", "errors",
                      "rules", "kept", "ppl ratio", "prefill top-1", "decode top-1"], rows))
    sections.append("<h2>Host steps</h2><pre>" + html.escape(host_text) + "</pre>")
    io = [{**r, "tensor": f"{phase}: {r['tensor']}"} for phase, rows in host.get("io", {}).items()
          for r in rows]
    if io:
        sections.append(io_section(io))
    sections.append(details("Diagnosis and candidates (plan.txt)",
                            "<pre>" + html.escape(plan_text) + "</pre>"))
    return render(f"quantscope run: {verdict['model']} on {verdict['target']}", sections)


__all__ = ["candidates_plot", "decoder_report_html", "figures_plot", "prefix_section",
           "search_section", "whatif_section"]
