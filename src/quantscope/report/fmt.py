"""One number format for the report and the verdict (which metrics are shares or dB, and
a value or a difference in its unit, come from :mod:`quantscope.units`, the bottom layer,
so that tasks and plans write them alike).

=================  ===============================================================
share metrics      (top-1 agreement, recall@k, decision agreement …: a share of the
                   samples) as percent, ``97.4 %``; differences in points, ``+3.0 pts``
dB metrics         ``17.6 dB``; differences ``+1.2 dB``
costs              ``1.406x`` (times uniform a8_w8)
anything else      4 significant digits
absent             ``—`` (None, NaN, a missing cell); the tables say so in a legend
=================  ===============================================================
"""

from __future__ import annotations

import math
import re
from typing import Any

from quantscope.units import (  # noqa: F401 - the facts, re-exported for the report
    DASH,
    SHARES,
    against,
    counted,
    gain,
    is_count,
    is_db,
    is_share,
    num,
    plain,
    value,
)

DASH_LEGEND = f"{DASH}: not measured or not applicable"

READABLE = {
    "top1_agreement": "top-1 agreement", "recall@1": "recall@1", "recall@1_fp32":
    "recall@1 of FP32", "embedding_cosine_mean": "embedding cosine (mean)",
    "embedding_cosine_min": "embedding cosine (min)", "embedding_cosine_p01":
    "embedding cosine (1st pct)", "norm_cv": "norm CV", "collapsed": "collapsed",
    "cosine_mean": "cosine (mean)", "cosine_min": "cosine (min)", "sqnr_db": "output SQNR",
    "sqnr_db_channel_min": "worst-channel SQNR", "output_sqnr_db": "output SQNR",
    "decision_agreement": "decision agreement", "exact_agreement": "exact agreement", "abs_err_max": "max |error|",
    "detection_f1": "detection F1", "decode_top1": "decode top-1",
    "string_agreement": "string agreement", "char_error_rate": "character error rate",
}


def label(key: str) -> str:
    """A metric key as a column name a person reads (``top1_agreement`` -> top-1 agreement);
    a per-output key (``sqnr_db:1``) as written."""
    return READABLE.get(key, key if ":" in key else key.replace("_", " "))


def fixed(metric: str, v: Any) -> str:
    """A decoder figure: a share in percent (``93.2 %``), anything else (a perplexity
    ratio, a KL) at 4 decimals (``1.0123``)."""
    x = num(v)
    if x is None or is_share(metric):
        return value(metric, v)
    return f"{x:.4f}"


def spread(metric: str, se: Any) -> str:
    """A standard error of ``metric`` (or the size of a difference): ``1.2 pts`` for a
    share, else 4 decimals; one too small for those digits keeps two significant ones
    (``0.030 pts``, ``0.000012``), so only an error that is exactly 0 reads 0 (``0 pts``)."""
    x = num(se)
    if x is None:
        return DASH
    share = is_share(metric)
    x, unit, places = (100 * x, " pts", 1) if share else (x, "", 4)
    if x == 0:
        return "0" + unit
    if abs(x) < 0.5 * 10 ** -places:  # two significant digits, never an exponent
        places = 1 - math.floor(math.log10(abs(x)))
    return f"{x:.{places}f}{unit}"


def with_se(metric: str, v: Any, se: Any, *, bracket: bool = False) -> str:
    """``93.2 % ± 1.2 pts`` (a share) or ``1.0123 ± 0.0040``; ``bracket``:
    ``93.2 % (± 1.2 pts)``."""
    shown, err = fixed(metric, v), spread(metric, se)
    return f"{shown} (± {err})" if bracket else f"{shown} ± {err}"


def goal(metric: str, g: Any, higher: bool = True) -> str:
    """A goal in words and the metric's unit: ``top-1 agreement >= 97.0 %``,
    ``worst-channel SQNR >= 30.0 dB``, ``similarity mae <= 0.1``; a goal finer than one
    decimal keeps its digits (``97.25 %``), so the text never shows a goal not asked."""
    shown = value(metric, g)
    x = num(g)
    if x is not None and (is_share(metric) or is_db(metric)):
        scaled = 100 * x if is_share(metric) else x
        if abs(round(scaled, 1) - scaled) > 1e-9:
            shown = f"{scaled:.6g}" + (" %" if is_share(metric) else " dB")
    return f"{label(metric)} {'>=' if higher else '<='} {shown}"


def axis(metric: str, text: str | None = None) -> tuple[float, str]:
    """How a plot draws ``metric``: the factor on its values (and errors, goals) and the
    axis label (``text``, else the key): a share in percent, ``top-1 agreement (%)``, as
    the tables beside it; anything else as it is."""
    share = is_share(metric)
    return (100.0 if share else 1.0), (text or metric) + (" (%)" if share else "")


def budget(metric: str, b: dict[str, Any] | None, higher: bool = True) -> str:
    """A planner's budget (``{'min_quality': .., 'max_cost': ..}``) in words:
    ``goal top-1 agreement >= 97.0 %, cost <= 1.5x``; none set: ``none (best quality)``."""
    b = b or {}
    parts = []
    if num(b.get("min_quality")) is not None:
        parts.append(f"goal {goal(metric, b['min_quality'], higher)}")
    if num(b.get("max_cost")) is not None:
        parts.append(f"cost <= {num(b['max_cost']):g}x")
    return ", ".join(parts) or "none (best quality)"


def cost(v: Any) -> str:
    x = num(v)
    return DASH if x is None else f"{x:.3f}x"


def phase_costs(costs: dict[str, Any]) -> str:
    """A plan's cost per phase (``1.49x / 1.29x``); a phase with float groups has no cost
    (infinite, or null read back from JSON): ``float``."""
    return " / ".join("float" if num(c) is None else f"{num(c):.2f}x" for c in costs.values())


def short_names(names: list[str], width: int = 24) -> list[str]:
    """Names shortened for tick labels: the last
    path parts that fit in ``width`` (``…`` marks a cut); a repeat gets ``#2``, ``#3``."""
    parts = [re.split(r"(?<=[/.])", n) for n in names]
    out = []
    for p, n in zip(parts, names, strict=True):
        tail = ""
        for piece in reversed(p):
            if len(tail) + len(piece) > width and tail:
                break
            tail = piece + tail
        tail = tail.strip("/.") or n
        out.append(tail if tail == n.strip("/.") else "…" + tail[-width:])
    seen: dict[str, int] = {}
    for i, s in enumerate(out):
        seen[s] = seen.get(s, 0) + 1
        if seen[s] > 1:
            out[i] = f"{s}#{seen[s]}"
    return out


ACCEPTED = "accepted by --allow-warning"  # a warning of a rule the user accepts


def problem_counts(severities: list[str]) -> str:
    """``2 error(s), 1 warning(s)``, and ``, 1 note(s) (info: not a failure)`` where there
    are info problems (the host's lookup), ``, 3 accepted by --allow-warning`` where
    warnings of accepted rules are among them (:data:`ACCEPTED` in place of their
    severity): how check, lint and check --phase count them."""
    errors, infos = severities.count("error"), severities.count("info")
    accepted = severities.count(ACCEPTED)
    return (f"{errors} error(s), {len(severities) - errors - infos - accepted} warning(s)"
            + (f", {accepted} {ACCEPTED}" if accepted else "")
            + (f", {infos} note(s) (info: not a failure)" if infos else ""))
