"""Lookups a plan and a model answer from a table built once (stop 56: the deploy stage's
cost table spent most of its time rebuilding them): the answers are the ones the data
gives, and the table is no part of what a plan is (its equality, digest or file)."""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper
from tiny_models import conv_net

from quantscope.analyze.evalcache import content_digest
from quantscope.model.load import load_proto
from quantscope.serde import plan_from_dict, plan_to_dict
from quantscope.types import Plan, Precision


def test_a_plans_precision_of_each_group_is_its_override_or_the_default() -> None:
    plan = Plan(default=Precision.A8_W8, overrides=(("a", Precision.A16_W16),
                                                    ("b", Precision.A16_W8)))
    fresh = Plan(default=Precision.A8_W8, overrides=plan.overrides)
    digest = content_digest(fresh)
    assert [plan.precision_of(g) for g in ("a", "b", "c")] == [
        Precision.A16_W16, Precision.A16_W8, Precision.A8_W8]
    assert plan == fresh and hash(plan) == hash(fresh)  # the table built on one only
    assert content_digest(plan) == digest
    assert plan_to_dict(plan) == plan_to_dict(fresh)
    assert plan_from_dict(plan_to_dict(plan)).precision_of("a") is Precision.A16_W16


def test_a_models_initializer_dims_and_value_shapes_are_its_own() -> None:
    model = load_proto(conv_net(), "conv")
    for t in model.graph.initializer:
        assert model.initializer_dims(t.name) == numpy_helper.to_array(t).shape
    first = model.value_shapes()
    first.clear()  # a caller's copy: the model's answer does not change
    assert model.value_shapes() and model.value_shapes() == load_proto(
        conv_net(), "again").value_shapes()
    try:
        model.initializer_dims("no such tensor")
    except KeyError:
        pass
    else:
        raise AssertionError("an unknown initializer must raise KeyError")
    assert np.prod(model.initializer_dims(model.graph.initializer[0].name)) > 0
