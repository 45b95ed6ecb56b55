"""Per-phase diagnosis of a decoder LLM from its calibration statistics (no emulation).

====================  ================================================================
widest groups         group outputs by calibrated range; outlier ratio = the largest
                      channel's max|x| over the median channel's (the few "massive
                      activation" channels of LLMs)
typical |x|           the median |x| of the tensor (from its calibration histogram; an
                      upper bin edge, so it errs high)
8-bit step            (max(hi, 0) - min(lo, 0)) / 255: the step of a min/max uint8 grid
predicted to break    8-bit step > typical |x|: most values round to 0 or one step. A
                      *prediction* from ranges alone, not a measurement
residual stream       the outputs of residual Adds (an Add of two activations)
first token           prefill only: per position, the max |x| over channels of each
                      residual tensor (max over the calibration windows); the peak
                      position and position 0 over the median of the other positions
KV cache              groups whose output is a ``present.*`` graph output
RMSNorm inputs        the input tensors of the normalisation groups
====================  ================================================================
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from quantscope.types import Group, Groups, Stats, TensorStats

NORM_OPS = ("RMSNormalization", "SimplifiedLayerNormalization", "LayerNormalization")
MASKED = 1e30  # a masked-scores range: the encoder sets its own


@dataclass(frozen=True)
class RangeRow:
    group: str
    tensor: str
    lo: float
    hi: float
    outlier_ratio: float  # max channel max|x| / median channel max|x|
    typical: float  # median |x|
    step8: float

    @property
    def breaks8(self) -> bool:
        """Predicted (not measured): the 8-bit step exceeds the typical value."""
        return self.step8 > self.typical


@dataclass(frozen=True)
class FirstToken:
    tensor: str
    peak_position: int
    first: float  # max |x| at position 0
    others: float  # median over positions > 0 of the per-position max |x|


@dataclass(frozen=True)
class PhaseDiagnosis:
    phase: str
    widest: tuple[RangeRow, ...]
    kv_cache: tuple[RangeRow, ...]
    norm_inputs: tuple[RangeRow, ...]
    predicted_8bit: tuple[RangeRow, ...]  # groups predicted to break 8 bit, worst first
    first_token: tuple[FirstToken, ...] = ()


def residual_groups(groups: Groups) -> tuple[Group, ...]:
    """Residual Adds: Adds of two activations whose output a normalisation reads (the
    residual stream; a RoPE Add feeds attention instead)."""
    normed = {g.inputs[0] for g in groups.groups if g.op_type in NORM_OPS and g.inputs}
    return tuple(g for g in groups.groups if g.op_type == "Add" and len(g.inputs) == 2
                 and g.outputs and g.outputs[0] in normed)


def typical_abs(ts: TensorStats) -> float:
    """Median |x| from the histogram (upper edge of the bin it falls in)."""
    h = np.asarray(ts.hist, np.float64)
    half = len(h) // 2
    if half == 0 or h.sum() <= 0:
        return max(abs(ts.min), abs(ts.max))
    c = np.cumsum(h[half:] + h[:half][::-1])
    return float((int(np.searchsorted(c, c[-1] / 2)) + 1) * ts.hist_range / half)


def range_row(group: str, ts: TensorStats) -> RangeRow:
    ch = np.asarray(ts.channel_absmax, np.float64)
    ratio = float(ch.max() / max(float(np.median(ch)), 1e-12)) if ch.size else 1.0
    step = (max(ts.max, 0.0) - min(ts.min, 0.0)) / 255
    return RangeRow(group, ts.name, ts.min, ts.max, ratio, typical_abs(ts), step)


def _rows(pairs: list[tuple[str, str]], stats: Stats) -> tuple[RangeRow, ...]:
    rows = [range_row(g, stats.tensors[t]) for g, t in pairs if t in stats.tensors]
    return tuple(r for r in rows if r.hi - r.lo < MASKED)


def first_token(positions: Mapping[str, np.ndarray]) -> tuple[FirstToken, ...]:
    """Per tensor: where the per-position max |x| peaks, position 0 against the rest."""
    out = []
    for name, per_pos in positions.items():
        p = np.asarray(per_pos, np.float64)
        others = float(np.median(p[1:])) if len(p) > 1 else 0.0
        out.append(FirstToken(name, int(p.argmax()), float(p[0]), others))
    return tuple(out)


def kv_cache_outputs(groups: Groups, output_names: Sequence[str]) -> list[tuple[str, str]]:
    """(group, tensor) of the KV cache: the group outputs that are ``present.*`` graph
    outputs."""
    present = {o for o in output_names if o.startswith("present.")}
    return [(g.name, t) for g in groups.groups for t in g.outputs if t in present]


def diagnose_phase(phase: str, groups: Groups, stats: Stats, output_names: tuple[str, ...],
                   positions: Mapping[str, np.ndarray] | None = None, *,
                   top: int = 8) -> PhaseDiagnosis:
    """What the calibration statistics of one phase graph say (see the module docstring)."""
    every = _rows([(g.name, g.outputs[0]) for g in groups.groups if g.outputs], stats)
    widest = sorted(every, key=lambda r: -(r.hi - r.lo))
    kv = kv_cache_outputs(groups, output_names)
    norms = [(g.name, g.inputs[0]) for g in groups.groups if g.op_type in NORM_OPS and g.inputs]
    breaks = sorted((r for r in every if r.breaks8),
                    key=lambda r: -r.step8 / max(r.typical, 1e-30))
    return PhaseDiagnosis(phase, tuple(widest[:top]), _rows(kv, stats), _rows(norms, stats),
                          tuple(breaks), first_token(positions or {}))


def _row_text(r: RangeRow) -> str:
    return (f"    {r.group:<32} [{r.lo:>10.3g}, {r.hi:>10.3g}]  outlier x{r.outlier_ratio:<7.3g}"
            f" typical |x| {r.typical:<8.3g} 8-bit step {r.step8:.3g}")


def _span(rows: tuple[RangeRow, ...]) -> str:
    if not rows:
        return "none"
    return (f"{len(rows)} tensors, ranges [{min(r.lo for r in rows):.3g}, "
            f"{max(r.hi for r in rows):.3g}], widest {max(rows, key=lambda r: r.hi - r.lo).group}")


def format_diagnosis(diagnoses: tuple[PhaseDiagnosis, ...], *, listed: int = 8) -> list[str]:
    lines = []
    for d in diagnoses:
        lines.append(f"{d.phase}: widest group outputs (range, max channel / median channel):")
        lines += [_row_text(r) for r in d.widest]
        lines.append(f"  KV cache: {_span(d.kv_cache)}")
        lines.append(f"  RMSNorm inputs: {_span(d.norm_inputs)}")
        if d.first_token:
            at0 = [f for f in d.first_token if f.peak_position == 0]
            top = max(d.first_token, key=lambda f: f.first / max(f.others, 1e-30))
            lines.append(f"  first token: {len(at0)} of {len(d.first_token)} residual tensors "
                         f"peak at position 0; largest ratio {top.tensor}: position 0 "
                         f"{top.first:.3g} vs median position {top.others:.3g}")
        names = ", ".join(r.group for r in d.predicted_8bit[:listed])
        more = len(d.predicted_8bit) - listed
        lines.append(f"  predicted to break 8 bit (step > typical |x|; a prediction): "
                     f"{len(d.predicted_8bit)} groups{': ' + names if names else ''}"
                     f"{f' (+{more} more)' if more > 0 else ''}")
    return lines


def diagnosis_to_dict(diagnoses: tuple[PhaseDiagnosis, ...]) -> dict[str, object]:
    """JSON form: per phase the rows, each with its prediction (``breaks8``)."""
    def rows(rs: tuple[RangeRow, ...]) -> list[dict[str, object]]:
        return [{**asdict(r), "breaks8": r.breaks8} for r in rs]

    return {"format": "quantscope.phase-diagnosis/1", "note": "breaks8 and predicted_8bit "
            "are predictions from calibrated ranges (8-bit step > typical |x|), not "
            "measurements",
            "phases": {d.phase: {"widest": rows(d.widest), "kv_cache": rows(d.kv_cache),
                                 "norm_inputs": rows(d.norm_inputs),
                                 "predicted_8bit": rows(d.predicted_8bit),
                                 "first_token": [asdict(f) for f in d.first_token]}
                       for d in diagnoses}}


__all__ = ["FirstToken", "PhaseDiagnosis", "RangeRow", "diagnose_phase", "diagnosis_to_dict",
           "first_token", "format_diagnosis", "kv_cache_outputs", "range_row",
           "residual_groups", "typical_abs"]
