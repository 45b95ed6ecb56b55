"""An old exporter's graph lists every initializer as a graph input too (IR < 4). quantscope
never feeds them, so the graphs it writes must not list them: a compiler would ask for
inputs the device is never given (found trying such a model as a user would, stop 57)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from quantscope import stages
from quantscope.emulate.qdq import quantize_model
from quantscope.model.load import load
from quantscope.types import Plan, Precision, QuantScheme


def _old_export(path) -> None:
    r = np.random.default_rng(0)
    w = numpy_helper.from_array(r.normal(0, 0.3, (8, 4)).astype(np.float32), "w")
    b = numpy_helper.from_array(r.normal(0, 0.1, 4).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])],
        "old", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8]),
                helper.make_tensor_value_info("w", TensorProto.FLOAT, [8, 4]),
                helper.make_tensor_value_info("b", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=3)
    onnx.save(model, path)


def test_initializers_listed_as_inputs_are_weights_and_not_exported_as_inputs(tmp_path):
    path = tmp_path / "old.onnx"
    _old_export(path)
    before = path.read_bytes()
    model = load(path)
    assert [i.name for i in model.graph.input] == ["x"]
    assert any("2 initializer(s) were also listed as graph inputs" in n for n in model.notes)
    x = np.random.default_rng(1).normal(0, 1, (16, 8)).astype(np.float32)
    stats = stages.calibrate_model(model, stages.open_data(str(_save(tmp_path, x)), model))
    qdq = quantize_model(model, stats, Plan.uniform(Precision.A8_W8), scheme=QuantScheme()).proto
    assert [i.name for i in qdq.graph.input] == ["x"]  # what a compiler is handed
    sess = ort.InferenceSession(qdq.SerializeToString(), providers=["CPUExecutionProvider"])
    assert sess.run(None, {"x": x})[0].shape == (16, 4)
    assert path.read_bytes() == before  # the input file untouched


def _save(tmp_path, x):
    p = tmp_path / "x.npy"
    np.save(p, x)
    return p
