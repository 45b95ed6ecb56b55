"""Saturation: how much of the evaluation data falls outside the calibrated ranges.

The QDQ graph clips silently; a range calibrated on other data can cap the quality
(a16_w16 stuck at 57 dB on held-out rows vs 90 dB on the calibration rows). The
evaluation data's streaming statistics (:func:`quantscope.calibrate.collect.calibrate`
on the evaluation rows) and each plan's encodings give, per tensor, the fraction of
values below and above the range. Tensors whose range leaves out a constant on purpose
(attention masks, ``Encodings.clamped``) are skipped: they clip by design.

A value counts as clipped when it lies more than half a grid step outside the range
(nearer is ordinary rounding). Fractions come from the 2,048-bin histogram (a bin counts as outside when its centre
is), so they are exact to one bin; a tensor whose minimum or maximum is outside always
counts at least one value.
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
        centres = (edges[:-1] + edges[1:]) / 2
        below = max(int(ts.hist[centres < lo].sum()), int(ts.min < lo)) / ts.count
        above = max(int(ts.hist[centres > hi].sum()), int(ts.max > hi)) / ts.count
        if below + above >= REPORT_MIN_FRACTION:
            out.append(Clipped(t, below, above, ts.min, ts.max, lo, hi))
    return tuple(sorted(out, key=lambda c: -(c.below + c.above)))


def saturation_note(rows: tuple[Clipped, ...], n_rows: int) -> str | None:
    if not rows:
        return None
    worst = ", ".join(f"{c.tensor} {c.below + c.above:.2%}" for c in rows[:4])
    return (f"saturation: {len(rows)} tensor(s) clip evaluation values outside their "
            f"calibrated range (on {n_rows} evaluation rows; worst: {worst}): calibrate on "
            "data like the deployment's, or widen those ranges")
