"""encode(): statistics + plan -> per-tensor encodings (pure, no ORT).

Which tensor gets which bit width
=================================  ==================================================
group output                       the group's activation bits (none if ``float``)
model input                        the widest activation bits among the groups that
                                   read it, directly or through pass-through ops (an
                                   NHWC input's Transpose): an NPU converts it once
weight of a weighted group         the group's weight bits, per channel if the scheme
                                   says so
masked attention scores            the range of the *unmasked* scores, extended down
                                   by ``MASK_MARGIN``: the additive mask constant
                                   (dtype min) then saturates to the grid minimum,
                                   which still zeroes its softmax weight (exp(-12)
                                   ~ 6e-6 per masked token) instead of wiping out the
                                   range of every real score
a constant far below the rest      (any other form of mask: masked_fill ``Where``,
                                   -1e4/-1e9 constants, causal masks, a position bias
                                   Add before the mask; or the same symptom outside
                                   attention) found in the statistics: a negative
                                   constant (a floor at or above 0 is inside every
                                   grid: a saturated gate, a ReLU), at least
                                   ``SENTINEL_MIN_FRACTION`` of the values sit in the
                                   floor cluster (``TensorStats.floor_count``),
                                   ``SENTINEL_GAP`` spans of the rest below it. The range is the rest's (``bulk_min`` ..
                                   max), extended by ``MASK_MARGIN`` when the tensor
                                   feeds a Softmax (or rowscale's Exp); the constant saturates to the grid
                                   minimum. A note names each tensor.
=================================  ==================================================
"""

from __future__ import annotations

import numpy as np

from quantscope.emulate.ranges import lookup_note, tensor_range
from quantscope.model.groups import find_mask_adds
from quantscope.model.load import Model
from quantscope.numerics import qparams, weight_encoding
from quantscope.types import (
    Encoding,
    Encodings,
    Groups,
    Plan,
    QuantScheme,
    QuantscopeError,
    Stats,
    TensorStats,
)

MASK_MARGIN = 12.0  # logits below the smallest real score that masked positions get
SENTINEL_GAP = 100.0  # a floor constant this many spans of the rest below it ...
SENTINEL_MIN_FRACTION = 1e-3  # ... holding at least this fraction of the values
# ... and nearly one value: spread over at most this many spans of the rest (the scores
# added to a fill), or this fraction of its magnitude (float32 rounding of -1e9 + scores)
FILL_SPREAD_SPANS = 4.0
FILL_SPREAD_RELATIVE = 1e-3


def sentinel_floor(ts: TensorStats) -> bool:
    """True when a negative constant far below the rest dominates the tensor's range (a
    mask fill): the floor cluster is nearly one value (a channel of real values far below
    the rest spreads, and keeps its range). A floor at or above 0 never is: every grid holds 0 (a saturated gate's
    0/1, a ReLU's 0 under constant data). The rest's scale is its span or its magnitude,
    so a rest that is one value (constant data) does not make any gap look infinite."""
    if ts.bulk_min is None or ts.floor_count < SENTINEL_MIN_FRACTION * max(ts.count, 1):
        return False
    if ts.lookup is not None:  # a lookup's range is its table's, every row kept
        return False
    if ts.min >= 0:
        return False
    span = max(ts.max - ts.bulk_min, abs(ts.max), abs(ts.bulk_min), 1e-12)
    if ts.floor_max is not None:  # a real outlier channel (-559 .. -355) is no fill
        spread = ts.floor_max - ts.min
        if spread > max(FILL_SPREAD_SPANS * span, FILL_SPREAD_RELATIVE * abs(ts.min)):
            return False
    return ts.min < ts.bulk_min - SENTINEL_GAP * span


def _zero_tensors(stats: Stats, names: list[str]) -> list[str]:
    """Tensors whose every calibration value is exactly 0."""
    out = []
    for t in names:
        ts = stats.tensors.get(t)
        if ts is not None and ts.count and ts.min == 0.0 and ts.max == 0.0:
            out.append(t)
    return out


def _data_notes(stats: Stats, acts: list[str]) -> list[str]:
    """What the statistics say of the quantized tensors: lookups whose range is their
    table's (:func:`quantscope.emulate.ranges.lookup_note`), tensors always 0."""
    notes = [n for n in [lookup_note({t: stats.tensors[t] for t in acts if t in stats.tensors})]
             if n]
    zeros = _zero_tensors(stats, acts)
    if zeros:
        notes.append(
            f"every calibration value is 0 in {len(zeros)} tensor(s) "
            f"({', '.join(zeros[:6])}{', …' if len(zeros) > 6 else ''}): the data never "
            "exercises them, so their grid is a guess; calibrate on data that does"
        )
    return notes


def _act_encoding(lo: float, hi: float, bits: int, scheme: QuantScheme) -> Encoding:
    return qparams(lo, hi, bits, signed=scheme.act_signed, symmetric=scheme.act_symmetric)


def _stat(stats: Stats, name: str) -> object:
    try:
        return stats.tensors[name]
    except KeyError:
        raise QuantscopeError(
            f"the stats file has no statistics for tensor '{name}': it was calibrated on "
            "another model; run 'quantscope calibrate' on this model again"
        ) from None


def encode(
    model: Model,
    groups: Groups,
    stats: Stats,
    plan: Plan,
    *,
    scheme: QuantScheme,
    method: str | None = None,
) -> Encodings:
    """Encodings for every tensor the plan quantizes, in ``scheme`` (required: the target's)."""
    method = method or stats.method
    per_tensor = dict(plan.ranges)
    pinned = dict(plan.pinned)  # learned ranges (finetune): used as they are
    masks = {m.output: m for m in find_mask_adds(model)}
    acts: dict[str, Encoding] = {}
    notes: list[str] = []
    floors: list[tuple[str, str]] = []
    floored: set[str] = set()
    # a Softmax, or the Exp that rowscale writes in its place
    softmax_inputs = {n.input[0] for n in model.graph.node if n.op_type in ("Softmax", "Exp")}
    for t, bits in groups.input_bits(plan).items():
        if t in pinned:
            acts[t] = _act_encoding(*pinned[t], bits, scheme)
            continue
        ts = _stat(stats, t)
        acts[t] = _act_encoding(*tensor_range(ts, per_tensor.get(t, method), bits), bits, scheme)
    for g in groups.groups:
        bits = plan.precision_of(g.name).act_bits
        if bits is None:
            continue
        for t in g.outputs:
            if t in pinned:
                acts[t] = _act_encoding(*pinned[t], bits, scheme)
                continue
            if t in masks:
                s = _stat(stats, masks[t].scores)
                lo, hi = tensor_range(s, per_tensor.get(t, method), bits)
                acts[t] = _act_encoding(lo - MASK_MARGIN, hi, bits, scheme)
                continue
            ts = _stat(stats, t)
            if sentinel_floor(ts):
                margin = MASK_MARGIN if t in softmax_inputs else 0.0
                acts[t] = _act_encoding(ts.bulk_min - margin, ts.max, bits, scheme)
                floored.add(t)
                floors.append((t, f"{t} (constant {ts.min:.3g} at "
                              f"{ts.floor_count / max(ts.count, 1):.1%} of its values; "
                              f"rest from {ts.bulk_min:.4g})"))
                continue
            m = per_tensor.get(t, method)
            acts[t] = _act_encoding(*tensor_range(ts, m, bits), bits, scheme)
    for before_softmax in (True, False):
        some = [f for t, f in floors if (t in softmax_inputs) is before_softmax]
        if not some:
            continue
        listed = "; ".join(some[:6]) + ("; …" if len(some) > 6 else "")
        notes.append(
            f"a constant far below the rest (a mask fill before a Softmax) in {len(some)} "
            f"tensor(s): {listed}: their range "
            f"is the rest's extended by {MASK_MARGIN:g}, so the fill saturates to the grid "
            "minimum (its Softmax weight stays ~0)" if before_softmax else
            f"a constant far below the rest in {len(some)} tensor(s): {listed}: their "
            "range is the rest's, so the constant saturates to the grid minimum"
        )
    notes.extend(_data_notes(stats, list(acts)))
    if masks and any(t in acts for t in masks):
        notes.append(
            f"attention mask: {len(masks)} additive-mask Add(s) found; their output range is "
            f"the unmasked scores' range extended by {MASK_MARGIN:g} below, so the mask "
            "constant saturates to the grid minimum instead of dominating the range"
        )
    weights = _weight_encodings(model, groups, plan, scheme)
    clamped = tuple(t for t in acts if t in masks or t in floored)
    return Encodings(activations=acts, weights=weights, scheme=scheme, notes=tuple(notes),
                     clamped=clamped)


def _weight_encodings(
    model: Model, groups: Groups, plan: Plan, scheme: QuantScheme
) -> dict[str, Encoding]:
    out: dict[str, Encoding] = {}
    for g in groups.groups:
        bits = plan.precision_of(g.name).weight_bits
        if bits is None or g.weight is None:
            continue
        w = model.initializer_array(g.weight).astype(np.float32)
        axis = None
        if scheme.weight_per_channel and g.weight_axis is not None and w.ndim > 1:
            axis = g.weight_axis % w.ndim
        out[g.weight] = weight_encoding(
            w, bits, axis=axis, signed=scheme.weight_signed, symmetric=scheme.weight_symmetric
        )
    return out
