"""Probability maps and per-sample scores: scored by the decisions taken from them.

SQNR of a probability map can look alarming (15-19 dB on an OCR text map) while the map
binarised at its threshold is almost FP32's (IoU 0.97); and a per-sample probability can
keep a cosine of 1.0 while its decisions flip. These tasks score what the user acts on:

``map`` (``[N, K, H, W]``, ``[N, H, W]``, any ``[N, ...]``), values in [0, 1]
    each sample's map (with ``channel``: only that index of the channel axis, the graph's,
    else 1: the face channel of a 2-class Softmax map) binarised at ``threshold`` (default
    0.5); ``mask_iou`` (headline):
    mean over samples of the IoU of the quantized mask with FP32's (a sample where both
    are empty counts 1.0); ``mask_iou_min``; ``pixel_flip_share``: share of values on the
    other side of the threshold, over ``pixel_flip_share_items`` values (the effective
    count of the values clustered by sample, ``pixel_flip_share_clusters`` the samples:
    :mod:`quantscope.tasks.shares`); ``map_abs_error_mean`` / ``map_abs_error_max``: the
    mean / largest absolute difference from FP32's values, in the map's units (a matte's
    alpha 0..1: the MAE matting is judged by, which the binarised mask does not see).
``score`` (``[N]`` or ``[N, 1]``: one value per sample)
    ``decision_agreement`` (headline): share of samples on the same side of ``threshold``
    (default 0.5) as FP32, over ``decision_agreement_items`` decisions (its binomial noise:
    :mod:`quantscope.tasks.shares`); ``score_abs_error_max`` / ``score_abs_error_mean``.

Both say when FP32's values leave [0, 1] (a logit map: the threshold is then the user's to
declare) and when FP32 is on one side of the threshold everywhere; ``score`` also counts
FP32's positive decisions apart (a wake word's score is positive on a few clips: an
agreement over all of them is mostly the negatives').

A ``score`` is found without ``--layout`` (:func:`score_output`) when a ``Sigmoid`` makes
the model's only output, of one value per sample (through Reshape, Flatten, Squeeze,
Unsqueeze or Identity): a wake word's probability. Its fidelity figures (SQNR over a few
near-1 values among many near-0 ones) would otherwise be the headline. A model with more
outputs (a streaming VAD's state beside its probability, which the next step reads) keeps
every output's fidelity as the headline; its score's decisions are in the fidelity notes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from quantscope.emulate.channels import sides_text
from quantscope.emulate.class_axes import ClassAxis
from quantscope.model.load import Model
from quantscope.tasks.shares import items_key, share_counts
from quantscope.types import Metrics, Outputs
from quantscope.units import value

MAP_THRESHOLD = 0.5
SCORE_THRESHOLD = 0.5
IOU_RESEMBLES = 0.9
NEAR_EMPTY = 0.01  # a sample whose FP32 mask covers less of its values: its IoU is a few values'
AGREEMENT_RESEMBLES = 0.95


def _arrays(out: Outputs, name: str) -> list[np.ndarray]:
    i = out.names.index(name)
    return [np.asarray(b[i], dtype=np.float64) for b in out.batches]


def _range_note(output: str, kind: str, lo: float, hi: float, threshold: float) -> list[str]:
    if lo >= 0.0 and hi <= 1.0:
        return []
    return [f"output '{output}' spans {lo:.4g}..{hi:.4g}, not [0, 1]: threshold {threshold:g} "
            f"is only right if you chose it (--layout {output}={kind}:threshold=T)"]


def _near_empty_note(output: str, iou: np.ndarray, cover: np.ndarray) -> list[str]:
    """Samples whose FP32 mask is (nearly) empty: a segmentation on images without what it
    segments (a selfie model on a photo of a rocket) gives IoU 0 for a few stray values,
    1.0 for none, and those samples move the mean by 1/N each. The first line is the same
    for every model compared on the data (``run``'s verdict says it once); the second
    gives the figures."""
    near = cover < NEAR_EMPTY
    if not near.any():
        return []
    said = (f"output '{output}': FP32's mask covers under {NEAR_EMPTY:.0%} of the values on "
            f"{int(near.sum())} of {len(iou)} samples (an image without what the model "
            "segments: each one's IoU turns on a few values, 0 when the masks share none): "
            "the mask IoU says little of them")
    if not (~near).any():
        return [said]
    return [said, f"output '{output}': mask IoU {float(iou[~near].mean()):.3f} over the "
            f"{int(np.sum(~near))} samples whose FP32 mask covers {NEAR_EMPTY:.0%} or more "
            f"of the values ({float(iou[near].mean()):.3f} over the {int(near.sum())} others)"]


@dataclass(frozen=True, eq=False)
class MapTask:
    """A probability / segmentation map binarised at ``threshold`` (module docstring)."""

    name: str
    output: str
    threshold: float = MAP_THRESHOLD
    channel: int | None = None  # binarise this index of channel_axis alone (None: every value)
    channel_axis: int = 1  # the graph's channel axis (an NHWC map's last), else 1
    headline: str = "mask_iou"
    higher_is_better: bool = True
    row_local: bool = True
    # the axis the per-channel figures read, the layout's claim (axis None: a single map,
    # no channel axis; :func:`quantscope.tasks.layout_axes.map_task`); None: no claim
    read: ClassAxis | None = None

    def class_axes(self) -> dict[str, ClassAxis]:
        """The layout's claim (:attr:`read`: the maps' channel axis, with or without
        ``channel=K``, or none for a single map), else with ``channel=K`` the axis K
        indexes; else none is told (the graph's or the default is read, and said)."""
        if self.read is not None:
            return {self.output: self.read}
        if self.channel is None:
            return {}
        return {self.output: ClassAxis(self.channel_axis, 0, "the channels of its map layout "
                                       f"(channel={self.channel} is one)")}

    def metrics(self, ref: Outputs, test: Outputs) -> Metrics:
        ious: list[np.ndarray] = []
        flipped: list[np.ndarray] = []  # each sample's flipped values
        covers: list[np.ndarray] = []  # each sample's share of values in FP32's mask
        sizes: list[np.ndarray] = []  # each sample's values
        flips = total = fg = 0
        err_sum = err_max = 0.0
        lo, hi = np.inf, -np.inf
        for r, t in zip(_arrays(ref, self.output), _arrays(test, self.output), strict=True):
            if self.channel is not None:
                r = np.take(r, self.channel, axis=self.channel_axis)
                t = np.take(t, self.channel, axis=self.channel_axis)
            mr = (r >= self.threshold).reshape(len(r), -1)
            mt = (t >= self.threshold).reshape(len(t), -1)
            inter, union = np.sum(mr & mt, axis=1), np.sum(mr | mt, axis=1)
            ious.append(np.where(union > 0, inter / np.maximum(union, 1), 1.0))
            covers.append(np.mean(mr, axis=1))
            flipped.append(np.sum(mr != mt, axis=1))
            sizes.append(np.full(len(mr), mr.shape[1]))
            flips += int(np.sum(mr != mt))
            total += mr.size
            fg += int(mr.sum())
            if r.size:
                err = np.abs(t - r)
                err_sum, err_max = err_sum + float(err.sum()), max(err_max, float(err.max()))
                lo, hi = min(lo, float(r.min())), max(hi, float(r.max()))
        iou = np.concatenate(ious) if ious else np.zeros(0)
        values = {"mask_iou": float(iou.mean()) if iou.size else float("nan"),
                  "mask_iou_min": float(iou.min()) if iou.size else float("nan"),
                  "pixel_flip_share": flips / total if total else float("nan"),
                  **(share_counts("pixel_flip_share", np.concatenate(flipped),
                                  np.concatenate(sizes)) if total else {}),
                  "mask_share_fp32": fg / total if total else float("nan"),
                  "map_abs_error_mean": err_sum / total if total else float("nan"),
                  "map_abs_error_max": err_max if total else float("nan")}
        notes = _range_note(self.output, "map", lo, hi, self.threshold)
        if total and fg in (0, total):
            side = "below" if fg == 0 else "at or above"
            notes.append(f"output '{self.output}': FP32's map is {side} {self.threshold:g} "
                         "everywhere: the mask IoU says little (only that the quantized map is too)")
        elif iou.size:
            notes.extend(_near_empty_note(self.output, iou, np.concatenate(covers)))
        if values["mask_iou"] < IOU_RESEMBLES:
            notes.append(f"NOT LIKE FP32: output '{self.output}' mask IoU "
                         f"{values['mask_iou']:.3f} < {IOU_RESEMBLES:g} at threshold "
                         f"{self.threshold:g}")
        return Metrics(values=values, notes=tuple(notes))


@dataclass(frozen=True, eq=False)
class ScoreTask:
    """One value per sample, read as a decision at ``threshold`` (module docstring)."""

    name: str
    output: str
    threshold: float = SCORE_THRESHOLD
    headline: str = "decision_agreement"
    higher_is_better: bool = True
    row_local: bool = True

    def metrics(self, ref: Outputs, test: Outputs) -> Metrics:
        r = np.concatenate([a.reshape(len(a), -1) for a in _arrays(ref, self.output)])
        t = np.concatenate([a.reshape(len(a), -1) for a in _arrays(test, self.output)])
        dr, dt = r >= self.threshold, t >= self.threshold
        err = np.abs(t - r)
        values = {"decision_agreement": float(np.mean(dr == dt)) if dr.size else float("nan"),
                  items_key("decision_agreement"): float(dr.size),
                  "score_abs_error_max": float(err.max()) if err.size else float("nan"),
                  "score_abs_error_mean": float(err.mean()) if err.size else float("nan"),
                  "decisions_positive_fp32": float(np.mean(dr)) if dr.size else float("nan")}
        notes = _range_note(self.output, "score", float(r.min(initial=np.inf)),
                            float(r.max(initial=-np.inf)), self.threshold) if r.size else []
        flipped = int(np.sum(dr != dt))
        if dr.size and not (dr.all() | (~dr).all()) and self.threshold != SCORE_THRESHOLD:
            # (at 0.5 the output's own fidelity note counts them: emulate.channels)
            notes.append(f"output '{self.output}' at {self.threshold:g}: " + sides_text(
                int(dr.size), int(dr.sum()), int((dr & dt).sum()), int(dt.sum())))
        if dr.size and dr.all() | (~dr).all():
            notes.append(f"output '{self.output}': FP32 decides the same on every sample at "
                         f"{self.threshold:g}: the decision agreement says little; give data with both "
                         "outcomes")
        if dr.size and values["decision_agreement"] < AGREEMENT_RESEMBLES:
            notes.append(f"NOT LIKE FP32: output '{self.output}': {flipped} of {dr.size} "
                         f"decisions at {self.threshold:g} flip (agreement "
                         f"{value('decision_agreement', values['decision_agreement'])} < "
                         f"{value('decision_agreement', AGREEMENT_RESEMBLES)})")
        return Metrics(values=values, notes=tuple(notes))


_CARRY = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})


def score_output(model: Model, output: str, samples: int | None) -> bool:
    """True when a ``Sigmoid`` makes ``output``, the model's only output (through ops
    that only reshape it), and it holds one value per sample (every axis but the samples'
    of static size 1)."""
    if model.output_names() != (output,):
        return False
    shape = model.value_shapes().get(output)
    axis = samples or 0
    if shape is None or len(shape) <= axis or any(
            d != 1 for k, d in enumerate(shape) if k != axis):
        return False
    producer = {o: n for n in model.graph.node for o in n.output}
    node = producer.get(output)
    while node is not None and node.op_type in _CARRY and node.input:
        node = producer.get(node.input[0])
    return node is not None and node.op_type == "Sigmoid"
