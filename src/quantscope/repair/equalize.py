"""Cross-layer equalisation (Nagel et al. 2019) for pairs of weighted ops across an activation.

For ``y = W2 f(W1 x + b1)`` with ``f`` positive-homogeneous per channel
(``f(s x) = s f(x)`` for ``s > 0``): ``W1[i] / s_i``, ``b1[i] / s_i`` and ``W2[:, i] * s_i``
leave ``y`` unchanged. ``s_i = sqrt(r1_i / r2_i)`` makes the ranges ``r1_i`` (output channel
``i`` of W1) and ``r2_i`` (input channel ``i`` of W2) equal, so per-tensor weight grids (and
the activation grid between them) stop wasting levels on a few wide channels.

Conditions, each checked (failures land in ``Repair.skipped`` with the reason)
==========================  ===========================================================
first op                    ``Conv`` / ``ConvTranspose`` (group 1) / ``Gemm`` / ``MatMul``
                            (layouts from :mod:`quantscope.model.layouts`) with initializer
                            weight; bias an initializer (input 2, or a
                            MatMul's bias ``Add``), or none
activation                  none, ``Relu``, ``LeakyRelu`` (any alpha) or ``PRelu``: all
                            positive-homogeneous. A ``PRelu`` slope is per channel (or
                            scalar) and stays as it is: ``PRelu(s x) = s PRelu(x)`` for
                            every ``s > 0``, so its slopes need no rescaling. ``Clip``,
                            ``Sigmoid``, GELU … are not homogeneous and stop a pair.
second op                   ``Conv`` / ``ConvTranspose`` (group 1) / ``Gemm`` / ``MatMul``
                            reading the activation as its data input, initializer weight
single consumer             each tensor between the two ops is read by exactly one node
                            and is not a graph output; no weight/bias is shared
scales                      ``s > 0``, clipped to ``[1e-4, 1e4]``; iterated over all pairs
                            (chains converge in a few rounds)
FP32                        outputs unchanged on the sample inputs (<= 1e-5 relative)
==========================  ===========================================================
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from quantscope.model.layouts import layout_of
from quantscope.model.load import Model
from quantscope.repair import (
    Change,
    Repair,
    RepairInput,
    RepairStep,
    as_model,
    consumers_of,
    step_of,
    use_counts,
    with_initializers,
)
from quantscope.repair.verify import Batch, check_function

HOMOGENEOUS = frozenset({"Relu", "LeakyRelu", "PRelu"})
LIMIT = 1e4


@dataclass(frozen=True)
class Pair:
    first: str  # node names
    second: str
    w1: str
    out_axis: int  # output-channel axis of w1
    b1: str | None
    w2: str
    in_axis: int  # input-channel axis of w2


def _out_axis(node: onnx.NodeProto) -> int | None:
    """Output-channel axis of the weight (:mod:`quantscope.model.layouts`); None: not
    equalisable (a grouped convolution, not a weighted op)."""
    lay = layout_of(node)
    if lay is None or lay.group != 1:
        return None
    return 1 if lay.op_type == "MatMul" else lay.out_axis


def _in_axis(node: onnx.NodeProto) -> int | None:
    """Input-channel axis of the weight; None: not equalisable (also a Gemm with transA)."""
    lay = layout_of(node)
    if lay is None or lay.group != 1 or (lay.op_type == "Gemm" and lay.data_axis != -1):
        return None
    return 0 if lay.op_type == "MatMul" else lay.in_axis


def _follow(
    t: str, cons: dict[str, list[onnx.NodeProto]], outputs: set[str]
) -> onnx.NodeProto | str:
    users = cons.get(t, [])
    if t in outputs or len(users) != 1:
        return f"tensor '{t}' has {len(users)} consumers or is a graph output (needs exactly one)"
    return users[0]


def _pair_from(node: onnx.NodeProto, model: Model, inits: set[str]) -> Pair | str:
    """The equalisable pair starting at ``node``, or why there is none."""
    cons, outputs = consumers_of(model.graph), set(model.output_names())
    out_axis = _out_axis(node)
    if out_axis is None or len(node.input) < 2 or node.input[1] not in inits:
        return "not a weighted op with an initializer weight (or a grouped Conv)"
    bias = (
        node.input[2]
        if node.op_type != "MatMul" and len(node.input) > 2 and node.input[2]
        else None
    )
    nxt = _follow(node.output[0], cons, outputs)
    if node.op_type == "MatMul" and not isinstance(nxt, str) and nxt.op_type == "Add":
        bias = next((i for i in nxt.input if i in inits), None)
        nxt = _follow(nxt.output[0], cons, outputs) if bias else "its Add is not a bias Add"
    if not isinstance(nxt, str) and nxt.op_type in HOMOGENEOUS:
        if nxt.op_type == "PRelu" and nxt.input[1] not in inits:
            return "PRelu slope is not an initializer"
        nxt = _follow(nxt.output[0], cons, outputs)
    if isinstance(nxt, str):
        return nxt
    in_axis = _in_axis(nxt)
    if in_axis is None or len(nxt.input) < 2 or nxt.input[1] not in inits:
        return (
            f"followed by {nxt.op_type} '{nxt.name}': not positive-homogeneous or not a weighted op"
        )
    if bias is not None and bias not in inits:
        return "bias is not an initializer"
    return Pair(node.name, nxt.name, node.input[1], out_axis, bias, nxt.input[1], in_axis)


def find_pairs(model: Model) -> tuple[list[Pair], list[tuple[str, str]]]:
    inits = {t.name for t in model.graph.initializer}
    counts = use_counts(model.graph)
    pairs, skipped = [], []
    for node in model.graph.node:
        if _out_axis(node) is None:
            continue
        found = _pair_from(node, model, inits)
        if not isinstance(found, str) and any(
            counts.get(t, 0) > 1 for t in (found.w1, found.b1, found.w2) if t
        ):
            found = "a weight or bias is shared with another node"
        if isinstance(found, str):
            skipped.append((node.name, found))
        else:
            pairs.append(found)
    return pairs, skipped


def _channel_range(w: np.ndarray, axis: int) -> np.ndarray:
    return np.abs(np.moveaxis(w, axis, 0)).reshape(w.shape[axis], -1).max(axis=1).astype(np.float64)


def _apply(w: np.ndarray, axis: int, s: np.ndarray, *, divide: bool) -> np.ndarray:
    shape = [1] * w.ndim
    shape[axis] = -1
    f = s.reshape(shape)
    return (w.astype(np.float64) / f if divide else w.astype(np.float64) * f).astype(w.dtype)


def _equalize_once(pair: Pair, arrays: dict[str, np.ndarray]) -> np.ndarray:
    r1 = _channel_range(arrays[pair.w1], pair.out_axis)
    r2 = _channel_range(arrays[pair.w2], pair.in_axis)
    ok = (r1 > 0) & (r2 > 0)
    s = np.where(ok, np.sqrt(np.where(ok, r1, 1.0) / np.where(ok, r2, 1.0)), 1.0)
    s = np.clip(s, 1.0 / LIMIT, LIMIT)
    arrays[pair.w1] = _apply(arrays[pair.w1], pair.out_axis, s, divide=True)
    if pair.b1:
        arrays[pair.b1] = _apply(arrays[pair.b1], arrays[pair.b1].ndim - 1, s, divide=True)
    arrays[pair.w2] = _apply(arrays[pair.w2], pair.in_axis, s, divide=False)
    return s


def equalize_pairs(
    model: Model | onnx.ModelProto, feeds: Sequence[Batch], *, rounds: int = 4
) -> Repair:
    """Cross-layer equalise every legal pair; the FP32 function is checked unchanged."""
    start = time.perf_counter()
    m = as_model(model)
    pairs, skipped = find_pairs(m)
    arrays = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    total = {p.first: np.ones(arrays[p.w1].shape[p.out_axis]) for p in pairs}
    for _ in range(rounds if pairs else 0):
        for p in pairs:
            total[p.first] *= _equalize_once(p, arrays)
    changes = []
    for p in pairs:
        s, ch = tuple(map(float, total[p.first])), tuple(range(total[p.first].size))
        changes.append(Change(p.w1, "divide", p.out_axis, ch, s, note=f"{p.first} -> {p.second}"))
        if p.b1:
            changes.append(Change(p.b1, "divide", 0, ch, s))
        changes.append(Change(p.w2, "multiply", p.in_axis, ch, s))
    touched = {c.tensor for c in changes}
    proto = with_initializers(m.proto, {k: v for k, v in arrays.items() if k in touched})
    diff = check_function(m.proto, proto, feeds, what="equalize_pairs")
    return Repair(
        name="equalize_pairs",
        reason=f"cross-layer equalisation of {len(pairs)} pair(s) across positive-homogeneous activations",
        proto=proto,
        changes=tuple(changes),
        skipped=tuple(skipped),
        effect=(("fp32_rel_diff", diff), ("pairs", float(len(pairs)))),
        seconds=time.perf_counter() - start,
    )


def equalize_step(inp: RepairInput) -> RepairStep:
    """The registry's ``equalize``: :func:`equalize_pairs` on the model so far."""
    return step_of(equalize_pairs(inp.model, inp.feeds))
