"""Which metrics are shares, which are in dB, and a value written in its unit: the facts
every layer's text needs (``tasks``' notes, ``plan``'s reasons, the report), kept at the
bottom so each writes a share the same way; :mod:`quantscope.report.fmt` re-exports them.

=================  ===============================================================
share metrics      (top-1 agreement, recall@k, decision agreement …: a share of the
                   samples) as percent, ``97.4 %``; differences in points, ``+3.0 pts``
dB metrics         ``17.6 dB``; differences ``+1.2 dB``
anything else      4 significant digits; a count whole
counts             ``KEY_items`` / ``KEY_clusters`` (the items a share counted, the
                   samples they cluster in): no figures of their own, shown beside
                   their share, ``97.9 % (n=47)`` (:func:`counted`)
absent             ``—`` (None, NaN)
=================  ===============================================================
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

DASH = "—"

SHARES = ("top1_agreement", "top5_agreement", "top1_ties", "top1_ties_fp32", "recall@", "decision_agreement",
          "tar_at_far", "detection_f1", "detection_recall", "detection_precision", "pixel_flip_share", "match_rate",
          "score_side_agreement", "decode_top1", "greedy_agreement", "greedy_stepwise", "exact_agreement",
          "values_equal_share", "mask_share_fp32", "point_agreement", "point_flag_agreement",
          "point_agreement_flagged",
          "string_agreement", "char_error_rate", "decisions_positive_fp32", "image_outside_share",
          "depth_delta1", "depth_invalid_share", "true_accept_rate", "false_accept_rate",
          "equal_error_rate", "true_accept_rate_fp32", "false_accept_rate_fp32",
          "equal_error_rate_fp32", "pitch_agreement", "voicing_agreement", "voiced_share_fp32",
          "neighbour_agreement", "neighbour_top5_overlap", "neighbour_label_agreement")
"""Metric keys (or prefixes) that are a share of the samples: shown in percent (a decoder's
``decode_top1``: top-1 agreement on the decode steps; ``greedy_agreement``: the share of
greedy tokens in the prefix matching FP32's; ``greedy_stepwise``: the share of the emulated
greedy tokens FP32 picks itself after the same tokens; ``mask_share_fp32``: the share of the
pixels FP32's map puts at or above the threshold; ``char_error_rate``: a CTC recognizer's
edits per FP32 label, a rate written in percent as the shares are)."""


ITEMS = "_items"  # KEY_items: the items the share KEY is over (quantscope.tasks.shares)
CLUSTERS = "_clusters"  # KEY_clusters: the samples its items cluster in (an effective count)


def count_key(metric: str, suffix: str) -> str:
    """The count ``suffix`` (:data:`ITEMS`, :data:`CLUSTERS`) of the share ``metric``
    (of one output's, ``KEY:OUTPUT``: ``KEY_items:OUTPUT``)."""
    base, sep, output = metric.partition(":")
    return base + suffix + sep + output


def is_count(key: str) -> bool:
    """``key`` counts a share's items or their samples: a count beside a figure, no
    metric to tabulate or rank by."""
    return key.partition(":")[0].endswith((ITEMS, CLUSTERS))


def counted(metric: str, values: Mapping[str, Any]) -> str:
    """``values[metric]`` in its unit with the items it counted beside it, where
    ``values`` holds them: ``97.9 % (n=47)``; per position (items clustered by sample):
    ``97.9 % (n=47 effective, 16 samples)``."""
    shown = value(metric, values.get(metric))
    n, k = (num(values.get(count_key(metric, s))) for s in (ITEMS, CLUSTERS))
    if n is None:
        return shown
    if n == 0:  # no item to count (a where= gate nothing passes): no share of nothing
        return shown + " (none judged)"
    return shown + (f" (n={int(n)})" if k is None else
                    f" (n={int(n)}, {of(int(k), 'samples')} judged)"
                    if one_per_sample(metric, values) else
                    f" (n={int(n)} effective, {of(int(k), 'samples')})")


def one_per_sample(metric: str, values: Mapping[str, Any]) -> bool:
    """The share ``metric``'s items are one per sample it judged (``KEY_clusters`` equal
    to ``KEY_items``, :func:`quantscope.tasks.shares.share_counts`: a gated share of one
    point per sample): a plain count, no effective count of positions clustered by sample
    to say."""
    n, k = (num(values.get(count_key(metric, s))) for s in (ITEMS, CLUSTERS))
    return n is not None and k is not None and n == k > 0


def of(n: Any, noun: str) -> str:
    """``n`` and ``noun`` (a plural phrase: ``held-out samples``), singular for one:
    ``n=1 held-out sample``."""
    return f"{n} {noun[:-1] if n == 1 and noun.endswith('s') else noun}"


def num(v: Any) -> float | None:
    """A finite float, or None (absent, NaN, a bool, a string); numpy scalars count."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return None
    return float(v) if math.isfinite(v) else None


def is_share(metric: str) -> bool:
    base = metric.split(":")[0]
    return any(base == s or (s.endswith("@") and base.startswith(s)) for s in SHARES)


def is_db(metric: str) -> bool:
    base = metric.split(":")[0]
    return "sqnr" in base or base.endswith("_db")


def value(metric: str, v: Any, *, fine: bool = False) -> str:
    """``v`` of ``metric`` in its unit: ``72.7 %``, ``17.6 dB``, ``0.9731``, a count whole
    (``12840``), or ``—``; ``fine`` (figures a decision compares against a margin):
    ``72.73 %``, ``17.62 dB``."""
    if isinstance(v, float) and math.isinf(v):
        return ("+" if v > 0 else "-") + "inf dB" if is_db(metric) else str(v)
    x = num(v)
    if x is None:
        return DASH
    if is_share(metric):
        return f"{100 * x:.{2 if fine else 1}f} %"
    if is_db(metric):
        return f"{x:.{2 if fine else 1}f} dB"
    if x.is_integer() and abs(x) < 1e15:  # a count (detections_fp32): whole, not 1.284e+04
        return str(int(x))
    return plain(x)


def against(metric: str, v: Any, goal: Any) -> str:
    """``v`` in its unit (:func:`value`) with the digits that tell it from the ``goal`` it
    is judged against: a held-out PSNR of 49.958 dB under a goal of 50 reads ``49.96 dB``,
    not ``50.0 dB`` beside ``NOT reached``."""
    shown = value(metric, v)
    x, g = num(v), num(goal)
    if x is None or g is None or x == g or shown != value(metric, goal):
        return shown
    for places in range(2, MAX_PLACES + 1):
        scaled, aim = (100 * x, 100 * g) if is_share(metric) else (x, g)
        if f"{scaled:.{places}f}" != f"{aim:.{places}f}":
            unit = " %" if is_share(metric) else " dB" if is_db(metric) else ""
            return f"{scaled:.{places}f}{unit}"
    return shown


def gain(metric: str, g: Any, *, fine: bool = False) -> str:
    """A difference of ``metric``: ``+3.0 pts`` (shares), ``+1.2 dB``, ``+0.0021``;
    ``fine`` (a decision's gain and its bounds, next to a margin): ``+3.00 pts``,
    ``+0.302 dB``."""
    x = num(g)
    if x is None:
        return DASH
    if is_share(metric):
        return _signed(100 * x, 2 if fine else 1) + " pts"
    if is_db(metric):
        return _signed(x, 3 if fine else 1) + " dB"
    return f"{x:+.4g}"


def _signed(x: float, places: int) -> str:
    """``x`` with its sign at ``places`` decimals; a non-zero ``x`` too small for them keeps
    two significant digits (``+0.012``), so only an exact 0 reads as no difference."""
    if x != 0 and abs(x) < 0.5 * 10 ** -places:
        places = min(1 - math.floor(math.log10(abs(x))), MAX_PLACES)
    return f"{x:+.{places}f}"


MAX_PLACES = 6  # a difference below 5e-7 of its unit reads +0.000000: no difference worth a digit


def plain(v: Any) -> str:
    """Any cell: floats at 4 significant digits, None/NaN as ``—``, the rest as text."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return DASH
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, str) and v.lower() in ("none", "nan"):
        return DASH
    return str(v)


__all__ = ["CLUSTERS", "DASH", "ITEMS", "SHARES", "against", "count_key", "counted", "gain",
           "one_per_sample",
           "is_count", "is_db", "is_share", "num", "plain", "value"]
