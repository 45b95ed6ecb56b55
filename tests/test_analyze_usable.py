"""The analysis sweeps only the groups the planner can use: a group the target refuses at
``high`` (or at ``low``) is not swept, is listed under ``skipped`` with the rule, and the
planner keeps it at its start."""

import json

import tiny_models as tm

from quantscope import stages
from quantscope.analyze import Scorer, analysis_from_dict, analysis_to_dict, analyze
from quantscope.calibrate.collect import calibrate
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.serde import sensitivity_from_dict
from quantscope.stages.usable import unusable_groups
from quantscope.targets import load_target
from quantscope.types import Precision

LOW, HIGH = Precision.A8_W8, Precision.A16_W16
SHAPES = (("x", (1, 6, 16)),)


def _attention():
    model = load_proto(tm.attention(), "attention")
    groups = find_groups(model)
    feeds = [tm.sample_inputs(model.proto, seed=i) for i in range(3)]
    return model, groups, calibrate(model, groups, feeds), feeds


def test_attention_groups_at_16_bit_are_unusable_on_hailo10h_only():
    model, groups, _, _ = _attention()
    by = groups.by_name()
    skip = unusable_groups(model, load_target("hailo10h"), low=LOW, high=HIGH, groups=groups,
                           input_shapes=SHAPES)
    # the Softmax and the two activation x activation MatMuls (scores, context)
    assert {by[g].op_type for g in skip} == {"Softmax", "MatMul"} and len(skip) == 3
    assert all("hailo.attention_16bit" in why for why in skip.values())
    assert all(by[g].weight is None for g in skip)  # the weighted projections are swept
    assert unusable_groups(model, load_target("hailo8"), low=LOW, high=HIGH) == {}
    assert unusable_groups(model, None, low=LOW, high=HIGH) == {}


def test_skipped_groups_are_not_swept_said_and_the_planner_keeps_them_at_start():
    model, groups, stats, feeds = _attention()
    target = load_target("hailo10h")
    skip = unusable_groups(model, target, low=LOW, high=HIGH, groups=groups, input_shapes=SHAPES)
    a = analyze(model, groups, stats, feeds, scorer=Scorer(), target=target,
                proxy_fraction=1.0, recover_top=(1,), skip=skip)
    swept = set(groups.names()) - set(skip)
    assert {s.group for s in a.sensitivity} == swept == {o.group for o in a.offenders}
    assert {k.group for k in a.skipped} == set(skip)
    assert all(k.reason == skip[k.group] for k in a.skipped)
    assert a.method["groups_swept"] == len(swept)
    assert any("not swept" in n and "hailo.attention_16bit" in n for n in a.notes)
    doc = analysis_to_dict(a)
    assert analysis_to_dict(analysis_from_dict(json.loads(json.dumps(doc)))) == doc
    # the swept groups' rows equal those of a sweep over every group
    whole = analyze(model, groups, stats, feeds, scorer=Scorer(), target=target,
                    proxy_fraction=1.0, recover_top=(1,))
    rows = {s.group: s.disable_one for s in whole.sensitivity}
    for s in a.sensitivity:
        assert s.disable_one == rows[s.group]
    # the planner reads the analysis without the skipped groups and keeps them at start
    sens = sensitivity_from_dict(doc)
    assert {g for g, _ in sens.gains} == swept
    options = stages.PlanOptions(max_cost=10.0, input_shapes=SHAPES)
    out = stages.plan_model(model, sens, target, options)
    assert {g for g, _ in out.plan.overrides} and {g for g, _ in out.plan.overrides} <= swept
    assert all(out.plan.precision_of(g) == LOW for g in skip)
    assert "3 group(s) have no gain in the analysis and stay at start" in out.pareto["notes"]
