"""A ``points`` layout read into its task (:class:`quantscope.tasks.points.PointsTask`):
``dims``, ``tol``, ``flags`` and ``threshold`` checked against the output, ``scale`` (a
number, or ``input``: the image input's width and height, :func:`input_scale`) and
``order``. Its syntax is checked in :mod:`quantscope.tasks.layout_spec`."""

from __future__ import annotations

import re

import numpy as np

from quantscope.model.load import Model
from quantscope.tasks.layout_detect import dims as _dims
from quantscope.tasks.layout_detect import float_option as _float
from quantscope.tasks.layout_spec import LayoutSpec
from quantscope.tasks.layout_spec import fail as _fail
from quantscope.tasks.layout_spec import rows as _rows
from quantscope.tasks.pixels import image_input
from quantscope.tasks.points import FLAG_THRESHOLD, ORDERS, POINT_DIMS, SCALE_INPUT, PointsTask
from quantscope.tasks.points_gate import PointsGate, parse_where
from quantscope.types import QuantscopeError


def input_scale(spec: LayoutSpec, model: Model) -> tuple[tuple[float, float], str]:
    """``scale=input``: the x, y factors to pixels, the image input's width and height
    (a non-square input's each), and where they came from in words; one line naming
    ``scale=S`` when the model has no one image input of a fixed size."""
    try:
        found = image_input(model)
    except QuantscopeError as e:
        why = re.split(r": (?:give|images fill|make)\b", str(e))[0]  # its advice is for data
        raise _fail(spec.text, f"scale={SCALE_INPUT} takes the image input's side, and {why}: "
                    "give the side in pixels instead (scale=48: shares of a 48-px crop; "
                    "scale=12: P-Net's 12-px window)") from None
    return ((float(found.width), float(found.height)),
            f"scale={SCALE_INPUT}, the width and height of input '{found.name}', "
            f"{found.width} x {found.height}")


def points_task(spec: LayoutSpec, model: Model, shape: tuple | None, name: str) -> PointsTask:
    """The task of ``OUT=points:...``, its keys checked against the output's shape."""
    dims = int(spec.option("dims") or POINT_DIMS)
    order = (spec.option("order") or ORDERS[0]).lower()
    if order == "channels" and shape is not None and len(shape) > 2 and isinstance(
            shape[1], int) and shape[1] % dims:
        raise _fail(spec.text, f"output '{spec.output}' has shape {_dims(shape)}: axis 1 "
                    f"holds {shape[1]} values per position, no whole number of points of "
                    f"{dims} values: give dims=D")
    rest = [d for d in (shape or ())[1:]]
    if shape is not None and all(isinstance(d, int) for d in rest):
        size = int(np.prod(rest)) if rest else 1
        if size % dims:
            raise _fail(spec.text, f"output '{spec.output}' has shape {_dims(shape)}: "
                        f"{size} values per sample are no whole number of points of {dims} "
                        "values: give dims=D (e.g. 3 for x, y, z)")
    tol = spec.option("tol")
    flags = _rows(spec, "flags")
    if flags is not None:
        a, b = flags[0], dims if flags[1] is None else flags[1]
        if a < 2 or b > dims:
            raise _fail(spec.text, f"flags '{spec.option('flags')}' are no values of a point "
                        f"of {dims} after its x, y (values 0, 1): give flags=A-B with 2 <= A "
                        f"<= B <= {dims - 1}, counted from 0 (MediaPipe pose's visibility and "
                        "presence: dims=5,flags=3-4)")
        flags = (a, b)
    elif spec.option("threshold") is not None:
        raise _fail(spec.text, "threshold decides the flags: give flags=A-B with it")
    raw = spec.option("scale")
    scale, read = None, ""
    if raw is not None and raw.lower() == SCALE_INPUT:
        scale, read = input_scale(spec, model)
    elif raw is not None:
        scale, read = (float(raw), float(raw)), f"scale={float(raw):g}"
    photo = spec.option("photo")
    return PointsTask(name=name, output=spec.output, dims=dims,
                      tolerance=None if tol is None else float(tol), flags=flags,
                      flag_threshold=_float(spec, "threshold", FLAG_THRESHOLD),
                      scale=scale, scale_read=read,
                      order=order, map_hint=map_hint(spec, model, shape, dims, order),
                      photo=None if photo is None else float(photo),
                      gate=gate(spec, model, shape, order))


def gate(spec: LayoutSpec, model: Model, shape: tuple | None, order: str
         ) -> PointsGate | None:
    """The ``where=OUT:K>T`` of a points layout, checked against the model: OUT another
    output, K a channel of its axis 1, and its values per sample either one or one per
    position of the points' map read ``order=channels`` (the same positions)."""
    raw = spec.option("where")
    found = None if raw is None else parse_where(raw)
    if found is None:
        return None
    outputs = model.output_names()
    if found.output == spec.output or found.output not in outputs:
        others = ", ".join(repr(o) for o in outputs if o != spec.output) or "none"
        raise _fail(spec.text, f"where={raw}: '{found.output}' is no other output of the "
                    f"model: give one of {others} (the score that decides where a host "
                    "draws these points)")
    gshape = model.value_shapes().get(found.output)
    if gshape is None:
        return found
    c = gshape[1] if len(gshape) > 1 else None
    if len(gshape) < 2 or (isinstance(c, int) and found.channel >= c):
        raise _fail(spec.text, f"where={raw}: output '{found.output}' has shape "
                    f"{_dims(gshape)}: channel {found.channel} is no channel of its axis 1 "
                    f"(give 0..{c - 1 if isinstance(c, int) else 'C-1'})")
    rest, mine = gshape[2:], (shape or ())[2:]
    if all(isinstance(d, int) for d in rest) and int(np.prod(rest)) == 1:
        return found  # one value per sample: every point of a sample, or none
    same = order == "channels" and (shape is None or len(rest) == len(mine) and all(
        a == b for a, b in zip(rest, mine, strict=True) if isinstance(a, int) and isinstance(b, int)))
    if not same:
        raise _fail(spec.text, f"where={raw}: output '{found.output}' of shape "
                    f"{_dims(gshape)} gives a value per position, and '{spec.output}'"
                    f"{f' of shape {_dims(shape)}' if shape is not None else ''} is not read "
                    "at the same positions: read it by position (order=channels, a map of the "
                    "same positions) or gate it by a score of one value per sample")
    return found


def map_hint(spec: LayoutSpec, model: Model, shape: tuple | None, dims: int, order: str
             ) -> str:
    """The note for a map ``[N, C, h, w]`` (the graph's channel axis 1: a Conv's) of more
    than one position read as one run of values per sample: its points pair values of
    neighbouring positions (MTCNN's P-Net boxes on a whole photo); ``order=channels``
    reads each position's C values."""
    from quantscope.model.axes import output_channel_axes

    if order == "channels" or shape is None or len(shape) < 4:
        return ""
    positions = shape[2:]
    one = all(isinstance(d, int) for d in positions) and int(np.prod(positions)) == 1
    c = shape[1]
    if one or not isinstance(c, int) or c < 2 or c % dims or \
            output_channel_axes(model).get(spec.output) != 1:
        return ""
    return (f"output '{spec.output}' of shape {_dims(shape)} is a map of {c} channels (the "
            f"graph's axis 1) read as one run of values per sample, {order}: its points pair "
            f"values of neighbouring positions; if each position's {c} values are its points "
            f"(a box map's corner offsets: MTCNN's P-Net), --layout {spec.output}=points:"
            "order=channels reads them")
