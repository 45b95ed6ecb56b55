"""A classifier that outputs its decision inside the graph (h24): ``TopK`` (float values and
int64 indices) and ``ArgMax`` (an int64 label) beside the logits. The int outputs are no
activations to quantize (a Q/DQ pair on int64 is a graph ONNX Runtime refuses)."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantscope.cli import main
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto


def decision_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.6, (8, 6)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([3], np.int64), "k")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits"], name="fc"),
             helper.make_node("TopK", ["logits", "k"], ["top_v", "top_i"], axis=1, name="topk"),
             helper.make_node("ArgMax", ["logits"], ["label"], axis=1, keepdims=0, name="argmax")]
    g = helper.make_graph(
        nodes, "decisions", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 6]),
         helper.make_tensor_value_info("top_v", TensorProto.FLOAT, ["N", 3]),
         helper.make_tensor_value_info("top_i", TensorProto.INT64, ["N", 3]),
         helper.make_tensor_value_info("label", TensorProto.INT64, ["N"])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def test_int_outputs_are_no_group_outputs():
    groups = find_groups(load_proto(decision_model()))
    outs = {t for g in groups.groups for t in g.outputs}
    assert "top_v" in outs and "logits" in outs
    assert "top_i" not in outs  # TopK's int64 indices: not quantized


def test_evaluate_runs_a_model_with_int_outputs(tmp_path, capsys):
    m, x, s, j = (tmp_path / n for n in ("m.onnx", "x.npy", "s.npz", "r.json"))
    onnx.save(decision_model(), m)
    np.save(x, np.random.default_rng(1).normal(0, 1, (48, 8)).astype(np.float32))
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(s)]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(m), "--data", str(x), "--stats", str(s),
                 "--precision", "a8_w8", "--json", str(j)]) == 0, capsys.readouterr().err
