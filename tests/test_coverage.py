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


def test_a_matmul_of_two_constants_is_said_as_a_constant():
    """DeBERTa's relative position embeddings times a projection (both initializers after
    export) is a MatMul off the data path: left float with that reason, not 'MatMul is not
    a weighted op the emulator quantizes (Conv/Gemm/MatMul)', which contradicts itself."""
    r = np.random.default_rng(0)
    inits = [numpy_helper.from_array(r.normal(0, 0.3, (4, 6)).astype(np.float32), n)
             for n in ("rel", "w")]
    inits.append(numpy_helper.from_array(r.normal(0, 0.3, (4, 4)).astype(np.float32), "wx"))
    nodes = [helper.make_node("MatMul", ["rel", "w_t"], ["pos"], name="pos_proj/MatMul"),
             helper.make_node("Transpose", ["w"], ["w_t"], perm=[1, 0], name="t"),
             helper.make_node("MatMul", ["x", "wx"], ["h"], name="proj/MatMul"),
             helper.make_node("MatMul", ["h", "pos_t"], ["out"], name="c2p/MatMul"),
             helper.make_node("Transpose", ["pos"], ["pos_t"], perm=[1, 0], name="pt")]
    nodes = [nodes[1], nodes[0], nodes[4], nodes[2], nodes[3]]
    g = helper.make_graph(
        nodes, "c2p", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, ["N", 4])], inits)
    model = load_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]), "c2p")
    x = np.random.default_rng(1).normal(0, 1, (5, 4)).astype(np.float32)
    _, stats = _stats(model, x)
    cov = quantize_model(model, stats, Plan.uniform(Precision.A8_W8),
                         scheme=QuantScheme()).coverage
    rows = {t: why for t, _, why in cov.weights_float}
    assert set(rows) == {"rel", "w_t"}
    assert all("every operand is a constant" in why and "Conv/Gemm/MatMul" not in why
               for why in rows.values())
