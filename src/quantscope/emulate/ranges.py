"""Range setting from streamed statistics: ``minmax``, ``percentile``, ``mse``.

The range is chosen at encode time, when the bit width is known: the MSE-optimal clip
range for 8 bit is much tighter than for 16 bit.

``percentile`` keeps the central ``PERCENTILE`` mass of the histogram (both tails).
``mse`` minimises the expected squared error of the histogram under the target grid:
clipping error for mass outside ``[lo, hi]`` plus the uniform rounding noise
``scale**2 / 12`` inside, by coordinate descent over candidate ends.

A lookup's output (a Gather of a constant table: :mod:`quantscope.calibrate.lookup`) has
its table's min..max under every method, and :func:`lookup_note` says so.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from quantscope.lookup_range import ROW_OUTLIER
from quantscope.numerics import MSE_MAX_BITS, qrange
from quantscope.types import QuantscopeError, TensorStats

METHODS = ("minmax", "percentile", "mse")
PERCENTILE = 99.99
_CANDIDATES = 96


def _centers(ts: TensorStats) -> np.ndarray:
    edges = np.linspace(-ts.hist_range, ts.hist_range, ts.hist.size + 1)
    return (edges[:-1] + edges[1:]) / 2


def _percentile_range(ts: TensorStats, pct: float) -> tuple[float, float]:
    cdf = np.cumsum(ts.hist) / max(int(ts.hist.sum()), 1)
    centers = _centers(ts)
    tail = (100.0 - pct) / 200.0
    lo = centers[min(int(np.searchsorted(cdf, tail)), centers.size - 1)]
    hi = centers[min(int(np.searchsorted(cdf, 1.0 - tail)), centers.size - 1)]
    return max(float(lo), ts.min), min(float(hi), ts.max)


def _expected_mse(
    centers: np.ndarray, counts: np.ndarray, lo: np.ndarray, hi: np.ndarray, levels: int
) -> np.ndarray:
    """Expected squared error for candidate ranges ``[lo_i, hi_i]`` (vectorised)."""
    lo_, hi_ = np.minimum(lo, 0.0)[:, None], np.maximum(hi, 0.0)[:, None]
    scale = np.maximum((hi_ - lo_) / levels, 1e-12)
    c = centers[None, :]
    clipped = np.clip(c, lo_, hi_)
    err = np.where(c == clipped, scale**2 / 12.0, (c - clipped) ** 2)
    return (err * counts[None, :]).sum(axis=1)


def _mse_range(ts: TensorStats, bits: int, *, symmetric: bool) -> tuple[float, float]:
    """:func:`_mse_search` once per statistics object, bit width and symmetry, kept on
    the (frozen) statistics: each plan's quantization encodes every tensor again, and
    the search is ~2-30 ms a tensor (the suite: ~22 s of CPU; a decoder's plan search
    quantizes dozens of plans from the same statistics)."""
    memo = ts.__dict__.setdefault("_mse_ranges", {})
    key = (bits, symmetric)
    if key not in memo:
        memo[key] = _mse_search(ts, bits, symmetric=symmetric)
    return memo[key]


def _mse_search(ts: TensorStats, bits: int, *, symmetric: bool) -> tuple[float, float]:
    centers, counts = _centers(ts), ts.hist.astype(np.float64)
    keep = counts > 0
    centers, counts = centers[keep], counts[keep]
    qmin, qmax = qrange(bits, signed=False)
    levels = qmax - qmin
    fracs = np.linspace(1.0 / _CANDIDATES, 1.0, _CANDIDATES)
    if symmetric:
        amax = max(abs(ts.min), abs(ts.max))
        cand = fracs * amax
        best = int(np.argmin(_expected_mse(centers, counts, -cand, cand, levels)))
        return -float(cand[best]), float(cand[best])
    lo, hi = ts.min, ts.max
    for _ in range(3):  # coordinate descent: each end in turn, the other fixed
        his = fracs * ts.max if ts.max > 0 else np.full(_CANDIDATES, ts.max)
        hi = float(his[np.argmin(_expected_mse(centers, counts, np.full_like(his, lo), his, levels))])
        los = fracs * ts.min if ts.min < 0 else np.full(_CANDIDATES, ts.min)
        lo = float(los[np.argmin(_expected_mse(centers, counts, los, np.full_like(los, hi), levels))])
    return lo, hi


def tensor_range(
    ts: TensorStats, method: str, bits: int, *, symmetric: bool = False
) -> tuple[float, float]:
    """Real-valued ``(lo, hi)`` to quantize ``ts`` with ``bits`` under ``method``; a
    lookup's is its table's under every method (:mod:`quantscope.calibrate.lookup`)."""
    if method == "minmax" or ts.count == 0 or ts.lookup is not None:
        return ts.min, ts.max
    if method == "percentile":
        return _percentile_range(ts, PERCENTILE)
    if method == "mse":
        if bits > MSE_MAX_BITS:  # rounding noise is negligible: never clip
            return ts.min, ts.max
        return _mse_range(ts, bits, symmetric=symmetric)
    raise QuantscopeError(
        f"unknown calibration method '{method}': use one of {', '.join(METHODS)}"
    )


def lookup_note(tensors: Mapping[str, TensorStats]) -> str | None:
    """One line naming the lookups whose range is their table's; None when none."""
    said = [(t, ts) for t, ts in tensors.items() if ts.lookup is not None]
    if not said:
        return None
    parts = []
    for t, ts in said[:MAX_NAMED]:
        k = ts.lookup
        assert k is not None
        parts.append(f"range of '{t}' taken from its table '{k.table}' ({k.rows:,} rows), "
                     f"not from the calibration rows: the data picked {k.picked:,} of "
                     f"{k.rows:,} rows ({k.data_min:.4g} .. {k.data_max:.4g}; the table "
                     f"{ts.min:.4g} .. {ts.max:.4g})"
                     + (f", {k.left_out:,} outlier row(s) past {ROW_OUTLIER:g}x the median "
                        "row's magnitude left out, unpicked: ids that pick them clip"
                        if k.left_out else ""))
    more = f"; and {len(said) - MAX_NAMED} more" if len(said) > MAX_NAMED else ""
    return ("; ".join(parts) + more + ": a lookup returns rows of its table only, so the "
            "table bounds every id the deployment can give; the layers after it are still "
            "calibrated on the rows the data picked (give calibration data that picks the "
            "rows the deployment will)")


MAX_NAMED = 4  # lookups named in the note (the rest counted)
