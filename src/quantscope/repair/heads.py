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

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantscope.model.load import Model
from quantscope.model.shapes import Shapes, resolve_shapes, seq_len_shapes
from quantscope.model.units import HEADS_KEY
from quantscope.repair import Change, Repair, attr, rewritten

UNVERIFIED = (
    "unverified on a device: each head is a layer of its own with its own 8-bit grid; "
    "that the DFC compiles and schedules them like the unsplit attention is not a "
    "measurement"
)
METADATA_KEY = HEADS_KEY  # the analysis sweeps a layer's heads as one (model.units)
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


# --- the per-head form of a token-split model (tokensplit --linears on a head-split one) ---

TOKEN_AXIS = 1  # [B, T, C] (tokensplit's SEQ_AXIS)


@dataclass(frozen=True)
class PerHead:
    """The node list of a token-split, head-split model with Q/K/V and the heads' context
    kept per head (:func:`keep_heads`): ``nodes`` in order, the ``initializers`` to add,
    the ``changes``, the tensors no longer written (``removed``: full-width Concats and
    what only they fed) and the attentions left full width (``skipped``, with the reason)."""

    nodes: tuple[onnx.NodeProto, ...]
    initializers: tuple[onnx.TensorProto, ...]
    changes: tuple[Change, ...]
    removed: frozenset[str]
    skipped: tuple[tuple[str, str], ...]
    qkv: int  # full-width Q/K/V Concats replaced by per-head ones
    contexts: int  # heads' context Concats replaced by per-chunk ones
    relays: int = 0  # values passed through identity Linears (relay_values)


def _readers(nodes: Sequence[onnx.NodeProto]) -> dict[str, list[onnx.NodeProto]]:
    out: dict[str, list[onnx.NodeProto]] = {}
    for n in nodes:
        for t in n.input:
            if t:
                out.setdefault(t, []).append(n)
    return out


def _int_attr(node: onnx.NodeProto, name: str, default: int) -> int:
    return int(attr(node, name, default))  # type: ignore[call-overload]


def _perm(node: onnx.NodeProto) -> tuple[int, ...]:
    return tuple(int(p) for p in attr(node, "perm", ()))  # type: ignore[union-attr]


def _one(readers: dict[str, list[onnx.NodeProto]], t: str, op: str) -> onnx.NodeProto | None:
    """The one reader of ``t`` besides ``Shape`` ops (a Reshape's target computed from
    the tensor: dropped with the Reshape when nothing else reads it), if it is an ``op``."""
    found = [n for n in readers.get(t, []) if n.op_type != "Shape"]
    return found[0] if len(found) == 1 and found[0].op_type == op else None


def _sliced_all(readers: list[onnx.NodeProto], t: str, prefix: str, axes: str, count: int,
                tag: str) -> bool:
    """Whether ``readers`` are exactly the ``count`` Slices a rewrite wrote of ``t``
    (``<prefix>/start<k>``, ``<prefix>/end<k>``, ``axes``, output ``<t>/<tag><k>``)."""
    got = sorted((list(n.input), list(n.output)) for n in readers if n.op_type == "Slice")
    want = sorted(([t, f"{prefix}/start{k}", f"{prefix}/end{k}", axes], [f"{t}/{tag}{k}"])
                  for k in range(count))
    return len(readers) == count and got == want


@dataclass(frozen=True)
class _Qkv:
    concat: onnx.NodeProto  # the full-width Concat of the Linear's token chunks
    reshape: onnx.NodeProto  # [B, T, C] -> [B, T, H, d]
    transpose: onnx.NodeProto  # -> [B, H, T, d] or [B, H, d, T]
    heads: int
    width: int  # d


@dataclass(frozen=True)
class _Context:
    concat: onnx.NodeProto  # headsplit's Concat of the heads' contexts [B, H, T, d]
    transpose: onnx.NodeProto  # -> [B, T, H, d]
    reshape: onnx.NodeProto  # -> [B, T, C], read by tokensplit's chunk Slices only
    heads: int
    hidden: int  # C


def _match_qkv(cat: onnx.NodeProto, readers: dict, shapes: Shapes, n_chunks: int
               ) -> _Qkv | str | None:
    """Q, K or V as tokensplit and headsplit left it: a Concat of a split Linear's chunks,
    Reshape to heads, Transpose, headsplit's Slices; the reason when it almost is; None:
    not such a Concat."""
    o = cat.output[0]
    if _int_attr(cat, "axis", 0) != TOKEN_AXIS or \
            list(cat.input) != [f"{o}/tok{i}" for i in range(n_chunks)]:
        return None
    reshape = _one(readers, o, "Reshape")
    so, sr = shapes.get(o), shapes.get(reshape.output[0]) if reshape else None
    if reshape is None or so is None or sr is None or len(so) != 3 or len(sr) != 4:
        return None  # not read as heads (a layer's output read by Shape, the graph output)
    heads, width = sr[2], sr[3]
    if not (isinstance(heads, int) and isinstance(width, int) and so[2] == heads * width):
        return f"'{o}' {list(so)} is not reshaped into [B, T, H, d] heads"
    transpose = _one(readers, reshape.output[0], "Transpose")
    perm = _perm(transpose) if transpose else ()
    if transpose is None or len(perm) != 4 or perm[:2] != (0, 2):
        return f"'{reshape.output[0]}' is not transposed to [B, H, ., .]"
    t = transpose.output[0]
    if not _sliced_all(readers.get(t, []), t, "headsplit", f"headsplit/axes{HEAD_AXIS}",
                       heads, "head"):
        return f"'{t}' is not read by headsplit's per-head Slices only"
    return _Qkv(cat, reshape, transpose, heads, width)


def _match_context(cat: onnx.NodeProto, readers: dict, shapes: Shapes, n_chunks: int
                   ) -> _Context | str | None:
    """The heads' contexts as headsplit and tokensplit left them: a Concat over the heads,
    Transpose to [B, T, H, d], Reshape to [B, T, C], tokensplit's chunk Slices (the
    output projection split by ``--linears``); the reason when it almost is."""
    c = cat.output[0]
    sc = shapes.get(c)
    if _int_attr(cat, "axis", 0) != HEAD_AXIS or sc is None or len(sc) != 4 or \
            list(cat.input) != [f"{c}/head{h}" for h in range(len(cat.input))]:
        return None
    heads, width = len(cat.input), sc[3]
    transpose = _one(readers, c, "Transpose")
    if transpose is None or _perm(transpose) != (0, 2, 1, 3):
        return f"the heads' context '{c}' is not transposed to [B, T, H, d]"
    reshape = _one(readers, transpose.output[0], "Reshape")
    x = reshape.output[0] if reshape else ""
    sx = shapes.get(x)
    if reshape is None or sx is None or len(sx) != 3 or not isinstance(width, int) \
            or sx[2] != heads * width:
        return f"the heads' context '{c}' is not merged into [B, T, H*d]"
    if not _sliced_all(readers.get(x, []), x, "tokensplit", "tokensplit/axes", n_chunks, "tok"):
        return (f"'{x}' is read whole, not in token chunks (tokensplit --linears splits "
                "the output projection)")
    return _Context(cat, transpose, reshape, heads, int(sx[2]))


class _Inits:
    """The int64 initializers the per-head nodes read, made once each."""

    def __init__(self) -> None:
        self.made: dict[str, onnx.TensorProto] = {}

    def __call__(self, name: str, values: Sequence[int]) -> str:
        if name not in self.made:
            self.made[name] = numpy_helper.from_array(np.array(values, np.int64), name)
        return name

    def add(self, tensor: onnx.TensorProto) -> None:
        self.made[tensor.name] = tensor


def _qkv_nodes(m: _Qkv, n_chunks: int, inits: _Inits, *, relay: bool = False
               ) -> list[onnx.NodeProto]:
    """Per head ``h``: each chunk's columns of head ``h`` (Slice), a Concat over the
    tokens ([B, T, d]), Reshape to [B, T, 1, d] and the original Transpose: the tensor
    headsplit's Slice of head ``h`` wrote, under its name. ``relay``: a [d, d] identity
    MatMul (``<Concat>/head<h>/relay``) after the Concat, so attention reads a Linear's
    output and the Concat a Linear reads (FP32 exact: ``x @ I = x``)."""
    o, r, t, d = m.concat.output[0], m.reshape.output[0], m.transpose.output[0], m.width
    axes = inits("tokensplit/axes2", [2])
    shape = inits(f"tokensplit/head_shape{d}", [0, 0, 1, d])
    out: list[onnx.NodeProto] = []
    for h in range(m.heads):
        lo, hi = inits(f"tokensplit/col{h * d}", [h * d]), inits(f"tokensplit/col{(h + 1) * d}",
                                                                  [(h + 1) * d])
        out += [helper.make_node("Slice", [f"{o}/tok{i}", lo, hi, axes], [f"{o}/tok{i}/head{h}"],
                                 name=f"{o}/tok{i}/slice_head{h}") for i in range(n_chunks)]
        cat = f"{o}/head{h}/cat" if relay else f"{o}/head{h}"
        out.append(helper.make_node("Concat", [f"{o}/tok{i}/head{h}" for i in range(n_chunks)],
                                    [cat], name=f"{m.concat.name}/head{h}", axis=TOKEN_AXIS))
        if relay:
            eye = f"tokensplit/relay{h}_{m.concat.name}"
            inits.add(numpy_helper.from_array(np.eye(d, dtype=np.float32), eye))
            out.append(helper.make_node("MatMul", [cat, eye], [f"{o}/head{h}"],
                                        name=f"{m.concat.name}/head{h}/relay"))
        out += [
            helper.make_node("Reshape", [f"{o}/head{h}", shape], [f"{r}/head{h}"],
                             name=f"{m.reshape.name}/head{h}"),
            helper.make_node("Transpose", [f"{r}/head{h}"], [f"{t}/head{h}"],
                             name=f"{m.transpose.name}/head{h}", perm=list(_perm(m.transpose))),
        ]
    return out


def _context_nodes(m: _Context, n_chunks: int, inits: _Inits) -> list[onnx.NodeProto]:
    """Per token chunk ``i``: each head's context rows of chunk ``i`` (Slice), a Concat
    over the heads ([B, H, chunk, d]), the original Transpose and a Reshape to [B, chunk,
    C]: the tensor tokensplit's Slice of chunk ``i`` wrote, under its name."""
    c, u, x = m.concat.output[0], m.transpose.output[0], m.reshape.output[0]
    axes = inits("tokensplit/axes2", [2])
    shape = inits(f"tokensplit/merge_shape{m.hidden}", [0, 0, m.hidden])
    out: list[onnx.NodeProto] = []
    for i in range(n_chunks):
        out += [helper.make_node("Slice", [f"{c}/head{h}", f"tokensplit/start{i}",
                                           f"tokensplit/end{i}", axes], [f"{c}/head{h}/tok{i}"],
                                 name=f"{c}/head{h}/slice{i}") for h in range(m.heads)]
        out += [
            helper.make_node("Concat", [f"{c}/head{h}/tok{i}" for h in range(m.heads)],
                             [f"{c}/tok{i}"], name=f"{m.concat.name}/tok{i}", axis=HEAD_AXIS),
            helper.make_node("Transpose", [f"{c}/tok{i}"], [f"{u}/tok{i}"],
                             name=f"{m.transpose.name}/tok{i}", perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", [f"{u}/tok{i}", shape], [f"{x}/tok{i}"],
                             name=f"{m.reshape.name}/tok{i}"),
        ]
    return out


def keep_heads(nodes: Sequence[onnx.NodeProto], shapes: Shapes, n_chunks: int,
               outputs: Collection[str], *, relay_values: bool = False) -> PerHead:
    """A token-split (``--linears``), head-split graph with no full-width [T, C] Concat
    between the token chunks and the heads (``nodes``: the token-split node list;
    ``shapes``: the unsplit model's tensor shapes at the split length; ``outputs``: the
    graph outputs).

    =============  ====================================================================
    Q, K, V        before: the Linear's chunks ``-> Concat [B,T,C] -> Reshape -> Transpose
                   -> Slice(head h)``; after: per head, each chunk's columns of head
                   ``h`` ``-> Concat over tokens [B,T,d] -> Reshape [B,T,1,d] ->
                   Transpose`` (the tensor headsplit's Slice wrote, same name)
    context        before: ``heads -> Concat [B,H,T,d] -> Transpose -> Reshape [B,T,C]
                   -> Slice(chunk i)``; after: per chunk, each head's rows of chunk ``i``
                   ``-> Concat over heads [B,H,chunk,d] -> Transpose -> Reshape
                   [B,chunk,C]`` (the tensor tokensplit's Slice wrote, same name)
    =============  ====================================================================

    The largest new Concat holds ``T * d`` (Q/K/V) or ``chunk * C`` (context) values per
    frame. ``relay_values``: each head's values (the context MatMul's second operand) pass
    through a [d, d] identity MatMul after their Concat, so the attention reads a Linear's
    output (which ``hailo.attention_16bit`` lets be 16 bit) instead of a Concat's (which
    it keeps at 8 bit); FP32 exact, ``T * d * d`` MACs per head. Nodes no longer read (the
    full-width Concats, their Reshapes' shape computations, a layer output Concat read
    only by them) are dropped."""
    readers = _readers(nodes)
    position = {n.name: k for k, n in enumerate(nodes)}
    inits = _Inits()
    before: dict[str, list[onnx.NodeProto]] = {}
    gone: set[str] = set()
    changes: list[Change] = []
    skipped: list[tuple[str, str]] = []
    qkv = contexts = relays = 0
    for n in nodes:
        if n.op_type != "Concat":
            continue
        found = _match_qkv(n, readers, shapes, n_chunks) or \
            _match_context(n, readers, shapes, n_chunks)
        if found is None:
            continue
        if isinstance(found, str):
            skipped.append((n.output[0], found))
            continue
        if isinstance(found, _Qkv):
            t = found.transpose.output[0]
            heads = readers[t]
            relay = relay_values and _is_values(found, readers)
            before.setdefault(n.name, []).extend(_qkv_nodes(found, n_chunks, inits,
                                                            relay=relay))
            gone.update(s.name for s in heads)  # the rest goes when nothing reads it
            changes.append(Change(tensor=n.output[0], kind="split", note=(
                f"kept per head: {found.heads} Concats over tokens of [B, T, {found.width}] "
                "instead of one full-width Concat"
                + (", each read by a [d, d] identity Linear (the values)" if relay else ""))))
            qkv += 1
            relays += relay
            continue
        x = found.reshape.output[0]
        first = min(readers[x], key=lambda s: position[s.name])
        before.setdefault(first.name, []).extend(_context_nodes(found, n_chunks, inits))
        gone.update(s.name for s in readers[x])
        changes.append(Change(tensor=n.output[0], kind="split", note=(
            f"kept per head until each token chunk: {n_chunks} Concats over the heads of "
            f"[B, {found.heads}, chunk, d] instead of one full-width Concat")))
        contexts += 1
    order = [m for n in nodes for m in (*before.get(n.name, ()), *(() if n.name in gone
                                                                    else (n,)))]
    order, dropped = _drop_unread(order, nodes, outputs)
    removed = {o for n in nodes if n.name in gone or n.name in dropped for o in n.output}
    return PerHead(nodes=tuple(order), initializers=tuple(inits.made.values()),
                   changes=tuple(changes), removed=frozenset(removed - _written(order)),
                   skipped=tuple(skipped), qkv=qkv, contexts=contexts, relays=relays)


def _is_values(m: _Qkv, readers: dict[str, list[onnx.NodeProto]]) -> bool:
    """Whether ``m`` is the attention's values: [B, H, T, d] read as a MatMul's second
    operand (the keys, also a second operand, are [B, H, d, T])."""
    head0 = f"{m.transpose.output[0]}/head0"
    return _perm(m.transpose)[2:] == (1, 3) and any(
        r.op_type == "MatMul" and r.input[1] == head0 for r in readers.get(head0, []))


def _written(nodes: Sequence[onnx.NodeProto]) -> set[str]:
    return {o for n in nodes for o in n.output}


def _drop_unread(order: list[onnx.NodeProto], before: Sequence[onnx.NodeProto],
                 outputs: Collection[str]) -> tuple[list[onnx.NodeProto], set[str]]:
    """``order`` without the nodes that nothing reads any more (none of their outputs read,
    nor a graph output), leaving those that were unread before as they were."""
    was = _readers(before)
    unread_before = {n.name for n in before
                     if not any(o in was or o in outputs for o in n.output if o)}
    dropped: set[str] = set()
    while True:
        now = _readers(order)
        dead = {n.name for n in order if n.name not in unread_before
                and not any(o in now or o in outputs for o in n.output if o)}
        if not dead:
            return order, dropped
        dropped |= dead
        order = [n for n in order if n.name not in dead]


__all__ = ["METADATA_KEY", "UNVERIFIED", "PerHead", "keep_heads", "split_heads"]
