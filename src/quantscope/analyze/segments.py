"""Cut a model into segments at single-activation boundaries, and write Q/DQ per segment.

Why: ONNX Runtime cannot be fed an intermediate tensor, so a sweep that perturbs one
group would re-run the whole prefix. Cut the graph where exactly one float activation
crosses (the residual stream after each LayerNorm of a transformer), cache the tensors
that cross each cut, and run only the segments from the perturbed one onwards.

=========================  ==========================================================
cut                        a position in topological node order where exactly one
                           ``act`` float tensor is live (made before, read after);
                           never inside a group; side/const tensors (attention mask,
                           shapes) may cross too: they are extra segment inputs
segment inputs             every tensor its nodes read that earlier segments or the
                           graph inputs make (cached per batch, both FP32 and low)
segment outputs            every tensor it makes that later segments or the graph
                           outputs read
Q/DQ in a segment          :func:`quantscope.emulate.qdq.build_qdq` applied to the
                           segment model with the encodings of the tensors the
                           segment makes (and of real graph inputs it reads): the same
                           writer, so a chain of segments equals the full QDQ model
=========================  ==========================================================
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
from onnx import helper

from quantscope.emulate.qdq import build_qdq
from quantscope.model.groups import tensor_kinds
from quantscope.model.load import FLOAT_TYPES, Model
from quantscope.types import Encodings, Groups, Plan


@dataclass(frozen=True)
class Segment:
    index: int
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    groups: tuple[str, ...]  # groups whose nodes lie in this segment


def _cut_positions(model: Model, groups: Groups, min_nodes: int) -> list[int]:
    nodes = list(model.graph.node)
    kinds, types = tensor_kinds(model), model.value_types()
    last_use = {t: len(nodes) for t in model.output_names()}
    for i, node in enumerate(nodes):
        for t in node.input:
            last_use[t] = max(last_use.get(t, -1), i)
    group_of = {n: g.name for g in groups.groups for n in g.nodes}
    span: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        if node.name in group_of:
            span.setdefault(group_of[node.name], [i, i])[1] = i
    inside = {k for lo, hi in span.values() for k in range(lo + 1, hi + 1)}
    live: set[str] = set()
    cuts, last, grouped = [], 0, False
    for i, node in enumerate(nodes[:-1]):
        grouped = grouped or node.name in group_of
        live = {t for t in live if last_use.get(t, -1) > i}
        live |= {
            t
            for t in node.output
            if last_use.get(t, -1) > i and kinds.get(t) == "act" and types.get(t) in FLOAT_TYPES
        }
        if len(live) == 1 and grouped and i + 1 not in inside and i + 1 - last >= min_nodes:
            cuts.append(i + 1)
            last, grouped = i + 1, False
    return cuts


def find_segments(model: Model, groups: Groups, *, min_nodes: int = 1) -> tuple[Segment, ...]:
    """Segments of ``model`` in execution order (see the module docstring)."""
    nodes = list(model.graph.node)
    bounds = [0, *_cut_positions(model, groups, min_nodes), len(nodes)]
    group_of = {n: g.name for g in groups.groups for n in g.nodes}
    graph_outs = set(model.output_names())
    made_at: dict[str, int] = {t: -1 for t in model.input_names()}
    for k, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
        for node in nodes[lo:hi]:
            made_at.update({t: k for t in node.output})
    read_at: dict[str, set[int]] = {}
    for k, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
        for node in nodes[lo:hi]:
            for t in node.input:
                read_at.setdefault(t, set()).add(k)
    segments = []
    for k, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
        part = nodes[lo:hi]
        ins = dict.fromkeys(t for n in part for t in n.input if t and made_at.get(t, k) < k)
        outs = dict.fromkeys(
            t
            for n in part
            for t in n.output
            if t in graph_outs or any(j > k for j in read_at.get(t, ()))
        )
        names = tuple(dict.fromkeys(group_of[n.name] for n in part if n.name in group_of))
        segments.append(Segment(k, tuple(n.name for n in part), tuple(ins), tuple(outs), names))
    return tuple(segments)


def _value_info(model: Model, name: str) -> onnx.ValueInfoProto:
    for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        if vi.name == name:
            return vi
    return helper.make_empty_tensor_value_info(name)


def segment_model(model: Model, seg: Segment, *, extra_outputs: tuple[str, ...] = ()) -> Model:
    """The float sub-model of one segment (its inputs become graph inputs)."""
    wanted = set(seg.nodes)
    nodes = [n for n in model.graph.node if n.name in wanted]
    used = {t for n in nodes for t in n.input}
    inits = [t for t in model.graph.initializer if t.name in used]
    init_names = {t.name for t in inits}
    graph = helper.make_graph(
        nodes,
        f"segment_{seg.index}",
        [_value_info(model, t) for t in seg.inputs if t not in init_names],
        [_value_info(model, t) for t in dict.fromkeys([*seg.outputs, *extra_outputs])],
        initializer=inits,
    )
    graph.value_info.extend(model.graph.value_info)
    proto = helper.make_model(graph, opset_imports=list(model.proto.opset_import))
    proto.ir_version = model.proto.ir_version
    return Model(proto=proto, source=f"{model.source}#segment{seg.index}")


def restrict_encodings(model: Model, seg_model: Model, encodings: Encodings) -> Encodings:
    """The encodings a segment writes: tensors it makes, graph inputs it reads, its weights."""
    made = {t for n in seg_model.graph.node for t in n.output}
    real_inputs = set(model.input_names())
    read = {t for n in seg_model.graph.node for t in n.input}
    acts = {
        t: e
        for t, e in encodings.activations.items()
        if t in made or (t in real_inputs and t in read)
    }
    inits = {t.name for t in seg_model.graph.initializer}
    weights = {t: e for t, e in encodings.weights.items() if t in inits}
    return Encodings(
        activations=acts, weights=weights, scheme=encodings.scheme, notes=encodings.notes
    )


def segment_qdq(
    model: Model, seg_model: Model, groups: Groups, plan: Plan, encodings: Encodings
) -> onnx.ModelProto:
    """The one writer applied to a segment: Q/DQ exactly where the full QDQ model has it."""
    return build_qdq(seg_model, groups, plan, restrict_encodings(model, seg_model, encodings))
