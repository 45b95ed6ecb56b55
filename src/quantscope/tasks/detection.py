"""Detection outputs: boxes and class scores in one tensor, scored as detections.

A YOLO-style head writes one output ``[N, 4 + C, A]`` (or ``[N, A, 4 + C]``): along the
*row axis*, 4 box rows (``cx, cy, w, h`` or ``x1, y1, x2, y2``) then ``C`` class-score
rows, for each of ``A`` anchors. Its two halves live on scales that differ by hundreds
(pixels vs probabilities), so one 8-bit grid can round every score to 0 while the whole
output's SQNR and cosine stay near perfect. This module scores such an output as the
detector's user sees it, against FP32:

========================  ==============================================================
``class_score_max_abs_error``  largest |quantized - FP32| of any class score
``score_side_agreement``  share of anchors whose best class score is on the same side of
                          the threshold as FP32's
``detections_fp32``       detections FP32 keeps: best-class score >= threshold, then
``detections_quantized``  class-aware NMS at IoU ``iou``; the same for the quantized model
``detection_precision``   quantized detections matched to an FP32 one (same class,
``detection_recall``      IoU >= ``iou``, greedy by FP32 score, one-to-one) over the
``detection_f1``          quantized / FP32 kept; F1 (the headline)
``*_items``               the items each share is over (:func:`item_counts`; the score
                          side's anchors: the effective count clustered by sample,
                          ``score_side_agreement_clusters`` the samples)
``box_iou_mean``          mean IoU of the matched boxes
========================  ==============================================================

When FP32 keeps nothing, precision/recall/F1 are NaN and a note says so (no 1.0 for a
comparison that did not happen). When every quantized class score is one value while
FP32's vary, a note says the class scores are lost.

The layout is declared (``--layout NAME=detect:...``, :mod:`quantscope.tasks.layout`) or
detected from the graph by :func:`detect_layout`: the output is a Concat whose first input
has 4 rows on the concat axis.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from quantscope.model.load import Model
from quantscope.tasks.shares import items_key, share_counts
from quantscope.types import Metrics, Outputs, QuantscopeError, moved_axis
from quantscope.units import value

BOX_FORMATS = ("cxcywh", "xyxy")
DEFAULT_THRESHOLD = 0.25
DEFAULT_IOU = 0.5
MAX_CANDIDATES = 3000  # per sample, highest scores first, before NMS
F1_RESEMBLES = 0.9  # below it, the detections are NOT LIKE FP32's


@dataclass(frozen=True)
class DetectionLayout:
    """Where boxes and scores sit in a detection output.

    ``axis``: the row axis of the full output as the model declares it (batch axis
    included, non-negative); ``sample_axis``: the output's axis of the samples, which the
    scored arrays hold first (:func:`quantscope.types.moved_axis`);
    ``boxes`` / ``scores``: ``[start, stop)`` row ranges on it (``scores`` stop None: to
    the last row); ``objectness``: the row of a YOLOv5-style objectness (None: none), by
    which every class score is multiplied before the threshold (the confidence YOLOv5's
    NMS thresholds on)."""

    axis: int = 1
    boxes: tuple[int, int] = (0, 4)
    scores: tuple[int, int | None] = (4, None)
    box_format: str = "cxcywh"
    threshold: float = DEFAULT_THRESHOLD
    iou: float = DEFAULT_IOU
    objectness: int | None = None
    sample_axis: int = 0

    def score_rows(self, rows: int) -> tuple[int, int]:
        stop = rows if self.scores[1] is None else self.scores[1]
        return self.scores[0], stop

    def describe(self, rows: int | None = None) -> str:
        n_box = self.boxes[1] - self.boxes[0]
        if rows is None and self.scores[1] is None:
            cls = f"class rows {self.scores[0]}-"
        else:
            a, b = self.score_rows(rows or 0)
            cls = f"{b - a} class rows"
        obj = ("" if self.objectness is None else
               f" x objectness row {self.objectness}")
        return (f"{n_box} box rows ({self.box_format}) + {cls}{obj} on axis {self.axis}, "
                f"threshold {self.threshold:g}, NMS/match IoU {self.iou:g}")


def detect_layout(model: Model, output: str) -> DetectionLayout | None:
    """The layout of ``output`` when the graph shows it: a rank-3 output made by a Concat
    whose first input has 4 rows on the concat axis, and at least one more row."""
    node = next((n for n in model.graph.node if output in n.output), None)
    shapes = model.value_shapes()
    out_shape = shapes.get(output)
    if node is None or node.op_type != "Concat" or out_shape is None or len(out_shape) != 3:
        return None
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    axis = axis + 3 if axis < 0 else axis
    if axis == 0:
        return None
    dims = [shapes.get(i, ())[axis] if len(shapes.get(i, ())) == 3 else None for i in node.input]
    if dims[0] != 4 or len(dims) < 2:
        return None
    return DetectionLayout(axis=axis)


def split_rows(arr: np.ndarray, layout: DetectionLayout) -> tuple[np.ndarray, np.ndarray]:
    """One batch ``[N, ...]`` -> (boxes ``[N, A, 4]`` as x1 y1 x2 y2, scores ``[N, A, C]``,
    each multiplied by the anchor's objectness when the layout has one)."""
    if np.ndim(arr) <= max(layout.axis, layout.sample_axis):
        raise QuantscopeError(f"--layout: a detection output of shape {np.shape(arr)} has no "
                              f"axis {layout.axis}: give its row axis with axis=")
    axis = moved_axis(layout.axis, layout.sample_axis, np.ndim(arr))
    a = np.moveaxis(np.asarray(arr, dtype=np.float64), axis, -1)
    a = a.reshape(len(a), -1, a.shape[-1])
    b0, b1 = layout.boxes
    s0, s1 = layout.score_rows(a.shape[-1])
    obj = layout.objectness
    need = max(b1, s1, s0 + 1, -1 if obj is None else obj + 1)
    if need > a.shape[-1]:
        raise QuantscopeError(f"--layout: the detection output has {a.shape[-1]} rows on axis "
                              f"{layout.axis}, the layout needs {need}: fix "
                              "boxes=/scores=/obj= or axis=")
    boxes, scores = a[..., b0:b1], a[..., s0:s1]
    if obj is not None:
        scores = scores * a[..., obj:obj + 1]
    if layout.box_format == "cxcywh":
        cx, cy, w, h = (boxes[..., i] for i in range(4))
        boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=-1)
    return boxes, scores


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box in ``a [n, 4]`` with every box in ``b [m, 4]`` (x1 y1 x2 y2)."""
    lo = np.maximum(a[:, None, :2], b[None, :, :2])
    hi = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(hi - lo, 0, None), axis=-1)
    area = lambda x: np.prod(np.clip(x[:, 2:] - x[:, :2], 0, None), axis=-1)  # noqa: E731
    union = area(a)[:, None] + area(b)[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


@dataclass(frozen=True)
class Detections:
    """Kept detections of one sample."""

    boxes: np.ndarray  # [k, 4] x1 y1 x2 y2
    classes: np.ndarray  # [k]
    scores: np.ndarray  # [k], descending


def nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, iou: float) -> np.ndarray:
    """Class-aware greedy NMS: indices kept, highest score first."""
    order = np.argsort(-scores, kind="stable")
    keep: list[int] = []
    suppressed = np.zeros(len(scores), bool)
    overlaps = box_iou(boxes, boxes) if len(boxes) else np.zeros((0, 0))
    for i in order:
        if suppressed[i]:
            continue
        keep.append(int(i))
        suppressed |= (overlaps[i] > iou) & (classes == classes[i])
    return np.asarray(keep, dtype=np.int64)


def keep_detections(boxes: np.ndarray, scores: np.ndarray, layout: DetectionLayout) -> Detections:
    """One sample (``[A, 4]``, ``[A, C]``): best class per anchor, score >= threshold,
    the ``MAX_CANDIDATES`` best, class-aware NMS."""
    cls = np.argmax(scores, axis=-1) if scores.shape[-1] else np.zeros(len(scores), np.int64)
    best = np.max(scores, axis=-1) if scores.shape[-1] else np.zeros(len(scores))
    cand = np.flatnonzero(best >= layout.threshold)
    cand = cand[np.argsort(-best[cand], kind="stable")][:MAX_CANDIDATES]
    kept = cand[nms(boxes[cand], best[cand], cls[cand], layout.iou)]
    return Detections(boxes[kept], cls[kept], best[kept])


def match(ref: Detections, test: Detections, iou: float) -> list[tuple[int, int, float]]:
    """Greedy one-to-one matching, FP32 detections by descending score: (ref index,
    test index, IoU) for each FP32 detection with a same-class test box at IoU >= ``iou``."""
    if not len(ref.scores) or not len(test.scores):
        return []
    overlaps = box_iou(ref.boxes, test.boxes)
    overlaps[ref.classes[:, None] != test.classes[None, :]] = -1.0
    used = np.zeros(len(test.scores), bool)
    pairs = []
    for i in range(len(ref.scores)):  # ref.scores is descending
        row = np.where(used, -1.0, overlaps[i])
        j = int(np.argmax(row))
        if row[j] >= iou:
            used[j] = True
            pairs.append((i, j, float(row[j])))
    return pairs


def _batches(out: Outputs, name: str) -> Iterator[np.ndarray]:
    i = out.names.index(name)
    for b in out.batches:
        yield b[i]


def item_counts(n_ref: int, n_test: int, n_match: int) -> dict[str, float]:
    """The items each detection share is over (:mod:`quantscope.tasks.shares`): recall
    over FP32's detections, precision over the quantized ones, and F1 over the detections
    of either model with a matched pair counted once (``n_ref + n_test - n_match``).

    Why that count for F1: ``F1 = 2m / (n_ref + n_test)`` is made of three kinds of
    outcome, a matched pair (``m``), an FP32 detection missed and a quantized one extra;
    those are the independent items. FP32's detections alone (the count used before)
    leave out the extras; both models' detections (``n_ref + n_test``) count each
    matched pair twice, though its two detections are one event. Over the outcomes the
    binomial variance of F1 (delta method) is ``F1 (1 - F1) / n`` with
    ``n = (n_ref + n_test)^2 / (2 (n_ref + n_test - m))``, which is at least this count
    where F1 >= 0.59: the noise said is then not too small (at most 1.41x too wide, as
    F1 nears 1)."""
    return {items_key("detection_recall"): float(n_ref),
            items_key("detection_precision"): float(n_test),
            items_key("detection_f1"): float(n_ref + n_test - n_match)}


def detection_metrics(ref_batches: list[np.ndarray], test_batches: list[np.ndarray],
                      layout: DetectionLayout, output: str) -> Metrics:
    """The module table's metrics of one detection output over its batches."""
    n_ref = n_test = n_match = anchors = side_same = 0
    sides: list[np.ndarray] = []  # each sample's anchors on FP32's side
    sizes: list[np.ndarray] = []  # each sample's anchors
    ious: list[float] = []
    err = 0.0
    test_values: set[float] = set()
    ref_lo, ref_hi = np.inf, -np.inf
    class_max: np.ndarray | None = None  # FP32's highest score of each class
    for r, t in zip(ref_batches, test_batches, strict=True):
        rb, rs = split_rows(r, layout)
        tb, ts = split_rows(t, layout)
        if rs.size:
            top = rs.reshape(-1, rs.shape[-1]).max(axis=0)
            class_max = top if class_max is None else np.maximum(class_max, top)
            err = max(err, float(np.max(np.abs(ts - rs))))
            ref_lo, ref_hi = min(ref_lo, float(rs.min())), max(ref_hi, float(rs.max()))
            if len(test_values) < 2:
                test_values.update(np.unique(ts)[:2].tolist())
            rbest, tbest = rs.max(axis=-1), ts.max(axis=-1)
            same = (rbest >= layout.threshold) == (tbest >= layout.threshold)
            sides.append(same.reshape(len(same), -1).sum(axis=1))
            sizes.append(np.full(len(same), same[0].size if len(same) else 0))
            side_same += int(np.sum(same))
            anchors += rbest.size
        for k in range(len(rb)):
            dr = keep_detections(rb[k], rs[k], layout)
            dt = keep_detections(tb[k], ts[k], layout)
            pairs = match(dr, dt, layout.iou)
            n_ref, n_test, n_match = n_ref + len(dr.scores), n_test + len(dt.scores), n_match + len(pairs)
            ious.extend(p[2] for p in pairs)
    nan = float("nan")
    values = {
        "class_score_max_abs_error": err,
        "score_side_agreement": side_same / anchors if anchors else nan,
        **(share_counts("score_side_agreement", np.concatenate(sides), np.concatenate(sizes))
           if anchors else {}),
        "detections_fp32": float(n_ref), "detections_quantized": float(n_test),
        "detection_precision": nan, "detection_recall": nan, "detection_f1": nan,
        **item_counts(n_ref, n_test, n_match),
        "box_iou_mean": float(np.mean(ious)) if ious else nan,
    }
    notes: list[str] = []
    if n_ref == 0:
        notes.append(f"output '{output}': FP32 keeps no detection at score >= "
                     f"{layout.threshold:g}: detection agreement not measured (declare a lower "
                     f"threshold: --layout {output}=detect:threshold=T)")
    else:
        p = n_match / n_test if n_test else 0.0
        rec = n_match / n_ref
        values.update({"detection_precision": p, "detection_recall": rec,
                       "detection_f1": 2 * p * rec / (p + rec) if p + rec else 0.0})
    if n_ref and class_max is not None:
        notes += _absent_classes(output, class_max, layout.threshold)
    if len(test_values) == 1 and ref_hi > ref_lo:
        v = next(iter(test_values))
        notes.append(f"output '{output}': class scores lost: every score quantizes to {v:.4g} "
                     f"(FP32's span {ref_lo:.4g}..{ref_hi:.4g}); the boxes' range sets the grid "
                     "of the whole output: give the score branch its own grid (16 bit or a "
                     "separate output)")
    f1 = values["detection_f1"]
    if np.isfinite(f1) and f1 < F1_RESEMBLES:
        notes.append(f"NOT LIKE FP32: output '{output}' detections F1 "
                     f"{value('detection_f1', f1)} vs FP32 (recall "
                     f"{value('detection_recall', values['detection_recall'])}, {n_test} kept "
                     f"vs FP32's {n_ref}) < {value('detection_f1', F1_RESEMBLES)}")
    return Metrics(values=values, notes=tuple(notes))


def _absent_classes(output: str, class_max: np.ndarray, threshold: float) -> list[str]:
    """The note naming the classes FP32 never scores at the threshold on this data (the
    data holds none of them: their detections are not measured, and the per-channel check
    reads their rows, which stay far below the grid step, as collapsed)."""
    absent = np.flatnonzero(class_max < threshold)
    if not len(absent):
        return []
    shown = ", ".join(str(int(k)) for k in absent[:8]) + (", …" if len(absent) > 8 else "")
    return [f"output '{output}': FP32 never scores {len(absent)} of its {len(class_max)} "
            f"classes at {threshold:g} on this data (classes {shown}; the highest of their "
            f"scores {float(class_max[absent].max()):.2g}): their detections are not measured, and "
            "the per-channel check of their rows says little; give data where they occur"]


@dataclass(frozen=True, eq=False)
class DetectionTask:
    """One detection output scored as detections (module table); row-local: any subset of
    samples is scored alike."""

    name: str
    output: str
    layout: DetectionLayout
    headline: str = "detection_f1"
    higher_is_better: bool = True
    row_local: bool = True

    def metrics(self, ref: Outputs, test: Outputs) -> Metrics:
        return detection_metrics(list(_batches(ref, self.output)),
                                 list(_batches(test, self.output)), self.layout, self.output)
