"""The fine-tune's ONNX -> torch conversion of an edge vision classifier (h24): a
MobileNetV3 block's HardSwish and HardSigmoid squeeze-excite gate, an EfficientNet's
unfolded BatchNormalization, and the class pick in the graph (ArgMax, ArgMin, TopK).
Before, ``run --finetune on`` on such a model said 'op HardSwish has no torch converter'
and fine-tuned nothing."""

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from quantscope.emulate.session import make_session
from quantscope.finetune.graph import to_torch


def _vision_block() -> onnx.ModelProto:
    r = np.random.default_rng(3)
    f32 = np.float32
    inits = [numpy_helper.from_array(r.normal(0, 0.5, (8, 3, 3, 3)).astype(f32), "w"),
             numpy_helper.from_array(r.uniform(0.5, 1.5, 8).astype(f32), "bn_s"),
             numpy_helper.from_array(r.normal(0, 0.3, 8).astype(f32), "bn_b"),
             numpy_helper.from_array(r.normal(0, 0.3, 8).astype(f32), "bn_m"),
             numpy_helper.from_array(r.uniform(0.5, 2.0, 8).astype(f32), "bn_v"),
             numpy_helper.from_array(r.normal(0, 0.5, (8, 8, 1, 1)).astype(f32), "se_w"),
             numpy_helper.from_array(r.normal(0, 0.5, (8, 5)).astype(f32), "fc"),
             numpy_helper.from_array(np.array([3], np.int64), "k")]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "bn_s", "bn_b", "bn_m", "bn_v"], ["bn"],
                         epsilon=1e-3),
        helper.make_node("HardSwish", ["bn"], ["hs"]),
        helper.make_node("GlobalAveragePool", ["hs"], ["p"]),
        helper.make_node("Conv", ["p", "se_w"], ["g0"]),
        helper.make_node("HardSigmoid", ["g0"], ["g"], alpha=1 / 6, beta=0.5),
        helper.make_node("Mul", ["hs", "g"], ["se"]),
        helper.make_node("GlobalAveragePool", ["se"], ["p2"]),
        helper.make_node("Flatten", ["p2"], ["f"]),
        helper.make_node("MatMul", ["f", "fc"], ["logits"]),
        helper.make_node("HardSigmoid", ["logits"], ["gate"]),  # ONNX's defaults 0.2, 0.5
        helper.make_node("TopK", ["logits", "k"], ["top_v", "top_i"], axis=1),
        helper.make_node("ArgMax", ["logits"], ["label"], axis=1, keepdims=0),
        helper.make_node("ArgMin", ["logits"], ["least"], axis=1)]
    outs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 5]),
            helper.make_tensor_value_info("gate", TensorProto.FLOAT, ["N", 5]),
            helper.make_tensor_value_info("top_v", TensorProto.FLOAT, ["N", 3]),
            helper.make_tensor_value_info("top_i", TensorProto.INT64, ["N", 3]),
            helper.make_tensor_value_info("label", TensorProto.INT64, ["N"]),
            helper.make_tensor_value_info("least", TensorProto.INT64, ["N", 1])]
    g = helper.make_graph(nodes, "vision",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                          outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_vision_classifier_ops_convert_like_ort():
    proto = _vision_block()
    feeds = {"x": np.random.default_rng(4).normal(0, 2, (6, 3, 8, 8)).astype(np.float32)}
    ref = make_session(proto).run(None, feeds)
    with torch.no_grad():
        ours = [t.numpy() for t in to_torch(proto)(feeds)[0]]
    assert len(ours) == len(ref)
    for name, a, b in zip(("logits", "gate", "top_v", "top_i", "label", "least"), ours, ref,
                          strict=True):
        assert a.shape == b.shape, name
        if b.dtype == np.int64:
            np.testing.assert_array_equal(a, b, err_msg=name)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=name)
