"""Racing candidates on prefixes (plan/race.py; stages/race.py; plan --race): a clearly
worse candidate stops early, a close one runs to the last look, the race is the same on
the same inputs, and the planner measures in full only the survivors."""

from __future__ import annotations

import numpy as np
import pytest
from test_search import _chain, _sens, _toy_target

from quantscope.plan.race import RaceRule, race, t_quantile
from quantscope.plan.search import search
from quantscope.types import Plan

TOTAL = 1000


def _scores(means: list[float], seed: int = 0):
    """Per-sample 0/1 scores drawn once per candidate (the same samples for every look)."""
    rng = np.random.default_rng(seed)
    u = rng.random(TOTAL)  # one draw per sample, shared: candidates are paired
    noise = rng.random((len(means), TOTAL))
    table = np.stack([(0.7 * u + 0.3 * noise[i] < m).astype(float) for i, m in enumerate(means)])
    return lambda i, n: table[i, :n]


def test_a_clearly_worse_candidate_stops_at_the_first_look():
    r = race(["good", "bad"], _scores([0.9, 0.2]), TOTAL)
    good, bad = r.entries
    assert bad.stopped and bad.n == r.looks[0] == 16 and bad.rival == "good"
    assert bad.difference + bad.half_width < 0 and bad.difference < -0.4
    assert not good.stopped and good.n == r.looks[-1] and r.survivors == (0,)
    assert r.looks == (16, 32, 64, 128) and r.looks[-1] <= TOTAL * 0.25


def test_a_close_candidate_runs_to_the_last_look():
    r = race(["a", "b"], _scores([0.80, 0.79]), TOTAL)
    assert r.survivors == (0, 1)
    assert all(e.n == r.looks[-1] for e in r.entries)
    loser = next(e for e in r.entries if e.difference < 0)
    assert loser.difference + loser.half_width >= 0  # inside its interval: not stopped


def test_same_inputs_same_race_and_the_record_states_the_rule():
    first = race(["a", "b", "c"], _scores([0.9, 0.5, 0.88]), TOTAL, RaceRule(0.99))
    again = race(["a", "b", "c"], _scores([0.9, 0.5, 0.88]), TOTAL, RaceRule(0.99))
    assert first == again and first.to_dict() == again.to_dict()
    doc = first.to_dict()
    assert "99%" in doc["rule"] and "Bonferroni over 4 look(s) x 2 rival(s)" in doc["rule"]
    assert [c["stopped"] for c in doc["candidates"]] == [False, True, False]


def test_against_an_incumbent_only_the_challengers_stop():
    r = race(["incumbent", "worse", "better"], _scores([0.7, 0.2, 0.95]), TOTAL, incumbent=0)
    assert r.entries[1].stopped and r.entries[1].rival == "incumbent"
    assert not r.entries[0].stopped and not r.entries[2].stopped and r.leader == 0


def test_too_few_samples_means_no_look_and_no_stop():
    r = race(["a", "b"], _scores([0.9, 0.1]), 40)  # 16 > 40 / 4: no look
    assert r.looks == () and r.survivors == (0, 1)


def test_a_score_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="expected 16"):
        race(["a", "b"], lambda i, n: np.ones(n - 1), TOTAL)


@pytest.mark.parametrize(("p", "dof", "exact"), [(0.95, 15, 1.7531), (0.99, 31, 2.4528),
                                                  (0.999, 63, 3.2247), (0.9875, 15, 2.4899)])
def test_the_t_quantile_is_students(p, dof, exact):
    assert t_quantile(p, dof) == pytest.approx(exact, abs=2e-3)


def test_the_planner_measures_only_the_survivors_and_chooses_the_same_plan():
    model, groups = _chain()
    gains = {g: {"a16_w8": 0.02, "a16_w16": 0.04} for g in groups.names()}

    def quality(p: Plan) -> float:  # more 16-bit groups, better; a16_w16 best
        return 0.3 + 0.1 * sum(2 if v.value == "a16_w16" else 1 for _, v in p.overrides)

    measured: list[Plan] = []

    def evaluate(p: Plan) -> float:
        measured.append(p)
        return quality(p)

    races = []

    def racer(plans, margin=None):
        rng = np.random.default_rng(1)
        u = rng.random(TOTAL)
        table = [(u < min(quality(p), 0.99)).astype(float) for p in plans]
        races.append(race([f"c{i}" for i in range(len(plans))], lambda i, n: table[i][:n],
                          TOTAL, margin=margin))
        return races[-1]

    kw = {"max_cost": 1.6}
    plain = search(groups, _sens(gains), _toy_target(), model, evaluate=evaluate, **kw)
    n_plain = len(measured)
    measured.clear()
    raced = search(groups, _sens(gains), _toy_target(), model, evaluate=evaluate,
                   race=racer, **kw)
    assert races and any(e.stopped for e in races[0].entries)
    stopped = sum(e.stopped for r in races for e in r.entries)
    assert len(measured) == n_plain - stopped  # the same steps, the stopped ones unmeasured
    assert raced.plan == plain.plan and raced.measured == plain.measured


def _drop_race_setup():
    model, groups = _chain()
    gains = {g: {"a16_w8": 0.02, "a16_w16": 0.04} for g in groups.names()}

    def quality(p: Plan) -> float:
        return 0.3 + 0.1 * sum(2 if v.value == "a16_w16" else 1 for _, v in p.overrides)

    measured: list[Plan] = []
    races = []

    def evaluate(p: Plan) -> float:
        measured.append(p)
        return quality(p)

    def racer(plans, margin=None):
        u = np.random.default_rng(1).random(TOTAL)
        table = [(u < min(quality(p), 0.99)).astype(float) for p in plans]
        races.append((tuple(plans), race([f"c{i}" for i in range(len(plans))],
                                         lambda i, n: table[i][:n], TOTAL, margin=margin)))
        return races[-1][1]

    return model, groups, gains, evaluate, racer, measured, races


def test_the_drops_are_raced_against_the_incumbent_and_a_stopped_one_is_never_measured():
    model, groups, gains, evaluate, racer, measured, races = _drop_race_setup()
    plain = search(groups, _sens(gains), _toy_target(), model, evaluate=evaluate, max_cost=1.6)
    n_plain = len(measured)
    measured.clear()
    raced = search(groups, _sens(gains), _toy_target(), model, evaluate=evaluate,
                   race=racer, max_cost=1.6)
    drops = [(plans, r) for plans, r in races if len(plans) == 2]
    assert drops, "no drop was raced"
    stopped = [plans[1] for plans, r in drops if r.entries[1].stopped]
    assert stopped and not any(p in measured for p in stopped)
    assert all(not r.entries[0].stopped for _, r in drops)  # never the incumbent
    assert raced.plan == plain.plan and raced.measured == plain.measured
    assert len(measured) < n_plain


def test_with_a_quality_goal_the_drops_are_not_raced():
    """The keep rule of a drop is then the goal, not the incumbent: measured in full."""
    model, groups, gains, evaluate, racer, measured, races = _drop_race_setup()
    search(groups, _sens(gains), _toy_target(), model, evaluate=evaluate, race=racer,
           min_quality=0.5, max_cost=1.6)
    assert measured and not races


def test_a_margin_keeps_a_candidate_the_callers_rule_could_still_choose():
    """Clearly worse than its rival (stopped without a margin), but within the caller's
    allowance: it runs on; the entry records the margin it was given."""
    score = _scores([0.9, 0.75])
    assert race(["a", "b"], score, TOTAL).entries[1].stopped
    r = race(["a", "b"], score, TOTAL, margin=lambda mean, rival, total: 0.3)
    assert not r.entries[1].stopped and r.entries[1].margin == 0.3
    assert r.entries[1].to_dict()["margin"] == 0.3 and "allowance" in r.rule
    assert "margin" not in race(["a", "b"], score, TOTAL).entries[1].to_dict()
    # beyond the allowance it still stops
    assert race(["a", "b"], _scores([0.9, 0.3]), TOTAL,
                margin=lambda mean, rival, total: 0.1).entries[1].stopped


def test_lowest_kept_is_where_the_noise_rule_stops_keeping():
    from dataclasses import replace

    from quantscope.plan.pareto import Budget, FrontPoint, lowest_kept, not_worse

    budget = Budget(max_cost=1.5)
    ref = FrontPoint(cost=1.2, predicted=0.8, measured=0.8, overrides=(), items=50.0)
    like = replace(ref, cost=1.0, measured=0.7)
    low = lowest_kept(ref, like, budget)
    assert low is not None and 0.5 < low < 0.8
    assert not_worse(replace(like, measured=low), ref, budget)
    assert not not_worse(replace(like, measured=low - 1e-6), ref, budget)
    # no noise estimate (no items): none
    assert lowest_kept(replace(ref, items=None), replace(like, items=None), budget) is None
    # a goal the reference meets is never traded away: the floor binds first
    floored = Budget(max_cost=1.5, floor=0.75)
    assert lowest_kept(ref, like, floored) == pytest.approx(0.75, abs=1e-9)


def test_a_drop_within_the_keep_rules_noise_is_not_raced_out_and_the_choice_holds():
    """The defect h77 left: a drop worse than the incumbent on a prefix beyond the race's
    interval, but within the noise the keep rule allows on the whole set (a share over few
    items), was stopped by the race, so the race changed the no-goal choice. Now the race
    stops a drop only beyond the keep rule's allowance: the same plan as without it."""
    model, groups, gains, evaluate, racer, measured, races = _drop_race_setup()

    class Counted:  # a share over 40 items: a wide noise (about +-0.17 at 0.7)
        items = 40.0

        def __call__(self, p: Plan) -> float:
            return evaluate(p)

    def unguarded(plans, margin=None):  # the race as it was: no allowance
        return racer(plans)

    kw = {"max_cost": 1.6}
    plain = search(groups, _sens(gains), _toy_target(), model, evaluate=Counted(), **kw)
    measured.clear()
    before = search(groups, _sens(gains), _toy_target(), model, evaluate=Counted(),
                    race=unguarded, **kw)
    assert any(r.entries[1].stopped for plans, r in races if len(plans) == 2)
    assert before.plan != plain.plan  # the defect: the race changed the choice
    races.clear()
    raced = search(groups, _sens(gains), _toy_target(), model, evaluate=Counted(),
                   race=racer, **kw)
    assert races and all(e.margin > 0 for _, r in races for e in r.entries[1:])
    assert not any(r.entries[1].stopped for plans, r in races if len(plans) == 2)
    assert raced.plan == plain.plan and raced.measured == plain.measured


# ---------------------------------------------------------------- real plans in ORT

PAIRS = 200


@pytest.fixture(scope="module")
def encoder():
    import onnx
    from test_tasks_text import tiny_encoder

    from quantscope import stages
    from quantscope.model.load import load_proto

    model = load_proto(tiny_encoder(inputs=("input_ids", "attention_mask")), "tiny-encoder")
    assert isinstance(model.proto, onnx.ModelProto)
    data = stages.open_data("stdlib-docs", model, max_pairs=PAIRS)
    return model, data, stages.calibrate_model(model, data)


def _plans():
    from quantscope.types import Precision

    hi, lo = Plan(default=Precision.A16_W16), Plan(default=Precision.A8_W8)
    # the token embeddings clipped to +-0.05: near chance against FP32
    broken = Plan(default=Precision.A8_W8, pinned=(("tokens", (-0.05, 0.05)),))
    return hi, lo, broken


def test_a_race_of_real_plans_stops_the_broken_one_at_the_first_look(encoder):
    from quantscope.stages.race import PlanRacer

    model, data, stats = encoder
    racer = PlanRacer(model, data, stats, "top1_agreement", RaceRule())
    r = racer(_plans())
    assert r.looks == (16, 32) and r.survivors == (0, 1)
    broken = r.entries[2]
    assert broken.stopped and broken.n == 16 and broken.mean < 0.6
    doc = racer.record()
    assert doc["races"][0]["candidates"][2]["n"] == 16
    assert doc["races"][0]["candidates"][0]["groups"] == {}  # uniform plans: no overrides
    assert "whole set" in doc["note"] and "prefix's own documents" in doc["interval"]


@pytest.mark.parametrize("metric", ["top1_agreement", "recall@1"])
def test_per_query_scores_on_every_pair_are_the_metric_evaluate_reports(encoder, metric):
    from quantscope import stages
    from quantscope.stages.race import PairRunner, PlanRacer
    from quantscope.tasks.samples import prefix_samples

    model, data, stats = encoder
    lo = _plans()[1]
    racer = PlanRacer(model, data, stats, metric, RaceRule())
    test = PairRunner(racer._proto(lo), data.task, racer.order)
    test.upto(16)  # run in two pieces: the rest comes on demand
    scores = prefix_samples(metric, racer.reference.upto(PAIRS), test.upto(PAIRS), PAIRS)
    full = stages.evaluate_plan(model, data, stats, lo, saturation=False)["metrics"][metric]
    assert scores.shape == (PAIRS,) and float(np.mean(scores)) == pytest.approx(full, abs=1e-12)


@pytest.mark.parametrize("metric", ["top1_agreement", "recall@1"])
def test_a_plan_scored_for_its_ranking_alone_gets_the_full_figure_float_for_float(encoder,
                                                                                  metric):
    """``evaluate_plan(only=metric)`` (the planner's evaluator) scores just the metric, by
    the per-query scores on every pair: the figure the full scoring reports, exactly."""
    from quantscope import stages
    from quantscope.analyze.incremental import IncrementalEngine
    from quantscope.analyze.measure import ONLY_NOTE

    model, data, stats = encoder
    engine = IncrementalEngine(model, list(data.evaluation))
    for plan in _plans():
        full = stages.evaluate_plan(model, data, stats, plan, saturation=False)
        alone = stages.evaluate_plan(model, data, stats, plan, saturation=False, engine=engine,
                                     only=metric)
        assert alone["metrics"][metric] == full["metrics"][metric]
        assert set(alone["metrics"]) == {metric, f"{metric}_items"}  # and its queries
        assert ONLY_NOTE.format(metric) in alone["notes"] and alone["outputs"] == {}
    assert len({stages.evaluate_plan(model, data, stats, p, saturation=False, only=metric)
                ["metrics"][metric] for p in _plans()}) > 1  # the plans differ: it can fail


@pytest.mark.parametrize("metric", ["top1_agreement", "recall@1"])
def test_the_planner_holds_fp32s_pooled_rows_only_and_scores_the_same(encoder, metric,
                                                                      monkeypatch):
    """The planner's evaluator keeps FP32's outputs as the task keeps them (pooled rows,
    no per-token reference) and gets the figure the full scoring reports."""
    from quantscope import stages
    from quantscope.analyze import measure
    from quantscope.stages import plan_measure
    from quantscope.targets import load_target

    model, data, stats = encoder
    kept = measure.reference_kept_outputs(model, data)
    widths = {a.shape[-1] for b in kept.batches for a in b}
    assert all(a.ndim == 2 for b in kept.batches for a in b)  # [rows, dim]: pooled
    ran = []
    monkeypatch.setattr(plan_measure, "run_model", lambda *a, **k: ran.append(1))
    evaluate = plan_measure.plan_evaluator(model, data, stats, metric,
                                           target=load_target("ort_cpu"))
    for plan in _plans():
        full = stages.evaluate_plan(model, data, stats, plan, saturation=False)
        alone = stages.evaluate_plan(model, data, stats, plan, saturation=False,
                                     only=metric, reference_kept=kept)
        count = alone["metrics"][f"{metric}_items"]  # a share over the queries
        assert alone["metrics"] == {metric: full["metrics"][metric], f"{metric}_items": count}
        assert count == full["metrics"].get(f"{metric}_items", count) >= 16
        assert evaluate(plan) == full["metrics"][metric] and evaluate.items == count
    assert not ran and len(widths) == 1  # no per-token FP32 run for the planner


def test_plan_model_records_the_race_and_chooses_what_it_chose_without(encoder):
    from quantscope import stages
    from quantscope.model.groups import find_groups
    from quantscope.report.console import format_search
    from quantscope.targets import load_target
    from quantscope.types import Sensitivity

    model, data, stats = encoder
    names = find_groups(model).names()
    sens = Sensitivity.from_gains("output_sqnr_db", 20.0,
                                  {n: {"a16_w8": 3.0, "a16_w16": 5.0} for n in names})
    runs = {race: stages.plan_model(model, sens, load_target("ort_cpu"),
                                    stages.PlanOptions(race=race), data=data, stats=stats)
            for race in (None, 0.95)}
    assert "race" not in runs[None].pareto
    record = runs[0.95].pareto["race"]
    assert record["confidence"] == 0.95 and len(record["races"]) >= 2
    # the refine batch, then each one-at-a-time drop against the incumbent (two plans)
    assert all(len(r["candidates"]) == 2 for r in record["races"][1:])
    assert all("n" in c and "half_width" in c for c in record["races"][0]["candidates"])
    assert runs[0.95].plan.overrides == runs[None].plan.overrides
    assert runs[0.95].pareto["chosen"] == runs[None].pareto["chosen"]
    assert "race (top1_agreement, 200 pairs" in format_search(runs[0.95].pareto)


def test_a_race_says_why_it_cannot_run(encoder):
    from quantscope.stages.race import race_unsupported

    _, data, _ = encoder
    assert "needs retrieval pairs" in race_unsupported(None, "top1_agreement")
    assert "no per-sample form" in race_unsupported(data, "embedding_cosine_mean")
    assert race_unsupported(data, "recall@1") is None


def test_the_cli_refuses_a_confidence_outside_its_range(tmp_path, capsys):
    from quantscope.cli import main

    (tmp_path / "a.json").write_text("{}")
    code = main(["plan", "minilm-l3", "--analysis", str(tmp_path / "a.json"), "--target",
                 "ort_cpu", "--race", "1.5", "--out", str(tmp_path / "p.json")])
    err = capsys.readouterr().err
    assert code != 0 and "outside [0.5, 1)" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "p.json").exists()


def test_buckets_race_stops_the_broken_candidate_and_chooses_the_same_deployment(encoder):
    from quantscope.plan.deployment import Candidate
    from quantscope.plan.deployment_results import DeploymentChoice
    from quantscope.stages.buckets import choose_deployment

    model, data, stats = encoder
    cands = tuple(Candidate(name, model, stats, Plan(default=p.default, target="ort_cpu",
                                                     pinned=p.pinned))
                  for name, p in zip(("hi", "lo", "broken"), _plans(), strict=True))
    kw = {"max_cost": 10.0, "seq_lens": (16, 32, 64), "max_buckets": 2}
    plain = choose_deployment(model, data, cands, "ort_cpu", **kw)
    raced = choose_deployment(model, data, cands, "ort_cpu", race=0.95, **kw)
    entries = {c["name"]: c for c in raced.race["candidates"]}
    assert entries["broken"]["stopped"] and entries["broken"]["n"] == 16
    assert entries["broken"]["rival"] == "lo"  # the same cost: only lo may stop it
    assert not entries["hi"]["stopped"] and not entries["lo"]["stopped"]
    assert set(raced.candidates) == {"hi", "lo"} and "broken" in plain.candidates
    assert raced.buckets == plain.buckets and raced.cosine_mean == plain.cosine_mean
    assert any(n.startswith("race: 1 of 3 candidate(s) stopped") for n in raced.notes)
    assert "race" not in plain.to_dict()
    assert DeploymentChoice.from_dict(raced.to_dict()) == raced


def test_buckets_measures_the_race_survivors_on_the_sessions_the_race_built(encoder):
    """``buckets --race``: the candidates of one model race on its engine's sessions, so
    the survivors' full measurement builds none again (before: engines of its own)."""
    from quantscope.plan.deployment import Candidate
    from quantscope.stages.buckets import _engines, measure_errors, race_candidates, select_texts

    model, data, stats = encoder
    cands = tuple(Candidate(name, model, stats, Plan(default=p.default, target="ort_cpu",
                                                     pinned=p.pinned))
                  for name, p in zip(("hi", "lo", "broken"), _plans(), strict=True))
    sel = select_texts(model, data, cands, (16, 32), 2, 0)
    engines = _engines(cands, tuple(sel.task.batches.batches))
    (engine,) = engines.values()
    costs = np.array([[2.0, 2.0], [1.0, 1.0], [1.0, 1.0]])  # hi dearer: only lo stops broken
    raced = race_candidates(model, cands, sel, costs, 0.95, engines=engines)
    built = engine.counts.sessions_built
    assert engine.counts.plans == 0 and raced.survivors == (0, 1)
    measure_errors(model, tuple(cands[i] for i in raced.survivors), sel, engines=engines)
    assert engine.counts.plans == 2 and engine.counts.sessions_built == built == 0
