"""Landmark outputs: points per sample, scored by how far each point moves from FP32's.

A landmark model (MediaPipe's hand landmarks ``[N, 63]``: 21 points of x, y, z in input
pixels; a face mesh's 468) is used by where its points are. Its cosine to FP32 is near 1
whatever the points do (every coordinate sits around the image centre), and its
per-coordinate SQNR names a channel, not a distance. Declared ``--layout OUT=points``:

========================  ==============================================================
``point_agreement``       share of points (headline) whose quantized position lies within
                          ``tol`` of FP32's, over ``point_agreement_items`` points (the
                          effective count clustered by sample, ``_clusters`` the samples:
                          :mod:`quantscope.tasks.shares`)
``point_error_mean``      mean / largest distance of a quantized point from FP32's, in
``point_error_max``       the output's units (pixels for MediaPipe's landmarks)
========================  ==============================================================

Each sample's values are read as points of ``dims`` values (default 2; MediaPipe's
landmarks: 3), in order; the distance is over each point's first two values (x, y; a
depth value is not measured). ``tol`` defaults to 1 % of FP32's x, y span on the data
scored, said in a note with how to give one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from quantscope.tasks.shares import share_counts
from quantscope.types import Metrics, Outputs, QuantscopeError
from quantscope.units import value

POINT_DIMS = 2
TOLERANCE_SHARE = 0.01  # the default tol: this share of FP32's x, y span
AGREEMENT_RESEMBLES = 0.95


def _points(out: Outputs, name: str, dims: int) -> list[np.ndarray]:
    i = out.names.index(name)
    arrays = []
    for b in out.batches:
        a = np.asarray(b[i], dtype=np.float64)
        flat = a.reshape(len(a), -1)
        if flat.shape[1] % dims:
            raise QuantscopeError(f"--layout: output '{name}' holds {flat.shape[1]} values per "
                                  f"sample, not a whole number of points of {dims}: fix dims=")
        arrays.append(flat.reshape(len(a), -1, dims))
    return arrays


@dataclass(frozen=True, eq=False)
class PointsTask:
    """Landmarks scored by distance (module docstring); row-local."""

    name: str
    output: str
    dims: int = POINT_DIMS
    tolerance: float | None = None  # None: TOLERANCE_SHARE of FP32's x, y span
    headline: str = "point_agreement"
    higher_is_better: bool = True
    row_local: bool = True

    def describe(self) -> str:
        xy = "x, y" if self.dims >= 2 else "its value"
        rest = ("" if self.dims <= 2 else " (the 3rd value not measured)" if self.dims == 3
                else f" (values 3 to {self.dims} not measured)")
        tol = (f"{self.tolerance:g}" if self.tolerance is not None else
               f"{TOLERANCE_SHARE * 100:g} % of FP32's x, y span")
        return (f"points of {self.dims} values, judged by the distance over {xy}{rest}, "
                f"within {tol}")

    def metrics(self, ref: Outputs, test: Outputs) -> Metrics:
        r = _points(ref, self.output, self.dims)
        t = _points(test, self.output, self.dims)
        k = min(self.dims, 2)
        dist = [np.linalg.norm(b[..., :k] - a[..., :k], axis=-1)
                for a, b in zip(r, t, strict=True)]
        d = np.concatenate(dist) if dist else np.zeros((0, 0))
        coords = np.concatenate([a[..., :k].reshape(-1, k) for a in r]) if r else np.zeros((0, k))
        span = float(np.max(np.ptp(coords, axis=0))) if coords.size else 0.0
        tol = self.tolerance if self.tolerance is not None else TOLERANCE_SHARE * span
        nan = float("nan")
        if not d.size:
            return Metrics(values={"point_agreement": nan, "point_error_mean": nan,
                                   "point_error_max": nan})
        hits = d <= tol
        values = {"point_agreement": float(np.mean(hits)),
                  **share_counts("point_agreement", hits.sum(axis=1),
                                 np.full(len(d), d.shape[1])),
                  "point_error_mean": float(np.mean(d)), "point_error_max": float(np.max(d)),
                  "point_tolerance": float(tol)}
        how = ("as given" if self.tolerance is not None else
               f"{TOLERANCE_SHARE * 100:g} % of FP32's x, y span {span:.4g}, by default: give "
               f"another with --layout {self.output}=points:tol=T")
        notes = [f"output '{self.output}': {d.shape[1]} points per sample; distance to FP32's "
                 f"mean {values['point_error_mean']:.4g}, max {values['point_error_max']:.4g} "
                 f"(the output's units); within {tol:.4g} ({how}): "
                 f"{value('point_agreement', values['point_agreement'])}"]
        if span == 0.0:
            notes.append(f"output '{self.output}': FP32's points are the same on every sample "
                         "and point: the agreement says little")
        if values["point_agreement"] < AGREEMENT_RESEMBLES:
            moved = int(np.sum(~hits))
            notes.append(f"NOT LIKE FP32: output '{self.output}': {moved} of {hits.size} points "
                         f"move more than {tol:.4g} from FP32's (point agreement "
                         f"{value('point_agreement', values['point_agreement'])} < "
                         f"{value('point_agreement', AGREEMENT_RESEMBLES)})")
        return Metrics(values=values, notes=tuple(notes))
