"""The checker and shape inference on a model without its weights' data
(quantscope.model.weightless): the same proto and the same refusals as on the whole."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper, shape_inference

from quantscope.kept import Kept
from quantscope.model import weightless
from quantscope.model.load import load_proto
from quantscope.types import QuantscopeError


def _model(w: onnx.TensorProto | None = None) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    big = w if w is not None else numpy_helper.from_array(
        rng.normal(size=(64, 96)).astype(np.float32), "w")  # 6,144 values: left out
    inits = [big, numpy_helper.from_array(rng.normal(size=96).astype(np.float32), "b"),
             numpy_helper.from_array(np.array([0, 10, 48], np.int64), "shape")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Reshape", ["a", "shape"], ["y"])]  # a shape constant kept
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     ["n", 5, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 3)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.metadata_props.add(key="k", value="v")
    return m


def test_the_light_copy_leaves_out_only_the_large_weights():
    light, held = weightless.light_proto(_model())
    assert [t.name for t in held] == ["w"]
    assert [t.name for t in light.graph.initializer] == ["b", "shape"]
    assert [i.name for i in light.graph.input] == ["x", "w"]
    assert light.metadata_props[0].value == "v" and light.opset_import[0].version == 21


def test_inference_gives_the_proto_inference_on_the_whole_gives():
    m = _model()
    before = m.SerializeToString()
    got = weightless.infer_shapes(m)
    want = shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
    assert got.SerializeToString() == want.SerializeToString()
    assert m.SerializeToString() == before  # the given proto as it was
    shapes = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in got.graph.value_info}
    assert shapes["m"] == ["n", 5, 96]
    out = got.graph.output[0].type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in out] == ["n", 10, 48]


def _refusal(w: onnx.TensorProto) -> tuple[str, str]:
    with pytest.raises(onnx.checker.ValidationError) as whole:
        onnx.checker.check_model(_model(w))
    with pytest.raises(onnx.checker.ValidationError) as light:
        weightless.check_model(_model(w))
    return str(whole.value), str(light.value)


def test_a_bad_large_weight_is_refused_in_the_checkers_words():
    w = numpy_helper.from_array(np.ones((64, 96), np.float32), "w")
    w.raw_data = w.raw_data[:-4]
    whole, light = _refusal(w)
    assert whole == light and "raw_data size" in light
    two = numpy_helper.from_array(np.ones((64, 96), np.float32), "w")
    two.float_data.extend([1.0] * (64 * 96))
    whole, light = _refusal(two)
    assert whole == light and "one and only one value field" in light
    weightless.check_model(_model())  # a good one passes


def test_load_refuses_a_short_weight_with_one_line():
    w = numpy_helper.from_array(np.ones((64, 96), np.float32), "w")
    w.raw_data = w.raw_data[:-4]
    with pytest.raises(QuantscopeError, match="fails the ONNX checker .*raw_data size"):
        load_proto(_model(w), "m.onnx")


def _old_opset_model(opset: int) -> onnx.ModelProto:
    """Ops whose adapters rewrite attributes into inputs (Split, Squeeze, ReduceMean) or
    read constant inputs (Reshape), around a large MatMul weight and a large Gather table."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.normal(size=(64, 96)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(size=(100, 64)).astype(np.float32), "table"),
             numpy_helper.from_array(np.array([0, 5, 2, 48], np.int64), "shape")]
    split = ({"split": [48, 48]} if opset < 13 else {})
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"]),
             helper.make_node("MatMul", ["e", "w"], ["m"]),
             helper.make_node("Reshape", ["m", "shape"], ["r"]),
             helper.make_node("ReduceMean", ["r"], ["s"], axes=[3], keepdims=1)
             if opset < 18 else helper.make_node("ReduceMean", ["r", "ax"], ["s"]),
             helper.make_node("Squeeze", ["s"], ["q"], axes=[3]) if opset < 13
             else helper.make_node("Squeeze", ["s", "ax"], ["q"]),
             helper.make_node("Softmax", ["q"], ["p"], axis=-1),
             helper.make_node("Split", ["m"], ["a", "b"], axis=2, **split),
             helper.make_node("Add", ["a", "b"], ["y"])]
    if opset >= 13:
        inits.append(numpy_helper.from_array(np.array([3], np.int64), "ax"))
    g = helper.make_graph(nodes, "old", [helper.make_tensor_value_info("ids", TensorProto.INT64,
                                                                       ["n", 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("p", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 7
    return m


@pytest.mark.parametrize("opset", [11, 13, 17])
def test_the_version_converter_on_the_light_copy_gives_the_whole_models_proto(
        opset, monkeypatch):
    from onnx import version_converter

    monkeypatch.setattr(weightless, "LIGHT_CONVERT_BYTES", 0)  # these weights are small
    m = _old_opset_model(opset)
    before = m.SerializeToString()
    got = weightless.convert_version(m, 21)
    want = version_converter.convert_version(m, 21)
    assert got.SerializeToString() == want.SerializeToString()
    assert m.SerializeToString() == before
    assert [t.name for t in got.graph.initializer][:3] == ["w", "table", "shape"]
    assert got.opset_import[0].version == 21


@pytest.mark.parametrize("light", [True, False])
def test_a_graph_is_converted_once_and_each_load_gets_its_own_proto(light, monkeypatch):
    from onnx import version_converter

    if light:
        monkeypatch.setattr(weightless, "LIGHT_CONVERT_BYTES", 0)
    runs = []
    real = version_converter.convert_version
    m = _old_opset_model(13)
    expected = real(m, 21).SerializeToString()
    cpp = version_converter.C.convert_version  # what the kept conversions call
    monkeypatch.setattr(version_converter.C, "convert_version",
                        lambda d, t: runs.append(t) or cpp(d, t))
    monkeypatch.setattr(weightless, "_CONVERTED",
                        Kept(budget=weightless.KEPT_CONVERSIONS_BYTES, weigh=len))
    first = weightless.convert_version(m, 21)
    again = weightless.convert_version(m, 21)
    assert runs == [21]  # the second load found the first's conversion
    assert first is not again and first.SerializeToString() == again.SerializeToString()
    assert again.SerializeToString() == expected
    first.graph.node[0].name = "changed by its caller"  # a caller's change stays its own
    assert weightless.convert_version(m, 21).graph.node[0].name != "changed by its caller"
    other = _old_opset_model(11)
    weightless.convert_version(other, 21)
    weightless.convert_version(m, 20)
    assert runs == [21, 21, 20]  # another graph, another opset: converted
    monkeypatch.setattr(weightless._CONVERTED, "budget", 1)  # kept: the newest only
    weightless.convert_version(m, 19)
    assert [k[1] for k in weightless._CONVERTED] == [19]


def test_what_the_converter_raises_is_raised_at_each_load():
    m = _old_opset_model(13)
    m.graph.node[0].op_type = "NoSuchOp"
    for _ in range(2):
        with pytest.raises(Exception):  # noqa: B017 - the converter's own error type
            weightless.convert_version(m, 21)
