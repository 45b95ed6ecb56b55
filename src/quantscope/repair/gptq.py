"""GPTQ rounding of MatMul/Gemm weights (Frantar et al. 2022), per layer, on calibration data.

Nearest rounding minimises each weight's own error; GPTQ minimises the layer's output
error ``tr(E H E^T)`` over its calibration inputs greedily: the input columns of the
weight are rounded one at a time and each one's error is fed back onto the columns not
yet rounded, weighted by the inverse Hessian (``H^-1``'s upper Cholesky factor), in blocks
of ``block`` columns (lazy batch updates). No activation reordering ("act order"): the
columns go in their own order.

=================  ================================================================
layers             every MatMul / Gemm whose plan precision quantizes its weight to
                   4 or 8 bit (``a8_w4``, ``a8_w8``, ``a16_w8``), 2-D weight read by
                   this node only, as the second input, or by the token chunks of one
                   layer (``<node>/tok<i>``, :mod:`~quantscope.repair.tokens`: one
                   weight, rounded once on ``H`` over all the chunks' rows, when every
                   chunk is rounded at the same precision). Left alone, with the reason:
                   16-bit weights (their grid is finer than the error GPTQ removes),
                   float groups, ``transA``, batched or shared weights, non-float32
                   weights, Conv (:mod:`~quantscope.repair.adaround` handles Conv)
``H``              ``2 X^T X / n`` of the layer's FP32 input rows ``X`` on ``feeds``
                   (every row; layers reading the same tensor share one ``H``), plus
                   ``damp`` (1 %) of its mean diagonal on the diagonal, as GPTQ does;
                   an input never excited (zero diagonal) gets 1 there
grid               the plan's own weight encoding, from the emulation's
                   :func:`~quantscope.emulate.encode.encode` (min/max scale per output
                   channel or per tensor, symmetric or not, as the target's scheme
                   says; round half to even): codes are kept inside the range that
                   re-derives the same scale (symmetric: ``zp ± (qmax - qmin) // 2``),
                   and the elements that set a channel's range keep nearest rounding
result             the weight as ``scale * (q - zp)`` in float32, in its own layout:
                   exactly on the grid, so the emulation's ``DequantizeLinear(
                   QuantizeLinear(w))`` returns it unchanged (checked per layer,
                   ``on_grid``: the re-derived encoding equals the plan's and
                   ``DQ(Q(w)) == w``). **Assumption**: a vendor compiler that derives
                   the same scale from these weights (min/max, per channel) rounds them
                   to the same integers; not verified on a device. Exact on symmetric
                   weight grids (every built-in target); on an asymmetric one the scale
                   re-derived from the rounded weight can differ from the plan's in its
                   last bit (round to nearest's output has the same property), the codes
                   being the same: ``on_grid`` and the reason say so. Per layer the result
                   is kept only if its output error on the (undamped) calibration
                   ``H`` is below nearest rounding's; else the weight is left as it was
FP32 function      changed on purpose (the weights move onto their quantization grid),
                   like ``adaround``: the runner recalibrates and the plan's figures are
                   measured after it
cost               one FP32 pass over ``feeds`` tapping the layers' inputs, and per layer
                   an ``[in, in]`` inverse and Cholesky plus about ``out * in * (in +
                   block)`` multiply-adds; ``Repair.seconds`` says
=================  ================================================================
"""

from __future__ import annotations

import re
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
from quantscope.model.load import Model
from quantscope.numerics import dequantize, quantize, reencode
from quantscope.repair import (
    Change,
    Repair,
    RepairError,
    RepairInput,
    RepairStep,
    as_model,
    attr,
    step_of,
    use_counts,
    with_initializers,
)
from quantscope.types import (
    Encoding,
    Plan,
    QuantScheme,
    QuantscopeError,
    Stats,
    batch_rows,
    take_rows,
)

DAMP = 0.01  # relative damping of H (of its mean diagonal), as GPTQ
BLOCK = 128  # columns per lazy batch update, as GPTQ
BITS = (4, 8)  # weight widths GPTQ rounds; 16-bit weights are left alone
GRID_NOTE = (
    "weights written as scale x integer on the plan's grid: the emulation's "
    "DequantizeLinear(QuantizeLinear(w)) returns them unchanged; a vendor compiler that "
    "derives the same min/max scale rounds them to the same integers (assumed, not "
    "verified on a device); FP32 outputs change on purpose"
)


@dataclass(frozen=True)
class _Layer:
    node: onnx.NodeProto
    enc: Encoding
    trans: bool  # the weight is stored [out, in] (Gemm transB), else [in, out]


def _layers(m: Model, plan: Plan, stats: Stats, scheme: QuantScheme
            ) -> tuple[list[_Layer], list[tuple[str, str]]]:
    """The layers GPTQ rounds (with their plan encodings) and those left alone, why."""
    groups = find_groups(m)
    enc = encode(m, groups, stats, plan, scheme=scheme)
    nodes = {n.name: n for n in m.graph.node}
    uses = use_counts(m.graph)
    todo, skipped = [], []
    for g in groups.groups:
        node = nodes[g.nodes[0]]
        if g.weight is None or node.op_type not in ("MatMul", "Gemm"):
            continue
        bits = plan.precision_of(g.name).weight_bits
        if bits is None:
            skipped.append((node.name, "float group: its weight is not quantized"))
            continue
        w = m.initializer_array(g.weight)
        why: str | None = None
        if bits not in BITS:
            why = f"{bits}-bit weights: left alone (GPTQ here rounds 4- and 8-bit weights)"
        elif g.weight not in enc.weights:
            why = "the plan's encoding has no grid for this weight"
        elif len(node.input) < 2 or node.input[1] != g.weight:
            why = "the weight is not the node's second input (GPTQ here needs x @ W)"
        elif uses.get(g.weight, 0) > 1 and not _chunk_copies(node.name):
            why = "weight read by more than one node (one H cannot stand for all)"
        elif w.ndim != 2 or attr(node, "transA", 0):
            why = f"{node.op_type} with a {w.ndim}-D weight or transA (GPTQ here needs x @ W)"
        elif w.dtype != np.float32:
            why = f"{w.dtype} weight (GPTQ writes float32 grid values)"
        if why:
            skipped.append((node.name, why))
            continue
        trans = node.op_type == "Gemm" and bool(attr(node, "transB", 0))
        todo.append(_Layer(node, enc.weights[g.weight], trans))
    readers: dict[str, list[_Layer]] = {}
    for layer in todo:
        readers.setdefault(layer.node.input[1], []).append(layer)
    shared = {w for w, ls in readers.items() if len(ls) != uses.get(w, 0)
              or len({_CHUNK.sub("", x.node.name) for x in ls}) != 1}
    skipped += [(x.node.name, "weight read by more than one node, not all token chunks of "
                 "one layer rounded at one precision") for x in todo if x.node.input[1] in shared]
    return [x for x in todo if x.node.input[1] not in shared], skipped


_CHUNK = re.compile(r"/tok\d+$")


def _chunk_copies(name: str) -> bool:
    """``name`` is a token chunk of a layer (its weight is read by each chunk)."""
    return _CHUNK.search(name) is not None


def input_grams(m: Model, layers: Sequence[_Layer], feeds: Sequence[dict[str, np.ndarray]],
                *, max_rows: int = 8) -> dict[str, tuple[np.ndarray, int]]:
    """One streaming FP32 pass: per input tensor of ``layers``, (``X^T X`` in float64, rows)."""
    taps = list(dict.fromkeys(layer.node.input[0] for layer in layers))
    run = runner(make_session(tapped_model(m, taps), arena=False), taps)
    sums: dict[str, np.ndarray] = {}
    rows: dict[str, int] = dict.fromkeys(taps, 0)
    for feed in feeds:
        n = batch_rows(feed)
        for i in range(0, n, max_rows):
            for t, x in zip(taps, run(take_rows(feed, slice(i, i + max_rows))), strict=True):
                x = x.reshape(-1, x.shape[-1]).astype(np.float64)
                sums[t] = x.T @ x + sums[t] if t in sums else x.T @ x
                rows[t] += x.shape[0]
    return {t: (sums[t], rows[t]) for t in taps if rows[t]}


def damped_hessian(gram: np.ndarray, rows: int, damp: float = DAMP) -> np.ndarray:
    """``2 X^T X / n`` with ``damp`` of its mean diagonal added (dead inputs: 1)."""
    h = 2.0 * gram / rows
    diag = np.diag(h).copy()
    dead = diag == 0
    idx = np.arange(len(h))
    h[idx, idx] += damp * float(np.mean(diag))
    h[dead, dead] = 1.0
    return h


def gptq_codes(w: np.ndarray, hmat: np.ndarray, scale: np.ndarray, zero: np.ndarray,
               qlo: np.ndarray, qhi: np.ndarray, *, fixed: np.ndarray | None = None,
               block: int = BLOCK) -> np.ndarray:
    """GPTQ's integer codes for ``w`` ``[out, in]`` under the damped Hessian ``hmat``
    ``[in, in]``; ``scale``, ``zero``, ``qlo``, ``qhi`` broadcast to ``w``'s shape (the
    grid and the codes allowed per element); where ``fixed`` is not NaN its code is taken
    as it is (the error it leaves is still fed back)."""
    if block < 1:
        raise QuantscopeError(f"GPTQ block must be a positive number of columns, not {block}")
    w = np.array(w, dtype=np.float64)
    out, n = w.shape
    s, z, lo, hi = (np.broadcast_to(np.asarray(a, np.float64), (out, n))
                    for a in (scale, zero, qlo, qhi))
    fx = None if fixed is None else np.broadcast_to(fixed, (out, n))
    try:
        u = np.linalg.cholesky(np.linalg.inv(hmat)).T  # H^-1 = U^T U, U upper
    except np.linalg.LinAlgError as e:
        raise RepairError(f"GPTQ: the damped Hessian is not positive definite ({e})") from None
    q = np.empty_like(w)
    for i1 in range(0, n, block):
        i2 = min(i1 + block, n)
        w1, err = w[:, i1:i2], np.zeros((out, i2 - i1))
        for i in range(i2 - i1):
            j = i1 + i
            col = w1[:, i]
            c = np.clip(np.round(col / s[:, j]) + z[:, j], lo[:, j], hi[:, j])
            if fx is not None:
                c = np.where(np.isnan(fx[:, j]), c, fx[:, j])
            q[:, j] = c
            e = (col - (c - z[:, j]) * s[:, j]) / u[j, j]
            w1[:, i:] -= np.outer(e, u[j, j:i2])
            err[:, i] = e
        w[:, i2:] -= err @ u[i1:i2, i2:]
    return q


def _channel_extremes(w: np.ndarray, axis: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Per channel along ``axis`` (None: the whole tensor) its min and max, shaped to
    broadcast against ``w``."""
    if axis is None:
        return np.asarray(w.min()), np.asarray(w.max())
    shape = [1] * w.ndim
    shape[axis] = -1
    moved = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)
    return moved.min(axis=1).reshape(shape), moved.max(axis=1).reshape(shape)


def _grid(w: np.ndarray, enc: Encoding, symmetric: bool
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(scale, zero point, lowest code, highest code, nearest code where pinned else NaN),
    each broadcast to ``w`` (its own layout): the codes that re-derive ``enc``."""
    shape = [1] * w.ndim
    if enc.axis is not None and enc.scale.ndim == 1:
        shape[enc.axis % w.ndim] = -1
    s = np.broadcast_to(enc.scale.astype(np.float64).reshape(shape), w.shape)
    z = np.broadcast_to(enc.zero_point.astype(np.float64).reshape(shape), w.shape)
    axis = None if enc.axis is None else enc.axis % w.ndim
    lo, hi = _channel_extremes(w, axis)
    if symmetric:
        half = (enc.qmax - enc.qmin) // 2
        qlo, qhi = np.maximum(z - half, enc.qmin), np.minimum(z + half, enc.qmax)
        amax = np.maximum(np.abs(lo), np.abs(hi))
        pinned = np.abs(w) == amax
    else:
        qlo, qhi = np.full(w.shape, float(enc.qmin)), np.full(w.shape, float(enc.qmax))
        pinned = (w == lo) | (w == hi)
    fixed = np.where(pinned, quantize(w, enc).astype(np.float64), np.nan)
    return s, z, qlo, qhi, fixed


def _exact(new: np.ndarray, enc: Encoding, symmetric: bool) -> bool:
    """The emulation re-derives ``enc`` from ``new`` and ``DQ(Q(new)) == new`` exactly."""
    again = reencode(new, enc, symmetric=symmetric)
    return bool(np.array_equal(again.scale, enc.scale)
                and np.array_equal(again.zero_point, enc.zero_point)
                and np.array_equal(dequantize(quantize(new, again), again), new))


def _out_error(e: np.ndarray, gram: np.ndarray) -> float:
    """``tr(E G E^T)`` for ``E`` ``[out, in]``: the summed squared output error."""
    return float(np.sum(e * (e @ gram)))


def _round_layer(w: np.ndarray, layer: _Layer, gram: np.ndarray, rows: int, *,
                 symmetric: bool, damp: float, block: int
                 ) -> tuple[np.ndarray, np.ndarray, float, float]:
    """(new weight in its own layout, codes, GPTQ's output error, nearest's)."""
    enc = layer.enc
    s, z, qlo, qhi, fixed = _grid(w, enc, symmetric)
    t = (lambda a: a) if layer.trans else (lambda a: a.T)  # to and from [out, in]
    codes = t(gptq_codes(t(w), damped_hessian(gram, rows, damp), t(s), t(z), t(qlo),
                         t(qhi), fixed=t(fixed), block=block))
    new = dequantize(codes.astype(np.int32), enc)
    near = dequantize(quantize(w, enc), enc)
    g = gram / rows
    after = _out_error(t(new.astype(np.float64) - w), g)
    before = _out_error(t(near.astype(np.float64) - w), g)
    return new, codes, after, before


def gptq(
    model: Model | onnx.ModelProto,
    feeds: Sequence[dict[str, np.ndarray]],
    plan: Plan,
    *,
    stats: Stats | None = None,
    scheme: QuantScheme | None = None,
    damp: float = DAMP,
    block: int = BLOCK,
    max_rows: int = 8,
) -> Repair:
    """GPTQ-round the plan's 4- and 8-bit MatMul/Gemm weights on their grid (module
    docstring); ``max_rows`` samples of a feed run at a time."""
    start = time.perf_counter()
    if not damp > 0:
        raise QuantscopeError(f"GPTQ damping must be > 0 (a fraction of H's mean diagonal, "
                              f"e.g. {DAMP}), not {damp}")
    m = as_model(model)
    sch = scheme_for(plan, scheme)
    feeds = list(feeds)
    todo, skipped = _layers(m, plan, stats or calibrate(m, find_groups(m), feeds), sch)
    if todo and not feeds:
        raise RepairError("gptq: no calibration feeds to measure the layers' inputs on")
    grams = input_grams(m, todo, feeds, max_rows=max_rows) if todo else {}
    arrays, changes, ratios, exact, rows_min = {}, [], [], 0, None
    chunks: dict[str, list[str]] = {}  # weight -> the inputs its readers tap
    for layer in todo:
        chunks.setdefault(layer.node.input[1], []).append(layer.node.input[0])
    done: set[str] = set()
    for layer in todo:
        name = layer.node.input[1]
        if name in done:
            continue  # a token chunk of a layer already rounded
        done.add(name)
        parts = [grams[t] for t in chunks[name] if t in grams]
        if not parts:
            skipped.append((layer.node.name, "no calibration rows reached its input"))
            continue
        gram, rows = sum(p[0] for p in parts), sum(p[1] for p in parts)
        w = m.initializer_array(name)
        new, codes, after, before = _round_layer(
            w.astype(np.float64), layer, gram, rows, symmetric=sch.weight_symmetric,
            damp=damp, block=block)
        rows_min = rows if rows_min is None else min(rows_min, rows)
        ratio = after / before if before > 0 else 1.0
        if not after < before:
            skipped.append((layer.node.name, f"GPTQ's output error x{ratio:.3f} of nearest "
                            "rounding's on the calibration inputs: left as it was"))
            continue
        ratios.append(ratio)
        arrays[name] = new
        exact += _exact(new, layer.enc, sch.weight_symmetric)
        flips = int(np.sum(codes != quantize(w, layer.enc)))
        changes.append(Change(name, "regrid", note=(
            f"{layer.enc.bits}-bit, {flips} of {codes.size} weights rounded away from "
            f"nearest; output error x{ratio:.3f} of nearest's on {rows} calibration rows")))
    off = len(changes) - exact
    return Repair(
        name="gptq",
        reason=f"GPTQ (blocks of {block}, damping {damp:g}) on {len(changes)} MatMul/Gemm "
        f"layer(s): rounding chosen for the layer output; {GRID_NOTE}"
        + (f"; {off} layer(s) not exactly on the grid: the scale re-derived from them "
           "differs in its last bit (asymmetric weights), the integers are the same"
           if off else ""),
        proto=with_initializers(m.proto, arrays),
        changes=tuple(changes),
        skipped=tuple(skipped),
        effect=(
            ("layers", float(len(changes))),
            ("mean_output_error_ratio", float(np.mean(ratios)) if ratios else 1.0),
            ("on_grid", exact / len(changes) if changes else 1.0),
            ("calibration_rows", float(rows_min or 0)),
        ),
        seconds=time.perf_counter() - start,
    )


def gptq_step(inp: RepairInput) -> RepairStep:
    """The registry's ``gptq``: :func:`gptq` for the plan's 4- and 8-bit weights."""
    return step_of(gptq(inp.model, inp.feeds, inp.plan, stats=inp.stats, scheme=inp.scheme))
