"""The recovery plans (full passes the planner never reads) are computed only on request:
without them every figure the planner reads, and the plan it makes, is the same, and the
analysis says they were left out."""

import json

import pytest
import tiny_models as tm

from quantscope import stages
from quantscope.analyze import RECOVER_TOP, Scorer, analysis_to_dict, analyze, summary_text
from quantscope.calibrate.collect import calibrate
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.serde import sensitivity_from_dict
from quantscope.targets import load_target


def _prepared(n=4):
    model = load_proto(tm.layernorm_block(), "layernorm_block")
    groups = find_groups(model)
    feeds = [tm.sample_inputs(model.proto, seed=i) for i in range(n)]
    return model, groups, calibrate(model, groups, feeds), feeds


def _comparable(doc: dict) -> dict:
    """The analysis JSON without what differs by design (recovery, its note, timing)."""
    out = json.loads(json.dumps(doc))
    out.pop("recovery")
    out["notes"] = [n for n in out["notes"] if "not computed" not in n]
    out["method"].pop("sweep_seconds")
    return out


@pytest.mark.parametrize("proxy", [1.0, 0.5])
def test_no_recovery_by_default_and_the_plan_is_the_same(proxy):
    model, groups, stats, feeds = _prepared()
    target = load_target("ort_cpu")
    kw = {"scorer": Scorer(), "target": target, "proxy_fraction": proxy}
    asked = analysis_to_dict(analyze(model, groups, stats, feeds, recover_top=RECOVER_TOP,
                                     **kw))
    default = analyze(model, groups, stats, feeds, **kw)
    cut = analysis_to_dict(default)
    assert len(asked["recovery"]) == len(RECOVER_TOP) and cut["recovery"] == []
    note = [n for n in cut["notes"] if "not computed" in n]
    assert len(note) == 1 and "recovery plans" in note[0] and "planner does not read" in note[0]
    assert not any("not computed" in n for n in asked["notes"])
    assert note[0] in summary_text(default)  # said on the console too
    # every figure besides the recovery is the same, so what the planner reads is too
    assert _comparable(cut) == _comparable(asked)
    sens_asked, sens_cut = sensitivity_from_dict(asked), sensitivity_from_dict(cut)
    assert sens_cut == sens_asked
    options = stages.PlanOptions(max_cost=1.6)
    plan_asked = stages.plan_model(model, sens_asked, target, options)
    plan_cut = stages.plan_model(model, sens_cut, target, options)
    assert plan_cut.plan == plan_asked.plan and plan_cut.plan.overrides  # a non-trivial plan
    assert plan_cut.pareto == plan_asked.pareto
