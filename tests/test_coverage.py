"""Coverage: what a build quantized, and what it left float and why (never silent)."""

import numpy as np
import onnx
import tiny_models as tm
from onnx import helper, numpy_helper

from quantscope import stages
from quantscope.emulate.qdq import quantize_model
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.types import Dataset, Plan, Precision, QuantScheme


def _lstm_model() -> onnx.ModelProto:
    r = np.random.default_rng(0)
    hidden, feat = 8, 4
    w = numpy_helper.from_array(r.normal(0, 0.3, (1, 4 * hidden, feat)).astype(np.float32), "W")
    rr = numpy_helper.from_array(r.normal(0, 0.3, (1, 4 * hidden, hidden)).astype(np.float32), "R")
    fc = numpy_helper.from_array(r.normal(0, 0.3, (hidden, 3)).astype(np.float32), "fc")
    nodes = [
        helper.make_node("LSTM", ["x", "W", "R"], ["y", "y_h"], hidden_size=hidden, name="lstm"),
        helper.make_node("Squeeze", ["y_h", "ax"], ["h"], name="sq"),
        helper.make_node("MatMul", ["h", "fc"], ["out"], name="head"),
    ]
    ax = numpy_helper.from_array(np.array([0], np.int64), "ax")
    g = helper.make_graph(
        nodes, "lstm",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [5, "N", feat])],
        [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, ["N", 3])],
        [w, rr, fc, ax])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def _stats(model, x):
    batches = ({model.input_names()[0]: x},)
    data = Dataset(name="x", calibration=batches, evaluation=batches)
    return data, stages.calibrate_model(model, data)


def test_lstm_weights_are_reported_as_left_float():
    model = load_proto(_lstm_model(), "lstm")
    x = np.random.default_rng(1).normal(0, 1, (5, 6, 4)).astype(np.float32)
    data, stats = _stats(model, x)
    q = quantize_model(model, stats, Plan.uniform(Precision.A8_W8), scheme=QuantScheme())
    cov = q.coverage
    assert {t for t, _, _ in cov.weights_float} == {"W", "R"}
    assert all(op == "LSTM" and "not quantized" in why for _, op, why in cov.weights_float)
    assert cov.weights_quantized == 1 and not cov.complete
    assert any("LEFT FLOAT" in line for line in cov.lines())
    result = stages.evaluate_plan(model, data, stats, Plan.uniform(Precision.A8_W8))
    assert {r["tensor"] for r in result["coverage"]["weights_float"]} == {"W", "R"}
    assert "weight W (LSTM) left float" in stages.format_result(result)


def test_conv_net_is_fully_covered_and_float_groups_are_named():
    model = load_proto(tm.conv_net(), "conv")
    x = np.random.default_rng(1).normal(0, 1, (4, 3, 16, 16)).astype(np.float32)
    _, stats = _stats(model, x)
    q = quantize_model(model, stats, Plan.uniform(Precision.A8_W8), scheme=QuantScheme())
    assert q.coverage.complete and q.coverage.weights_quantized == 3
    first = find_groups(model).groups[0].name
    plan = Plan(default=Precision.A8_W8, overrides=((first, Precision.FLOAT),))
    cov = quantize_model(model, stats, plan, scheme=QuantScheme()).coverage
    assert any(n == first and "float" in why for n, _, why in cov.ops_float)
