"""``--layout OUT=detect:…``: a detection output's layout read and checked against the
output's shape (rows, the row axis, objectness, scores in another output, anchors, a
YOLOX grid), each bad value one error naming ``--layout`` and the fix
(:mod:`quantscope.tasks.layout` dispatches the kinds)."""

from __future__ import annotations

import numpy as np

from quantscope.model.load import Model
from quantscope.tasks.detection import (
    DEFAULT_IOU,
    DEFAULT_THRESHOLD,
    DetectionLayout,
    read_anchors,
)
from quantscope.tasks.grid_head import grid_option
from quantscope.tasks.layout_spec import LayoutSpec
from quantscope.tasks.layout_spec import fail as _fail
from quantscope.tasks.layout_spec import rows as _rows
from quantscope.types import QuantscopeError


def others(rank: int | None, samples: int | None) -> str:
    """The axes of an output of ``rank`` axes but its ``samples`` one, in words."""
    last = (rank or 2) - 1
    if not samples:
        return f"1..{last}"
    return f"0..{last} but {samples}" if rank is not None else f"any but {samples}"


def _scores_from(spec: LayoutSpec, model: Model, shape: tuple | None, axis: int
                 ) -> tuple[str | None, tuple | None]:
    """The score output a layout names (``scores_from=``) and its shape, checked: another
    output of the model, of the box output's rank and anchors (its dims but the row axis)."""
    name = spec.option("scores_from")
    if name is None:
        return None, None
    outputs = model.output_names()
    if name not in outputs or name == spec.output:
        raise _fail(spec.text, f"scores_from '{name}' is no other output of the model "
                    f"(outputs: {', '.join(o for o in outputs if o != spec.output)})")
    other = model.value_shapes().get(name)
    if shape is not None and other is not None:
        same = len(other) == len(shape) and all(
            k == axis or not isinstance(a, int) or not isinstance(b, int) or a == b
            for k, (a, b) in enumerate(zip(shape, other, strict=True)))
        if not same:
            differ = [k for k, (a, b) in enumerate(zip(shape, other, strict=False)) if a != b]
            hint = (f": give axis={differ[0]}, the axis they differ on" if len(other) ==
                    len(shape) and len(differ) == 1 and spec.option("axis") is None else "")
            raise _fail(spec.text, f"scores_from '{name}' has shape {dims(other)}, output "
                        f"'{spec.output}' {dims(shape)}: the two must differ only on the row "
                        f"axis {axis} (one score row set per anchor){hint}")
    return name, other


def _anchors(spec: LayoutSpec, shape: tuple | None, axis: int, samples: int) -> str | None:
    path = spec.option("anchors")
    if path is None:
        return None
    try:
        centres = read_anchors(path)
    except QuantscopeError as e:
        raise _fail(spec.text, str(e)) from None
    dims = [d for k, d in enumerate(shape or ()) if k not in (samples, axis)]
    if shape is not None and all(isinstance(d, int) for d in dims):
        anchors = int(np.prod(dims)) if dims else 1
        if anchors != len(centres):
            raise _fail(spec.text, f"anchors '{path}' holds {len(centres)} centres, output "
                        f"'{spec.output}' {anchors} anchors: give one centre per anchor")
    return path


def detection_layout(spec: LayoutSpec, shape: tuple | None, samples: int | None,
                      model: Model | None = None) -> DetectionLayout:
    """``samples``: the output's sample axis (None: not known yet, the data unread: 0
    assumed, not checked)."""
    rank = len(shape) if shape is not None else None
    raw = spec.option("axis")
    axis = int(raw) if raw is not None else (2 if samples == 1 else 1)
    if rank is not None and axis < 0:
        axis += rank
    if axis == samples or axis < 0 or (rank is not None and axis >= rank):
        where = f"of rank {rank}" if rank is not None else ""
        raise _fail(spec.text, f"axis {raw or axis} is not a row axis of output "
                    f"'{spec.output}' {where}: give one of {others(rank, samples)} "
                    f"({samples or 0} is the samples)")
    boxes = _rows(spec, "boxes") or (0, 4)
    obj_rows = _rows(spec, "obj")
    obj = None if obj_rows is None else obj_rows[0]
    scores_from, other = (None, None) if model is None else _scores_from(spec, model, shape, axis)
    # default scores: the rows after the boxes (boxes first; after the objectness row when
    # it follows the boxes) or before them (boxes last); every row of a score output
    after = boxes[1] + (1 if obj == boxes[1] else 0)
    scores = _rows(spec, "scores") or (
        (0, None) if scores_from else (after, None) if boxes[0] == 0 else (0, boxes[0]))
    assert boxes[1] is not None
    rows = shape[axis] if shape is not None and isinstance(shape[axis], int) else None
    if rows is not None:
        last = max(boxes[1], -1 if obj is None else obj + 1,
                   0 if scores_from else scores[1] or scores[0] + 1)
        if last > rows:
            raise _fail(spec.text, f"output '{spec.output}' has {rows} rows on axis {axis}, the "
                        f"layout needs {last}: fix boxes=/scores=/obj= or axis=")
    score_rows = other[axis] if other is not None and isinstance(other[axis], int) else None
    if score_rows is not None and (scores[1] or scores[0] + 1) > score_rows:
        raise _fail(spec.text, f"scores_from '{scores_from}' has {score_rows} rows on axis "
                    f"{axis}, scores={spec.option('scores')} needs more: fix scores=")
    if scores_from is None and scores[0] < boxes[1] and (
            scores[1] is None or scores[1] > boxes[0]):
        raise _fail(spec.text, "the box rows and the score rows overlap: give disjoint ranges")
    if obj is not None and (boxes[0] <= obj < boxes[1] or (scores_from is None and
            scores[0] <= obj and (scores[1] is None or obj < scores[1]))):
        raise _fail(spec.text, f"the objectness row {obj} is a box or score row: give a row of "
                    "its own (e.g. boxes=0-3,obj=4,scores=5-)")
    return DetectionLayout(axis=axis, sample_axis=samples or 0,
                           boxes=(boxes[0], boxes[1]), scores=scores,
                           box_format=(spec.option("format") or "cxcywh").lower(),
                           threshold=float_option(spec, "threshold", DEFAULT_THRESHOLD),
                           iou=float_option(spec, "iou", DEFAULT_IOU), objectness=obj,
                           scores_output=scores_from, anchors=_anchors(spec, shape, axis, samples or 0),
                           grid=_grid(spec, shape, axis, samples or 0))


def _grid(spec: LayoutSpec, shape: tuple | None, axis: int, samples: int) -> tuple[int, ...]:
    dims = [d for k, d in enumerate(shape or ()) if k not in (samples, axis)]
    known = shape is not None and all(isinstance(d, int) for d in dims)
    try:
        return grid_option(spec.option("grid"), spec.option("format"),
                           int(np.prod(dims)) if known else None)
    except QuantscopeError as e:
        raise _fail(spec.text, str(e)) from None


def float_option(spec: LayoutSpec, key: str, default: float) -> float:
    raw = spec.option(key)
    return default if raw is None else float(raw)


def dims(shape: tuple) -> tuple:
    return tuple(d if isinstance(d, int) else "?" for d in shape)
