"""Emulation sessions take their large weights as buffers (emulate.session.external_weights):
the same outputs as the serialized model, the model's bytes without those weights, and the
buffers alive for as long as the session, whatever else is dropped."""

import gc

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from quantscope.emulate.session import EXTERNAL_BYTES, external_weights, make_session


def _model(rng: np.random.Generator) -> onnx.ModelProto:
    w = rng.normal(size=(256, 256)).astype(np.float32)  # 256 KiB: handed over
    b = rng.normal(size=256).astype(np.float32)  # 1 KiB: serialized
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 256])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_large_weights_are_handed_over_and_the_outputs_are_the_same() -> None:
    rng = np.random.default_rng(0)
    proto = _model(rng)
    data, names, values = external_weights(proto)
    assert names == ["w"] and len(data) < EXTERNAL_BYTES < proto.ByteSize()
    x = rng.normal(size=(4, 256)).astype(np.float32)
    opts = ort.SessionOptions()  # as make_session's, but for the weights in the bytes
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    opts.add_session_config_entry("session.disable_prepacking", "1")
    plain = ort.InferenceSession(proto.SerializeToString(), opts,
                                 providers=["CPUExecutionProvider"])
    expected = plain.run(None, {"x": x})[0]
    session = make_session(proto, threads=1)
    del proto, data, values, plain
    gc.collect()
    [np.ones((256, 256), np.float32) * k for k in range(8)]  # reuse freed memory, if any
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], expected)


def test_an_initializer_that_is_also_an_input_stays_in_the_bytes() -> None:
    proto = _model(np.random.default_rng(1))
    proto.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [256, 256]))
    assert external_weights(proto)[1] == []
