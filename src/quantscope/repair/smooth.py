"""SmoothQuant-style outlier migration: per-channel scales moved from activations to weights.

For a tensor ``t`` with a few huge channels that feeds linear ops ``y = t @ W``:
``t' = t / s`` (per channel ``j`` of the last axis) and ``W'[j, :] = W[j, :] * s_j``, so
``t' @ W' == t @ W``. ``s_j = max|t_j|**alpha / max_k |W_jk|**(1 - alpha)``.

Where ``1/s`` goes (the producer of ``t``)
===========================================  ==========================================
``LayerNormalization`` (last axis)           ``gamma / s`` and ``beta / s``
``RMSNormalization`` (last axis)             ``gain / s`` (a decoder's norms)
``MatMul`` (+ bias ``Add``) / ``Gemm``       weight output columns and bias ``/ s``
``Mul`` of a gated MLP (``gated=True``)      the weight output columns of the one
                                             operand a ``MatMul`` writes for this ``Mul``
                                             alone (a decoder's up projection: ``silu(g)
                                             * (x W_up)``, channel ``j`` of the product
                                             is ``j`` of ``x W_up`` times a factor)
anything else                                skipped
===========================================  ==========================================

Conditions (each failure is recorded in ``Repair.skipped`` with the reason)
- every consumer of ``t`` is a ``MatMul`` / ``Gemm`` reading ``t`` as its data input with
  an initializer weight; otherwise skipped -- unless ``rescale_others=True``, which
  inserts one ``Mul(t, s)`` for the other consumers (an extra elementwise op that the
  target must allow and that a plan must cost);
- ``t`` is not a graph output; every initializer touched is read by one node only;
- the FP32 outputs are unchanged on the sample inputs (checked, ``<= 1e-5`` relative).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantscope.model.layouts import layout_of
from quantscope.model.load import Model
from quantscope.repair import (
    Change,
    Repair,
    RepairInput,
    RepairStep,
    as_model,
    attr,
    consumers_of,
    step_of,
    use_counts,
    with_initializers,
)
from quantscope.repair.verify import FP32_RTOL, Batch, check_function
from quantscope.types import Stats

MAX_SCALE = 1e4


@dataclass(frozen=True)
class _Site:
    tensor: str
    divide: tuple[tuple[str, int], ...]  # (initializer, channel axis) that get / s
    multiply: tuple[tuple[str, int], ...]  # consumer weights, input-channel axis, get * s
    others: tuple[str, ...]  # names of non-linear consumers (need a Mul to undo s)


def _consumer_weight(
    node: onnx.NodeProto, t: str, inits: dict[str, np.ndarray]
) -> tuple[str, int] | None:
    """(weight, input-channel axis) when ``node`` is a linear op reading ``t`` as data."""
    if len(node.input) < 2 or node.input[0] != t or node.input[1] not in inits:
        return None
    w = inits[node.input[1]]
    if node.op_type == "MatMul" and w.ndim == 2:
        return node.input[1], 0
    lay = layout_of(node)
    if lay is not None and lay.op_type == "Gemm" and lay.data_axis == -1:  # not transA
        return node.input[1], lay.in_axis
    return None


def _gated_scalables(
    node: onnx.NodeProto, prod: dict[str, onnx.NodeProto], inits: dict[str, np.ndarray],
    cons: dict[str, list[onnx.NodeProto]],
) -> tuple[tuple[str, int], ...] | str:
    """The up projection's weight columns of a gated product ``Mul(a, x @ W)``: the one
    operand a ``MatMul`` with an initializer weight writes for this ``Mul`` alone."""
    ups = [prod[i] for i in node.input if i in prod and prod[i].op_type == "MatMul"
           and prod[i].input[1] in inits and inits[prod[i].input[1]].ndim == 2
           and [c.name for c in cons.get(i, [])] == [node.name]]
    if len(ups) != 1 or len(set(node.input)) != 2:
        return "a Mul that is not a gated product (one factor a MatMul read by it alone)"
    return ((ups[0].input[1], 1),)


def _producer_scalables(
    model: Model, t: str, inits: dict[str, np.ndarray], *, gated: bool = False,
    cons: dict[str, list[onnx.NodeProto]] | None = None,
) -> tuple[tuple[str, int], ...] | str:
    """Initializers (and their channel axis) that carry 1/s for ``t``'s producer, or why not."""
    prod = {o: n for n in model.graph.node for o in n.output}
    node = prod.get(t)
    if node is None:
        return "produced by no node (a graph input)"
    if node.op_type == "Mul" and gated:
        return _gated_scalables(node, prod, inits, cons or consumers_of(model.graph))
    if node.op_type == "LayerNormalization":
        rank = len(model.value_shapes().get(node.input[0], ()))
        if attr(node, "axis", -1) not in (-1, rank - 1):
            return "LayerNormalization over more than the last axis"
        params = [p for p in node.input[1:3] if p]
        if not all(p in inits for p in params):
            return "LayerNormalization gamma/beta are not initializers"
        return tuple((p, 0) for p in params)
    if node.op_type == "RMSNormalization":  # a decoder's norm: its gain takes 1/s
        rank = len(model.value_shapes().get(node.input[0], ()))
        if attr(node, "axis", -1) not in (-1, rank - 1):
            return "RMSNormalization over more than the last axis"
        if len(node.input) < 2 or node.input[1] not in inits:
            return "RMSNormalization gain is not an initializer"
        return ((node.input[1], 0),)
    if node.op_type == "Add":
        bias = next((i for i in node.input if i in inits), None)
        other = next((i for i in node.input if i not in inits), None)
        mm = prod.get(other or "")
        if bias is None or mm is None or mm.op_type != "MatMul" or mm.input[1] not in inits:
            return "an Add that is not a MatMul's bias"
        return ((mm.input[1], 1), (bias, inits[bias].ndim - 1))
    if node.op_type == "MatMul" and node.input[1] in inits:
        return ((node.input[1], 1),)
    return f"produced by {node.op_type}, which cannot absorb a per-channel scale"


def _candidates(model: Model, inits: dict[str, np.ndarray]) -> list[str]:
    """Tensors read as data by some linear op with an initializer weight (graph order)."""
    seen: dict[str, None] = {}
    for n in model.graph.node:
        if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1 and n.input[1] in inits:
            seen.setdefault(n.input[0], None)
    return list(seen)


def find_sites(
    model: Model, *, rescale_others: bool = False, gated: bool = False,
    producers: Collection[str] | None = None,
) -> tuple[list[_Site], list[tuple[str, str]]]:
    """Inputs of linear ops that can be smoothed, and why the others cannot; with
    ``producers`` only the inputs made by those op types are looked at."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    cons, counts = consumers_of(model.graph), use_counts(model.graph)
    outputs = set(model.output_names())
    made_by = {o: n.op_type for n in model.graph.node for o in n.output}
    sites, skipped = [], []
    for t in _candidates(model, inits):
        if producers is not None and made_by.get(t) not in producers:
            continue
        divide = _producer_scalables(model, t, inits, gated=gated, cons=cons)
        linear = {c.name: _consumer_weight(c, t, inits) for c in cons.get(t, [])}
        others = tuple(name for name, w in linear.items() if w is None)
        touched = [] if isinstance(divide, str) else [*divide, *(v for v in linear.values() if v)]
        why = divide if isinstance(divide, str) else None
        if why is None and t in outputs:
            why = "it is a graph output"
        elif why is None and others and not rescale_others:
            why = (
                f"consumers {', '.join(others)} are not linear ops that can absorb 1/s "
                "(rescale_others=True inserts a Mul for them)"
            )
        elif why is None and any(counts.get(w, 0) > 1 for w, _ in touched):
            why = "an initializer it would change is shared with another node"
        if why:
            skipped.append((t, why))
            continue
        sites.append(_Site(t, tuple(divide), tuple(v for v in linear.values() if v), others))
    return sites, skipped


def _scales(act_absmax: np.ndarray, w_absmax: np.ndarray, alpha: float) -> np.ndarray:
    act = np.maximum(act_absmax.astype(np.float64), 1e-8)
    w = np.maximum(w_absmax.astype(np.float64), 1e-8)
    s = act**alpha / w ** (1.0 - alpha)
    s = s / np.exp(np.mean(np.log(s)))  # geometric mean 1: the overall scale stays put
    return np.clip(s, 1.0 / MAX_SCALE, MAX_SCALE)


def _scale_along(a: np.ndarray, axis: int, s: np.ndarray, *, divide: bool) -> np.ndarray:
    shape = [1] * a.ndim
    shape[axis] = -1
    f = s.reshape(shape)
    return (a.astype(np.float64) / f if divide else a.astype(np.float64) * f).astype(a.dtype)


def _rescale_node(site: _Site, s: np.ndarray, proto: onnx.ModelProto) -> Change:
    """Insert ``Mul(t, s)`` for the non-linear consumers of ``site.tensor``."""
    t = site.tensor
    undo, const = f"{t}_unsmoothed", f"{t}_smooth_scale"
    proto.graph.initializer.append(numpy_helper.from_array(s.astype(np.float32), const))
    nodes = list(proto.graph.node)
    at = next(i for i, n in enumerate(nodes) if t in n.output)
    nodes.insert(at + 1, helper.make_node("Mul", [t, const], [undo], name=f"{t}/unsmooth"))
    for n in nodes:
        if n.name in site.others:
            for i, name in enumerate(n.input):
                if name == t:
                    n.input[i] = undo
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    return Change(
        undo,
        "insert",
        note=f"Mul node '{t}/unsmooth' restores the scale for {', '.join(site.others)}",
    )


def smooth_outliers(
    model: Model | onnx.ModelProto,
    stats: Stats,
    feeds: Sequence[Batch],
    *,
    alpha: float = 0.5,
    rescale_others: bool = False,
    rtol: float = FP32_RTOL,
    gated: bool = False,
    producers: Collection[str] | None = None,
) -> Repair:
    """Migrate LayerNorm-output outliers into the consuming linear ops' weights (checked
    within ``rtol``); ``gated``: also a gated MLP's product (1/s into the up projection);
    ``producers``: only the sites made by those op types (e.g. ``("Mul",)``)."""
    start = time.perf_counter()
    m = as_model(model)
    sites, skipped = find_sites(m, rescale_others=rescale_others, gated=gated,
                                producers=producers)
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    arrays: dict[str, np.ndarray] = {}
    changes: list[Change] = []
    pending: list[tuple[_Site, np.ndarray]] = []
    for site in sites:
        ts = stats.tensors.get(site.tensor)
        if (
            ts is None
            or ts.channel_absmax.size != inits[site.multiply[0][0]].shape[site.multiply[0][1]]
        ):
            skipped.append((site.tensor, "no per-channel statistics for it (calibrate this model)"))
            continue
        w_absmax = np.max(
            [
                np.abs(np.moveaxis(inits[w], ax, 0)).reshape(ts.channel_absmax.size, -1).max(axis=1)
                for w, ax in site.multiply
            ],
            axis=0,
        )
        s = _scales(ts.channel_absmax, w_absmax, alpha)
        channels = tuple(range(s.size))
        for name, ax in site.divide:
            arrays[name] = _scale_along(inits[name], ax, s, divide=True)
            changes.append(Change(name, "divide", ax, channels, tuple(map(float, s))))
        for name, ax in site.multiply:
            arrays[name] = _scale_along(inits[name], ax, s, divide=False)
            changes.append(Change(name, "multiply", ax, channels, tuple(map(float, s))))
        if site.others:
            pending.append((site, s))
    proto = with_initializers(m.proto, arrays)
    changes += [_rescale_node(site, s, proto) for site, s in pending]
    diff = check_function(m.proto, proto, feeds, what="smooth_outliers", rtol=rtol)
    n_done = len(sites) - sum(1 for t, _ in skipped if t in {x.tensor for x in sites})
    return Repair(
        name="smooth_outliers",
        reason=(
            f"SmoothQuant alpha={alpha:g}: per-channel outliers of {n_done} tensor(s) "
            "moved into the weights of the linear ops that read them"
        ),
        proto=proto,
        changes=tuple(changes),
        skipped=tuple(skipped),
        effect=(("fp32_rel_diff", diff), ("sites", float(n_done))),
        seconds=time.perf_counter() - start,
    )


def smooth_step(inp: RepairInput) -> RepairStep:
    """The registry's ``smooth``: :func:`smooth_outliers` with the model's stats."""
    return step_of(smooth_outliers(inp.model, inp.stats, inp.feeds))
