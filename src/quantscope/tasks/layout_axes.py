"""The axes a ``class`` or ``map`` layout reads (:mod:`quantscope.tasks.layout`).

``class``: the class axis as given (``axis=K``), else the one non-sample axis of
``[N, C]``, else the graph's channel axis, else the first non-sample axis, said to be a
default, unless the model declares that axis symbolic (a ``dim_param`` or an unknown dim:
tokens, frames): its indexes are positions, so the last non-sample axis of fixed length
(2 or more) is taken and said (``y [N, 'T', 9]``: axis 2), and with none left the layout
is refused in one line naming ``axis=`` (h73: a sequence labeller's classes had been read
along its tokens, its top-1 agreement the agreement of the largest token per class).

``map``: with ``channel=K`` the axis K indexes; without, the maps' channel axis is still
the layout's claim (each value is decided alone, but ``[N, C, H, W]``'s C maps are
distinct channels, a heatmap stack's joints): the graph's channel axis, else axis 1 of
``[N, C]`` or ``[N, C, H, W, ...]``; a single map ``[N, H, W]`` whose graph tells no
channel axis has none (its worst channel is its whole SQNR, said). Both are read by
the per-channel figures (:func:`quantscope.emulate.class_axes.read_axis`); before h73
a map without ``channel=`` claimed none, and ``[N, H, W]``'s rows were read as channels.
"""

from __future__ import annotations

from quantscope.emulate.class_axes import ClassAxis
from quantscope.model.load import Model
from quantscope.tasks.classes import AXIS_BY_DEFAULT, ClassTask
from quantscope.tasks.layout_detect import dims as _dims
from quantscope.tasks.layout_detect import others as _others
from quantscope.tasks.layout_spec import LayoutSpec
from quantscope.tasks.layout_spec import fail as _fail
from quantscope.tasks.maps import MAP_THRESHOLD, MapTask

MAPS = "the maps of its map layout (each value decided alone, each map a channel)"
SINGLE_MAP = "a single map {shape} of its map layout, each value decided alone"
NO_CLAIM = -1  # :func:`_map_axis` of frames by bins: no claim, the default rule reads it


def _open(shape: tuple, k: int) -> str:
    """The model's name of a symbolic dim (``'T'``; ``'?'``: an unknown one)."""
    return shape[k] if isinstance(shape[k], str) else "?"


def _declared(shape: tuple) -> str:
    """``[N, 16, 16]``: the sample axis N, a symbolic dim by its name (``'?'`` unknown)."""
    return "[" + ", ".join("N" if not k else str(d) if isinstance(d, int) else repr(d or "?")
                           for k, d in enumerate(shape)) + "]"


def _default_class_axis(spec: LayoutSpec, shape: tuple | None, samples: int | None
                        ) -> tuple[int, str]:
    """The class axis by default: the first non-sample axis, unless the model declares
    it symbolic: then the last non-sample axis of fixed length, 2 or more (module doc)."""
    first = 2 if samples == 1 else 1
    said = f"by default: {AXIS_BY_DEFAULT}"
    if shape is None or first >= len(shape) or isinstance(shape[first], int):
        return first, said
    fixed = [k for k, d in enumerate(shape)
             if k != (samples or 0) and isinstance(d, int) and d >= 2]
    if not fixed:
        raise _fail(spec.text, f"output '{spec.output}' has shape {_declared(shape)}: axis "
                    f"{first} is symbolic in the model ({_open(shape, first)!r}: positions, "
                    "tokens or frames) and no axis of fixed length holds classes: give the "
                    f"class axis with {spec.output}=class:axis=K")
    return fixed[-1], (f"by default, the last axis of fixed length: {AXIS_BY_DEFAULT}; "
                       f"axis {first} is symbolic in the model ({_open(shape, first)!r}): "
                       "positions")


def class_task(spec: LayoutSpec, model: Model, shape: tuple | None,
               samples: int | None = None) -> ClassTask:
    """The class task of a ``class`` layout: the class axis as given (``axis=K``; -1 the
    last), else the one non-sample axis of ``[N, C]``, else the channel axis the graph
    gives the output (:func:`quantscope.model.axes.output_channel_axes`: the features of
    the weighted MatMul/Gemm that makes ``[N, T, C]``, the channels of a Conv's
    ``[N, C, H, W]``), else axis 1 (off a symbolic one: :func:`_default_class_axis`),
    said to be a default (``ClassTask.axis_read``). Every axis is the declared output's;
    ``samples`` its sample axis (None: not known yet, the data unread: 0 assumed, not
    checked)."""
    from quantscope.model.axes import output_channel_axes

    rank = len(shape) if shape is not None else None
    raw = spec.option("axis")
    if rank is not None and rank < 2:
        raise _fail(spec.text, f"output '{spec.output}' has shape {_dims(shape)}, no class "
                    "axis of 2 or more classes: use kind score for one value per sample")
    if raw is not None:
        axis, read = int(raw), "as given"
        if rank is not None and not -rank <= axis < rank:
            raise _fail(spec.text, f"axis {axis} is outside output '{spec.output}' of shape "
                        f"{_dims(shape)}: give one of {_others(rank, samples)} (-1: the last)")
        axis = axis % rank if rank is not None else axis
        if axis == samples:
            raise _fail(spec.text, f"axis {raw} is the samples' axis of output "
                        f"'{spec.output}': give the class axis, {_others(rank, samples)} "
                        "(-1: the last)")
    elif rank == 2:
        axis, read = 1 - (samples or 0), ""
    else:
        graph = output_channel_axes(model).get(spec.output)
        producer = next((n.op_type for n in model.graph.node if spec.output in n.output), None)
        if graph:
            axis, read = graph, f"the graph's channel axis of its {producer}"
        else:
            axis, read = _default_class_axis(spec, shape, samples)
    size = shape[axis] if shape is not None and axis < len(shape) else None
    if isinstance(size, int) and size < 2:
        raise _fail(spec.text, f"output '{spec.output}' has shape {_dims(shape)}: axis {axis} "
                    f"holds {size} value, no classes to pick: give the class axis with "
                    f"{spec.output}=class:axis=K, or use kind score for one value per sample")
    return ClassTask(name=f"class:{spec.output}", output=spec.output, axis=axis,
                     axis_read=read, sample_axis=samples or 0)


def _map_axis(model: Model, output: str, shape: tuple | None) -> int | None:
    """A map's channel axis: the graph's (an NHWC export's last axis: tf2onnx's ``[N, H,
    W, C]``), else 1 (``[N, C]``, ``[N, C, H, W]``); None for ``[N, H, W]`` whose graph
    tells none (a single map) and where the shape is not known. ``[N, 'T', 88]`` (one
    axis symbolic, the other not: a posteriorgram's frames and bins) is no single map:
    :data:`NO_CLAIM` (the default rule reads its axis of fixed length, said)."""
    from quantscope.model.axes import output_channel_axes

    if shape is None:
        return None
    graph = output_channel_axes(model).get(output)
    if graph is not None and 0 < graph < len(shape):
        return graph
    if len(shape) != 3:
        return 1
    return None if isinstance(shape[1], int) == isinstance(shape[2], int) else NO_CLAIM


def map_task(spec: LayoutSpec, model: Model, shape: tuple | None, samples: int | None,
             threshold: float) -> MapTask:
    """The map task of a ``map`` layout: ``channel=K`` checked against the map's channel
    axis (:func:`_map_axis`, 1 where it tells none), and the axis the per-channel figures
    read (``MapTask.read``, module doc)."""
    raw = spec.option("channel")
    axis = _map_axis(model, spec.output, shape)
    name = f"{spec.kind}:{spec.output}"
    if raw is None:
        if shape is None or samples or len(shape) < 2 or axis == NO_CLAIM:
            read = None  # not known, batched on another axis, frames: no claim, as before
        elif axis is None:
            read = ClassAxis(None, 0, SINGLE_MAP.format(shape=_declared(shape)))
        else:
            read = ClassAxis(axis, 0, MAPS)
        return MapTask(name=name, output=spec.output, threshold=threshold, read=read)
    k = int(raw)
    if samples:
        raise _fail(spec.text, f"channel= reads axis 1 of an output batched on axis 0, and "
                    f"'{spec.output}' is batched on axis {samples}: leave channel out")
    axis = 1 if axis is None or axis == NO_CLAIM else axis
    if shape is not None and (len(shape) < 3 or (isinstance(shape[axis], int)
                                                 and k >= shape[axis])):
        where = ("its axis 1 (a map [N, C, H, W] has C of them)" if axis == 1 else
                 f"its channel axis {axis}, the graph's (an NHWC map [N, H, W, C] has C "
                 "of them)")
        raise _fail(spec.text, f"output '{spec.output}' has shape {_dims(shape)}: channel {k} "
                    f"is no channel of {where}")
    return MapTask(name=name, output=spec.output, channel=k, channel_axis=axis,
                   threshold=threshold,
                   read=ClassAxis(axis, 0, f"the channels of its map layout (channel={k} "
                                  "is one)"))


__all__ = ["MAP_THRESHOLD", "class_task", "map_task"]
