"""Rotate each attention head's values (QuaRot / SpinQuant R2), offline: no extra op.

Per head, ``ctx_j = P_j V_kv(j)`` and the output projection reads the heads' contexts
side by side. An orthogonal ``H`` (``H Hᵀ = I``, head_dim x head_dim) applied to every
head's value columns and undone in the output projection's rows leaves the function
unchanged: ``(P V H)(Hᵀ W_o) = P V W_o``. One ``H`` for every head, so grouped-query
attention (query head j reading KV head j // group) needs no mapping:

==========================  ===========================================================
value projection            ``W_v [in, kv*d]`` -> ``W_v blockdiag(H, ..., H)`` (its bias,
                            when an ``Add`` of an initializer follows, likewise)
output projection           ``W_o [q*d, out]`` -> ``blockdiag(Hᵀ, ..., Hᵀ) W_o``
the V cache                 stored in the rotated basis: ``present.*.value`` is the old
                            one times ``H`` per head, and ``past.*.value`` is read so. A
                            host that copies present to past, and a KV prefix computed
                            by the rewritten prefill graph, need nothing; a cache made
                            by the un-rotated graph must be multiplied by ``H`` per head
                            (:func:`value_basis` names the tensors)
the matrix                  :func:`quantscope.repair.rotate.rotation_matrix` of
                            head_dim (64: Sylvester's Hadamard / 8)
==========================  ===========================================================

Where it applies (:func:`find_value_heads`): each attention ``MatMul(probs, V)`` whose
probs come from a ``Softmax``; ``V`` followed back through shape-only ops (``Reshape``
to ``[..., d]``, ``Transpose`` keeping the last axis, ``Concat`` with a graph-input cache
on another axis, ``Unsqueeze``/``Expand`` of the head axis) to a Linear (``MatMul`` with
an initializer weight, optionally plus a bias ``Add``); the context followed forward
through ``Transpose`` (perm ``[0, 2, 1, 3]``) and a ``Reshape`` to ``[..., q*d]`` into a
Linear; the values must reach a KV cache (a graph output such as ``present.0.value``): on
a graph without one (an encoder) it says no, since it was measured only on a decoder's
cache. Anything else: it does not apply, and the reason names the node.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from quantscope.model.load import Model
from quantscope.repair import Change, Repair, attr, consumers_of, use_counts, with_initializers
from quantscope.repair.rotate import rotation_matrix

METADATA_KEY = "quantscope.rotate_values"
UNVERIFIED = ("unverified on a device: the rotated weights are ordinary dense weights (no "
              "extra op); the V cache holds the rotated values, which a host that copies "
              "present to past never reads")
ROTATED_VALUES = ("; the values are stored rotated per head (vrotate, QuaRot R2): the prefix "
                  "file and both graphs use that basis, so feeding present back as past "
                  "needs nothing; a cache made by another graph (the un-rotated model) must "
                  "first be multiplied by the head_dim Hadamard matrix on its last axis")
_SHAPE_OPS = {"Reshape", "Transpose", "Concat", "Unsqueeze", "Expand", "Identity"}


@dataclass(frozen=True)
class ValueHeads:
    """One attention's value path, as graph facts."""

    context: str  # the MatMul(probs, V) node
    v_weight: str  # initializer [in, kv*d]
    v_bias: str | None  # initializer [kv*d] of the Add after the value projection
    o_weight: str  # initializer [q*d, out]
    head_dim: int
    caches: tuple[str, ...]  # graph inputs / outputs holding these values


def _inits(model: Model) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in model.graph.initializer}


def _const(inits: dict[str, onnx.TensorProto], name: str) -> np.ndarray | None:
    return numpy_helper.to_array(inits[name]) if name in inits else None


def _weight(node: onnx.NodeProto | None, inits: dict[str, onnx.TensorProto]) -> str | None:
    if node is None or node.op_type != "MatMul" or node.input[1] not in inits:
        return None
    return node.input[1] if len(inits[node.input[1]].dims) == 2 else None


def _last_axis_moves(chain: list[onnx.NodeProto], inits: dict[str, onnx.TensorProto],
                     d: int) -> tuple[onnx.NodeProto, str] | None:
    """The first node of ``chain`` (value projection -> attention, in that order) that may
    move the last (head_dim) axis, and how; None when every node keeps it."""
    rank = 0
    for node in chain:
        shape = _const(inits, node.input[1]) if len(node.input) > 1 else None
        if node.op_type in ("Reshape", "Expand"):
            if shape is None or shape.ndim != 1 or int(shape[-1]) not in (
                    (d,) if node.op_type == "Reshape" else (d, 1)):
                return node, f"does not keep the last axis at {d}"
            rank = len(shape) if node.op_type == "Reshape" else max(rank, len(shape))
        elif node.op_type == "Transpose":
            perm = list(attr(node, "perm", []))
            if not perm or perm[-1] != len(perm) - 1:
                return node, "moves the last axis"
        elif node.op_type == "Concat":
            if not rank or int(attr(node, "axis", 0)) % rank == rank - 1:
                return node, "concatenates along the last axis"
        elif node.op_type == "Unsqueeze":
            axes = shape.tolist() if shape is not None else list(attr(node, "axes", []))
            if not axes or any(a < 0 or a >= rank + len(axes) - 1 for a in axes):
                return node, "unsqueezes at the end"
            rank += len(axes)
    return None


def _values_back(model: Model, start: str, inits: dict[str, onnx.TensorProto],
                 producer: dict[str, onnx.NodeProto], graph_io: set[str]
                 ) -> tuple[str, str | None, list[onnx.NodeProto], list[str]] | str:
    """From V back to the value projection: (weight, bias, chain nodes, cache tensors)."""
    chain: list[onnx.NodeProto] = []
    caches: list[str] = []
    t = start
    while True:
        if t in graph_io:
            caches.append(t)
        node = producer.get(t)
        if node is None:
            return f"the values '{start}' come from no Linear"
        if _weight(node, inits) is not None:
            return node.input[1], None, chain, caches
        if node.op_type == "Add":
            bias = next((i for i in node.input if i in inits), None)
            other = next((i for i in node.input if i != bias), None)
            linear = producer.get(other) if other else None
            w = _weight(linear, inits)
            if bias is None or w is None or len(inits[bias].dims) != 1:
                return f"'{node.name}' (Add) on the values is not a Linear's bias"
            return w, bias, chain, caches
        if node.op_type not in _SHAPE_OPS:
            return f"'{node.name}' ({node.op_type}) computes on the values"
        chain.append(node)
        inner = [i for i in node.input[:1 if node.op_type != "Concat" else None]
                 if i not in inits]
        fed = [i for i in inner if i not in graph_io or producer.get(i) is not None]
        caches += [i for i in inner if i in graph_io and producer.get(i) is None]
        if len(fed) != 1:
            return f"'{node.name}' ({node.op_type}) joins more than one value tensor"
        t = fed[0]


def _context_forward(model: Model, ctx: onnx.NodeProto, inits: dict[str, onnx.TensorProto],
                     readers: dict[str, list[onnx.NodeProto]]) -> tuple[str, int] | str:
    """From the context to the output projection: (its weight, the merged width)."""
    tr = readers.get(ctx.output[0], [])
    if len(tr) != 1 or tr[0].op_type != "Transpose" or list(attr(tr[0], "perm", [])) != [0, 2, 1, 3]:
        return f"the context of '{ctx.name}' is not transposed to [B, S, heads, d]"
    rs = readers.get(tr[0].output[0], [])
    shape = _const(inits, rs[0].input[1]) if len(rs) == 1 and rs[0].op_type == "Reshape" else None
    if shape is None:
        return f"the heads after '{tr[0].name}' are not merged by a Reshape"
    lin = readers.get(rs[0].output[0], [])
    w = _weight(lin[0], inits) if len(lin) == 1 and lin[0].input[0] == rs[0].output[0] else None
    if w is None or int(shape[-1]) != int(inits[w].dims[0]):
        return f"the merged heads after '{rs[0].name}' are not read by one Linear"
    return w, int(inits[w].dims[0])


def find_value_heads(model: Model) -> tuple[ValueHeads, ...] | str:
    """Every attention's value path (module docstring), or why the model has none."""
    inits = _inits(model)
    readers = consumers_of(model.graph)
    producer = {o: n for n in model.graph.node for o in n.output}
    outputs = set(model.output_names())
    graph_io = {i.name for i in model.graph.input} | outputs
    found: list[ValueHeads] = []
    for soft in (n for n in model.graph.node if n.op_type == "Softmax"):
        for ctx in readers.get(soft.output[0], []):
            if ctx.op_type != "MatMul" or ctx.input[0] != soft.output[0] or ctx.input[1] in inits:
                continue
            back = _values_back(model, ctx.input[1], inits, producer, graph_io)
            if isinstance(back, str):
                return back
            w_v, bias, chain, caches = back
            split = chain[-1] if chain and chain[-1].op_type == "Reshape" else None
            shape = _const(inits, split.input[1]) if split is not None else None
            d = int(shape[-1]) if shape is not None and shape.ndim == 1 else 0
            if split is not None and shape is None:
                return (f"the head split of the values '{split.name}' has a computed shape "
                        "(not an initializer): head_dim is read from a constant [..., d]")
            if d < 2 or int(inits[w_v].dims[1]) % d:
                return f"no head split of the values before '{ctx.name}'"
            why = _last_axis_moves(chain[::-1], inits, d)
            if why is not None:
                return f"'{why[0].name}' ({why[0].op_type}) on the values {why[1]}"
            inside = ({n.output[0] for n in chain} | {ctx.input[1]}
                      | {i for n in chain for i in n.input[:1] if i not in inits})
            stray = [r for t in inside for r in readers.get(t, [])
                     if r is not ctx and r.output[0] not in inside]
            if stray:
                return f"'{stray[0].name}' ({stray[0].op_type}) also reads the values"
            fwd = _context_forward(model, ctx, inits, readers)
            if isinstance(fwd, str):
                return fwd
            w_o, width = fwd
            if not any(c in outputs for c in caches):
                return (f"the values of '{ctx.name}' reach no KV cache (a graph output): "
                        "vrotate is for a decoder's cached values (not measured elsewhere)")
            if width % d:
                return f"the output projection's {width} inputs are not heads of {d}"
            found.append(ValueHeads(ctx.name, w_v, bias, w_o, d, tuple(dict.fromkeys(caches))))
    if not found:
        return "no attention MatMul(Softmax, V): no value heads to rotate"
    counts = use_counts(model.graph)
    touched = [t for h in found for t in (h.v_weight, h.v_bias, h.o_weight) if t]
    shared = [t for t in touched if counts.get(t, 0) > 1 or touched.count(t) > 1]
    if shared:
        return f"initializer '{shared[0]}' is read by more than one node"
    return tuple(found)


def value_basis(model: Model, seed: int = 0) -> dict[str, np.ndarray]:
    """The graph inputs / outputs (the V cache) the rewrite stores rotated: name -> the
    head_dim x head_dim matrix the rewritten graph's tensor is the old one times, on its
    last axis. Empty when it does not apply."""
    heads = find_value_heads(model)
    if isinstance(heads, str):
        return {}
    return {c: rotation_matrix(h.head_dim, seed)[0] for h in heads for c in h.caches}


def rotate_values(model: Model, *, seed: int = 0) -> Repair:
    """Rotate every attention's value heads (module docstring). Not applicable: nothing
    changed, the reason says why."""
    start = time.perf_counter()
    heads = find_value_heads(model)
    if isinstance(heads, str):
        return Repair(name="rotate_values", reason=heads, proto=model.proto)
    inits = _inits(model)
    arrays: dict[str, np.ndarray] = {}
    changes: list[Change] = []
    kinds = set()
    for h in heads:
        r2, kind = rotation_matrix(h.head_dim, seed)
        kinds.add(kind)
        w_v = numpy_helper.to_array(inits[h.v_weight]).astype(np.float64)
        blocks_v = w_v.reshape(w_v.shape[0], -1, h.head_dim)
        arrays[h.v_weight] = (blocks_v @ r2).reshape(w_v.shape).astype(np.float32)
        if h.v_bias is not None:
            b = numpy_helper.to_array(inits[h.v_bias]).astype(np.float64)
            arrays[h.v_bias] = (b.reshape(-1, h.head_dim) @ r2).reshape(-1).astype(np.float32)
        w_o = numpy_helper.to_array(inits[h.o_weight]).astype(np.float64)
        blocks_o = w_o.reshape(-1, h.head_dim, w_o.shape[1])
        arrays[h.o_weight] = (r2.T[None] @ blocks_o).reshape(w_o.shape).astype(np.float32)
        changes += [Change(h.v_weight, "multiply", note=f"value heads x R2 ({kind})"),
                    *([Change(h.v_bias, "multiply", note="value heads x R2")]
                      if h.v_bias else []),
                    Change(h.o_weight, "multiply", note="rows R2ᵀ per head")]
    d = heads[0].head_dim
    out = with_initializers(model.proto, arrays)
    onnx.helper.set_model_props(out, {**{p.key: p.value for p in out.metadata_props},
                                      METADATA_KEY: f"r2={'/'.join(sorted(kinds))};seed={seed}"})
    caches = sum(len(h.caches) for h in heads)
    reason = (f"R2 ({'/'.join(sorted(kinds))}, {d} wide) on the value heads of {len(heads)} "
              f"attention(s): value and output projections rotated, no extra op"
              + (f"; {caches} V-cache tensor(s) hold rotated values" if caches else ""))
    return Repair(name="rotate_values", reason=reason, proto=out, changes=tuple(changes),
                  effect=(("attentions", float(len(heads))),),
                  seconds=time.perf_counter() - start)


__all__ = ["METADATA_KEY", "ROTATED_VALUES", "UNVERIFIED", "ValueHeads", "find_value_heads", "rotate_values",
           "value_basis"]
