"""Which job each Linear does in a transformer block, read from the graph (no names).

==========  ==========================================================================
``qk``      a Linear whose output reaches an attention score MatMul (the MatMul whose
            output a Softmax normalises, or its decomposed form ``Exp(x - max x)``): the
            query and key projections
``v``       a Linear whose output reaches the context MatMul (the MatMul that reads the
            Softmax's probabilities) as its other operand: the value projection
``ao``      a Linear that reads the context MatMul's output: the attention output
``up``      a Linear whose output reaches an activation (Gelu, Erf, Relu, Sigmoid, Tanh,
            …) before any other Linear: the FFN up-projection
``down``    a Linear that reads an activation's output (through elementwise ops): the FFN
            down-projection
==========  ==========================================================================

The paths are followed through the ops that move or rescale a tensor without mixing
positions (Reshape, Transpose, a bias Add, a scale Mul/Div, Cast, …), so the answer does
not depend on how an exporter names nodes: minilm (``/query/``, ``/intermediate/``) and
mpnet (``/attn/q/``) get the same families. A Linear that fits none (an embedding
projection, a classifier head) has no family; a fused QKV projection (one Linear, then
Split) reaches both the score and the context MatMul and is ``qkv``.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx

from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.types import GroupKind

FAMILIES = ("qk", "v", "qkv", "ao", "up", "down")
# ops a path passes through: they move, reshape or rescale values but mix no positions
PASS = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Cast", "Identity",
                  "Add", "Sub", "Mul", "Div", "Split", "Slice", "Gather", "Flatten",
                  "Expand", "Concat"})
ACTIVATIONS = frozenset({"Gelu", "FastGelu", "BiasGelu", "Erf", "Relu", "Sigmoid", "Tanh",
                         "Softplus", "Elu", "LeakyRelu", "HardSigmoid", "HardSwish", "Mish",
                         "Selu", "Celu", "PRelu", "QuickGelu"})
_DEPTH = 12  # longest pass-through path followed


def linear_families(model: Model) -> dict[str, str]:
    """Weighted group name -> its family (:data:`FAMILIES`); groups of no family are left
    out. Only MatMul/Gemm groups (Linears) are read: a Conv has no family."""
    graph = model.proto.graph
    producer = {t: n for n in graph.node for t in n.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for t in n.input:
            if t:
                readers.setdefault(t, []).append(n)
    groups = [g for g in find_groups(model).groups
              if g.kind is GroupKind.WEIGHTED and g.op_type in ("MatMul", "Gemm")]
    owner = {node: g.name for g in groups for node in g.nodes}
    scores, contexts = _attention_matmuls(graph, producer, readers, owner)
    ops = {n.name: n.op_type for n in graph.node}
    # an activation the grouping fused into its Linear (MatMul, bias Add, Gelu) is in there
    activated = {g.name for g in groups if any(ops.get(n) in ACTIVATIONS for n in g.nodes)}
    found: dict[str, set[str]] = {g: {"up"} for g in activated}
    for g in groups:
        fam = found.setdefault(g.name, set())
        for node in _forward(g.outputs, readers, owner, g.name):
            if node.name in scores:
                fam.add("qk")
            elif node.name in contexts:  # reached as the values (a Softmax is not PASS)
                fam.add("v")
            elif node.op_type in ACTIVATIONS:
                fam.add("up")
        for node in _backward(g.inputs, producer, owner):
            if node.name in contexts:
                fam.add("ao")
            elif node.op_type in ACTIVATIONS or (owner.get(node.name) in activated
                                                 and owner.get(node.name) != g.name):
                fam.add("down")
    out = {}
    for name, fams in found.items():
        if {"qk", "v"} <= fams:
            out[name] = "qkv"
        elif len(fams) == 1:
            out[name] = next(iter(fams))
    return out


def _attention_matmuls(graph: onnx.GraphProto, producer: dict[str, onnx.NodeProto],
                       readers: dict[str, list[onnx.NodeProto]], owner: dict[str, str]
                       ) -> tuple[set[str], set[str]]:
    """The activation x activation MatMuls before (scores) and after (context) each
    attention normaliser: a Softmax, or its decomposed form (``Exp(x - ReduceMax(x))``, as
    the rowscale rewrite writes it)."""
    scores, contexts = set(), set()
    for n in graph.node:
        if not _normaliser(n, producer):
            continue
        for node in _backward((n.input[0],), producer, owner, stop_at_matmul=True):
            if node.op_type == "MatMul" and node.name not in owner:
                scores.add(node.name)
        for node in _forward(tuple(n.output), readers, owner, None, stop_at_matmul=True):
            if node.op_type == "MatMul" and node.name not in owner:
                contexts.add(node.name)
    return scores, contexts


def _normaliser(node: onnx.NodeProto, producer: dict[str, onnx.NodeProto]) -> bool:
    """A Softmax, or the Exp of a decomposed one: ``Exp(Sub(x, ReduceMax(x)))``."""
    if node.op_type == "Softmax":
        return True
    if node.op_type != "Exp":
        return False
    sub = producer.get(node.input[0])
    if sub is None or sub.op_type != "Sub" or len(sub.input) < 2:
        return False
    peak = producer.get(sub.input[1])
    return peak is not None and peak.op_type == "ReduceMax"


def _forward(tensors: tuple[str, ...], readers: dict[str, list[onnx.NodeProto]],
             owner: dict[str, str], me: str | None, *, stop_at_matmul: bool = False
             ) -> Iterator[onnx.NodeProto]:
    """Nodes reached from ``tensors`` through :data:`PASS` ops; the walk stops at (and
    yields) any other op, another Linear, or a MatMul."""
    seen: set[str] = set()
    todo = [(t, 0) for t in tensors]
    while todo:
        t, depth = todo.pop()
        for node in readers.get(t, ()):
            if node.name in seen or depth > _DEPTH:
                continue
            seen.add(node.name)
            if owner.get(node.name) == me and me is not None:
                todo.extend((o, depth) for o in node.output)  # inside my own group
                continue
            yield node
            if node.op_type in PASS and node.name not in owner and not (
                    stop_at_matmul and node.op_type == "MatMul"):
                todo.extend((o, depth + 1) for o in node.output)


def _backward(tensors: tuple[str, ...], producer: dict[str, onnx.NodeProto],
              owner: dict[str, str], *, stop_at_matmul: bool = False
              ) -> Iterator[onnx.NodeProto]:
    """Nodes reached backwards from ``tensors`` through :data:`PASS` ops (see
    :func:`_forward`)."""
    seen: set[str] = set()
    todo = [(t, 0) for t in tensors]
    while todo:
        t, depth = todo.pop()
        node = producer.get(t)
        if node is None or node.name in seen or depth > _DEPTH:
            continue
        seen.add(node.name)
        yield node
        if node.op_type in PASS and node.name not in owner and not (
                stop_at_matmul and node.op_type == "MatMul"):
            todo.extend((i, depth + 1) for i in node.input if i)


__all__ = ["ACTIVATIONS", "FAMILIES", "linear_families"]
