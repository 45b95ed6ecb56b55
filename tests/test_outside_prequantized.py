"""A model already quantized by ONNX Runtime's quantization tool, passed by mistake
(issue: models as real toolchains export them).

``quantize_static`` (QDQ) stopped ``run`` after the rewrite choice with ``node
'w_DequantizeLinear' is a DequantizeLinear, which quantscope cannot emulate (control flow
or an already-quantized model)``; its QOperator form (QLinearConv, ``com.microsoft.QGemm``)
was refused as an ONNX Runtime *transformer optimiser* output, with that wrong fix. Every
form is now refused at load, in one line naming it, its ops and the fix (the float
model), before any work and without touching the file.
"""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantscope.cli import main


def float_model() -> onnx.ModelProto:
    """x [N, 2, 6, 6] -> Conv -> Relu -> Flatten -> Gemm -> y [N, 4]."""
    r = np.random.default_rng(0)
    inits = [numpy_helper.from_array(r.normal(0, 0.5, (3, 2, 3, 3)).astype(np.float32), "cw"),
             numpy_helper.from_array(r.normal(0, 0.1, 3).astype(np.float32), "cb"),
             numpy_helper.from_array(r.normal(0, 0.3, (4, 48)).astype(np.float32), "gw"),
             numpy_helper.from_array(r.normal(0, 0.1, 4).astype(np.float32), "gb")]
    nodes = [helper.make_node("Conv", ["x", "cw", "cb"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Flatten", ["r"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "gw", "gb"], ["y"], name="fc", transB=1)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


DATA = np.random.default_rng(1).uniform(0, 1, (8, 2, 6, 6)).astype(np.float32)


def _quantized(folder, form: str):
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        quantize_dynamic,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.rows = iter([{"x": DATA[i:i + 1]} for i in range(4)])

        def get_next(self):
            return next(self.rows, None)

    src, dst = folder / "float.onnx", folder / f"{form}.onnx"
    onnx.save(float_model(), src)
    if form == "dynamic":
        quantize_dynamic(src, dst, op_types_to_quantize=["Conv", "Gemm", "MatMul"])
    else:
        quantize_static(src, dst, Reader(), quant_format=(
            QuantFormat.QDQ if form == "qdq" else QuantFormat.QOperator))
    return dst


LINES = {
    "qdq": "QDQ format, as onnxruntime.quantization.quantize_static or quantscope's "
           "quantized.qdq.onnx write: DequantizeLinear x",
    "qoperator": "QOperator format, as onnxruntime.quantization.quantize_static("
                 "quant_format=QOperator) writes: ",
    "dynamic": "dynamically quantized, as onnxruntime.quantization.quantize_dynamic "
               "writes: ",
}


@pytest.mark.parametrize("form", ["qdq", "qoperator", "dynamic"])
@pytest.mark.parametrize("command", [["run", "--target", "hailo8", "--out"],
                                     ["calibrate", "--out"]])
def test_an_already_quantized_model_is_refused_in_one_line(tmp_path, capsys, form, command):
    model = _quantized(tmp_path, form)
    np.savez(tmp_path / "feeds.npz", x=DATA)
    before = hashlib.sha256(model.read_bytes()).hexdigest()
    out = tmp_path / "out"
    argv = [command[0], str(model), "--data", str(tmp_path / "feeds.npz"), *command[1:],
            str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"quantscope: error: model '{model}' is already quantized "
                             f"({LINES[form]}")
    assert err[0].endswith("would quantize this one twice: pass the float model it was "
                           "made from")
    assert not out.exists()
    assert hashlib.sha256(model.read_bytes()).hexdigest() == before


def test_the_float_model_it_was_made_from_loads(tmp_path):
    from quantscope.model.load import load_proto

    assert load_proto(float_model(), "float").output_names() == ("y",)


def test_a_weight_only_model_is_named_as_such():
    """A 4-bit ``com.microsoft.MatMulNBits`` graph (onnxruntime's MatMulNBitsQuantizer) is
    refused as weight-only quantized, not as QOperator nor as a transformer-optimiser
    output."""
    from onnx import helper

    from quantscope.model.load import load_proto
    from quantscope.types import QuantscopeError

    graph = helper.make_graph(
        [helper.make_node("MatMulNBits", ["x", "wq", "sc"], ["y"], domain="com.microsoft",
                          K=16, N=4, bits=4, block_size=16)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(np.zeros((4, 1, 8), np.uint8), "wq"),
         numpy_helper.from_array(np.ones(4, np.float32), "sc")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    with pytest.raises(QuantscopeError) as err:
        load_proto(proto, "nbits")
    assert str(err.value) == (
        "model 'nbits' is already quantized (weights in 4/8-bit blocks, as "
        "onnxruntime.quantization's MatMulNBitsQuantizer writes: com.microsoft.MatMulNBits); "
        "quantscope quantizes a float model itself and would quantize this one twice: pass "
        "the float model it was made from")
