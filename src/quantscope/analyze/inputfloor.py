"""A model input whose small values a linear grid reads as 0: a power spectrum fed as it is.

A speaker encoder trained on a power mel spectrogram (Resemblyzer's: no log, values from
1e-22 to 28 on speech, the median 2e-4) is fed that spectrogram as its input. Its 8-bit
grid has a step of 0.11: 85 % of the values read 0 (49 % at 16 bit), the encoder sees
silence where there was speech, and its embedding's cosine to FP32 falls to 0.72. The
layers inside are not where the error is, and no analysis of them says so; this finding
does (the same loss as :mod:`quantscope.analyze.logfloor`'s, at the device's input).

=================  =====================================================================
checked            every float graph input with a calibrated range from 0 up (a
                   magnitude: a power, an energy, a count)
reported when      at least :data:`MIN_SHARE` of its calibrated values are non-zero and
                   lie below half a step of its 8-bit grid (the histogram's bins wholly
                   below it, less the exact zeros the calibration counts: a lower bound;
                   exact zeros are on every grid and lose nothing)
figures            the step at 8 and 16 bit, the decades each keeps, the decades the
                   positive values span, the share read 0 at 8 and 16 bit
fix                16 bit on the groups that read it (the share it still loses said), or
                   an input the model takes log-compressed (a model trained on log-mel
                   features has none of this): no layer inside brings the values back
=================  =====================================================================

Findings are :class:`Outlier` records of kind ``"input_floor"``; :func:`input_floor_notes`
gives those that bind under a plan as result notes (``evaluate``, ``run``).
"""

from __future__ import annotations

import math

import numpy as np

from quantscope.analyze.outliers import Outlier
from quantscope.model.axes import range_source
from quantscope.model.load import Model
from quantscope.numerics import qparams
from quantscope.types import Groups, Plan, QuantScheme, Stats, TensorStats

MIN_SHARE = 0.1  # non-zero values read 0 at 8 bit: this share or more is a finding
KIND = "input_floor"


def _step(ts: TensorStats, bits: int, scheme: QuantScheme) -> float:
    enc = qparams(float(ts.min), float(ts.max), bits, signed=scheme.act_signed,
                  symmetric=scheme.act_symmetric)
    return float(enc.scale)


def lost_share(ts: TensorStats, limit: float) -> float | None:
    """The share of the calibrated values that are not 0 and lie in histogram bins wholly
    within ``[0, limit)`` (a lower bound: whole bins only; exact zeros left out); None
    when ``limit`` is finer than one bin (the histogram cannot tell: a 16-bit half step)."""
    hist = np.asarray(ts.hist, dtype=np.float64)
    total = hist.sum()
    if total <= 0 or ts.hist_range <= 0:
        return 0.0
    if limit < 2 * ts.hist_range / hist.size:
        return None
    edges = np.linspace(-ts.hist_range, ts.hist_range, hist.size + 1)
    inside = (edges[:-1] >= 0) & (edges[1:] <= limit)
    zeros = ts.floor_count if float(ts.min) == 0.0 else 0
    return max(float((hist[inside].sum() - zeros) / total), 0.0)


def _readers(model: Model, groups: Groups, name: str, known: frozenset[str]) -> list[str]:
    """The groups that read input ``name`` (through Reshape, Transpose, ...)."""
    return [g.name for g in groups.groups
            if any(range_source(model, t, known | {name}) == name for t in g.inputs)]


def _finding(name: str, ts: TensorStats, readers: list[str],
             scheme: QuantScheme) -> Outlier | None:
    hi = float(ts.max)
    if float(ts.min) < 0.0 or not hi > 0.0:
        return None
    steps = {b: _step(ts, b, scheme) for b in (8, 16)}
    lost = {b: lost_share(ts, steps[b] / 2) for b in (8, 16)}
    if lost[8] is None or lost[8] < MIN_SHARE:
        return None
    at16 = ("not counted at 16 bit: its half step is finer than the calibration histogram's "
            "bins" if lost[16] is None else f"{lost[16]:.0%} at 16 bit")
    low = ts.bulk_min if ts.bulk_min and ts.bulk_min > 0 else None
    span = (f"its positive values span {math.log10(hi / low):.1f} decades ({low:.3g} .. "
            f"{hi:.3g})" if low else f"its values reach {hi:.3g}")
    reason = (f"input '{name}' is read on a linear grid: one step is {steps[8]:.3g} at 8 bit "
              f"and {steps[16]:.3g} at 16 bit, and {span}; at least {lost[8]:.0%} of its "
              f"calibrated values are not 0 and read 0 at 8 bit ({at16}): "
              "the model sees nothing there (a power spectrum fed without its log)")
    who = ", ".join(f"'{r}'" for r in readers[:3]) or "the layers that read it"
    remedies = (f"keep {who} at 16-bit activations (the input then keeps the top "
                f"{math.log10(hi / steps[16]):.1f} decades"
                + ("" if lost[16] is None else f"; {lost[16]:.0%} of its values still read 0")
                + "; what lies below stays lost)",
                "give the model its input log-compressed (a model trained on log features "
                "does not lose them): no layer inside brings the values back")
    ratio = hi / (steps[8] / 2)
    return Outlier(name, readers[0] if readers else None, KIND, ratio, (), ts.channel_axis,
                   math.log2(ratio), reason, remedies)


def find_input_floors(model: Model, groups: Groups, stats: Stats,
                      scheme: QuantScheme | None = None) -> tuple[Outlier, ...]:
    """Graph inputs whose small values the grid reads 0 (module docstring)."""
    scheme = scheme or QuantScheme()
    known = frozenset(stats.tensors)
    found = []
    for name in groups.model_inputs:
        ts = stats.tensors.get(name)
        if ts is None or not ts.count:
            continue
        hit = _finding(name, ts, _readers(model, groups, name, known), scheme)
        if hit is not None:
            found.append(hit)
    return tuple(found)


def input_floor_notes(model: Model, stats: Stats, plan: Plan,
                      scheme: QuantScheme | None = None) -> list[str]:
    """The findings that bind under ``plan`` (the input's widest reading group at a width
    that still reads the values 0), as result notes with the fix."""
    from quantscope.model.groups import find_groups

    scheme = scheme or QuantScheme()
    groups = find_groups(model)
    notes = []
    for o in find_input_floors(model, groups, stats, scheme):
        known = frozenset(stats.tensors)
        bits = [plan.precision_of(g).act_bits for g in _readers(model, groups, o.tensor, known)]
        widest = max((b for b in bits if b is not None), default=None)
        ts = stats.tensors[o.tensor]
        lost = None if widest is None else lost_share(ts, _step(ts, widest, scheme) / 2)
        if lost is None or lost < MIN_SHARE:
            continue  # (not counted at 16 bit: the histogram's bins are coarser)
        notes.append(f"{o.reason}; fix: {'; or '.join(o.remedies)}")
    return notes


def floor_notes(model: Model, stats: Stats, plan: Plan,
                scheme: QuantScheme | None = None) -> list[str]:
    """Both floors' notes under ``plan``: a Log reading a linear grid (a spectrogram's,
    :func:`quantscope.analyze.logfloor.log_floor_notes`) and an input read 0 below one step."""
    from quantscope.analyze.logfloor import log_floor_notes

    return [*log_floor_notes(model, stats, plan, scheme),
            *input_floor_notes(model, stats, plan, scheme)]
