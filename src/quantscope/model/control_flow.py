"""The refusal of a control-flow node (If, Loop, Scan), naming the fix that fits it.

An ``If`` on a condition the user fixes (a rank-0 sample rate: silero VAD) folds: keep the
branch used. An
``If`` whose condition is computed from the data (openWakeWord's ``hey_jarvis`` head: a
verifier network runs when the first network's score is >= 0.5) differs per sample and
cannot be folded: the line says so, names the tensors the condition and the branches read,
and the fix (one model per path, the branch picked on the host).
"""

from __future__ import annotations

import onnx


def _upstream_inputs(graph: onnx.GraphProto, tensor: str) -> list[str]:
    """The graph inputs ``tensor`` is computed from that carry samples (rank >= 1 or
    unknown): a rank-0 input (a sample rate) is a setting the user fixes, not data."""
    producer = {o: n for n in graph.node for o in n.output}
    inputs = {i.name for i in graph.input
              if not (i.type.tensor_type.HasField("shape") and not i.type.tensor_type.shape.dim)}
    seen, stack, found = set(), [tensor], []
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        if t in inputs:
            found.append(t)
        node = producer.get(t)
        if node is not None:
            stack.extend(i for i in node.input if i)
    return sorted(found)


def _outer_reads(node: onnx.NodeProto, weights: set[str]) -> list[str]:
    """The outer graph's tensors (not its ``weights``) the node's subgraphs read."""
    reads: list[str] = []
    for a in node.attribute:
        if a.type != onnx.AttributeProto.GRAPH:
            continue
        made = {o for n in a.g.node for o in n.output} | {i.name for i in a.g.initializer}
        made |= {i.name for i in a.g.input} | weights
        reads += [i for n in a.g.node for i in n.input if i and i not in made and i not in reads]
    return reads


def control_flow_message(node: onnx.NodeProto, graph: onnx.GraphProto) -> str:
    """One line: what the node is, why it cannot be emulated, the fix for its kind."""
    head = (f"node '{node.name}' is control flow ({node.op_type}), which quantscope cannot "
            "emulate")
    data = _upstream_inputs(graph, node.input[0]) if node.op_type == "If" and node.input else []
    if not data:
        return (f"{head}: fold it for your inputs and re-export (an If on a condition you "
                "fix: keep the branch you use; a Loop or Scan of a fixed count: unroll it)")
    reads = _outer_reads(node, {i.name for i in graph.initializer})
    branches = ", ".join(f"'{a.name}' ({len(a.g.node)} node{'s' * (len(a.g.node) != 1)})"
                         for a in node.attribute
                         if a.type == onnx.AttributeProto.GRAPH)
    quoted = ", ".join(f"'{t}'" for t in data)
    return (f"{head}: its condition '{node.input[0]}' is computed from the data (input "
            f"{quoted}), so the branch differs per sample and no fold keeps the model: "
            "export one model per path, the graph up to the tensors the If reads ("
            + ", ".join(f"'{t}'" for t in reads[:6]) + ") and each branch "
            f"({branches}) as a model of its own, measure each, and pick the branch on the host")
