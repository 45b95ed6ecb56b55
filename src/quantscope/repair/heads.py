"""Function-preserving rewrite: multi-head attention split into one layer per head (``headsplit``).

Hailo's DFC 5.3 crashes on 16-bit attention (target rule ``hailo.attention_16bit``), so
the scores, the Softmax and the context MatMul stay at 8 bit. One 8-bit grid then serves
all heads of a layer at once: the sharpest head (scores over tens of logits, a
probability near 1) sets the grid, and a diffuse head (probabilities near ``1/T`` at
``T = 256`` tokens, one step of a [0, 1] grid) is rounded to zero or one step. The heads
are independent computations, so a layer over ``H`` heads is exactly ``H`` layers over
one head each, and each gets its own 8-bit grid:

=================  ==================================================================
before             ``q, k^T, v [B,H,..] -> MatMul -> (Mul/Div scale, Add mask) ->
                   Softmax -> MatMul(., v) -> ctx [B,H,T,d]``
after              ``Slice(q, head h) ... -> MatMul/head{h} -> ... -> Softmax/head{h}
                   -> MatMul/head{h}(., Slice(v, head h)) -> ctx/head{h}`` for every
                   head ``h``; a Concat along the head axis writes ``ctx`` for its
                   readers (the output projection)
=================  ==================================================================

Which attention: every Softmax over the last axis of a rank-4 ``[B, H, Tq, Tk]`` tensor
with a static ``H > 1`` whose input is an activation x activation MatMul of rank-4
operands with ``H`` heads, through a chain of elementwise ops (``Add``/``Sub``/``Mul``/
``Div``/``Where``/``Identity``) whose other operands have no head axis (a scale, an additive mask
``[B,1,1,Tk]``) or exactly ``H`` heads (a position bias: sliced too), and whose output is
read by one MatMul with a rank-4 value operand of ``H`` heads. Each intermediate tensor
must have no other reader. Anything else is left whole, with the reason.

Names: a split node is ``<node>/head<h>`` and writes ``<tensor>/head<h>``: a plan names
the head groups (``<group>/head<h>``); the context tensor keeps its name (the Concat
writes it), so the graph's inputs, outputs and other layers are unchanged. The Slices are
pass-throughs (they share their input's encoding); the Concat is a layer of its own
(``other`` kind), quantized at the plan's precision like any layer output -- the per-head
context values are requantized once onto the one grid the unsplit context had.

The MACs are the same; the layer count grows by ``(H - 1)`` per op of each attention.
That the DFC compiles ``H`` small attention layers like one big one is **unverified on a
device** (:data:`UNVERIFIED`). The FP32 function is unchanged (checked on the feeds by
the caller).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantscope.model.load import Model
from quantscope.model.shapes import Shapes, resolve_shapes, seq_len_shapes
from quantscope.repair import Change, Repair, attr, rewritten

UNVERIFIED = (
    "unverified on a device: each head is a layer of its own with its own 8-bit grid; "
    "that the DFC compiles and schedules them like the unsplit attention is not a "
    "measurement"
)
METADATA_KEY = "quantscope.headsplit"
HEAD_AXIS = 1  # [B, H, T, d]
PROBE_LEN = 16  # tokens, to infer head counts when no --seq-len is given
CHAIN = frozenset({"Add", "Sub", "Mul", "Div", "Where", "Identity"})


def _heads(shape: tuple | None) -> int | None:
    """The head count of a rank-4 [B, H, ., .] shape (None: not rank 4 or H unknown)."""
    if shape is None or len(shape) != 4 or not isinstance(shape[HEAD_AXIS], int):
        return None
    return int(shape[HEAD_AXIS])


def _operand_heads(t: str, shapes: dict, consts: dict) -> int | None:
    """Heads of a side operand: 1 when it has no head axis (broadcast), else its H."""
    shape = consts[t] if t in consts else shapes.get(t)
    if shape is None:
        return None
    if len(shape) < 3:  # a scalar, a [Tk] or [Tq, Tk] bias: broadcast over heads
        return 1
    head = shape[len(shape) - 3]  # right-aligned broadcasting: [.., H, Tq, Tk]
    return int(head) if isinstance(head, int) else None


def _attention(softmax: onnx.NodeProto, producer: dict, readers: dict, shapes: dict,
               consts: dict) -> tuple[list[onnx.NodeProto], str | None]:
    """The nodes of one attention (scores MatMul .. context MatMul) or why not."""
    out = softmax.output[0]
    heads = _heads(shapes.get(out))
    if heads is None:
        return [], f"Softmax output {list(shapes.get(out) or ())} is not [B, H, Tq, Tk]"
    if heads < 2:
        return [], "one head"
    if int(attr(softmax, "axis", -1)) not in (-1, 3):  # type: ignore[call-overload]
        return [], "Softmax not over the last axis"
    chain: list[onnx.NodeProto] = []
    t = softmax.input[0]
    while True:
        node = producer.get(t)
        if node is None:
            return [], f"no MatMul before the Softmax (reached '{t}')"
        if len(readers.get(t, ())) != 1:
            return [], f"'{t}' has readers outside the attention"
        if node.op_type == "MatMul":
            if any(_heads(shapes.get(i)) != heads or i in consts for i in node.input):
                return [], "the scores MatMul is not activation x activation over the heads"
            chain.append(node)
            break
        if node.op_type not in CHAIN:
            return [], f"{node.op_type} between the scores MatMul and the Softmax"
        ins = [i for i in node.input if i]
        main = [i for i in ins if i not in consts and _heads(shapes.get(i)) == heads
                and producer.get(i) is not None and producer[i].op_type in (*CHAIN, "MatMul")
                and len(readers.get(i, ())) == 1]
        if len(main) != 1:
            return [], f"{node.op_type} '{node.name}' has no single score operand"
        for i in ins:
            if i != main[0] and _operand_heads(i, shapes, consts) not in (1, heads):
                return [], f"operand '{i}' of '{node.name}' has neither 1 nor {heads} heads"
        chain.append(node)
        t = main[0]
    after = readers.get(out, [])
    if len(after) != 1 or after[0].op_type != "MatMul" or after[0].input[0] != out:
        return [], "the Softmax output is not read by one MatMul (probabilities x values)"
    context = after[0]
    if _heads(shapes.get(context.input[1])) != heads or context.input[1] in consts:
        return [], "the context MatMul's values are not [B, H, Tk, d]"
    if _heads(shapes.get(context.output[0])) != heads:
        return [], "the context MatMul's output is not [B, H, Tq, d]"
    return [*reversed(chain), softmax, context], None


def _constants(model: Model) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {t.name: tuple(t.dims) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant":
            value = next((a.t for a in n.attribute if a.name == "value"), None)
            if value is not None:
                out[n.output[0]] = tuple(value.dims)
    return out


_Site = tuple[list[onnx.NodeProto], int]  # one attention's nodes (scores .. context), heads


def split_heads(model: Model, *, shapes: Shapes | None = None,
                seq_len: int | None = None) -> Repair:
    """The model with each multi-head attention split into one layer per head.

    ``shapes``: concrete input shapes (``--input-shape``), ``seq_len``: a sequence length
    for token inputs (``--seq-len``). The rewrite does not depend on the length: token
    inputs with symbolic dims are resolved at :data:`PROBE_LEN` tokens when none is given,
    only to infer the head count. FP32 function unchanged.
    """
    shapes = _head_shapes(model, shapes, seq_len)
    consts = _constants(model)
    sites, skipped = _attentions(model, shapes, consts)
    if not sites:
        return Repair(name="headsplit", reason="no multi-head attention to split",
                      proto=model.proto, skipped=skipped)
    most = max(h for _, h in sites)
    order, inits, changes = _split_graph(model, sites, shapes, consts)
    proto = rewritten(model.proto, order, inits, (
        METADATA_KEY, f"attentions={len(sites)} heads={most}; {UNVERIFIED}"))
    heads_total = sum(h for _, h in sites)
    return Repair(
        name="headsplit",
        reason=f"{len(sites)} attention(s) split into {heads_total} per-head layers "
        f"(groups '<name>/head<h>'), each with its own grid; {UNVERIFIED}",
        proto=proto,
        changes=changes,
        skipped=skipped,
        effect=(("attentions", float(len(sites))), ("heads", float(most))),
    )


def _head_shapes(model: Model, shapes: Shapes | None, seq_len: int | None) -> Shapes:
    """Every tensor's shape at the given input shapes; token inputs with symbolic dims at
    ``seq_len`` (or :data:`PROBE_LEN` tokens: only the head count is read)."""
    given = dict(shapes or {})
    known = model.value_shapes()
    tokens = [n for n in model.input_names() if len(known.get(n) or ()) == 2
              and n not in given and not all(isinstance(d, int) for d in known[n])]
    if seq_len is not None or tokens:
        given.update({k: v for k, v in seq_len_shapes(model, seq_len or PROBE_LEN).items()
                      if k not in given})
    return resolve_shapes(model, given or None)


def _attentions(model: Model, shapes: Shapes, consts: dict[str, tuple[int, ...]]
                ) -> tuple[list[_Site], tuple[tuple[str, str], ...]]:
    """Every Softmax's attention that can be split (with its head count), and the others
    with the reason."""
    producer = {o: n for n in model.graph.node for o in n.output if o}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for t in n.input:
            if t:
                readers.setdefault(t, []).append(n)
    for o in model.graph.output:
        readers.setdefault(o.name, []).append(onnx.NodeProto(name="<graph output>"))
    sites: list[_Site] = []
    skipped: list[tuple[str, str]] = []
    for n in model.graph.node:
        if n.op_type != "Softmax":
            continue
        nodes, why = _attention(n, producer, readers, shapes, consts)
        if why:
            skipped.append((n.name, why))
        else:
            sites.append((nodes, int(_heads(shapes.get(n.output[0])) or 0)))
    return sites, tuple(skipped)


def _split_graph(model: Model, sites: list[_Site], shapes: Shapes,
                 consts: dict[str, tuple[int, ...]]
                 ) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], tuple[Change, ...]]:
    """The node order with each attention written at its context MatMul, once per head
    (a Slice per head of each input with the heads, a Concat of the heads' contexts); the
    Slice bounds' initializers; the changes."""
    most = max(h for _, h in sites)
    axis_inits: dict[str, onnx.TensorProto] = {}
    inits = [*(numpy_helper.from_array(np.array([h], np.int64), f"headsplit/start{h}")
               for h in range(most)),
             *(numpy_helper.from_array(np.array([h + 1], np.int64), f"headsplit/end{h}")
               for h in range(most))]
    at: dict[str, _Site] = {nodes[-1].name: (nodes, h) for nodes, h in sites}
    inside = {n.name for nodes, _ in sites for n in nodes}
    sliced: set[str] = set()
    order: list[onnx.NodeProto] = []
    changes: list[Change] = []
    for n in model.graph.node:
        if n.name in inside and n.name not in at:
            continue  # written with its attention, at the context MatMul
        if n.name not in at:
            order.append(n)
            continue
        nodes, heads = at[n.name]
        made = {o for m in nodes for o in m.output}
        for t in (t for m in nodes for t in m.input):
            if t and t not in made and t not in sliced and \
                    _operand_heads(t, shapes, consts) == heads:
                sliced.add(t)
                order.extend(_head_slices(t, heads, consts, shapes, axis_inits))
                changes.append(Change(tensor=t, kind="insert",
                                      note=f"sliced into {heads} heads"))
        order.extend(_head_copies(nodes, heads, made | sliced))
        out = n.output[0]
        order.append(helper.make_node("Concat", [f"{out}/head{h}" for h in range(heads)],
                                      [out], name=f"{n.name}/concat", axis=HEAD_AXIS))
        changes.append(Change(tensor=out, kind="new",
                              note=f"Concat of {heads} heads for its readers"))
    return order, [*inits, *axis_inits.values()], tuple(changes)


def _head_slices(t: str, heads: int, consts: dict[str, tuple[int, ...]], shapes: Shapes,
                 axis_inits: dict[str, onnx.TensorProto]) -> list[onnx.NodeProto]:
    """A Slice per head of ``t`` along its head axis (right-aligned: [.., H, Tq, Tk]);
    the axis initializer added to ``axis_inits`` when it is new."""
    rank = len(consts[t] if t in consts else shapes[t])
    axes = f"headsplit/axes{rank - 3}"  # right-aligned: [.., H, Tq, Tk]
    if axes not in axis_inits:
        axis_inits[axes] = numpy_helper.from_array(np.array([rank - 3], np.int64), axes)
    return [helper.make_node("Slice", [t, f"headsplit/start{h}", f"headsplit/end{h}", axes],
                             [f"{t}/head{h}"], name=f"{t}/slice_head{h}")
            for h in range(heads)]


def _head_copies(nodes: list[onnx.NodeProto], heads: int, sliced: set[str]
                 ) -> list[onnx.NodeProto]:
    """The attention's nodes once per head (``<name>/head<h>``), head by head, reading the
    heads of the ``sliced`` tensors."""
    out = []
    for h in range(heads):
        for m in nodes:
            copy = onnx.NodeProto()
            copy.CopyFrom(m)
            copy.name = f"{m.name}/head{h}"
            copy.input[:] = [f"{t}/head{h}" if t in sliced else t for t in m.input]
            copy.output[:] = [f"{o}/head{h}" if o else o for o in m.output]
            out.append(copy)
    return out


__all__ = ["METADATA_KEY", "UNVERIFIED", "split_heads"]
