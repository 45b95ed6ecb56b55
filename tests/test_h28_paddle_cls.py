"""A Paddle2ONNX classifier (PP-OCR's text orientation classifier): its input declared
``[-1, 3, ?, ?]`` and its output an ``Identity`` of the Softmax. The ``-1`` was read as a
fixed size, so every batch of data was refused ("axis 0 is 48, the model's -1: pad or
crop"), and the Softmax behind the Identity was not read as class scores (h28)."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantscope.cli import main
from quantscope.model.load import load_proto
from quantscope.tasks.classes import class_output


def paddle_classifier() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32), "k"),
             numpy_helper.from_array(rng.normal(0, 0.5, (4, 2)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus_one")]
    nodes = [helper.make_node("Conv", ["x", "k"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("GlobalAveragePool", ["c"], ["p"], name="pool"),
             # Paddle's flatten: a Reshape to a shape computed from Shape (its rank lost
             # to ONNX's inference at opset 11)
             helper.make_node("Shape", ["p"], ["ps"], name="shape"),
             helper.make_node("Slice", ["ps", "zero", "one"], ["n"], name="batch"),
             helper.make_node("Concat", ["n", "minus_one"], ["to"], axis=0, name="cat"),
             helper.make_node("Reshape", ["p", "to"], ["f"], name="flat"),
             helper.make_node("MatMul", ["f", "w"], ["logits"], name="fc"),
             helper.make_node("Softmax", ["logits"], ["probs"], axis=1, name="softmax"),
             helper.make_node("Identity", ["probs"], ["save_infer_model/scale_0.tmp_1"],
                              name="scale")]
    g = helper.make_graph(
        nodes, "cls", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, None, None])],
        [helper.make_tensor_value_info("save_infer_model/scale_0.tmp_1", TensorProto.FLOAT,
                                       [-1, 2])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 11)])


def test_negative_dims_are_symbolic_and_said() -> None:
    model = load_proto(paddle_classifier())
    assert model.value_shapes()["x"][0] == "x_dim0"
    assert any("dims declared -1" in n and "'x' axis 0" in n for n in model.notes)


def test_softmax_behind_identity_is_read_as_classes() -> None:
    model = load_proto(paddle_classifier())
    assert "Flatten" not in [n.op_type for n in model.graph.node]  # one Softmax kept
    assert class_output(model, "save_infer_model/scale_0.tmp_1") == 1


def test_evaluate_takes_any_batch(tmp_path, capsys) -> None:
    m, x, s, j = (tmp_path / n for n in ("m.onnx", "x.npy", "s.npz", "r.json"))
    onnx.save(paddle_classifier(), m)
    np.save(x, np.random.default_rng(1).normal(0, 1, (24, 3, 8, 16)).astype(np.float32))
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(s)]) == 0, \
        capsys.readouterr().err
    assert main(["evaluate", str(m), "--data", str(x), "--stats", str(s), "--precision",
                 "a8_w8", "--json", str(j)]) == 0
    result = json.loads(j.read_text())
    assert "top1_agreement" in result["metrics"]
