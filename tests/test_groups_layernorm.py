"""A decomposed LayerNorm (ReduceMean/Sub/Pow/Add/Sqrt/Div/Mul/Add) is one normalization group."""

import onnx
import tiny_models as tm
import tiny_vit

from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.targets.profile import op_kind


def _by_name(model):
    return {g.name: g for g in find_groups(model).groups}


def test_decomposed_layernorm_is_one_normalization_group():
    model = load_proto(tiny_vit.vit_block())
    groups = _by_name(model)
    norms = [g for g in groups.values() if g.op_type == "LayerNormalization"]
    assert [op_kind(g) for g in norms] == ["normalization", "normalization"]
    ops = {n.name: n.op_type for n in model.graph.node}
    for g in norms:
        assert [ops[n] for n in g.nodes] == ["ReduceMean", "Sub", "Pow", "ReduceMean", "Add",
                                            "Sqrt", "Div", "Mul", "Add"]
        assert len(g.outputs) == 1  # only the normalized tensor is quantized
    assert not any(g.op_type in ("ReduceMean", "Sub", "Pow", "Sqrt", "Div")
                   for g in groups.values())


def test_rms_norm_without_the_mean_is_not_taken_for_a_layernorm():
    proto = tiny_vit.vit_block()
    # drop the centring of the first LayerNorm: Pow and Div read x, not x - mean
    for n in proto.graph.node:
        if n.output[0] in ("p1", "n1"):
            n.input[0] = "x"
    proto.graph.node.remove(next(n for n in proto.graph.node if n.output[0] == "d1"))
    proto.graph.node.remove(next(n for n in proto.graph.node if n.output[0] == "m1"))
    onnx.checker.check_model(proto)
    norms = [g for g in find_groups(load_proto(proto)).groups
             if g.op_type == "LayerNormalization"]
    assert len(norms) == 1  # the second one only


def test_fused_layernorm_groups_are_unchanged():
    model = load_proto(tm.layernorm_block())
    ln = [g for g in find_groups(model).groups if g.op_type == "LayerNormalization"]
    assert [len(g.nodes) for g in ln] == [1, 1]
