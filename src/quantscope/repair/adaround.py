"""AdaRound-style rounding of weights (Nagel et al. 2020), per layer, on calibration data.

Nearest rounding minimises each weight's own error, not the layer's output error. With
``H = E[x x^T]`` over the calibration inputs of a linear layer, the output error of a
rounding choice is ``tr(E^T H E)`` for ``E = s (floor(W/s) + h) - W``; AdaRound relaxes
``h`` in ``[0, 1]`` (rectified sigmoid of ``V``) and adds a regulariser
``sum 1 - |2h - 1|^beta`` (beta annealed 20 -> 2) that pushes every ``h`` to 0 or 1.

=================  ================================================================
layers             MatMul / Gemm whose weight the plan quantizes (2-D weight), and 2-D
                   Conv (weight ``[O, C/g, kh, kw]``, any ``group`` incl. depthwise,
                   strides, pads, dilations, every ``auto_pad``); a Conv is the linear
                   map ``p @ W_g`` per group ``g`` on its input patches ``p`` (im2col,
                   :func:`im2col`) with ``W_g`` the group's weight as
                   ``[C/g*kh*kw, O/g]``. Skipped, with the reason: other ranks (1-D/3-D
                   Conv, batched MatMul weights), ``transA``, ConvTranspose, a weight
                   read by more than one node, negative pads
inputs ``x``       FP32 inputs of the layer on ``feeds`` (run ``max_rows`` samples at a
                   time), folded into ``H`` as they stream: MatMul/Gemm every row; Conv
                   one ``H`` per group over patch rows (products in float32, summed in
                   float64). Conv patch positions are subsampled when there are many:
                   at most ``ceil(max_patches / samples)`` output positions per sample
                   (so about ``max_patches`` rows per layer), drawn without replacement
                   by a generator seeded with ``(seed, layer index)``: deterministic for
                   the same feeds. A layer with fewer rows than inputs has a singular
                   ``H``; it is damped by ``DAMP`` (1 %) of its mean diagonal, as GPTQ
                   does, so the rounding cannot exploit directions the calibration data
                   never excited (the gain is still measured in-sample)
grid               the plan's own weight encoding (per output channel or per tensor);
                   elements that set a channel's range keep nearest rounding, so the
                   rounded weight has the same encoding
result             the weight as ``s * q`` in the layer's own layout: a float
                   initializer exactly on the grid, so the writer's ``quantize()``
                   reproduces ``q`` (checked, ``on_grid``); per layer (per Conv group)
                   the result is kept only if its output error on ``H`` is below nearest
                   rounding's, else nearest rounding is written
cost               ``iterations`` Adam steps of an ``[in, in] @ [in, out]`` product per
                   layer (Conv: ``in = C/g*kh*kw``, ``out = O/g``, once per group, a
                   Python loop: depthwise layers pay it ``C`` times), plus one FP32 pass
                   over ``feeds`` and the ``H`` products (Conv: about ``max_patches``
                   rows of ``in`` per layer); ``Repair.seconds`` says. dlib-face (29
                   Conv + 1 Gemm, 144 chips, 100 steps, 2 cores): 72 s
=================  ================================================================
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from quantscope.calibrate.collect import calibrate, tapped_model
from quantscope.emulate.encode import encode
from quantscope.emulate.qdq import scheme_for
from quantscope.emulate.session import make_session, runner
from quantscope.model.groups import find_groups
from quantscope.model.layouts import layout_of
from quantscope.model.load import Model
from quantscope.numerics import quantize, reencode
from quantscope.repair import (
    Change,
    Repair,
    RepairInput,
    RepairStep,
    as_model,
    attr,
    step_of,
    use_counts,
    with_initializers,
)
from quantscope.repair.verify import Batch
from quantscope.types import Encoding, Plan, QuantScheme, Stats, batch_rows, take_rows

DAMP = 0.01  # relative damping of a singular H (fewer rows than inputs)

ZETA, GAMMA = 1.1, -0.1
AUTO_PADS = ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")


@dataclass(frozen=True)
class ConvGeometry:
    """Attributes of a 2-D Conv that decide its patches (ONNX semantics)."""

    kernel: tuple[int, int]
    strides: tuple[int, int] = (1, 1)
    dilations: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, left, bottom, right
    auto_pad: str = "NOTSET"
    group: int = 1

    @staticmethod
    def of(node: onnx.NodeProto, weight_shape: tuple[int, ...]) -> ConvGeometry:
        ap = attr(node, "auto_pad", b"NOTSET")
        return ConvGeometry(
            kernel=tuple(attr(node, "kernel_shape", weight_shape[2:])),  # type: ignore[arg-type]
            strides=tuple(attr(node, "strides", (1, 1))),  # type: ignore[arg-type]
            dilations=tuple(attr(node, "dilations", (1, 1))),  # type: ignore[arg-type]
            pads=tuple(attr(node, "pads", (0, 0, 0, 0))),  # type: ignore[arg-type]
            auto_pad=ap.decode() if isinstance(ap, bytes) else str(ap),
            group=int(attr(node, "group", 1)),  # type: ignore[call-overload]
        )

    def padding(self, hw: tuple[int, int]) -> tuple[tuple[int, int, int, int], tuple[int, int]]:
        """(top, left, bottom, right) pads and the output (height, width) for input ``hw``."""
        begin, end, out = [], [], []
        for i in range(2):
            size, k, s, d = hw[i], self.kernel[i], self.strides[i], self.dilations[i]
            span = (k - 1) * d + 1
            if self.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
                o = -(-size // s)
                total = max((o - 1) * s + span - size, 0)
                small = total // 2
                b, e = (small, total - small) if self.auto_pad == "SAME_UPPER" else (total - small, small)
            elif self.auto_pad == "VALID":
                b = e = 0
            else:
                b, e = self.pads[i], self.pads[i + 2]
            begin.append(b)
            end.append(e)
            out.append((size + b + e - span) // s + 1)
        return (begin[0], begin[1], end[0], end[1]), (out[0], out[1])


def im2col(x: np.ndarray, geom: ConvGeometry, positions: np.ndarray | None = None) -> np.ndarray:
    """Input patches of a 2-D Conv: ``[P, C*kh*kw]`` for ``x`` ``[N, C, H, W]``.

    Rows are output positions in ``(n, oy, ox)`` order (all of them, or the flat indices
    ``positions`` into ``N*OH*OW``); columns are ``(c, ky, kx)``, the order of a weight
    ``[O, C/g, kh, kw]`` reshaped to ``[O, C/g*kh*kw]``, so for group ``g`` the columns
    ``g*C/g*kh*kw ...`` times that reshaped weight's rows of the group give the Conv's
    output (without bias) at those positions.
    """
    n_, c_, h_, w_ = x.shape
    (pt, pl, pb, pr), (oh, ow) = geom.padding((h_, w_))
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    pos = np.arange(n_ * oh * ow) if positions is None else np.asarray(positions)
    n, rem = np.divmod(pos, oh * ow)
    oy, ox = np.divmod(rem, ow)
    kh, kw = geom.kernel
    ky = np.repeat(np.arange(kh), kw) * geom.dilations[0]
    kx = np.tile(np.arange(kw), kh) * geom.dilations[1]
    iy = oy[:, None] * geom.strides[0] + ky[None, :]  # [P, K]
    ix = ox[:, None] * geom.strides[1] + kx[None, :]
    patches = xp[n[:, None, None], np.arange(c_)[None, :, None], iy[:, None, :], ix[:, None, :]]
    return patches.reshape(len(pos), c_ * kh * kw)


def _h(v: np.ndarray) -> np.ndarray:
    return np.clip(1.0 / (1.0 + np.exp(-v)) * (ZETA - GAMMA) + GAMMA, 0.0, 1.0)


def _rec(hmat: np.ndarray, e: np.ndarray) -> float:
    return float(np.sum(e * (hmat @ e)))


def optimise_rounding(
    w: np.ndarray,
    s: np.ndarray,
    qmin: int,
    qmax: int,
    hmat: np.ndarray,
    *,
    iterations: int = 200,
    lam: float = 0.05,
    lr: float = 0.05,
) -> np.ndarray:
    """Integer codes ``q`` of ``w`` ([in, out], scale ``s`` per column) minimising ``tr(E^T H E)``."""
    x = w / s
    base = np.floor(x)
    rest = np.clip(x - base, 0.01, 0.99)
    v = -np.log((ZETA - GAMMA) / (rest - GAMMA) - 1.0)
    pinned = np.abs(x) > qmax - 1  # range-defining elements keep nearest rounding
    nearest = np.clip(np.round(x), qmin, qmax)
    rec0 = max(_rec(hmat, s * nearest - w), 1e-30)
    m1, m2 = np.zeros_like(v), np.zeros_like(v)
    for it in range(iterations):
        frac = it / max(iterations - 1, 1)
        sig = 1.0 / (1.0 + np.exp(-v))
        h = _h(v)
        e = s * (base + h) - w
        g_h = 2.0 * (hmat @ e) * s / rec0
        if frac > 0.2:  # warm-up without the regulariser, then anneal beta 20 -> 2
            beta = 20.0 + (2.0 - 20.0) * (frac - 0.2) / 0.8
            d = 2.0 * h - 1.0
            g_h = g_h - lam * beta * np.abs(d) ** (beta - 1.0) * np.sign(d) * 2.0 / h.size
        inner = (h > 0) & (h < 1)
        g = np.where(inner & ~pinned, g_h * sig * (1 - sig) * (ZETA - GAMMA), 0.0)
        m1 = 0.9 * m1 + 0.1 * g
        m2 = 0.999 * m2 + 0.001 * g * g
        v -= lr * (m1 / (1 - 0.9 ** (it + 1))) / (np.sqrt(m2 / (1 - 0.999 ** (it + 1))) + 1e-8)
    q = np.clip(base + (v >= 0), qmin, qmax)
    q = np.where(pinned, nearest, q)
    return q if _rec(hmat, s * q - w) < rec0 else nearest


def _conv_skip(node: onnx.NodeProto, w: np.ndarray) -> str | None:
    """Why a Conv cannot be handled here, or None."""
    if w.ndim != 4:
        return f"Conv with a {w.ndim - 2}-D kernel (AdaRound here handles 2-D Conv only)"
    geom = ConvGeometry.of(node, w.shape)
    if geom.auto_pad not in AUTO_PADS:
        return f"Conv auto_pad '{geom.auto_pad}' is not understood"
    if min(geom.pads) < 0:
        return "Conv with negative pads"
    if geom.group < 1 or w.shape[0] % geom.group:
        return f"Conv group {geom.group} does not divide its {w.shape[0]} output channels"
    return None


def _layers(
    m: Model, plan: Plan, stats: Stats, scheme: QuantScheme | None
) -> tuple[list[tuple[onnx.NodeProto, Encoding]], list[tuple[str, str]]]:
    groups = find_groups(m)
    enc = encode(m, groups, stats, plan, scheme=scheme_for(plan, scheme))
    nodes = {n.name: n for n in m.graph.node}
    uses = use_counts(m.graph)
    todo, skipped = [], []
    for g in groups.groups:
        node = nodes[g.nodes[0]]
        if g.weight not in enc.weights:
            continue
        w = m.initializer_array(g.weight)
        if uses.get(g.weight, 0) > 1:
            why: str | None = "weight read by more than one node (one H cannot stand for all)"
        elif node.op_type == "Conv":
            why = _conv_skip(node, w)
        elif node.op_type not in ("MatMul", "Gemm") or w.ndim != 2 or attr(node, "transA", 0):
            why = f"{node.op_type} is not a 2-D MatMul/Gemm or 2-D Conv (AdaRound here needs x @ W)"
        else:
            why = None
        if why:
            skipped.append((node.name, why))
            continue
        todo.append((node, enc.weights[g.weight]))
    return todo, skipped


class _Gram:
    """Running ``E[x x^T]`` of one layer's input (one per Conv group)."""

    def __init__(self, node: onnx.NodeProto, m: Model, rng: np.random.Generator, cap: int) -> None:
        self.conv = node.op_type == "Conv"
        self.geom = ConvGeometry.of(node, m.initializer_array(node.input[1]).shape) if self.conv else None
        self.rng, self.cap = rng, cap
        self.sum: np.ndarray | None = None
        self.rows = 0
        self.positions = 0  # Conv: output positions seen (before subsampling)

    def add(self, x: np.ndarray) -> None:
        if self.geom is None:
            x = x.reshape(-1, x.shape[-1]).astype(np.float64)
            prod = (x.T @ x)[None]
        else:
            n = x.shape[0]
            _, (oh, ow) = self.geom.padding((x.shape[2], x.shape[3]))
            per = oh * ow
            self.positions += n * per
            pos = None
            if per > self.cap:
                pick = np.stack([self.rng.choice(per, self.cap, replace=False) for _ in range(n)])
                pos = (np.arange(n)[:, None] * per + np.sort(pick, axis=1)).ravel()
            p = im2col(x.astype(np.float32), self.geom, pos)
            g = self.geom.group
            blk = p.reshape(len(p), g, -1).transpose(1, 0, 2)  # [g, P, C/g*kh*kw]
            prod = np.matmul(blk.transpose(0, 2, 1), blk).astype(np.float64)
            x = p
        self.sum = prod if self.sum is None else self.sum + prod
        self.rows += x.shape[0]

    def mean(self) -> np.ndarray:
        assert self.sum is not None, "no calibration rows reached this layer"
        h = self.sum / self.rows
        if self.rows < h.shape[-1]:  # singular: damp it (module docstring)
            idx = np.arange(h.shape[-1])
            diag = h[..., idx, idx]
            h = h.copy()
            h[..., idx, idx] += DAMP * diag.mean(axis=-1, keepdims=True)
        return h


def _grams(
    m: Model,
    todo: list[tuple[onnx.NodeProto, Encoding]],
    feeds: Sequence[Batch],
    *,
    max_patches: int,
    seed: int,
    max_rows: int,
) -> list[_Gram]:
    """One streaming FP32 pass: every layer's ``H`` (Conv: per group, over patches)."""
    taps = list(dict.fromkeys(n.input[0] for n, _ in todo))
    samples = sum(batch_rows(f) for f in feeds)
    cap = max(1, math.ceil(max_patches / max(samples, 1)))
    grams = [_Gram(n, m, np.random.default_rng([seed, k]), cap) for k, (n, _) in enumerate(todo)]
    run = runner(make_session(tapped_model(m, taps), arena=False), taps)
    for feed in feeds:
        rows = batch_rows(feed)
        for i in range(0, rows, max_rows):
            got = dict(zip(taps, run(take_rows(feed, slice(i, i + max_rows))), strict=True))
            for (node, _), gram in zip(todo, grams, strict=True):
                gram.add(got[node.input[0]])
    return grams


def _matmul_layer(
    w: np.ndarray, node: onnx.NodeProto, enc: Encoding, hmat: np.ndarray, iterations: int
) -> tuple[np.ndarray, np.ndarray, float, float]:
    """(new weight, codes, error after, nearest's error) for a MatMul/Gemm weight."""
    lay = layout_of(node)
    trans = lay is not None and lay.op_type == "Gemm" and lay.out_axis == 0  # transB: [out, in]
    w_io = w.T if trans else w
    s = np.broadcast_to(enc.scale.astype(np.float64), (w_io.shape[1],)).reshape(1, -1)
    q = optimise_rounding(w_io, s, enc.qmin, enc.qmax, hmat[0], iterations=iterations)
    new = (q * s).astype(np.float32)
    near = s * np.clip(np.round(w_io / s), enc.qmin, enc.qmax)
    after, before = _rec(hmat[0], new - w_io), _rec(hmat[0], near - w_io)
    return (new.T, q.T, after, before) if trans else (new, q, after, before)


def _conv_layer(
    w: np.ndarray, group: int, enc: Encoding, hmat: np.ndarray, iterations: int
) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Same for a Conv weight ``[O, C/g, kh, kw]``, one optimisation per group."""
    o = w.shape[0]
    og = o // group
    scale = np.broadcast_to(enc.scale.astype(np.float64), (o,))
    new, codes = np.empty(w.shape, np.float32), np.empty(w.shape)
    after = before = 0.0
    for g in range(group):
        sl = slice(g * og, (g + 1) * og)
        w_io = w[sl].reshape(og, -1).T  # [C/g*kh*kw, O/g]
        s = scale[sl].reshape(1, -1)
        q = optimise_rounding(w_io, s, enc.qmin, enc.qmax, hmat[g], iterations=iterations)
        new_g = (q * s).astype(np.float32)
        near = s * np.clip(np.round(w_io / s), enc.qmin, enc.qmax)
        after += _rec(hmat[g], new_g - w_io)
        before += _rec(hmat[g], near - w_io)
        new[sl] = new_g.T.reshape(w[sl].shape)
        codes[sl] = q.T.reshape(w[sl].shape)
    return new, codes, after, before


def adaround(
    model: Model | onnx.ModelProto,
    feeds: Sequence[Batch],
    plan: Plan,
    *,
    stats: Stats | None = None,
    scheme: QuantScheme | None = None,
    iterations: int = 200,
    max_patches: int = 16384,
    seed: int = 0,
    max_rows: int = 8,
) -> Repair:
    """Optimise weight rounding per layer; weights come back as float values on their grid.

    ``max_patches`` bounds the Conv patch rows per layer (see the module docstring for the
    subsampling, seeded by ``seed``); ``max_rows`` samples of a feed run at a time.
    """
    start = time.perf_counter()
    m = as_model(model)
    stats = stats or calibrate(m, find_groups(m), feeds)
    todo, skipped = _layers(m, plan, stats, scheme)
    grams = (
        _grams(m, todo, feeds, max_patches=max_patches, seed=seed, max_rows=max_rows)
        if todo
        else []
    )
    arrays, changes, gains, on_grid = {}, [], [], True
    for (node, enc), gram in zip(todo, grams, strict=True):
        w = m.initializer_array(node.input[1]).astype(np.float64)
        hmat = gram.mean()
        if gram.geom is None:
            new, q, after, before = _matmul_layer(w, node, enc, hmat, iterations)
            where = ""
        else:
            new, q, after, before = _conv_layer(w, gram.geom.group, enc, hmat, iterations)
            where = (
                f"; H from {gram.rows} of {gram.positions} patch rows"
                + (f", {gram.geom.group} groups" if gram.geom.group > 1 else "")
            )
        gains.append(after / max(before, 1e-30))
        arrays[node.input[1]] = new
        on_grid &= _reproduces(new, q, enc)
        flips = int(np.sum(q != np.clip(np.round(w / _scale_like(enc, w)), enc.qmin, enc.qmax)))
        changes.append(
            Change(
                node.input[1],
                "regrid",
                note=f"{flips} of {q.size} weights rounded away from nearest; "
                f"output error x{gains[-1]:.3f}{where}",
            )
        )
    return Repair(
        name="adaround",
        reason=f"AdaRound ({iterations} steps) on {len(changes)} layer(s): rounding chosen for the layer output",
        proto=with_initializers(m.proto, arrays),
        changes=tuple(changes),
        skipped=tuple(skipped),
        effect=(
            ("layers", float(len(changes))),
            ("mean_output_error_ratio", float(np.mean(gains)) if gains else 1.0),
            ("on_grid", float(on_grid)),
        ),
        seconds=time.perf_counter() - start,
    )


def _scale_like(enc: Encoding, w: np.ndarray) -> np.ndarray:
    """The encoding's scale shaped to broadcast against ``w`` along its axis."""
    scale = enc.scale.astype(np.float64)
    if enc.axis is None or scale.ndim == 0:
        return scale
    shape = [1] * w.ndim
    shape[enc.axis % w.ndim] = -1
    return scale.reshape(shape)


def _reproduces(w: np.ndarray, q: np.ndarray, enc: Encoding) -> bool:
    """True when re-encoding ``w`` and quantizing it gives back ``q`` exactly."""
    again = reencode(w, enc, symmetric=True)  # symmetric assumed (asymmetric: see repairs.md)
    return bool(np.array_equal(quantize(w, again), q.astype(np.int32)))


def adaround_step(inp: RepairInput) -> RepairStep:
    """The registry's ``adaround``: :func:`adaround` for the plan's quantized weights."""
    return step_of(adaround(inp.model, inp.feeds, inp.plan, stats=inp.stats, scheme=inp.scheme))
