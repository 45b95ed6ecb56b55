"""A T5 encoder's RMSNorm, spelt out by torch.onnx as ``Cast, Pow, ReduceMean, Add, Sqrt,
Div(1, .), Mul, Mul(weight, .)``, is one ``RMSNormalization`` at load: one decision group
(not five that no compiler names), the function unchanged, a note saying so."""

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.repair.verify import run_all

H = 8


def _t5_norm(exponent: float = 2.0):
    rng = np.random.default_rng(0)
    c = {"two": exponent, "eps": 1e-6, "one": 1.0}
    nodes = [helper.make_node("MatMul", ["x", "w_in"], ["h"], name="in/MatMul"),
             helper.make_node("Cast", ["h"], ["hf"], to=TensorProto.FLOAT, name="ln/Cast"),
             helper.make_node("Pow", ["hf", "two"], ["sq"], name="ln/Pow"),
             helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1], keepdims=1,
                              name="ln/ReduceMean"),
             helper.make_node("Add", ["var", "eps"], ["ve"], name="ln/Add"),
             helper.make_node("Sqrt", ["ve"], ["sd"], name="ln/Sqrt"),
             helper.make_node("Div", ["one", "sd"], ["r"], name="ln/Div"),
             helper.make_node("Mul", ["hf", "r"], ["n"], name="ln/Mul"),
             helper.make_node("Mul", ["gain", "n"], ["y0"], name="ln/Mul_1"),
             helper.make_node("MatMul", ["y0", "w_out"], ["y"], name="out/MatMul")]
    inits = [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in c.items()]
    inits += [numpy_helper.from_array(rng.normal(0, 1, (H, H)).astype(np.float32), "w_in"),
              numpy_helper.from_array(rng.normal(0, 1, (H, H)).astype(np.float32), "w_out"),
              numpy_helper.from_array(rng.normal(1, 0.1, H).astype(np.float32), "gain")]
    graph = helper.make_graph(
        nodes, "t5_norm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, H])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, H])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_spelt_out_rmsnorm_is_one_group():
    proto = _t5_norm()
    model = load_proto(proto)
    ops = [n.op_type for n in model.graph.node]
    assert ops == ["MatMul", "RMSNormalization", "MatMul"]
    groups = [g.name for g in find_groups(model).groups]
    assert len(groups) == 3 and sum("ln" in g for g in groups) == 1
    assert any("1 RMSNorm(s) spelt out" in n and "one decision group" in n for n in model.notes)
    x = np.random.default_rng(1).normal(0, 1, (2, 4, H)).astype(np.float32)
    np.testing.assert_allclose(run_all(model.proto, [{"x": x}])[0][0],
                               run_all(proto, [{"x": x}])[0][0], rtol=1e-5, atol=1e-5)


def test_a_chain_that_is_not_an_rmsnorm_stays():
    """``Pow(x, 3)`` then a mean is not an RMSNorm: the graph and its opset are left."""
    model = load_proto(_t5_norm(exponent=3.0))
    assert "RMSNormalization" not in {n.op_type for n in model.graph.node}
    assert not any("RMSNorm" in n for n in model.notes) and model.opset() < 23
