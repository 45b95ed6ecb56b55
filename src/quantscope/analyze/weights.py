"""Degenerate weights: values that break vendor compilers or waste the integer grid.

=====================  ==================================================================
a16_low_byte_zero      every 16-bit weight code of the tensor has an all-zero low byte,
                       or the weights already lie exactly on an 8-bit grid: Hailo splits
                       an a16 conv into a high and a low 8-bit sub-layer; the low part is
                       all zero, its scale 0, and optimize() fails with "the exponent
                       [[nan]] is not in range" (field notes, wall 2)
zero_scale             a channel whose range is 0 gets no valid scale (0 or the 1e-12
                       floor); compilers that take log2(scale) fail on it
denormal_scale         a channel scale below the smallest normal float32
dead_channels          output channels whose weights are all zero
constant               every weight of the tensor has the same value
tiny_channels          channels whose max|w| is ``TINY_FACTOR`` below the median channel's:
                       a per-tensor scale rounds them to zero
=====================  ==================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from quantscope.model.load import Model
from quantscope.numerics import fake_quant, quantize, weight_encoding
from quantscope.types import Groups, QuantScheme

TINY_FACTOR = 1000.0
FLOAT32_TINY = float(np.finfo(np.float32).tiny)
MAX_LISTED = 16

REMEDIES = {
    "a16_low_byte_zero": "keep this layer at 8-bit weights (a16_w8 is not the fix: the "
    "split is by weight bits), or add tiny dither below the 8-bit step before compiling",
    "zero_scale": "remove or prune the dead channel, or give it a minimum range",
    "denormal_scale": "rescale the layer (fold a factor into the next layer) so weights are normal",
    "dead_channels": "prune the dead output channels (and the matching consumer inputs)",
    "constant": "fold the constant weight into a scalar op",
    "tiny_channels": "per-channel weight scales, or equalise channel ranges (cross-layer scaling)",
}


@dataclass(frozen=True)
class WeightIssue:
    group: str
    weight: str
    kind: str
    channels: tuple[int, ...]  # affected output channels (empty: the whole tensor)
    reason: str
    remedy: str


def _channels(w: np.ndarray, axis: int | None) -> np.ndarray:
    """[C, -1] view with output channels as rows (one row if per-tensor)."""
    if axis is None or w.ndim < 2:
        return w.reshape(1, -1)
    return np.moveaxis(w, axis % w.ndim, 0).reshape(w.shape[axis % w.ndim], -1)


def _issue(group: str, weight: str, kind: str, idx: np.ndarray, reason: str) -> WeightIssue:
    chans = tuple(int(i) for i in idx[:MAX_LISTED])
    return WeightIssue(group, weight, kind, chans, reason, REMEDIES[kind])


def _low_byte(w: np.ndarray, axis: int | None, scheme: QuantScheme) -> str | None:
    kw = {"axis": axis, "signed": scheme.weight_signed, "symmetric": scheme.weight_symmetric}
    codes = quantize(w, weight_encoding(w, 16, **kw))
    if np.any(codes) and np.all(codes % 256 == 0):
        return "every 16-bit code has an all-zero low byte"
    enc8 = weight_encoding(w, 8, **kw)
    if np.any(w) and np.allclose(fake_quant(w, enc8), w, rtol=1e-6, atol=0.0):
        return "the weights lie exactly on an 8-bit grid (an already-quantized export)"
    return None


def check_weight(
    group: str, name: str, w: np.ndarray, axis: int | None, scheme: QuantScheme
) -> list[WeightIssue]:
    """Every degenerate case of one weight tensor (see the module docstring)."""
    w = np.asarray(w, dtype=np.float32)
    out: list[WeightIssue] = []
    if w.size > 1 and w.min() == w.max():
        return [
            _issue(group, name, "constant", np.array([]), f"all {w.size} weights = {w.flat[0]:.6g}")
        ]
    rows = _channels(w, axis if scheme.weight_per_channel else None)
    amax = np.abs(_channels(w, axis)).max(axis=1)
    dead = np.flatnonzero(amax == 0)
    if dead.size:
        out.append(
            _issue(
                group,
                name,
                "dead_channels",
                dead,
                f"{dead.size} of {amax.size} output channels are all zero",
            )
        )
        out.append(
            _issue(
                group,
                name,
                "zero_scale",
                dead,
                f"{dead.size} channel range(s) are 0: no valid scale",
            )
        )
    scale = np.abs(rows).max(axis=1) / 127.0
    denorm = np.flatnonzero((scale > 0) & (scale < FLOAT32_TINY))
    if denorm.size:
        out.append(
            _issue(
                group,
                name,
                "denormal_scale",
                denorm,
                f"{denorm.size} channel scale(s) below {FLOAT32_TINY:.3g}",
            )
        )
    live = amax[amax > 0]
    if live.size >= 2:
        tiny = np.flatnonzero((amax > 0) & (amax * TINY_FACTOR < np.median(live)))
        if tiny.size:
            out.append(
                _issue(
                    group,
                    name,
                    "tiny_channels",
                    tiny,
                    f"{tiny.size} channel(s) have max|w| over {TINY_FACTOR:g}x "
                    "below the median channel",
                )
            )
    why = _low_byte(w, axis if scheme.weight_per_channel else None, scheme)
    if why:
        out.append(_issue(group, name, "a16_low_byte_zero", np.array([]), why))
    return out


def find_weight_issues(
    model: Model, groups: Groups, scheme: QuantScheme | None = None
) -> tuple[WeightIssue, ...]:
    """Degenerate-weight findings for every weighted group, in graph order."""
    scheme = scheme or QuantScheme()
    found: list[WeightIssue] = []
    for g in groups.groups:
        if g.weight is None:
            continue
        w = model.initializer_array(g.weight)
        axis = g.weight_axis % w.ndim if g.weight_axis is not None and w.ndim > 1 else None
        found.extend(check_weight(g.name, g.weight, w, axis, scheme))
    return tuple(found)
