"""Outputs that cannot be compared with FP32's value by value: refused before any work.

Every figure quantscope gives compares the quantized model's outputs with FP32's, sample by
sample and position by position. Two kinds of output make that meaningless:

==============================  ============================================================
an output downstream of an op   (``NonMaxSuppression``, ``NonZero``, ``Unique``,
whose output size depends on    ``Compress``): FP32 may keep 6 boxes where the quantized
the values                      model keeps 7, and box 3 of one is not box 3 of the other
an output whose size an op      (``Range``'s limit, ``Tile``'s repeats, ``Expand``'s shape,
takes from a float tensor the   ...: :data:`SIZE_INPUTS`): a TTS's length regulator, whose
model computes                  frame count is the sum of its rounded durations; a duration
                                rounded otherwise quantized makes an output of another
                                length (a ``Shape`` breaks the chain: sizes of tensors are
                                the same in both models)
every output a label or index   (``ArgMax`` alone, :data:`INDEX_TYPES`): nothing to score
                                the plan by but equal or not; the logits it is made from
                                are
==============================  ============================================================

Each is one line naming the output, the op and the fix (:func:`refuse_unscorable_outputs`).
"""

from __future__ import annotations

from onnx import TensorProto

from quantscope.model.load import FLOAT_TYPES, Model
from quantscope.types import QuantscopeError

INDEX_TYPES = frozenset({TensorProto.INT64, TensorProto.INT32, TensorProto.UINT64,
                         TensorProto.UINT32, TensorProto.BOOL})
"""Output types of labels, indices, counts and flags (``ArgMax``, ``TopK``'s indices):
compared exactly (:mod:`quantscope.emulate.exact`). An 8/16-bit integer output (an image
the graph Casts back to uint8) is a magnitude, scored like a float one."""

DATA_SIZED = frozenset({"NonMaxSuppression", "NonZero", "Unique", "Compress"})
"""Ops whose output size depends on the values of their inputs."""


SIZE_INPUTS: dict[str, tuple[int, ...]] = {
    "Range": (0, 1, 2), "Tile": (1,), "Expand": (1,), "ConstantOfShape": (0,),
    "Reshape": (1,), "Slice": (1, 2, 3, 4), "Resize": (2, 3), "Upsample": (1,),
    "Pad": (1,), "TopK": (1,), "OneHot": (1,), "Split": (1,)}
"""Op -> the positions of its inputs whose values set its output's size."""

SIZE_ONLY = frozenset({"Shape", "Size"})
"""Ops whose output depends on their input's size alone, not its values."""


def float_value_sources(model: Model) -> dict[str, str]:
    """Tensor -> the last float tensor upstream of it whose values come from the data (a
    float input, or a float tensor computed from any input's values), for every tensor
    the quantized model can compute otherwise than FP32. Ints made from int inputs alone
    (token ids, a mask's positions) and anything below a ``Shape`` are not in it."""
    types = model.value_types()
    inputs = model.input_names()
    src = {k: k for k in inputs if types.get(k) in FLOAT_TYPES}
    dep = set(inputs)
    for node in model.graph.node:
        ins = [t for t in node.input if t]
        if node.op_type in SIZE_ONLY or not any(t in dep for t in ins):
            continue
        inherited = next((src[t] for t in ins if t in src), None)
        for out in node.output:
            dep.add(out)
            if types.get(out) in FLOAT_TYPES:
                src[out] = out
            elif inherited is not None:
                src[out] = inherited
    return src


def value_sized_sources(model: Model) -> dict[str, tuple[str, str, str]]:
    """Graph output -> (op type, node name, float tensor) of the first op upstream of it
    that takes its output's size from a float tensor computed from the data."""
    sources = float_value_sources(model)
    sized: dict[str, tuple[str, str, str]] = {}
    for node in model.graph.node:
        for i in SIZE_INPUTS.get(node.op_type, ()):
            if i < len(node.input) and node.input[i] in sources:
                sized.update({o: (node.op_type, node.name, sources[node.input[i]])
                              for o in node.output})
                break
    producer = {t: n for n in model.graph.node for t in n.output}
    found: dict[str, tuple[str, str, str]] = {}
    for out in model.output_names():
        todo, seen = [out], set()
        while todo and out not in found:
            t = todo.pop()
            if t in sized:
                found[out] = sized[t]
            node = producer.get(t)
            if node is None or node.name in seen or node.op_type in SIZE_ONLY:
                continue
            seen.add(node.name)
            todo.extend(i for i in node.input if i)
    return found


def data_sized_sources(model: Model) -> dict[str, tuple[str, str, tuple[str, ...]]]:
    """Graph output -> (op type, node name, its float inputs) of the first op upstream of it
    whose output size depends on the data (none for an output with no such op above it)."""
    producer = {t: n for n in model.graph.node for t in n.output}
    found: dict[str, tuple[str, str, tuple[str, ...]]] = {}
    for out in model.output_names():
        todo, seen = [out], set()
        while todo and out not in found:
            node = producer.get(todo.pop())
            if node is None or node.name in seen:
                continue
            seen.add(node.name)
            if node.op_type in DATA_SIZED:
                types = model.value_types()
                inits = {i.name for i in model.graph.initializer}
                ins = tuple(t for t in node.input
                            if t and t not in inits and types.get(t) in FLOAT_TYPES)
                found[out] = (node.op_type, node.name, ins)
            todo.extend(t for t in node.input if t)
    return found


def refuse_unscorable_outputs(model: Model) -> None:
    """One line for an output whose size depends on the data, or a model whose every
    output is an integer (see the module table)."""
    for out, (op, node, ins) in data_sized_sources(model).items():
        reads = f" (the tensors {', '.join(repr(t) for t in ins)} it reads)" if ins else ""
        raise QuantscopeError(
            f"model '{model.source}' output {out!r} has a size that depends on the data (it "
            f"comes from {op} '{node}'), so FP32's and the quantized model's cannot be compared "
            f"value by value: export the model without that post-processing, its outputs the "
            f"tensors before '{node}'{reads}, and run it on the host (declare a detection "
            "head with --layout OUT=detect)")
    for out, (op, node, tensor) in value_sized_sources(model).items():
        raise QuantscopeError(
            f"model '{model.source}' output {out!r} has a size set by values the model "
            f"computes: {op} '{node}' takes its size from '{tensor}' (float, computed from "
            "the data: a TTS's durations, the frames each phoneme lasts), and a value the "
            "quantized model rounds otherwise makes an output of another length, which "
            "cannot be compared with FP32's value by value: split the model there, one "
            f"model up to '{tensor}' (an output, scored against FP32's) and one from it "
            "(an input of the size it sets), and measure each on its own data")
    types = model.value_types()
    outs = model.output_names()
    if outs and all(types.get(o, 1) in INDEX_TYPES for o in outs):
        raise QuantscopeError(
            f"model '{model.source}' has only integer (label or index) outputs ({', '.join(repr(o) for o in outs)}"
            "): there is nothing float to compare with FP32 (a label compares equal or not); "
            "export the float tensor they are made from as an output too (the logits before "
            f"an ArgMax) and declare it --layout OUT=class{_ctc_hint(model, outs)}")


def _ctc_hint(model: Model, outs: tuple[str, ...]) -> str:
    """Where an output is an ``ArgMax`` per step (``[N, T]`` from ``[N, T, C]``), the CTC
    layout a host that collapses the steps reads the logits by (hibari's G2P)."""
    producer = {t: n for n in model.graph.node for t in n.output}
    shapes = model.value_shapes()
    for o in outs:
        node = producer.get(o)
        if node is None or node.op_type != "ArgMax":
            continue
        keep = next((a.i for a in node.attribute if a.name == "keepdims"), 1)
        rank = len(shapes.get(o) or ()) + (0 if keep else 1)
        if rank >= 3:
            return (f" (per step), or --layout OUT=ctc where the host decodes '{o}' as CTC "
                    "(repeats merged, the blank dropped)")
    return ""
