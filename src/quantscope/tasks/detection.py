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

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from quantscope.emulate.class_axes import ClassAxis
from quantscope.model.load import Model
from quantscope.tasks.grid_head import decode_dfl, decode_grid
from quantscope.tasks.shares import items_key, share_counts
from quantscope.tasks.unscored import MARK as UNSCORED
from quantscope.types import Metrics, Outputs, QuantscopeError, moved_axis
from quantscope.units import value

BOX_FORMATS = ("cxcywh", "xyxy")
DEFAULT_THRESHOLD = 0.25
DEFAULT_IOU = 0.5
MAX_CANDIDATES = 3000  # per sample, highest scores first, before NMS
F1_RESEMBLES = 0.9  # below it, the detections are NOT LIKE FP32's
SSD_MIN_ANCHORS = 16  # ssd_heads_hint: fewer rows on axis 1 are not taken for anchors


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
    scores_output: str | None = None
    anchors: str | None = None
    grid: tuple[int, ...] = ()  # strides of an anchor-free grid head (YOLOX): boxes decoded
    dfl: int | None = None  # bins per side of box distributions (PicoDet, YOLOv8) on the grid
    centre: float = 0.5  # a cell's point in cells from its corner, of dfl boxes
    input_size: tuple[int, int] | None = None  # the image input's H, W (None: square grids)
    levels: tuple[str, ...] = ()  # the box outputs of the head's other levels, in order
    score_levels: tuple[str, ...] = ()  # the score outputs of the other levels

    def outputs(self, output: str) -> tuple[str, ...]:
        """The outputs read: the box output and its other levels', then the scores'
        outputs when others (level by level)."""
        scores = () if self.scores_output is None else (self.scores_output, *self.score_levels)
        return (output, *self.levels, *scores)

    def score_rows(self, rows: int) -> tuple[int, int]:
        stop = rows if self.scores[1] is None else self.scores[1]
        return self.scores[0], stop

    def unread_rows(self, box_rows: int) -> list[int]:
        """The rows of the box output (``box_rows`` of them) no box, score or objectness
        is read from (an SSD's key points, a post-processed output's class id)."""
        used = set(range(*self.boxes)) | ({self.objectness} - {None})
        if self.scores_output is None:
            used |= set(range(*self.score_rows(box_rows)))
        return sorted(set(range(box_rows)) - used)

    def row_words(self, box_rows: int | None = None) -> str:
        """What the box output's rows are, in words (its per-channel figures' channels):
        ``box values, scores``; a DFL head's ``box distribution bins (4 sides x 8)``; the
        scores said to be elsewhere where another output holds them (``scores_from=``). h70: a DFL head's
        bin logits had been said ``box values, scores``. With ``box_rows`` (the box
        output's count on the row axis) the rows no box, score or objectness is read from
        are counted (:meth:`unread_rows`: BlazeFace's 12 key-point values of its 16 rows,
        h73: they had been said box values)."""
        boxes = f"box distribution bins (4 sides x {self.dfl})" if self.dfl else "box values"
        obj = "" if self.objectness is None else ", objectness"
        unread = self.unread_rows(box_rows) if box_rows is not None else []
        if unread:
            n = self.boxes[1] - self.boxes[0]
            boxes = f"{n} {boxes}" if not self.dfl else boxes
            obj += (f"; {len(unread)} row{'' if len(unread) == 1 else 's'} not read by the "
                    f"detection layout (rows {_ranges(unread)})")
        if self.scores_output is not None:
            return f"{boxes}{obj}; its scores in another output, scores_from="
        return f"{boxes}, scores{obj}"

    def describe(self, rows: int | None = None, box_rows: int | None = None) -> str:
        """``rows``: the score rows' output's count on the row axis, ``box_rows`` the box
        output's (None: not known)."""
        n_box = self.boxes[1] - self.boxes[0]
        read = f"{n_box} box rows ({self.box_format})"
        if self.dfl:
            read = f"4 box sides x {self.dfl} bins (rows {self.boxes[0]}-{self.boxes[1] - 1})"
        if rows is None and self.scores[1] is None:
            cls = f"class rows {self.scores[0]}-"
        else:
            a, b = self.score_rows(rows or 0)
            cls = f"{b - a} class rows"
        obj = ("" if self.objectness is None else
               f" x objectness row {self.objectness}")
        if self.scores_output is not None:
            cls += f" of output '{self.scores_output}'"
            cls += "".join(f" + '{o}'" for o in self.score_levels)
        boxes = ("" if self.anchors is None else
                 f", box centres offset by the anchor centres of '{self.anchors}'")
        grid = "/".join(map(str, self.grid))
        on = "" if self.input_size is None else \
            f" of the {self.input_size[0]}x{self.input_size[1]} input"
        if self.levels:
            boxes += f", pooled with levels {', '.join(repr(o) for o in self.levels)}"
        if self.grid and self.dfl:
            boxes += (f", boxes decoded from distributions on the grid of strides {grid}{on} "
                      f"(x1 = (col + {self.centre:g}) * stride - sum(softmax(bins) * "
                      f"0..{self.dfl - 1}) * stride)")
        elif self.grid:
            boxes += (f", boxes decoded on the grid of strides {grid}{on}"
                      " (cx = (x + col) * stride, w = exp(w) * stride)")
        unread = self.unread_rows(box_rows) if box_rows is not None else []
        left = ("" if not unread else f"; rows {_ranges(unread)} not read (key points, ids: "
                f"{UNSCORED})")
        return (f"{read} + {cls}{obj} on axis {self.axis}"
                f"{boxes}, threshold {self.threshold:g}, NMS/match IoU {self.iou:g}{left}")


def _ranges(rows: list[int]) -> str:
    """``[4, 5, 6, 9]`` -> ``4-6, 9``."""
    spans: list[list[int]] = []
    for r in rows:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in spans)


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


@functools.lru_cache(maxsize=8)
def read_anchors(path: str) -> np.ndarray:
    """The anchor centres ``[A, 2]`` (x, y in the boxes' units) of an ``.npy`` file;
    :class:`QuantscopeError` naming what is wrong."""
    if not Path(path).is_file():  # a FIFO would block, a folder is no array
        raise QuantscopeError(f"anchors '{path}' is no regular file: give the .npy file of "
                              "the anchor centres")
    try:
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise QuantscopeError(f"anchors '{path}' cannot be read as an .npy array ({e}): save "
                              "the anchor centres with np.save(path, centres)") from None
    if not isinstance(arr, np.ndarray) or arr.ndim != 2 or arr.shape[1] != 2 \
            or arr.dtype.kind not in "fiu":
        raise QuantscopeError(f"anchors '{path}' holds {getattr(arr, 'shape', '?')} "
                              f"{getattr(arr, 'dtype', '')}, not [anchors, 2] numbers: save "
                              "each anchor's centre x, y in the boxes' units")
    arr = arr.astype(np.float64)
    if not np.all(np.isfinite(arr)):
        raise QuantscopeError(f"anchors '{path}' holds NaN or inf: give finite centres")
    arr.setflags(write=False)
    return arr


def _rows_last(arr: np.ndarray, layout: DetectionLayout, what: str) -> np.ndarray:
    """``arr`` ``[N, ...]`` with its row axis last, its anchors flattened: ``[N, A, R]``."""
    if np.ndim(arr) <= max(layout.axis, layout.sample_axis):
        raise QuantscopeError(f"--layout: a detection {what} of shape {np.shape(arr)} has no "
                              f"axis {layout.axis}: give its row axis with axis=")
    axis = moved_axis(layout.axis, layout.sample_axis, np.ndim(arr))
    a = np.moveaxis(np.asarray(arr, dtype=np.float64), axis, -1)
    return a.reshape(len(a), -1, a.shape[-1])


def ssd_heads_hint(model: Model, taken: set[str]) -> list[str]:
    """A note for each pair of float outputs that look like an SSD's two heads (BlazeFace's
    ``regressors [N, A, 16]`` and ``classificators [N, A, 1]``: rank 3, the same anchors on
    axis 1 (at least ``SSD_MIN_ANCHORS``), 4 box values and x, y key points (at most 64
    values) beside fewer) and that no task reads (``taken``): they are
    scored for fidelity only, and the note says how to score them as detections. Nothing
    is read as detections without being declared: the rows' meaning is the user's."""
    shapes = model.value_shapes()
    types = model.value_types()
    outs = [o for o in model.output_names() if o not in taken
            and types.get(o) == onnx.TensorProto.FLOAT]
    dims = {o: shapes.get(o) for o in outs}
    notes = []
    for boxes in outs:
        b = dims[boxes]
        # many anchors (an SSD's hundreds), 4 box values + x, y key points each
        if b is None or len(b) != 3 or not all(isinstance(d, int) for d in b[1:]) \
                or b[1] < SSD_MIN_ANCHORS or not 4 <= b[2] <= 64 or (b[2] - 4) % 2:
            continue
        for scores in outs:
            c = dims[scores]
            if scores == boxes or c is None or len(c) != 3 or c[1] != b[1] \
                    or not isinstance(c[2], int) or not 1 <= c[2] < b[2]:
                continue
            notes.append(f"outputs '{boxes}' {_shape(b)} and '{scores}' {_shape(c)} hold rows "
                         f"for the same {b[1]} anchors: if they are an SSD's boxes and scores, "
                         f"--layout {boxes}=detect:axis=2,scores_from={scores} (with "
                         "anchors=CENTRES.npy for boxes given as offsets to anchors, threshold=0 "
                         f"for logits) scores them as detections; they are {UNSCORED} now")
    return notes


def _shape(dims: tuple) -> str:
    return "[" + ", ".join(str(d) if isinstance(d, int) else "?" for d in dims) + "]"


def _levels(arrs: tuple, layout: DetectionLayout, what: str) -> np.ndarray:
    """Each level's ``[N, ...]`` with its row axis last, the anchors of the levels one
    after the other: ``[N, A, R]``."""
    parts = [_rows_last(x, layout, what) for x in arrs]
    if len({p.shape[-1] for p in parts}) > 1 or len({len(p) for p in parts}) > 1:
        raise QuantscopeError(f"--layout: the levels' {what}s have {[p.shape for p in parts]}: "
                              "give levels= outputs of the same rows and samples")
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)


def split_rows(arr: np.ndarray | tuple, layout: DetectionLayout,
               scores_arr: np.ndarray | tuple | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One batch ``[N, ...]`` -> (boxes ``[N, A, 4]`` as x1 y1 x2 y2, scores ``[N, A, C]``,
    each multiplied by the anchor's objectness when the layout has one). ``arr``: the box
    output's batch, or a tuple of it and its other levels' (``layout.levels``);
    ``scores_arr``: the batch (or the levels' batches) of the scores' own output
    (``layout.scores_output``), same anchors; box centres are offset by the layout's anchor
    centres when it names a file, decoded on its grid when it gives strides."""
    a = _levels(arr if isinstance(arr, tuple) else (arr,), layout, "output")
    s = a if scores_arr is None else _levels(
        scores_arr if isinstance(scores_arr, tuple) else (scores_arr,), layout, "score output")
    if s.shape[:2] != a.shape[:2]:
        raise QuantscopeError(f"--layout: the score output has {s.shape[1]} anchors, the box "
                              f"output {a.shape[1]}: give a score output of the same anchors")
    b0, b1 = layout.boxes
    s0, s1 = layout.score_rows(s.shape[-1])
    obj = layout.objectness
    need = max(b1, -1 if obj is None else obj + 1,
               *(() if scores_arr is not None else (s1, s0 + 1)))
    if need > a.shape[-1] or (scores_arr is not None and max(s1, s0 + 1) > s.shape[-1]):
        raise QuantscopeError(f"--layout: the detection output has {a.shape[-1]} rows on axis "
                              f"{layout.axis}, the layout needs {need}: fix "
                              "boxes=/scores=/obj= or axis=")
    boxes, scores = a[..., b0:b1], s[..., s0:s1]
    if obj is not None:
        scores = scores * a[..., obj:obj + 1]
    if layout.anchors is not None:
        boxes = _shift(boxes, layout)
    if layout.dfl:
        return decode_dfl(boxes, layout.grid, layout.dfl, layout.centre, layout.input_size), \
            scores
    if layout.grid:
        boxes = decode_grid(boxes, layout.grid, layout.input_size)
    if layout.box_format == "cxcywh":
        cx, cy, w, h = (boxes[..., i] for i in range(4))
        boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=-1)
    return boxes, scores


def _shift(boxes: np.ndarray, layout: DetectionLayout) -> np.ndarray:
    """Boxes offset by the anchor centres of ``layout.anchors``."""
    assert layout.anchors is not None
    centres = read_anchors(layout.anchors)
    if len(centres) != boxes.shape[1]:
        raise QuantscopeError(f"--layout: anchors '{layout.anchors}' has {len(centres)} "
                              f"anchors, the output {boxes.shape[1]}: give one centre per "
                              "anchor")
    shift = np.tile(centres, 2) if layout.box_format == "xyxy" else \
        np.concatenate([centres, np.zeros_like(centres)], axis=1)
    return boxes + shift


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


def _split_batch(batch: np.ndarray | tuple, layout: DetectionLayout
                 ) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(batch, tuple):
        n = 1 + len(layout.levels)
        return split_rows(tuple(batch[:n]), layout, tuple(batch[n:]) or None)
    return split_rows(batch, layout)


def detection_metrics(ref_batches: list, test_batches: list,
                      layout: DetectionLayout, output: str) -> Metrics:
    """The module table's metrics of one detection output over its batches (each batch an
    array, or a tuple ``(boxes' output, scores' output)`` when the layout names a score
    output of its own)."""
    n_ref = n_test = n_match = anchors = side_same = 0
    sides: list[np.ndarray] = []  # each sample's anchors on FP32's side
    sizes: list[np.ndarray] = []  # each sample's anchors
    ious: list[float] = []
    err = 0.0
    test_values: set[float] = set()
    ref_lo, ref_hi = np.inf, -np.inf
    class_max: np.ndarray | None = None  # FP32's highest score of each class
    for r, t in zip(ref_batches, test_batches, strict=True):
        rb, rs = _split_batch(r, layout)
        tb, ts = _split_batch(t, layout)
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
                     f"{layout.threshold:g}: detection agreement not measured, the F1 says "
                     f"little (declare a lower threshold: --layout {output}=detect:threshold=T, "
                     "or give data where the model detects something)")
    else:
        # no detection kept: precision is 0/0 (not measured, was shown as 0.0 %), F1 is 0
        p = n_match / n_test if n_test else nan
        rec = n_match / n_ref
        values.update({"detection_precision": p, "detection_recall": rec,
                       "detection_f1": 2 * p * rec / (p + rec) if n_test and p + rec else 0.0})
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

    def class_axes(self) -> dict[str, ClassAxis]:
        """The per-channel figures read the rows on the layout's row axis, not the anchors:
        the box output's and its other levels' (:meth:`DetectionLayout.row_words`: box
        values or a DFL head's distribution bins, and the scores where they are rows of
        it), and the score outputs' (``scores_from=``: the classes, on the same axis,
        which the layout checks), whose own graph axis is often the anchors (a Concat of
        the levels)."""
        lay, boxes = self.layout, (self.output, *self.layout.levels)
        scores = () if lay.scores_output is None else (lay.scores_output, *lay.score_levels)
        return {**{o: ClassAxis(lay.axis, lay.sample_axis, f"the rows ({lay.row_words()}) "
                                "of its detection layout", why_of=self._rows_read) for o in boxes},
                **{o: ClassAxis(lay.axis, lay.sample_axis, "the class scores of its "
                                "detection layout (scores_from=)") for o in scores}}

    def _rows_read(self, rows: int) -> str:
        """The box output's rows in words, ``rows`` of them (:meth:`DetectionLayout.row_words`)."""
        return f"the rows ({self.layout.row_words(rows)}) of its detection layout"

    def metrics(self, ref: Outputs, test: Outputs) -> Metrics:
        names = self.layout.outputs(self.output)
        if len(names) == 1:
            return detection_metrics(list(_batches(ref, self.output)),
                                     list(_batches(test, self.output)), self.layout, self.output)
        return detection_metrics(list(zip(*(_batches(ref, n) for n in names), strict=True)),
                                 list(zip(*(_batches(test, n) for n in names), strict=True)),
                                 self.layout, self.output)
