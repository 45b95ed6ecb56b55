"""Mixed scales: one grid that spans tensors of different scales.

A Concat's output has ONE encoding on an integer NPU, so every input is requantized to
the grid of the union of their ranges. When one input's whole range is a few grid steps
of that grid, its values collapse (a YOLOv8 head concatenates boxes of 0-325 px with
class probabilities of 0-0.73: at 8 bit the step is ~1.27 and every probability rounds to
0). The whole-output SQNR hardly notices, since the large input carries the power.

=================  =====================================================================
checked            every Concat with a float output: each input's calibrated range (the
                   statistics of the tensor it carries unchanged, through Reshape /
                   Transpose / ...: :func:`quantscope.model.axes.range_source`; a constant
                   input's own values) against the output grid, i.e. the union of the
                   input ranges on the target's activation grid, at 8 and at 16 bit
reported when      an input's range spans fewer than ``MIN_LEVELS`` steps of the 8-bit
                   output grid (its values keep fewer than log2(``MIN_LEVELS``) bits)
also checked       every graph output not reported so: its channels (the graph's channel
                   axis, :mod:`quantscope.model.axes`) by max|x|, when some but not all
                   span fewer than ``MIN_LEVELS`` steps of its 8-bit grid (one op, e.g. a
                   Mul by per-row strides, can mix scales as a Concat does)
not counted        a dead channel or input: its span within float32's resolution
                   (``DEAD``) of the largest one's; it carries nothing a grid can lose
                   (a finding names how many channels it ignored so)
fix                keep the Concat's output at 16 bit when that gives the input
                   ``MIN_LEVELS`` steps or more; else (and always as the alternative) split
                   the output into one output per scale, each with its own grid
=================  =====================================================================

An Add of two branches is not reported: its output's own scale is what the grid must
hold, and the small branch is small in FP32 too. Findings are :class:`Outlier` records of
kind ``"mixed_scale"`` (``ratio``: the output span over the smallest input's span;
``channels``: that input's positions along the Concat axis when shapes tell them;
``channel_axis``: the Concat axis), so the JSON, the console and the report show them
with the other outliers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx

from quantscope.analyze.outliers import MAX_LISTED, Outlier
from quantscope.model.axes import range_source
from quantscope.model.load import FLOAT_TYPES, Model
from quantscope.numerics import DEAD, qparams
from quantscope.types import Groups, QuantScheme, Stats

MIN_LEVELS = 8.0  # an input spanning fewer steps of the 8-bit output grid keeps < 3 bits
MAX_CHANNELS = 4096  # a graph output with more "channels" is not read channel by channel
BITS = (8, 16)


@dataclass(frozen=True)
class _Part:
    tensor: str
    lo: float
    hi: float
    size: int | None  # extent along the Concat axis, if the shape tells it

    @property
    def span(self) -> float:
        return max(self.hi, 0.0) - min(self.lo, 0.0)


def _parts(node: onnx.NodeProto, model: Model, stats: Stats, axis: int) -> list[_Part] | None:
    inits = model.initializers()
    shapes = model.value_shapes()
    known = frozenset(stats.tensors)
    parts = []
    for name in node.input:
        if not name:
            continue
        if name in inits:
            arr = np.asarray(onnx.numpy_helper.to_array(inits[name]), dtype=np.float64)
            if arr.size == 0:
                continue
            lo, hi = float(arr.min()), float(arr.max())
        else:
            src = range_source(model, name, known)
            ts = stats.tensors.get(src) if src is not None else None
            if ts is None or not ts.count:
                return None  # a range we cannot see: no verdict on this Concat
            lo, hi = float(ts.min), float(ts.max)
        shape = shapes.get(name)
        size = shape[axis] if shape is not None and len(shape) > axis else None
        parts.append(_Part(name, lo, hi, size if isinstance(size, int) else None))
    return parts


def _step(lo: float, hi: float, bits: int, scheme: QuantScheme) -> float:
    enc = qparams(lo, hi, bits, signed=scheme.act_signed, symmetric=scheme.act_symmetric)
    return float(enc.scale)


def _positions(parts: list[_Part], small: _Part) -> tuple[int, ...]:
    """``small``'s indices along the Concat axis (first ``MAX_LISTED``), if sizes are known."""
    start = 0
    for p in parts:
        if p.size is None:
            return ()
        if p is small:
            return tuple(range(start, start + min(p.size, MAX_LISTED)))
        start += p.size
    return ()


def _finding(node: onnx.NodeProto, parts: list[_Part], axis: int, group: str | None,
             scheme: QuantScheme, own: tuple[float, float] | None) -> Outlier | None:
    """``own``: the Concat output's calibrated range (its real grid), else the union."""
    lo, hi = own or (min(p.lo for p in parts), max(p.hi for p in parts))
    steps = {b: _step(lo, hi, b, scheme) for b in BITS}
    large = max(parts, key=lambda p: p.span)
    live = [p for p in parts if p.span > DEAD * large.span]
    small = min(live, key=lambda p: p.span)
    if small is large:
        return None
    levels = {b: small.span / steps[b] for b in BITS}
    if levels[8] >= MIN_LEVELS:
        return None
    out = node.output[0]
    ratio = (max(hi, 0.0) - min(lo, 0.0)) / small.span
    below = "below one grid step" if levels[8] < 1 else f"{levels[8]:.1f} grid steps"
    reason = (
        f"one grid spans tensors of different scales: Concat '{node.name}' (axis {axis}) -> "
        f"'{out}' joins {', '.join(f'{p.tensor} [{p.lo:.3g}, {p.hi:.3g}]' for p in parts)}; "
        f"the output grid step is {steps[8]:.3g} at 8 bit and {steps[16]:.3g} at 16 bit, so "
        f"the whole range of {small.tensor} is {below} at 8 bit ({levels[16]:.0f} steps at 16 bit)"
        + (": its values collapse to one or two codes" if levels[8] < 2 else "")
    )
    split = (f"split '{out}' into one output per scale (e.g. {large.tensor} and "
             f"{small.tensor} as separate graph outputs, each with its own grid)")
    if levels[16] >= MIN_LEVELS and group is not None:
        remedies: tuple[str, ...] = (
            f"keep group '{group}' (the Concat) at 16-bit activations (a16_w16): "
            f"{small.tensor} then spans {levels[16]:.0f} steps", split)
    else:
        remedies = (split, f"16 bit is not enough ({levels[16]:.1f} steps at 16 bit)")
    return Outlier(out, group, "mixed_scale", ratio, _positions(parts, small), axis,
                   math.log2(ratio), reason, remedies)


def find_mixed_scales(model: Model, groups: Groups, stats: Stats,
                      scheme: QuantScheme | None = None) -> tuple[Outlier, ...]:
    """Concats whose smallest input collapses on the output's grid (module docstring),
    worst span ratio first."""
    scheme = scheme or QuantScheme()
    owner = {n: g.name for g in groups.groups for n in g.nodes}
    types = model.value_types()
    shapes = model.value_shapes()
    found = []
    for node in model.graph.node:
        if node.op_type != "Concat" or not node.output:
            continue
        out = node.output[0]
        if types.get(out) not in FLOAT_TYPES:
            continue
        rank = len(shapes[out]) if out in shapes else None
        axis = next((int(a.i) for a in node.attribute if a.name == "axis"), 0)
        axis = axis % rank if rank else axis
        parts = _parts(node, model, stats, axis)
        if not parts or len(parts) < 2:
            continue
        ts = stats.tensors.get(out)
        own = (float(ts.min), float(ts.max)) if ts is not None and ts.count else None
        hit = _finding(node, parts, axis, owner.get(node.name), scheme, own)
        if hit is not None:
            found.append(hit)
    seen = {o.tensor for o in found}
    found += [o for o in (_output_channels(model, groups, stats, t, scheme)
                          for t in model.output_names() if t not in seen) if o is not None]
    return tuple(sorted(found, key=lambda o: -o.ratio))


def _output_channels(model: Model, groups: Groups, stats: Stats, out: str,
                     scheme: QuantScheme) -> Outlier | None:
    """A graph output whose own channels (along the axis the graph tells, as calibrated)
    differ in scale so much that some span fewer than ``MIN_LEVELS`` steps of its 8-bit
    grid: the same loss as a Concat's, made by one op (e.g. a Mul by per-row strides).
    A channel's span is estimated by its max|x|."""
    src = range_source(model, out, frozenset(stats.tensors))
    ts = stats.tensors.get(src) if src is not None else None
    if ts is None or not ts.count or src != out:
        return None
    a = np.asarray(ts.channel_absmax, dtype=np.float64).ravel()
    if a.size < 2 or a.size > MAX_CHANNELS or not a.max() > 0:
        return None
    steps = {b: _step(float(ts.min), float(ts.max), b, scheme) for b in BITS}
    dead = int(np.count_nonzero(a <= DEAD * a.max()))
    small = np.flatnonzero((a > DEAD * a.max()) & (a / steps[8] < MIN_LEVELS))
    if small.size == 0 or small.size == a.size:
        return None
    worst = float(a[small].min())
    levels = {b: worst / steps[b] for b in BITS}
    chans = tuple(int(i) for i in small[np.argsort(a[small])][:MAX_LISTED])
    owner = {t: g.name for g in groups.groups for t in g.outputs}
    group = owner.get(out)
    ratio = float(a.max()) / worst
    reason = (
        f"one grid spans channels of different scales: output '{out}' (channel axis "
        f"{ts.channel_axis}) has {small.size} of {a.size} channels with max|x| below "
        f"{MIN_LEVELS:g} steps of its grid (step {steps[8]:.3g} at 8 bit, {steps[16]:.3g} at "
        f"16 bit; channels {', '.join(map(str, chans[:6]))}, smallest max|x| {worst:.3g} "
        f"against {float(a.max()):.3g}), so those channels keep "
        f"{max(levels[8], 0):.1f} steps at 8 bit ({levels[16]:.0f} at 16 bit)"
        + (f"; {dead} dead channel{'s' if dead > 1 else ''} (max|x| within float32 "
           "precision of 0 against the largest) ignored" if dead else "")
    )
    split = (f"split '{out}' into one output per scale (its small channels as a separate "
             "graph output, each with its own grid)")
    remedies: tuple[str, ...] = (
        (f"keep group '{group}' at 16-bit activations (a16_w16): the small channels then "
         f"span {levels[16]:.0f} steps", split) if levels[16] >= MIN_LEVELS and group
        else (split, f"16 bit is not enough ({levels[16]:.1f} steps at 16 bit)"))
    return Outlier(out, group, "mixed_scale", ratio, chans, ts.channel_axis,
                   math.log2(ratio), reason, remedies)
