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
``[B, T, H]`` with the stream's token count ``T`` (``--seq-len`` for token inputs, else the
static or given input shape) and whose ops are token-wise (``LayerNormalization`` over the
last axis; ``Add``/``Sub``/``Mul``/``Div``/``Pow`` whose operands are ``[B, T, H]``,
``[B, T, 1]`` or ``[B, 1, H]`` tensors or constants without a token dim; a ``ReduceMean``
over the last axis; unary elementwise ops); with ``linears`` also the weighted MatMul
groups (2-D constant weight, bias, activation). Anything else is left whole, with the
reason.

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
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.model.shapes import Shapes, resolve_shapes, seq_len_shapes
from quantscope.model.units import TOKENS_KEY
from quantscope.repair import Change, Repair, attr, rewritten
from quantscope.repair.heads import METADATA_KEY as HEADS_KEY
from quantscope.repair.heads import keep_heads
from quantscope.targets.profile import op_kind
from quantscope.types import Group, QuantscopeError

UNVERIFIED = (
    "unverified on a device: the chunks are below hailo.super_defuse's size because each "
    "is a layer of its own; that the DFC allocates them without super-defuse is the "
    "rule applied per layer, not a measurement"
)
METADATA_KEY = TOKENS_KEY  # the analysis sweeps a layer's chunks as one (model.units)
SEQ_AXIS = 1  # [B, T, H]
BINARY = frozenset({"Add", "Sub", "Mul", "Div"})
UNARY = frozenset({"Sqrt", "Erf", "Relu", "Tanh", "Sigmoid", "Neg", "Abs", "Identity",
                   "Reciprocal", "Exp", "Log"})
KINDS = ("normalization", "elementwise")  # op kinds of quantscope.targets.profile
_INT64_MAX = np.iinfo(np.int64).max


def _tokens(shape: tuple | None) -> int | None:
    """The token count of a [B, T, H] shape (None: not rank 3 or T unknown)."""
    if shape is None or len(shape) != 3 or not isinstance(shape[SEQ_AXIS], int):
        return None
    return int(shape[SEQ_AXIS])


def _full(shape: tuple | None, tokens: int) -> bool:
    return _tokens(shape) == tokens


def _node_why(node: onnx.NodeProto, shapes: dict, consts: dict, tokens: int) -> str | None:
    """Why ``node`` is not token-wise on [B, tokens, H] (None: it is)."""
    out = shapes.get(node.output[0])
    if not _full(out, tokens):
        return f"{node.op_type} output {list(out) if out else '?'} is not [B, {tokens}, H]"
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
    if node.op_type == "MatMul":  # a Linear: [B, T, H] x [H, H'] works token by token
        w = node.input[1]
        if w not in consts or consts[w] is None or len(consts[w] or ()) != 2:
            return "MatMul without a 2-D constant weight"
        return None if _full(shapes.get(node.input[0]), tokens) else "MatMul input not [B, T, H]"
    if node.op_type in BINARY or node.op_type == "Pow":
        for t in node.input:
            s = consts[t] if t in consts else shapes.get(t)
            if t in consts:
                if s is None or (len(s) >= 2 and s[-2] not in (1,)) or len(s) > 3:
                    return f"constant operand '{t}' may have a sequence dim"
            elif not _full(s, tokens) and _tokens(s) != 1:
                return (f"operand '{t}' {list(s) if s else '?'} is neither [B, {tokens}, H] "
                        "nor a constant")
        return None
    return f"{node.op_type} is not a token-wise op this rewrite knows"


def _group_why(group: Group, nodes: dict[str, onnx.NodeProto], shapes: dict, consts: dict,
               tokens: int | None) -> str | None:
    if tokens is None:
        return f"output {list(group.output_shape)} has no known token count [B, T, H]"
    for name in group.nodes:
        why = _node_why(nodes[name], shapes, consts, tokens)
        if why:
            return why
    return None


def _constants(model: Model) -> dict[str, tuple[int, ...] | None]:
    """Constant tensors (initializers, Constant outputs) and their shapes (None: unknown)."""
    out: dict[str, tuple[int, ...] | None] = {
        t.name: tuple(t.dims) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant":
            value = next((a.t for a in n.attribute if a.name == "value"), None)
            out[n.output[0]] = tuple(value.dims) if value is not None else None
    return out


def split_tokens(model: Model, *, shapes: Shapes | None = None, chunk: int | None = None,
                 seq_len: int | None = None, linears: bool = False,
                 per_head: bool = False, relay_values: bool = False,
                 only: frozenset[str] | None = None) -> Repair:
    """The model with its token-wise norm/elementwise layers split into ``chunk``-token layers.

    ``shapes``: concrete input shapes (``--input-shape``), ``seq_len``: the deployment's
    sequence length for token inputs (``--seq-len``); legality is computed for them.
    ``chunk``: tokens per chunk (default: half the token count, rounded up). Layers with
    ``T <= chunk`` tokens are left whole. ``linears``: the token-wise Linears (MatMul with
    a 2-D constant weight, its bias and activation) are split too, so they read the
    chunks directly (no full-width Concat in between: at 16 bit that Concat is as wide as
    the unsplit tensor); only what mixes tokens (attention) reads a Concat. ``per_head``
    (with ``linears``, on a head-split model): not even attention reads a full-width
    Concat: Q/K/V and the heads' context are kept per head
    (:func:`quantscope.repair.heads.keep_heads`); on another model it is not applied and
    the reason says why; ``relay_values``: with it, each head's values pass through a
    [d, d] identity Linear (see ``keep_heads``). ``only``: the groups (by name) that may be
    split; the others are not candidates (a decoder's MLPs:
    :func:`quantscope.repair.gated.split_gated`). FP32 function unchanged.
    """
    resolved = _token_shapes(model, shapes, chunk, seq_len)
    c = _choose(model, resolved, chunk, linears, only)
    if c.tokens is None or not c.sites:
        return Repair(name="tokensplit", reason="no token-wise normalization or elementwise "
                      f"layer with more than {c.chunk} tokens", proto=model.proto,
                      skipped=c.skipped)
    order, inits, changes = _split_graph(model, c, c.tokens, resolved)
    tokens, chunk, n_chunks = c.tokens, c.chunk, math.ceil(c.tokens / c.chunk)
    skipped, heads_note, heads_effect = c.skipped, "", ()
    why = per_head_why(model, linears=linears) if per_head else None
    if per_head and why is None:
        kept = keep_heads(order, resolved, n_chunks, set(model.output_names()),
                          relay_values=relay_values)
        order, inits = list(kept.nodes), [*inits, *kept.initializers]
        changes = (*(ch for ch in changes if ch.tensor not in kept.removed), *kept.changes)
        skipped = (*skipped, *kept.skipped)
        heads_note = (f"; per head: {kept.qkv} Q/K/V and {kept.contexts} context Concat(s) "
                      "kept per head (no full-width Concat between the chunks and the heads)"
                      + (f", {kept.relays} values relayed by [d, d] identity Linears"
                         if kept.relays else ""))
        heads_effect = (("per_head_qkv", float(kept.qkv)),
                        ("per_head_contexts", float(kept.contexts)),
                        *((("per_head_relays", float(kept.relays)),) if relay_values else ()))
    elif why is not None and (linears or HEADS_KEY in _props(model)):
        heads_note = f"; per head: not applied: {why}"
    proto = rewritten(model.proto, order, inits, (
        METADATA_KEY, f"tokens={tokens} chunk={chunk} groups={len(c.sites)}; {UNVERIFIED}"))
    return Repair(
        name="tokensplit",
        reason=f"{len(c.sites)} token-wise layer(s) on [B, {tokens}, H] split into {n_chunks} "
        f"chunks of {chunk} tokens (groups '<name>/tok<i>'){heads_note}; {UNVERIFIED}",
        proto=proto,
        changes=changes,
        skipped=skipped,
        effect=(("sites", float(len(c.sites))), ("chunks", float(n_chunks)),
                ("chunk", float(chunk)), ("tokens", float(tokens)), *heads_effect),
    )


def _props(model: Model) -> set[str]:
    return {p.key for p in model.proto.metadata_props}


def per_head_why(model: Model, *, linears: bool) -> str | None:
    """Why the per-head form does not apply (None: it does): it needs a head-split model
    (``quantscope headsplit`` first) and the Linears in chunks (``--linears``)."""
    if HEADS_KEY not in _props(model):
        return "the model is not head-split (run headsplit before tokensplit)"
    if not linears:
        return ("needs --linears (without it Q/K/V and the output projection read whole "
                "tensors)")
    return None


def _token_shapes(model: Model, shapes: Shapes | None, chunk: int | None,
                  seq_len: int | None) -> Shapes:
    """The options checked and every tensor's shape at the given input shapes (an error
    when an input's token count stays symbolic)."""
    if seq_len is not None and chunk is not None and seq_len <= chunk:
        raise QuantscopeError(
            f"--chunk {chunk} must be below --seq-len {seq_len} (one chunk is the unsplit "
            "model)")
    if chunk is not None and chunk < 1:
        raise QuantscopeError(f"--chunk must be at least 1, got {chunk}")
    given = dict(shapes or {})
    if seq_len is not None:
        given.update(seq_len_shapes(model, seq_len))
    inferred = model.value_shapes()
    symbolic = [n for n in model.input_names() if n not in given
                and any(not isinstance(d, int) for d in (inferred.get(n) or ())[1:])]
    if symbolic:
        raise QuantscopeError(
            f"input '{symbolic[0]}' {list(inferred.get(symbolic[0]) or ())} has symbolic dims: "
            "give --seq-len N (token inputs) or --input-shape NAME=DxDx… so the token count "
            "is known")
    return resolve_shapes(model, given or None)


@dataclass(frozen=True)
class _Choice:
    """The layers to split: the chunk size, the residual stream's token count (None: no
    layer qualifies), the groups split (``sites``) and their nodes, and what was left."""

    chunk: int
    tokens: int | None
    sites: tuple[str, ...]
    split: frozenset[str]  # node names
    skipped: tuple[tuple[str, str], ...]


def _choose(model: Model, shapes: Shapes, chunk: int | None, linears: bool,
            only: frozenset[str] | None = None) -> _Choice:
    """The token-wise layers on the most common token count above ``chunk`` (default:
    half the largest token count, rounded up); every other candidate with the reason."""
    consts = _constants(model)
    nodes = {n.name: n for n in model.graph.node}
    groups = find_groups(model)
    kinds = (*KINDS, "weighted") if linears else KINDS
    candidates = [(g, _tokens(shapes.get(g.outputs[0]) if g.outputs else None))
                  for g in groups.groups if op_kind(g) in kinds
                  and (only is None or g.name in only)]
    if chunk is None:
        most = max((t for _, t in candidates if t), default=1)
        chunk = max(1, math.ceil(most / 2))
    whys = {g.name: _group_why(g, nodes, shapes, consts, t) for g, t in candidates}
    counts = [t for g, t in candidates if t is not None and t > chunk and whys[g.name] is None]
    tokens = max(set(counts), key=counts.count) if counts else None  # the residual stream's
    split: set[str] = set()
    skipped: list[tuple[str, str]] = []
    sites: list[str] = []
    for g, t in candidates:
        why = whys[g.name]
        if why is None and t is not None and t <= chunk:
            why = f"{t} tokens: not more than one chunk of {chunk}"
        elif why is None and t != tokens:
            why = f"{t} tokens: the split is for the {tokens}-token layers"
        if why is None:
            split.update(g.nodes)
            sites.append(g.name)
        else:
            skipped.append((g.name, why))
    return _Choice(chunk=chunk, tokens=tokens, sites=tuple(sites), split=frozenset(split),
                   skipped=tuple(skipped))


def _split_graph(model: Model, c: _Choice, tokens: int, shapes: Shapes
                 ) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], tuple[Change, ...]]:
    """The node order with every split node in ``n_chunks`` copies, each reading its chunk:
    a Slice per chunk of each full-width input from outside, a Concat of the chunks for
    each output read outside; the Slice bounds' initializers; the changes."""
    chunk, split, consts = c.chunk, c.split, _constants(model)
    n_chunks = math.ceil(tokens / chunk)
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
                    and _full(shapes.get(t), tokens):
                sliced.add(t)
                for i in range(n_chunks):
                    order.append(helper.make_node(
                        "Slice", [t, f"tokensplit/start{i}", f"tokensplit/end{i}",
                                  "tokensplit/axes"], [f"{t}/tok{i}"], name=f"{t}/slice{i}"))
                changes.append(Change(tensor=t, kind="insert",
                                      note=f"sliced into {n_chunks} chunks of {chunk} tokens"))
        order.extend(_chunk_copies(n, n_chunks, made | sliced))
        for o in n.output:
            if o in readers_outside:
                order.append(helper.make_node(
                    "Concat", [f"{o}/tok{i}" for i in range(n_chunks)], [o],
                    name=f"{n.name}/concat", axis=SEQ_AXIS))
                changes.append(Change(tensor=o, kind="new",
                                      note=f"Concat of {n_chunks} chunks for its readers"))
    return order, inits, tuple(changes)


def _chunk_copies(n: onnx.NodeProto, n_chunks: int, chunked: set[str]) -> list[onnx.NodeProto]:
    """``n`` once per chunk (``<name>/tok<i>``), reading the chunks of ``chunked`` inputs."""
    out = []
    for i in range(n_chunks):
        copy = onnx.NodeProto()
        copy.CopyFrom(n)
        copy.name = f"{n.name}/tok{i}"
        copy.input[:] = [f"{t}/tok{i}" if t in chunked else t for t in n.input]
        copy.output[:] = [f"{o}/tok{i}" if o else o for o in n.output]
        out.append(copy)
    return out





def _vocab(model: Model, name: str) -> int | None:
    """Rows of the embedding table a ``Gather`` looks token input ``name`` up in (a
    vocabulary below 1000 bounds the sample ids; None: no such table)."""
    inits = {t.name: t for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Gather" and len(n.input) == 2 and n.input[1] == name \
                and n.input[0] in inits:
            return int(inits[n.input[0]].dims[0])
    return None


def sample_feeds(model: Model, lengths: tuple[int, ...], *, shapes: Shapes | None = None,
                 seed: int = 0, what: str = "tokensplit") -> list[dict[str, np.ndarray]]:
    """Inputs to check the function on: ``[batch, sequence]`` token inputs at each length
    (ids 100-999, or below the vocabulary size when it is under 1000; masks 1, type ids 0); other float inputs normal random at their given
    (``shapes``) or static shape, a symbolic batch as 2 (one feed when no token input)."""
    rng = np.random.default_rng(seed)
    known, given = model.value_shapes(), dict(shapes or {})
    types = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    ints = {onnx.TensorProto.INT64: np.int64, onnx.TensorProto.INT32: np.int32}
    tokens = [n for n in model.input_names()
              if types.get(n) in ints and len(known.get(n) or ()) == 2]
    feeds = []
    for length in (lengths if tokens else (0,)):
        feed: dict[str, np.ndarray] = {}
        for name in model.input_names():
            if name in tokens:
                dtype = ints[types[name]]
                batch = (given.get(name) or known.get(name) or (2,))[0]
                size = (batch if isinstance(batch, int) else 2, length)
                vocab = _vocab(model, name)
                low, high = (100, 1000) if vocab is None or vocab >= 1000 else (0, vocab)
                feed[name] = (np.ones(size, dtype) if "mask" in name else
                              np.zeros(size, dtype) if "type" in name else
                              rng.integers(low, high, size).astype(dtype))
                continue
            shape = given.get(name) or known.get(name) or ()
            dims = [2 if i == 0 and not isinstance(d, int) else d for i, d in enumerate(shape)]
            if types.get(name) != onnx.TensorProto.FLOAT or not all(
                    isinstance(d, int) for d in dims):
                raise QuantscopeError(
                    f"input '{name}' {list(shape)}: {what} checks the function on token "
                    "inputs and float inputs of known shape: give --input-shape NAME=DxDx…")
            feed[name] = rng.normal(0, 1, dims).astype(np.float32)
        feeds.append(feed)
    return feeds


__all__ = ["METADATA_KEY", "UNVERIFIED", "per_head_why", "sample_feeds", "split_tokens"]
