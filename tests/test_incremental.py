"""The incremental evaluator: a plan's outputs run from its first changed segment equal the
full QDQ model's; the caches stay within their budgets; the planner records which engine
measured; a plan it cannot run gets a full pass and a note."""

from __future__ import annotations

import numpy as np
import pytest
import tiny_models as tm
from incremental_models import encoder, feeds
from test_route import setup  # noqa: F401

from quantscope.analyze.incremental import IncrementalConfig, IncrementalEngine, IncrementalRunner
from quantscope.analyze.measure import evaluate_plans
from quantscope.calibrate.collect import calibrate
from quantscope.emulate.evaluate import run_model
from quantscope.emulate.qdq import quantize_model, scheme_for
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.types import Dataset, Plan, Precision, QuantScheme, Sensitivity

SCHEME = QuantScheme()
LOW, HIGH = Precision.A8_W8, Precision.A16_W16


@pytest.fixture(scope="module")
def prepared():
    model = load_proto(encoder(layers=3), "tiny-encoder")
    batches = [feeds(n=3, s=5 + i, seed=i) for i in range(3)]  # lengths differ per batch
    return model, calibrate(model, find_groups(model), batches), batches


def _full(model, stats, plan, batches):
    return run_model(quantize_model(model, stats, plan, scheme=SCHEME).proto, batches)


def _assert_same(a, b):
    assert a.names == b.names
    for x, y in zip(a.batches, b.batches, strict=True):
        for u, v in zip(x, y, strict=True):
            np.testing.assert_allclose(u, v, rtol=0, atol=1e-6)


def _plans(names, seed=0, n=5):
    rng = np.random.default_rng(seed)
    prec = [LOW, HIGH, Precision.A16_W8, Precision.FLOAT]
    for _ in range(n):
        yield Plan(default=LOW, overrides=tuple(
            (g, prec[int(rng.integers(len(prec)))]) for g in names if rng.random() < 0.4))


def test_random_plans_equal_the_full_qdq_model(prepared):
    model, stats, batches = prepared
    runner = IncrementalRunner(model, stats, batches, scheme=SCHEME)
    assert len(runner.segments) > 4  # several cuts: the test means something
    for plan in _plans(runner.groups.names()):
        _assert_same(runner.outputs(plan), _full(model, stats, plan, batches))
    assert runner.counts.plans == 5


def test_a_plan_differing_in_the_last_group_runs_only_the_last_segment(prepared):
    model, stats, batches = prepared
    runner = IncrementalRunner(model, stats, batches, scheme=SCHEME)
    names = runner.groups.names()
    seg_of = {g: s.index for s in runner.segments for g in s.groups}
    first, last = names[0], max(names, key=seg_of.__getitem__)
    base = Plan.uniform(LOW)
    _assert_same(runner.outputs(base), _full(model, stats, base, batches))
    m = len(runner.segments)
    assert (runner.counts.segments_run, runner.counts.segments_skipped) == (m, 0)
    late = Plan(default=LOW, overrides=((last, HIGH),))
    before = runner.counts
    _assert_same(runner.outputs(late), _full(model, stats, late, batches))
    done = runner.counts.minus(before)
    assert done.segments_skipped == seg_of[last] and done.cache_hits == 1
    assert done.segments_run == m - seg_of[last]
    assert done.sessions_reused == done.segments_run - 1  # only the changed one is new
    early = Plan(default=LOW, overrides=((first, HIGH),))
    before = runner.counts
    _assert_same(runner.outputs(early), _full(model, stats, early, batches))
    done = runner.counts.minus(before)
    assert (done.segments_run, done.segments_skipped, done.cache_hits) == (m, 0, 0)
    assert done.engine == f"ort (incremental, {m} of {m} segments run)"


def test_the_caches_stay_within_their_budgets_and_the_numbers_do_not_change(prepared):
    model, stats, batches = prepared
    tight = IncrementalRunner(model, stats, batches, scheme=SCHEME,
                              config=IncrementalConfig(cache_bytes=4000, session_bytes=0))
    roomy = IncrementalRunner(model, stats, batches, scheme=SCHEME)
    for plan in _plans(tight.groups.names(), seed=1, n=4):
        _assert_same(tight.outputs(plan), roomy.outputs(plan))
        assert tight.cached_bytes <= 4000
        assert not tight._sessions.items  # nothing kept between plans at budget 0
    assert roomy.cached_bytes > 4000 and roomy.counts.cache_hits > tight.counts.cache_hits


def test_a_model_without_a_cut_and_a_repaired_model_get_a_full_pass_and_a_note():
    model = load_proto(tm.helper_identity(), "one node")  # nowhere to cut
    batches = [tm.sample_inputs(model.proto)]
    stats = calibrate(model, find_groups(model), batches)
    engine = IncrementalEngine(model, batches)
    runner, why = engine.runner(model, stats, SCHEME)
    assert runner is None and "no cut" in why
    data = Dataset("tiny", calibration=tuple(batches), evaluation=tuple(batches))
    plans = {"low": Plan.uniform(LOW)}
    res = evaluate_plans(model, data, stats, plans, saturation=False, engine=engine)
    naive = evaluate_plans(model, data, stats, plans, saturation=False)
    assert res["low"]["engine"] == "ort (full pass)" and "engine" not in naive["low"]
    assert any("no cut" in n for n in res["low"]["notes"])
    assert res["low"]["metrics"] == naive["low"]["metrics"]
    other = load_proto(tm.helper_identity(), "one node (repaired)")
    assert engine.runner(other, stats, SCHEME)[0] is None
    assert engine.counts.full_passes == 3 and len(engine.notes) == 2


def test_evaluate_plans_with_the_engine_measures_what_the_full_pass_measures(prepared):
    model, stats, batches = prepared
    data = Dataset("tiny", calibration=tuple(batches), evaluation=tuple(batches))
    names = find_groups(model).names()
    plans = {f"p{i}": p for i, p in enumerate(_plans(names, seed=2, n=3))}
    engine = IncrementalEngine(model, batches)
    fast = evaluate_plans(model, data, stats, plans, saturation=False, engine=engine)
    slow = evaluate_plans(model, data, stats, plans, saturation=False)
    for k in plans:
        assert fast[k]["engine"].startswith("ort (incremental, ")
        assert set(fast[k]) - set(slow[k]) == {"engine"}
        for key, v in slow[k]["metrics"].items():
            assert fast[k]["metrics"][key] == pytest.approx(v, rel=1e-5, abs=1e-5), key
    assert engine.counts.plans == 3


def test_only_a_metric_the_task_cannot_score_alone_gets_every_metric(prepared):
    """Tensors (no task): ``only`` cannot be scored alone, so every metric is scored."""
    model, stats, batches = prepared
    data = Dataset("tiny", calibration=tuple(batches), evaluation=tuple(batches))
    plan = next(_plans(find_groups(model).names(), seed=4, n=1))
    full = evaluate_plans(model, data, stats, {"p": plan}, saturation=False)["p"]
    only = evaluate_plans(model, data, stats, {"p": plan}, saturation=False,
                          only="sqnr_db")["p"]
    assert only["metrics"] == full["metrics"] and len(full["metrics"]) > 1


@pytest.fixture(scope="module")
def planned(prepared):
    """``plan_model`` on the tiny encoder (gains rising with group order, max cost 1.2 on
    ort-cpu): the model, statistics, data, group names, target and the result."""
    from quantscope.stages import PlanOptions, plan_model
    from quantscope.targets import load_target

    model, stats, batches = prepared
    data = Dataset("tiny", calibration=tuple(batches), evaluation=tuple(batches))
    names = find_groups(model).names()
    sens = Sensitivity.from_gains("sqnr_db", 10.0, {g: {"a16_w16": 1.0 + i / 10}
                                                    for i, g in enumerate(names)})
    target = load_target("ort-cpu")
    out = plan_model(model, sens, target, PlanOptions(max_cost=1.2), data=data, stats=stats)
    return model, stats, data, names, target, out


def test_the_planner_measures_incrementally_and_records_the_engine(planned):
    from quantscope.stages import evaluate_plan, plan_evaluator

    model, stats, data, names, target, out = planned
    rec = out.work  # what the engine did: work, kept out of the plan file
    assert out.pareto["engine"].startswith("ort (incremental") and "incremental" not in out.pareto
    assert rec["engine"].startswith("ort (incremental, ") and rec["plans"] >= 2
    assert rec["segments_skipped"] > 0 and rec["cache_hits"] > 0
    score = plan_evaluator(model, data, stats, "sqnr_db", target=target)  # incremental now
    for plan in _plans(names, seed=3, n=3):
        plan = Plan(default=plan.default, overrides=plan.overrides, target=target.name)
        naive = evaluate_plan(model, data, stats, plan, saturation=False)["metrics"]["sqnr_db"]
        assert score(plan) == pytest.approx(naive, abs=1e-4)


def test_buckets_measures_the_candidates_of_one_model_with_one_engine(setup):  # noqa: F811
    """Two candidates share the tiny encoder: one engine runs both (its two segments:
    the token table, the pooling); the errors are the full passes' errors."""
    from test_route import _candidates

    from quantscope.emulate.evaluate import kept
    from quantscope.stages import buckets as B
    from quantscope.tasks.registry import text_embeddings

    tmp_path, model, data, *_ = setup
    cands, _ = B.read_candidates(_candidates(tmp_path))
    assert cands[0].model is cands[1].model
    sel = B.select_texts(model, data, cands, (8, 64), 3, 0)
    err = B.measure_errors(model, cands, sel)
    batches = tuple(sel.task.batches.batches)
    ref = text_embeddings(sel.task, kept(run_model(model.proto, batches), batches,
                                         sel.task.keep))
    for i, c in enumerate(cands):
        q = quantize_model(c.model, c.stats, c.plan, scheme=scheme_for(c.plan))
        emb = text_embeddings(sel.task, kept(run_model(q.proto, batches), batches,
                                             sel.task.keep))
        np.testing.assert_allclose(err.errors[i], 1.0 - np.sum(emb * ref, axis=1), atol=1e-6)
        assert err.engines[i] == "ort (incremental, 2 of 2 segments run)"
    # the candidates' engine caps its activation cache (their plans share few prefixes)
    engine, = B._engines(cands, batches).values()
    assert engine.config.cache_cap == B.CANDIDATES_CACHE_CAP


def test_an_engine_in_use_travels_to_another_process_without_its_sessions(prepared):
    """``plan --ray`` pickles the evaluator: the engine goes without its runner (ORT
    sessions cannot be pickled) and its copy measures the same."""
    import pickle

    model, stats, batches = prepared
    engine = IncrementalEngine(model, batches)
    plan = Plan.uniform(LOW)
    runner, _ = engine.runner(model, stats, SCHEME)
    first = runner.outputs(plan)
    copy = pickle.loads(pickle.dumps(engine))
    again, _ = copy.runner(copy.model, stats, SCHEME)  # the model: the copy's own
    assert again is not None and again is not runner
    _assert_same(again.outputs(plan), first)
    assert copy.counts.plans == 2


def test_the_chosen_plans_recorded_figure_is_a_fresh_measurement_in_the_named_metric(planned):
    """The search's measurements are in the data's headline metric, the analysis' gains in
    its own: the plan file names both, and the chosen plan's recorded figure equals a fresh
    measurement of the returned plan in the measured metric (before, the figure was
    labelled with the analysis' metric: 29.6 'sqnr_db' for a plan whose sqnr_db is 32.8)."""
    from quantscope.stages import plan_evaluator

    model, stats, data, names, target, out = planned
    measured = out.pareto["measured_metric"]
    assert out.pareto["metric"] == "sqnr_db" and measured != "sqnr_db"
    assert dict(out.plan.meta)["measured_metric"] == measured
    fresh = plan_evaluator(model, data, stats, measured, target=target)(out.plan)
    assert out.pareto["chosen"]["measured"] == pytest.approx(fresh, abs=1e-4)
