"""Legalising rewrite: token-wise layers split into chunks along the sequence (``tokensplit``).

Hailo's DFC 5.3 refuses a 16-bit activation tensor of [256, 384] on a normalization or
elementwise layer ("needs super-defuse", which only conv kinds have; target rule
``hailo.super_defuse``), while the same layers at 128 tokens are below the limit. A
residual Add and a LayerNorm work on each token alone, so a layer over ``S`` tokens is
exactly ``ceil(S / chunk)`` layers over ``chunk`` tokens each. This rewrite does that by
hand, which is what super-defuse would do for a conv:

=================  ==================================================================
before             ``a [B,S,H], r [B,S,H] -> Add -> s -> LayerNorm -> y [B,S,H]``
after              ``Slice(a, tokens i*chunk .. (i+1)*chunk) -> Add/tok{i} -> s/tok{i}
                   -> LayerNorm/tok{i} -> y/tok{i}`` for every chunk ``i``; a Concat
                   along the sequence writes ``y`` for every reader that is not split
                   (Q/K/V, the FFN); the residual stream itself stays in chunks from
                   one split layer to the next
=================  ==================================================================

Which groups: every ``normalization`` and ``elementwise`` group whose output is 3-D
``[B, S, H]`` at the given sequence length and whose ops are token-wise
(``LayerNormalization`` over the last axis; ``Add``/``Sub``/``Mul``/``Div`` whose operands
are full ``[B, S, H]`` tensors or constants without a sequence dim; a ``ReduceMean`` over
the last axis; unary elementwise ops). Anything else is left whole, with the reason.

Names: a split node is ``<node>/tok<i>`` and writes ``<tensor>/tok<i>``: a plan names the
chunk groups (``<group>/tok<i>``); every tensor read outside keeps its name (the Concat
writes it), so the graph's inputs, outputs and other layers are unchanged. The Slice is a
pass-through (it shares its input's encoding); the Concat is a layer of its own
(``other`` kind) and is quantized at the plan's precision like any layer output.

The last chunk runs to the end of the sequence, so inputs longer than ``seq_len`` still
run (with a wider last chunk), and a chunk past the end of a shorter input is empty.

That the DFC compiles the chunks at 16 bit is the rule's size limit applied to each
chunk, not a measurement: the remedy is **unverified on a device** (:data:`UNVERIFIED`).
The FP32 function is unchanged (checked on the feeds by the caller).
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.model.shapes import resolve_shapes, seq_len_shapes
from quantscope.repair import Change, Repair, attr
from quantscope.targets.profile import op_kind
from quantscope.types import Group, QuantscopeError

UNVERIFIED = (
    "unverified on a device: the chunks are below hailo.super_defuse's size because each "
    "is a layer of its own; that the DFC allocates them without super-defuse is the "
    "rule applied per layer, not a measurement"
)
METADATA_KEY = "quantscope.tokensplit"
SEQ_AXIS = 1  # [B, S, H]
BINARY = frozenset({"Add", "Sub", "Mul", "Div"})
UNARY = frozenset({"Sqrt", "Erf", "Relu", "Tanh", "Sigmoid", "Neg", "Abs", "Identity",
                   "Reciprocal", "Exp", "Log"})
KINDS = ("normalization", "elementwise")  # op kinds of quantscope.targets.profile
_INT64_MAX = np.iinfo(np.int64).max


def _full(shape: tuple | None, seq_len: int) -> bool:
    return shape is not None and len(shape) == 3 and shape[SEQ_AXIS] == seq_len


def _node_why(node: onnx.NodeProto, shapes: dict, consts: set[str], seq_len: int) -> str | None:
    """Why ``node`` is not token-wise on [B, S, H] (None: it is)."""
    out = shapes.get(node.output[0])
    if not _full(out, seq_len):
        return f"{node.op_type} output {list(out) if out else '?'} is not [B, {seq_len}, H]"
    if node.op_type == "LayerNormalization":
        if int(attr(node, "axis", -1)) not in (-1, 2):  # type: ignore[call-overload]
            return "LayerNormalization not over the last axis"
        return None if all(t in consts for t in node.input[1:] if t) else "scale/bias not constant"
    if node.op_type == "ReduceMean":
        axes = attr(node, "axes", None)
        if axes is None and len(node.input) > 1 and node.input[1]:
            return None if node.input[1] in consts else "ReduceMean axes not constant"
        return None if axes is not None and list(axes) in ([-1], [2]) else "ReduceMean not over the last axis"  # type: ignore[arg-type]
    if node.op_type in UNARY:
        return None
    if node.op_type in BINARY or node.op_type == "Pow":
        for t in node.input:
            s = shapes.get(t)
            if t in consts:
                if s is None or (len(s) >= 2 and s[-2] not in (1,)) or len(s) > 3:
                    return f"constant operand '{t}' may have a sequence dim"
            elif not _full(s, seq_len) and not (s is not None and len(s) == 3 and s[SEQ_AXIS] == 1):
                return f"operand '{t}' {list(s) if s else '?'} is neither [B, {seq_len}, H] nor a constant"
        return None
    return f"{node.op_type} is not a token-wise op this rewrite knows"


def _group_why(group: Group, nodes: dict[str, onnx.NodeProto], shapes: dict, consts: set[str],
               seq_len: int) -> str | None:
    if op_kind(group) not in KINDS:
        return f"{op_kind(group)} group"
    for name in group.nodes:
        why = _node_why(nodes[name], shapes, consts, seq_len)
        if why:
            return why
    return None


def _constants(model: Model) -> set[str]:
    out = {t.name for t in model.graph.initializer}
    out |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    return out


def split_tokens(model: Model, *, seq_len: int, chunk: int) -> Repair:
    """The model with its token-wise norm/elementwise layers split into ``chunk``-token layers.

    ``seq_len``: the deployment's sequence length (what legality is computed for);
    ``chunk``: tokens per chunk (``< seq_len``). FP32 function unchanged.
    """
    if chunk < 1 or seq_len <= chunk:
        raise QuantscopeError(
            f"--chunk {chunk} must be at least 1 and below --seq-len {seq_len} "
            "(one chunk is the unsplit model)")
    shapes = resolve_shapes(model, seq_len_shapes(model, seq_len))
    consts = _constants(model)
    nodes = {n.name: n for n in model.graph.node}
    groups = find_groups(model)
    split: set[str] = set()
    skipped: list[tuple[str, str]] = []
    sites: list[str] = []
    for g in groups.groups:
        if op_kind(g) not in KINDS:
            continue
        why = _group_why(g, nodes, shapes, consts, seq_len)
        if why is None:
            split.update(g.nodes)
            sites.append(g.name)
        else:
            skipped.append((g.name, why))
    if not sites:
        return Repair(name="tokensplit", reason="no token-wise normalization or elementwise "
                      f"layer on [B, {seq_len}, H]", proto=model.proto, skipped=tuple(skipped))
    n_chunks = math.ceil(seq_len / chunk)
    made = {o for n in model.graph.node if n.name in split for o in n.output}
    readers_outside: set[str] = set()
    for n in model.graph.node:
        if n.name not in split:
            readers_outside.update(t for t in n.input if t in made)
    readers_outside.update(o.name for o in model.graph.output if o.name in made)

    inits = [
        numpy_helper.from_array(np.array([SEQ_AXIS], np.int64), "tokensplit/axes"),
        *(numpy_helper.from_array(np.array([i * chunk], np.int64), f"tokensplit/start{i}")
          for i in range(n_chunks)),
        *(numpy_helper.from_array(
            np.array([(i + 1) * chunk if i < n_chunks - 1 else _INT64_MAX], np.int64),
            f"tokensplit/end{i}") for i in range(n_chunks)),
    ]
    sliced: set[str] = set()
    order: list[onnx.NodeProto] = []
    changes: list[Change] = []
    for n in model.graph.node:
        if n.name not in split:
            order.append(n)
            continue
        for t in n.input:
            if t and t not in made and t not in consts and t not in sliced \
                    and _full(shapes.get(t), seq_len):
                sliced.add(t)
                for i in range(n_chunks):
                    order.append(helper.make_node(
                        "Slice", [t, f"tokensplit/start{i}", f"tokensplit/end{i}",
                                  "tokensplit/axes"], [f"{t}/tok{i}"], name=f"{t}/slice{i}"))
                changes.append(Change(tensor=t, kind="insert",
                                      note=f"sliced into {n_chunks} chunks of {chunk} tokens"))
        for i in range(n_chunks):
            copy = onnx.NodeProto()
            copy.CopyFrom(n)
            copy.name = f"{n.name}/tok{i}"
            copy.input[:] = [f"{t}/tok{i}" if (t in made or t in sliced) else t for t in n.input]
            copy.output[:] = [f"{o}/tok{i}" if o else o for o in n.output]
            order.append(copy)
        for o in n.output:
            if o in readers_outside:
                order.append(helper.make_node(
                    "Concat", [f"{o}/tok{i}" for i in range(n_chunks)], [o],
                    name=f"{n.name}/concat", axis=SEQ_AXIS))
                changes.append(Change(tensor=o, kind="new",
                                      note=f"Concat of {n_chunks} chunks for its readers"))
    proto = onnx.ModelProto()
    proto.CopyFrom(model.proto)
    del proto.graph.node[:]
    proto.graph.node.extend(order)
    proto.graph.initializer.extend(inits)
    del proto.graph.value_info[:]  # the loader infers them again
    props = {p.key: p.value for p in proto.metadata_props}
    props[METADATA_KEY] = f"seq_len={seq_len} chunk={chunk} groups={len(sites)}; {UNVERIFIED}"
    onnx.helper.set_model_props(proto, props)
    return Repair(
        name="tokensplit",
        reason=f"{len(sites)} token-wise layer(s) on [B, {seq_len}, H] split into {n_chunks} "
        f"chunks of {chunk} tokens (groups '<name>/tok<i>'); {UNVERIFIED}",
        proto=proto,
        changes=tuple(changes),
        skipped=tuple(skipped),
        effect=(("sites", float(len(sites))), ("chunks", float(n_chunks))),
    )





def sample_feeds(model: Model, lengths: tuple[int, ...], *, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Token feeds at each length (ids 100-999, mask 1, type ids 0) to check the function."""
    rng = np.random.default_rng(seed)
    shapes = model.value_shapes()
    types = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    feeds = []
    for n in lengths:
        feed: dict[str, np.ndarray] = {}
        for name in model.input_names():
            shape = shapes.get(name) or ()
            if len(shape) != 2 or types.get(name) not in (onnx.TensorProto.INT64,
                                                          onnx.TensorProto.INT32):
                raise QuantscopeError(
                    f"input '{name}' {list(shape)} is not a [batch, sequence] token input: "
                    "tokensplit checks text encoders with token inputs only")
            dtype = np.int64 if types[name] == onnx.TensorProto.INT64 else np.int32
            if "mask" in name:
                feed[name] = np.ones((2, n), dtype)
            elif "type" in name:
                feed[name] = np.zeros((2, n), dtype)
            else:
                feed[name] = rng.integers(100, 1000, (2, n)).astype(dtype)
        feeds.append(feed)
    return feeds
__all__ = ["METADATA_KEY", "UNVERIFIED", "sample_feeds", "split_tokens"]
