"""Planner (plan/: start, greedy, prune, refine, result, pareto; serde input) on tiny models."""

from __future__ import annotations

import math

import pytest
import tiny_models
from hypothesis import given, settings
from hypothesis import strategies as st

from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.plan.check import check
from quantscope.plan.cost import cost_table, plan_cost
from quantscope.plan.pareto import Budget, FrontPoint, pareto_front
from quantscope.plan.search import (
    PlannerError,
    RepairOption,
    plan_from_analysis,
    search,
)
from quantscope.serde import read_plan, sensitivity_from_dict, write_plan
from quantscope.targets import load_target, parse_target
from quantscope.types import Plan, Precision, QuantscopeError, Sensitivity

A8, A16W8, A16W16 = Precision.A8_W8, Precision.A16_W8, Precision.A16_W16
HAILO = load_target("hailo10h")
ATT_SHAPES = {"x": (1, 8, 16)}


def _setup(build):
    model = load_proto(build())
    return model, find_groups(model)


def _sens(gains, base=0.7, **kw):
    return Sensitivity.from_gains("top1", base, gains, **kw)


def _all_plans(result):
    plans = [result.plan]
    for p in (*result.front, *result.trials):
        plans.append(Plan(default=result.plan.default, overrides=p.overrides))
    return plans


def _assert_all_legal(result, groups, model, target, shapes=None):
    for plan in _all_plans(result):
        errors = [
            p for p in check(plan, groups, model, target, shapes=shapes) if p.severity == "error"
        ]
        assert errors == [], plan


def _toy_target(rules=()):
    """A target where every kind allows 8 and 16 bit, cost 2x for 16 bit, no boundary cost."""
    kinds = ("weighted", "matmul", "softmax", "normalization", "elementwise", "other")
    return parse_target(
        {
            "name": "toy",
            "vendor": "test",
            "sdk": "none",
            "precisions": {k: ["a8_w8", "a16_w8", "a16_w16"] for k in kinds},
            "rules": list(rules),
            "cost": {
                "basis": "test",
                "boundary_macs": 0.0,
                "relative": {k: {"a8_w8": 1.0, "a16_w8": 2.0, "a16_w16": 3.0} for k in kinds},
            },
        }
    )


ATTN_RULE = {
    "id": "toy.no_16bit_softmax",
    "check": "act16_on_kinds",
    "reason": "no",
    "provenance": "test",
    "fix": "keep it at 8 bit",
    "params": {"kinds": ["softmax"]},
}


# ---------------------------------------------------------------- legality


def test_never_picks_forbidden_promotions_on_hailo():
    model, groups = _setup(tiny_models.attention)
    gains = {g: {"a16_w8": 0.02, "a16_w16": 0.05} for g in groups.names()}
    gains["Softmax_6"] = {"a16_w8": 0.2, "a16_w16": 0.2}
    r = search(groups, _sens(gains, reference=1.0), HAILO, model, shapes=ATT_SHAPES)
    over = dict(r.plan.overrides)
    assert "Softmax_6" not in over and "MatMul_4" not in over and "MatMul_7" not in over
    assert A16W8 not in over.values()  # a16_w8 on weighted groups hits the empty low byte
    for p in r.front:
        assert not {"Softmax_6", "MatMul_4", "MatMul_7"} & set(dict(p.overrides))
    _assert_all_legal(r, groups, model, HAILO, ATT_SHAPES)
    skipped = {(s.group, s.precision): s.rules for s in r.skipped}
    assert skipped[("Softmax_6", A16W16)] == ("hailo.attention_16bit",)
    assert "blocked by hailo.attention_16bit" in dict(r.plan.reasons)["Softmax_6"]


def test_reports_the_binding_rule_when_quality_is_out_of_reach():
    model, groups = _setup(tiny_models.attention)
    gains = {g: {"a16_w16": 0.01} for g in groups.names()}
    gains["Softmax_6"] = {"a16_w16": 0.25}
    r = search(groups, _sens(gains), HAILO, model, shapes=ATT_SHAPES, min_quality=0.9)
    assert not r.met
    assert r.blockers[0].rule == "hailo.attention_16bit"
    assert r.blockers[0].groups[0] == "Softmax_6" or "Softmax_6" in r.blockers[0].groups
    assert "binding rule: hailo.attention_16bit" in r.binding
    assert r.to_dict()["binding"] == r.binding


def test_a_classifier_softmax_is_not_held_by_attention_16bit_and_planner_agrees_with_check():
    """hailo8: no activation x activation MatMul feeds a classifier's Softmax, so check
    says attention_16bit may not apply there (a warning); the planner reads the same fact
    (Problem.applies) and does not refuse the promotion."""
    from vision_models import gap_classifier

    from quantscope.plan.start import legality

    model, groups = _setup(gap_classifier)
    hailo8 = load_target("hailo8")
    soft = next(g.name for g in groups.groups if g.op_type == "Softmax")
    one = Plan(default=A8, overrides=((soft, A16W16),), target="hailo8")
    (p,) = [p for p in check(one, groups, model, hailo8) if p.rule == "hailo.attention_16bit"]
    assert (p.group, p.severity, p.applies) == (soft, "warning", False)
    assert "not attention" in p.reason and "may not apply here" in p.reason
    legal = legality(Plan.uniform(A8), groups, model, hailo8, None, )
    assert legal.screen(Plan.uniform(A8), soft, A16W16) == ()
    assert legal.blocking(one) == ()
    gains = {g: {"a16_w16": 0.01} for g in groups.names()}
    gains[soft] = {"a16_w16": 0.3}
    r = search(groups, _sens(gains), hailo8, model, max_cost=1.5)
    assert dict(r.plan.overrides)[soft] == A16W16
    assert not [s for s in r.skipped if s.group == soft]
    assert "attention_16bit" not in dict(r.plan.reasons)[soft]
    assert all(b.rule != "hailo.attention_16bit" for b in r.blockers)
    # what the planner emitted, check passes with nothing but that one warning
    assert [(x.rule, x.severity) for x in check(r.plan, groups, model, hailo8)
            if x.group == soft] == [("hailo.attention_16bit", "warning")]


def test_an_attention_softmax_is_still_held_by_attention_16bit_on_hailo8():
    model, groups = _setup(tiny_models.attention)
    hailo8 = load_target("hailo8")
    one = Plan(default=A8, overrides=(("Softmax_6", A16W16),), target="hailo8")
    (p,) = [p for p in check(one, groups, model, hailo8, shapes=ATT_SHAPES)
            if p.rule == "hailo.attention_16bit"]
    assert (p.severity, p.applies) == ("warning", True)
    assert "attention Softmax (fed by an activation x activation MatMul)" in p.reason
    gains = {g: {"a16_w16": 0.01} for g in groups.names()}
    gains["Softmax_6"] = {"a16_w16": 0.3}
    r = search(groups, _sens(gains), hailo8, model, shapes=ATT_SHAPES)
    assert "Softmax_6" not in dict(r.plan.overrides)
    skipped = {(s.group, s.precision): s.rules for s in r.skipped}
    assert skipped[("Softmax_6", A16W16)] == ("hailo.attention_16bit",)
    assert "blocked by hailo.attention_16bit" in dict(r.plan.reasons)["Softmax_6"]


def test_symbolic_shapes_block_wide_rule_moves_even_when_warnings_allowed():
    """hailo.super_defuse is an error rule on hailo10h: a size it cannot evaluate blocks
    the move at that severity, and the blocker says the size is unknown."""
    model, groups = _setup(tiny_models.layernorm_block)
    gains = {"LayerNormalization_10": {"a16_w16": 0.1}}
    strict = search(groups, _sens(gains), HAILO, model)
    assert strict.plan.overrides == ()
    assert strict.skipped[0].severity == "error"
    assert strict.skipped[0].rules == (
        "hailo.super_defuse (size unknown: give --input-shape NAME=… or --seq-len)",)
    loose = search(groups, _sens(gains), HAILO, model, allowed_warnings=frozenset({"hailo.maxpool_16bit"}))
    assert loose.plan.overrides == ()
    wide = search(groups, _sens(gains), HAILO, model, shapes={"x": (1, 8192, 24)})
    assert wide.plan.overrides == ()
    assert wide.skipped[0].rules == ("hailo.super_defuse",)


def test_illegal_start_is_refused():
    model, groups = _setup(tiny_models.residual_add)
    start = Plan(default=A16W8, target=HAILO.name)
    with pytest.raises(PlannerError, match="start plan"):
        search(groups, _sens({}, low=A16W8), HAILO, model, low=A16W8, start=start)


def test_illegal_uniform_low_gets_a_legal_start_with_a_note():
    model, groups = _setup(tiny_models.residual_add)
    r = search(groups, _sens({}, low=A16W8), HAILO, model, low=A16W8)
    assert any("is not legal on" in n for n in r.notes)


def test_low_must_match_the_analysis():
    model, groups = _setup(tiny_models.residual_add)
    with pytest.raises(QuantscopeError, match="same precision"):
        search(groups, _sens({}), HAILO, model, low=A16W16)


# ---------------------------------------------------------------- budgets


def _chain():
    model, groups = _setup(tiny_models.residual_add)  # MatMul_0, MatMul_3, Add_5
    return model, groups


def test_min_quality_picks_the_cheaper_plan():
    model, groups = _chain()
    target = _toy_target()
    costs = {
        g: plan_cost(Plan(A8, ((g, A16W16),)), groups, target, model=model) for g in groups.names()
    }
    cheap = min(costs, key=costs.get)
    dear = max(costs, key=costs.get)
    gains = {cheap: {"a16_w16": 0.06}, dear: {"a16_w16": 0.10}}
    r = search(groups, _sens(gains), target, model, min_quality=0.75)
    assert r.met and dict(r.plan.overrides) == {cheap: A16W16}
    # a quality only the expensive group reaches: the cheap one is pruned away
    r = search(groups, _sens(gains), target, model, min_quality=0.79)
    assert r.met and dict(r.plan.overrides) == {dear: A16W16}
    assert r.cost == pytest.approx(costs[dear])


def test_max_cost_is_respected_and_the_cap_is_reported():
    model, groups = _chain()
    target = _toy_target()
    gains = {g: {"a16_w8": 0.03, "a16_w16": 0.05} for g in groups.names()}
    for cap in (1.0, 1.2, 1.5, 2.0, 10.0):
        r = search(groups, _sens(gains), target, model, max_cost=cap)
        assert r.cost <= cap + 1e-9 and r.met
        assert plan_cost(r.plan, groups, target, model=model) == pytest.approx(r.cost)
        assert all(p.cost <= cap + 1e-9 for p in r.front)
    r = search(groups, _sens(gains), target, model, max_cost=1.2, min_quality=0.9)
    assert not r.met and "cost cap binds" in r.binding
    r = search(groups, _sens(gains), target, model, max_cost=0.5)
    assert not r.met and "below the cost of the start plan" in r.binding


def test_lower_is_better_metric():
    model, groups = _chain()
    gains = {"MatMul_0": {"a16_w16": 0.2}, "MatMul_3": {"a16_w16": 0.05}}
    sens = _sens(gains, base=1.0, higher_is_better=False)
    r = search(groups, sens, _toy_target(), model, min_quality=0.8)
    assert r.met and r.predicted == pytest.approx(0.8)
    assert dict(r.plan.overrides) == {"MatMul_0": A16W16}


# ---------------------------------------------------------------- front, cost, determinism


def test_front_is_non_dominated_and_costs_match_plan_cost():
    model, groups = _setup(tiny_models.layernorm_block)
    shapes = {"x": (1, 8, 24)}
    gains = {
        g: {"a16_w8": 0.01 * (i + 1), "a16_w16": 0.02 * (i + 1)}
        for i, g in enumerate(groups.names())
    }
    r = search(groups, _sens(gains), HAILO, model, shapes=shapes)
    budget = Budget()
    for a in r.front:
        assert plan_cost(
            Plan(A8, a.overrides), groups, HAILO, shapes, model=model
        ) == pytest.approx(a.cost)
        assert not any(
            b is not a and (b.cost <= a.cost and b.predicted > a.predicted) for b in r.front
        )
    assert [p.cost for p in r.front] == sorted(p.cost for p in r.front)
    assert pareto_front(r.front, budget) == r.front
    _assert_all_legal(r, groups, model, HAILO, shapes)


@settings(max_examples=25, deadline=None)
@given(
    precs=st.lists(st.sampled_from([A8, A16W8, A16W16]), min_size=5, max_size=5),
)
def test_cost_table_equals_plan_cost(precs):
    model, groups = _setup(tiny_models.layernorm_block)
    shapes = {"x": (1, 8, 24)}
    table = cost_table(groups, HAILO, model, [A8, A16W8, A16W16], shapes)
    prec = dict(zip(groups.names(), precs, strict=True))
    plan = Plan(A8, tuple((g, p) for g, p in prec.items() if p != A8))
    assert table.total(prec) == pytest.approx(plan_cost(plan, groups, HAILO, shapes, model=model))
    g = groups.names()[2]
    moved = {**prec, g: A16W16}
    expected = table.total(moved) - table.total(prec)
    assert table.delta(prec, g, A16W16) == pytest.approx(expected, abs=1e-12)


@settings(max_examples=20, deadline=None)
@given(gains=st.lists(st.floats(-0.05, 0.2), min_size=21, max_size=21), q=st.floats(0.7, 1.2))
def test_every_emitted_plan_passes_check(gains, q):
    model, groups = _setup(tiny_models.attention)
    names = groups.names()
    table = {g: {"a16_w8": gains[3 * i], "a16_w16": gains[3 * i + 1]} for i, g in enumerate(names)}
    r = search(groups, _sens(table), HAILO, model, shapes=ATT_SHAPES, min_quality=q)
    _assert_all_legal(r, groups, model, HAILO, ATT_SHAPES)


def test_same_inputs_same_bytes(tmp_path):
    model, groups = _setup(tiny_models.attention)
    analysis = {
        "metric": "top1_agreement",
        "base": 0.7,
        "reference": 1.0,
        "gains": {
            g: {"a16_w8": 0.01, "a16_w16": 0.03 + 0.001 * i} for i, g in enumerate(groups.names())
        },
    }
    outs = []
    for i in range(2):
        plan, extra = plan_from_analysis(
            model, sensitivity_from_dict(analysis), "hailo10h", min_quality=0.75,
            shapes=ATT_SHAPES, seed=3
        )
        outs.append(write_plan(tmp_path / f"plan{i}.json", plan, extra).read_bytes())
    assert outs[0] == outs[1]
    back = read_plan(tmp_path / "plan0.json")
    assert back.target == "hailo10h" and dict(back.meta)["seed"] == "3"
    assert back.overrides == plan.overrides and back.reasons == plan.reasons


# ---------------------------------------------------------------- refinement


def test_refine_uses_measurements_and_drops_useless_promotions():
    model, groups = _chain()
    target = _toy_target()
    gains = {g: {"a16_w16": 0.05} for g in groups.names()}
    calls = []

    def evaluate(plan):  # only MatMul_3 really helps
        calls.append(plan)
        return 0.7 + (0.1 if plan.precision_of("MatMul_3") == A16W16 else 0.0)

    r = search(
        groups, _sens(gains), target, model, min_quality=0.78, evaluate=evaluate, refine_steps=6
    )
    assert r.met and r.measured == pytest.approx(0.8)
    assert dict(r.plan.overrides) == {"MatMul_3": A16W16}
    assert 0 < len(calls) <= 6 and len(r.trials) == len(calls)
    assert all(p.measured is not None for p in r.trials)
    _assert_all_legal(r, groups, model, target)


def test_refine_reports_when_prediction_overestimates():
    model, groups = _chain()
    gains = {g: {"a16_w16": 0.1} for g in groups.names()}
    r = search(groups, _sens(gains), _toy_target(), model, min_quality=0.9, evaluate=lambda p: 0.71)
    assert not r.met and "measurement does not" in r.binding


def test_max_cost_refine_keeps_best_measured_within_cap():
    model, groups = _chain()
    gains = {g: {"a16_w8": 0.02, "a16_w16": 0.04} for g in groups.names()}
    r = search(
        groups,
        _sens(gains),
        _toy_target(),
        model,
        max_cost=1.6,
        evaluate=lambda p: 0.5 + 0.01 * len(p.overrides),
    )
    assert r.cost <= 1.6 + 1e-9 and r.measured is not None


# ---------------------------------------------------------------- inputs and hooks


def test_sensitivity_adapter_forms():
    gains = sensitivity_from_dict({"metric": "m", "base": 0.5, "gains": {"a": {"a16_w16": 0.1}}})
    enable = sensitivity_from_dict(
        {"metric": "m", "base": 0.5, "enable_one": {"a": {"a16_w16": 0.6}}}
    )
    assert gains.gain("a", A16W16) == pytest.approx(0.1) == enable.gain("a", A16W16)
    lower = sensitivity_from_dict(
        {
            "metric": "err",
            "base": 0.5,
            "higher_is_better": False,
            "enable_one": {"a": {"a16_w16": 0.3}},
        }
    )
    assert lower.gain("a", A16W16) == pytest.approx(0.2) and lower.quality(0.2) == pytest.approx(
        0.3
    )
    assert gains.gain("a", A8) == 0.0 and gains.gain("a", A16W8) is None
    for bad in (
        {"base": 1},
        {"metric": "m", "base": "x", "gains": {}},
        {"metric": "m", "base": 1},
        [1],
    ):
        with pytest.raises(QuantscopeError):
            sensitivity_from_dict(bad)


def test_analysis_for_another_model_is_refused():
    model, _ = _chain()
    with pytest.raises(QuantscopeError, match="another model"):
        plan_from_analysis(
            model,
            sensitivity_from_dict({"metric": "m", "base": 0.5, "gains": {"nope": {"a16_w16": 1}}}),
            HAILO,
        )


def test_repair_hook_is_ranked_with_promotions():
    model, groups = _chain()
    gains = {g: {"a16_w16": 0.01} for g in groups.names()}
    fix = RepairOption("smooth", gain=0.08, cost=0.0, reason="migrates outliers")
    r = search(groups, _sens(gains), _toy_target(), model, min_quality=0.78, repairs=(fix,))
    assert r.met and r.plan.overrides == () and r.repairs == (fix,)
    assert dict(r.plan.meta)["repairs"] == "smooth"
    assert r.path[0].group == "repair:smooth"


def test_toy_rule_blocks_and_is_named():
    model, groups = _setup(tiny_models.attention)
    target = _toy_target([ATTN_RULE])
    gains = {"Softmax_6": {"a16_w16": 0.3}, "MatMul_0": {"a16_w16": 0.01}}
    r = search(groups, _sens(gains), target, model, min_quality=0.95)
    assert "Softmax_6" not in dict(r.plan.overrides)
    assert r.blockers[0].rule == "toy.no_16bit_softmax" and r.blockers[0].gain == pytest.approx(0.3)
    assert not math.isinf(r.cost)


def test_pareto_front_drops_dominated_points():
    b = Budget()
    pts = [
        FrontPoint(1.0, 0.5, None, ()),
        FrontPoint(2.0, 0.6, None, (("a", A16W16),)),
        FrontPoint(1.5, 0.7, None, (("b", A16W16),)),
    ]
    assert [p.cost for p in pareto_front(pts, b)] == [1.0, 1.5]


# ---------------------------------------------------------------- one place per fact, layering


def test_analysis_json_is_parsed_by_serde_into_a_typed_value(tmp_path):
    from quantscope.serde import read_sensitivity

    path = tmp_path / "a.json"
    path.write_text(
        '{"format": "quantscope.analysis/1", "low": "a8_w8", "high": "a16_w16", '
        '"offenders": [{"group": "a", "score_db": 2.5}, {"group": "b", "score_db": -0.1}], '
        '"baselines": {"a8_w8": {"sqnr_db": 12.0}}}'
    )
    sens = read_sensitivity(path)
    assert isinstance(sens, Sensitivity) and sens.metric == "output_sqnr_db"
    assert sens.base == 12.0 and sens.gain("a", A16W16) == 2.5 and sens.gain("b", A16W16) == 0.0
    assert sens.quality(2.5) == 14.5
    path.write_text('{"format": "quantscope.analysis/1", "offenders": [{"group": "a", '
                    '"score_db": "high"}]}')
    with pytest.raises(QuantscopeError, match="'score_db' in offender 'a'"):
        read_sensitivity(path)
    with pytest.raises(QuantscopeError, match="does not exist"):
        read_sensitivity(tmp_path / "missing.json")


def test_values_per_frame_for_rules_and_costs():
    from quantscope.model.shapes import frame_values

    assert frame_values((1, 8, 24)) == 192 == frame_values((1, 8, 24), unknown=1)
    assert frame_values(("batch", "seq", 24)) is None  # a rule cannot decide
    assert frame_values(("batch", "seq", 24), unknown=1) == 24  # cost per position
    assert frame_values(None) is None and frame_values(None, unknown=1) == 1
    assert frame_values((7,)) == 7  # rank 1: no batch dim


def test_plan_imports_no_higher_layer():
    """plan/ takes evaluation and repairs as callables (stages binds them)."""
    import ast
    from pathlib import Path

    import quantscope.plan

    higher = ("quantscope.stages", "quantscope.cli", "quantscope.repair", "quantscope.export",
              "quantscope.report", "quantscope.tasks.registry")
    found = []
    for path in Path(quantscope.plan.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [node.module or ""] if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names] if isinstance(node, ast.Import) else []
            )
            found += [(path.name, n) for n in names if n.startswith(higher)]
    assert found == []


def test_residual_stream_is_measured_when_predictions_rank_nothing():
    """A collapsed model: every per-group prediction is zero, so the greedy path promotes
    nothing; the residual-stream candidate (the residual Add + the LayerNorm reading it,
    at the widest legal precision) is measured anyway and chosen because it measures
    best. A rule forbidding 16-bit normalisation keeps the LayerNorm out of it."""
    model, groups = _setup(tiny_models.layernorm_block)
    gains = {g: {"a16_w8": 0.0, "a16_w16": 0.0} for g in groups.names()}
    stream = {"Add_9", "LayerNormalization_10"}

    def evaluate(plan):
        return 0.5 + 0.2 * len(stream & set(dict(plan.overrides)))

    r = search(groups, _sens(gains), _toy_target(), model, max_cost=3.0, evaluate=evaluate)
    assert dict(r.plan.overrides) == {n: A16W16 for n in stream}
    assert r.measured == pytest.approx(0.9)
    assert [t.origin for t in r.trials].count("residual") == 1
    no_norm = {**ATTN_RULE, "id": "toy.no_16bit_norm", "params": {"kinds": ["normalization"]}}
    r = search(groups, _sens(gains), _toy_target([no_norm]), model, max_cost=3.0,
               evaluate=evaluate)
    assert dict(r.plan.overrides) == {"Add_9": A16W16}
    _assert_all_legal(r, groups, model, _toy_target([no_norm]))
    r = search(groups, _sens(gains), _toy_target(), model, max_cost=1.0, evaluate=evaluate)
    assert r.plan.overrides == () and "residual" not in [t.origin for t in r.trials]


def test_the_binding_sentence_and_reasons_write_a_share_in_its_unit():
    """The planner's binding sentence and reasons wrote a share 0-1 ("min_quality 0.97 not
    met: … has top1_agreement 0.9 …; … blocks +0.3 predicted"); a share now reads in
    percent and its gains in points, as every console does."""
    model, groups = _setup(tiny_models.attention)
    gains = {g: {"a16_w16": 0.01} for g in groups.names()}
    gains["Softmax_6"] = {"a16_w16": 0.25}
    sens = Sensitivity.from_gains("top1_agreement", 0.7, gains)
    r = search(groups, sens, HAILO, model, shapes=ATT_SHAPES, min_quality=0.97)
    assert r.binding.startswith("min_quality 97.0 % not met: the best legal plan found has "
                                "top1_agreement ")
    assert "binding rule: hailo.attention_16bit blocks +27.00 pts predicted on 3" in r.binding
    assert "(+25.00 pts predicted) blocked by hailo.attention_16bit" in \
        dict(r.plan.reasons)["Softmax_6"]
