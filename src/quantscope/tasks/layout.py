"""``--layout``: what a model output is, declared by the user or read from the graph.

Tensor data (``.npy`` / ``.npz``) has no task of its own: every output is scored by its
fidelity to FP32 (cosine, SQNR). An output whose numbers mean something more gets a task
that scores what the user acts on::

    --layout OUTPUT=KIND[:KEY=VALUE[,KEY=VALUE...]]      (repeat for several outputs)

=============  =======================================================  ===================
KIND           keys (defaults)                                          headline metric
=============  =======================================================  ===================
``detect``     ``boxes=0-3`` (4 rows), ``scores=4-`` (to the last row),  ``detection_f1``
               ``obj=R`` (a YOLOv5 objectness row: scores x objectness;
               scores then default to the rows after it),
               ``axis=1`` (the row axis), ``format=cxcywh`` | ``xyxy``,
               ``threshold=0.25``, ``iou=0.5``, ``scores_from=OUT``
               (the scores in another output of the same anchors, an
               SSD's two heads), ``anchors=FILE.npy`` (anchor centres
               ``[A, 2]`` added to the box centres), ``grid=8/16/32``
               (a grid head's strides: YOLOX's offsets decoded),
               ``dfl=BINS`` (box distributions, PicoDet's, YOLOv8's),
               ``centre=0.5``, ``levels=OUT2+OUT3`` (the other levels'
               box outputs, pooled)  (:mod:`.detection`,
               :mod:`.grid_head`)
``map``        ``threshold=0.5``, ``channel=K`` (binarise channel K of   ``mask_iou``
               axis 1 alone; default: every value)  (:mod:`.maps`,
               :mod:`.layout_axes`)
``score``      ``threshold=0.5``: one value per sample  (:mod:`.maps`)   ``decision_agreement``
``class``      ``axis=K`` (the class axis; -1 the last): class scores    ``top1_agreement``
               (:mod:`.classes`; default: the graph's, :mod:`.layout_axes`)
``points``     ``dims=2`` (values per point), ``tol=T`` (default 1 % of   ``point_agreement``
               FP32's x, y span; 1 px when scaled), ``flags=A-B`` (values
               decided at ``threshold=0``), ``scale=S`` | ``input`` (the
               values x S are pixels), ``order=interleaved`` |
               ``planar`` (x1..xP then y1..yP) | ``channels``,
               ``photo=PX`` (the box side on the photo),
               ``where=OUT:K>T`` (only where another output's
               score passes): landmarks (:mod:`.points`,
               :mod:`.layout_points`, :mod:`.points_gate`)
``ctc``        ``blank=0`` (-1: the last class), ``axis=-1``: a          ``string_agreement``
               ``[N, T, C]`` decoded by CTC greedy decoding (:mod:`.ctc`)
``image``      ``range=LO-HI`` (default FP32's min..max): an image,       ``psnr_db``
               judged by PSNR and SSIM against FP32, both clipped to
               the range  (:mod:`.pictures`)
``depth``      ``align=affine`` | ``scale`` | ``none``: a relative depth  ``depth_abs_rel``
               map, AbsRel and delta < 1.25 against FP32 after each     (lower is better)
               map's least-squares alignment  (:mod:`.depth`)
``embedding``  ``norm=l2`` | ``none``: each sample's nearest other     ``neighbour_agreement``
               sample, by cosine (l2) or raw Euclidean distance, the
               plan's against FP32's  (:mod:`.neighbours`)
``tensor``     none: plain per-output fidelity                           (fidelity)
=============  =======================================================  ===================

An ``axis=`` counts the axes of the output as the model declares it, whichever axis holds
its samples (``--batch-axis``; that one is no row or class axis);
:func:`quantscope.types.moved_axis` translates it to the sample-first arrays scored.
Row ranges: ``A-B`` (inclusive), ``A-`` (to the last row) or ``A``. Without ``--layout``,
an output the graph shows to be a detection head (a Concat whose first input has 4 rows on
the concat axis, :func:`quantscope.tasks.detection.detect_layout`) gets the ``detect`` task,
and a Softmax over the classes (axis 1 of a ``[N, C]`` or ``[N, C, H, W]`` output, the
last axis of a ``[N, T, C]`` one that is no attention's) the ``class`` task
(:func:`quantscope.tasks.classes.class_output`), and so does an output the graph takes an
``ArgMax``/``TopK`` of (:func:`quantscope.tasks.classes.picked_output`); a Sigmoid of one
value per sample the ``score`` task (:func:`quantscope.tasks.maps.score_output`); a note
says so; ``OUTPUT=tensor`` turns that off. Every bad value is one error line
naming ``--layout`` and the fix.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from quantscope.emulate.channels import TopClasses
from quantscope.emulate.class_axes import ClassAxis
from quantscope.model.dynamic import INDEX_TYPES
from quantscope.model.load import Model
from quantscope.tasks.classes import ClassTask, class_output, picked_output
from quantscope.tasks.ctc import DEFAULT_BLANK, CtcTask, ctc_hint
from quantscope.tasks.db_noise import Parts, side_by_side
from quantscope.tasks.depth import DepthTask
from quantscope.tasks.detection import (
    DetectionTask,
    detect_layout,
    ssd_heads_hint,
)
from quantscope.tasks.embedding_hint import embedding_hint
from quantscope.tasks.grid_head import dfl_head_hint, grid_head_hint
from quantscope.tasks.layout_axes import class_task, map_task
from quantscope.tasks.layout_detect import detection_layout as _detection_layout
from quantscope.tasks.layout_detect import dims as _dims
from quantscope.tasks.layout_detect import float_option as _float
from quantscope.tasks.layout_detect import input_size
from quantscope.tasks.layout_detect import others as _others
from quantscope.tasks.layout_points import points_task
from quantscope.tasks.layout_spec import (
    KINDS,
    LAYOUT_NOTE,
    QUOTE_HINT,
    SYNTAX,
    LayoutError,
    LayoutSpec,
    parse_layout,
)
from quantscope.tasks.layout_spec import fail as _fail
from quantscope.tasks.maps import (
    MAP_THRESHOLD,
    SCORE_THRESHOLD,
    MapTask,
    ScoreTask,
    score_output,
)
from quantscope.tasks.neighbours import EmbeddingTask, embedding_task
from quantscope.tasks.pictures import ImageTask, dense_hint, parse_range
from quantscope.tasks.pitch import CENTS_PER_BIN, TOLERANCE, VOICING, PitchTask
from quantscope.tasks.points import PointsTask
from quantscope.tasks.shares import CLUSTERS, ITEMS, worst_counts
from quantscope.tasks.unscored import tensor_unscored_note
from quantscope.tasks.verify import VerifyTask, read_labels, verify_task
from quantscope.tasks.worst_output import worst_output_note
from quantscope.types import Metrics, Outputs


def _task(spec: LayoutSpec, model: Model, samples: int | None, data: str) -> object | None:
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
                             layout=_detection_layout(spec, shape, samples, model))
    if spec.kind == "map":
        return map_task(spec, model, shape, samples, _float(spec, "threshold", MAP_THRESHOLD))
    if spec.kind == "score":
        if shape is not None and any(isinstance(d, int) and d != 1 for d in shape[1:]):
            raise _fail(spec.text, f"output '{spec.output}' has shape "
                        f"{tuple(d if isinstance(d, int) else '?' for d in shape)}, not one value "
                        "per sample: use kind map (each value decided at the threshold), class, "
                        "points, or detect (an SSD's per-anchor scores: --layout "
                        f"BOXES=detect:scores_from={spec.output})")
        return ScoreTask(name=name, output=spec.output,
                         threshold=_float(spec, "threshold", SCORE_THRESHOLD))
    if spec.kind == "points":
        return points_task(spec, model, shape, name)
    if spec.kind == "class":
        return class_task(spec, model, shape, samples)
    if spec.kind == "ctc":
        return ctc_task(spec, shape, samples, model)
    if spec.kind == "depth":
        return DepthTask(name=name, output=spec.output,
                         align=(spec.option("align") or "affine").lower())
    if spec.kind == "verify":
        label = spec.option("labels") or ""
        return verify_task(spec.output, read_labels(data, label, spec.text), label,
                           None if spec.option("threshold") is None else
                           _float(spec, "threshold", 0.0), spec.text)
    if spec.kind == "pitch":
        return PitchTask(name=name, output=spec.output,
                         cents=_float(spec, "cents", CENTS_PER_BIN),
                         threshold=_float(spec, "threshold", VOICING),
                         tol=_float(spec, "tol", TOLERANCE))
    if spec.kind == "embedding":
        label = spec.option("labels")
        return embedding_task(spec.output, spec.option("norm"), None if label is None else
                              read_labels(data, label, spec.text), label or "")
    if spec.kind == "image":
        rng = spec.option("range")
        return ImageTask(name=name, output=spec.output,
                         range=None if rng is None else parse_range(rng))
    return None


def _steps_hint(model: Model, out: str, axis: int, made_by: str) -> str:
    """For class scores per step of a sequence (``[N, T, C]``, the classes last) that the
    op ``made_by`` makes (a CTC encoder's LogSoftmax; any op for logits the graph takes an
    ArgMax of per step): the CTC layout, which a per-step top-1 does not judge (the blank
    wins most steps). A token classifier's Softmax gets none."""
    shape = model.value_shapes().get(out)
    if shape is None or len(shape) != 3 or axis % 3 != 2:
        return ""
    producer = {t: n for n in model.graph.node for t in n.output}
    node = producer.get(out)
    while node is not None and node.op_type in ("Identity", "Reshape", "Transpose"):
        node = producer.get(node.input[0])
    if made_by and (node is None or node.op_type != made_by):
        return ""
    return (f"; if a host decodes it as CTC (repeats merged, a blank dropped: a speech or "
            f"text recognizer), --layout {out}=ctc[:blank=B,lengths=LEN] judges the decoded "
            "strings")


def ctc_task(spec: LayoutSpec, shape: tuple | None, samples: int | None,
             model: Model | None = None) -> CtcTask:
    """The task of a ``ctc`` layout: an output of 3 axes (samples, time, classes), the
    class axis ``axis=`` (default the last), ``blank=`` a class of it (default 0),
    ``lengths=`` an integer output of the model giving each sample's valid steps."""
    axis, blank = int(spec.option("axis") or -1), int(spec.option("blank") or DEFAULT_BLANK)
    lengths = spec.option("lengths")
    if lengths is not None and model is not None:
        ints = [o for o in model.output_names()
                if o != spec.output and model.value_types().get(o) in INDEX_TYPES]
        if lengths not in ints:
            raise _fail(spec.text, f"lengths={lengths} is no integer output of the model "
                        f"beside '{spec.output}': give one of "
                        f"{', '.join(repr(o) for o in ints) or 'none (the model has none)'} "
                        "(each sample's valid steps, as an encoder's 'log_probs_len')")
    if shape is not None:
        if len(shape) != 3:
            raise _fail(spec.text, f"output '{spec.output}' has shape {_dims(shape)} as "
                        "the model file declares it, not [samples, time, classes]: CTC decodes 3 axes "
                        "(use kind class for class scores of another rank; if the graph "
                        "computes 3 axes, as ONNX Runtime's 'Expected shape from model' "
                        "warning says, declare that shape in the file)")
        if not -3 <= axis < 3 or axis % 3 == (samples or 0):
            raise _fail(spec.text, f"axis {axis} is no class axis of output '{spec.output}' "
                        f"of shape {_dims(shape)}: give one of {_others(3, samples)} "
                        "(-1: the last)")
        c = shape[axis]
        if isinstance(c, int) and not -c <= blank < c:
            raise _fail(spec.text, f"blank {blank} is no class of the {c} on axis {axis % 3}: "
                        f"give 0..{c - 1} (-1: the last)")
    return CtcTask(name=f"ctc:{spec.output}", output=spec.output, blank=blank, axis=axis,
                   sample_axis=samples or 0, lengths=lengths)


# a figure whose worst over several outputs is its highest (errors, flips, values outside)
LOWER_IS_BETTER = ("error", "flip", "outside", "abs_rel", "invalid", "false_accept",
                   "collapsed", "pairwise_cosine")


@dataclass(frozen=True, eq=False)
class OutputTasks:
    """Several outputs with tasks: each one's metrics as ``KEY:OUTPUT``, and unprefixed the
    worst over the outputs that have it (lowest for scores, highest for errors); the
    headline is the first task's."""

    name: str
    tasks: tuple
    headline: str
    row_local: bool = True

    @property
    def rows_alone(self) -> bool:
        """Every task's figures read each sample alone (``sample_row_scoring``)."""
        return all(getattr(t, "rows_alone", True) for t in self.tasks)

    @property
    def higher_is_better(self) -> bool:
        """The headline's direction: the first task's (a depth map's AbsRel is lower-better)."""
        return bool(getattr(self.tasks[0], "higher_is_better", True))

    def metrics(self, ref: Outputs, test: Outputs) -> Metrics:
        values: dict[str, float] = {}
        by_key: dict[str, list[float]] = {}
        notes: list[str] = []
        per_task = []
        first = self.tasks[0]
        for t in self.tasks:
            m = t.metrics(ref, test)
            per_task.append(m.values)
            for k, v in m.values.items():
                values[f"{k}:{t.output}"] = v
                by_key.setdefault(k, []).append(v)
            notes.extend(m.notes if t.headline == first.headline else
                         (_not_planned_for(n, t, first) for n in m.notes))
        worst: dict[str, float] = {}
        for k, vs in by_key.items():
            if k.startswith(("detections_", "decisions_", "mask_share", "point_tolerance",
                             "point_judged", "chars_")) or k.endswith((ITEMS, CLUSTERS)):
                continue
            worse = max if any(w in k for w in LOWER_IS_BETTER) else min
            # an output with no figure (NaN: a gate that keeps no point) is left out, said
            # in the note naming each output's; min/max over a NaN depended on the order
            figures = [v for v in vs if not math.isnan(v)]
            worst[k] = worse(figures) if figures else math.nan
        # a share's items: the worst output's own (the figure the unprefixed key is)
        values.update(worst, **worst_counts(per_task, worst))
        which = worst_output_note(first.headline, self.tasks, per_task, worst.get(first.headline))
        notes += [which] if which else []
        return Metrics(values=values, notes=tuple(notes))

    def top_classes(self) -> dict[str, TopClasses]:
        """The outputs decided by their top class, of the tasks that have one."""
        return {k: v for t in self.tasks if hasattr(t, "top_classes")
                for k, v in t.top_classes().items()}

    def class_axes(self) -> dict[str, ClassAxis]:
        """The outputs whose task tells the axis of their classes (or rows)."""
        return {k: v for t in self.tasks if hasattr(t, "class_axes")
                for k, v in t.class_axes().items()}

    def sample_parts(self, ref: Outputs, test: Outputs) -> dict[str, Parts]:
        """The outputs' tasks' per-sample powers (an image's PSNR:
        :meth:`quantscope.tasks.pictures.ImageTask.sample_parts`), as
        :meth:`metrics` keys their figures: ``KEY:OUTPUT`` each, and the unprefixed
        ``KEY`` (the worst output's) as the outputs' columns side by side, whose lowest
        pooled ratio is that worst figure (kept only where it pools to the figure
        reported: :func:`quantscope.analyze.measure.kept_parts`)."""
        out: dict[str, Parts] = {}
        by_key: dict[str, list[Parts]] = {}
        for t in self.tasks:
            fn = getattr(t, "sample_parts", None)
            for k, p in (fn(ref, test) if fn is not None else {}).items():
                out[f"{k}:{t.output}"] = p
                by_key.setdefault(k, []).append(p)
        for k, ps in by_key.items():
            if (both := side_by_side(ps)) is not None:
                out[k] = both
        return out


def _not_planned_for(note: str, task: object, first: object) -> str:
    """A NOT LIKE FP32 note of an output whose task is not the headline's, with why a plan
    may leave it so: plans are searched for the headline (the first --layout's), and a
    group only this output needs gains nothing there (BlazePose's segmentation head stayed
    at 8 bit in a plan of every other group at 16 bit)."""
    output, headline = getattr(task, "output", ""), getattr(task, "headline", "")
    if not note.startswith(f"NOT LIKE FP32: output '{output}'"):
        return note
    return (f"{note} (plans are searched for the headline, '{getattr(first, 'output', '')}''s "
            f"{getattr(first, 'headline', '')}, the first --layout's; its analysis finds no "
            f"gain in a layer only this output needs: give --layout {output}=... first to "
            f"plan for its {headline})")


def layout_tasks(model: Model, specs: tuple[LayoutSpec, ...], data: str,
                 sample_axes: Mapping[str, int] | None = None
                 ) -> tuple[object | None, tuple[str, ...]]:
    """The task of tensor data (None: plain fidelity) and the notes saying what each
    output was read as (declared or detected). ``sample_axes``: each output's sample axis
    when not 0 (None: not known yet, the data unread: an axis is then not checked against
    it)."""
    outputs = model.output_names()
    _check_outputs(specs, outputs)
    tasks, notes = [], []
    declared = {s.output: s for s in specs}
    built = {o: _task(s, model, None if sample_axes is None else sample_axes.get(o, 0), data)
             for o, s in declared.items()}
    # the outputs a declared task reads besides its own (a detection's scores_from=, its
    # levels=): no task of their own is guessed (a Concat of score levels whose first has
    # 4 anchors had been read as a second detection head as well)
    read = {o for t in built.values() if t is not None for o in _read_by(t)}
    for out in outputs:
        spec = declared.get(out)
        samples = None if sample_axes is None else sample_axes.get(out, 0)
        if spec is not None:
            task = built[out]
            if task is not None:
                notes.append(f"output '{out}' read as {_describe(task, model)} (--layout)")
                notes.extend(_rows_hint(spec, task, model))
            if isinstance(task, MapTask) and task.channel is None and class_output(
                    model, out) == 1:
                notes.append(f"output '{out}' is a Softmax over its axis 1: its mask counts "
                             "every channel, the background's too, so the mask IoU mostly "
                             f"says the background agrees; --layout {out}=map:channel=K "
                             "binarises channel K alone")
        elif out in read:
            task = None
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
                             f"the classes); --layout {out}=tensor for plain fidelity"
                             + _steps_hint(model, out, axis, "LogSoftmax"))
            elif (picked := picked_output(model, out)) is not None:
                task = ClassTask(name=f"class:{out}", output=out, axis=picked[0])
                notes.append(f"output '{out}' read as {_describe(task, model)} (the graph "
                             f"picks classes from it: '{picked[1]}'); --layout {out}=tensor "
                             f"for plain fidelity{_steps_hint(model, out, picked[0], '')}")
            elif score_output(model, out, samples):
                task = ScoreTask(name=f"score:{out}", output=out)
                notes.append(f"output '{out}' read as {_describe(task, model)} (a Sigmoid of "
                             f"one value per sample); --layout {out}=score:threshold=T for "
                             f"another threshold, --layout {out}=tensor for plain fidelity")
        if task is not None:
            tasks.append(task)
    taken = {o for t in tasks for o in _read_by(t)}
    notes.extend(_head_hints(model, taken))
    if not tasks:
        rest = [o for o in outputs if o not in declared]
        hints = (dense_hint(model, rest, sample_axes), embedding_hint(model, rest, sample_axes),
                 ctc_hint(model.proto, model.value_shapes(), rest, sample_axes))
        return None, tuple(notes) + tuple(h for h in hints if h)
    unscored = tensor_unscored_note(model.proto, [o for t in tasks for o in _read_by(t)],
                                    tuple(k for k in KINDS if k != "tensor"))
    notes += [unscored] if unscored else []
    if len(tasks) == 1:
        return tasks[0], tuple(notes)
    # the headline is the first declared output's, in --layout order (the model's output
    # order had made BlazePose's points the headline with its map declared first)
    order = {s.output: i for i, s in enumerate(specs)}
    tasks.sort(key=lambda t: order.get(t.output, len(order)))
    return OutputTasks(name=f"outputs:{data}", tasks=tuple(tasks), headline=tasks[0].headline,
                       row_local=all(getattr(t, "row_local", True) for t in tasks)), tuple(notes)


def _check_outputs(specs: tuple[LayoutSpec, ...], outputs: list[str]) -> None:
    """Each declared output is one of the model's, declared once, and read by no other
    declaration's ``levels=`` (a level pooled into another detector)."""
    seen: set[str] = set()
    for s in specs:
        if s.output not in outputs:
            raise _fail(s.text, f"'{s.output}' is no output of the model (outputs: "
                        f"{', '.join(outputs)})"
                        + (f"; {QUOTE_HINT}" if any("=" in n for n in (s.output, *outputs))
                           else ""))
        if s.output in seen:
            raise _fail(s.text, f"output '{s.output}' is declared twice: give one --layout per output")
        seen.add(s.output)
    for s in specs:
        raw = s.option("levels") if s.kind == "detect" else None
        names = () if raw is None else (raw,) if raw in outputs else raw.split("+")
        for name in (n.strip() for n in names):
            if name in seen or any(name in (t.option("levels") or "").split("+")
                                   for t in specs if t is not s):
                raise _fail(s.text, f"levels '{name}' is declared by another --layout too: "
                            "give each level once, in one detector's levels= or its own "
                            "--layout")


def _head_hints(model: Model, taken: set[str]) -> list[str]:
    """The notes naming undeclared detection heads no task reads (``taken``): a DFL
    head's levels (whose outputs no SSD note then names), an SSD's two heads, a YOLOX head."""
    dfl_notes, named = dfl_head_hint(model, taken, input_size(model))
    return dfl_notes + ssd_heads_hint(model, taken | named) + grid_head_hint(model, taken)


def _rows_hint(spec: LayoutSpec, task: object, model: Model) -> list[str]:
    """A detect layout on its default row axis that has more rows than anchors (an
    anchors-first ``[N, A, R]`` output read as ``[N, R, A]``): a note naming axis 2."""
    if not isinstance(task, DetectionTask) or spec.option("axis") is not None:
        return []
    shape = model.value_shapes().get(spec.output) or ()
    axis = task.layout.axis
    rest = [d for k, d in enumerate(shape) if k not in (axis, task.layout.sample_axis)]
    rows = shape[axis] if axis < len(shape) else None
    if not isinstance(rows, int) or not all(isinstance(d, int) for d in rest) \
            or rows <= int(np.prod(rest)):
        return []
    other = next(k for k in range(len(shape)) if k not in (axis, task.layout.sample_axis))
    return [f"output '{spec.output}' {_dims(shape)} read with {rows} rows on axis {axis} for "
            f"{int(np.prod(rest))} anchors (the default axis): if its anchors come first "
            f"([N, A, 4 + C], YOLOv5's and an SSD's), give axis={other}"]


def _read_by(task: object) -> tuple[str, ...]:
    if isinstance(task, DetectionTask):
        return task.layout.outputs(task.output)
    return (getattr(task, "output", ""),)


def _describe(task: object, model: Model) -> str:
    if isinstance(task, DetectionTask):
        def rows_of(name: str) -> int | None:
            shape = model.value_shapes().get(name) or ()
            rows = shape[task.layout.axis] if len(shape) > task.layout.axis else None
            return rows if isinstance(rows, int) else None

        return task.layout.describe(rows_of(task.layout.scores_output or task.output),
                                    rows_of(task.output))
    if isinstance(task, MapTask):
        return f"a probability map binarised at {task.threshold:g}" + (
            "" if task.channel is None else
            f" (channel {task.channel} of axis {task.channel_axis})")
    if isinstance(task, ScoreTask):
        return f"one score per sample, decided at {task.threshold:g}"
    if isinstance(task, ClassTask):
        return describe_classes(task, model)
    if isinstance(task, (PointsTask, ImageTask, DepthTask, VerifyTask, PitchTask, EmbeddingTask)):
        return task.describe()
    if isinstance(task, CtcTask):
        cut = (f"; each sample's first '{task.lengths}' steps, FP32's" if task.lengths
               else "")
        return (f"CTC sequences (greedy decoding of the top class per step on axis "
                f"{task.axis}, blank {task.blank}{cut}; judged by the decoded string)")
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


# the syntax (quantscope.tasks.layout_spec) is read from here too: one import for callers
__all__ = ["KINDS", "LAYOUT_NOTE", "QUOTE_HINT", "SYNTAX", "LayoutError", "LayoutSpec",
           "OutputTasks", "class_task", "ctc_task", "describe_classes", "layout_tasks",
           "parse_layout"]
