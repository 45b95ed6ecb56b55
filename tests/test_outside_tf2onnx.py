"""A tf2onnx-style export (issue: models as real toolchains export them): NHWC input
``input_1:0`` turned NCHW by a Transpose (``model/conv/Conv2D__6``) before the first Conv,
names with ':' and '/', a symbolic batch ``unk__7``.

The QNN encodings file had no entry for the Transpose's output (``model/conv/Conv2D__6:0``),
the tensor the first Conv reads, while a Reshape/Flatten after a group got its group's
encoding: a pass-through of a *model input* was left out, so the converter picked its own
encoding for the compiled graph's first activation. The original names must survive.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantscope.cli import main


def tf2onnx_nhwc() -> onnx.ModelProto:
    r = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(r.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32),
                                "conv/kernel:0"),
        numpy_helper.from_array(np.zeros(8, np.float32), "conv/bias:0"),
        numpy_helper.from_array(r.normal(0, 0.3, (5, 8)).astype(np.float32), "dense/kernel:0"),
        numpy_helper.from_array(np.zeros(5, np.float32), "dense/bias:0")]
    nodes = [
        helper.make_node("Transpose", ["input_1:0"], ["model/conv/Conv2D__6:0"],
                         perm=[0, 3, 1, 2], name="model/conv/Conv2D__6"),
        helper.make_node("Conv", ["model/conv/Conv2D__6:0", "conv/kernel:0", "conv/bias:0"],
                         ["model/conv/BiasAdd:0"], pads=[1, 1, 1, 1], name="model/conv/BiasAdd"),
        helper.make_node("Relu", ["model/conv/BiasAdd:0"], ["model/conv/Relu:0"],
                         name="model/conv/Relu"),
        helper.make_node("GlobalAveragePool", ["model/conv/Relu:0"], ["gap:0"],
                         name="model/gap"),
        helper.make_node("Flatten", ["gap:0"], ["flat:0"], name="model/flatten"),
        helper.make_node("Gemm", ["flat:0", "dense/kernel:0", "dense/bias:0"], ["dense:0"],
                         transB=1, name="model/dense/BiasAdd")]
    graph = helper.make_graph(
        nodes, "tf2onnx",
        [helper.make_tensor_value_info("input_1:0", TensorProto.FLOAT, ["unk__7", 16, 16, 3])],
        [helper.make_tensor_value_info("dense:0", TensorProto.FLOAT, ["unk__7", 5])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_the_input_transpose_has_the_inputs_qnn_encoding(tmp_path):
    path = tmp_path / "tf2onnx.onnx"
    onnx.save(tf2onnx_nhwc(), path)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    np.savez(tmp_path / "x.npz", **{"input_1:0": np.random.default_rng(1).random(
        (8, 16, 16, 3)).astype(np.float32)})
    stats, plan, out = tmp_path / "s.npz", tmp_path / "plan.json", tmp_path / "q.json"
    assert main(["calibrate", str(path), "--data", str(tmp_path / "x.npz"),
                 "--out", str(stats)]) == 0
    plan.write_text(json.dumps({"format": "quantscope.plan/1", "default": "a8_w8",
                                "target": "qnn_htp_v73",
                                "groups": {"model/conv/BiasAdd": "a16_w8"}}))
    assert main(["export", "--model", str(path), "--stats", str(stats), str(plan),
                 "--format", "qnn", "--out", str(out)]) == 0
    acts = {e["name"]: e for e in json.loads(out.read_text())["activation_encodings"]}
    assert {"input_1:0", "model/conv/Conv2D__6:0", "model/conv/Relu:0", "gap:0", "flat:0",
            "dense:0"} <= set(acts)
    moved, given = acts["model/conv/Conv2D__6:0"], acts["input_1:0"]
    assert (moved["bw"], moved["scale"], moved["offset"]) == \
        (given["bw"], given["scale"], given["offset"]) and given["bw"] == 16
    params = {e["name"] for e in json.loads(out.read_text())["param_encodings"]}
    assert params == {"conv/kernel:0", "dense/kernel:0"}
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
