"""A uint8 image input, Cast to float and normalised in the graph before its first Conv.

Every tensor derived only from a non-float input was ``side`` (the attention-mask rule), so
the whole data path of such a model was: no group, nothing to tap, and ``run`` died in
calibration with ``internal error: ValueError: zip() argument 2 is longer than argument 1``.
A Cast of a non-float input that reaches a weighted op's data input through side tensors
only now starts the data path (``act``); a mask Cast that only meets activations in an Add
stays side.
"""

from __future__ import annotations

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper

from quantscope.calibrate.collect import calibrate
from quantscope.model.groups import find_groups, find_mask_adds, tensor_kinds
from quantscope.model.load import load_proto


def _image_model():
    r = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array([127.5], np.float32), "mean"),
             numpy_helper.from_array(np.array([127.5], np.float32), "std"),
             numpy_helper.from_array(r.normal(0, .3, (4, 3, 3, 3)).astype(np.float32), "w")]
    graph = helper.make_graph([
        helper.make_node("Transpose", ["img"], ["nchw"], name="to_nchw", perm=[0, 3, 1, 2]),
        helper.make_node("Cast", ["nchw"], ["f"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("Sub", ["f", "mean"], ["s"], name="sub"),
        helper.make_node("Div", ["s", "std"], ["n"], name="div"),
        helper.make_node("Conv", ["n", "w"], ["y"], name="conv", pads=[1] * 4)], "g",
        [helper.make_tensor_value_info("img", TensorProto.UINT8, [1, 8, 8, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    return load_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_a_cast_image_input_is_the_data_path_and_calibrates():
    model = _image_model()
    groups = find_groups(model)
    assert [g.op_type for g in groups.groups] == ["Cast", "Conv"]
    assert groups.groups[0].outputs == ("n",)  # normalised: quantized before the Conv
    assert groups.model_inputs == ()  # the uint8 input itself is fed as is
    r = np.random.default_rng(1)
    batches = [{"img": r.integers(0, 256, (1, 8, 8, 3)).astype(np.uint8)} for _ in range(3)]
    stats = calibrate(model, groups, batches)
    lo, hi = stats.tensors["n"].min, stats.tensors["n"].max
    assert -1.0 <= lo < -0.9 and 0.9 < hi <= 1.0


def test_a_mask_cast_that_only_meets_activations_stays_side():
    r = np.random.default_rng(0)
    inits = [numpy_helper.from_array(r.normal(0, .3, (4, 4)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array(-1e4, np.float32), "big")]
    graph = helper.make_graph([
        helper.make_node("MatMul", ["x", "w"], ["q"], name="proj"),
        helper.make_node("Cast", ["mask"], ["mf"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["mf", "big"], ["bias"], name="scale"),
        helper.make_node("Add", ["q", "bias"], ["scores"], name="add"),
        helper.make_node("Softmax", ["scores"], ["p"], name="softmax", axis=-1)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4]),
         helper.make_tensor_value_info("mask", TensorProto.INT64, [1, 4, 4])],
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, [1, 4, 4])], inits)
    model = load_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert tensor_kinds(model)["mf"] == "side"
    assert [m.node for m in find_mask_adds(model)] == ["add"]


def test_io_says_the_uint8_input_is_fed_as_it_is(tmp_path, capsys):
    """``io`` listed the quantized output only: the uint8 image input was not named at all
    (console, JSON and snippet), so a user could not tell whether to quantize it."""
    import json

    import onnx

    from quantscope.cli import main

    m, x, s = tmp_path / "m.onnx", tmp_path / "x.npz", tmp_path / "s.npz"
    onnx.save(_image_model().proto, m)
    np.savez(x, img=np.random.default_rng(1).integers(0, 256, (6, 8, 8, 3)).astype(np.uint8))
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(s)]) == 0
    j, py = tmp_path / "io.json", tmp_path / "io_host.py"
    assert main(["io", str(m), "--stats", str(s), "--precision", "a8_w8", "--json", str(j),
                 "--out-snippet", str(py)]) == 0
    out = capsys.readouterr().out
    assert "input  img: uint8, fed as it is: not quantized" in out
    assert json.loads(j.read_text())["as_is_io"] == [
        {"role": "input", "tensor": "img", "dtype": "uint8"}]
    assert "# input  img: uint8, fed as it is" in py.read_text()
    assert "to_device_img" not in py.read_text()


def cast_pool_model() -> ModelProto:
    """``img`` uint8 [1, 3, 8, 8] -> Cast -> Div 255 -> MaxPool -> ``y``: no weighted op."""
    graph = helper.make_graph([
        helper.make_node("Cast", ["img"], ["f"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("Div", ["f", "s"], ["n"], name="div"),
        helper.make_node("MaxPool", ["n"], ["y"], kernel_shape=[2, 2], strides=[2, 2],
                         name="pool")], "g",
        [helper.make_tensor_value_info("img", TensorProto.UINT8, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4, 4])],
        [numpy_helper.from_array(np.array([255.0], np.float32), "s")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_cast_image_input_with_no_weighted_op_is_the_data_path():
    """uint8 -> Cast -> Div -> MaxPool -> output: no weighted op to start the data path at;
    the float graph output does (it was all side: no tap, the zip() internal error)."""
    model = load_proto(cast_pool_model())
    groups = find_groups(model)
    assert [g.op_type for g in groups.groups] == ["Cast", "MaxPool"]
    r = np.random.default_rng(1)
    batches = [{"img": r.integers(0, 256, (1, 3, 8, 8)).astype(np.uint8)} for _ in range(2)]
    assert set(calibrate(model, groups, batches).tensors) == {"n", "y"}


def test_a_model_with_nothing_float_is_refused_in_one_line():
    """An int-only graph has no tap: ORT ran every output instead and calibrate died with the
    zip() internal error; it is now one line naming the model and the fix."""
    import pytest

    from quantscope.types import QuantscopeError

    graph = helper.make_graph([helper.make_node("Add", ["ids", "one"], ["y"], name="add")],
                              "g", [helper.make_tensor_value_info("ids", TensorProto.INT32, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 4])],
                              [numpy_helper.from_array(np.array([1], np.int32), "one")])
    model = load_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                       "ints.onnx")
    with pytest.raises(QuantscopeError, match="ints.onnx: nothing to quantize.*give the float"):
        calibrate(model, find_groups(model), [{"ids": np.arange(4, dtype=np.int32)[None]}])


def test_io_says_a_uint8_output_is_read_as_it_is(tmp_path, capsys):
    """An image-to-image model that Casts its output back to uint8: ``io`` said nothing of
    the output (not float, so no row) and ``no quantized model inputs or outputs (they
    stay float under this plan)``, which they do not."""
    import onnx

    from quantscope.cli import main

    r = np.random.default_rng(0)
    graph = _uint8_out_graph(r)
    m, x, s = tmp_path / "m.onnx", tmp_path / "x.npz", tmp_path / "s.npz"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), m)
    np.savez(x, img=r.integers(0, 256, (6, 3, 8, 8)).astype(np.uint8))
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(s)]) == 0
    capsys.readouterr()
    assert main(["io", str(m), "--stats", str(s), "--precision", "a8_w8"]) == 0
    out = capsys.readouterr().out
    assert "output out: uint8, read as it is: not quantized" in out
    assert "input  img: uint8, fed as it is" in out
    assert "stay float" not in out


def _uint8_out_graph(r):
    """uint8 image -> Cast, /255, Conv, Sigmoid, *255 -> Cast back to uint8."""
    return helper.make_graph([
        helper.make_node("Cast", ["img"], ["f"], name="cast_in", to=TensorProto.FLOAT),
        helper.make_node("Div", ["f", "s"], ["n"], name="div"),
        helper.make_node("Conv", ["n", "w"], ["c"], name="conv", pads=[1] * 4),
        helper.make_node("Sigmoid", ["c"], ["p"], name="sig"),
        helper.make_node("Mul", ["p", "s"], ["q"], name="scale"),
        helper.make_node("Cast", ["q"], ["out"], name="cast_out", to=TensorProto.UINT8)], "g",
        [helper.make_tensor_value_info("img", TensorProto.UINT8, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("out", TensorProto.UINT8, [1, 3, 8, 8])],
        [numpy_helper.from_array(np.array([255.0], np.float32), "s"),
         numpy_helper.from_array(r.normal(0, .3, (3, 3, 3, 3)).astype(np.float32), "w")])


def test_the_run_verdict_and_report_say_the_uint8_io(tmp_path):
    """``run``'s verdict said ``no quantized input or output (they stay float)`` of a model
    whose input and output are uint8 (the report's device section too)."""
    import json

    import onnx

    from quantscope.cli import main

    r = np.random.default_rng(0)
    m, x = tmp_path / "m.onnx", tmp_path / "x.npz"
    onnx.save(helper.make_model(_uint8_out_graph(r), opset_imports=[helper.make_opsetid("", 17)]),
              m)
    np.savez(x, img=r.integers(0, 256, (8, 3, 8, 8)).astype(np.uint8))
    w = tmp_path / "W"
    assert main(["run", str(m), "--data", str(x), "--target", "hailo8", "--out", str(w)]) == 0
    v = json.loads((w / "verdict.json").read_text())
    assert v["io_as_is"] == [{"role": "input", "tensor": "img", "dtype": "uint8"},
                             {"role": "output", "tensor": "out", "dtype": "uint8"}]
    report = (w / "report.html").read_text()
    assert "output out: uint8, as it is (not quantized" in report
    assert "they stay float" not in report
