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
from quantscope.tasks.grid_head import grid_cells, grid_option
from quantscope.tasks.layout_spec import LayoutSpec, dfl_bins
from quantscope.tasks.layout_spec import fail as _fail
from quantscope.tasks.layout_spec import rows as _rows
from quantscope.tasks.pixels import image_input
from quantscope.types import QuantscopeError


def others(rank: int | None, samples: int | None) -> str:
    """The axes of an output of ``rank`` axes but its ``samples`` one, in words."""
    last = (rank or 2) - 1
    if not samples:
        return f"1..{last}"
    return f"0..{last} but {samples}" if rank is not None else f"any but {samples}"


def _names(spec: LayoutSpec, model: Model, key: str) -> tuple[str, ...]:
    """The outputs an option names, ``+`` between them (an output whose own name holds
    ``+`` is taken whole), each checked: another output of the model, named once."""
    raw = spec.option(key)
    if raw is None:
        return ()
    outputs = model.output_names()
    names = (raw,) if raw in outputs else tuple(n.strip() for n in raw.split("+"))
    for name in names:
        if name not in outputs or name == spec.output:
            raise _fail(spec.text, f"{key} '{name}' is no other output of the model "
                        f"(outputs: {', '.join(o for o in outputs if o != spec.output)})")
    if len(set(names)) < len(names):
        raise _fail(spec.text, f"{key} names an output twice: give each once, '+' between")
    return names


def _same_anchors(spec: LayoutSpec, name: str, other: tuple | None, box: str,
                  shape: tuple | None, axis: int, what: str) -> None:
    """``other`` (output ``name``'s shape) has ``shape``'s (output ``box``'s) anchors: its
    dims but the row axis."""
    if shape is None or other is None:
        return
    same = len(other) == len(shape) and all(
        k == axis or not isinstance(a, int) or not isinstance(b, int) or a == b
        for k, (a, b) in enumerate(zip(shape, other, strict=True)))
    if not same:
        differ = [k for k, (a, b) in enumerate(zip(shape, other, strict=False)) if a != b]
        hint = (f": give axis={differ[0]}, the axis they differ on" if len(other) ==
                len(shape) and len(differ) == 1 and spec.option("axis") is None else "")
        raise _fail(spec.text, f"{what} '{name}' has shape {dims(other)}, output "
                    f"'{box}' {dims(shape)}: the two must differ only on the row "
                    f"axis {axis} (one score row set per anchor){hint}")


def _scores_from(spec: LayoutSpec, model: Model, boxes: tuple[str, ...], axis: int
                 ) -> tuple[tuple[str, ...], tuple | None]:
    """The score outputs a layout names (``scores_from=``, one per level: ``boxes`` the
    box outputs) and the first one's shape, checked: other outputs of the model, each of
    its level's box output's rank and anchors (its dims but the row axis)."""
    names = _names(spec, model, "scores_from")
    if not names:
        return (), None
    if len(names) != len(boxes):
        raise _fail(spec.text, f"scores_from names {len(names)} output(s), the head has "
                    f"{len(boxes)} level(s) (the box output and levels=): give one score "
                    "output per level, in the same order, '+' between")
    shapes = model.value_shapes()
    for name, box in zip(names, boxes, strict=True):
        _same_anchors(spec, name, shapes.get(name), box, shapes.get(box), axis, "scores_from")
    return names, shapes.get(names[0])


def _levels(spec: LayoutSpec, model: Model | None, shape: tuple | None, axis: int
            ) -> tuple[str, ...]:
    """The box outputs of the head's other levels (``levels=``), each of the box output's
    rows on ``axis`` and rank."""
    if model is None:
        raw = spec.option("levels")
        return () if raw is None else tuple(n.strip() for n in raw.split("+"))
    names = _names(spec, model, "levels")
    for name in names:
        other = model.value_shapes().get(name)
        if shape is not None and other is not None and (
                len(other) != len(shape) or other[axis] != shape[axis]):
            raise _fail(spec.text, f"levels '{name}' has shape {dims(other)}, output "
                        f"'{spec.output}' {dims(shape)}: each level's box output must have "
                        f"the same rank and rows on axis {axis}")
    return names


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
    bins = dfl_bins(spec)
    boxes = _rows(spec, "boxes") or (0, 4 * (bins or 1))
    obj_rows = _rows(spec, "obj")
    obj = None if obj_rows is None else obj_rows[0]
    levels = _levels(spec, model, shape, axis)
    scores_from, other = ((), None) if model is None else _scores_from(
        spec, model, (spec.output, *levels), axis)
    # default scores: the rows after the boxes (boxes first; after the objectness row when
    # it follows the boxes) or before them (boxes last); every row of a score output
    after = boxes[1] + (1 if obj == boxes[1] else 0)
    scores = _rows(spec, "scores") or (
        (0, None) if scores_from else (after, None) if boxes[0] == 0 else (0, boxes[0]))
    assert boxes[1] is not None
    rows = shape[axis] if shape is not None and isinstance(shape[axis], int) else None
    if bins and scores_from and rows is not None and rows != boxes[1] - boxes[0] \
            and spec.option("boxes") is None:
        raise _fail(spec.text, _dfl_rows(spec, rows, axis, bins))
    _check_rows(spec, rows, axis, boxes, obj, scores, bool(scores_from), other)
    grid, size = _grid(spec, model, [shape] + _shapes(model, levels), axis, samples or 0, bins)
    return DetectionLayout(axis=axis, sample_axis=samples or 0,
                           boxes=(boxes[0], boxes[1]), scores=scores,
                           box_format="xyxy" if bins else (spec.option("format") or
                                                           "cxcywh").lower(),
                           threshold=float_option(spec, "threshold", DEFAULT_THRESHOLD),
                           iou=float_option(spec, "iou", DEFAULT_IOU), objectness=obj,
                           scores_output=scores_from[0] if scores_from else None,
                           anchors=_anchors(spec, shape, axis, samples or 0), grid=grid,
                           dfl=bins, centre=float_option(spec, "centre", 0.5),
                           input_size=size, levels=levels, score_levels=scores_from[1:])


def _shapes(model: Model | None, names: tuple[str, ...]) -> list[tuple | None]:
    return [None if model is None else model.value_shapes().get(n) for n in names]


def _dfl_rows(spec: LayoutSpec, rows: int, axis: int, bins: int) -> str:
    """Why a box output's ``rows`` on ``axis`` are no 4 sides of ``bins`` bins, and the fix."""
    fix = (f"give dfl={rows // 4}" if rows % 4 == 0 else
           "check axis=: the bins of the 4 sides are the rows of one axis")
    return (f"dfl={bins}: output '{spec.output}' has {rows} rows on axis {axis}, not 4 sides x "
            f"{bins} bins ({4 * bins}): {fix}")


def _check_rows(spec: LayoutSpec, rows: int | None, axis: int, boxes: tuple, obj: int | None,
                scores: tuple, scores_from: bool, other: tuple | None) -> None:
    """The row ranges against the output's ``rows`` on ``axis`` (and the score output's,
    ``other``'s): within them, apart."""
    if rows is not None:
        last = max(boxes[1], -1 if obj is None else obj + 1,
                   0 if scores_from else scores[1] or scores[0] + 1)
        if last > rows:
            raise _fail(spec.text, f"output '{spec.output}' has {rows} rows on axis {axis}, the "
                        f"layout needs {last}: fix boxes=/scores=/obj= or axis=")
    score_rows = other[axis] if other is not None and isinstance(other[axis], int) else None
    if score_rows is not None and (scores[1] or scores[0] + 1) > score_rows:
        raise _fail(spec.text, f"scores_from '{spec.option('scores_from')}' has {score_rows} "
                    f"rows on axis {axis}, scores={spec.option('scores')} needs more: fix scores=")
    if not scores_from and scores[0] < boxes[1] and (
            scores[1] is None or scores[1] > boxes[0]):
        raise _fail(spec.text, "the box rows and the score rows overlap: give disjoint ranges")
    if obj is not None and (boxes[0] <= obj < boxes[1] or (not scores_from and
            scores[0] <= obj and (scores[1] is None or obj < scores[1]))):
        raise _fail(spec.text, f"the objectness row {obj} is a box or score row: give a row of "
                    "its own (e.g. boxes=0-3,obj=4,scores=5-)")


def input_size(model: Model | None) -> tuple[int, int] | None:
    """The H, W of the model's one image input (None: none found, or not fixed)."""
    if model is None:
        return None
    try:
        found = image_input(model)
    except QuantscopeError:
        return None
    return found.height, found.width


def _anchor_count(shape: tuple | None, axis: int, samples: int) -> int | None:
    dims_ = [d for k, d in enumerate(shape or ()) if k not in (samples, axis)]
    known = shape is not None and all(isinstance(d, int) for d in dims_)
    return int(np.prod(dims_)) if known else None


def _grid(spec: LayoutSpec, model: Model | None, shapes: list, axis: int, samples: int,
          bins: int | None) -> tuple[tuple[int, ...], tuple[int, int] | None]:
    """The strides of ``grid=`` and the input's H, W, checked against the anchors of each
    level's output (``shapes``: the box output's, then the other levels')."""
    if spec.option("grid") is None:
        return (), None
    size = input_size(model)
    counts = [_anchor_count(s, axis, samples) for s in shapes]
    try:
        strides = grid_option(spec.option("grid"), spec.option("format"), None, size, bins)
        if len(shapes) > 1 and len(strides) != len(shapes):
            raise QuantscopeError(f"grid={spec.option('grid')} gives {len(strides)} stride(s), "
                                  f"the head {len(shapes)} level output(s) (the box output "
                                  "and levels=): give one stride per level, in order")
        if len(shapes) > 1 and None not in counts:
            for stride, count in zip(strides, counts, strict=True):
                grid_cells((stride,), count, size)
        elif None not in counts:
            grid_cells(strides, sum(counts), size)
    except QuantscopeError as e:
        raise _fail(spec.text, str(e)) from None
    return strides, size


def float_option(spec: LayoutSpec, key: str, default: float) -> float:
    raw = spec.option(key)
    return default if raw is None else float(raw)


def dims(shape: tuple) -> tuple:
    return tuple(d if isinstance(d, int) else "?" for d in shape)
