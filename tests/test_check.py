"""Legality preflight (plan/check.py) and cost model (plan/cost.py) on tiny and real models."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
import tiny_models
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from onnx import numpy_helper

from quantscope.model.groups import find_groups
from quantscope.model.load import load, load_proto
from quantscope.model.shapes import resolve_shapes, seq_len_shapes
from quantscope.plan.check import check, low_byte_empty, prepare
from quantscope.plan.cost import cost_breakdown, plan_cost
from quantscope.targets import load_target, with_params
from quantscope.types import Plan, Precision, QuantscopeError
from quantscope.zoo.text import find_minilm_l3_onnx

HAILO = load_target("hailo10h")
QNN = load_target("qnn_htp_v73")


def _setup(build):
    model = load_proto(build())
    return model, find_groups(model)


def _rules(problems, severity=None):
    return sorted(p.rule for p in problems if severity is None or p.severity == severity)


def _plan(**overrides):
    return Plan(default=Precision.A8_W8, overrides=tuple(overrides.items()))


def test_uniform_a8_w8_is_legal_everywhere():
    for build in tiny_models.ALL.values():
        model, groups = _setup(build)
        for target in (HAILO, load_target("hailo8"), load_target("ort_cpu")):
            assert check(Plan.uniform(Precision.A8_W8), groups, model, target) == []


def test_every_problem_names_group_rule_reason_provenance_fix():
    model, groups = _setup(tiny_models.attention)
    problems = check(
        Plan.uniform(Precision.A16_W8), groups, model, HAILO, shapes={"x": (1, 512)[:1] + (512, 16)}
    )
    assert problems
    for p in problems:
        assert p.group in groups.names()
        assert p.rule and p.reason and p.fix and "hailo10h" in p.provenance


def test_wall1_softmax_and_attention_matmul_at_16_bit():
    model, groups = _setup(tiny_models.attention)
    probs = check(
        _plan(Softmax_6=Precision.A16_W16, MatMul_4=Precision.A16_W16), groups, model, HAILO
    )
    hits = {p.group for p in probs if p.rule == "hailo.attention_16bit"}
    assert hits == {"Softmax_6", "MatMul_4"}


def test_wall2_a16_w8_always_hits_the_empty_low_sublayer():
    model, groups = _setup(tiny_models.layernorm_block)
    probs = check(_plan(MatMul_1=Precision.A16_W8), groups, model, HAILO)
    assert _rules(probs, "error") == ["hailo.a16_low_sublayer_empty"]
    assert "high byte" in probs[0].reason
    assert check(_plan(MatMul_1=Precision.A16_W16), groups, model, HAILO) == []


@settings(max_examples=40, deadline=None)
@given(arrays(np.float32, (6, 5), elements=st.floats(-4, 4, width=32)))
def test_low_byte_of_8_bit_codes_in_the_16_bit_grid_is_always_empty(w):
    assert low_byte_empty(w, Precision.A16_W8, HAILO, axis=1).all()


@settings(max_examples=40, deadline=None)
@given(arrays(np.float32, (6, 5), elements=st.floats(0.125, 4, width=32)))
def test_16_bit_codes_of_nonzero_channels_fill_the_low_byte(w):
    # the channel max maps to the top code 65535 (low byte 0xFF): never empty
    assert not low_byte_empty(w, Precision.A16_W16, HAILO, axis=1).any()


def _with_weight(proto, name, value):
    for t in proto.graph.initializer:
        if t.name == name:
            t.CopyFrom(numpy_helper.from_array(value.astype(np.float32), name))
    return proto


def test_a16_w16_with_zero_weights_is_flagged_and_zero_channels_warned():
    proto = _with_weight(tiny_models.layernorm_block(), "w1", np.zeros((24, 48)))
    model = load_proto(proto)
    groups = find_groups(model)
    probs = check(_plan(MatMul_1=Precision.A16_W16), groups, model, HAILO)
    assert [(p.rule, p.severity) for p in probs] == [("hailo.a16_low_sublayer_empty", "error")]
    w = np.random.default_rng(0).normal(0, 0.2, (24, 48))
    w[:, 3] = 0.0  # one pruned output channel
    model = load_proto(_with_weight(tiny_models.layernorm_block(), "w1", w))
    probs = check(_plan(MatMul_1=Precision.A16_W16), find_groups(model), model, HAILO)
    assert [(p.rule, p.severity) for p in probs] == [("hailo.a16_low_sublayer_empty", "warning")]
    assert "1 of 48" in probs[0].reason


def test_wall3_super_defuse_needs_concrete_shapes():
    model, groups = _setup(tiny_models.layernorm_block)
    plan = _plan(LayerNormalization_0=Precision.A16_W16, MatMul_1=Precision.A16_W16)
    small = with_params(HAILO, {"hailo.super_defuse.max_values": 256 * 24})
    unknown = check(plan, groups, model, small)
    # an error rule that cannot be evaluated stays an error (the plan may not compile)
    assert [(p.rule, p.severity) for p in unknown] == [("hailo.super_defuse", "error")]
    assert "could not evaluate" in unknown[0].reason and "--seq-len" in unknown[0].fix
    assert "x [N, S, 24]" in unknown[0].reason and "x=1x<S>x24" in unknown[0].fix
    at256 = check(plan, groups, model, small, shapes={"x": (1, 256, 24)})
    assert [(p.group, p.severity) for p in at256] == [("LayerNormalization_0", "error")]
    assert check(plan, groups, model, small, shapes={"x": (1, 128, 24)}) == []
    default = check(plan, groups, model, HAILO, shapes={"x": (1, 256, 24)})
    assert default == []  # 6,144 values: far under the 98,304 estimate


def test_maxpool_16_bit_is_a_warning():
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    pool (float[1, 3, 8, 8] x) => (float[1, 4, 4, 4] y) {
        c = Conv (x, w)
        y = MaxPool <kernel_shape = [2, 2], strides = [2, 2]> (c)
    }
    """
    proto = onnx.parser.parse_model(text)
    proto.graph.initializer.append(
        numpy_helper.from_array(np.ones((4, 3, 1, 1), np.float32) * 0.3, "w")
    )
    model = load_proto(proto)
    groups = find_groups(model)
    pool = next(g.name for g in groups.groups if g.op_type == "MaxPool")
    probs = check(
        Plan(default=Precision.A8_W8, overrides=((pool, Precision.A16_W16),)), groups, model, HAILO
    )
    assert [(p.rule, p.severity) for p in probs] == [("hailo.maxpool_16bit", "warning")]


def test_qnn_bias_add_on_3d_tensors_and_not_in_float():
    model, groups = _setup(tiny_models.layernorm_block)
    probs = check(Plan.uniform(Precision.A16_W8), groups, model, QNN)
    assert {p.group for p in probs if p.rule == "qnn.linearclip_5d"} == {"MatMul_1"}
    assert "q::linearclip" in probs[0].reason
    assert (
        check(_plan(MatMul_1=Precision.FLOAT), groups, model, QNN, shapes={"x": (1, 8, 24)})[0].rule
        != "qnn.linearclip_5d"
    )
    model2, groups2 = _setup(tiny_models.residual_add)  # 2-D tensors: legal
    assert _rules(check(Plan.uniform(Precision.A8_W8), groups2, model2, QNN)) == []


def test_qnn_fp16_boundaries_are_counted():
    model, groups = _setup(tiny_models.residual_add)
    probs = check(_plan(MatMul_3=Precision.FLOAT), groups, model, QNN)
    assert [(p.rule, p.severity) for p in probs] == [("qnn.fp16_boundary_cascade", "warning")]
    assert "2 FP16<->quantized boundaries at this group, 2 in the whole plan" in probs[0].reason
    assert check(Plan.uniform(Precision.FLOAT), groups, model, QNN) == []


def test_plan_level_problems():
    model, groups = _setup(tiny_models.residual_add)
    probs = check(_plan(MatMul_0=Precision.FLOAT, Nope=Precision.A16_W16), groups, model, HAILO)
    assert _rules(probs) == ["plan.unknown_group", "precision.not_allowed"]


def test_shapes_for_unknown_tensors_and_wrong_rank_are_errors():
    model, _ = _setup(tiny_models.attention)
    with pytest.raises(QuantscopeError, match="no tensor"):
        resolve_shapes(model, {"nope": (1,)})
    with pytest.raises(QuantscopeError, match="rank"):
        resolve_shapes(model, {"x": (1, 4)})
    assert resolve_shapes(model, {"x": (1, 7, 16)})["p"] == (1, 7, 7)
    with pytest.raises(QuantscopeError, match="rank-2 token input"):
        seq_len_shapes(model, 128)


@pytest.mark.parametrize("build", [tiny_models.residual_add, tiny_models.attention,
                                   tiny_models.conv_net])
@pytest.mark.parametrize("target", [HAILO, QNN])
def test_a_prepared_check_gives_each_plan_what_a_fresh_one_does(build, target):
    """plan.check.prepare: the plan-free part made once and the local rules' verdicts kept
    by (rule, group, precision), over plans that revisit a group's precision (a search)."""
    model, groups = _setup(build)
    shapes = {"x": (1, 7, 16)} if build is tiny_models.attention else None
    prepared = prepare(groups, model, target, shapes)
    rng = np.random.default_rng(0)
    names = groups.names()
    choices = [Precision.A8_W8, Precision.A16_W8, Precision.A16_W16, Precision.FLOAT]
    seen = set()
    for _ in range(30):
        plan = _plan(**{n: choices[rng.integers(4)] for n in names if rng.random() < 0.5})
        got = check(plan, groups, model, target, shapes=shapes, prepared=prepared)
        assert got == check(plan, groups, model, target, shapes=shapes)
        seen.update(p.rule for p in got)
    assert prepared.local  # kept verdicts
    assert seen  # the plans broke rules: the comparison saw problems, not only empty lists
    other = load_proto(build())  # another model: the prepared part is not read for it
    assert check(Plan.uniform(Precision.A16_W16), find_groups(other), other, target,
                 shapes=shapes, prepared=prepared) == check(
        Plan.uniform(Precision.A16_W16), find_groups(other), other, target, shapes=shapes)


# ---- cost -------------------------------------------------------------------------


def test_cost_is_relative_to_uniform_a8_w8():
    model, groups = _setup(tiny_models.conv_net)
    assert plan_cost(Plan.uniform(Precision.A8_W8), groups, HAILO, model=model) == 1.0
    # a conv-dominated net all at a16_w16 reproduces the pose-model ratio 104/14
    full = plan_cost(Plan.uniform(Precision.A16_W16), groups, HAILO, model=model)
    assert full == pytest.approx(104 / 14, rel=0.02)
    assert math.isinf(plan_cost(Plan.uniform(Precision.FLOAT), groups, HAILO, model=model))


def test_cost_counts_boundaries_and_grows_with_precision():
    model, groups = _setup(tiny_models.layernorm_block)
    shapes = {"x": (1, 64, 24)}
    one = _plan(MatMul_8=Precision.A16_W16)
    parts = cost_breakdown(one, groups, QNN, shapes, model=model)
    assert parts["<boundaries>"] > 0
    assert (
        cost_breakdown(Plan.uniform(Precision.A8_W8), groups, QNN, shapes, model=model)[
            "<boundaries>"
        ]
        == 0
    )
    costs = [
        plan_cost(_plan(MatMul_8=p), groups, HAILO, shapes, model=model)
        for p in (Precision.A8_W8, Precision.A16_W8, Precision.A16_W16)
    ]
    assert costs == sorted(costs) and costs[0] == 1.0
    # without the model the estimate still orders plans the same way
    assert plan_cost(one, groups, HAILO) > 1.0


def test_attention_cost_grows_with_sequence_length():
    model, groups = _setup(tiny_models.attention)
    plan = _plan(Softmax_6=Precision.A16_W16)
    short = plan_cost(plan, groups, QNN, {"x": (1, 8, 16)}, model=model)
    long = plan_cost(plan, groups, QNN, {"x": (1, 512, 16)}, model=model)
    assert long > short > 1.0


# ---- the real model of the field report -----------------------------------------


def _minilm_path():
    """The shipped ONNX of the `models` extra (a test dependency), looked up when a test
    needs it: without the extra only the real-model tests skip, not the whole file."""
    try:
        return find_minilm_l3_onnx()
    except QuantscopeError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def minilm():
    model = load(_minilm_path())
    return model, find_groups(model)


def test_minilm_uniform_plans_on_hailo10h(minilm):
    model, groups = minilm
    seq = seq_len_shapes(model, 256)
    # the word-embedding lookup runs on the host: one note at 8 bit
    (host,) = check(Plan.uniform(Precision.A8_W8), groups, model, HAILO, shapes=seq)
    assert (host.rule, host.severity) == ("host.embedding", "info")
    assert "word_embeddings.weight [30522, 384] float32" in host.reason
    probs = [p for p in check(Plan.uniform(Precision.A16_W16), groups, model, HAILO,
                              shapes=seq) if p != host]
    assert {p.rule for p in probs} == {"hailo.attention_16bit", "hailo.super_defuse"}
    assert all(p.severity == "error" for p in probs)
    # its 16-bit [256, 384] rows, the compiled graph's input, are still over the size
    assert ("hailo.super_defuse", host.group) in {(p.rule, p.group) for p in probs}
    probs = check(Plan.uniform(Precision.A16_W8), groups, model, HAILO, shapes=seq)
    low = [p for p in probs if p.rule == "hailo.a16_low_sublayer_empty"]
    assert len(low) == 18  # every linear, as for all 72 convs of the L12 model


def test_minilm_on_qnn_flags_every_linear_bias_add(minilm):
    model, groups = minilm
    probs = [p for p in check(Plan.uniform(Precision.A16_W8), groups, model, QNN)
             if p.rule != "host.embedding"]  # the lookup runs on the host (a note)
    assert {p.rule for p in probs} == {"qnn.linearclip_5d"} and len(probs) == 18
