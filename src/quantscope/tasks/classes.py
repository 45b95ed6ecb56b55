"""Class scores: a classifier's output judged by the class it picks.

A classifier's probabilities can keep a whole-output SQNR of 50 dB while the class that
ships changes, and its logits can read 22 dB while every sample keeps its class. The
class task scores what the user acts on:

``class`` (``[N, C]``; ``[N, C, H, W]`` per position: a segmentation's class logits;
``[N, T, C]`` per position with the classes on ``axis`` 2: a token classifier, an LM head)
    ``top1_agreement`` (headline): share of samples (and positions) whose top class is
    FP32's; ``top5_agreement``: share whose FP32 top class is among the quantized top 5
    (when there are more than 5 classes); ``top1_ties``: share whose quantized top score
    is shared by several classes (the grid merged them; the first one wins the argmax);
    ``top1_agreement_items``: the picks the share is over (per position, the effective
    count of positions clustered by sample, ``top1_agreement_clusters`` the samples:
    :mod:`quantscope.tasks.shares`); ``top5_agreement_items`` (``_clusters``) alike.
    ``class_iou_min`` (when FP32 or the quantized model picks several classes): the
    lowest, over the classes either picks, of the IoU of the samples (positions) where
    FP32 picks the class with those where the quantized model does, with
    ``class_iou_min_items`` (where either picks it; per position the effective count
    clustered by sample, ``class_iou_min_clusters`` the samples). A face map (P-Net) whose faces are
    0.5 % of the positions can lose every one of them, or double them, at 99.5 % top-1
    agreement: this figure then reads 0, or 0.5.

Notes say when FP32 picks one class on every sample (the agreement then says little) and
when the agreement is below :data:`AGREEMENT_RESEMBLES`, or a class's IoU below
:data:`quantscope.tasks.maps.IOU_RESEMBLES` (as a map's mask) (``NOT LIKE FP32``).

An output made by a Softmax or LogSoftmax over the classes of a ``[N, C]`` tensor, over
axis 1 of a ``[N, C, ...]`` one (a segmentation's per-pixel class probabilities), or over
the last axis of a ``[N, ..., C]`` one (a token classifier's; not an attention's) is read
as class scores without being declared (:func:`class_output`), and so is an output the
graph itself takes an ``ArgMax`` or ``TopK`` of (:func:`picked_output`); other logits need
``--layout OUTPUT=class`` (``class:axis=K`` to give the class axis).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from quantscope.emulate.channels import TopClasses
from quantscope.emulate.class_axes import ClassAxis
from quantscope.model.load import Model
from quantscope.tasks.maps import IOU_RESEMBLES
from quantscope.tasks.shares import items_key, share_counts
from quantscope.types import Metrics, Outputs, moved_axis
from quantscope.units import value

AGREEMENT_RESEMBLES = 0.95
TOP_K = 5
# the words of a class layout's note when its axis is a default (the verdict finds them)
AXIS_BY_DEFAULT = "the graph does not say which axis holds the classes"


def _classes_last(out: Outputs, name: str, axis: int) -> list[np.ndarray]:
    """Each batch as ``[samples x positions, C]`` (the class ``axis`` moved last; the rows
    sample by sample, each sample's positions in order)."""
    i = out.names.index(name)
    arrays = []
    for b in out.batches:
        a = np.moveaxis(np.asarray(b[i], dtype=np.float64), axis, -1)
        arrays.append(a.reshape(-1, a.shape[-1]))
    return arrays


def _positions(out: Outputs, name: str, axis: int) -> np.ndarray:
    """Each sample's number of positions (1 for ``[N, C]``: every non-sample axis but the
    class ``axis``), in the order of :func:`_classes_last`'s rows."""
    i = out.names.index(name)
    sizes = []
    for b in out.batches:
        shape = np.shape(b[i])
        rest = [d for k, d in enumerate(shape[1:], 1) if k != axis % len(shape)]
        sizes.append(np.full(shape[0], int(np.prod(rest, dtype=np.int64))))
    return np.concatenate(sizes) if sizes else np.zeros(0, np.int64)


def _bad_axis(out: Outputs, name: str, axis: int) -> str | None:
    """Why ``axis`` is no class axis of the arrays ``out`` holds (a symbolic shape the
    layout could not check), else None."""
    i = out.names.index(name)
    for b in out.batches:
        shape = np.shape(b[i])
        if len(shape) < 2 or not -len(shape) <= axis < len(shape) or axis % len(shape) == 0:
            return f"its arrays have shape {shape}: axis {axis} is no class axis"
        if shape[axis] < 2:
            return (f"its arrays have shape {shape}: axis {axis} holds {shape[axis]} value, "
                    "no classes to pick")
    return None


@dataclass(frozen=True, eq=False)
class ClassTask:
    """Class scores on ``axis`` (of the output as the model declares it; 1 by default, -1
    the last), judged by the top class (module docstring). ``sample_axis``: the output's
    axis of the samples (``--batch-axis``), which the scored arrays hold first
    (:func:`quantscope.types.moved_axis` translates ``axis`` to them)."""

    name: str
    output: str
    headline: str = "top1_agreement"
    higher_is_better: bool = True
    row_local: bool = True
    axis: int = 1
    axis_read: str = ""  # where the axis came from, said in the layout's note
    sample_axis: int = 0

    def top_classes(self) -> dict[str, TopClasses]:
        """The output is decided by its top class on ``axis`` (the per-channel check's
        :class:`quantscope.emulate.channels.TopClasses`)."""
        return {self.output: TopClasses(self.axis, self.sample_axis)}

    def class_axes(self) -> dict[str, ClassAxis]:
        """The per-channel figures read the classes on ``axis``."""
        read = f" ({self.axis_read})" if self.axis_read else ""
        return {self.output: ClassAxis(self.axis, self.sample_axis,
                                       f"the classes of its class task{read}")}

    def metrics(self, ref: Outputs, test: Outputs) -> Metrics:
        i = ref.names.index(self.output)
        rank = np.ndim(ref.batches[0][i]) if ref.batches else 0
        axis = moved_axis(self.axis, self.sample_axis, rank)
        bad = _bad_axis(ref, self.output, axis)
        if bad:
            return Metrics(values={"top1_agreement": float("nan")},
                           notes=(f"output '{self.output}' not scored as classes: {bad}; "
                                  f"give --layout {self.output}=class:axis=K",))
        r = np.concatenate(_classes_last(ref, self.output, axis))
        t = np.concatenate(_classes_last(test, self.output, axis))
        n, classes = r.shape if r.ndim == 2 else (0, 0)
        rows = "positions" if ref.batches and np.ndim(ref.batches[0][
            ref.names.index(self.output)]) > 2 else "samples"
        if not n:
            return Metrics(values={"top1_agreement": float("nan")},
                           notes=(f"output '{self.output}': no samples to compare",))
        top_r, top_t = r.argmax(axis=1), t.argmax(axis=1)
        agree = top_r == top_t
        positions = _positions(ref, self.output, axis)
        values = {"top1_agreement": float(agree.mean()),
                  **_items("top1_agreement", agree, positions)}
        if classes > TOP_K:
            best = np.argpartition(-t, TOP_K - 1, axis=1)[:, :TOP_K]
            top5 = np.any(best == top_r[:, None], axis=1)
            values["top5_agreement"] = float(np.mean(top5))
            values.update(_items("top5_agreement", top5, positions))
        own = np.sum(r == r.max(axis=1, keepdims=True), axis=1) > 1  # FP32's own ties
        ties = (np.sum(t == t.max(axis=1, keepdims=True), axis=1) > 1) & ~own
        values["top1_ties"] = float(ties.mean())
        values["top1_ties_fp32"] = float(own.mean())
        notes = []
        worst = _worst_class(top_r, top_t)
        if worst is not None:
            values["class_iou_min"] = worst[4]
            values.update(_iou_items(top_r == worst[0], top_t == worst[0], positions))
        picked = np.unique(top_r)
        if len(picked) == 1 and n > 1:
            notes.append(f"output '{self.output}': FP32 picks class {int(picked[0])} on every "
                         f"{rows[:-1]}: the top-1 agreement says little; give data of several classes")
        if ties.any():
            notes.append(f"output '{self.output}': on {int(ties.sum())} of {n} {rows} the "
                         "quantized top score is shared by several classes (the grid step "
                         "merges them; the argmax takes the first)")
        if own.any():
            notes.append(f"output '{self.output}': on {int(own.sum())} of {n} {rows} FP32's "
                         "own top score is shared by several classes (every class equal "
                         "there, as on frames past a lengths input or a masked position): "
                         "both models' argmax takes the first class, so their agreement there "
                         "says nothing of the quantization")
        if values["top1_agreement"] < AGREEMENT_RESEMBLES:
            notes.append(f"NOT LIKE FP32: output '{self.output}': the top class changes on "
                         f"{int((~agree).sum())} of {n} {rows} (top-1 agreement "
                         f"{value('top1_agreement', values['top1_agreement'])} < "
                         f"{value('top1_agreement', AGREEMENT_RESEMBLES)})")
        elif worst is not None and worst[4] < IOU_RESEMBLES:
            k, fp32, quantized, both, iou = worst
            notes.append(f"NOT LIKE FP32: output '{self.output}': class {k}: FP32 gives it on "
                         f"{fp32} {rows}, the quantized model on {quantized}, both on {both} "
                         f"(IoU {iou:.3f} < {IOU_RESEMBLES}); the top-1 agreement "
                         f"{value('top1_agreement', values['top1_agreement'])} is mostly the "
                         f"other classes' {rows} (--metric class_iou_min plans for the class)")
        return Metrics(values=values, notes=tuple(notes))


def _worst_class(top_r: np.ndarray, top_t: np.ndarray
                 ) -> tuple[int, int, int, int, float] | None:
    """(the class, FP32's picks of it, the quantized model's, both's, their IoU) of the
    class of lowest IoU among those either model picks (ties: the lower class); None when
    both pick one and the same class everywhere."""
    classes = np.union1d(top_r, top_t)
    if len(classes) < 2:
        return None
    size = int(classes.max()) + 1
    fp32, quantized = np.bincount(top_r, minlength=size), np.bincount(top_t, minlength=size)
    both = np.bincount(top_r[top_r == top_t], minlength=size)
    iou = both[classes] / (fp32[classes] + quantized[classes] - both[classes])
    i = int(np.argmin(iou))
    k = int(classes[i])
    return k, int(fp32[k]), int(quantized[k]), int(both[k]), float(iou[i])


def _iou_items(fp32: np.ndarray, quantized: np.ndarray, positions: np.ndarray
               ) -> dict[str, float]:
    """The items ``class_iou_min`` is over: the positions where either model picks the
    class (``fp32``, ``quantized``: where each does), a share of them picked by both; per
    position, the effective count of those positions clustered by their sample, and the
    samples (:func:`quantscope.tasks.shares.share_counts`: the faces of one photo move
    together, so the raw count of positions made the noise of the IoU far too small)."""
    either, both = fp32 | quantized, fp32 & quantized
    positions = positions[positions > 0]
    if len(positions) == len(either) or int(positions.sum()) != len(either):
        return {items_key("class_iou_min"): float(either.sum())}
    starts = np.r_[0, np.cumsum(positions)[:-1]]
    return share_counts("class_iou_min", np.add.reduceat(both.astype(np.float64), starts),
                        np.add.reduceat(either.astype(np.int64), starts))


def _items(metric: str, agree: np.ndarray, positions: np.ndarray) -> dict[str, float]:
    """The items the share ``metric`` (top-1 or top-5 agreement) is over
    (:func:`quantscope.tasks.shares.share_counts`): the samples of ``[N, C]``; per
    position, the effective count of the positions clustered by their sample, and the
    samples."""
    positions = positions[positions > 0]
    if len(positions) == len(agree) or int(positions.sum()) != len(agree):
        return {items_key(metric): float(len(agree))}
    hits = np.add.reduceat(agree.astype(np.float64), np.r_[0, np.cumsum(positions)[:-1]])
    return share_counts(metric, hits, positions)


def class_output(model: Model, output: str) -> int | None:
    """The class axis of ``output`` when the graph makes it a Softmax or LogSoftmax over
    the classes: of a ``[N, C]`` tensor, over axis 1 of a ``[N, C, ...]`` one (per
    position: a segmentation), or over the last axis of a ``[N, ..., C]`` one (per
    position: a token classifier's ``[N, T, C]``) that is no attention's (its input is not
    from an activation x activation MatMul), with C >= 2 or symbolic (an ``Identity`` after
    the Softmax, as Paddle2ONNX writes every output, is looked through); else None. Before
    opset 13 a Softmax flattens the axes from its axis on: only the last axis is one axis."""
    from quantscope.model.axes import softmax_facts

    node = next((n for n in model.graph.node if output in n.output), None)
    while node is not None and node.op_type == "Identity" and node.input:  # Paddle2ONNX's last
        node = next((n for n in model.graph.node if node.input[0] in n.output), None)
    if node is None or node.op_type not in ("Softmax", "LogSoftmax"):
        return None
    shape = model.value_shapes().get(output)
    if shape is None or len(shape) < 2:
        return None
    axis, _, attention = softmax_facts(model, node)
    axis %= len(shape)
    last = axis == len(shape) - 1
    if not (last or (axis == 1 and model.opset() >= 13)) or axis == 0:
        return None
    if axis != 1 and attention:
        return None
    c = shape[axis]
    if isinstance(c, int) and c < 2:
        return None
    return axis


def picked_output(model: Model, output: str) -> tuple[int, str] | None:
    """(the class axis, the node) of an output the graph itself picks classes from: an
    ``ArgMax`` or ``TopK`` over its axis 1 (``[N, C]``, ``[N, C, ...]``: per position) or
    its last axis (``[N, ..., C]``) reads it, so it holds class scores (logits beside the
    label the graph outputs); else None."""
    shape = model.value_shapes().get(output)
    if shape is None or len(shape) < 2:
        return None
    for node in model.graph.node:
        if node.op_type not in ("ArgMax", "TopK") or not node.input or node.input[0] != output:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"),
                    0 if node.op_type == "ArgMax" else -1) % len(shape)
        c = shape[axis]
        if axis != 0 and (axis in (1, len(shape) - 1)) and not (isinstance(c, int) and c < 2):
            return axis, node.name
    return None
