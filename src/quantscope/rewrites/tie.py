"""How ``run --rewrites auto`` decides a tie of the headline (:mod:`quantscope.rewrites.auto`):
by the tiebreak figure (an SQNR in dB, higher is better), with its own noise.

==============  ========================================================================
parts           per independent unit, the signal and the noise power whose pooled ratio
                is the tiebreak (``10 log10(sum s / sum n)``: the embedding SQNR of a
                retrieval run is this over every query and document row; a query and its
                document come from one pair, so a unit is a pair, both rows' powers
                summed: :func:`pair_powers`,
                :attr:`quantscope.rewrites.auto.Measured.tiebreak_parts`)
interval        the gain ``after - before`` in dB, paired (the same units), with one-sided
                :data:`CONFIDENCE` bounds from its jackknife standard error over the units
                (leave one unit out, a pair's two rows together; Student t with
                ``units - 1`` degrees of freedom)
kept            only when the lower bound is above :data:`TIE_MARGIN`: the gain clears
                the margin beyond noise
dropped         otherwise; the given model stands (a rewrite adds layers). When the
                interval reaches above the margin the figures cannot separate the two
                choices: the reason says it is a tie on both figures and gives what the
                other choice measured, so a decision is never silent about it
no parts        (a tiebreak given as one figure): kept when it gains more than the margin,
                and the reason says there was no noise estimate
a share         a headline with no per-sample scores that is a share over n items
                (the count its task gives, :mod:`quantscope.tasks.shares`: detection F1,
                a class output's or image views' top-1 agreement, a score output's or a
                verification's decision agreement): its noise is the binomial standard
                error of the difference, ``sqrt(p(1-p)/n + q(1-q)/n)`` of the two
                figures (each over its own n), times the one-sided :data:`CONFIDENCE`
                normal quantile (:func:`share_noise`); a gain within it is a headline tie
==============  ========================================================================

Why: a bare threshold on a figure decides on noise at the threshold: two functionally
identical encoders measuring a tie of the headline with SQNR gains a hair either side of
0.1 dB took opposite decisions, and every later stage then planned a different graph.
With the interval both of such a pair fall on the same side (the gain cannot be told
from the margin: dropped, and said), and the boundary sits where the gain is measurably
past the margin.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from quantscope.plan.race import t_quantile
from quantscope.tasks.shares import (  # noqa: F401 - share_noise: the one rule, re-exported
    SHARE_CONFIDENCE,
    share_noise,
)
from quantscope.units import value

TIE_MARGIN = 0.1  # the tiebreak figure must gain more than this (dB for an SQNR)
CONFIDENCE = SHARE_CONFIDENCE  # one-sided: a gain is beyond noise when its lower bound is above 0

class Parts(NamedTuple):
    """Per independent unit: signal power, noise power, and what a unit is (``rows``, or
    ``pairs`` where a query row and its document row are one unit). A plain
    ``(signal, noise)`` tuple is read as rows."""

    signal: np.ndarray
    noise: np.ndarray
    unit: str = "rows"


def row_powers(ref: np.ndarray, test: np.ndarray) -> Parts:
    """Each row's signal power ``sum ref**2`` and noise power ``sum (ref - test)**2``
    (float64): the parts whose pooled ratio is :func:`quantscope.numerics.sqnr_db` of the
    whole arrays."""
    r = np.asarray(ref, np.float64).reshape(len(ref), -1)
    d = r - np.asarray(test, np.float64).reshape(len(test), -1)
    return Parts(np.sum(r * r, axis=1), np.sum(d * d, axis=1))


def pair_powers(ref: Sequence[np.ndarray], test: Sequence[np.ndarray]) -> Parts:
    """Each pair's powers where row ``i`` of every array in ``ref`` (the queries', the
    documents') belongs to pair ``i``: the rows' :func:`row_powers` summed across the
    arrays. The pooled figure is the same as over all rows; the jackknife then leaves out
    one pair (both its rows) at a time, not one row: a query and its document are not
    independent samples."""
    rows = [row_powers(r, t) for r, t in zip(ref, test, strict=True)]
    n = len(rows[0].signal)
    if any(len(p.signal) != n for p in rows):
        raise ValueError(f"pair_powers: arrays of {[len(p.signal) for p in rows]} rows")
    return Parts(np.sum([p.signal for p in rows], axis=0),
                 np.sum([p.noise for p in rows], axis=0), "pairs")


def pooled_db(parts: Parts) -> float:
    """``10 log10(sum signal / sum noise)``: the figure the parts pool to."""
    return 10.0 * float(np.log10(np.sum(parts[0]) / np.sum(parts[1])))


def gain_interval(after: Parts, before: Parts, *, margin: float = TIE_MARGIN,
                  confidence: float = CONFIDENCE) -> dict[str, Any] | None:
    """The pooled dB gain of ``after`` over ``before`` (paired rows) with one-sided
    ``confidence`` bounds from the jackknife, and the outcome against ``margin``:
    ``better`` (lower bound above it), ``not better`` (upper bound at or below it) or
    ``tie`` (the interval straddles it). None: fewer than 3 units, unequal units, or a
    zero power (an infinite figure: the point rule decides). ``unit`` in the result: what
    was left out one at a time (:class:`Parts`)."""
    s_a, n_a = (np.asarray(p, np.float64) for p in after[:2])
    s_b, n_b = (np.asarray(p, np.float64) for p in before[:2])
    unit = after.unit if isinstance(after, Parts) else "rows"
    rows = len(s_a)
    if rows < 3 or not (len(n_a) == len(s_b) == len(n_b) == rows):
        return None
    totals = np.array([s_a.sum(), n_a.sum(), s_b.sum(), n_b.sum()])
    left = totals[:, None] - np.stack([s_a, n_a, s_b, n_b])  # each row left out
    if not (np.all(totals > 0) and np.all(left > 0)):
        return None
    gain = 10.0 * float(np.log10(totals[0] * totals[3] / (totals[1] * totals[2])))
    loo = 10.0 * np.log10(left[0] * left[3] / (left[1] * left[2]))
    se = float(np.sqrt((rows - 1) / rows * np.sum((loo - loo.mean()) ** 2)))
    half = t_quantile(confidence, rows - 1) * se
    lower, upper = gain - half, gain + half
    outcome = "better" if lower > margin else "not better" if upper <= margin else "tie"
    return {"n": rows, "unit": unit, "difference": gain, "lower": lower, "upper": upper,
            "confidence": confidence, "margin": margin, "outcome": outcome}


def decide_tie(after: Any, before: Any, named: str) -> tuple[str, str | None,
                                                             dict[str, Any] | None]:
    """How the tiebreak decides a headline tie for the rewrite (``after``, a
    :class:`quantscope.rewrites.auto.Measured`, over ``before``): the outcome (``better``:
    keep it; ``not better``; ``tie``: the figures cannot separate the two), the figures
    in words (None: no tiebreak figures) and the tiebreak's interval (None: no parts)."""
    if after.tiebreak is None or before.tiebreak is None:
        return "not better", None, None
    tb = (f"{named} ({value(named, before.tiebreak, fine=True)} -> "
          f"{value(named, after.tiebreak, fine=True)})")
    iv = (gain_interval(after.tiebreak_parts, before.tiebreak_parts)
          if after.tiebreak_parts is not None and before.tiebreak_parts is not None else None)
    if iv is None:
        won = after.tiebreak - before.tiebreak > TIE_MARGIN
        return "better" if won else "not better", f"{tb} (no noise estimate)", None
    text = (f"gain {iv['difference']:+.3f} dB, one-sided {iv['confidence']:.0%} bounds "
            f"[{iv['lower']:+.3f}, {iv['upper']:+.3f}] over {iv['n']} {iv['unit']}, margin "
            f"{iv['margin']:g} dB")
    if iv["outcome"] == "better":
        return "better", f"{tb} beyond noise ({text})", iv
    if iv["outcome"] == "not better":
        return "not better", f"{tb} ({text})", iv
    return "tie", (f"{tb} cannot be told from the margin ({text}); the model without it "
                   f"kept (fewer layers), with it {named} measured "
                   f"{value(named, after.tiebreak, fine=True)}"), iv
