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
``point_error_max``       the output's units (pixels for MediaPipe's landmarks; with ``scale``,
                          pixels of the image it names)
``point_flag_agreement``  with ``flags=A-B``: share of the flag values (each point's values
                          A to B, counted from 0) on the same side of ``threshold`` (default
                          0: a logit) as FP32's, over ``point_flag_agreement_items``
``point_agreement_flagged``  with ``flags``: ``point_agreement`` over the points whose first
                          flag FP32 puts at or above ``threshold`` (the points a host keeps:
                          MoveNet's keypoint score, a pose's visibility), over
                          ``point_agreement_flagged_items``; NaN when FP32 flags none
========================  ==============================================================

A point a host drops (its score under the threshold: MoveNet's keypoints on a photo with
no person) still counts in ``point_agreement``; ``point_agreement_flagged`` and its note
give the figure over the kept ones, and ``--metric point_agreement_flagged`` plans by it.

Each sample's values are read as points of ``dims`` values (default 2; MediaPipe's
landmarks: 3), in order; the distance is over each point's first two values (x, y; a
depth value is not measured). ``tol`` defaults to 1 % of FP32's x, y span on the data
scored (one pixel with ``scale``, below), said in a note with how to give one. A point's
other values may be flags: MediaPipe's pose landmarks are ``[N, 195]``, 39 points of x, y,
z, visibility and presence, the last two logits the host puts through a sigmoid and
compares with 0.5. They share the output's one grid with the pixel coordinates (-320..370
px on BlazePose lite: a step of 2.7 at 8 bit, visibility logits of -18..14 on 10 levels),
so a distance over x, y says nothing of them: ``flags=3-4`` decides each at ``threshold``
and counts the decisions that differ from FP32's; undeclared, the note says they are not
measured and how to declare them.

**Normalised points** (MTCNN's O-Net: ``landmarks [N, 10]`` in units of its 48-px crop,
``boxes [N, 4]`` offsets of the corners x1, y1, x2, y2 in units of the crop side): ``scale``
is the factor from the output's units to pixels (x times its first value, y its second:
``scale=48``, or ``scale=input``, the image input's width and height), so every distance,
the span and ``tol`` are in pixels, and ``tol`` defaults to one pixel (``TOLERANCE_PIXELS``)
of the image the scale names, not a share of the span. ``planar`` reads a sample's values
as each point's first values, then each point's second, ... (x1..x5 then y1..y5: MTCNN's
landmarks) instead of one point after another (x1, y1, x2, y2, ...: a box's two corners);
``channels`` reads a map ``[N, C, h, w]`` (MTCNN's P-Net ``boxes [N, 4, h, w]`` on a whole
photo) as each position's C values, one point after another (its two corners), where the
other orders would pair values of neighbouring positions; a map read otherwise is said,
with the layout that reads it by position (``PointsTask.map_hint``).

**On the photo** (``photo=PX``, with ``scale``): the crop is a box of the photo resized, so
one unit of the values is the box side; ``PX`` is that side in photo pixels (a face of
192 px: 1 px of O-Net's 48-px crop is 4 px of the photo). The model does not know it (the
cascade's boxes do): the user declares it, and ``point_error_mean_photo`` /
``point_error_max_photo`` are the distances in pixels of the photo; the agreement and
``tol`` stay in pixels of the crop (a share of the face, whatever its size).

**Judged where a host draws** (``where=OUT:K>T``: :mod:`quantscope.tasks.points_gate`):
only the points where FP32's output ``OUT``, channel ``K``, passes ``T`` are judged
(P-Net's box map where its face map passes 0.6); ``point_judged`` counts them, a note
says how many of how many, and every figure above is over them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from quantscope.tasks.points_gate import KEPT, NONE_KEPT, PointsGate
from quantscope.tasks.shares import share_counts
from quantscope.types import Metrics, Outputs, QuantscopeError
from quantscope.units import value

POINT_DIMS = 2
TOLERANCE_SHARE = 0.01  # the default tol: this share of FP32's x, y span
TOLERANCE_PIXELS = 1.0  # the default tol of scaled points: one pixel of the scaled image
NORMALISED_SPAN = 2.0  # points spanning no more are likely shares of a side: scale= said
SCALE_INPUT = "input"  # scale=input: the image input's width and height
# x1, y1, x2, y2, ... | x1, x2, ..., y1, y2, ... | axis 1's values at each position
ORDERS = ("interleaved", "planar", "channels")
AGREEMENT_RESEMBLES = 0.95
FLAG_THRESHOLD = 0.0  # a flag is a logit by default (MediaPipe's: sigmoid, then 0.5)
ON_PHOTO = ": on the photo, for a box of "  # in the note of photo=PX's distances


def _ordinal(k: int) -> str:
    return f"{k}{'th' if 10 <= k % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


def _span(a: int, b: int) -> str:
    """Values ``a`` to ``b - 1`` as a row range, as ``flags=`` takes it."""
    return f"{a}" if b == a + 1 else f"{a}-{b - 1}"


def _values(a: int, b: int) -> str:
    """Values ``a`` to ``b - 1`` (from 0) of a point, in words (1st, 2nd, ...)."""
    return f"the {_ordinal(a + 1)} value" if b == a + 1 else \
        f"the {_ordinal(a + 1)} to {_ordinal(b)} values"


def _points(out: Outputs, name: str, dims: int, order: str = "interleaved"
            ) -> list[np.ndarray]:
    """Each batch of the output as ``[samples, points, dims]`` (``ORDERS``): ``planar``, a
    sample's values are every point's first value, then every point's second, ...;
    ``channels``, axis 1 holds each position's values (moved last)."""
    i = out.names.index(name)
    arrays = []
    for b in out.batches:
        a = np.asarray(b[i], dtype=np.float64)
        if order == "channels" and a.ndim > 2:
            if a.shape[1] % dims:
                raise QuantscopeError(f"--layout: output '{name}' holds {a.shape[1]} values "
                                      f"per position on axis 1, not a whole number of points "
                                      f"of {dims}: fix dims=")
            a = np.moveaxis(a, 1, -1)
        flat = a.reshape(len(a), -1)
        if flat.shape[1] % dims:
            raise QuantscopeError(f"--layout: output '{name}' holds {flat.shape[1]} values per "
                                  f"sample, not a whole number of points of {dims}: fix dims=")
        arrays.append(flat.reshape(len(a), dims, -1).transpose(0, 2, 1) if order == "planar"
                      else flat.reshape(len(a), -1, dims))
    return arrays


@dataclass(frozen=True, eq=False)
class PointsTask:
    """Landmarks scored by distance (module docstring); row-local."""

    name: str
    output: str
    dims: int = POINT_DIMS
    tolerance: float | None = None  # None: TOLERANCE_SHARE of FP32's x, y span
    flags: tuple[int, int] | None = None  # values [a, b) of each point decided at threshold
    flag_threshold: float = FLAG_THRESHOLD
    scale: tuple[float, float] | None = None  # x, y times these are pixels (None: as they are)
    scale_read: str = ""  # where the scale came from, in words ("scale=48", the input's)
    order: str = "interleaved"  # ORDERS: planar, x1..xP then y1..yP (MTCNN's landmarks)
    map_hint: str = ""  # said with the figures: a map read as one run of values per sample
    photo: float | None = None  # photo=PX: the crop's box side in photo pixels (one unit)
    gate: PointsGate | None = None  # where=OUT:K>T: only the points FP32's score keeps
    headline: str = "point_agreement"
    higher_is_better: bool = True
    row_local: bool = True

    def describe(self) -> str:
        xy = "x, y" if self.dims >= 2 else "its value"
        a, b = self.flags or (self.dims, self.dims)
        rest = [f"{_values(2, a)} not measured"] if a > 2 else []
        if self.flags:
            rest.append(f"{_values(a, b)} read as flags (flags={_span(a, b)}, counted from 0), "
                        f"decided at {self.flag_threshold:g}")
        if b < self.dims:
            rest.append(f"{_values(max(b, 2), self.dims)} not measured")
        flags = "3-4" if self.dims == 5 else "A-B"  # MediaPipe pose's: x, y, z, vis., pres.
        hint = ("; flags among them (MediaPipe pose's visibility and presence logits, values "
                "3-4) are judged by their decisions with --layout "
                f"{self.output}=points:dims={self.dims},flags={flags}"
                if self.dims >= 4 and not self.flags else "")
        tol = (f"{self.tolerance:g}" if self.tolerance is not None else
               f"{TOLERANCE_PIXELS:g}" if self.scale else
               f"{TOLERANCE_SHARE * 100:g} % of FP32's x, y span")
        said = f" ({'; '.join(rest)})" if rest else ""
        order = {"planar": ", planar (every point's x, then every point's y)" if self.dims == 2
                 else ", planar (every point's 1st value, then every point's 2nd, ...)",
                 "channels": f", each position's values on axis 1 read as points of "
                 f"{self.dims} (order=channels)"}.get(self.order, "")
        unit = f" in pixels ({self._scaling()})" if self.scale else ""
        photo = (f"; on the photo too, for a box of {self.photo:g} px (photo={self.photo:g})"
                 if self.photo else "")
        where = (f", only where {self.gate.words()} (where={self.gate.text()})"
                 if self.gate else "")
        return (f"points of {self.dims} values{order}, judged by the distance over {xy}"
                f"{said}{unit}{where}, within {tol}{' px' if self.scale else ''}{photo}{hint}")

    def figure(self, values: dict[str, float]) -> str:
        """This output's headline figure in its own words (``run``'s verdict names each
        output's: :mod:`quantscope.tasks.worst_output`)."""
        unit = " px" if self.scale else ""
        if "point_tolerance" not in values:  # no point (a gate that keeps none): no figure
            return (f"no point judged (no FP32 score passes where={self.gate.text()})"
                    if self.gate else "no point to judge")
        tol, share = values["point_tolerance"], values[self.headline]
        photo = (f"; on the photo (a box of {self.photo:g} px) mean "
                 f"{values['point_error_mean_photo']:.3g} px, max "
                 f"{values['point_error_max_photo']:.3g} px"
                 if "point_error_mean_photo" in values else "")
        judged = (f", {int(values['point_judged'])} points judged where "
                  f"{self.gate.text()}" if self.gate and "point_judged" in values else "")
        return (f"{value(self.headline, share)} within {tol:.3g}{unit} (mean "
                f"{values.get('point_error_mean', float('nan')):.3g}{unit}, max "
                f"{values.get('point_error_max', float('nan')):.3g}{unit}{photo}{judged})")

    def _scaling(self) -> str:
        """How the values are made pixels, in words (``scale`` given)."""
        sx, sy = self.scale or (1.0, 1.0)
        times = f"{sx:g}" if sx == sy or self.dims < 2 else f"{sx:g} (x), {sy:g} (y)"
        return f"the values x {times}, {self.scale_read}" if self.scale_read else \
            f"the values x {times}"

    def _scaled(self, a: np.ndarray) -> np.ndarray:
        """A point array's x, y (its first ``min(dims, 2)`` values) in pixels."""
        k = min(self.dims, 2)
        xy = a[..., :k]
        return xy * np.asarray(self.scale[:k]) if self.scale else xy

    def metrics(self, ref: Outputs, test: Outputs) -> Metrics:
        r = _points(ref, self.output, self.dims, self.order)
        t = _points(test, self.output, self.dims, self.order)
        k = min(self.dims, 2)
        dist = [np.linalg.norm(self._scaled(b) - self._scaled(a), axis=-1)
                for a, b in zip(r, t, strict=True)]
        d = np.concatenate(dist) if dist else np.zeros((0, 0))
        coords = (np.concatenate([self._scaled(a).reshape(-1, k) for a in r]) if r
                  else np.zeros((0, k)))
        span = float(np.max(np.ptp(coords, axis=0))) if coords.size else 0.0
        tol = (self.tolerance if self.tolerance is not None else
               TOLERANCE_PIXELS if self.scale else TOLERANCE_SHARE * span)
        nan = float("nan")
        if not d.size:
            return Metrics(values={"point_agreement": nan, "point_error_mean": nan,
                                   "point_error_max": nan})
        kept, gate_note = self._kept(ref, d)
        if not kept.any():
            return Metrics(values={"point_agreement": nan, "point_error_mean": nan,
                                   "point_error_max": nan, "point_judged": 0.0,
                                   # 0 points in 0 samples: the verdict says none judged
                                   **share_counts("point_agreement", kept.sum(axis=1),
                                                  kept.sum(axis=1))},
                           notes=(gate_note,))
        hits = d <= tol
        values = {"point_agreement": float(np.mean(hits[kept])),
                  **share_counts("point_agreement", (hits & kept).sum(axis=1),
                                 kept.sum(axis=1)),
                  "point_error_mean": float(np.mean(d[kept])),
                  "point_error_max": float(np.max(d[kept])),
                  "point_tolerance": float(tol)}
        if self.gate:
            values["point_judged"] = float(kept.sum())
        unit = " px" if self.scale else ""
        how = ("as given" if self.tolerance is not None else
               f"one pixel, by default: give another with --layout {self.output}=points:"
               "tol=T (pixels)" if self.scale else
               f"{TOLERANCE_SHARE * 100:g} % of FP32's x, y span {span:.4g}, by default: give "
               f"another with --layout {self.output}=points:tol=T")
        units = f"pixels: {self._scaling()}" if self.scale else "the output's units"
        judged = f" ({int(kept.sum())} judged: below)" if self.gate else ""
        notes = [f"output '{self.output}': {d.shape[1]} points per sample{judged}; distance to "
                 f"FP32's mean {values['point_error_mean']:.4g}{unit}, max "
                 f"{values['point_error_max']:.4g}{unit} ({units}); within {tol:.4g}{unit} "
                 f"({how}): {value('point_agreement', values['point_agreement'])}"]
        notes += [gate_note] if gate_note else []
        if self.photo:
            photo_values, photo_note = self._on_photo(r, t, kept, tol)
            values.update(photo_values)
            notes.append(photo_note)
        if self.map_hint:
            notes.append(self.map_hint)
        notes += self._span_notes(span)
        if values["point_agreement"] < AGREEMENT_RESEMBLES:
            moved = int(np.sum(~hits & kept))
            notes.append(f"NOT LIKE FP32: output '{self.output}': {moved} of {int(kept.sum())} "
                         f"points{' judged' if self.gate else ''} "
                         f"move more than {tol:.4g}{unit} from FP32's (point agreement "
                         f"{value('point_agreement', values['point_agreement'])} < "
                         f"{value('point_agreement', AGREEMENT_RESEMBLES)})")
        if self.flags:
            flag_values, flag_notes = self._flags(r, t)
            values.update(flag_values)
            notes.extend(flag_notes)
            kept_values, kept_note = self._flagged(r, d, tol, unit)
            values.update(kept_values)
            notes.append(kept_note)
        return Metrics(values=values, notes=tuple(notes))

    def _span_notes(self, span: float) -> list[str]:
        """What FP32's x, y span says: shares of a side (``scale=`` named), or nothing."""
        notes = []
        if not self.scale and 0.0 < span <= NORMALISED_SPAN:
            notes.append(f"output '{self.output}': FP32's points span {span:.4g} of the "
                         "output's units: if they are shares of an image side (a crop's, as "
                         f"MTCNN's), --layout {self.output}=points:scale=S (S the side in "
                         "pixels, or scale=input) measures them in pixels")
        if span == 0.0:
            notes.append(f"output '{self.output}': FP32's points are the same on every sample "
                         "and point: the agreement says little")
        return notes

    def _kept(self, ref: Outputs, d: np.ndarray) -> tuple[np.ndarray, str]:
        """The points judged, ``[samples, points]`` (all without ``where=``), and the note
        counting them (empty without ``where=``)."""
        if self.gate is None:
            return np.ones(d.shape, dtype=bool), ""
        a = ref.batches[0][ref.names.index(self.output)]
        positions = int(np.prod(a.shape[2:])) if self.order == "channels" and a.ndim > 2 else 1
        kept, each = self.gate.kept(ref, d.shape[1], positions)
        n, positions = int(kept.sum()), d.shape[1] // each
        where = (f"where {self.gate.words()} (where={self.gate.text()})")
        if not n:
            return kept, (f"output '{self.output}'{NONE_KEPT}{where} holds nowhere on "
                          f"the {len(d)} samples ({positions} position(s) each): no point a host "
                          f"keeps to judge (a threshold below {self.gate.threshold:g}, or "
                          "data where the score passes it, gives some)")
        samples = f"on {int(kept.any(axis=1).sum())} of {len(d)} samples"
        at = (f"at {n // each} of {positions * len(d)} positions ({n} of {d.size} points), "
              f"{where}, {samples}" if positions > 1 else
              f"{samples} ({n} of {d.size} points), {where}")
        return kept, (f"output '{self.output}': judged {at}{KEPT}"
                      f"{d.size - n} are not judged (the score's own "
                      f"decisions: --layout {self.gate.output}=map:threshold="
                      f"{self.gate.threshold:g},channel={self.gate.channel})")

    def _on_photo(self, r: list[np.ndarray], t: list[np.ndarray], kept: np.ndarray,
                  tol: float) -> tuple[dict[str, float], str]:
        """The distances in pixels of the photo (``photo=PX``: one unit of the values is the
        crop's box side, PX photo pixels) over the points judged, and their note."""
        k = min(self.dims, 2)
        px = float(self.photo or 1.0)
        d = np.concatenate([np.linalg.norm((b[..., :k] - a[..., :k]) * px, axis=-1)
                            for a, b in zip(r, t, strict=True)])[kept]
        values = {"point_error_mean_photo": float(np.mean(d)),
                  "point_error_max_photo": float(np.max(d))}
        sx, sy = self.scale or (1.0, 1.0)
        ratio = (f"{px / sx:.4g}" if sx == sy or k < 2 else f"{px / sx:.4g} (x), {px / sy:.4g} (y)")
        return values, (
            f"output '{self.output}'{ON_PHOTO}{px:g} px (photo={px:g}, as "
            f"declared: the model does not know the box; a pixel of the crop is {ratio} px "
            f"of the photo): distance to FP32's mean {values['point_error_mean_photo']:.4g} px, "
            f"max {values['point_error_max_photo']:.4g} px of the photo "
            f"(point_error_mean_photo, point_error_max_photo); the agreement is judged within "
            f"{tol:.4g} px of the crop")

    def _flagged(self, ref: list[np.ndarray], d: np.ndarray, tol: float, unit: str = ""
                 ) -> tuple[dict[str, float], str]:
        """The point agreement over the points whose first flag FP32 puts at or above the
        threshold (the points a host keeps), and its note."""
        a = (self.flags or (0, 0))[0]
        kept = np.concatenate([x[..., a] for x in ref]) >= self.flag_threshold  # [N, P]
        key = "point_agreement_flagged"
        if not kept.any():
            return {key: float("nan")}, (
                f"output '{self.output}': FP32 flags no point at or above "
                f"{self.flag_threshold:g} (value {a}): no point a host keeps to judge")
        hits = (d <= tol) & kept
        share = float(hits.sum() / kept.sum())
        values = {key: share, **share_counts(key, hits.sum(axis=1), kept.sum(axis=1))}
        return values, (
            f"output '{self.output}': over the {int(kept.sum())} of {kept.size} points FP32 "
            f"flags at or above {self.flag_threshold:g} (value {a}; on {int(kept.any(axis=1).sum())} "
            f"of {len(kept)} samples), the points a host keeps: {value(key, share)} within "
            f"{tol:.4g}{unit}, mean distance {float(np.mean(d[kept])):.4g}{unit}; the others "
            f"count in point_agreement (--metric {key} plans for the kept ones)")

    def _flags(self, ref: list[np.ndarray], test: list[np.ndarray]
               ) -> tuple[dict[str, float], list[str]]:
        """Each flag value decided at the threshold: the share decided as FP32's."""
        a, b = self.flags or (0, 0)
        th = self.flag_threshold
        fr = np.concatenate([x[..., a:b] for x in ref]) >= th  # [samples, points, flags]
        ft = np.concatenate([x[..., a:b] for x in test]) >= th
        same = fr == ft
        values = {"point_flag_agreement": float(np.mean(same)),
                  **share_counts("point_flag_agreement", same.reshape(len(same), -1).sum(axis=1),
                                 np.full(len(same), same[0].size))}
        each = "; ".join(
            f"value {k}: {value('point_flag_agreement', float(np.mean(same[..., k - a])))} "
            f"(FP32 positive on {value('point_flag_agreement', float(np.mean(fr[..., k - a])))})"
            for k in range(a, b))
        notes = [f"output '{self.output}': flags (values {_span(a, b)} of each point, counted "
                 f"from 0) decided at "
                 f"{th:g}: {value('point_flag_agreement', values['point_flag_agreement'])} of "
                 f"{same.size} decisions as FP32's ({each})"]
        if fr.all() or not fr.any():
            notes.append(f"output '{self.output}': FP32's flags are on one side of {th:g} "
                         "everywhere: the flag agreement says little")
        if values["point_flag_agreement"] < AGREEMENT_RESEMBLES:
            notes.append(f"NOT LIKE FP32: output '{self.output}': {int(np.sum(~same))} of "
                         f"{same.size} point flags decided otherwise than FP32's at {th:g} "
                         f"(flag agreement "
                         f"{value('point_flag_agreement', values['point_flag_agreement'])} < "
                         f"{value('point_flag_agreement', AGREEMENT_RESEMBLES)})")
        return values, notes
