"""The run report's figures (matplotlib, embedded as PNG data URIs by :func:`build._png`).

Each function takes the stage files' dicts and returns an ``<img>`` tag, or "" when there
is nothing to draw.
"""

from __future__ import annotations

import html
import math
from typing import Any

import numpy as np

from quantscope.report.figures import log_scale, remembered
from quantscope.report.figures import png_uri as _png
from quantscope.report.figures import pyplot as _plt
from quantscope.report.fmt import axis, is_share, short_names


def num(v: Any) -> float | None:
    """A JSON number (or the analysis' "inf"/"nan" strings) as a float; None if absent."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str) and v in ("inf", "-inf", "nan"):
        return float(v)
    return None


def _img(fig: Any, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="{_png(fig)}">'


@remembered
def noise_plot(noise: list[dict[str, Any]], labels: list[str] | None = None,
               masked: set[str] | None = None) -> str:
    """Isolated vs accumulated SQNR per tensor, in graph order (a line each); ``labels``:
    the tick labels (shortened names); ``masked``: tensors not drawn (a grey band each)."""
    if not noise:
        return ""
    masked = masked or set()
    labels = labels or [r["tensor"][-22:] for r in noise]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 4.2))
    x = np.arange(len(noise))
    for key, label, style in (("sqnr_isolated_db", "isolated (this tensor alone quantized)", "o-"),
                              ("sqnr_cumulative_db", "accumulated (everything up to here)", "s-")):
        ys = [None if r["tensor"] in masked else num(r.get(key)) for r in noise]
        ys = [y if y is not None and math.isfinite(y) else np.nan for y in ys]
        ax.plot(x, ys, style, markersize=3, label=label)
    for i, r in enumerate(noise):
        if r["tensor"] in masked:
            ax.axvspan(i - 0.5, i + 0.5, color="#bbb", alpha=0.5, lw=0)
    step = max(1, math.ceil(len(noise) / 30))
    ax.set_xticks(x[::step])
    ax.set_xticklabels(labels[::step], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("SQNR (dB)")
    ax.set_xlabel("tensor, in graph order (shortened; full names in the table)"
                  + ("; grey: masked attention scores, not drawn" if masked & {
                      r["tensor"] for r in noise} else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _img(fig, "per-layer noise: isolated vs accumulated SQNR")


def rank_value(v: Any) -> float:
    """A sensitivity figure as a sort key (absent last, +inf first)."""
    x = num(v)
    return -math.inf if x is None or math.isnan(x) else x


@remembered
def sensitivity_plot(sens: list[dict[str, Any]], metric: str, top: int = 20) -> str:
    """Enable-one and disable-one ``metric`` per group (the ``top`` most sensitive)."""
    rows = [r for r in sens if num(r["disable_one"].get(metric)) is not None]
    if not rows:
        return ""
    rows = sorted(rows, key=lambda r: -_finite(num(r["disable_one"].get(metric))))[:top]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(rows) + 1.2))
    y = np.arange(len(rows))
    k, name = axis(metric)
    en = [k * _finite(num(r["enable_one"].get(metric))) for r in rows]
    dis = [k * _finite(num(r["disable_one"].get(metric))) for r in rows]
    ax.barh(y - 0.2, dis, height=0.4, label="disable-one (all low but this group)", color="#4a7ab5")
    ax.barh(y + 0.2, en, height=0.4, label="enable-one (only this group low)", color="#e08a3c")
    ax.set_yticks(y)
    ax.set_yticklabels(short_names([r["group"] for r in rows], 40), fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(name)
    ax.legend(fontsize=8, loc="lower right")
    return _img(fig, "sensitivity: enable-one and disable-one per group")


def _finite(v: float | None, cap: float = 120.0) -> float:
    """Plot value: +inf (no noise at all) drawn at ``cap``, nan/None at 0."""
    if v is None or math.isnan(v):
        return 0.0
    return min(v, cap) if v > 0 else max(v, -cap)


@remembered
def outlier_plot(tensor: str, absmax: np.ndarray, channels: list[int]) -> str:
    """Per-channel max|x| of one tensor, the outlier channels marked and named."""
    a = np.asarray(absmax, dtype=np.float64).ravel()
    if a.size == 0:
        return ""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 2.6))
    # the channels as one filled outline (touching bars of width 1, the look of a bar per
    # channel: hundreds of patches drew in 0.28 s a figure), the outliers as bars over it
    ax.stairs(a, np.arange(a.size + 1) - 0.5, fill=True, color="#8aa5c8")
    marked = [c for c in channels if 0 <= c < a.size]
    ax.bar(marked, a[marked], color="#c0392b", width=1.0)
    for c in channels[:6]:
        if 0 <= c < a.size:
            ax.annotate(f"ch {c}", (c, a[c]), textcoords="offset points", xytext=(0, 3),
                        ha="center", fontsize=7, color="#c0392b")
    ax.axhline(float(np.median(a)), color="#555", lw=0.8, ls="--", label="median channel")
    ax.set_title(tensor[-70:], fontsize=9)
    ax.set_xlabel("channel")
    ax.set_ylabel("max |x|")
    ax.legend(fontsize=7)
    return _img(fig, f"per-channel max|x| of {tensor}")


@remembered
def pareto_plot(pareto: dict[str, Any], measured_metric: str) -> str:
    """Cost vs predicted and measured quality; one axis when both are in one unit."""
    points = pareto.get("points") or []
    if not points:
        return ""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    pred_metric = str(pareto.get("metric", "predicted"))
    kp, kq = axis(pred_metric)[0], axis(measured_metric)[0]
    cost = [p["cost"] for p in points]
    lines = ax.plot(cost, [kp * p["predicted"] for p in points], "o-", color="#4a7ab5",
                    label=f"predicted ({pred_metric}, from the analysis, fit data)")
    meas = [(p["cost"], kq * p["measured"]) for p in points if p.get("measured") is not None]
    if meas:
        same = pred_metric == measured_metric or (pred_metric, measured_metric) == (
            "output_sqnr_db", "sqnr_db")
        ax2 = ax if same else ax.twinx()
        lines += ax2.plot(*zip(*meas, strict=True), "s--", color="#c0392b",
                          label=f"measured ({measured_metric}, real emulation, fit data)")
        ax2.ticklabel_format(axis="y", useOffset=False)
        if not same:
            ax2.set_ylabel(axis(measured_metric, f"measured {measured_metric}")[1],
                           color="#c0392b")
    chosen = pareto.get("chosen", {})
    if chosen.get("cost") is not None:
        ax.axvline(chosen["cost"], color="#555", lw=0.8, ls=":")
        y_meas = num(chosen.get("measured"))
        if y_meas is not None and meas:
            lines += ax2.plot([chosen["cost"]], [kq * y_meas], "*", color="#111", markersize=14,
                              label="the chosen plan (measured, fit data)")
        elif num(chosen.get("predicted")) is not None:
            lines += ax.plot([chosen["cost"]], [kp * chosen["predicted"]], "*", color="#111",
                             markersize=14, label="the chosen plan (predicted)")
    ax.set_xlabel("relative cost (uniform a8_w8 = 1)")
    ax.set_ylabel(axis(pred_metric, f"predicted {pred_metric}")[1], color="#4a7ab5")
    ax.legend(lines, [ln.get_label() for ln in lines], fontsize=8, loc=legend_corner(pareto))
    ax.grid(alpha=0.3)
    return _img(fig, "Pareto front: predicted and measured")


def legend_corner(pareto: dict[str, Any]) -> str:
    """Where the front is not: it rises to the right for a higher-is-better metric and
    falls to the right for an error (``char_error_rate``), where a lower-right legend hid
    the chosen plan's star (the best, costliest point)."""
    return "lower right" if pareto.get("higher_is_better", True) else "upper right"


@remembered
def config_plot(results: dict[str, dict[str, Any]], metric: str,
                data: str = "held-out data") -> str:
    labels = [k for k in results if num(results[k]["metrics"].get(metric)) is not None]
    if not labels:
        return ""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(labels) + 1))
    share = is_share(metric)
    scale, name = axis(metric)
    vals = [_finite(num(results[k]["metrics"][metric])) * scale for k in labels]
    ax.barh(labels, vals, color="#4a7ab5")
    ax.invert_yaxis()
    ax.set_xlabel(f"{name} ({data})")
    for i, v in enumerate(vals):
        ax.text(v, i, f" {v:.1f} %" if share else f" {v:.4g}", va="center", fontsize=8)
    return _img(fig, f"{metric} per configuration")


@remembered
def whatif_plot(whatif: dict[str, Any], data: str = "held-out data") -> str:
    """Gain of the plan's metric per op kind lifted to a16_w16, and of all at once."""
    m = whatif["metric"]
    kinds = sorted(whatif["kinds"], key=lambda r: -(num(r["gain"]) or 0.0))
    rows = [(f"{r['kind']} ({r['groups']})", num(r["gain"])) for r in kinds]
    rows.append((f"all ({whatif['all']['groups']})", num(whatif["all"]["gain"])))
    scale, unit = (100.0, " points") if is_share(m) else (1.0, "")
    rows = [(label, scale * _finite(g)) for label, g in rows if g is not None]
    if not rows:
        return ""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1))
    ax.barh([r[0] for r in rows], [r[1] for r in rows],
            color=["#4a7ab5"] * (len(rows) - 1) + ["#999"])
    ax.invert_yaxis()
    ax.axvline(0, color="#333", lw=0.8)
    ax.set_xlabel(f"{m} gained over the plan{unit} ({data}; legality and cost aside)")
    for i, (_, v) in enumerate(rows):
        ax.text(v, i, f" {v:+.1f}" if scale != 1.0 else f" {v:+.4g}", va="center", fontsize=8)
    return _img(fig, f"{m} gained per op kind lifted to a16_w16")


@remembered
def headroom_plot(metric: str, plan_value: float, headroom: dict[str, Any]) -> str:
    """The metric against the scale of the plan's own error (log axis), with the goal."""
    pts = [(1.0, num(plan_value))] + [(float(r["scale"]), num(r[metric]))
                                      for r in headroom["rows"]]
    k, name = axis(metric)
    pts = [(s, k * v) for s, v in pts if v is not None]
    if len(pts) < 2:
        return ""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color="#4a7ab5")
    log_scale(ax, "x")
    ax.invert_xaxis()
    if headroom.get("goal") is not None:
        ax.axhline(k * headroom["goal"], color="#c33", lw=0.9, ls="--", label="goal")
        if headroom.get("needed"):
            ax.axvline(headroom["needed"], color="#c33", lw=0.6, ls=":")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xlabel("the plan's error, scaled (1 = the plan)")
    ax.set_ylabel(name)
    return _img(fig, f"{metric} against the scale of the plan's own error")


@remembered
def length_plot(lengths: list[int], title: str) -> str:
    if not lengths:
        return ""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 2.4))
    ax.hist(lengths, bins=min(40, max(5, len(set(lengths)))), color="#8aa5c8")
    ax.set_xlabel("tokens per text (after truncation)")
    ax.set_ylabel("texts")
    ax.set_title(title, fontsize=9)
    return _img(fig, f"token lengths: {title}")


@remembered
def prenorm_plot(results: dict[str, dict[str, Any]]) -> str:
    """Match rate of genuine pairs per pre_norm bin, one line per configuration: the INT8
    "cliff" of field report 002 shows as a line that falls to 0 below some pre_norm."""
    curves = {}
    for label, r in results.items():
        table = (r.get("outputs") or {}).get("pre_norm_match_rate") or {}
        pts = []
        for key, rate in table.items():
            if key.endswith(" n") or ".." not in key or num(rate) is None:
                continue
            lo, hi = (float(v) for v in key.split(".."))
            pts.append(((lo + hi) / 2, float(rate)))
        if pts:
            curves[label] = sorted(pts)
    if not curves:
        return ""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for label, pts in curves.items():
        gate = num((results[label].get("metrics") or {}).get("pre_norm_gate"))
        suffix = f" (gate {gate:.3g})" if gate is not None and np.isfinite(gate) else ""
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=label + suffix)
    ax.set_xlabel("pre_norm (embedding norm before L2 normalisation), bin centre")
    ax.set_ylabel("match rate of genuine pairs")
    ax.set_ylim(-0.05, 1.05)
    ax.legend(fontsize=7)
    return _img(fig, "match rate by pre_norm per configuration")
