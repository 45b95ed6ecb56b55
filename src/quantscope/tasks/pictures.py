"""Image outputs (an image-to-image model: super-resolution, denoising, a depth or alpha
map read as an image), scored as a picture is: PSNR against FP32 in the image's own range.

A 3-channel picture's per-channel cosine or SQNR names a channel, not what the eye sees;
the figure an image engineer compares is the peak signal-to-noise ratio over the pixel
range (255 for 8-bit pixels). Declared ``--layout OUT=image[:range=LO-HI]``:

========================  ==============================================================
``psnr_db``               (headline) ``10 log10(peak² / MSE)`` against FP32, the MSE over
                          every value of every sample, the peak the range's span
``psnr_min_db``           the worst sample's PSNR
``image_abs_error_mean``  mean / largest absolute difference from FP32, in the output's
``image_abs_error_max``   units (pixel levels for a 0-255 image)
``image_outside_share``   share of FP32's values outside the range (a range that is not
                          the image's: the PSNR's peak is then not its peak; said)
========================  ==============================================================

Undeclared, an output shaped like a map or a picture (:func:`dense_hint`) is scored by its
fidelity, and a note says so with the kinds to declare.

``range`` defaults to FP32's own min..max on the data scored (a relative depth map has no
declared range), said in a note with how to give one. An output where the quantized model
equals FP32 reads ``+inf dB``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from quantscope.model.load import Model
from quantscope.types import Metrics, Outputs, QuantscopeError

PSNR_RESEMBLES = 30.0  # dB: below it, a picture's error is visible (a rule of thumb)


def parse_range(text: str) -> tuple[float, float]:
    """``LO-HI`` (``0-255``, ``0-1``, ``-1-1``) -> ``(LO, HI)`` with LO < HI, or ValueError."""
    for k in range(1, len(text)):
        if text[k] == "-" and text[k - 1] not in "eE":
            lo, hi = float(text[:k]), float(text[k + 1:])
            if math.isfinite(lo) and math.isfinite(hi) and lo < hi:
                return lo, hi
            break
    raise ValueError(text)


def _psnr(peak: float, mse: float) -> float:
    if mse <= 0.0:
        return math.inf
    return 10.0 * math.log10(peak * peak / mse)


@dataclass(frozen=True, eq=False)
class ImageTask:
    """An output read as an image, scored by PSNR against FP32 (module docstring)."""

    name: str
    output: str
    range: tuple[float, float] | None = None  # None: FP32's min..max on the data scored
    headline: str = "psnr_db"
    higher_is_better: bool = True
    row_local: bool = True

    def describe(self) -> str:
        rng = (f"range {self.range[0]:g}..{self.range[1]:g}" if self.range else
               "FP32's own range on the data")
        return f"an image, judged by PSNR against FP32 over its {rng}"

    def metrics(self, ref: Outputs, test: Outputs) -> Metrics:
        i = ref.names.index(self.output)
        sse: list[float] = []
        sizes: list[int] = []
        err_sum = err_max = 0.0
        lo, hi = math.inf, -math.inf
        outside = total = 0
        for rb, tb in zip(ref.batches, test.batches, strict=True):
            r = np.asarray(rb[i], dtype=np.float64)
            t = np.asarray(tb[i], dtype=np.float64)
            if r.shape != t.shape:
                raise QuantscopeError(f"--layout: output '{self.output}' has shape {t.shape} "
                                      f"quantized and {r.shape} in FP32: not one image")
            d = (t - r).reshape(len(r), -1)
            sse.extend(np.sum(d * d, axis=1).tolist())
            sizes.extend([d.shape[1]] * len(d))
            if d.size:
                err_sum += float(np.abs(d).sum())
                err_max = max(err_max, float(np.abs(d).max()))
                lo, hi = min(lo, float(r.min())), max(hi, float(r.max()))
            if self.range is not None:
                outside += int(np.sum((r < self.range[0]) | (r > self.range[1])))
            total += d.size
        if not total:
            return Metrics(values={"psnr_db": float("nan")}, notes=())
        a, b = self.range if self.range is not None else (lo, hi)
        peak = b - a
        notes: list[str] = []
        if self.range is None:
            notes.append(f"output '{self.output}': PSNR over FP32's own range {lo:.4g}..{hi:.4g} "
                         f"on this data (give the image's: --layout {self.output}=image:range="
                         "0-255 for 8-bit pixels, 0-1 for a matte)")
        if peak <= 0.0:  # FP32 constant and no range declared: no peak to measure against
            return Metrics(values={"psnr_db": float("nan")}, notes=(
                *notes, f"output '{self.output}': FP32 is one value everywhere: no PSNR; "
                "declare the range"))
        per = [_psnr(peak, s / n) for s, n in zip(sse, sizes, strict=True)]
        values = {"psnr_db": _psnr(peak, sum(sse) / total),
                  "psnr_min_db": min(per),
                  "image_abs_error_mean": err_sum / total,
                  "image_abs_error_max": err_max}
        if self.range is not None:
            values["image_outside_share"] = outside / total
            if outside:
                notes.append(f"output '{self.output}': {outside / total:.1%} of FP32's values "
                             f"lie outside the declared range {a:g}..{b:g} ({lo:.4g}..{hi:.4g}): "
                             "the PSNR's peak is not the image's; declare its range")
        if values["psnr_db"] < PSNR_RESEMBLES:
            notes.append(f"NOT LIKE FP32: output '{self.output}' PSNR "
                         f"{values['psnr_db']:.1f} dB < {PSNR_RESEMBLES:g} dB against FP32 "
                         f"(peak {peak:g}): the difference is visible")
        return Metrics(values=values, notes=tuple(notes))


MIN_SIDE = 16  # a map or picture: both spatial sides at least this (or symbolic)
_CARRY = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Identity", "Transpose"})


def _dense(model: Model, output: str, samples: int | None) -> str | None:
    """``output``'s shape as text when it is shaped like a map or a picture (``[N, C, H, W]``
    or ``[N, H, W, C]`` with C of 1 to 3, H and W of :data:`MIN_SIDE` or more, or symbolic),
    with ``(Sigmoid)`` when a Sigmoid makes it; None for any other output."""
    shape = model.value_shapes().get(output)
    if samples or shape is None or len(shape) != 4:
        return None

    def side(d: object) -> bool:
        return not isinstance(d, int) or d >= MIN_SIDE

    chw = isinstance(shape[1], int) and 1 <= shape[1] <= 3 and side(shape[2]) and side(shape[3])
    hwc = isinstance(shape[3], int) and 1 <= shape[3] <= 3 and side(shape[1]) and side(shape[2])
    if not (chw or hwc):
        return None
    producer = {o: n for n in model.graph.node for o in n.output}
    node = producer.get(output)
    while node is not None and node.op_type in _CARRY and node.input:
        node = producer.get(node.input[0])
    dims = "x".join(str(d) if isinstance(d, int) else "?" for d in shape)
    return f"[{dims}]" + (" (Sigmoid)" if node is not None and node.op_type == "Sigmoid" else "")


def dense_hint(model: Model, outputs: Sequence[str], samples: Mapping[str, int] | None
               ) -> str | None:
    """One note naming the undeclared ``outputs`` shaped like a map or a picture (a matte, a
    depth map, an upscaled image): scored by their cosine and SQNR over all values unless a
    kind is declared, which read neither a matte's lost edges nor a picture's visible error;
    None when there are none."""
    found = [(o, d) for o in outputs
             if (d := _dense(model, o, None if samples is None else samples.get(o, 0)))]
    if not found:
        return None
    names = ", ".join(f"'{o}' {d}" for o, d in found)
    first, many = found[0][0], len(found) > 1
    return (f"output{'s' if many else ''} {names} {'are' if many else 'is'} shaped like a "
            "map or a picture and judged by fidelity alone (cosine, SQNR over every value, "
            "which read neither a matte's lost edges nor a picture's visible error); "
            f"declare --layout {first}=map (a probability "
            f"map or matte: mask IoU at a threshold, mean absolute error) or {first}=image:"
            "range=LO-HI (pixels, depth: PSNR against FP32 over the range)")
