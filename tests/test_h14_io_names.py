"""``io --check-mapping`` naming a tensor that is no quantized input or output lists the
ones there are each quoted (repr), so a name holding ', ' cannot be read as two."""

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantscope.cli import main


def _model_with_comma_names() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.random.default_rng(0).normal(0, 0.5, (4, 2)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
             helper.make_node("Split", ["h"], ["a, b", "c"], axis=1, num_outputs=2, name="split")]
    g = helper.make_graph(nodes, "commas",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("a, b", onnx.TensorProto.FLOAT, ["N", 1]),
                           helper.make_tensor_value_info("c", onnx.TensorProto.FLOAT, ["N", 1])],
                          [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def test_unknown_mapping_tensor_lists_the_names_quoted(tmp_path, capsys):
    m, x, s = tmp_path / "m.onnx", tmp_path / "x.npy", tmp_path / "s.npz"
    onnx.save(_model_with_comma_names(), m)
    np.save(x, np.random.default_rng(1).uniform(-1, 1, (64, 4)).astype(np.float32))
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(s)]) == 0
    capsys.readouterr()
    j = tmp_path / "io.json"
    assert main(["io", str(m), "--stats", str(s), "--precision", "a8_w8",
                 "--check-mapping", "nope=0:1,1:2", "--json", str(j)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, no traceback
    assert "mapping names 'nope', which is no quantized input or output" in err[0]
    assert "(these are: 'x', 'a, b', 'c')" in err[0], err[0]
    assert not j.exists()
