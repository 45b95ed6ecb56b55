"""A Log that reads a linear grid: the decades below one step are lost.

A spectrogram front-end (openWakeWord's ``melspectrogram.onnx``: an STFT as two Convs,
``Pow`` 2, ``Add``, the mel ``MatMul``, ``Clip`` at 1e-10, ``Log``) computes a power
spectrum whose values span ten decades (0.87 .. 1.4e10 on spoken clips) and then takes
its log. An integer grid on that power is linear: a value below half a step reads 0, and
the Log gives ``-inf`` (or the floor a Clip after it sets) where FP32 gives a finite
log. The grid keeps the top ``log10(2^bits)`` decades of its range: 2.4 at 8 bit, 4.8 at
16 bit. Promoting the layers to 16 bit cannot bring back the rest, so ``analyze`` says it
rather than let the figures (cosine 0.69 at a8_w8, 0.82 at a16_w16) stand unexplained.

=================  =====================================================================
checked            every ``Log`` whose input is (or carries unchanged, through Reshape,
                   Transpose, ...) a calibrated tensor with a positive max
reported when      the tensor's calibrated minimum lies below half a step of its 8-bit
                   grid (a minimum <= 0 counts as below): those values read 0
figures            the grid step at 8 and 16 bit, the decades each keeps
                   (``log10(max / step)``), the decades the data spans
                   (``log10(max / min)``, min > 0), and, from the calibration
                   histogram, the share of values below half the 8-bit step (a lower
                   bound: whole histogram bins only)
fix                compute the chain up to the Log in float on the host and feed the
                   device its output (the log-mel features), or keep the layers that
                   make the Log's input in float (16 bit when it keeps every decade)
=================  =====================================================================

:func:`log_floor_notes` gives the findings that bind under a plan as result notes
(``evaluate``, ``run``'s evaluate stage). Findings are :class:`Outlier` records of kind
``"log_floor"`` (``ratio``: the data's
max over half the 8-bit step; ``bits_lost``: log2 of it), listed with the outliers.
"""

from __future__ import annotations

import math

import numpy as np

from quantscope.analyze.outliers import Outlier
from quantscope.model.axes import range_source
from quantscope.model.load import Model
from quantscope.numerics import qparams
from quantscope.types import Groups, Plan, QuantScheme, Stats, TensorStats

BITS = (8, 16)


def _step(ts: TensorStats, bits: int, scheme: QuantScheme) -> float:
    enc = qparams(float(ts.min), float(ts.max), bits, signed=scheme.act_signed,
                  symmetric=scheme.act_symmetric)
    return float(enc.scale)


def _share_below(ts: TensorStats, limit: float) -> float:
    """The share of calibrated values in histogram bins wholly within [0, ``limit``)
    (a lower bound of the share below ``limit``)."""
    hist = np.asarray(ts.hist, dtype=np.float64)
    total = hist.sum()
    if total <= 0 or ts.hist_range <= 0:
        return 0.0
    edges = np.linspace(-ts.hist_range, ts.hist_range, hist.size + 1)
    inside = (edges[:-1] >= 0) & (edges[1:] <= limit)
    return float(hist[inside].sum() / total)


def _finding(node_name: str, src: str, ts: TensorStats, group: str | None,
             scheme: QuantScheme) -> Outlier | None:
    steps = {b: _step(ts, b, scheme) for b in BITS}
    lo, hi = float(ts.min), float(ts.max)
    if not hi > 0 or lo >= steps[8] / 2:
        return None
    kept = {b: math.log10(hi / steps[b]) for b in BITS}
    span = f"{math.log10(hi / lo):.1f} decades ({lo:.3g} .. {hi:.3g})" if lo > 0 else \
        f"down to {lo:.3g} (max {hi:.3g})"
    share = _share_below(ts, steps[8] / 2)
    reason = (
        f"Log '{node_name}' reads '{src}' on a linear grid: one step is {steps[8]:.3g} at 8 bit "
        f"and {steps[16]:.3g} at 16 bit, so the grid keeps the top {kept[8]:.1f} decades "
        f"(8 bit) or {kept[16]:.1f} (16 bit) of the values, which span {span}; a value below "
        "half a step reads 0 and its log is -inf (or the floor a Clip after it sets) where "
        "FP32's is finite"
        + (f" (at least {100 * share:.0f} % of the calibrated values at 8 bit)" if share else "")
    )
    whole = lo > 0 and steps[16] / 2 <= lo
    float_fix = ("compute the chain up to the Log in float on the host (a spectrogram "
                 "front-end: STFT, power, mel, Log) and feed the device the Log's output "
                 "(the log-mel features)")
    remedies = ((f"keep group '{group}' and the layers before it that make '{src}' at 16 bit "
                 "(it then keeps every decade)", float_fix) if whole and group else
                (float_fix, f"16 bit is not enough (it keeps {kept[16]:.1f} decades)"))
    ratio = hi / (steps[8] / 2)
    return Outlier(src, group, "log_floor", ratio, (), ts.channel_axis, math.log2(ratio),
                   reason, remedies)


def find_log_floors(model: Model, groups: Groups, stats: Stats,
                    scheme: QuantScheme | None = None) -> tuple[Outlier, ...]:
    """Log nodes whose quantized input loses its small values (module docstring)."""
    scheme = scheme or QuantScheme()
    owner = {t: g.name for g in groups.groups for t in g.outputs}
    known = frozenset(stats.tensors)
    found = []
    for node in model.graph.node:
        if node.op_type != "Log" or not node.input:
            continue
        src = range_source(model, node.input[0], known)
        ts = stats.tensors.get(src) if src is not None else None
        if ts is None or not ts.count:
            continue
        hit = _finding(node.name or node.output[0], src, ts, owner.get(src), scheme)
        if hit is not None:
            found.append(hit)
    return tuple(found)


def log_floor_notes(model: Model, stats: Stats, plan: Plan,
                    scheme: QuantScheme | None = None) -> list[str]:
    """The findings that bind under ``plan`` (the Log's input group quantized, at a width
    whose half step lies above the calibrated minimum), as result notes with the fix:
    ``evaluate`` says why a spectrogram reads NOT LIKE FP32 where ``analyze`` would."""
    from quantscope.model.groups import find_groups

    if not any(n.op_type == "Log" for n in model.graph.node):
        return []  # (most models: no grouping per plan measured)
    scheme = scheme or QuantScheme()
    notes = []
    for o in find_log_floors(model, find_groups(model), stats, scheme):
        bits = plan.precision_of(o.group).act_bits if o.group else None
        ts = stats.tensors[o.tensor]
        if bits is None or float(ts.min) >= _step(ts, bits, scheme) / 2:
            continue
        notes.append(f"{o.reason}; fix: {o.remedies[0]}")
    return notes
