"""A weight read by two weighted groups is one tensor with one encoding.

Before: a plan with ``mm1`` at a16_w16 and ``mm2`` at a8_w8 on a shared ``W`` passed
``check``; the QDQ model quantized ``W`` once at 8 bits and the QNN encodings held one
8-bit entry, so the w16 the plan (and its cost) claimed for ``mm1`` existed nowhere.
Now ``check`` refuses it (``plan.shared_weight``), and so the planner never emits it.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.plan.check import check
from quantscope.targets import load_target
from quantscope.types import Plan, Precision


def _shared_model():
    w = numpy_helper.from_array(np.random.default_rng(0).normal(0, 0.5, (8, 8))
                                .astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm1"),
         helper.make_node("Relu", ["h"], ["hr"], name="relu"),
         helper.make_node("MatMul", ["hr", "W"], ["y"], name="mm2")], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8])], [w])
    return load_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _errors(plan, model, target):
    return [p for p in check(plan, find_groups(model), model, target) if p.severity == "error"]


def test_a_shared_weight_at_two_weight_precisions_is_refused():
    model, target = _shared_model(), load_target("qnn-htp-v73")
    split = Plan(default=Precision.A8_W8, overrides=(("mm1", Precision.A16_W16),))
    bad = _errors(split, model, target)
    assert {p.group for p in bad} == {"mm1", "mm2"}
    assert all(p.rule == "plan.shared_weight" and "'W'" in p.reason for p in bad)
    half_float = Plan(default=Precision.A8_W8, overrides=(("mm2", Precision.FLOAT),))
    assert {p.rule for p in _errors(half_float, model, target)} == {"plan.shared_weight"}
    # the same weight bits (activations may differ) are one encoding: legal
    same = Plan(default=Precision.A8_W8, overrides=(("mm1", Precision.A16_W8),))
    assert not _errors(same, model, target)

