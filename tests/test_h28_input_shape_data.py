"""``run --input-shape`` at another size than the data's samples (a recognizer compiled
640 px wide, measured on 320 px lines): the figures are the data's size's while the size
rules and the compiler take the given one; that was said nowhere. ``run`` now says it in
a ``warning:`` line before any work (h28)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantscope import stages
from quantscope.model.load import load_proto
from quantscope.tasks.sizes import other_size_line


def _conv(tmp_path):
    k = numpy_helper.from_array(np.ones((2, 3, 3, 3), np.float32), "k")
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "k"], ["y"], pads=[1, 1, 1, 1], name="conv")], "c",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, 8, "W"])], [k])
    model = load_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    data = tmp_path / "d.npz"
    np.savez(data, x=np.zeros((6, 3, 8, 16), np.float32))
    return model, stages.open_data(str(data), model)


def test_another_size_than_the_data_is_said(tmp_path) -> None:
    model, fit = _conv(tmp_path)
    line = other_size_line(model, fit, (("x", (1, 3, 8, 32)),))
    assert line is not None and line.startswith("warning: --input-shape x=1x3x8x32 (the "
                                                "data's 1x3x8x16, axis 3)")
    assert other_size_line(model, fit, (("x", (1, 3, 8, 16)),)) is None
    assert other_size_line(model, fit, (("x", (4, 3, 8, 16)),)) is None  # the batch aside
    onnx.checker.check_model(model.proto)
