"""A Resize's decision in the Hailo script.

Resize had no Hailo name prefix: without an HN its decision (an upsampling between two
convs at a16_w16) was written ``# up: a16_w16 NOT SET: no Hailo layer name known for its
Resize layer`` and the compiler kept it at the default. The DFC names its resize layers
``resize<i>``: the decision is now a guessed ``resize1`` line (marked guessed, as every
name by op order), and the script parses back to the plan.
"""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from quantscope.export.alls_lint import script_plan
from quantscope.export.hailo_alls import export_alls, unset_decisions
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.targets import load_target
from quantscope.types import Plan, Precision


def _upsampler():
    r = np.random.default_rng(0)
    inits = [numpy_helper.from_array(r.normal(0, .3, (4, 3, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(r.normal(0, .3, (4, 4, 3, 3)).astype(np.float32), "w2"),
             numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]
    graph = helper.make_graph([
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv_a", pads=[1] * 4),
        helper.make_node("Resize", ["c1", "", "scales"], ["up"], name="up", mode="nearest"),
        helper.make_node("Conv", ["up", "w2"], ["y"], name="conv_b", pads=[1] * 4)], "g",
        [helper.make_tensor_value_info("x", 1, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", 1, [1, 4, 16, 16])], inits)
    return load_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_a_resize_decision_is_a_resize_line_not_a_not_set_comment():
    model = _upsampler()
    groups = find_groups(model)
    assert [g.op_type for g in groups.groups] == ["Conv", "Resize", "Conv"]
    plan = Plan(default=Precision.A8_W8, overrides=(("up", Precision.A16_W16),),
                target="hailo8")
    text = export_alls(plan, groups)
    assert unset_decisions(text) == [], text
    assert "quantization_param(resize1, precision_mode=a16_w16)" in text
    assert "guessed name: resize1 for ONNX 'up'" in text
    back = script_plan(text, groups, model, load_target("hailo8"))
    assert back.precision_of("up") is Precision.A16_W16
    assert back.precision_of("conv_a") is Precision.A8_W8
