"""CTC sequences: a text recognizer's output judged by the string it decodes to.

A CRNN / SVTR recognizer (PP-OCR's ``[N, T, 6625]`` after a Softmax, EasyOCR's
``[N, T, 97]`` logits) gives one class per time step, and the host reads text from it
by CTC greedy decoding: the top class of each step, repeats merged, the blank class
dropped. Most steps are blank, so a top-1 agreement per step reads 98 % while a word
changes, and the whole-output SQNR says nothing about the string. Declared
``--layout OUTPUT=ctc[:blank=B,axis=K]``, the output is decoded greedily, FP32's and the
quantized model's alike, and judged by the labels the host would read:

``string_agreement`` (headline)
    the share of samples whose decoded label sequence is FP32's exactly (over
    ``string_agreement_items`` samples);
``char_error_rate``
    the edit distance (insertions, deletions, substitutions) of the quantized sequences
    to FP32's, summed over the samples, over FP32's label count ``chars_fp32`` (above 1
    when the quantized model reads more labels than FP32 does).

No dictionary is needed: labels are compared as class numbers (one character each in
a CTC recognizer's dictionary). ``blank`` (default 0, PaddleOCR and EasyOCR; -1: the last
class, a Keras/TF export's) is the class dropped; ``axis`` (default -1, the last) the
class axis; the other non-sample axis is time. Notes say when FP32 decodes an empty
string on every sample (a wrong ``blank=``, or data the model does not read) and when the
agreement is below :data:`STRINGS_RESEMBLE` (``NOT LIKE FP32``, with a sample's two
sequences). The per-class figures (:mod:`quantscope.emulate.channels`) are told that the
string decides, not each step: a class whose step changes change no string on the data
(:func:`string_moves`) is counted apart (``collapsed_strings_kept``), not judged; with a
``lengths`` output they judge each step alone (the cut is another output's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import onnx

from quantscope.emulate.channels import TopClasses
from quantscope.emulate.class_axes import ClassAxis
from quantscope.tasks.shares import items_key
from quantscope.tasks.unscored import MARK as UNSCORED
from quantscope.types import Metrics, Outputs, moved_axis
from quantscope.units import value

_FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)
DEFAULT_BLANK = 0
STRINGS_RESEMBLE = 0.95
SHOWN_LABELS = 12  # labels of a changed sample written in a note


def greedy_decode(steps: np.ndarray, blank: int) -> list[tuple[int, ...]]:
    """CTC greedy decoding of ``[N, T, C]`` scores: per sample, each step's top class,
    repeats merged, ``blank`` (a class number in 0..C-1) dropped."""
    return [_labels(seq, blank) for seq in np.asarray(steps).argmax(axis=-1)]


def _labels(seq: np.ndarray, blank: int) -> tuple[int, ...]:
    """One sample's steps' top classes ``[T]`` read as CTC greedy decoding does."""
    keep = np.ones(len(seq), dtype=bool)
    keep[1:] = seq[1:] != seq[:-1]
    return tuple(int(k) for k in seq[keep] if k != blank)


def string_moves(ref: np.ndarray, test: np.ndarray, blank: int, classes: int) -> np.ndarray:
    """Per class (``[classes]`` counts), the samples whose decoded string its step changes
    change: of the steps' top classes ``[N, T]`` of FP32 (``ref``) and the quantized model
    (``test``), a class's step changes are the steps where it is either one's top and the
    two differ; they change a string when, applied alone to FP32's steps, the string is
    no longer FP32's, or, undone alone from the quantized model's, no longer its own
    (measured both ways: a class moved to another step can read the same alone and yet
    change the order with another class's change). A class without step changes changes
    no string; ``blank`` is a class number in 0..classes-1."""
    moved = np.zeros(classes, np.int64)
    for a, b in zip(ref, test, strict=True):
        diff = a != b
        if not diff.any():
            continue
        read_a, read_b = _labels(a, blank), _labels(b, blank)
        for k in np.union1d(a[diff], b[diff]):
            steps = diff & ((a == k) | (b == k))
            on, off = a.copy(), b.copy()
            on[steps], off[steps] = b[steps], a[steps]
            moved[k] += _labels(on, blank) != read_a or _labels(off, blank) != read_b
    return moved


def edit_distance(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Levenshtein distance of two label sequences."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        diag, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            diag, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diag + (x != y))
    return row[-1]


def _steps(out: Outputs, name: str, axis: int) -> tuple[np.ndarray, ...]:
    """Each batch of output ``name`` as ``[N, T, C]`` (the class ``axis`` of the sample-first
    arrays moved last)."""
    i = out.names.index(name)
    return tuple(np.moveaxis(np.asarray(b[i]), axis, -1) for b in out.batches)


@dataclass(frozen=True, eq=False)
class CtcTask:
    """A ``[N, T, C]`` output decoded by CTC greedy decoding, judged by the decoded
    labels (module docstring). ``axis``: the class axis of the output as the model
    declares it (-1 the last); ``sample_axis``: its samples' axis (``--batch-axis``)."""

    name: str
    output: str
    blank: int = DEFAULT_BLANK
    axis: int = -1
    sample_axis: int = 0
    lengths: str | None = None  # an int output: each sample's valid steps (FP32's read)
    headline: str = "string_agreement"
    higher_is_better: bool = True
    row_local: bool = True

    def top_classes(self) -> dict[str, TopClasses]:
        """Each step's top class on ``axis`` is read, and a sample's string from them
        (greedy decoding, :func:`string_moves`); with ``lengths``, each step alone (the
        string is cut where another output says, which the per-class figures cannot see)."""
        moves = None if self.lengths is not None else partial(_moves, self.blank)
        return {self.output: TopClasses(self.axis, self.sample_axis, moves=moves)}

    def class_axes(self) -> dict[str, ClassAxis]:
        """The per-channel figures read the classes on ``axis``, not the time steps."""
        return {self.output: ClassAxis(self.axis, self.sample_axis,
                                       "the classes of the declared ctc layout")}

    def metrics(self, ref: Outputs, test: Outputs) -> Metrics:
        i = ref.names.index(self.output)
        shape = np.shape(ref.batches[0][i]) if ref.batches else ()
        axis = moved_axis(self.axis, self.sample_axis, len(shape)) % max(len(shape), 1)
        why = self._unscorable(shape, axis)
        if why:
            return Metrics(values={"string_agreement": float("nan")},
                           notes=(f"output '{self.output}' not decoded as CTC: {why}",))
        classes = shape[axis]
        blank = self.blank % classes
        cuts = self._cuts(ref)
        if isinstance(cuts, str):
            return Metrics(values={"string_agreement": float("nan")},
                           notes=(f"output '{self.output}' not decoded as CTC: {cuts}",))
        r = _decoded(_steps(ref, self.output, axis), blank, cuts)
        t = _decoded(_steps(test, self.output, axis), blank, cuts)
        same = np.array([a == b for a, b in zip(r, t, strict=True)])
        chars = sum(len(a) for a in r)
        edits = sum(edit_distance(b, a) for a, b in zip(r, t, strict=True))
        values = {"string_agreement": float(same.mean()),
                  items_key("string_agreement"): float(len(same)),
                  "char_error_rate": edits / chars if chars else float("nan"),
                  "chars_fp32": float(chars)}
        notes = []
        if not chars:
            notes.append(f"output '{self.output}': FP32 decodes an empty string on every "
                         f"sample (every step's top class is the blank, {blank}): the string "
                         f"agreement says little; check blank= (-1: the last class) and the data")
        if values["string_agreement"] < STRINGS_RESEMBLE:
            k = int(np.argmin(same))
            notes.append(f"NOT LIKE FP32: output '{self.output}': the decoded string changes "
                         f"on {int((~same).sum())} of {len(same)} samples (string agreement "
                         f"{value('string_agreement', values['string_agreement'])} < "
                         f"{value('string_agreement', STRINGS_RESEMBLE)}, character error rate "
                         f"{value('char_error_rate', values['char_error_rate'])}); e.g. sample "
                         f"{k}: FP32 labels {_shown(r[k])}, quantized {_shown(t[k])}")
        return Metrics(values=values, notes=tuple(notes))

    def _cuts(self, ref: Outputs) -> list[np.ndarray] | str | None:
        """Each batch's valid steps per sample, FP32's ``lengths`` output (the host decodes
        no step past it); None without one; why not, as a string."""
        if self.lengths is None:
            return None
        i, k = ref.names.index(self.output), ref.names.index(self.lengths)
        cuts = []
        for b in ref.batches:
            n, lens = np.shape(b[i])[0], np.asarray(b[k]).reshape(-1)
            if len(lens) != n:
                return (f"lengths output '{self.lengths}' gives {len(lens)} values for "
                        f"{n} samples: it must give one per sample")
            cuts.append(lens)
        return cuts

    def _unscorable(self, shape: tuple[int, ...], axis: int) -> str | None:
        """Why arrays of ``shape`` (sample-first) are no ``[N, T, C]`` to decode, else None."""
        if len(shape) != 3:
            return (f"its arrays have shape {shape}, not [samples, time, classes]; give "
                    f"--layout {self.output}=class for class scores of another rank")
        if axis == 0 or shape[axis] < 2:
            return f"its arrays have shape {shape}: axis {self.axis} is no class axis"
        if not -shape[axis] <= self.blank < shape[axis]:
            return (f"blank={self.blank} is no class of {shape[axis]}: give blank=0..."
                    f"{shape[axis] - 1} (-1: the last)")
        return None


def _decoded(batches: tuple[np.ndarray, ...], blank: int,
             cuts: list[np.ndarray] | None) -> list[tuple[int, ...]]:
    """Every sample's decoded labels, each cut at its valid steps where ``cuts`` gives them."""
    if cuts is None:
        return [s for b in batches for s in greedy_decode(b, blank)]
    return [greedy_decode(b[j:j + 1, :max(int(n), 0)], blank)[0]
            for b, lens in zip(batches, cuts, strict=True) for j, n in enumerate(lens)]


def _moves(blank: int, ref: np.ndarray, test: np.ndarray, classes: int) -> np.ndarray:
    """:func:`string_moves` with ``blank`` as given (-1: the last class)."""
    return string_moves(ref, test, blank % classes, classes)


def _shown(labels: tuple[int, ...]) -> str:
    more = f", … {len(labels)} in all" if len(labels) > SHOWN_LABELS else ""
    return "[" + ", ".join(map(str, labels[:SHOWN_LABELS])) + more + "]"


MIN_HINT_CLASSES = 10  # a last axis this long, written by a linear layer, may be classes
_MOVES = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Flatten")
_CLASSIFIES = ("Gemm", "MatMul", "LogSoftmax")  # a Softmax over classes is read as such


def ctc_hint(proto: onnx.ModelProto, shapes: Mapping[str, tuple], outputs: Sequence[str],
             samples: Mapping[str, int] | None) -> str | None:
    """One note naming the undeclared rank-3 float ``outputs`` that a linear layer (or a
    LogSoftmax) writes over a last axis of :data:`MIN_HINT_CLASSES` or more, through
    reshapes only (ddddocr's ``387 [T, 1, 8210]`` from a Gemm, EasyOCR's logits): per-step
    class scores whose strings nothing judges unless ``ctc`` is declared (it is never found
    by itself); not a square ``[T, T]`` (attention's); None when there are none."""
    made = {o: n for n in proto.graph.node for o in n.output}
    floats = {o.name for o in proto.graph.output if o.type.tensor_type.elem_type in _FLOATS}
    found = []
    for out in outputs:
        shape, node = shapes.get(out) or (), made.get(out)
        while node is not None and node.op_type in _MOVES:
            node = made.get(node.input[0])
        if node is not None and node.op_type == "Add":  # MatMul + bias
            node = next((made[i] for i in node.input if i in made
                         and made[i].op_type == "MatMul"), None)
        if (out in floats and len(shape) == 3 and isinstance(shape[-1], int)
                and shape[-1] >= MIN_HINT_CLASSES and (samples or {}).get(out, 0) != 2
                and shape[-1] != shape[-2]
                and node is not None and node.op_type in _CLASSIFIES):
            found.append((out, shape))
    if not found:
        return None
    out, shape = found[0]
    dims = ", ".join(str(d) if isinstance(d, int) else "?" for d in shape)
    more = f" (and {len(found) - 1} more output(s) alike)" if len(found) > 1 else ""
    return (f"output '{out}' [{dims}]{more} is written by a linear layer over "
            f"{shape[-1]} values on its last axis, as a text recognizer's per-step class "
            f"scores are, and {UNSCORED} (cosine, SQNR: not the string the host "
            f"decodes); if it is one, declare --layout {out}=ctc (CTC greedy strings; "
            f"blank=0, or -1 for the last class) or {out}=class:axis=2 (the top class per "
            "step)")
