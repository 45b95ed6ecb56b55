import tiny_models as tm

from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.types import GroupKind


def groups_of(name):
    return find_groups(load_proto(tm.ALL[name](), name))


def test_conv_relu_fuses_and_flatten_shares_encoding():
    g = groups_of("conv_net")
    assert [x.op_type for x in g.groups] == ["Conv", "Conv", "GlobalAveragePool", "Gemm"]
    assert g.groups[0].nodes == ("Conv_0", "Relu_1")
    assert g.groups[0].weight == "w1" and g.groups[0].bias == "b1" and g.groups[0].weight_axis == 0
    assert g.groups[3].weight_axis == 0  # Gemm transB=1: W is [out, in]
    assert ("p", "f") in g.shared
    assert g.model_inputs == ("image",)


def test_matmul_bias_and_gelu_fuse_into_one_group():
    g = groups_of("layernorm_block")
    ffn = g.groups[1]
    assert ffn.kind is GroupKind.WEIGHTED and ffn.bias == "b1" and ffn.weight_axis == -1
    assert ffn.outputs == ("gelu",)
    assert len(ffn.nodes) == 7


def test_attention_groups():
    g = groups_of("attention")
    kinds = [(x.op_type, x.kind) for x in g.groups]
    assert ("Softmax", GroupKind.ACTIVATION) in kinds
    assert sum(1 for k in kinds if k == ("MatMul", GroupKind.ACTIVATION)) == 2
    assert sum(1 for k in kinds if k == ("MatMul", GroupKind.WEIGHTED)) == 4


def test_residual_add_is_its_own_group():
    g = groups_of("residual_add")
    assert [x.op_type for x in g.groups] == ["MatMul", "MatMul", "Add"]
    assert g.groups[2].inputs == ("x", "ob")


def test_a_models_groups_and_kinds_are_found_once_and_kept_on_it():
    from quantscope.model import groups as g

    model = load_proto(tm.attention(), "attention")
    first = find_groups(model)
    assert find_groups(model) is first  # kept on the model, not found again
    fresh = g._find_groups(load_proto(tm.attention(), "attention"))
    assert fresh == first  # what a fresh search finds
    kinds = g.tensor_kinds(model)
    kinds["changed by its caller"] = "act"
    assert "changed by its caller" not in g.tensor_kinds(model)  # each caller its own copy
    assert g.tensor_kinds(model) == g._tensor_kinds(model)
    other = load_proto(tm.conv_net(), "conv")  # another model: its own groups
    assert find_groups(other).names() != first.names()
