"""A weight that torch's exporter reads in several layers through one ``Identity`` per use
(ALBERT's shared layer) stays one tensor at load: the layers share it, so
``plan.shared_weight`` keeps them at one weight precision (copied, each could be planned
at a precision the one tensor of the user's model cannot hold)."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.plan.shared_weight import RULE, shared_weight_problems, sharers
from quantscope.repair.verify import run_all
from quantscope.types import Plan, Precision

H = 8


def _albert_like() -> onnx.ModelProto:
    """Two layers ``y = relu(x @ W + b)`` applied in turn, both reading one ``W`` and ``b``
    (the second through Identity nodes, as torch.onnx writes a shared module)."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["m0"], name="layer0/MatMul"),
        helper.make_node("Add", ["m0", "b"], ["a0"], name="layer0/Add"),
        helper.make_node("Relu", ["a0"], ["h0"], name="layer0/Relu"),
        helper.make_node("Identity", ["W"], ["W_1"], name="Identity_1"),
        helper.make_node("Identity", ["b"], ["b_1"], name="Identity_2"),
        helper.make_node("MatMul", ["h0", "W_1"], ["m1"], name="layer1/MatMul"),
        helper.make_node("Add", ["m1", "b_1"], ["a1"], name="layer1/Add"),
        helper.make_node("Relu", ["a1"], ["y"], name="layer1/Relu"),
    ]
    graph = helper.make_graph(
        nodes, "albert_like",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", H])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", H])],
        [numpy_helper.from_array(rng.normal(0, 0.5, (H, H)).astype(np.float32), "W"),
         numpy_helper.from_array(rng.normal(0, 0.1, H).astype(np.float32), "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_weight_read_through_identity_stays_shared():
    proto = _albert_like()
    model = load_proto(proto)
    mms = {n.name: n for n in model.graph.node if n.op_type == "MatMul"}
    assert mms["layer0/MatMul"].input[1] == mms["layer1/MatMul"].input[1] == "W"
    assert "Identity" not in {n.op_type for n in model.graph.node}
    assert [t.name for t in model.graph.initializer] == ["W", "b"]  # no copies
    assert any("Identity node(s) of a weight" in n and "one encoding" in n
               for n in model.notes)
    x = np.random.default_rng(1).normal(0, 1, (3, H)).astype(np.float32)
    np.testing.assert_array_equal(run_all(model.proto, [{"x": x}])[0][0],
                                  run_all(proto, [{"x": x}])[0][0])
    groups = find_groups(model)
    layer0 = next(g.name for g in groups.groups if g.weight == "W" and "layer0" in g.name)
    layer1 = next(g.name for g in groups.groups if g.weight == "W" and "layer1" in g.name)
    assert sharers(groups)[layer0] == (layer1,)
    # one layer promoted alone is a plan the one tensor cannot carry: refused
    plan = Plan(default=Precision.A8_W8, overrides=((layer1, Precision.A16_W16),))
    problems = shared_weight_problems(plan, groups)
    assert {p.group for p in problems} == {layer0, layer1} and {p.rule for p in problems} == {RULE}
