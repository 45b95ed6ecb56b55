"""Activation outliers: ranges dominated by a few channels, and additive-mask ranges.

=====================  ==================================================================
outlier channels       per-channel max|x| (``TensorStats.channel_absmax``): a channel is
                       an outlier when its max|x| >= ``CHANNEL_FACTOR`` x the median
                       channel's; the tensor is reported when 1..``MAX_SHARE`` of its
                       channels are outliers and max/median >= ``MIN_RATIO``. Bits lost
                       on a per-tensor grid: log2(max / median)
mask range             min <= ``MASK_MIN`` and |min| >= ``MASK_RATIO`` x max|x| of the rest
                       (the max, and the smallest value above the floor cluster: an
                       additive attention mask's fill far below the scores): a min/max
                       grid would spend every level on the mask. A signal as wide on both
                       sides (int16-scale audio, -32768 .. 32767; an STFT's +-9e5), or
                       spread down to its min (x - max(x)), is no mask
=====================  ==================================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from quantscope.types import Groups, Stats

CHANNEL_FACTOR = 6.0
MIN_RATIO = 8.0
MAX_SHARE = 0.05  # at most 5 % of the channels (and at least one)
MIN_CHANNELS = 8
MASK_MIN = -1e4
MASK_RATIO = 10.0  # a fill of -1e4 .. -3e38 against scores of at most hundreds
MAX_LISTED = 16

OUTLIER_REMEDIES = (
    "keep this tensor at 16 bit (a16) and the rest at 8 bit",
    "per-channel (or per-group) activation scales where the target supports them",
    "clip the range (percentile / mse calibration) and accept saturation of the outlier channels",
    "equalise: fold a per-channel scale into the producer (LayerNorm gamma) and the "
    "consumer weights (SmoothQuant-style), so the outlier channels shrink",
)
MASK_REMEDIES = (
    "clamp the additive mask constant to a small negative value (e.g. -12 .. -6)",
    "exclude the mask constant from the range (quantscope's encoder does this for "
    "detected mask Adds)",
)


@dataclass(frozen=True)
class Outlier:
    tensor: str
    group: str | None
    kind: str  # "channels" | "mask_range"
    ratio: float  # max/median channel max|x| (channels) or |min|/max|x| (mask_range)
    channels: tuple[int, ...]  # outlier channel indices, largest first
    channel_axis: int
    bits_lost: float  # log2(ratio): levels a per-tensor grid wastes on typical channels
    reason: str
    remedies: tuple[str, ...]


def _tensor_groups(groups: Groups) -> dict[str, str]:
    return {t: g.name for g in groups.groups for t in g.outputs}


def channel_outliers(name: str, absmax: np.ndarray) -> tuple[float, tuple[int, ...]] | None:
    """(max/median ratio, outlier channels largest first), or None if not dominated."""
    a = np.asarray(absmax, dtype=np.float64).ravel()
    if a.size < MIN_CHANNELS:
        return None
    med = float(np.median(a))
    if med <= 0.0:
        return None
    ratio = float(a.max()) / med
    idx = np.flatnonzero(a >= CHANNEL_FACTOR * med)
    if ratio < MIN_RATIO or not 1 <= idx.size <= max(1, int(MAX_SHARE * a.size)):
        return None
    idx = idx[np.argsort(-a[idx])]
    return ratio, tuple(int(i) for i in idx[:MAX_LISTED])


def find_outliers(stats: Stats, groups: Groups) -> tuple[Outlier, ...]:
    """Channel-dominated ranges and mask-dominated ranges, worst ratio first."""
    owner = _tensor_groups(groups)
    found: list[Outlier] = []
    for name, ts in stats.tensors.items():
        amax = float(max(abs(ts.max), 1e-12))
        if ts.count and ts.min <= MASK_MIN and abs(ts.min) >= MASK_RATIO * max(
                amax, abs(ts.bulk_min) if ts.bulk_min is not None else 0.0):
            found.append(
                Outlier(
                    name,
                    owner.get(name),
                    "mask_range",
                    abs(ts.min) / amax,
                    (),
                    ts.channel_axis,
                    math.log2(abs(ts.min) / amax) if abs(ts.min) > amax else 0.0,
                    f"min {ts.min:.3g} against max {ts.max:.3g}: an additive attention mask "
                    "constant is in this range",
                    MASK_REMEDIES,
                )
            )
            continue
        hit = channel_outliers(name, ts.channel_absmax)
        if hit is None:
            continue
        ratio, chans = hit
        found.append(
            Outlier(
                name,
                owner.get(name),
                "channels",
                ratio,
                chans,
                ts.channel_axis,
                math.log2(ratio),
                f"{len(chans)} of {ts.channel_absmax.size} channels reach {ratio:.1f}x the median "
                f"channel's max|x| (channels {', '.join(map(str, chans[:6]))}); a per-tensor "
                f"8-bit grid leaves typical channels ~{max(0.0, 8 - math.log2(ratio)):.1f} bits",
                OUTLIER_REMEDIES,
            )
        )
    return tuple(sorted(found, key=lambda o: -o.ratio))
