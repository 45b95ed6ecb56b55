"""Function-preserving rewrite: attention weights scaled per row onto the 8-bit grid (``rowscale``).

Hailo's DFC 5.3 crashes on 16-bit attention (target rule ``hailo.attention_16bit``), so the
attention weights ``P = Softmax(s)`` enter the context MatMul at 8 bit. On a [0, 1] grid a
row spread over ``n`` keys has weights near ``1/n``: at ``n = 100`` each weight is two or
three grid steps, so its context is mostly rounding. With everything else at 16 bit and
heads split, the Softmax output alone at 8 bit costs ``minilm-l6`` 2.6 points of top-1
agreement at sequence 256, the largest attention error (docs/benchmarks.md).

Softmax is ``E / Z`` with ``E = exp(s - max(s))`` (each row's largest entry is 1) and
``Z = sum(E)`` (1 for a one-key row, up to ``n`` for a flat one). This rewrite feeds the
MatMul the weights of each row scaled by ``min(Z, g)`` (``g``: ``growth``) and divides the
context by the sum of those 8-bit weights afterwards:

=================  ==================================================================
before             ``P = Softmax(s)`` (8 bit) ``-> c = MatMul(P, v)``
after              ``E = Exp(s - ReduceMax(s))``, ``Z = ReduceSum(E)``,
                   ``w = E * Min(g / Z, 1)`` (8 bit: ``<Softmax>/w``, what the MatMul
                   reads; ``w = min(Z, g) * P``), ``c = MatMul(w, v) / ReduceSum(w)``
                   (``<MatMul>/norm`` writes ``c``: same name, same readers)
=================  ==================================================================

A flat row's weights are ``g`` times larger on the same grid (``g`` times finer); the
MatMul's 8-bit output grows by at most ``g`` (the reason for the cap: uncapped, ``E`` itself,
the context grows by ``Z``, up to ~180 in ``minilm-l6`` layer 0, and the peaked rows'
contexts lose that factor of resolution). Dividing by the sum of the quantized weights
makes every row's weights sum to exactly 1 after rounding. Measured on ``minilm-l6``
(heads split, everything but attention at 16 bit, 1,000 pairs at sequence 256): Softmax
96.8 %, ``g = 1.5`` 98.2 %, **2: 97.7 %** (embedding cosine error 5.3e-4 -> 1.9e-4), 4:
97.1 %, 8: 96.8 %, 16: 94.3 %; uncapped 88.5 %. Default :data:`GROWTH` = 2.

Sites: a Softmax over the last axis whose output is read only by a MatMul, as its first
operand, whose second operand is an activation (attention; run ``headsplit`` first: it
matches Softmax chains, so ``rowscale`` goes after it). Anything else is left, with the
reason. Plan ``<Softmax>/w`` at 8 bit (it is the attention MatMul's input:
``hailo.attention_16bit`` says so) and the row statistics (``/rowmax``, ``/shift``,
``/exp``, ``/z``, ``/f`` -- the ``/cap`` division joins its group -- ``/sum``) and ``<MatMul>/norm`` at 16 bit where the
size rules allow (with heads split, ``/shift`` and ``/exp`` hold ``T x T`` values per head).

**Unverified on a device**: ``ReduceMax``, ``Exp``, ``ReduceSum``, a division and ``Min``
in place of the Softmax are layers the DFC lists, but this composition compiling and
running at these precisions is not a measurement here (:data:`UNVERIFIED`). The FP32
function is unchanged up to float rounding (checked by the caller).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantscope.model.load import Model
from quantscope.repair import Change, Repair, attr, consumers_of, rewritten, spliced

UNVERIFIED = (
    "unverified on a device: the Softmax becomes ReduceMax, Exp, ReduceSum, Div, Min and "
    "Mul layers and the context a Div; that the DFC compiles them at these precisions is "
    "not a measurement"
)
METADATA_KEY = "quantscope.rowscale"
GROWTH = 2.0  # most the context MatMul's output grows (measured best of 1.5-16, above)
NEW_PARTS = ("rowmax", "shift", "exp", "z", "cap", "f", "w", "sum")  # node suffixes


def _opset(model: Model) -> int:
    return max((o.version for o in model.proto.opset_import if o.domain in ("", "ai.onnx")),
               default=0)


def _reduce(op: str, x: str, out: str, name: str, opset: int) -> onnx.NodeProto:
    """ReduceMax / ReduceSum over the last axis, keepdims (axes as input from opset 18;
    ReduceSum from 13)."""
    as_input = opset >= 18 or (op == "ReduceSum" and opset >= 13)
    if as_input:
        return helper.make_node(op, [x, "rowscale/axes"], [out], name=name, keepdims=1)
    return helper.make_node(op, [x], [out], name=name, keepdims=1, axes=[-1])


def _site(node: onnx.NodeProto, readers: dict[str, list[onnx.NodeProto]],
          inits: set[str], rank: int | None) -> str | None:
    """Why this Softmax is not a site (None: it is one)."""
    axis = attr(node, "axis", -1)
    if axis != -1 and (rank is None or axis != rank - 1):
        return f"Softmax over axis {axis}, not the last axis"
    users = readers.get(node.output[0], [])
    if len(users) != 1 or users[0].op_type != "MatMul":
        return "its output is not read by exactly one MatMul"
    mm = users[0]
    if mm.input[0] != node.output[0]:
        return "the MatMul reads it as its second operand"
    if mm.input[1] in inits:
        return "the MatMul's other operand is a weight, not an activation"
    return None


def rowscale(model: Model, *, growth: float = GROWTH) -> Repair:
    """The attention weights of every site scaled per row by ``min(Z, growth)``."""
    if not growth >= 1.0:
        raise ValueError(f"growth must be >= 1 (1 is the Softmax itself), got {growth}")
    opset = _opset(model)
    readers = consumers_of(model.graph)
    inits = {t.name for t in model.graph.initializer}
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in
             [*model.graph.value_info, *model.graph.input, *model.graph.output]
             if v.type.tensor_type.HasField("shape")}
    before: dict[str, list[onnx.NodeProto]] = {}
    after: dict[str, list[onnx.NodeProto]] = {}
    rewire: dict[str, tuple[list[str], list[str]]] = {}
    dropped: set[str] = set()
    changes: list[Change] = []
    skipped: list[tuple[str, str]] = []
    for n in model.graph.node:
        if n.op_type != "Softmax":
            continue
        why = _site(n, readers, inits, ranks.get(n.input[0]))
        if why is not None:
            skipped.append((n.name, why))
            continue
        s, y, b = n.input[0], n.output[0], n.name
        mm = readers[y][0]
        c = mm.output[0]
        t = {p: f"{y}/{p}" for p in NEW_PARTS}
        before[mm.name] = [
            _reduce("ReduceMax", s, t["rowmax"], f"{b}/rowmax", opset),
            helper.make_node("Sub", [s, t["rowmax"]], [t["shift"]], name=f"{b}/shift"),
            helper.make_node("Exp", [t["shift"]], [t["exp"]], name=f"{b}/exp"),
            _reduce("ReduceSum", t["exp"], t["z"], f"{b}/z", opset),
            helper.make_node("Div", ["rowscale/growth", t["z"]], [t["cap"]], name=f"{b}/cap"),
            helper.make_node("Min", [t["cap"], "rowscale/one"], [t["f"]], name=f"{b}/f"),
            helper.make_node("Mul", [t["exp"], t["f"]], [t["w"]], name=f"{b}/w"),
            _reduce("ReduceSum", t["w"], t["sum"], f"{b}/sum", opset),
        ]
        rewire[mm.name] = ([t["w"], mm.input[1]], [f"{c}/rowscaled"])
        after[mm.name] = [helper.make_node("Div", [f"{c}/rowscaled", t["sum"]], [c],
                                           name=f"{mm.name}/norm")]
        dropped.add(b)
        changes.append(Change(tensor=t["w"], kind="new",
                              note=f"attention weights of '{b}' x min(Z, {growth:g}); "
                              f"'{mm.name}/norm' divides the context by their sum"))
    if not changes:
        return Repair(name="rowscale", reason="no attention Softmax found"
                      + (f" ({skipped[0][0]}: {skipped[0][1]})" if skipped else ""),
                      proto=model.proto, skipped=tuple(skipped))
    copy = onnx.ModelProto()
    copy.CopyFrom(model.proto)  # spliced edits the MatMuls in place
    kept = [n for n in copy.graph.node if n.name not in dropped]
    order = spliced(kept, before, after, rewire)
    consts = [numpy_helper.from_array(np.array([-1], np.int64), "rowscale/axes"),
              numpy_helper.from_array(np.array(growth, np.float32), "rowscale/growth"),
              numpy_helper.from_array(np.array(1.0, np.float32), "rowscale/one")]
    proto = rewritten(model.proto, order, consts,
                      (METADATA_KEY, f"sites={len(changes)} growth={growth:g}; {UNVERIFIED}"))
    return Repair(
        name="rowscale",
        reason=f"{len(changes)} attention Softmax(es) rewritten: weights scaled per row by "
        f"min(Z, {growth:g}) (groups '<Softmax>/w': keep them at 8 bit), context divided by "
        f"their sum ('<MatMul>/norm'); {UNVERIFIED}",
        proto=proto,
        changes=tuple(changes),
        skipped=tuple(skipped),
        effect=(("sites", float(len(changes))), ("growth", float(growth))),
    )


__all__ = ["GROWTH", "METADATA_KEY", "UNVERIFIED", "rowscale"]
