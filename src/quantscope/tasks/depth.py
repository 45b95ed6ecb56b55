"""A relative depth map (MiDaS, Depth Anything, a phone's portrait depth): judged against
FP32's after the scale and shift a host may take away.

A relative depth (or inverse depth) model is trained up to a scale and a shift: the host
normalises each map (to 0..1 for display, or aligns it to a few known depths) before it
uses it. A quantized model whose map moves by an offset or a gain then loses nothing the
host sees, and its PSNR over FP32's range (``image``) reads that offset as error. Declared
``--layout OUT=depth[:align=affine|scale|none]``, each sample's quantized map ``q`` is
aligned to FP32's ``r`` by least squares (``affine``: ``s q + t``, the MiDaS evaluation's
scale-and-shift alignment; ``scale``: ``s q``; ``none``: as it is), then over FP32's
valid pixels (``r > 0``: depth, or inverse depth, is positive):

======================  ================================================================
``depth_abs_rel``       (headline, lower is better) ``mean |q' - r| / r``, the AbsRel of
                        monocular depth benchmarks, with FP32's map as the ground truth;
                        the mean over samples of each one's
``depth_abs_rel_max``   the worst sample's
``depth_delta1``        share of valid pixels where ``max(q' / r, r / q') < 1.25``
                        (delta < 1.25; a ``q'`` of 0 or less misses), over
                        ``depth_delta1_items`` pixels (clustered by sample)
``depth_invalid_share`` share of FP32's pixels not positive (not judged; said)
======================  ================================================================

Above :data:`ABS_REL_RESEMBLES` a ``NOT LIKE FP32`` note says so (a rule of thumb, as the
image's 30 dB: a tenth of the AbsRel of about 0.1 that relative depth models reach against
ground truth). The figures are against FP32's map, not a ground truth: they measure what
quantization changed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from quantscope.tasks.pictures import paired_batches
from quantscope.tasks.shares import share_counts
from quantscope.types import Metrics, Outputs

ALIGNS = ("affine", "scale", "none")
DELTA = 1.25
ABS_REL_RESEMBLES = 0.01


def align(q: np.ndarray, r: np.ndarray, how: str) -> np.ndarray:
    """``q`` (one sample's values) aligned to ``r`` by least squares: ``s q + t``
    (``affine``), ``s q`` (``scale``) or as it is (``none``); a constant ``q`` is shifted
    (affine) or kept."""
    if how == "none" or not q.size:
        return q
    if how == "scale":
        qq = float(q @ q)
        return q * (float(q @ r) / qq) if qq > 0.0 else q
    qc, rc = q - q.mean(), r - r.mean()
    var = float(qc @ qc)
    s = float(qc @ rc) / var if var > 0.0 else 0.0
    return s * qc + r.mean()


@dataclass(frozen=True, eq=False)
class DepthTask:
    """An output read as a relative depth map (module docstring)."""

    name: str
    output: str
    align: str = "affine"
    headline: str = "depth_abs_rel"
    higher_is_better: bool = False
    goal_range: tuple[float, float] = (0.0, float("inf"))
    row_local: bool = True

    def describe(self) -> str:
        how = {"affine": "after each quantized map's least-squares scale and shift to FP32's",
               "scale": "after each quantized map's least-squares scale to FP32's",
               "none": "as it is (no alignment)"}[self.align]
        return (f"a relative depth map, judged by AbsRel and delta < {DELTA:g} against FP32 "
                f"{how}")

    def _samples(self, ref: Outputs, test: Outputs) -> list[tuple[np.ndarray, np.ndarray]]:
        return [pair for r, t in paired_batches(ref, test, self.output, "depth map")
                for pair in zip(r.reshape(len(r), -1), t.reshape(len(t), -1), strict=True)]

    def metrics(self, ref: Outputs, test: Outputs) -> Metrics:
        rels: list[float] = []
        hits, sizes = [], []
        invalid = total = 0
        for r, q in self._samples(ref, test):
            total += r.size
            valid = r > 0.0
            invalid += int(r.size - valid.sum())
            if not valid.any():
                continue
            a = align(q[valid], r[valid], self.align)
            rv = r[valid]
            rels.append(float(np.mean(np.abs(a - rv) / rv)))
            ratio = np.maximum(a / rv, rv / np.where(a > 0.0, a, np.nan))
            hits.append(int(np.sum(np.nan_to_num(ratio, nan=np.inf) < DELTA)))
            sizes.append(int(valid.sum()))
        notes: list[str] = []
        if invalid:
            notes.append(f"output '{self.output}': {invalid / max(total, 1):.1%} of FP32's "
                         "values are 0 or less, not a depth: left out (a metric depth's "
                         "invalid pixels, or not a depth map: --layout "
                         f"{self.output}=image for PSNR)")
        if not rels:
            return Metrics(values={"depth_abs_rel": float("nan")}, notes=(
                *notes, f"output '{self.output}': FP32 gives no positive value: no depth "
                "error to measure"))
        values = {"depth_abs_rel": float(np.mean(rels)), "depth_abs_rel_max": max(rels),
                  "depth_delta1": sum(hits) / sum(sizes),
                  "depth_invalid_share": invalid / total,
                  **share_counts("depth_delta1", np.array(hits), np.array(sizes))}
        if values["depth_abs_rel"] > ABS_REL_RESEMBLES:
            notes.append(f"NOT LIKE FP32: output '{self.output}' AbsRel "
                         f"{values['depth_abs_rel']:.4f} > {ABS_REL_RESEMBLES:g} against FP32 "
                         f"({self.align} aligned): the depth moves by "
                         f"{100 * values['depth_abs_rel']:.1f} % of itself")
        return Metrics(values=values, notes=tuple(notes))
