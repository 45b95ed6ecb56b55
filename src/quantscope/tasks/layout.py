"""``--layout``: what a model output is, declared by the user or read from the graph.

Tensor data (``.npy`` / ``.npz``) has no task of its own: every output is scored by its
fidelity to FP32 (cosine, SQNR). An output whose numbers mean something more gets a task
that scores what the user acts on::

    --layout OUTPUT=KIND[:KEY=VALUE[,KEY=VALUE...]]      (repeat for several outputs)

==========  =======================================================  ===================
KIND        keys (defaults)                                          headline metric
==========  =======================================================  ===================
``detect``  ``boxes=0-3`` (4 rows), ``scores=4-`` (to the last row),  ``detection_f1``
            ``obj=R`` (a YOLOv5 objectness row: scores x objectness;
            scores then default to the rows after it),
            ``axis=1`` (the row axis), ``format=cxcywh`` | ``xyxy``,
            ``threshold=0.25``, ``iou=0.5``  (:mod:`.detection`)
``map``     ``threshold=0.5``, ``channel=K`` (binarise channel K of   ``mask_iou``
            axis 1 alone; default: every value)  (:mod:`.maps`)
``score``   ``threshold=0.5``: one value per sample  (:mod:`.maps`)   ``decision_agreement``
``class``   ``axis=K`` (the class axis; -1 the last): class scores    ``top1_agreement``
            (:mod:`.classes`; default: the graph's, :func:`class_task`)
``tensor``  none: plain per-output fidelity                           (fidelity)
==========  =======================================================  ===================

An ``axis=`` counts the axes of the output as the model declares it, whichever axis holds
its samples (``--batch-axis``; that one is no row or class axis);
:func:`quantscope.types.moved_axis` translates it to the sample-first arrays scored.
Row ranges: ``A-B`` (inclusive), ``A-`` (to the last row) or ``A``. Without ``--layout``,
an output the graph shows to be a detection head (a Concat whose first input has 4 rows on
the concat axis, :func:`quantscope.tasks.detection.detect_layout`) gets the ``detect`` task,
and a Softmax over the classes (axis 1 of a ``[N, C]`` or ``[N, C, H, W]`` output, the
last axis of a ``[N, T, C]`` one that is no attention's) the ``class`` task
(:func:`quantscope.tasks.classes.class_output`), and so does an output the graph takes an
``ArgMax``/``TopK`` of (:func:`quantscope.tasks.classes.picked_output`); a note says so; ``OUTPUT=tensor`` turns
that off. Every bad value is one error line
naming ``--layout`` and the fix.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from quantscope.model.dynamic import INDEX_TYPES
from quantscope.model.load import Model
from quantscope.tasks.classes import AXIS_BY_DEFAULT, ClassTask, class_output, picked_output
from quantscope.tasks.detection import (
    BOX_FORMATS,
    DEFAULT_IOU,
    DEFAULT_THRESHOLD,
    DetectionLayout,
    DetectionTask,
    detect_layout,
)
from quantscope.tasks.maps import MAP_THRESHOLD, SCORE_THRESHOLD, MapTask, ScoreTask
from quantscope.tasks.shares import CLUSTERS, ITEMS, worst_counts
from quantscope.tasks.unscored import tensor_unscored_note
from quantscope.types import Metrics, Outputs, QuantscopeError

KINDS: dict[str, tuple[str, ...]] = {
    "detect": ("boxes", "scores", "obj", "axis", "format", "threshold", "iou"),
    "map": ("threshold", "channel"),
    "score": ("threshold",),
    "class": ("axis",),
    "tensor": (),
}
SYNTAX = "OUTPUT=KIND[:KEY=VALUE,...] with KIND detect, map, score, class or tensor"
LAYOUT_NOTE = "' read as "  # in every note saying what an output was read as


class LayoutError(QuantscopeError):
    """A ``--layout`` value that cannot be read (one line: the value and the fix)."""


@dataclass(frozen=True)
class LayoutSpec:
    """One parsed ``--layout`` value (checked against the model by :func:`layout_tasks`)."""

    output: str
    kind: str
    options: tuple[tuple[str, str], ...] = ()
    text: str = ""

    def option(self, key: str) -> str | None:
        return dict(self.options).get(key)


def _fail(text: str, why: str) -> LayoutError:
    return LayoutError(f"--layout '{text}': {why}")


_KIND_AFTER = re.compile(r"=\s*(?:" + "|".join(KINDS) + r")\s*(?=:|$)", re.IGNORECASE)
QUOTE_HINT = ("an output name holding '=' is read up to the last '=KIND', or quote it: "
              "--layout '\"a=b\"=detect'")


def _split_output(text: str) -> tuple[str, str, str]:
    """(output, '=', the rest): a quoted output name as written; else the name runs to
    the last ``=KIND`` (a known kind, then ``:`` or the end), so it may hold '=' (and ',',
    ':'); else to the first '=' (the kind is then named as unknown)."""
    quote = text.lstrip()[:1]
    if quote in ("'", '"'):
        body = text.lstrip()[1:]
        close = body.find(quote)
        after = body[close + 1:].lstrip() if close >= 0 else ""
        if close < 0 or not after.startswith("="):
            raise _fail(text, f"the quoted output name is not closed by {quote}=KIND: "
                        f"give {SYNTAX} ({QUOTE_HINT})")
        return body[:close], "=", after[1:]
    found = list(_KIND_AFTER.finditer(text))
    if found:
        return text[:found[-1].start()].strip(), "=", text[found[-1].start() + 1:]
    output, eq, rest = text.partition("=")
    return output.strip(), eq, rest


def parse_layout(text: str) -> LayoutSpec:
    """``OUTPUT=KIND[:KEY=VALUE,...]`` -> :class:`LayoutSpec`; syntax, kinds, keys and
    numbers checked here (output names and row counts need the model)."""
    output, eq, rest = _split_output(text)
    if not eq or not output:
        raise _fail(text, f"give {SYNTAX} (e.g. detections=detect, mask=map:threshold=0.5)")
    kind, _, opts = rest.partition(":")
    kind = kind.strip().lower()
    if kind not in KINDS:
        raise _fail(text, f"unknown kind '{kind}': use detect, map, score, class or tensor")
    options: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in opts.split(","))):
        key, eq, value = item.partition("=")
        key, value = key.strip().lower(), value.strip()
        if key not in KINDS[kind]:
            allowed = ", ".join(KINDS[kind]) or "none"
            raise _fail(text, f"'{key}' is no key of kind {kind} (keys: {allowed})")
        if not eq or not value:
            raise _fail(text, f"'{key}' has no value: write {key}=VALUE")
        if key in options:
            raise _fail(text, f"'{key}' is given twice: give it once")
        options[key] = value
    spec = LayoutSpec(output, kind, tuple(options.items()), text)
    _check_values(spec)
    return spec


def _number(spec: LayoutSpec, key: str, lo: float, hi: float, *, open_lo: bool = False
            ) -> float | None:
    raw = spec.option(key)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise _fail(spec.text, f"{key} '{raw}' is not a number") from None
    if not math.isfinite(value):
        raise _fail(spec.text, f"{key} '{raw}' is not a finite number: give e.g. {key}=0.5")
    if value < lo or value > hi or (open_lo and value == lo):
        side = "(" if open_lo else "["
        raise _fail(spec.text, f"{key} {raw} is outside {side}{lo:g}, {hi:g}]: give a value in it")
    return value


def _rows(spec: LayoutSpec, key: str) -> tuple[int, int | None] | None:
    """``A-B`` / ``A-`` / ``A`` -> ``(A, B + 1)`` / ``(A, None)`` / ``(A, A + 1)``."""
    raw = spec.option(key)
    if raw is None:
        return None
    a, dash, b = raw.partition("-")
    try:
        start = int(a)
        stop = (None if not b.strip() else int(b) + 1) if dash else start + 1
    except ValueError:
        raise _fail(spec.text, f"{key} '{raw}' is not a row range: write A-B, A- or A "
                    "(rows counted from 0)") from None
    if start < 0 or (stop is not None and stop <= start):
        raise _fail(spec.text, f"{key} '{raw}' is an empty or negative row range: write A-B "
                    "with 0 <= A <= B")
    return start, stop


def _check_values(spec: LayoutSpec) -> None:
    _number(spec, "threshold", -math.inf, math.inf)
    _number(spec, "iou", 0.0, 1.0, open_lo=True)
    boxes = _rows(spec, "boxes")
    if boxes is not None and (boxes[1] is None or boxes[1] - boxes[0] != 4):
        raise _fail(spec.text, f"boxes '{spec.option('boxes')}' must be 4 rows (e.g. boxes=0-3)")
    _rows(spec, "scores")
    obj = _rows(spec, "obj")
    if obj is not None and obj[1] != obj[0] + 1:
        raise _fail(spec.text, f"obj '{spec.option('obj')}' must be one row (e.g. obj=4)")
    fmt = spec.option("format")
    if fmt is not None and fmt.lower() not in BOX_FORMATS:
        raise _fail(spec.text, f"format '{fmt}' is unknown: use {' or '.join(BOX_FORMATS)}")
    channel = spec.option("channel")
    if channel is not None and not channel.isdigit():
        raise _fail(spec.text, f"channel '{channel}' is not a whole number >= 0: give the "
                    "index on axis 1 of the channel to binarise (e.g. channel=1)")
    axis = spec.option("axis")
    if axis is not None and (not axis.lstrip("-").isdigit()):
        what = "class axis (e.g. -1, the last)" if spec.kind == "class" else "row axis (e.g. 1)"
        raise _fail(spec.text, f"axis '{axis}' is not a whole number: give the {what}")


def _others(rank: int | None, samples: int | None) -> str:
    """The axes of an output of ``rank`` axes but its ``samples`` one, in words."""
    last = (rank or 2) - 1
    if not samples:
        return f"1..{last}"
    return f"0..{last} but {samples}" if rank is not None else f"any but {samples}"


def _detection_layout(spec: LayoutSpec, shape: tuple | None, samples: int | None
                      ) -> DetectionLayout:
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
                    f"'{spec.output}' {where}: give one of {_others(rank, samples)} "
                    f"({samples or 0} is the samples)")
    boxes = _rows(spec, "boxes") or (0, 4)
    obj_rows = _rows(spec, "obj")
    obj = None if obj_rows is None else obj_rows[0]
    # default scores: the rows after the boxes (boxes first; after the objectness row when
    # it follows the boxes) or before them (boxes last)
    after = boxes[1] + (1 if obj == boxes[1] else 0)
    scores = _rows(spec, "scores") or ((after, None) if boxes[0] == 0 else (0, boxes[0]))
    assert boxes[1] is not None
    rows = shape[axis] if shape is not None and isinstance(shape[axis], int) else None
    if rows is not None:
        last = max(boxes[1], scores[1] or scores[0] + 1, -1 if obj is None else obj + 1)
        if last > rows:
            raise _fail(spec.text, f"output '{spec.output}' has {rows} rows on axis {axis}, the "
                        f"layout needs {last}: fix boxes=/scores=/obj= or axis=")
    if scores[0] < boxes[1] and (scores[1] is None or scores[1] > boxes[0]):
        raise _fail(spec.text, "the box rows and the score rows overlap: give disjoint ranges")
    if obj is not None and (boxes[0] <= obj < boxes[1] or (
            scores[0] <= obj and (scores[1] is None or obj < scores[1]))):
        raise _fail(spec.text, f"the objectness row {obj} is a box or score row: give a row of "
                    "its own (e.g. boxes=0-3,obj=4,scores=5-)")
    return DetectionLayout(axis=axis, sample_axis=samples or 0,
                           boxes=(boxes[0], boxes[1]), scores=scores,
                           box_format=(spec.option("format") or "cxcywh").lower(),
                           threshold=_float(spec, "threshold", DEFAULT_THRESHOLD),
                           iou=_float(spec, "iou", DEFAULT_IOU), objectness=obj)


def _float(spec: LayoutSpec, key: str, default: float) -> float:
    raw = spec.option(key)
    return default if raw is None else float(raw)


def _dims(shape: tuple) -> tuple:
    return tuple(d if isinstance(d, int) else "?" for d in shape)


def class_task(spec: LayoutSpec, model: Model, shape: tuple | None,
               samples: int | None = None) -> ClassTask:
    """The class task of a ``class`` layout: the class axis as given (``axis=K``; -1 the
    last), else the one non-sample axis of ``[N, C]``, else the channel axis the graph
    gives the output (:func:`quantscope.model.axes.output_channel_axes`: the features of
    the weighted MatMul/Gemm that makes ``[N, T, C]``, the channels of a Conv's
    ``[N, C, H, W]``), else axis 1, said to be a default (``ClassTask.axis_read``). Every
    axis is the declared output's; ``samples`` its sample axis (None: not known yet, the
    data unread: 0 assumed, not checked)."""
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
            axis, read = 2 if samples == 1 else 1, f"by default: {AXIS_BY_DEFAULT}"
    size = shape[axis] if shape is not None and axis < len(shape) else None
    if isinstance(size, int) and size < 2:
        raise _fail(spec.text, f"output '{spec.output}' has shape {_dims(shape)}: axis {axis} "
                    f"holds {size} value, no classes to pick: give the class axis with "
                    f"{spec.output}=class:axis=K, or use kind score for one value per sample")
    return ClassTask(name=f"class:{spec.output}", output=spec.output, axis=axis,
                     axis_read=read, sample_axis=samples or 0)


def _map_channel(spec: LayoutSpec, shape: tuple | None, samples: int | None) -> int | None:
    """The ``channel=K`` of a map layout, checked against the output's axis 1."""
    raw = spec.option("channel")
    if raw is None:
        return None
    k = int(raw)
    if samples:
        raise _fail(spec.text, f"channel= reads axis 1 of an output batched on axis 0, and "
                    f"'{spec.output}' is batched on axis {samples}: leave channel out")
    if shape is not None and (len(shape) < 3 or (isinstance(shape[1], int) and k >= shape[1])):
        dims = tuple(d if isinstance(d, int) else "?" for d in shape)
        raise _fail(spec.text, f"output '{spec.output}' has shape {dims}: channel {k} is no "
                    "channel of its axis 1 (a map [N, C, H, W] has C of them)")
    return k


def _task(spec: LayoutSpec, model: Model, samples: int | None) -> object | None:
    shape = model.value_shapes().get(spec.output)
    name = f"{spec.kind}:{spec.output}"
    dtype = model.value_types().get(spec.output)
    if spec.kind != "tensor" and dtype in INDEX_TYPES:  # an argmax of class numbers: nonsense
        raise _fail(spec.text, f"output '{spec.output}' is "
                    f"{onnx.TensorProto.DataType.Name(dtype).lower()} (a label or an index), "
                    "which is compared exactly with FP32's: declare the float scores it is "
                    "made from (the logits before an ArgMax or TopK) instead")
    if spec.kind == "detect":
        return DetectionTask(name=name, output=spec.output,
                             layout=_detection_layout(spec, shape, samples))
    if spec.kind == "map":
        return MapTask(name=name, output=spec.output, channel=_map_channel(spec, shape, samples),
                       threshold=_float(spec, "threshold", MAP_THRESHOLD))
    if spec.kind == "score":
        if shape is not None and any(isinstance(d, int) and d != 1 for d in shape[1:]):
            raise _fail(spec.text, f"output '{spec.output}' has shape "
                        f"{tuple(d if isinstance(d, int) else '?' for d in shape)}, not one value "
                        "per sample: use kind map or detect")
        return ScoreTask(name=name, output=spec.output,
                         threshold=_float(spec, "threshold", SCORE_THRESHOLD))
    if spec.kind == "class":
        return class_task(spec, model, shape, samples)
    return None


@dataclass(frozen=True, eq=False)
class OutputTasks:
    """Several outputs with tasks: each one's metrics as ``KEY:OUTPUT``, and unprefixed the
    worst over the outputs that have it (lowest for scores, highest for errors); the
    headline is the first task's."""

    name: str
    tasks: tuple
    headline: str
    higher_is_better: bool = True
    row_local: bool = True

    def metrics(self, ref: Outputs, test: Outputs) -> Metrics:
        values: dict[str, float] = {}
        by_key: dict[str, list[float]] = {}
        notes: list[str] = []
        per_task = []
        for t in self.tasks:
            m = t.metrics(ref, test)
            per_task.append(m.values)
            for k, v in m.values.items():
                values[f"{k}:{t.output}"] = v
                by_key.setdefault(k, []).append(v)
            notes.extend(m.notes)
        worst: dict[str, float] = {}
        for k, vs in by_key.items():
            if k.startswith(("detections_", "decisions_", "mask_share")) or k.endswith(
                    (ITEMS, CLUSTERS)):
                continue
            worse = max if ("error" in k or "flip" in k) else min
            worst[k] = worse(vs)
        # a share's items: the worst output's own (the figure the unprefixed key is)
        values.update(worst, **worst_counts(per_task, worst))
        return Metrics(values=values, notes=tuple(notes))


def layout_tasks(model: Model, specs: tuple[LayoutSpec, ...], data: str,
                 sample_axes: Mapping[str, int] | None = None
                 ) -> tuple[object | None, tuple[str, ...]]:
    """The task of tensor data (None: plain fidelity) and the notes saying what each
    output was read as (declared or detected). ``sample_axes``: each output's sample axis
    when not 0 (None: not known yet, the data unread: an axis is then not checked against
    it)."""
    outputs = model.output_names()
    seen: set[str] = set()
    for s in specs:
        if s.output not in outputs:
            raise _fail(s.text, f"'{s.output}' is no output of the model (outputs: "
                        f"{', '.join(outputs)})"
                        + (f"; {QUOTE_HINT}" if any("=" in n for n in (s.output, *outputs))
                           else ""))
        if s.output in seen:
            raise _fail(s.text, f"output '{s.output}' is declared twice: give one --layout "
                        "per output")
        seen.add(s.output)
    tasks, notes = [], []
    declared = {s.output: s for s in specs}
    for out in outputs:
        spec = declared.get(out)
        samples = None if sample_axes is None else sample_axes.get(out, 0)
        if spec is not None:
            task = _task(spec, model, samples)
            if task is not None:
                notes.append(f"output '{out}' read as {_describe(task, model)} (--layout)")
            if isinstance(task, MapTask) and task.channel is None and class_output(
                    model, out) == 1:
                notes.append(f"output '{out}' is a Softmax over its axis 1: its mask counts "
                             "every channel, the background's too, so the mask IoU mostly "
                             f"says the background agrees; --layout {out}=map:channel=K "
                             "binarises channel K alone")
        else:
            found = detect_layout(model, out)
            if found is not None and found.axis == samples:
                found = None  # a Concat over the samples is no detection head
            task = None if found is None else DetectionTask(
                name=f"detect:{out}", output=out,
                layout=dataclasses.replace(found, sample_axis=samples or 0))
            if task is not None:
                notes.append(f"output '{out}' read as detections [{_describe(task, model)}] (a Concat "
                             f"of 4 box rows and score rows); declare with --layout {out}=... "
                             f"to change, --layout {out}=tensor for plain fidelity")
            elif (axis := class_output(model, out)) is not None and axis != samples:
                task = ClassTask(name=f"class:{out}", output=out, axis=axis,
                                 sample_axis=samples or 0)
                notes.append(f"output '{out}' read as {_describe(task, model)} (a Softmax over "
                             f"the classes); --layout {out}=tensor for plain fidelity")
            elif (picked := picked_output(model, out)) is not None:
                task = ClassTask(name=f"class:{out}", output=out, axis=picked[0])
                notes.append(f"output '{out}' read as {_describe(task, model)} (the graph "
                             f"picks classes from it: '{picked[1]}'); --layout {out}=tensor "
                             "for plain fidelity")
        if task is not None:
            tasks.append(task)
    if not tasks:
        return None, tuple(notes)
    unscored = tensor_unscored_note(model.proto, [t.output for t in tasks])
    notes += [unscored] if unscored else []
    if len(tasks) == 1:
        return tasks[0], tuple(notes)
    return OutputTasks(name=f"outputs:{data}", tasks=tuple(tasks),
                       headline=tasks[0].headline), tuple(notes)


def _describe(task: object, model: Model) -> str:
    if isinstance(task, DetectionTask):
        shape = model.value_shapes().get(task.output) or ()
        rows = shape[task.layout.axis] if len(shape) > task.layout.axis else None
        return task.layout.describe(rows if isinstance(rows, int) else None)
    if isinstance(task, MapTask):
        return f"a probability map binarised at {task.threshold:g}" + (
            "" if task.channel is None else f" (channel {task.channel} of axis 1)")
    if isinstance(task, ScoreTask):
        return f"one score per sample, decided at {task.threshold:g}"
    if isinstance(task, ClassTask):
        return describe_classes(task, model)
    return "a tensor"


def describe_classes(task: ClassTask, model: Model) -> str:
    """What a class task reads: the class count and axis; for a declared one, where the
    axis came from and (per position) the positions per sample and how to read another
    axis (a Softmax's axis needs no more)."""
    shape = model.value_shapes().get(task.output) or ()
    rank = len(shape) or None
    axis = task.axis % rank if rank else task.axis
    c = shape[axis] if rank and axis < rank and isinstance(shape[axis], int) else None
    where = f"axis {axis}" + (", the last" if rank and rank > 2 and axis == rank - 1 else "")
    text = f"class scores (top-1 over {c or 'the'} classes on {where}"
    if task.axis_read:
        text += f", {task.axis_read}"
    if task.axis_read and rank and rank > 2:
        rest = [d for k, d in enumerate(shape) if k not in (axis, task.sample_axis)]
        per = int(np.prod(rest)) if all(isinstance(d, int) for d in rest) else None
        text += (f"; judged per position, {per or 'its'} positions per sample; another "
                 f"axis: --layout {task.output}=class:axis=K")
    return text + ")"
