"""Streaming observers: running min/max, a range-doubling histogram, per-channel |max|.

Memory is constant in the number of batches: every batch is folded into fixed-size
accumulators and dropped. Batches may differ in every dimension but the channel one
(variable sequence lengths are fine).

The histogram covers a symmetric range ``[-r, r]`` with ``HIST_BINS`` equal bins, ``r`` a
power of two. When a batch exceeds ``r`` the range doubles and pairs of old bins merge
into one new bin exactly (old ``[-r, r]`` is the middle half of new ``[-2r, 2r]``), so no
counts are smeared and the result does not depend on batch order beyond that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from quantscope.types import TensorStats

HIST_BINS = 2048
MASK_FILL = float(np.finfo(np.float32).min)  # an eager export's mask fill: how -inf is seen
HIST_LIMIT = 2.0**64  # beyond this (e.g. an additive mask's dtype minimum) values saturate


def channel_axis(ndim: int, graph_axis: int | None = None) -> int:
    """Channel axis used for per-channel statistics: the one the graph tells
    (:func:`quantscope.model.axes.channel_axes`: a Conv output's 1, a Concat's axis, a
    token tensor's last) when it fits the rank; else 1 for rank 4, else the last axis."""
    if graph_axis is not None and 0 <= graph_axis < ndim:
        return graph_axis
    return 1 if ndim == 4 else max(ndim - 1, 0)


@dataclass
class Observer:
    """Mutable accumulator for one tensor; :meth:`freeze` returns the typed stats.
    ``graph_axis``: the tensor's channel axis from the graph, if known. ``mask``: a
    tensor whose ``-inf`` is an attention mask's fill by design (an SDPA export's masked
    keys: the mask Add's output, what a Softmax or Exp reads), not a fault: not counted as
    ``nonfinite``, and observed as the float32 minimum, the fill an eager export's mask
    writes, so the floor cluster holds it and the encoding keeps the real values' range
    (``emulate.encode.sentinel_floor``) instead of taking the fill for 0."""

    name: str
    graph_axis: int | None = None
    mask: bool = False
    lo: float = math.inf
    hi: float = -math.inf
    count: int = 0
    nonfinite: int = 0
    hist: np.ndarray | None = None
    r: float = 0.0
    chan: np.ndarray | None = None
    axis: int = -1
    bulk_lo: float = math.inf  # smallest value above ``lo``
    floor_count: int = 0  # values exactly at ``lo``
    floor_hi: float = -math.inf  # the largest value of the floor cluster

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x)
        if x.size == 0 or not np.issubdtype(x.dtype, np.floating):
            return
        x = x.astype(np.float32, copy=False)
        axis = channel_axis(x.ndim, self.graph_axis)
        top, bottom = _channel_extremes(x, axis)  # the tensor's min and max from these:
        lo, hi = float(bottom.min()), float(top.max())  # two passes fewer
        if not (math.isfinite(lo) and math.isfinite(hi)):  # a NaN or inf makes one so
            finite = np.isfinite(x)
            fill = (x == -np.inf) if self.mask else np.zeros(x.shape, bool)
            self.nonfinite += int(np.count_nonzero(~finite & ~fill))
            x = np.where(finite, x, np.where(fill, MASK_FILL, 0.0)).astype(np.float32)
            top, bottom = _channel_extremes(x, axis)
            lo, hi = float(bottom.min()), float(top.max())
        self.count += x.size
        self._update_floor(x, lo)
        self.lo = min(self.lo, lo)
        self.hi = max(self.hi, hi)
        self._update_hist(x)
        self._update_channels(top, bottom, axis)

    def _update_floor(self, x: np.ndarray, m: float) -> None:
        """Floor cluster: values within a factor 2 of a negative minimum ``m`` (a mask fill
        and what was added to it), or exactly at a non-negative one; ``bulk_lo`` is the
        smallest value above it. Batches are merged cluster by cluster."""
        k, above, top = floor_cluster(x, m)
        if m < self.lo:
            same = self.lo <= (m / 2 if m < 0 else m)  # the old floor is in the new cluster
            self.floor_count = k + (self.floor_count if same else 0)
            self.bulk_lo = min(above, self.bulk_lo if same else self.lo)
            self.floor_hi = max(top, self.floor_hi) if same else top
        elif m <= (self.lo / 2 if self.lo < 0 else self.lo):
            self.floor_count += k
            self.bulk_lo = min(self.bulk_lo, above)
            self.floor_hi = max(self.floor_hi, top)
        else:
            self.bulk_lo = min(self.bulk_lo, m)

    def _update_hist(self, x: np.ndarray) -> None:
        amax = min(max(abs(self.lo), abs(self.hi)), HIST_LIMIT)
        if self.hist is None:
            self.r = 2.0 ** math.ceil(math.log2(amax)) if amax > 0 else 1.0
            self.hist = np.zeros(HIST_BINS, dtype=np.int64)
        while amax > self.r:
            merged = self.hist.reshape(-1, 2).sum(axis=1)
            self.hist = np.zeros(HIST_BINS, dtype=np.int64)
            self.hist[HIST_BINS // 4 : HIST_BINS // 4 + merged.size] = merged
            self.r *= 2.0
        if amax >= HIST_LIMIT:
            x = np.clip(x, -HIST_LIMIT, HIST_LIMIT)
        self.hist += bin_counts(x, self.r)

    def _update_channels(self, top: np.ndarray, bottom: np.ndarray, axis: int) -> None:
        # max |x| per channel without an |x| copy: max(max x, -min x), -0 made 0
        per = np.maximum(top, -bottom) + np.float32(0.0)
        if self.chan is None or self.chan.shape != per.shape:
            if self.chan is not None:  # channel count changed: keep only a global max
                per = np.array([max(float(self.chan.max()), float(per.max()))])
            self.chan = per.astype(np.float32)
            self.axis = axis
        else:
            np.maximum(self.chan, per, out=self.chan)

    def bound(self, lo: float, hi: float, per_channel: np.ndarray) -> None:
        """Widen the range to ``lo .. hi`` and the channel maxima to ``per_channel`` (one
        per channel, or one for all) without counting values: a bound the data need not
        reach (a lookup's table, :mod:`quantscope.calibrate.lookup`). The histogram's
        range grows to hold it; its counts stay the data's."""
        if self.count == 0:
            return
        self.lo, self.hi = min(self.lo, lo), max(self.hi, hi)
        self._update_hist(np.zeros(0, np.float32))
        if self.chan is not None:
            np.maximum(self.chan, per_channel if per_channel.size == self.chan.size
                       else np.float32(per_channel.max()), out=self.chan)

    def freeze(self) -> TensorStats:
        empty = self.count == 0
        return TensorStats(
            name=self.name,
            min=0.0 if empty else self.lo,
            max=0.0 if empty else self.hi,
            count=self.count,
            hist=self.hist if self.hist is not None else np.zeros(HIST_BINS, np.int64),
            hist_range=self.r or 1.0,
            channel_absmax=self.chan if self.chan is not None else np.zeros(1, np.float32),
            channel_axis=self.axis,
            bulk_min=None if empty or not math.isfinite(self.bulk_lo) else self.bulk_lo,
            floor_count=self.floor_count,
            floor_max=None if empty or not math.isfinite(self.floor_hi) else self.floor_hi,
            nonfinite=self.nonfinite,
        )


def _channel_extremes(x: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """The max and the min of ``x`` per channel along ``axis`` (one value for a scalar)."""
    if x.ndim == 0:
        return x.reshape(1), x.reshape(1)
    rest = tuple(a for a in range(x.ndim) if a != axis)
    return x.max(axis=rest), x.min(axis=rest)


_SIGN = np.int32(-(2**31))
_TOP = np.uint32(2**31)


def _keys(x: np.ndarray) -> np.ndarray:
    """Unsigned keys in the order of the float32 values (``-0.0`` just below ``+0.0``):
    the sign bit set on a positive value, every bit flipped on a negative one."""
    b = np.ascontiguousarray(x, dtype=np.float32).reshape(-1).view(np.int32)
    return (b ^ ((b >> 31) | _SIGN)).view(np.uint32)


def _value(key: np.uint32) -> float:
    bits = key ^ _TOP if key & _TOP else ~key
    return float(np.array([bits], np.uint32).view(np.float32)[0])


def floor_cluster(x: np.ndarray, m: float) -> tuple[int, float, float]:
    """The floor cluster of finite ``x`` with minimum ``m``: how many values are in it
    (those within a factor 2 of a negative ``m``, or exactly at a non-negative one), the
    smallest value above it (inf when none) and its largest value.

    ``np.min(x, where=mask)`` is what this computes, 8-9x faster where the cluster is
    large (a ReLU's zeros, a GELU's negative half: the masked reduction branches on
    every value, 17 ns each) and 2-3x where it is small: few members are gathered by
    index; many are set aside branch-free, on integer keys in the values' order."""
    low = x <= m / 2 if m < 0 else x == m
    k, n = int(np.count_nonzero(low)), x.size
    if k * 16 <= n:
        flat = np.ascontiguousarray(x).reshape(-1)
        idx = np.flatnonzero(low)
        top = m if m >= 0 else float(flat[idx].max())
        if k == n:
            return k, math.inf, top
        rest = flat.copy()
        rest[idx] = np.inf
        return k, float(rest.min()), top
    keys = _keys(x)
    out = np.uint32(0) - low.reshape(-1).astype(np.uint32)  # all ones on the cluster
    top = m if m >= 0 else _value(np.bitwise_and(keys, out).max())
    above = math.inf if k == n else _value(np.bitwise_or(keys, out).min())
    return k, above, top


CHUNK = 1 << 16  # values binned at a time (bounds the temporaries)


def bin_counts(x: np.ndarray, r: float) -> np.ndarray:
    """``np.histogram(x, HIST_BINS, range=(-r, r))[0]`` for ``|x| <= r``, ``r`` a power of
    two, several times faster: the bin width ``2r / HIST_BINS`` is a power of two, so
    ``x / width`` is exact and its floor is the bin (the right edge ``r`` in the last bin,
    as numpy puts it). Exact in float32 when the scale is at least 1 (no underflow), else
    in float64."""
    scale = (HIST_BINS // 2) / r
    dtype = np.float32 if 1.0 <= scale < 2.0**100 else np.float64
    flat = x.reshape(-1)
    counts = np.zeros(HIST_BINS, dtype=np.int64)
    for i in range(0, flat.size, CHUNK):
        f = np.floor(flat[i:i + CHUNK].astype(dtype, copy=False) * dtype(scale))
        idx = f.astype(np.int32)
        idx += HIST_BINS // 2
        np.minimum(idx, HIST_BINS - 1, out=idx)
        counts += np.bincount(idx, minlength=HIST_BINS)
    return counts
