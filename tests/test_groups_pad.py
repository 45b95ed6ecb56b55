"""A ``Pad`` that only adds zeros (torch's ``F.pad``) was a decision group of its own, with
no Hailo layer name: model.alls got a "NOT SET" line for it (h23 noticed it, stop 57). Its
values are its input's plus zeros, on its input's grid: it now shares that encoding. A
constant pad of another value keeps its group."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from quantscope.export.hailo_alls import export_alls, unset_decisions
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.types import Plan, Precision


def _padded(value: float | None, mode: str = "constant"):
    r = np.random.default_rng(0)
    inits = [numpy_helper.from_array(r.normal(0, .3, (4, 3, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(r.normal(0, .3, (4, 4, 3, 3)).astype(np.float32), "w2"),
             numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads")]
    pad_in = ["c1", "pads"]
    if value is not None:
        inits.append(numpy_helper.from_array(np.array(value, np.float32), "value"))
        pad_in.append("value")
    graph = helper.make_graph([
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv_a"),
        helper.make_node("Pad", pad_in, ["p"], name="pad", mode=mode),
        helper.make_node("Conv", ["p", "w2"], ["y"], name="conv_b")], "g",
        [helper.make_tensor_value_info("x", 1, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", 1, [1, 4, 6, 6])], inits)
    return load_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.parametrize("value,mode", [(None, "constant"), (0.0, "constant"),
                                        (None, "reflect")])
def test_a_zero_pad_shares_its_inputs_encoding(value, mode):
    groups = find_groups(_padded(value, mode))
    assert [g.op_type for g in groups.groups] == ["Conv", "Conv"]
    text = export_alls(Plan(default=Precision.A8_W8, overrides=(("conv_a", Precision.A16_W16),),
                            target="hailo8"), groups)
    assert unset_decisions(text) == [], text


def test_a_pad_of_another_value_keeps_its_group():
    groups = find_groups(_padded(-5.0))
    assert [g.op_type for g in groups.groups] == ["Conv", "Pad", "Conv"]
