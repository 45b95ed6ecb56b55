"""Give each opset < 13 Softmax's input its rank before the opset is raised.

Before opset 13 a ``Softmax`` (``LogSoftmax``, ``Hardmax``) flattens its input from
``axis`` on. ONNX's version converter keeps one ``Softmax(axis=-1)`` where that axis is
the input's last, which it reads from the input's shape; where ONNX's shape inference
lost the rank (a PaddleOCR recognizer's ``Reshape`` to a shape computed from ``Shape``),
it writes ``Shape``, ``Flatten``, ``Softmax``, ``Reshape`` instead. The function is the
same, but the output is then made by a ``Reshape``: its classes are not found
(:func:`quantscope.tasks.classes.class_output`), and three layers no compiler wants
become decision groups. The rank is taken from the node's output (a graph output keeps
its declared shape), ONNX's inference on a copy raised to the target opset, or onnxruntime's
symbolic shape inference, and written as the
input's shape (dims unknown) for the converter to read; nothing else changes.
"""

from __future__ import annotations

import onnx
from onnx import shape_inference

from quantscope.model.symbolic import symbolic_proto

FLATTENING_OPS = ("Softmax", "LogSoftmax", "Hardmax")


def _ranked(vi: onnx.ValueInfoProto) -> int | None:
    tt = vi.type.tensor_type
    return len(tt.shape.dim) if tt.HasField("shape") else None


def _converted_ranks(proto: onnx.ModelProto, target: int) -> dict[str, int | None]:
    """Each tensor's rank as ONNX's shape inference gives it on ``proto`` raised to opset
    ``target`` (its rules there keep ranks that opset 11's lose, e.g. a Reshape to a
    computed shape; the Softmax inputs keep their names), empty when that fails."""
    try:
        raised = onnx.version_converter.convert_version(proto, target)
        raised = shape_inference.infer_shapes(raised, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - the symbolic inference is tried next
        return {}
    return {v.name: _ranked(v) for v in raised.graph.value_info}


def rank_softmax_inputs(proto: onnx.ModelProto, opset: int, target: int) -> onnx.ModelProto:
    """``proto`` with a ranked value_info for the input of each flattening op whose rank
    ONNX's shape inference does not give (``proto`` itself when none lacks one, or
    ``opset`` is 13 or more); ``target``: the opset the model is being raised to."""
    if opset >= 13:
        return proto
    nodes = [n for n in proto.graph.node
             if n.op_type in FLATTENING_OPS and n.domain in ("", "ai.onnx") and n.input]
    if not nodes:
        return proto
    try:
        inferred = shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - the converter then does as it did
        return proto
    infos = {v.name: v for v in [*inferred.graph.input, *inferred.graph.value_info,
                                 *inferred.graph.output]}
    missing = [n for n in nodes if _ranked(infos.get(n.input[0], onnx.ValueInfoProto())) is None]
    if not missing:
        return proto
    ranks = {n.input[0]: _ranked(infos[n.output[0]]) for n in missing if n.output[0] in infos}
    if any(ranks.get(n.input[0]) is None for n in missing):
        found = _converted_ranks(inferred, target)
        for n in missing:
            if ranks.get(n.input[0]) is None:
                ranks[n.input[0]] = found.get(n.input[0])
    if any(ranks.get(n.input[0]) is None for n in missing):
        symbolic = symbolic_proto(inferred)
        found = {} if symbolic is None else {v.name: _ranked(v) for v in symbolic.graph.value_info}
        for n in missing:
            if ranks.get(n.input[0]) is None:
                ranks[n.input[0]] = found.get(n.input[0])
    ranks = {k: r for k, r in ranks.items() if r}
    if not ranks:
        return proto
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    known = {v.name for v in out.graph.value_info}
    for name, rank in ranks.items():
        elem = infos[name].type.tensor_type.elem_type if name in infos else 0
        if not elem:  # no type known: nothing to write that could not be wrong
            continue
        vi = onnx.helper.make_tensor_value_info(name, elem, [None] * rank)
        if name in known:
            existing = next(v for v in out.graph.value_info if v.name == name)
            existing.CopyFrom(vi)
        else:
            out.graph.value_info.append(vi)
    return out
