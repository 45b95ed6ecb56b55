"""Saturation: how much of the evaluation data falls outside the calibrated ranges.

The QDQ graph clips silently; a range calibrated on other data can cap the quality
(a16_w16 stuck at 57 dB on held-out rows vs 90 dB on the calibration rows). The
evaluation data's streaming statistics (:func:`quantscope.calibrate.collect.calibrate`
on the evaluation rows) and each plan's encodings give, per tensor, the fraction of
values below and above the range. Tensors whose range leaves out a constant on purpose
(attention masks, ``Encodings.clamped``) are skipped: they clip by design.

A value counts as clipped when it lies more than half a grid step outside the range
(nearer is ordinary rounding). Fractions come from the 2,048-bin histogram, counted on
values, never on bin centres: a side whose data extreme lies inside the range clips
nothing (a 16-bit half step is far narrower than a bin, so a bin that holds the range's
edge holds values inside it too), and on a side that does clip only bins lying wholly
outside count, so a fraction is a lower bound exact to one bin; a tensor whose minimum
or maximum is outside always counts at least one value.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from quantscope.types import Encodings, Stats

REPORT_MIN_FRACTION = 1e-4  # tensors clipping less than this are not listed


@dataclass(frozen=True)
class Clipped:
    tensor: str
    below: float  # fraction of the evaluation values under the range
    above: float
    data_min: float
    data_max: float
    range_min: float
    range_max: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def saturation(data_stats: Stats, encodings: Encodings) -> tuple[Clipped, ...]:
    """Tensors whose evaluation values exceed their encoding's range, worst first."""
    out = []
    for t, enc in encodings.activations.items():
        ts = data_stats.tensors.get(t)
        if ts is None or ts.count == 0 or t in encodings.clamped:
            continue
        rlo, rhi = enc.range()
        half = float(np.max(enc.scale)) / 2  # within half a step is rounding, not clipping
        lo, hi = float(np.min(rlo)) - half, float(np.max(rhi)) + half
        if ts.min >= lo and ts.max <= hi:
            continue
        edges = np.linspace(-ts.hist_range, ts.hist_range, ts.hist.size + 1)
        below = _outside(int(ts.hist[edges[1:] <= lo].sum()), ts.min < lo) / ts.count
        above = _outside(int(ts.hist[edges[:-1] >= hi].sum()), ts.max > hi) / ts.count
        if below + above >= REPORT_MIN_FRACTION:
            out.append(Clipped(t, below, above, ts.min, ts.max, lo, hi))
    return tuple(sorted(out, key=lambda c: -(c.below + c.above)))


def _outside(in_bins: int, extreme_outside: bool) -> int:
    """Values outside on one side: none when the data's extreme on that side is inside
    the range, else the wholly-outside bins' count (at least the extreme itself)."""
    return max(in_bins, 1) if extreme_outside else 0


def saturation_note(rows: tuple[Clipped, ...], n_rows: int) -> str | None:
    if not rows:
        return None
    worst = ", ".join(f"{c.tensor} {c.below + c.above:.2%}" for c in rows[:4])
    return (f"saturation: {len(rows)} tensor(s) clip evaluation values outside their "
            f"calibrated range (on {n_rows} evaluation rows; worst: {worst}): calibrate on "
            "data like the deployment's, or widen those ranges")
