"""Quantization arithmetic in numpy (ONNX convention: q = clip(round(x/scale) + zp)).

Rounding is round-half-to-even, as ONNX QuantizeLinear specifies. Scales are float32,
zero-points int32 (cast to the storage type by the QDQ writer).

Fidelity of a test array (emulated) against a reference (FP32): the one place these are
computed; every report, sweep and metric calls :func:`sqnr_db` (or, for streams,
:func:`sqnr_db_from_powers`) and :func:`row_cosines`.

=============================  ================  ==================================
case                           SQNR (dB)         row cosine
=============================  ================  ==================================
test == reference              ``+inf``          ``1.0`` (also for two zero rows:
                                                 identical)
reference zero, test not       ``-inf``          ``0.0`` (no direction to agree on)
test zero, reference not       ``0.0`` (noise    ``0.0``
                               = signal)
otherwise                      ``10 log10(sum    ``<r, t> / (|r| |t|)`` in float64
                               r^2 / sum (r -
                               t)^2)``
=============================  ================  ==================================
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np

from quantscope.types import Encoding

_TINY = np.float32(1e-12)  # smallest scale we emit; a zero range still gets a valid scale


# Mean cosine to FP32 below which quantized outputs "no longer resemble FP32's" (said in
# one line by evaluate and the tasks, next to the collapse test).
RESEMBLE_MIN_COSINE = 0.9
# Above this width a grid's step is far below a calibration histogram's bin width, so the
# histogram cannot tell clipping error from rounding noise; min/max is then optimal (a range
# method such as ``mse`` keeps min/max there: quantscope.emulate.ranges).
MSE_MAX_BITS = 10


def qrange(bits: int, *, signed: bool) -> tuple[int, int]:
    """Integer range of a ``bits``-wide storage type."""
    if signed:
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


def qparams(
    lo: np.ndarray | float,
    hi: np.ndarray | float,
    bits: int,
    *,
    signed: bool,
    symmetric: bool,
    axis: int | None = None,
) -> Encoding:
    """Scale and zero-point covering ``[lo, hi]`` (extended to include 0).

    Symmetric: zero-point is 0 for signed storage, the mid-point ``2**(bits-1)`` for
    unsigned storage; the scale covers ``max(|lo|, |hi|)``. Signed symmetric uses the
    restricted range ``[-(2**(b-1)-1), 2**(b-1)-1]`` for the scale (as QNN/AIMET do).
    Asymmetric: the zero-point is rounded to an integer so that 0.0 is exact.
    """
    lo = np.minimum(np.asarray(lo, dtype=np.float64), 0.0)
    hi = np.maximum(np.asarray(hi, dtype=np.float64), 0.0)
    qmin, qmax = qrange(bits, signed=signed)
    if symmetric:
        amax = np.maximum(np.abs(lo), np.abs(hi))
        half = (qmax - qmin) // 2  # 127 for 8 bit
        scale = np.maximum(amax / half, _TINY)
        zp = np.zeros_like(scale) if signed else np.full_like(scale, (qmax + qmin + 1) // 2)
    else:
        scale = np.maximum((hi - lo) / (qmax - qmin), _TINY)
        zp = np.clip(np.round(qmin - lo / scale), qmin, qmax)
    return Encoding(
        scale=np.asarray(scale, dtype=np.float32),
        zero_point=np.asarray(zp, dtype=np.int32),
        bits=bits,
        signed=signed,
        axis=axis,
    )


def _broadcast(enc: Encoding, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    scale = enc.scale.astype(np.float32)
    zp = enc.zero_point.astype(np.float32)
    if enc.axis is not None and scale.ndim == 1:
        shape = [1] * x.ndim
        shape[enc.axis] = -1
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    return scale, zp


def quantize(x: np.ndarray, enc: Encoding) -> np.ndarray:
    """Float -> integer codes (int32 array holding values in the storage range)."""
    scale, zp = _broadcast(enc, x)
    q = np.round(x.astype(np.float32) / scale) + zp
    return np.clip(q, enc.qmin, enc.qmax).astype(np.int32)


def dequantize(q: np.ndarray, enc: Encoding) -> np.ndarray:
    scale, zp = _broadcast(enc, q)
    return ((q.astype(np.float32) - zp) * scale).astype(np.float32)


def fake_quant(x: np.ndarray, enc: Encoding) -> np.ndarray:
    """Quantize then dequantize: the value an integer NPU actually holds."""
    return dequantize(quantize(x, enc), enc)


def sqnr_db_from_powers(signal: float, noise: float) -> float:
    """``10 log10(signal / noise)`` from summed powers (the rule of :func:`sqnr_db`).

    For streams: sum ``ref**2`` and ``(ref - test)**2`` over batches, then call this.
    """
    if noise == 0.0:
        return float("inf")
    if signal == 0.0:
        return float("-inf")
    return 10.0 * float(np.log10(signal / noise))


# Above this many values an array's float64 copies are made a block of columns at a time
# (an image model's reduced rows are every output value: IS-Net at 1024 x 1024, 474 MB
# of float32 for 4 samples, took 5 GB of float64 temporaries in one SQNR). Below it the
# whole array is one block, as before; above it only the summation order differs.
BLOCK_VALUES = 1 << 23


def column_blocks(a: np.ndarray) -> list[slice]:
    """Column ranges of ``a`` (rows first, the rest flattened) of at most about
    :data:`BLOCK_VALUES` values each (one range when the whole array is that small)."""
    rows = max(a.shape[0], 1) if a.ndim else 1
    cols = a.size // rows if rows else 0
    step = max(BLOCK_VALUES // rows, 1)
    if a.size <= BLOCK_VALUES:
        return [slice(0, cols)]
    return [slice(c, min(c + step, cols)) for c in range(0, cols, step)]


def _as_rows(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.reshape(len(a), -1) if a.ndim >= 1 and len(a) else a.reshape(1, -1)


def sqnr_db(ref: np.ndarray, test: np.ndarray) -> float:
    """SQNR = ``10 log10(sum ref^2 / sum (ref - test)^2)`` over the whole array, in dB
    (float64 sums; zero cases in the module's fidelity table). Both arrays are first
    scaled by the power of two nearest their largest magnitude (exact: the figure does
    not change), so squares of very small or large values neither underflow nor overflow:
    the figure stays the same under a joint scale of ``ref`` and ``test``. Large arrays
    are summed a block of columns at a time (:data:`BLOCK_VALUES`)."""
    if np.size(ref) > BLOCK_VALUES and np.shape(ref) == np.shape(test):
        return _sqnr_db_blocks(_as_rows(ref), _as_rows(test))
    ref64 = np.asarray(ref, dtype=np.float64)
    diff = ref64 - np.asarray(test, dtype=np.float64)
    top = max(float(np.max(np.abs(ref64), initial=0.0)), float(np.max(np.abs(diff), initial=0.0)))
    if 0.0 < top < np.inf:
        e = int(np.frexp(top)[1])
        ref64, diff = np.ldexp(ref64, -e), np.ldexp(diff, -e)
    return sqnr_db_from_powers(float(np.sum(ref64**2)), float(np.sum(diff**2)))


def _sqnr_db_blocks(ref: np.ndarray, test: np.ndarray) -> float:
    """:func:`sqnr_db` of [rows, values] arrays, one block of columns at a time."""
    blocks = column_blocks(ref)

    def parts(b: slice) -> tuple[np.ndarray, np.ndarray]:
        r = ref[:, b].astype(np.float64)
        return r, r - test[:, b]

    top = 0.0
    for b in blocks:
        r, d = parts(b)
        top = max(top, float(np.max(np.abs(r), initial=0.0)), float(np.max(np.abs(d), initial=0.0)))
    e = int(np.frexp(top)[1]) if 0.0 < top < np.inf else 0
    signal = noise = 0.0
    for b in blocks:
        r, d = parts(b)
        if e:
            r, d = np.ldexp(r, -e), np.ldexp(d, -e)
        signal += float(np.sum(r**2))
        noise += float(np.sum(d**2))
    return sqnr_db_from_powers(signal, noise)


def row_cosines(ref: np.ndarray, test: np.ndarray) -> np.ndarray:
    """Cosine between row ``i`` of ``ref`` and row ``i`` of ``test`` (float64).

    Rows are the first axis, every other axis is flattened. Zero cases in the module's
    fidelity table; identical rows give exactly 1.0. Large arrays are summed a block of
    columns at a time (:data:`BLOCK_VALUES`).
    """
    if np.shape(ref) != np.shape(test):
        raise ValueError(f"row cosine: shapes differ, {np.shape(ref)} vs {np.shape(test)}")
    if np.size(ref) > BLOCK_VALUES:
        r32, t32 = _as_rows(ref), _as_rows(test)
        num = np.zeros(len(r32))
        rr, tt = np.zeros(len(r32)), np.zeros(len(r32))
        same = np.ones(len(r32), bool)
        for b in column_blocks(r32):
            r, t = r32[:, b].astype(np.float64), t32[:, b].astype(np.float64)
            num += (r * t).sum(axis=1)
            rr += (r * r).sum(axis=1)
            tt += (t * t).sum(axis=1)
            same &= np.all(r == t, axis=1)
        den = np.sqrt(rr) * np.sqrt(tt)
        return np.where(same, 1.0, np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0))
    r = np.asarray(ref, dtype=np.float64)
    t = np.asarray(test, dtype=np.float64)
    r, t = r.reshape(len(r), -1), t.reshape(len(t), -1)
    num = (r * t).sum(axis=1)
    den = np.linalg.norm(r, axis=1) * np.linalg.norm(t, axis=1)
    same = np.all(r == t, axis=1)
    return np.where(same, 1.0, np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0))


def squared_error_rows(ref: np.ndarray, test: np.ndarray) -> np.ndarray:
    """Per row: the summed squared difference of ``test`` and ``ref`` (float64), a block
    of columns at a time for large arrays."""
    r32, t32 = _as_rows(ref), _as_rows(test)
    out = np.zeros(len(r32))
    for b in column_blocks(r32):
        d = t32[:, b].astype(np.float64) - r32[:, b]
        out += (d**2).sum(axis=1)
    return out


def weight_encoding(
    w: np.ndarray, bits: int, *, axis: int | None, signed: bool, symmetric: bool
) -> Encoding:
    """Min/max encoding of a weight tensor, per channel along ``axis`` or per tensor."""
    if axis is None:
        return qparams(float(w.min()), float(w.max()), bits, signed=signed, symmetric=symmetric)
    moved = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)
    return qparams(
        moved.min(axis=1), moved.max(axis=1), bits, signed=signed, symmetric=symmetric, axis=axis
    )



def reencode(w: np.ndarray, enc: Encoding, *, symmetric: bool) -> Encoding:
    """The encoding the emulation derives again from ``w`` on ``enc``'s grid (its bits,
    signedness and axis): what a weight written back by a rounding repair is read with."""
    axis = None if enc.axis is None else enc.axis % w.ndim
    return weight_encoding(w, enc.bits, axis=axis, signed=enc.signed, symmetric=symmetric)

# a channel (or Concat input) whose span is within float32's own resolution of the largest
# one's carries nothing a grid can lose: dead (e.g. a LayerNorm channel of weight ~0, a
# Softmax class at 1e-24 next to one at 1)
DEAD = float(np.finfo(np.float32).eps)


def default_channel_axis(shape: tuple[int, ...]) -> int | None:
    """The channel axis of an output of ``shape`` (batch first) when the graph does not
    say: 1 for rank >= 3 (``N, C, ...``), the last axis for rank 2, none for rank 1."""
    return 1 if len(shape) >= 2 else None  # rank 2: axis 1 is the last


def channel_rows(x: np.ndarray, axis: int) -> np.ndarray:
    """``x`` as float64 rows, one per index of ``axis`` (every other axis flattened)."""
    x = np.asarray(x, dtype=np.float64)
    return np.moveaxis(x, axis, 0).reshape(x.shape[axis], -1)


def channel_sqnr_db(ref: np.ndarray, test: np.ndarray, axis: int) -> np.ndarray:
    """SQNR (dB) of each index of ``axis`` (a channel: every value with that index), by
    :func:`sqnr_db_from_powers`'s rule."""
    r, t = channel_rows(ref, axis), channel_rows(test, axis)
    signal, noise = np.sum(r**2, axis=1), np.sum((r - t) ** 2, axis=1)
    return np.array([sqnr_db_from_powers(float(s), float(n)) for s, n in zip(signal, noise, strict=True)])


def worst_channel_sqnr_db(signal: np.ndarray, noise: np.ndarray) -> tuple[float, int, int]:
    """(the lowest channel SQNR, its index, how many channels were left out) from each
    channel's summed FP32 power and noise power. A channel FP32 holds at exactly 0 on every
    value (a ReLU unit the data never activates) has no signal to measure noise against:
    its SQNR is -inf whenever the quantized model moves it at all, however little, and a
    minimum taken over it is -inf at every precision (a 16-bit plan reads like an 8-bit
    one, and no promotion gains). Such channels are left out of the minimum and counted
    (the figure's ``channels_left_out``, said beside it); when every channel is such, the
    minimum is taken over all of them and none is counted left out. The one place that
    decides which channels the worst-channel figures read (:func:`signal_channels`)."""
    sqnr = np.array([sqnr_db_from_powers(float(s), float(n))
                     for s, n in zip(signal, noise, strict=True)])
    some = signal_channels(signal)
    pick = np.flatnonzero(some)
    worst = int(pick[np.argmin(sqnr[pick])])
    return float(sqnr[worst]), worst, int(np.count_nonzero(~some))


def signal_channels(signal: np.ndarray) -> np.ndarray:
    """Which channels a worst-channel figure reads: those with FP32 power above 0, or every
    one when none has any (:func:`worst_channel_sqnr_db`)."""
    some = np.asarray(signal) > 0.0
    return some if some.any() else np.ones_like(some)


LEFT_OUT = "left out of sqnr_db_channel_min and cosine_channel_min"
"""What :func:`left_out_note` says (run's verdict finds its lines by it)."""


def left_out_note(name: str, left_out: int, n: int, axis: int) -> str:
    """The line said when ``left_out`` of an output's ``n`` channels have no FP32 signal."""
    return (f"output '{name}': {left_out} of {n} channels of axis {axis} are 0 in FP32 on "
            f"every value of this data: {LEFT_OUT} (no signal to measure noise against; "
            "counted in channels_left_out)")


SAME_RTOL = 1e-5  # samples within this share of each value (and DEAD of the largest): alike


class SameSamples:
    """Whether every sample (axis 0) of a stream of batches equals the first sample: an
    output that does not depend on the input on this data. :attr:`constant` only once two
    samples or more were seen. Float values count as equal within float32 rounding
    (:data:`SAME_RTOL` of each value, plus :data:`DEAD` of the first sample's largest):
    an InstanceNorm's spatial mean is its bias on every sample, up to the order of the sums,
    and an output like that measured '96.6 dB' while it depends on no input."""

    def __init__(self) -> None:
        self.first: np.ndarray | None = None
        self.samples = 0
        self.same = True

    def add(self, a: np.ndarray) -> None:
        a = np.asarray(a)
        if not self.same or a.ndim == 0 or len(a) == 0:
            return
        if self.first is None:
            self.first = a[0].copy()
        self.samples += len(a)
        if a.shape[1:] != self.first.shape:
            self.same = False
        elif not np.issubdtype(a.dtype, np.floating):
            self.same = bool(np.array_equal(a, np.broadcast_to(self.first, a.shape)))
        else:  # equal up to float32 rounding: the same function of other inputs' order of sums
            first = np.array(np.abs(self.first), dtype=np.float64)  # an array, even 0-d
            first[~np.isfinite(first)] = 0.0  # an inf is the same only where it is equal
            tol = SAME_RTOL * first + DEAD * float(first.max(initial=0.0))
            with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: not close
                close = np.abs(a - self.first) <= tol
            self.same = bool(np.all(close | (a == self.first)))

    @property
    def constant(self) -> bool:
        return self.same and self.samples >= 2


def t_quantile(p: float, dof: int) -> float:
    """Student's t quantile at probability ``p`` with ``dof`` degrees of freedom
    (Cornish-Fisher expansion around the normal quantile: within 0.002 of the exact
    quantile from 15 degrees of freedom; the races, the paired intervals and the
    jackknife bounds of a dB gain read it)."""
    z = NormalDist().inv_cdf(p)
    v = float(max(dof, 1))
    return (z + (z**3 + z) / (4 * v) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3))
