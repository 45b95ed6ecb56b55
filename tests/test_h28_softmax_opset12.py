"""An opset-12 Softmax over the last axis of ``[N, T, C]`` whose input's rank ONNX's
shape inference loses (a PaddleOCR recognizer's Reshape to a computed shape) stays one
Softmax when the opset is raised, so its output is read as class scores per position
(the version converter had made it Shape/Flatten/Softmax/Reshape: a Reshape's output, no
classes found, three extra decision groups)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantscope.model.load import load_proto
from quantscope.tasks.classes import class_output
from quantscope.tasks.layout import layout_tasks


def _recognizer(*, declared_output: bool) -> onnx.ModelProto:
    """x [N, 4, 6] -> MatMul [N, 4, 7] -> Reshape(Concat(Shape[:1], [-1, 7])) ->
    Softmax(axis=2) at opset 12 (ONNX infers no rank after the Reshape)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(6, 7)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array([-1, 7], np.int64), "tail")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
             helper.make_node("Shape", ["h"], ["hs"], name="shape"),
             helper.make_node("Slice", ["hs", "zero", "one"], ["n"], name="batch"),
             helper.make_node("Concat", ["n", "tail"], ["target"], axis=0, name="cat"),
             helper.make_node("Reshape", ["h", "target"], ["r"], name="reshape"),
             helper.make_node("Softmax", ["r"], ["probs"], axis=2, name="softmax")]
    if not declared_output:  # the Softmax's rank from onnxruntime's symbolic inference
        nodes[-1].output[0] = "p"
        nodes.append(helper.make_node("Mul", ["p", "p"], ["probs"], name="square"))
    out = helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", "T", 7])
    graph = helper.make_graph(nodes, "rec", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", 4, 6])], [out], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])


def test_onnx_loses_the_rank_here() -> None:
    """The premise: without help the converter flattens (else the test proves nothing)."""
    proto = _recognizer(declared_output=True)
    converted = onnx.version_converter.convert_version(proto, 21)
    assert "Flatten" in [n.op_type for n in converted.graph.node]


def test_softmax_kept_one_node_and_read_as_classes() -> None:
    for declared in (True, False):
        model = load_proto(_recognizer(declared_output=declared))
        ops = [n.op_type for n in model.graph.node]
        assert "Flatten" not in ops and "Softmax" in ops, (declared, ops)
        softmax = next(n for n in model.graph.node if n.op_type == "Softmax")
        assert [a.i for a in softmax.attribute if a.name == "axis"] in ([-1], [2])
        if not declared:
            continue
        assert class_output(model, "probs") == 2
        task, notes = layout_tasks(model, (), "d.npz")
        assert task is not None and "a Softmax over the classes" in notes[0]


def test_function_unchanged() -> None:
    import onnxruntime as ort

    x = np.random.default_rng(1).normal(size=(3, 4, 6)).astype(np.float32)
    proto = _recognizer(declared_output=True)
    ref = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]
                               ).run(None, {"x": x})[0]
    model = load_proto(proto)
    got = ort.InferenceSession(model.proto.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)
