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
                ``units - 1`` degrees of freedom; computed in one place,
                :func:`quantscope.tasks.db_noise.gain_interval`, which the planner's
                choice between measured plans reads too)
kept            only when the lower bound is above :data:`TIE_MARGIN`: the gain clears
                the margin beyond noise
dropped         otherwise; the given model stands (a rewrite adds layers). When the
                interval reaches above the margin the figures cannot separate the two
                choices: the reason says it is a tie on both figures and gives what the
                other choice measured, so a decision is never silent about it
no parts        (a tiebreak given as one figure): kept when it gains more than the margin,
                and the reason says there was no noise estimate
left out        a share with its value recomputed with each unit left out where its items
                are not its units (face data's people: a verification pair spans two
                people, a person's pairs err together; :attr:`quantscope.rewrites.auto.Measured.left`):
                the paired jackknife of the difference over those units
                (:func:`paired_gain`, :func:`quantscope.tasks.db_noise.left_out_interval`,
                as the planner and ``run``'s held-out check read it), decided as the
                per-sample scores' interval; not the binomial below
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

from typing import Any

import numpy as np

from quantscope.numerics import t_quantile
from quantscope.tasks import db_noise
from quantscope.tasks.db_noise import (  # noqa: F401 - the one place of the dB noise, re-exported
    LeftOut,
    Parts,
    left_out_interval,
    pair_powers,
    pooled_db,
    row_powers,
)
from quantscope.tasks.shares import (  # noqa: F401 - share_noise: the one rule, re-exported
    SHARE_CONFIDENCE,
    share_noise,
)
from quantscope.units import gain as gain_text
from quantscope.units import of, value

TIE_MARGIN = 0.1  # the tiebreak figure must gain more than this (dB for an SQNR)
CONFIDENCE = SHARE_CONFIDENCE  # one-sided: a gain is beyond noise when its lower bound is above 0


def gain_interval(after: Parts, before: Parts, *, margin: float = TIE_MARGIN,
                  confidence: float = CONFIDENCE) -> dict[str, Any] | None:
    """:func:`quantscope.tasks.db_noise.gain_interval` against the tiebreak's margin
    (:data:`TIE_MARGIN`): the jackknife interval of the pooled dB gain, computed there
    (the planner's choice between measured plans reads the same bound)."""
    return db_noise.gain_interval(after, before, margin=margin, confidence=confidence)


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


def paired_interval(after: np.ndarray, before: np.ndarray, *, higher: bool = True,
                    confidence: float = CONFIDENCE) -> dict[str, Any]:
    """The mean per-sample gain of ``after`` over ``before`` (paired, in the metric's
    direction) with its one-sided ``confidence`` bounds (Student t, as
    :mod:`quantscope.plan.race` bounds a race) and the outcome: ``better`` (lower bound
    above 0), ``worse`` (upper bound below 0) or ``tie`` (within noise)."""
    d = np.asarray(after, np.float64) - np.asarray(before, np.float64)
    d = d if higher else -d
    n = len(d)
    mean = float(np.mean(d))
    half = t_quantile(confidence, n - 1) * float(np.std(d, ddof=1)) / float(np.sqrt(n))
    lower, upper = mean - half, mean + half
    outcome = "better" if lower > 0 else "worse" if upper < 0 else "tie"
    return {"n": n, "difference": mean, "lower": lower, "upper": upper,
            "confidence": confidence, "outcome": outcome}


def paired_gain(samples_after: np.ndarray | None, samples_before: np.ndarray | None,
                left_after: LeftOut | None, left_before: LeftOut | None, *, higher: bool
                ) -> dict[str, Any] | None:
    """The paired interval of a rewrite's gain in the headline: over per-sample scores
    (:func:`paired_interval`), else, for a share with its value per unit left out (module
    table, ``left out``), its jackknife over those units in the same form (``unit``
    added); None: neither (the binomial or the margin decides)."""
    if samples_after is not None and samples_before is not None \
            and len(samples_after) == len(samples_before) >= 2:
        return paired_interval(samples_after, samples_before, higher=higher)
    if left_after is None or left_before is None:
        return None
    a, b = (left_after, left_before) if higher else (left_before, left_after)
    iv = left_out_interval(a, b)
    if iv is None:
        return None
    lower, upper = float(iv["lower"]), float(iv["upper"])
    outcome = "better" if lower > 0 else "worse" if upper < 0 else "tie"
    return {"n": iv["n"], "unit": iv["unit"], "difference": float(iv["difference"]),
            "lower": lower, "upper": upper, "confidence": iv["confidence"],
            "outcome": outcome}


def _interval_text(iv: dict[str, Any], metric: str = "") -> str:
    """The paired interval in words, in ``metric``'s unit (a share in points)."""
    def g(x: float) -> str:
        return gain_text(metric, x, fine=True) if metric else f"{x:+.4g}"

    units = f"{iv['unit']}, each left out in turn" if iv.get("unit") else "paired samples"
    return (f"gain {g(iv['difference'])}, one-sided {iv['confidence']:.0%} bounds "
            f"[{g(iv['lower'])}, {g(iv['upper'])}] over n={of(iv['n'], units)}")
