"""A GroupNormalization (opset 21) classifier with only its batch symbolic (h24): ONNX's
shape inference gives the norm's output no shape, so every size rule on it read 'size
unknown: give --input-shape' while run knew the compiled shape from the data (its host
line said x=1x3x8x8). The data's size is now taken, as for a graph ONNX cannot fold
without a concrete batch."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantscope.model.load import load_proto
from quantscope.tasks.sizes import data_shapes


def _group_norm_classifier() -> onnx.ModelProto:
    r = np.random.default_rng(0)
    f32 = np.float32
    inits = [numpy_helper.from_array(r.normal(0, 0.3, (8, 3, 3, 3)).astype(f32), "w"),
             numpy_helper.from_array(r.uniform(0.5, 1.5, 8).astype(f32), "s"),
             numpy_helper.from_array(r.normal(0, 0.1, 8).astype(f32), "b"),
             numpy_helper.from_array(r.normal(0, 1, (8, 5)).astype(f32), "fc_w")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("GroupNormalization", ["c", "s", "b"], ["n"], num_groups=2, name="gn"),
             helper.make_node("Relu", ["n"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["p"], name="gap"),
             helper.make_node("Flatten", ["p"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "fc_w"], ["logits"], name="fc")]
    g = helper.make_graph(nodes, "gn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 5])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def test_a_norm_onnx_cannot_shape_takes_the_datas_size():
    model = load_proto(_group_norm_classifier())
    assert "n" not in model.value_shapes()  # what ONNX's inference leaves
    batches = [{"x": np.zeros((4, 3, 8, 8), np.float32)}, {"x": np.zeros((2, 3, 8, 8), np.float32)}]
    fixed, differ = data_shapes(model, batches)
    assert dict(fixed) == {"x": (1, 3, 8, 8)} and not differ
