"""Weights stored as Constant nodes (Paddle/TF exports) are weights, not activations."""

import numpy as np
import onnx
import tiny_models as tm
from onnx import helper, numpy_helper

from quantscope import stages
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.types import Dataset, Plan, Precision


def _paddle_style(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Every initializer as a Constant node; w3 stored transposed behind a Transpose."""
    nodes = []
    for t in proto.graph.initializer:
        arr = numpy_helper.to_array(t)
        if t.name == "w3":
            nodes.append(helper.make_node("Constant", [], ["w3_t"],
                                          value=numpy_helper.from_array(arr.T.copy(), "w3_t")))
            nodes.append(helper.make_node("Transpose", ["w3_t"], ["w3"], perm=[1, 0]))
        else:
            nodes.append(helper.make_node("Constant", [], [t.name],
                                          value=numpy_helper.from_array(arr, t.name)))
    g = proto.graph
    graph = helper.make_graph(nodes + list(g.node), g.name, list(g.input), list(g.output))
    return helper.make_model(graph, opset_imports=list(proto.opset_import),
                             ir_version=proto.ir_version)


def test_constant_weights_give_the_same_groups_and_numbers():
    ref = load_proto(tm.conv_net(), "init")
    pad = load_proto(_paddle_style(tm.conv_net()), "paddle")
    assert pad.notes and "Constant" in pad.notes[0]
    assert ref.notes == ()
    gr, gp = find_groups(ref), find_groups(pad)
    assert [(g.op_type, g.kind, g.weight) for g in gr.groups] == \
           [(g.op_type, g.kind, g.weight) for g in gp.groups]
    assert {g.weight for g in gp.groups if g.weight} == {"w1", "w2", "w3"}
    x = np.random.default_rng(0).normal(0, 1, (8, 3, 16, 16)).astype(np.float32)
    batches = ({"image": x},)
    results = []
    for m in (ref, pad):
        data = Dataset(name="x", calibration=batches, evaluation=batches)
        stats = stages.calibrate_model(m, data)
        results.append([
            stages.evaluate_plan(m, data, stats, Plan.uniform(p))["metrics"]["sqnr_db"]
            for p in (Precision.A8_W8, Precision.A16_W8, Precision.A16_W16)])
    assert results[0] == results[1]
    # weights are quantized: 16-bit weights beat 8-bit ones at 16-bit activations
    assert results[1][2] > results[1][1] + 10


def test_scalar_and_integer_constants_stay():
    m = load_proto(tm.attention(), "att")
    kinds = {n.op_type for n in m.graph.node}
    before = sum(n.op_type == "Constant" for n in tm.attention().graph.node)
    assert sum(n.op_type == "Constant" for n in m.graph.node) == before
    assert m.notes == () and kinds


def test_a_layout_op_on_an_initializer_is_folded_and_nothing_else_is_copied():
    """The fold reads an initializer's data only where a layout op needs it; a model with
    nothing to fold, its nodes named, is neither copied nor changed by the loader."""
    from quantscope.model.load import fold_constant_weights, name_nodes

    proto = tm.conv_net()
    g = proto.graph
    w3 = next(t for t in g.initializer if t.name == "w3")
    arr = numpy_helper.to_array(w3)
    inits = [t for t in g.initializer if t.name != "w3"]
    inits.append(numpy_helper.from_array(arr.T.copy(), "w3_t"))
    graph = helper.make_graph([helper.make_node("Transpose", ["w3_t"], ["w3"], perm=[1, 0]),
                               *g.node], g.name, list(g.input), list(g.output), inits)
    stored = helper.make_model(graph, opset_imports=list(proto.opset_import),
                               ir_version=proto.ir_version)
    folded, notes = fold_constant_weights(stored)
    assert notes and "Transpose" not in {n.op_type for n in folded.graph.node}
    np.testing.assert_array_equal(numpy_helper.to_array(
        next(t for t in folded.graph.initializer if t.name == "w3")), arr)
    ref = load_proto(tm.conv_net(), "init")
    assert {g.weight for g in find_groups(load_proto(stored, "t")).groups if g.weight} == \
        {g.weight for g in find_groups(ref).groups if g.weight}
    named = name_nodes(tm.conv_net())
    before = named.SerializeToString()
    assert name_nodes(named) is named and fold_constant_weights(named) == (named, ())
    loaded = load_proto(named, "named")
    assert named.SerializeToString() == before and loaded.proto is not named
    assert loaded.proto.graph.node == ref.proto.graph.node


def test_a_resize_scales_constant_is_no_weight():
    """torch's opset >= 11 export of ``F.interpolate`` gives Resize its scales as a float
    Constant ``[1, 1, 2, 2]``: the loader made it an initializer and said "1 weight
    tensor(s) stored as Constant nodes ... were made initializers, so they are quantized
    as weights", which nothing did (no op quantizes a Resize's scales). A float constant
    read only as an op's parameter stays as it is; a Conv weight beside it is promoted."""
    w = np.random.default_rng(0).normal(0, 0.3, (4, 2, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Constant", [], ["scales"], value=numpy_helper.from_array(
            np.array([1, 1, 2, 2], np.float32), "scales")),
        helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(w, "w")),
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Resize", ["c", "", "scales"], ["y"], name="up", mode="nearest"),
    ]
    graph = helper.make_graph(
        nodes, "up", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 8, 8])])
    m = load_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "up")
    assert m.notes == ("1 weight tensor(s) stored as Constant nodes (or layout ops on them) "
                       "were made initializers, so they are quantized as weights",)
    assert set(m.initializers()) == {"w"}
    assert any(n.op_type == "Constant" and n.output[0] == "scales" for n in m.graph.node)
