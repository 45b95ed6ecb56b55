"""build_qdq(): the one graph writer. Emulation runs what export ships.

Graph form (ONNX QDQ, opset >= 21)
==================================  ===============================================
weight ``W`` of a quantized group   initializer ``W_quantized`` (int8/int16, or int4
                                    for 4-bit weights) -> DequantizeLinear -> ``W``
activation ``t`` (group output)     producer writes ``t_float`` -> QuantizeLinear ->
                                    DequantizeLinear -> ``t``: every consumer and
                                    graph output keeps the original name
model input ``x``                   ``x`` -> QuantizeLinear -> DequantizeLinear ->
                                    ``x_dq`` read by the consumers
bias                                kept in float (the 32-bit bias grid of integer
                                    NPUs is far finer than the activation grid)
pass-through ops (Reshape …)         untouched: their output is already on the grid
==================================  ===============================================

:func:`quantize_model` is the one composition every caller uses (evaluate, export-qdq,
export, analyze, repairs, the planner's evaluator): plan + statistics + the target's
scheme -> encodings -> QDQ graph. The scheme is a required input, so no caller can build
the graph of another scheme than the one it measures or ships (:func:`scheme_for`).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantscope.emulate.coverage import Coverage, coverage
from quantscope.emulate.encode import encode
from quantscope.model.groups import check_plan_names, find_groups
from quantscope.model.load import Model
from quantscope.model.weightless import append_copies, copy_fields
from quantscope.numerics import quantize
from quantscope.types import Encoding, Encodings, Groups, Plan, QuantScheme, QuantscopeError, Stats

_STORAGE = {
    (4, True): (ml_dtypes.int4, TensorProto.INT4),
    (4, False): (ml_dtypes.uint4, TensorProto.UINT4),
    (8, True): (np.int8, TensorProto.INT8),
    (8, False): (np.uint8, TensorProto.UINT8),
    (16, True): (np.int16, TensorProto.INT16),
    (16, False): (np.uint16, TensorProto.UINT16),
}


def storage_type(enc: Encoding) -> tuple[type, int]:
    """(numpy dtype, ONNX TensorProto type) that holds this encoding's codes."""
    return _STORAGE[(enc.bits, enc.signed)]


def _param_tensors(name: str, enc: Encoding) -> list[TensorProto]:
    np_type, _ = storage_type(enc)
    scale = numpy_helper.from_array(enc.scale.astype(np.float32), f"{name}_scale")
    zp = numpy_helper.from_array(enc.zero_point.astype(np_type), f"{name}_zero_point")
    return [scale, zp]


def _axis_attr(enc: Encoding) -> dict[str, int]:
    return {"axis": enc.axis} if enc.axis is not None and enc.scale.ndim == 1 else {}


def _qdq_nodes(src: str, dst: str, enc: Encoding) -> tuple[list[onnx.NodeProto], list[TensorProto]]:
    q_out = f"{dst}_quantized"
    nodes = [
        helper.make_node("QuantizeLinear", [src, f"{dst}_scale", f"{dst}_zero_point"],
                         [q_out], name=f"{dst}_QuantizeLinear", **_axis_attr(enc)),
        helper.make_node("DequantizeLinear", [q_out, f"{dst}_scale", f"{dst}_zero_point"],
                         [dst], name=f"{dst}_DequantizeLinear", **_axis_attr(enc)),
    ]
    return nodes, _param_tensors(dst, enc)


def _weight_nodes(
    model: Model, encodings: Encodings
) -> tuple[list[onnx.NodeProto], list[TensorProto], set[str]]:
    nodes: list[onnx.NodeProto] = []
    inits: list[TensorProto] = []
    for name, enc in encodings.weights.items():
        w = model.initializer_array(name).astype(np.float32)
        np_type, _ = storage_type(enc)
        codes = quantize(w, enc).astype(np_type)
        inits.append(numpy_helper.from_array(codes, f"{name}_quantized"))
        inits.extend(_param_tensors(name, enc))
        nodes.append(helper.make_node(
            "DequantizeLinear", [f"{name}_quantized", f"{name}_scale", f"{name}_zero_point"],
            [name], name=f"{name}_DequantizeLinear", **_axis_attr(enc)))
    return nodes, inits, set(encodings.weights)


def build_qdq(model: Model, encodings: Encodings) -> onnx.ModelProto:
    """The QDQ graph for ``encodings`` (which say what the plan quantizes, and how).

    Callers use :func:`quantize_model`; only the segment engine of the sweeps calls this
    directly, with a plan's encodings restricted to a cut-out segment.
    """
    proto = onnx.ModelProto()  # the model's proto but its nodes and weights, copied once
    copy_fields(model.proto, proto, skip=("graph",))
    copy_fields(model.proto.graph, proto.graph, skip=("node", "initializer"))
    graph = proto.graph
    w_nodes, new_inits, replaced = _weight_nodes(model, encodings)
    kept = [t for t in model.proto.graph.initializer if t.name not in replaced]
    still_inputs = [i for i in graph.input if i.name not in replaced]
    if len(still_inputs) != len(graph.input):  # old exports list initializers as inputs
        del graph.input[:]
        graph.input.extend(still_inputs)
    in_nodes: list[onnx.NodeProto] = []
    renamed_inputs: dict[str, str] = {}
    graph_inputs = {i.name for i in graph.input}
    for name, enc in encodings.activations.items():
        if name in graph_inputs:
            nodes, params = _qdq_nodes(name, f"{name}_dq", enc)
            in_nodes += nodes
            new_inits += params
            renamed_inputs[name] = f"{name}_dq"
    body: list[onnx.NodeProto] = []
    for node in model.proto.graph.node:
        new = onnx.NodeProto()
        new.CopyFrom(node)
        for i, t in enumerate(new.input):
            if t in renamed_inputs:
                new.input[i] = renamed_inputs[t]
        tail: list[onnx.NodeProto] = []
        for i, t in enumerate(new.output):
            enc = encodings.activations.get(t)
            if enc is None or t in graph_inputs:
                continue
            new.output[i] = f"{t}_float"
            nodes, params = _qdq_nodes(f"{t}_float", t, enc)
            tail += nodes
            new_inits += params
        body += [new, *tail]
    graph.node.extend(w_nodes + in_nodes + body)
    append_copies(graph.initializer, kept + new_inits)
    _refuse_taken_names(graph)
    return proto


QDQ_SUFFIXES = ("_dq", "_float", "_quantized", "_scale", "_zero_point")


def _refuse_taken_names(graph: onnx.GraphProto) -> None:
    """Each tensor the graph defines once. A model's own name that the writer also gives
    (``x_dq`` beside an input ``x``: the names above add :data:`QDQ_SUFFIXES`) would make
    a graph ONNX Runtime refuses with "Duplicate definition": said instead, naming it."""
    seen: set[str] = set()
    inits = [t.name for t in graph.initializer]  # old exports list them as inputs too
    init_set = set(inits)
    for name in [*(i.name for i in graph.input if i.name not in init_set), *inits,
                 *(o for n in graph.node for o in n.output if o)]:
        if name in seen:
            raise QuantscopeError(
                f"the model names a tensor {name!r}, a name the Q/DQ graph gives one of its "
                f"own (it adds {', '.join(QDQ_SUFFIXES)} to a quantized tensor's name): "
                "rename that tensor in the model and re-export")
        seen.add(name)


@dataclass(frozen=True, eq=False)
class QdqModel:
    """The QDQ graph of one plan and the encodings it was written from."""

    proto: onnx.ModelProto
    encodings: Encodings
    coverage: Coverage

    @property
    def notes(self) -> tuple[str, ...]:
        return self.encodings.notes


def scheme_for(plan: Plan, fallback: QuantScheme | None = None) -> QuantScheme:
    """The scheme a plan is built with: its target's, else ``fallback``, else the default.

    A ``fallback`` that contradicts the plan's own target is a caller error: the graph
    measured would not be the graph shipped.
    """
    if not plan.target:
        return fallback or QuantScheme()
    from quantscope.targets import load_target

    scheme = load_target(plan.target).scheme
    if fallback is not None and fallback != scheme:
        raise QuantscopeError(
            f"plan names target '{plan.target}' but another quantization scheme was given: "
            "drop the explicit scheme or the plan's target"
        )
    return scheme


def quantize_model(
    model: Model,
    stats: Stats,
    plan: Plan,
    *,
    scheme: QuantScheme,
    groups: Groups | None = None,
    method: str | None = None,
) -> QdqModel:
    """Plan + statistics + scheme -> the QDQ model (what is measured is what is exported)."""
    enc, cov = plan_encodings(model, stats, plan, scheme=scheme, groups=groups, method=method)
    return QdqModel(proto=build_qdq(model, enc), encodings=enc, coverage=cov)


def plan_encodings(
    model: Model,
    stats: Stats,
    plan: Plan,
    *,
    scheme: QuantScheme,
    groups: Groups | None = None,
    method: str | None = None,
) -> tuple[Encodings, Coverage]:
    """What :func:`quantize_model` writes its graph from (the plan's encodings and their
    coverage), without writing it: the incremental evaluator writes it per segment."""
    groups = groups or find_groups(model)
    check_plan_names(plan, groups)
    enc = encode(model, groups, stats, plan, scheme=scheme, method=method)
    return enc, coverage(model, groups, plan, enc)
