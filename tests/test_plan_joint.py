"""Repairs x precisions: measured repair offers, repair-aware scoring, joint refinement."""

from __future__ import annotations

import pytest
import tiny_models
from test_repair_split import residual_block
from test_search import _chain, _sens, _toy_target

from quantscope.model.groups import find_groups
from quantscope.plan.search import RepairOption, search
from quantscope.stages import Dataset, evaluate_plan, plan_evaluator, plan_repair_offer
from quantscope.types import Plan, Precision, QuantscopeError, Sensitivity


def _measured(values):
    """A fake evaluation: the metric of a plan looked up by its repairs."""

    def run(plan: Plan) -> float:
        return values[dict(plan.meta).get("repairs", "")]

    return run


def test_refinement_drops_a_repair_the_measurement_does_not_support():
    model, groups = _chain()
    gains = {g: {"a16_w16": 0.01} for g in groups.names()}
    fix = RepairOption("smooth", gain=0.08, cost=0.0, reason="predicted to help")
    r = search(groups, _sens(gains), _toy_target(), model, max_cost=1.0, repairs=(fix,),
               evaluate=_measured({"smooth": 0.60, "": 0.70}))
    assert r.path[0].group == "repair:smooth"  # greedy took it on prediction ...
    assert r.repairs == () and "repairs" not in dict(r.plan.meta)  # ... measurement dropped it
    assert r.measured == pytest.approx(0.70)


def test_repairs_are_judged_before_the_step_budget_goes_to_promotion_drops():
    # the planner on a rewritten minilm-l6 kept bias+ranges (SQNR up, top-1 down) because
    # its 12 measurements were spent reverting promotions before the repairs were tried
    model, groups = _chain()
    gains = {g: {"a16_w16": 0.01} for g in groups.names()}
    fix = RepairOption("smooth", gain=0.08, cost=0.0, reason="predicted to help")
    r = search(groups, _sens(gains), _toy_target(), model, max_cost=3.0, repairs=(fix,),
               evaluate=_measured({"smooth": 0.60, "": 0.70}), refine_steps=2)
    assert len(r.path) > 2  # promotions were taken, so reverts compete for the steps
    assert r.repairs == () and r.measured == pytest.approx(0.70)


def test_refinement_keeps_a_repair_the_measurement_supports():
    model, groups = _chain()
    gains = {g: {"a16_w16": 0.01} for g in groups.names()}
    fix = RepairOption("bias", gain=0.02, cost=0.0, reason="measured")
    r = search(groups, _sens(gains), _toy_target(), model, max_cost=1.0, repairs=(fix,),
               evaluate=_measured({"bias": 0.75, "": 0.70}))
    assert r.repairs == (fix,) and dict(r.plan.meta)["repairs"] == "bias"
    assert r.measured == pytest.approx(0.75)


def _data(model, n=3):
    feeds = tuple(tiny_models.sample_inputs(model.proto, seed=i) for i in range(n))
    return Dataset("tiny", calibration=feeds, evaluation=feeds)


def _stats(model, data):
    from quantscope.calibrate.collect import calibrate

    return calibrate(model, find_groups(model), iter(data.calibration))


def test_offers_are_measured_and_the_evaluator_applies_the_plans_repairs():
    from quantscope.targets import load_target

    model = residual_block()
    data = _data(model)
    stats = _stats(model, data)
    target = load_target("ort-cpu")
    low = Plan(default=Precision.A8_W8, target=target.name)
    base = evaluate_plan(model, data, stats, low, scheme=target.scheme)["metrics"]["sqnr_db"]
    sens = Sensitivity.from_gains("sqnr_db", base, {g: {"a16_w16": 1.0}
                                                     for g in find_groups(model).names()})
    feeds = list(data.calibration)
    offer = plan_repair_offer(model, data, stats, sens, target, ("smooth", "split"), feeds,
                              task_metric="sqnr_db")
    rows = {r["name"]: r for r in offer.measured}
    assert rows["smooth"]["changed"] == 0 and any("smooth" in n for n in offer.notes)
    split = next(o for o in offer.options if o.name == "split")
    assert rows["split"]["sqnr_db"][1] > rows["split"]["sqnr_db"][0] + 3  # > 3 dB better
    assert split.gain == pytest.approx(rows["split"]["sqnr_db"][1] - rows["split"]["sqnr_db"][0],
                                       abs=1e-5)
    assert split.cost > 0  # it widens layers: the cost model sees the extra channels
    score = plan_evaluator(model, data, stats, "sqnr_db", feeds, target=target)
    plain = score(low)
    repaired = score(Plan(default=Precision.A8_W8, target=target.name,
                          meta=(("repairs", "split"),)))
    assert plain == pytest.approx(base, abs=1e-6)
    assert repaired == pytest.approx(rows["split"]["sqnr_db"][1], abs=1e-4)
    with pytest.raises(QuantscopeError, match="unknown repair 'nope'"):
        plan_repair_offer(model, data, stats, sens, target, ("nope",), feeds,
                          task_metric="sqnr_db")
