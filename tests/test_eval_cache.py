"""The evaluation cache (analyze/evalcache.py) and the time budget of the plan search
(plan/refine.py TimeBudget): a rerun reads back what was measured, a budget stops the
search and says so, a larger budget continues to the unbudgeted result."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import tiny_models as tm
from test_route import PAIRS, SHORT, _candidates, setup  # noqa: F401

from quantscope import stages
from quantscope.analyze.evalcache import EvalCache, evaluation_key, plan_digest
from quantscope.cli import main
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.plan.search import TimeBudget, search
from quantscope.serde import read_sensitivity
from quantscope.targets import load_target, parse_target
from quantscope.types import Plan, Precision, Sensitivity

A16W16 = Precision.A16_W16


# ---------------------------------------------------------------- the store


def test_entries_read_back_and_unreadable_ones_are_misses_with_a_note(tmp_path):
    cache = EvalCache(tmp_path / "evals")
    key = evaluation_key(model="m", plan="p")
    assert cache.get(key) is None and (cache.hits, cache.misses) == (0, 1)
    cache.put(key, 0.75, seconds=1.5, what={"metric": "top1"})
    again = EvalCache(tmp_path / "evals")
    assert again.get(key) == 0.75 and (again.hits, again.misses) == (1, 0)
    path = next((tmp_path / "evals").rglob(f"{key}.json"))
    assert json.loads(path.read_text())["seconds"] == 1.5
    assert not [p for p in (tmp_path / "evals").rglob("*") if p.name.endswith(".tmp")]
    for broken in (path.read_text()[:20], "{}", json.dumps({**json.loads(path.read_text()),
                                                            "key": "another"})):
        path.write_text(broken)  # partial, foreign, another key's entry
        fresh = EvalCache(tmp_path / "evals")
        assert fresh.get(key) is None and fresh.misses == 1
        assert len(fresh.notes) == 1 and "unreadable" in fresh.notes[0] and "ignored" in \
            fresh.notes[0]
    cache.put(key, 0.5, seconds=0.1, what={})  # measured again: rewritten whole
    assert EvalCache(tmp_path / "evals").get(key) == 0.5


def test_arrays_are_kept_beside_and_checked(tmp_path):
    cache = EvalCache(tmp_path)
    emb = np.arange(12, dtype=np.float32).reshape(3, 4)
    cache.put("ab" * 32, 3.0, seconds=0.0, what={"notes": ["n"]}, arrays={"embeddings": emb})
    hit = EvalCache(tmp_path).get_entry("ab" * 32)
    assert hit is not None and np.array_equal(hit.arrays["embeddings"], emb)
    assert hit.what["notes"] == ["n"]
    next(tmp_path.rglob("*.npz")).write_bytes(b"not an archive")
    torn = EvalCache(tmp_path)
    assert torn.get_entry("ab" * 32) is None and "unreadable" in torn.notes[0]


def test_plan_digest_ignores_reasons_and_descriptive_meta_only():
    base = Plan(default=Precision.A8_W8, overrides=(("g", A16W16),))
    described = Plan(default=Precision.A8_W8, overrides=(("g", A16W16),),
                     reasons=(("g", "why"),), meta=(("planner", "x"), ("measured", "0.7")))
    assert plan_digest(base) == plan_digest(described)
    repaired = Plan(default=Precision.A8_W8, overrides=(("g", A16W16),),
                    meta=(("repairs", "bias"),))
    other = Plan(default=Precision.A8_W8, overrides=(("h", A16W16),))
    assert len({plan_digest(base), plan_digest(repaired), plan_digest(other)}) == 3


# ---------------------------------------------------------------- the budget (pure search)


def _chain_search(**kw):
    model = load_proto(tm.layernorm_block())
    groups = find_groups(model)
    kinds = ("weighted", "matmul", "softmax", "normalization", "elementwise", "other")
    target = parse_target({
        "name": "toy", "vendor": "test", "sdk": "none",
        "precisions": {k: ["a8_w8", "a16_w8", "a16_w16"] for k in kinds}, "rules": [],
        "cost": {"basis": "test", "boundary_macs": 0.0,
                 "relative": {k: {"a8_w8": 1.0, "a16_w8": 2.0, "a16_w16": 3.0}
                              for k in kinds}}})
    gains = {g: {"a16_w8": 0.005 * (i + 1), "a16_w16": 0.01 * (i + 1)}
             for i, g in enumerate(groups.names())}
    sens = Sensitivity.from_gains("top1", 0.7, gains)
    return search(groups, sens, target, model, max_cost=2.5, **kw)


def _measured(memo, calls):
    """An evaluator with a memo (the cache's role): ``calls`` counts real measurements."""
    def evaluate(plan):
        key = plan_digest(plan)
        if key not in memo:
            calls.append(key)
            memo[key] = 0.7 + sum(0.01 * (len(n) % 4) * (p.act_bits or 0) / 16
                                  for n, p in plan.overrides)
        return memo[key]

    return evaluate


def test_a_budget_of_evaluations_stops_the_search_and_says_so():
    full_calls, budget_calls = [], []
    full = _chain_search(evaluate=_measured({}, full_calls))
    assert full.time_budget is None and "time_budget" not in full.to_dict()
    assert len(full_calls) > 2
    # the clock counts real measurements: a budget of 2 of them
    stopped = _chain_search(evaluate=_measured({}, budget_calls),
                            time_budget=TimeBudget(2, clock=lambda: len(budget_calls)))
    assert len(budget_calls) == 2 and len(stopped.trials) == 2
    tb = stopped.to_dict()["time_budget"]
    assert tb["bound"] and tb["measured"] == 2 and tb["candidates_left"] >= 1
    assert "larger --budget continues" in tb["note"] and tb["note"] in stopped.notes
    best = max(t.measured for t in stopped.trials)
    assert stopped.measured == best  # the best legal plan measured so far


def test_a_larger_budget_continues_to_the_unbudgeted_result():
    full_calls = []
    full = _chain_search(evaluate=_measured({}, full_calls))
    memo, calls = {}, []
    _chain_search(evaluate=_measured(memo, calls), time_budget=TimeBudget(
        2, clock=lambda: len(calls)))
    again = _chain_search(evaluate=_measured(memo, calls))  # no bound, same memo
    assert again.time_budget is None
    assert again.plan == full.plan and again.measured == full.measured
    assert len(calls) == len(full_calls)  # the 2 measured first were not measured again


def test_the_first_candidate_is_measured_even_with_no_time_left():
    calls = []
    r = _chain_search(evaluate=_measured({}, calls), time_budget=TimeBudget(
        1e-9, clock=lambda: 5.0 + len(calls)))
    assert len(calls) == 1 and r.measured is not None and r.time_budget is not None


def test_a_wall_clock_budget_charges_a_cached_figure_what_measuring_it_took():
    """A killed search resumed under the same --budget read its figures back in no time and
    so measured more than the clean run (a different plan). The evaluator says what each
    evaluation cost (``seconds``: as recorded when read from the cache), and the meter's
    wall-clock budget counts that: figures recorded at 100 s each stop a 150 s budget after
    two, as the clean run stopped, though reading them took no time."""
    memo: dict = {}

    def cached(plan):
        key = plan_digest(plan)
        memo.setdefault(key, 0.7 + 0.001 * len(plan.overrides))
        return memo[key]

    cached.seconds = 100.0  # every figure read back, recorded as 100 s of measuring
    budget = TimeBudget(150.0)  # the wall clock: time.monotonic
    r = _chain_search(evaluate=cached, time_budget=budget)
    assert r.time_budget is not None and len(r.trials) == 2
    assert r.to_dict()["time_budget"]["measured"] == 2
    plain = _chain_search(evaluate=lambda p: cached(p), time_budget=TimeBudget(150.0))
    assert plain.time_budget is None  # an evaluator that says nothing: its wall time only




@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plan")
    m, x = tmp / "m.onnx", tmp / "x.npy"
    onnx.save(tm.layernorm_block(), m)
    np.save(x, np.random.default_rng(0).normal(0, 1, (16, 6, 24)).astype(np.float32))
    s, a = tmp / "s.npz", tmp / "a.json"
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(s)]) == 0
    assert main(["analyze", str(m), "--data", str(x), "--stats", str(s), "--proxy", "1.0",
                 "--out", str(a)]) == 0
    return tmp, m, x, s, a


def _plan(planned, cache, *, x=None, budget=None, clock=None, model=None, repairs=()):
    tmp, m, x0, s, a = planned
    mod = stages.open_model(model or m)
    options = stages.PlanOptions(max_cost=2.0, metric="sqnr_db", budget=budget,
                                 repairs=repairs)
    return stages.plan_model(mod, read_sensitivity(a), load_target("ort-cpu"), options,
                             data=stages.open_data(x or x0, mod), stats=stages.read_stats(s),
                             cache=cache, clock=clock)


def test_the_cache_resumes_and_misses_on_another_plan_model_or_data(planned, tmp_path):
    tmp, m, x, s, a = planned
    first = EvalCache(tmp_path / "evals")
    out1 = _plan(planned, first)
    assert first.hits == 0 and first.misses > 1
    second = EvalCache(tmp_path / "evals")
    out2 = _plan(planned, second)
    assert (second.hits, second.misses) == (first.misses, 0)  # nothing measured again
    assert out2.plan == out1.plan and out2.pareto == out1.pareto
    assert out1.work["plans"] > 0 and out2.work["plans"] == 0  # the rerun measured nothing
    # other data (another sample order): every plan missed
    x2 = tmp_path / "x2.npy"
    np.save(x2, np.load(x)[::-1].copy())
    other_data = EvalCache(tmp_path / "evals")
    _plan(planned, other_data, x=x2)
    assert other_data.hits == 0 and other_data.misses > 0
    # the same graph under another path: hits; another weight: misses
    same = tmp_path / "copy.onnx"
    same.write_bytes(Path(m).read_bytes())
    moved = EvalCache(tmp_path / "evals")
    _plan(planned, moved, model=same)
    assert moved.misses == 0 and moved.hits == first.misses
    proto = onnx.load(m)
    w = proto.graph.initializer[0]
    arr = onnx.numpy_helper.to_array(w).copy()
    arr.flat[0] += 0.5
    w.CopyFrom(onnx.numpy_helper.from_array(arr, w.name))
    changed = tmp_path / "changed.onnx"
    onnx.save(proto, changed)
    other_model = EvalCache(tmp_path / "evals")
    _plan(planned, other_model, model=changed)
    assert other_model.hits == 0


def test_the_repair_offer_and_the_repaired_plans_are_read_back_too(planned, tmp_path):
    first = EvalCache(tmp_path / "evals")
    out1 = _plan(planned, first, repairs=("bias", "split"))
    assert first.misses > 3  # the offer (start plan, each repair alone) and the search
    kept = [json.loads(p.read_text())["what"] for p in (tmp_path / "evals").rglob("*.json")]
    assert len(kept) == first.misses and sum("metrics" in w for w in kept) >= 2  # offer's
    second = EvalCache(tmp_path / "evals")
    out2 = _plan(planned, second, repairs=("bias", "split"))
    assert (second.hits, second.misses) == (first.misses, 0)
    assert out2.plan == out1.plan and out2.offer == out1.offer


def test_plan_model_budget_stops_then_continues_from_the_cache(planned, tmp_path):
    full = _plan(planned, EvalCache(tmp_path / "full"))
    cache = EvalCache(tmp_path / "evals")
    bound = _plan(planned, cache, budget=1.0, clock=lambda: float(cache.misses))
    tb = bound.pareto["time_budget"]
    assert tb["bound"] and tb["measured"] == 1 and cache.misses == 1
    more = EvalCache(tmp_path / "evals")
    again = _plan(planned, more, budget=100.0, clock=lambda: float(more.misses))
    assert "time_budget" not in again.pareto and more.hits == 1
    assert again.plan == full.plan and again.pareto["chosen"] == full.pareto["chosen"]


def test_budget_bad_values_are_one_line(planned, tmp_path, capsys):
    tmp, m, x, s, a = planned
    for bad in ("30", "0s", "-1m", "fast", "1d", "nanm"):
        assert main(["run", str(m), "--data", str(x), "--target", "hailo10h", f"--budget={bad}",
                     "--out", str(tmp_path / "W")]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--budget" in err and "90s, 30m, 1h" in err
    assert not (tmp_path / "W").exists()


# ---------------------------------------------------------------- run: evals/ and --budget


def _run(m, x, out, *extra):
    return main(["run", str(m), "--data", str(x), "--target", "ort-cpu", "--max-cost", "2",
                 "--repairs", "none", "--out", str(out), *extra])


def _plan_timings(out):
    return json.loads((out / "run.json").read_text())["stages"]["plan"]["timings"]


@pytest.mark.slow  # six small runs: 15 s alone, 45 s on a loaded machine
def test_run_keeps_its_evaluations_and_continues_a_budgeted_search(planned, tmp_path, capsys):
    tmp, m, x, s, a = planned
    full, out = tmp_path / "full", tmp_path / "W"
    assert _run(m, x, full, "--budget", "none") == 0
    counts = _plan_timings(full)["evaluation_cache"]
    assert counts["hits"] == 0 and counts["misses"] > 2
    assert _run(m, x, full, "--budget", "none", "--force", "plan") == 0  # all read back
    assert "0 miss(es)" in capsys.readouterr().err
    assert _plan_timings(full)["evaluation_cache"] == {**counts, "hits": counts["misses"],
                                                       "misses": 0}
    # a budget spent after the first measurement: said in plan.json, the verdict, the output
    assert _run(m, x, out, "--budget", "0.001s") == 0
    text = capsys.readouterr().out
    tb = json.loads((out / "plan.json").read_text())["pareto"]["time_budget"]
    assert tb["bound"] and tb["measured"] == 1 and tb["candidates_left"] >= 1
    assert "seconds" not in tb  # the wall-clock figure is kept in run.json only
    assert json.loads((out / "verdict.json").read_text())["time_budget"] == tb
    assert "budget: the time budget" in text and "larger --budget continues" in text
    # the same or a smaller budget reuses the plan; a larger one continues from evals/
    assert _run(m, x, out, "--budget", "0.0005s") == 0
    assert "skipped (done): calibrate, analyze, plan," in capsys.readouterr().out
    assert _run(m, x, out, "--budget", "1h") == 0
    captured = capsys.readouterr()
    assert "stages run: plan," in captured.out and "continuing from the evaluation cache" \
        in captured.err
    assert _plan_timings(out)["evaluation_cache"]["hits"] == 1
    doc, ref = (json.loads((f / "plan.json").read_text()) for f in (out, full))
    assert "time_budget" not in doc["pareto"] and doc == ref  # the unbudgeted result


# ---------------------------------------------------------------- buckets --cache


def test_buckets_reads_its_candidates_back_from_the_cache(setup, tmp_path, capsys):  # noqa: F811
    folder = setup[0]
    args = ["buckets", str(folder / "tiny.onnx"), "--data", "stdlib-docs", "--pairs",
            str(PAIRS), "--skip-pairs", "10", "--candidates", str(_candidates(folder)),
            "--max-cost", "10", "--lengths", f"8,{SHORT},64", "--max-buckets", "2",
            "--cache", str(tmp_path / "evals")]
    assert main([*args, "--out", str(tmp_path / "d1.json"), "--json",
                 str(tmp_path / "c1.json")]) == 0
    first = capsys.readouterr().out
    n = len(json.loads((tmp_path / "c1.json").read_text())["candidates"])
    assert f"0 hit(s), {n} miss(es)" in first
    assert main([*args, "--out", str(tmp_path / "d2.json"), "--json",
                 str(tmp_path / "c2.json")]) == 0
    assert f"{n} hit(s), 0 miss(es)" in capsys.readouterr().out
    assert (tmp_path / "c1.json").read_text() == (tmp_path / "c2.json").read_text()


def test_a_killed_runs_temporary_cache_files_are_removed(tmp_path):
    from quantscope.pipeline import _remove_stale

    shard = tmp_path / "W" / "evals" / "ab"
    shard.mkdir(parents=True)
    (shard / ".abcd.json.x1.tmp").write_text("{")
    (shard / "abcd.json").write_text("{}")
    _remove_stale(tmp_path / "W")
    assert [p.name for p in shard.iterdir()] == ["abcd.json"]
