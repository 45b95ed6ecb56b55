"""Image outputs (an image-to-image model: super-resolution, denoising, an alpha map
read as an image), scored as a picture is: PSNR and SSIM against FP32 in the image's own
range (a relative depth map: :mod:`quantscope.tasks.depth`).

A 3-channel picture's per-channel cosine or SQNR names a channel, not what the eye sees;
the figure an image engineer compares is the peak signal-to-noise ratio over the pixel
range (255 for 8-bit pixels). Declared ``--layout OUT=image[:range=LO-HI]``:

========================  ==============================================================
``psnr_db``               (headline) ``10 log10(peak² / MSE)`` against FP32, the MSE over
                          every value of every sample, the peak the range's span
``psnr_min_db``           the worst sample's PSNR
``image_abs_error_mean``  mean / largest absolute difference from FP32, in the output's
``image_abs_error_max``   units (pixel levels for a 0-255 image)
``image_outside_share``   share of FP32's values outside the range (said)
``ssim``, ``ssim_min``    the structural similarity (Wang et al. 2004: an 11 x 11 Gaussian
                          window of sigma 1.5, K1 0.01, K2 0.03, L the peak) of each
                          channel's plane, over the window positions inside the image,
                          averaged over the channels; the mean over samples and the worst
========================  ==============================================================

With a declared range both images are compared clipped to it, as the host shows them (an
8-bit picture saturates at 0 and 255; UpscalerJS clips its ESRGAN output so): an output
FP32 overshoots by a few levels at edges is not charged for values no display shows, and
a note says how much of FP32's output the range clips. FP32 spanning more than twice the
range, or under a twentieth of it (a 0-1 image declared 0-255, whose PSNR reads 48 dB too
high), is asked whether the range is the image's. The planes SSIM reads are those of
``[N, C, H, W]`` (channels first, C of 1 to 4), ``[N, H, W, C]`` (channels last: a
TensorFlow export's NHWC output, C of 1 to 4 and axis 1 more) or ``[N, H, W]``; an output
of another rank, or planes under 11 values on a side, has no SSIM (NaN, said).

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
from typing import NamedTuple

import numpy as np

from quantscope.model.load import Model
from quantscope.tasks.db_noise import Parts
from quantscope.types import Metrics, Outputs, QuantscopeError

PSNR_RESEMBLES = 30.0  # dB: below it, a picture's error is visible (a rule of thumb)
SSIM_WINDOW, SSIM_SIGMA, SSIM_K1, SSIM_K2 = 11, 1.5, 0.01, 0.03  # Wang et al. 2004
WIDE_RANGE = 2.0  # FP32's span over this many times the declared range's: not the image's?
NARROW_RANGE = 0.05  # FP32's span under this share of the declared range's: not the image's?


def parse_range(text: str) -> tuple[float, float]:
    """``LO-HI`` (``0-255``, ``0-1``, ``-1-1``) -> ``(LO, HI)`` with LO < HI, or ValueError."""
    for k in range(1, len(text)):
        if text[k] == "-" and text[k - 1] not in "eE":
            lo, hi = float(text[:k]), float(text[k + 1:])
            if math.isfinite(lo) and math.isfinite(hi) and lo < hi:
                return lo, hi
            break
    raise ValueError(text)


def planes(a: np.ndarray) -> np.ndarray | None:
    """The ``[N, C, H, W]`` planes of an image batch (module docstring: channels first or
    last, or one plane ``[N, H, W]``); None for another rank."""
    if a.ndim == 3:
        return a[:, None]
    if a.ndim != 4:
        return None
    last = a.shape[3] <= 4 < a.shape[1]
    return np.moveaxis(a, 3, 1) if last else a


def _window() -> np.ndarray:
    x = np.arange(SSIM_WINDOW) - (SSIM_WINDOW - 1) / 2.0
    g = np.exp(-x * x / (2.0 * SSIM_SIGMA ** 2))
    return g / g.sum()


def _blur(a: np.ndarray, g: np.ndarray) -> np.ndarray:
    """``a [..., H, W]`` filtered by the separable window ``g`` at the positions where it
    lies inside the plane (``[..., H - k + 1, W - k + 1]``)."""
    from numpy.lib.stride_tricks import sliding_window_view

    a = sliding_window_view(a, len(g), axis=-2) @ g
    return sliding_window_view(a, len(g), axis=-1) @ g


def ssim(ref: np.ndarray, test: np.ndarray, peak: float) -> np.ndarray | None:
    """Each sample's SSIM of ``test`` against ``ref`` (module docstring), the mean over
    its channels' planes; None where the batch has no planes of :data:`SSIM_WINDOW` values
    a side."""
    r, t = planes(ref), planes(test)
    if r is None or t is None or min(r.shape[2:]) < SSIM_WINDOW:
        return None
    g = _window()
    c1, c2 = (SSIM_K1 * peak) ** 2, (SSIM_K2 * peak) ** 2
    mr, mt = _blur(r, g), _blur(t, g)
    vr, vt = _blur(r * r, g) - mr * mr, _blur(t * t, g) - mt * mt
    cov = _blur(r * t, g) - mr * mt
    score = ((2 * mr * mt + c1) * (2 * cov + c2)) / ((mr * mr + mt * mt + c1) * (vr + vt + c2))
    return score.reshape(len(score), -1).mean(axis=1)


def paired_batches(ref: Outputs, test: Outputs, output: str, what: str
                   ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Output ``output`` of each batch, FP32's and the quantized one's in float64; one line
    when their shapes differ (not one ``what``: an image, a depth map)."""
    i = ref.names.index(output)
    pairs = []
    for rb, tb in zip(ref.batches, test.batches, strict=True):
        r, t = np.asarray(rb[i], dtype=np.float64), np.asarray(tb[i], dtype=np.float64)
        if r.shape != t.shape:
            raise QuantscopeError(f"--layout: output '{output}' has shape {t.shape} "
                                  f"quantized and {r.shape} in FP32: not one {what}")
        pairs.append((r, t))
    return pairs


class _Scored(NamedTuple):
    """What :class:`ImageTask` compares: FP32's and the quantized batches (clipped to a
    declared range), FP32's own min and max, the range, the values and those outside it."""

    pairs: list[tuple[np.ndarray, np.ndarray]]
    lo: float
    hi: float
    a: float
    b: float
    total: int
    outside: int

    @property
    def peak(self) -> float:
        return self.b - self.a


def _sample_sse(ref: np.ndarray, test: np.ndarray) -> np.ndarray:
    """Each sample's summed squared error (float64)."""
    d = (test - ref).reshape(len(ref), -1)
    return np.sum(d * d, axis=1)


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
        rng = (f"its range {self.range[0]:g}..{self.range[1]:g} (both clipped to it)"
               if self.range else "FP32's own range on the data")
        return f"an image, judged by PSNR and SSIM against FP32 over {rng}"

    def _pairs(self, ref: Outputs, test: Outputs) -> list[tuple[np.ndarray, np.ndarray]]:
        return paired_batches(ref, test, self.output, "image")

    def _scored(self, ref: Outputs, test: Outputs) -> _Scored | None:
        """The batches as PSNR compares them (clipped to a declared range) with the peak
        and what the notes read; None: no sample."""
        pairs = [(r, t) for r, t in self._pairs(ref, test) if r.size]
        if not pairs:
            return None
        lo = min(float(r.min()) for r, _ in pairs)
        hi = max(float(r.max()) for r, _ in pairs)
        a, b = self.range if self.range is not None else (lo, hi)
        total = sum(r.size for r, _ in pairs)
        outside = sum(int(np.sum((r < a) | (r > b))) for r, _ in pairs)
        if self.range is not None:  # the images as the host shows them
            pairs = [(np.clip(r, a, b), np.clip(t, a, b)) for r, t in pairs]
        return _Scored(pairs, lo, hi, a, b, total, outside)

    def sample_parts(self, ref: Outputs, test: Outputs) -> dict[str, Parts]:
        """Per sample, the powers ``psnr_db`` pools: ``peak² x values`` and the summed
        squared error (:mod:`quantscope.tasks.db_noise`; the peak the whole data's): the
        noise the planner's choice and ``run``'s held-out check read; none where there is
        no PSNR."""
        got = self._scored(ref, test)
        if got is None or got.peak <= 0.0:
            return {}
        sse = np.concatenate([_sample_sse(r, t) for r, t in got.pairs])
        values = np.concatenate([np.full(len(r), r[0].size, np.float64) for r, _ in got.pairs])
        return {"psnr_db": Parts(got.peak * got.peak * values, sse, "samples")}

    def metrics(self, ref: Outputs, test: Outputs) -> Metrics:
        got = self._scored(ref, test)
        if got is None:
            return Metrics(values={"psnr_db": float("nan")}, notes=())
        pairs, lo, hi, a, b, total, outside = got
        peak = got.peak
        notes: list[str] = []
        if self.range is None:
            notes.append(f"output '{self.output}': PSNR over FP32's own range {lo:.4g}..{hi:.4g} "
                         f"on this data (give the image's: --layout {self.output}=image:range="
                         "0-255 for 8-bit pixels, 0-1 for a matte)")
        if peak <= 0.0:  # FP32 constant and no range declared: no peak to measure against
            return Metrics(values={"psnr_db": float("nan")}, notes=(
                *notes, f"output '{self.output}': FP32 is one value everywhere: no PSNR; "
                "declare the range"))
        sse: list[float] = []
        sizes: list[int] = []
        per_ssim: list[float] = []
        err_sum = err_max = 0.0
        for r, t in pairs:
            d = np.abs(t - r)
            sse.extend(_sample_sse(r, t).tolist())
            sizes.extend([d[0].size] * len(d))
            err_sum += float(d.sum())
            err_max = max(err_max, float(d.max()))
            s = ssim(r, t, peak)
            per_ssim.extend([] if s is None else s.tolist())
        per = [_psnr(peak, e / n) for e, n in zip(sse, sizes, strict=True)]
        values = {"psnr_db": _psnr(peak, sum(sse) / total),
                  "psnr_min_db": min(per),
                  "image_abs_error_mean": err_sum / total,
                  "image_abs_error_max": err_max,
                  "ssim": float(np.mean(per_ssim)) if per_ssim else float("nan"),
                  "ssim_min": min(per_ssim) if per_ssim else float("nan")}
        if not per_ssim:
            notes.append(f"output '{self.output}' {pairs[0][0].shape[1:]}: no SSIM (it reads "
                         f"planes [N, C, H, W], [N, H, W, C] or [N, H, W] of {SSIM_WINDOW} "
                         "values a side or more)")
        if self.range is not None:
            values["image_outside_share"] = outside / total
            if outside:
                wide = (hi - lo) / peak
                notes.append(
                    f"output '{self.output}': {outside / total:.1%} of FP32's values lie outside "
                    f"the declared range {a:g}..{b:g} (FP32 {lo:.4g}..{hi:.4g}): both images are "
                    "compared clipped to it, as the host shows them" + (
                        f"; FP32 spans {wide:.3g}x the range: is it the image's? declare its "
                        "range" if wide > WIDE_RANGE else ""))
        if self.range is not None and 0.0 < hi - lo < NARROW_RANGE * peak:
            notes.append(
                f"output '{self.output}': FP32's values span {lo:.4g}..{hi:.4g}, "
                f"{(hi - lo) / peak:.2%} of the declared range {a:g}..{b:g}: is it the "
                f"image's? (a 0-1 image declared 0-255 reads its PSNR "
                f"{20 * math.log10(255):.0f} dB too high; over FP32's own span it would read "
                f"{_psnr(hi - lo, sum(sse) / total):.1f} dB)")
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
    or is a Sigmoid map of three axes (``[N, T, F]``, both of :data:`MIN_SIDE` or more: a
    posteriorgram, basic-pitch's ``[N, 172, 88]``), with ``(Sigmoid)`` when a Sigmoid makes
    it; None for any other output."""
    shape = model.value_shapes().get(output)
    if samples or shape is None or len(shape) not in (3, 4):
        return None

    def side(d: object) -> bool:
        return not isinstance(d, int) or d >= MIN_SIDE

    producer = {o: n for n in model.graph.node for o in n.output}
    node = producer.get(output)
    while node is not None and node.op_type in _CARRY and node.input:
        node = producer.get(node.input[0])
    sigmoid = node is not None and node.op_type == "Sigmoid"
    if len(shape) == 3:
        dense = sigmoid and side(shape[1]) and side(shape[2])
    else:
        dense = (isinstance(shape[1], int) and 1 <= shape[1] <= 3 and side(shape[2])
                 and side(shape[3])) or (isinstance(shape[3], int) and 1 <= shape[3] <= 3
                                         and side(shape[1]) and side(shape[2]))
    if not dense:
        return None
    dims = "x".join(str(d) if isinstance(d, int) else "?" for d in shape)
    return f"[{dims}]" + (" (Sigmoid)" if sigmoid else "")


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
            f"map or matte: mask IoU at a threshold, mean absolute error), {first}=image:"
            f"range=LO-HI (pixels: PSNR and SSIM against FP32 over the range) or {first}="
            "depth (a relative depth map: AbsRel after scale and shift alignment)")
