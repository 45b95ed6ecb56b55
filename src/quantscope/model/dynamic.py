"""Outputs that cannot be compared with FP32's value by value: refused before any work.

Every figure quantscope gives compares the quantized model's outputs with FP32's, sample by
sample and position by position. Two kinds of output make that meaningless:

==============================  ============================================================
an output downstream of an op   (``NonMaxSuppression``, ``NonZero``, ``Unique``,
whose output size depends on    ``Compress``): FP32 may keep 6 boxes where the quantized
the values                      model keeps 7, and box 3 of one is not box 3 of the other
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
    types = model.value_types()
    outs = model.output_names()
    if outs and all(types.get(o, 1) in INDEX_TYPES for o in outs):
        raise QuantscopeError(
            f"model '{model.source}' has only integer (label or index) outputs ({', '.join(repr(o) for o in outs)}"
            "): there is nothing float to compare with FP32 (a label compares equal or not); "
            "export the float tensor they are made from as an output too (the logits before "
            "an ArgMax) and declare it --layout OUT=class")
