"""Nodes out of topological order are put in order at load.

ONNX requires a graph's nodes in topological order, but ONNX Runtime sorts them itself and
runs a graph that is not: ``convert_float_to_float16(keep_io_types=True)`` (onnxconverter-
common, and its copy in ``onnxruntime.transformers.float16``) appends the Casts after each
graph input at the *end* of the node list. The ONNX checker refused such a model ("Nodes
in a graph must be topologically sorted"), with the fix "re-export it", for a model the
user's runtime runs. The nodes are reordered (stably: a node keeps its place unless an
input it reads comes later), nothing else changes, and a note says so.
"""

from __future__ import annotations

import heapq

import onnx


def _reads(node: onnx.NodeProto) -> set[str]:
    """The tensors a node reads: its inputs, and the outer names its subgraphs read."""
    names = {i for i in node.input if i}
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for g in graphs:
            inner = {o for n in g.node for o in n.output} | {i.name for i in g.input} \
                | {t.name for t in g.initializer}
            names |= {t for n in g.node for t in _reads(n)} - inner
    return names


def sort_nodes(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, tuple[str, ...]]:
    """``proto`` with its nodes in topological order and a note saying they were moved
    (``proto`` itself, and no note, when they are in order already or cannot be: a cycle
    or a tensor no node makes is left to the checker to name)."""
    graph = proto.graph
    nodes = list(graph.node)
    maker = {o: k for k, n in enumerate(nodes) for o in n.output if o}
    needs = [{maker[t] for t in _reads(n) if t in maker and maker[t] != k}
             for k, n in enumerate(nodes)]
    if all(max(d, default=-1) < k for k, d in enumerate(needs)):
        return proto, ()
    waiting = [len(d) for d in needs]
    readers: list[list[int]] = [[] for _ in nodes]
    for k, d in enumerate(needs):
        for j in d:
            readers[j].append(k)
    ready = [k for k, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        k = heapq.heappop(ready)
        order.append(k)
        for r in readers[k]:
            waiting[r] -= 1
            if waiting[r] == 0:
                heapq.heappush(ready, r)
    if len(order) != len(nodes):  # a cycle: not a graph ONNX Runtime runs either
        return proto, ()
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    del out.graph.node[:]
    out.graph.node.extend(nodes[k] for k in order)
    moved = [nodes[k].name or nodes[k].op_type for k in range(len(nodes))
             if any(r < k for r in readers[k])]  # made after a node that reads it
    shown = ", ".join(moved[:4]) + (", …" if len(moved) > 4 else "")
    return out, ("the graph's nodes were not in topological order (ONNX Runtime sorts them "
                 "itself; onnxconverter-common's convert_float_to_float16 writes such graphs): "
                 f"{len(moved)} node(s) moved before the nodes that read them ({shown}); "
                 "nothing else changed",)
