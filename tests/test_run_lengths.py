"""``quantscope run`` decides the compiled lengths (its ``deploy`` stage): buckets only where
the data has short texts and the cost depends on the length; candidates per length chosen
on the fit pairs and measured on the held-out pairs (what ``route`` measures); one model
kept when it is as good; the run folder's deployment, per-length files and a host router
that runs."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from call_log import recorded
from test_tasks_text import tiny_encoder

from quantscope import stages
from quantscope.cli import main
from quantscope.model.load import load_proto
from quantscope.pipeline.data import open_run_data
from quantscope.plan.buckets import route
from quantscope.plan.deployment import Bucket, Candidate, Deployment
from quantscope.report import summary
from quantscope.serde import read_json
from quantscope.stages import lengths as L
from quantscope.targets import load_target
from quantscope.types import Plan, Precision

PAIRS = 20


def _static(proto: onnx.ModelProto, n: int) -> onnx.ModelProto:
    """The same encoder with its sequence dim fixed at ``n`` (one compiled length)."""
    for i in proto.graph.input:
        dim = i.type.tensor_type.shape.dim[1]
        dim.ClearField("dim_param")
        dim.dim_value = n
    return proto


def test_buckets_only_with_short_texts_and_a_cost_that_depends_on_the_length():
    target = load_target("ort-cpu")
    model = load_proto(tiny_encoder(), "tiny")
    short = np.array([10, 20, 30, 200, 250] * 4)  # 60 % within 128
    long = np.array([200, 230, 250, 256, 129] * 4)  # none within 128
    yes = L.decide_lengths(model, target, short, longest=256)
    assert yes.buckets and yes.made_at == (64, 128, 256) and "0.25x" in yes.reason
    # the compiled lengths come from the fine grid (a text's error does not depend on its
    # padding), the candidates are made at the few
    assert yes.seq_lens == (16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256)
    assert "candidates made at 64, 128, 256" in yes.reason
    few = L.decide_lengths(model, target, long, longest=256)
    assert not few.buckets and "few short texts" in few.reason
    fixed = load_proto(_static(tiny_encoder(), 256), "fixed")
    same = L.decide_lengths(fixed, target, short, longest=256)
    assert not same.buckets and "does not depend on its length" in same.reason
    none = L.decide_lengths(model, target, None, longest=None)
    assert not none.buckets and "no token counts" in none.reason
    given = L.decide_lengths(model, target, short, longest=128, given=(32, 64, 512))
    assert given.buckets and given.seq_lens == given.made_at == (32, 64, 128)


def _tiny_run(tmp_path: Path):
    m = tmp_path / "tiny.onnx"
    onnx.save(tiny_encoder(inputs=("input_ids", "attention_mask")), m)
    out = tmp_path / "W"
    args = ["run", str(m), "--data", "stdlib-docs", "--pairs", str(PAIRS), "--target",
            "ort-cpu", "--max-cost", "1.5", "--out", str(out)]
    return tmp_path, m, out, args


@pytest.fixture()
def tiny_run(tmp_path: Path):
    return _tiny_run(tmp_path)


def _main_said(args: list[str]) -> tuple[int, str, str]:
    """``main(args)``: its exit code and what it printed to stdout and stderr (a
    module-scoped fixture has no capsys)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def chosen_run(tmp_path_factory):
    """``tiny_run``'s ``run`` once for the module (the deploy stage chooses lengths): read
    by the tests of its lengths and its router, which do not change the folder."""
    tmp_path, m, out, args = _tiny_run(tmp_path_factory.mktemp("chosen"))
    code, printed, err = _main_said(args)
    assert code == 0, err[-2000:]
    return tmp_path, m, out, args, printed, err


@pytest.fixture(scope="module")
def lengths_off_run(tmp_path_factory):
    """``tiny_run``'s ``run`` with ``--lengths off`` once for the module: read by the tests
    of ``--lengths off`` and of the length taken from the longest fit text."""
    tmp_path, m, out, args = _tiny_run(tmp_path_factory.mktemp("off"))
    code, printed, err = _main_said([*args, "--lengths", "off"])
    assert code == 0, err[-2000:]
    return tmp_path, m, out, args, printed, err


def test_run_chooses_lengths_route_measures_the_same_and_a_rerun_skips(chosen_run, tmp_path,
                                                                      capsys):
    _, m, out, args, printed, err = chosen_run
    doc = read_json(out / "lengths.json", "lengths")
    d = doc["deployment"]
    assert doc["buckets"] and not d["kept_one"] and d["models"] >= 2
    assert d["cost_mean"] <= 1.5 and d["held_out"]["legal"]
    margin = d["cost_margin"]  # chosen with a margin on the fit texts' mean cost
    assert margin["z"] == L.COST_Z and margin["fit_mean"] + L.COST_Z * margin["fit_se"] <= 1.5
    assert doc["candidates"][0] == "plan" and any("@" in c for c in doc["candidates"])
    for n in d["seq_lens"]:  # per compiled length: the compiler's model, stats, plan
        assert {p.name for p in (out / f"len-{n}").iterdir()} == {"model.onnx", "stats.npz",
                                                                   "plan.json"}
    # the deployment file is route's: measured again on the held-out pairs, the same figures
    js = tmp_path / "route.json"
    assert main(["route", str(m), "--data", str(out / "heldout.jsonl"), "--deployment",
                 str(out / "deployment.json"), "--json", str(js)]) == 0
    again = json.loads(js.read_text())
    assert again["metrics"] == d["held_out"]["metrics"]
    assert again["cost_mean"] == pytest.approx(d["cost_mean"])
    # the verdict: models, cost per query and per document, standard error, switching
    v = read_json(out / "verdict.json", "verdict")["deployment"]
    assert v["models"] == d["models"] and v["cost_per_query"] < v["cost_per_document"]
    line = next(x for x in printed.splitlines() if "per document" in x)
    assert "cost per query" in line and "standard error" in line and "not modelled" in line
    assert f"{d['models']} compiled models" in printed
    # the stage's memory estimate, said before its work and kept beside its peak: its
    # length candidates' evaluator with the capped activation cache
    dep = json.loads((out / "run.json").read_text())["stages"]["deploy"]
    said = [ln for ln in err.splitlines() if ln.startswith("[deploy] memory: ~")]
    assert len(said) == 1 and "the activation cache ~" in said[0], err[-2000:]
    assert dep["memory_estimate"].startswith(said[0][len("[deploy] memory: "):])
    assert dep["memory_estimate_mb"] > 0
    assert "Compiled lengths" in (out / "report.html").read_text()
    # the plan search, one candidate of the deploy stage's, measured for 5 min at most
    assert "plan: the search measures for at most 5 min of the 30 min --budget: the " \
        "deploy stage chooses compiled lengths" in err
    # ... offering no default repair (the deploy stage's candidates carry none), said in
    # the output, plan.json, verdict.json and the report
    assert "plan: no repair offered" in err
    scope = read_json(out / "verdict.json", "verdict")["plan_scope"]
    assert scope == json.loads((out / "plan.json").read_text())["scope"]
    assert any("no repair offered" in line for line in scope)
    assert "no repair offered" in (out / "report.html").read_text()
    # no Hailo script on ort-cpu: nothing measured as scripted; where a script leaves
    # decisions NOT SET (pipeline/deploy.py), the verdict reads them per file and the figure
    assert "as_scripted" not in doc and "as_scripted" not in v
    first = f"len-{d['seq_lens'][0]}/model.alls"
    sc = summary.deployment({**doc, "as_scripted": {"groups": {first: ["Gather_1", "x"]},
                                                    "metrics": {"top1_agreement": 0.5}}},
                            "top1_agreement")["as_scripted"]
    assert sc == {"files": {first: 2}, "decisions": 2, "value": 0.5}
    # the rerun on a copy (the folder is the module's: the router's test reads it too)
    again_out = tmp_path / "W"
    shutil.copytree(out, again_out)
    capsys.readouterr()
    assert main([*args[:-1], str(again_out)]) == 0
    assert "skipped (done): calibrate, analyze, plan, repair, check, evaluate, deploy, " \
           "export, io, report" in capsys.readouterr().out


def test_the_written_router_runs_and_routes_by_token_count(chosen_run):
    out = chosen_run[2]
    lens = tuple(read_json(out / "lengths.json", "lengths")["deployment"]["seq_lens"])
    counts = [1, lens[0], lens[0] + 1, lens[-1], lens[-1] + 40]
    script = (
        "import json, runpy, sys\n"
        "import onnxruntime as ort\n"
        "ns = runpy.run_path('io_snippet.py')\n"
        "out = []\n"
        f"for n in {counts!r}:\n"
        "    path, feeds = ns['route_text'](list(range(1, n + 1)))\n"
        "    s = ort.InferenceSession(path, providers=['CPUExecutionProvider'])\n"
        "    y = s.run(None, feeds)[0]\n"
        "    ids = feeds['input_ids'][0].tolist()\n"
        "    out.append([path, list(feeds['input_ids'].shape), int(feeds['attention_mask'].sum()),"
        " ids[-1] if n > feeds['input_ids'].shape[1] else ids[n - 1], list(y.shape)])\n"
        "print(json.dumps(out))\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=out, capture_output=True,
                          text=True, check=True)
    got = json.loads(done.stdout)
    which = route(np.asarray(counts), lens)  # the bucket route and the run measured with
    for n, k, (path, shape, kept, last, y) in zip(counts, which, got, strict=True):
        assert path == f"len-{lens[k]}/model.onnx" and shape == [1, lens[k]]
        assert kept == min(n, lens[k]) and last == n  # a longer text keeps its end token
        assert y[:2] == [1, lens[k]]


def test_one_model_is_kept_when_several_lengths_do_not_pay(tmp_path):
    model = load_proto(tiny_encoder(), "tiny")
    rd = open_run_data(model, "stdlib-docs", eval_data=None, pairs=PAIRS, tokenizer=None,
                       folder=tmp_path)
    stats = stages.calibrate_model(model, rd.fit, progress=False)
    lo = Candidate(name="a8", model=model, stats=stats,
                   plan=Plan(default=Precision.A8_W8, target="ort-cpu"))
    target = load_target("ort-cpu")
    # one plan: every length gives each text the same error, so buckets buy nothing
    got = L.deploy_lengths(model, rd.fit, rd.held_out, (lo,), target, "ort-cpu",
                           max_cost=1.0, seq_lens=(64, 128, 256))
    assert got.kept_one and got.deployment.seq_lens == (256,)
    assert got.to_dict()["models"] == 1 and got.cost_per_query == got.cost_per_document == 1.0
    hi = Candidate(name="a16", model=model, stats=stats,
                   plan=Plan(default=Precision.A16_W16, target="ort-cpu"))
    both = L.deploy_lengths(model, rd.fit, rd.held_out, (lo, hi), target, "ort-cpu",
                            max_cost=1.5, seq_lens=(64, 128, 256))
    assert not both.kept_one and len(both.deployment.buckets) >= 2


def test_lengths_off_keeps_one_model_and_bad_lengths_are_one_line(lengths_off_run, capsys):
    _, _, out, args, _, said = lengths_off_run
    doc = read_json(out / "lengths.json", "lengths")
    assert not doc["buckets"] and "--lengths off" in doc["reason"]
    assert not (out / "deployment.json").exists() and not list(out.glob("len-*"))
    assert read_json(out / "verdict.json", "verdict")["deployment"] is None
    # nothing measured: no estimate said or kept for the stage
    assert "[deploy] memory" not in said
    assert "memory_estimate" not in json.loads((out / "run.json").read_text())["stages"][
        "deploy"]
    assert "route_text" not in (out / "io_snippet.py").read_text()
    capsys.readouterr()
    assert main([*args, "--lengths", "0,64"]) == 2
    err = capsys.readouterr().err
    assert "--lengths" in err and len(err.strip().splitlines()) == 1


def test_several_lengths_must_beat_one_model_by_more_than_two_standard_errors():
    from quantscope.stages import buckets as B

    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 250, 200)
    sel = B.Selection(data=None, task=None, seq_lens=(64, 256), lengths=lengths, n_pairs=100,
                      skip_pairs=0)
    one = B.Allocation(picks=((1, 0),), legal={})
    many = B.Allocation(picks=((0, 1), (1, 0)), legal={})
    base = rng.uniform(0.01, 0.02, 200)
    for gain, noise, kept in ((0.0, 1e-4, True), (1e-5, 1e-3, True), (5e-3, 1e-4, False)):
        noisy = base - gain + rng.normal(0, noise, 200)  # candidate 1: better by ``gain``
        err = B.Errors(reference=None, errors=np.stack([base, noisy]), embeddings=(), notes=())
        keep, why = L._keep_one(sel, err, many, one)
        assert keep is kept and ("as good" in why) is kept


def test_without_seq_len_the_run_plans_checks_and_compiles_at_the_longest_fit_text(
        lengths_off_run, tmp_path, capsys):
    """Text data and no --seq-len: the run's length is the widest fit batch, said in one
    line and used by every stage as if given (before, the plan and the check saw symbolic
    dims: a size rule such as hailo.super_defuse could not be judged)."""
    from quantscope.pipeline.data import open_fit_data, widest_text_batch

    _, m, out, args, _, said = lengths_off_run
    fit = open_fit_data(stages.open_model(str(m)), "stdlib-docs", eval_data=None, pairs=PAIRS,
                        tokenizer=None)
    widest = widest_text_batch(fit)
    assert widest is not None and f"seq-len: {widest} tokens, the longest fit text" in said
    assert read_json(out / "check.json", "check")["seq_len"] == widest
    given = tmp_path / "G"
    assert main([*args[:-1], str(given), "--lengths", "off", "--seq-len", "16"]) == 0
    assert "the longest fit text" not in capsys.readouterr().err
    assert read_json(given / "check.json", "check")["seq_len"] == 16


def test_the_deployment_keeps_the_cost_cap_with_a_margin_on_the_fit_texts(tmp_path):
    """Without a margin the choice sits at the cap on the fit texts, and texts it has not
    seen may cost more; with it, the fit mean cost + COST_Z standard errors is within."""
    model = load_proto(tiny_encoder(), "tiny")
    rd = open_run_data(model, "stdlib-docs", eval_data=None, pairs=PAIRS, tokenizer=None,
                       folder=tmp_path)
    stats = stages.calibrate_model(model, rd.fit, progress=False)
    cands = tuple(Candidate(name=p.value, model=model, stats=stats,
                            plan=Plan(default=p, target="ort-cpu"))
                  for p in (Precision.A8_W8, Precision.A16_W16))
    target = load_target("ort-cpu")

    def deploy(z):
        return L.deploy_lengths(model, rd.fit, rd.held_out, cands, target, "ort-cpu",
                                max_cost=1.5, seq_lens=(64, 128, 256), cost_z=z)

    bare, kept = deploy(0.0), deploy(L.COST_Z)
    assert bare.margin.fit_mean <= 1.5 < bare.margin.fit_mean + L.COST_Z * bare.margin.fit_se
    m = kept.margin
    assert m.bound == m.fit_mean + L.COST_Z * m.fit_se <= 1.5 and m.budget < 1.5
    assert kept.to_dict()["cost_margin"]["bound"] == m.bound
    assert "+ 2 standard errors" in m.sentence and "budget lowered" in m.sentence


def test_no_deployment_within_the_margin_is_one_line():
    from quantscope.stages import buckets as B
    from quantscope.types import QuantscopeError

    alloc = B.Allocation(picks=((0, 0),), legal={})
    with pytest.raises(QuantscopeError, match="margin of 2 standard errors") as e:
        L.allocate_with_margin(lambda budget: alloc, lambda a: (1.4, 0.1), 1.5)
    assert "\n" not in str(e.value)
    got, margin = L.allocate_with_margin(lambda budget: alloc, lambda a: (1.2, 0.1), 1.5)
    assert got is alloc and margin.budget == 1.5 and margin.bound == pytest.approx(1.4)


def test_auto_does_not_fine_tune_a_plan_the_compiled_lengths_would_not_ship(tiny_run, capsys):
    """The deploy stage will choose compiled lengths (short texts, a cost that depends on
    the length), whose other candidates are not fine-tuned: ``--finetune auto`` skips the
    single plan's fine-tune even with the goal missed, says why in the record, and
    measures nothing for it (no fit figure: decided before any model is run)."""
    from quantscope.finetune.engine import torch_available
    from quantscope.pipeline import tune

    if not torch_available():  # found as the run finds it, not imported (a 7 s import)
        pytest.skip("torch is not installed: --finetune auto has no fine-tune to skip")

    tmp_path, m, out, args = tiny_run
    measured = []
    real = tune.FitMeasure.plan
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tune.FitMeasure, "plan", lambda *a, **k: measured.append(1) or real(*a, **k))
        assert main([*args, "--metric", "embedding_cosine_mean", "--goal", "1.0"]) == 0
    repaired = read_json(out / "repaired.plan.json", "plan")
    (rec,) = [r for r in repaired["repairs"] if r["name"] == "finetune"]
    assert not rec["tried"] and "the deploy stage chooses compiled lengths" in rec["why"]
    assert not measured and rec.get("fit_before") is None
    assert read_json(out / "lengths.json", "lengths")["buckets"]


def test_the_plan_search_gets_a_share_of_the_budget_only_where_lengths_are_chosen(
        monkeypatch):
    """``steps.plan_scope``: ``--budget`` as given, capped at LENGTHS_SEARCH_S only when
    the deploy stage chooses compiled lengths; ``none`` and a smaller budget stand."""
    from types import SimpleNamespace

    from quantscope.pipeline import steps, tune

    decided: list[str | None] = [None]
    monkeypatch.setattr(tune, "lengths_decided", lambda ctx: decided[0])

    def budget(b):
        scope = steps.plan_scope(SimpleNamespace(opts=SimpleNamespace(
            budget=b, repairs=(), repairs_given=False)))
        return scope.budget, " ".join(scope.lines) or None

    assert budget(1800.0) == (1800.0, None)
    decided[0] = "short texts"
    got, why = budget(1800.0)
    assert got == steps.LENGTHS_SEARCH_S and "(short texts)" in why
    assert budget(None) == (None, None) and budget(120.0) == (120.0, None)


def test_the_plan_offers_no_default_repair_where_lengths_are_chosen(monkeypatch):
    """``steps.plan_scope``: the default repairs are not offered where the deploy stage
    chooses compiled lengths (its candidates carry none), with a line that says so;
    ``--repairs`` given, or no lengths chosen, stands."""
    from types import SimpleNamespace

    from quantscope.pipeline import steps, tune

    decided: list[str | None] = [None]
    monkeypatch.setattr(tune, "lengths_decided", lambda ctx: decided[0])

    def scope(given):
        return steps.plan_scope(SimpleNamespace(opts=SimpleNamespace(
            budget=None, repairs=("bias", "ranges"), repairs_given=given)))

    assert scope(False) == steps.PlanScope(None, ("bias", "ranges"))
    decided[0] = "short texts"
    dropped = scope(False)
    assert dropped.repairs == () and dropped.budget is None
    (line,) = dropped.lines
    assert "no repair offered" in line and "bias, ranges not measured" in line
    assert scope(True) == steps.PlanScope(None, ("bias", "ranges"))


def test_the_deployment_is_measured_as_its_scripts_carry_it(tmp_path):
    """A compiled length whose Hailo script cannot name a group (the tiny encoder's Gather on
    a target that keeps it on the device) runs that group at the plan's default: the
    scripted deployment is the plan with that decision dropped, and measures as such."""
    model = load_proto(tiny_encoder(), "tiny")
    rd = open_run_data(model, "stdlib-docs", eval_data=None, pairs=PAIRS, tokenizer=None,
                       folder=tmp_path)
    stats = stages.calibrate_model(model, rd.fit, progress=False)
    a8 = Plan(default=Precision.A8_W8, target="ort-cpu")
    lifted = Plan(default=Precision.A8_W8, target="ort-cpu",
                  overrides=(("Gather_1", Precision.A16_W16), ("ReduceMean_2", Precision.A16_W16)))
    dep = Deployment(buckets=(Bucket(64, model, stats, lifted), Bucket(256, model, stats, a8)),
                     target="ort-cpu")
    scripted, lost = stages.scripted_deployment(dep)
    assert lost == {64: ("Gather_1",)}  # the ReduceMean is named (a Hailo guess): kept
    assert scripted.buckets[0].plan.precision_of("Gather_1") is Precision.A8_W8
    assert scripted.buckets[0].plan.precision_of("ReduceMean_2") is Precision.A16_W16
    assert scripted.buckets[1] == dep.buckets[1]
    by_hand = Deployment(buckets=(Bucket(64, model, stats, dataclasses.replace(
        lifted, overrides=(("ReduceMean_2", Precision.A16_W16),))), dep.buckets[1]),
        target="ort-cpu")
    from quantscope.stages.route import evaluate_deployment

    got, want = (evaluate_deployment(model, rd.held_out, d).metrics for d in (scripted, by_hand))
    assert got == want


def test_the_candidates_memory_is_given_back_before_the_held_out_measurement(
        tmp_path, monkeypatch):
    """h67: measure_errors releases after each candidate, which leaves the growth rule of
    ``release_memory`` under its threshold when it returns: the release meant to give the
    candidates' evaluators back did nothing, and the held-out measurement ran on top of
    them (minilm-l3, 100 pairs: 1,005 MiB resident after the candidates, 241 MiB once
    given back; the measurement's peak 1,131 -> 686 MiB). Both releases are made at a
    step's growth (32 MiB), not the rule's 256 MiB."""
    from quantscope.stages import buckets as B

    model = load_proto(tiny_encoder(), "tiny")
    rd = open_run_data(model, "stdlib-docs", eval_data=None, pairs=PAIRS, tokenizer=None,
                       folder=tmp_path)
    stats = stages.calibrate_model(model, rd.fit, progress=False)
    cands = tuple(Candidate(name=p.value, model=model, stats=stats,
                            plan=Plan(default=p, target="ort-cpu"))
                  for p in (Precision.A8_W8, Precision.A16_W16))
    events: list[str] = []

    monkeypatch.setattr(B, "measure_errors", recorded(events, "measure", B.measure_errors))
    monkeypatch.setattr(L, "routed_outputs", recorded(events, "held out", L.routed_outputs))
    from quantscope.emulate.release import RELEASE_GROWTH, STAGE_RELEASE_GROWTH

    # "force=True": a release at a step's growth (32 MiB), not the 256 MiB of the rule
    monkeypatch.setattr(L, "release_memory", lambda force=False, growth=RELEASE_GROWTH:
                        events.append(f"release force={force or growth == STAGE_RELEASE_GROWTH}"))
    L.deploy_lengths(model, rd.fit, rd.held_out, cands, load_target("ort-cpu"), "ort-cpu",
                     max_cost=1.5, seq_lens=(64, 128, 256))
    after = events[events.index("measure") + 1:events.index("held out")]
    assert after and all(e == "release force=True" for e in after), events
