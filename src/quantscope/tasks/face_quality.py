"""``pre_norm`` as a face-quality signal: per distance slice, match rate by bin, a gate.

``pre_norm`` is the norm of an embedding before L2 normalisation. Field report 002: on an
INT8 NPU it falls with face size and, below a threshold, the match rate falls off a cliff;
users gate on it ("ignore faces with pre_norm < t"). This module measures that.

=================  ================================================================
match rate         fraction of genuine pairs accepted (distance < threshold), i.e.
                   TAR at the model's threshold, counted per *probe*
bins               edges at quantiles of the FP32 probes' pre_norm
                   (:func:`prenorm_edges`), so every precision is binned alike and
                   FP32's bins hold equal counts; the outer edges are open
gate               :func:`quality_gate`: the lower edge of the lowest bin from which
                   every bin up has a match rate >= ``target`` (NaN: none does)
=================  ================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from quantscope.types import QuantscopeError

__all__ = [
    "PrenormBin",
    "match_rate_by_prenorm",
    "prenorm_by_slice",
    "prenorm_edges",
    "quality_gate",
]

GATE_TARGET = 0.9
N_BINS = 8


@dataclass(frozen=True)
class PrenormBin:
    lo: float  # -inf for the first bin
    hi: float  # +inf for the last bin
    n: int
    match_rate: float  # NaN when empty


def prenorm_by_slice(norms: np.ndarray, second: np.ndarray, distance: np.ndarray,
                     slices: tuple[str, ...]) -> dict[str, dict[str, float]]:  # fmt: skip
    """Per slice: mean / min / p10 / max pre_norm of the distinct probe chips in it."""
    norms = np.asarray(norms, np.float64)
    out = {}
    for name in slices:
        chips = np.unique(np.asarray(second)[np.asarray(distance) == name])
        if chips.size:
            v = norms[chips]
            out[name] = {"mean": float(v.mean()), "min": float(v.min()),
                         "p10": float(np.percentile(v, 10)), "max": float(v.max())}  # fmt: skip
    return out


def prenorm_edges(reference_norms: np.ndarray, n_bins: int = N_BINS) -> np.ndarray:
    """Inner bin edges [n_bins - 1]: quantiles of the reference (FP32) probes' pre_norm."""
    ref = np.asarray(reference_norms, np.float64)
    if ref.size < n_bins or not np.all(np.isfinite(ref)):
        raise QuantscopeError(f"pre_norm bins need >= {n_bins} finite reference values")
    return np.quantile(ref, np.arange(1, n_bins) / n_bins)


def match_rate_by_prenorm(
    probe_norms: np.ndarray, matched: np.ndarray, edges: np.ndarray
) -> tuple[PrenormBin, ...]:
    """Match rate of genuine pairs binned by their probe's pre_norm (``edges`` inner)."""
    x, m = np.asarray(probe_norms, np.float64), np.asarray(matched, bool)
    if x.shape != m.shape:
        raise QuantscopeError(f"{x.shape[0]} pre_norms but {m.shape[0]} match decisions")
    which = np.searchsorted(edges, x, side="right")
    bounds = np.concatenate([[-np.inf], edges, [np.inf]])
    bins = []
    for i in range(len(bounds) - 1):
        sel = which == i
        rate = float(m[sel].mean()) if sel.any() else float("nan")
        bins.append(PrenormBin(float(bounds[i]), float(bounds[i + 1]), int(sel.sum()), rate))
    return tuple(bins)


def quality_gate(bins: tuple[PrenormBin, ...], target: float = GATE_TARGET) -> float:
    """Lowest pre_norm from which every non-empty bin up has match rate >= target."""
    gate = float("nan")
    for b in reversed(bins):
        if b.n == 0:
            continue
        if b.match_rate < target:
            break
        gate = b.lo
    return gate


def bins_table(bins: tuple[PrenormBin, ...]) -> dict[str, float]:
    """``{"lo..hi": match rate, "lo..hi n": count}`` for a Metrics table."""
    out: dict[str, float] = {}
    for b in bins:
        key = f"{b.lo:.3g}..{b.hi:.3g}"
        out[key], out[f"{key} n"] = b.match_rate, float(b.n)
    return out
