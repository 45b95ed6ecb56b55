"""AdaRound-style rounding of weights (Nagel et al. 2020), per layer, on calibration data.

Nearest rounding minimises each weight's own error, not the layer's output error. With
``H = E[x x^T]`` over the calibration inputs of a linear layer, the output error of a
rounding choice is ``tr(E^T H E)`` for ``E = s (floor(W/s) + h) - W``; AdaRound relaxes
``h`` in ``[0, 1]`` (rectified sigmoid of ``V``) and adds a regulariser
``sum 1 - |2h - 1|^beta`` (beta annealed 20 -> 2) that pushes every ``h`` to 0 or 1.

=================  ================================================================
layers             MatMul / Gemm whose weight the plan quantizes (2-D weight); Conv is
                   not handled (would need im2col inputs) and is listed as skipped
inputs ``x``       FP32 inputs of the layer on ``feeds``, folded into ``H`` as they stream
grid               the plan's own weight encoding (per output channel or per tensor);
                   elements that set a channel's range keep nearest rounding, so the
                   rounded weight has the same encoding
result             the weight as ``s * q``: a float initializer exactly on the grid, so
                   the writer's ``quantize()`` reproduces ``q`` (checked, ``on_grid``);
                   per layer the result is kept only if its output error on ``H`` is
                   below nearest rounding's
cost               ``iterations`` Adam steps of an ``[in, in] @ [in, out]`` product per
                   layer, plus one FP32 pass over ``feeds``; ``Repair.seconds`` says
=================  ================================================================
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import onnx

from quantscope.calibrate.collect import calibrate, tapped_model
from quantscope.emulate.encode import encode
from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.numerics import quantize, weight_encoding
from quantscope.repair import Change, Repair, as_model, attr, with_initializers
from quantscope.repair.verify import Batch, run_all
from quantscope.types import Encoding, Plan, QuantScheme, Stats

ZETA, GAMMA = 1.1, -0.1


def _gram(m: Model, inputs: list[str], feeds: Sequence[Batch]) -> list[np.ndarray]:
    """``E[x x^T]`` of each named tensor, rows over every leading position."""
    n = len(m.graph.output)
    grams: list[np.ndarray | None] = [None] * len(inputs)
    rows = [0] * len(inputs)
    for out in run_all(tapped_model(m, inputs), feeds):
        for k, x in enumerate(out[n:] if len(out) > n else out):
            x = x.reshape(-1, x.shape[-1]).astype(np.float64)
            grams[k] = x.T @ x if grams[k] is None else grams[k] + x.T @ x
            rows[k] += x.shape[0]
    return [g / r for g, r in zip(grams, rows, strict=True)]


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


def _layers(
    m: Model, plan: Plan, stats: Stats, scheme: QuantScheme | None
) -> tuple[list[tuple[onnx.NodeProto, Encoding]], list[tuple[str, str]]]:
    groups = find_groups(m)
    enc = encode(m, groups, stats, plan, scheme=scheme)
    nodes = {n.name: n for n in m.graph.node}
    todo, skipped = [], []
    for g in groups.groups:
        node = nodes[g.nodes[0]]
        if g.weight not in enc.weights:
            continue
        if (
            node.op_type not in ("MatMul", "Gemm")
            or m.initializer_array(g.weight).ndim != 2
            or attr(node, "transA", 0)
        ):
            skipped.append(
                (node.name, f"{node.op_type} is not a 2-D MatMul/Gemm (AdaRound here needs x @ W)")
            )
            continue
        todo.append((node, enc.weights[g.weight]))
    return todo, skipped


def adaround(
    model: Model | onnx.ModelProto,
    feeds: Sequence[Batch],
    plan: Plan,
    *,
    stats: Stats | None = None,
    scheme: QuantScheme | None = None,
    iterations: int = 200,
) -> Repair:
    """Optimise weight rounding per layer; weights come back as float values on their grid."""
    start = time.perf_counter()
    m = as_model(model)
    stats = stats or calibrate(m, find_groups(m), feeds)
    todo, skipped = _layers(m, plan, stats, scheme)
    grams = _gram(m, [n.input[0] for n, _ in todo], feeds) if todo else []
    arrays, changes, gains, on_grid = {}, [], [], True
    for (node, enc), hmat in zip(todo, grams, strict=True):
        trans = node.op_type == "Gemm" and bool(attr(node, "transB", 0))
        w = m.initializer_array(node.input[1]).astype(np.float64)
        w_io = w.T if trans else w
        s = np.broadcast_to(enc.scale.astype(np.float64), (w_io.shape[1],)).reshape(1, -1)
        q = optimise_rounding(w_io, s, enc.qmin, enc.qmax, hmat, iterations=iterations)
        new = (q * s).astype(np.float32)
        near = s * np.clip(np.round(w_io / s), enc.qmin, enc.qmax)
        gains.append(_rec(hmat, new - w_io) / max(_rec(hmat, near - w_io), 1e-30))
        arrays[node.input[1]] = new.T if trans else new
        on_grid &= _reproduces(arrays[node.input[1]], q.T if trans else q, enc)
        flips = int(np.sum(q != np.clip(np.round(w_io / s), enc.qmin, enc.qmax)))
        changes.append(
            Change(
                node.input[1],
                "regrid",
                note=f"{flips} of {q.size} weights rounded away from nearest; output error x{gains[-1]:.3f}",
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


def _reproduces(w: np.ndarray, q: np.ndarray, enc: Encoding) -> bool:
    """True when re-encoding ``w`` and quantizing it gives back ``q`` exactly."""
    axis = None if enc.axis is None else (enc.axis % w.ndim)
    again = weight_encoding(w, enc.bits, axis=axis, signed=enc.signed, symmetric=True)
    return bool(np.array_equal(quantize(w, again), q.astype(np.int32)))
