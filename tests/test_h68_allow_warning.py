"""``--allow-warning RULE`` (h68): a warning rule of the target the user accepts blocks no
promotion; the plan records each accepted rule with its reason and the groups it lets
through; an error rule or an unknown id is refused in one line."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from test_plan_candidates import _pooled

from quantscope.cli import main
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.plan.accepted import accepted_of
from quantscope.plan.candidates import max_legal
from quantscope.plan.search import search
from quantscope.plan.start import blocks
from quantscope.serde import read_plan
from quantscope.targets import load_target
from quantscope.targets.accept import allowed_warnings
from quantscope.types import Precision, Problem, QuantscopeError, Sensitivity

RULE = "hailo.maxpool_16bit"  # a warning on hailo8l, on a 16-bit MaxPool
HAILO8L = load_target("hailo8l")


def _pool_group(groups) -> str:
    return next(g.name for g in groups.groups if g.op_type == "MaxPool")


def test_search_blocks_the_warned_pool_without_the_flag_and_promotes_it_with():
    model = load_proto(_pooled())
    groups = find_groups(model)
    pool = _pool_group(groups)
    sens = Sensitivity.from_gains("top1", 0.7, {pool: {"a16_w16": 0.1}})
    strict = search(groups, sens, HAILO8L, model)
    assert strict.plan.precision_of(pool) == Precision.A8_W8
    assert any(RULE in s.rules for s in strict.skipped)
    assert accepted_of(strict.plan) == []
    loose = search(groups, sens, HAILO8L, model, allowed_warnings=frozenset({RULE}))
    assert loose.plan.precision_of(pool) == Precision.A16_W16
    record = accepted_of(loose.plan)
    reason = next(r.reason for r in HAILO8L.rules if r.id == RULE)
    assert record == [{"rule": RULE, "reason": reason, "groups": 1, "group_names": [pool]}]


def test_max_legal_keeps_the_warned_pool_at_16_bit_when_accepted():
    model = load_proto(_pooled())
    pool = _pool_group(find_groups(model))
    strict = max_legal(model, HAILO8L, None)
    assert dict(strict.plan.overrides) == {pool: Precision.A8_W8}
    loose = max_legal(model, HAILO8L, None, allowed=frozenset({RULE}))
    assert loose.plan.overrides == () and loose.plan.default == Precision.A16_W16
    assert [(r["rule"], r["groups"]) for r in accepted_of(loose.plan)] == [(RULE, 1)]


def test_only_warning_rules_of_the_target_are_accepted():
    assert allowed_warnings(HAILO8L, ["all"]) == {
        r.id for r in HAILO8L.rules if r.severity == "warning"}
    assert allowed_warnings(HAILO8L, []) == frozenset()
    hailo10h = load_target("hailo10h")
    with pytest.raises(QuantscopeError, match="hailo.super_defuse is an error rule of "
                       "hailo10h.*warning rules: hailo.maxpool_16bit"):
        allowed_warnings(hailo10h, ["hailo.super_defuse"])
    with pytest.raises(QuantscopeError, match="hailo8l has no rule 'hailo.super_defuze'"
                       ".*hailo.super_defuse"):
        allowed_warnings(HAILO8L, ["hailo.super_defuze"])


def test_blocks_is_the_one_rule():
    warn = Problem(group="g", rule=RULE, reason="", provenance="", fix="", severity="warning")
    assert blocks(warn) and not blocks(warn, frozenset({RULE}))
    err = Problem(group="g", rule=RULE, reason="", provenance="", fix="")
    assert blocks(err, frozenset({RULE}))  # an error is never accepted


def test_cli_max_legal_check_and_alls_say_the_accepted_warning(tmp_path, capsys):
    path = tmp_path / "pooled.onnx"
    onnx.save(_pooled(), path)
    out = tmp_path / "p.json"
    assert main(["plan", str(path), "--target", "hailo8l", "--max-legal",
                 "--allow-warning", RULE, "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"accepted by --allow-warning: {RULE} lets 1 group(s) through" in said
    doc = json.loads(out.read_text())
    assert json.loads(doc["meta"]["accepted_warnings"])[0]["groups"] == 1
    # check: the warning is listed as accepted, not as passing and not as a bare warning
    assert main(["check", "--model", str(path), "--target", "hailo8l", str(out),
                 "--allow-warning", RULE]) == 0
    said = capsys.readouterr().out
    assert f"accepted by --allow-warning: [{RULE}]" in said
    assert "0 error(s), 1 warning(s), 1 accepted by --allow-warning" in said  # ops.unlisted
    assert main(["check", "--model", str(path), "--target", "hailo8l", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"warning: [{RULE}]" in said
    assert f"was made accepting {RULE} (--allow-warning): give --allow-warning {RULE}" in said
    # the compiler script notes it as a comment
    stats = tmp_path / "s.npz"
    data = tmp_path / "d.npz"
    np.savez(data, x=np.random.default_rng(1).normal(size=(4, 3, 8, 8)).astype(np.float32))
    assert main(["calibrate", str(path), "--data", str(data), "--out", str(stats)]) == 0
    alls = tmp_path / "m.alls"
    assert main(["export", "--model", str(path), "--stats", str(stats), str(out),
                 "--target", "hailo8l", "--format", "alls", "--out", str(alls)]) == 0
    lines = alls.read_text().splitlines()
    assert lines[0].startswith("# quantscope plan for hailo8l")
    assert lines[1].startswith(f"# accepted by --allow-warning: {RULE} lets 1 group(s)")
    assert read_plan(out).default == Precision.A16_W16


@pytest.mark.parametrize("rule, says", [
    ("hailo.super_defuze", "hailo8l has no rule 'hailo.super_defuze'"),
    ("ops.unlisted", "hailo8l has no rule 'ops.unlisted'"),
])
def test_cli_refuses_a_rule_the_target_cannot_accept(tmp_path, capsys, rule, says):
    path = tmp_path / "pooled.onnx"
    onnx.save(_pooled(), path)
    out = tmp_path / "p.json"
    assert main(["plan", str(path), "--target", "hailo8l", "--max-legal",
                 "--allow-warning", rule, "--out", str(out)]) != 0
    err = capsys.readouterr().err
    assert says in err and "hailo.maxpool_16bit" in err and "Traceback" not in err
    assert not out.exists()


def test_cli_refuses_an_error_rule(tmp_path, capsys):
    path = tmp_path / "pooled.onnx"
    onnx.save(_pooled(), path)
    out = tmp_path / "p.json"
    assert main(["plan", str(path), "--target", "hailo10h", "--max-legal",
                 "--allow-warning", "hailo.attention_16bit", "--out", str(out)]) != 0
    err = capsys.readouterr().err
    assert "hailo.attention_16bit is an error rule of hailo10h" in err
    assert "Traceback" not in err and not out.exists()


def test_run_reruns_the_plan_for_another_allowed_set_and_records_it(tmp_path, capsys):
    """``run``: the plan, check and deploy stage keys hold the allowed set; the verdict,
    check.json, the report and model.alls say what was accepted (accepted, not passing)."""
    m = _pooled()
    for v in (*m.graph.input, *m.graph.output):
        v.type.tensor_type.shape.dim[0].dim_param = "N"
    path, data, out = tmp_path / "pooled.onnx", tmp_path / "d.npz", tmp_path / "W"
    onnx.save(m, path)
    np.savez(data, x=np.random.default_rng(1).normal(size=(16, 3, 8, 8)).astype(np.float32))
    argv = ["run", str(path), "--data", str(data), "--target", "hailo8l", "--out", str(out),
            "--finetune", "off", "--repairs", "none"]
    assert main(argv) == 0
    capsys.readouterr()
    strict = json.loads((out / "verdict.json").read_text())
    assert strict["accepted_warnings"] == [] and strict["rules_accepted"] == []
    assert main([*argv, "--allow-warning", RULE]) == 0
    said = capsys.readouterr().out
    assert "stages run: plan, repair, check" in said and "skipped (done): calibrate, analyze" in said
    assert "8 of 9 rules pass, hailo.maxpool_16bit accepted by --allow-warning" in said
    assert f"accepted by --allow-warning: {RULE} lets 1 group(s) through" in said
    v = json.loads((out / "verdict.json").read_text())
    assert [(r["rule"], r["groups"]) for r in v["accepted_warnings"]] == [(RULE, 1)]
    rules = json.loads((out / "check.json").read_text())["rules"]
    mine = next(r for r in rules if r["rule"] == RULE)
    assert mine["accepted"] == "accepted by --allow-warning" and not mine["passed"]
    assert "accepted by --allow-warning (1 groups)" in (out / "report.html").read_text()
    assert f"# accepted by --allow-warning: {RULE}" in (out / "model.alls").read_text()
    # the same set again: nothing to redo
    assert main([*argv, "--allow-warning", RULE]) == 0
    assert "stages run: none" in capsys.readouterr().out
    # a typo: refused before any stage, the folder's files untouched
    before = (out / "verdict.json").read_text()
    assert main([*argv, "--allow-warning", "hailo.maxpool16"]) != 0
    err = capsys.readouterr().err
    assert "hailo8l has no rule 'hailo.maxpool16'" in err and "Traceback" not in err
    assert (out / "verdict.json").read_text() == before


def test_buckets_screens_a_pick_as_the_planner_does(monkeypatch):
    """``buckets``: a pick that carries a warning of the target's rules was legal (only
    errors blocked), a plan the planner never emits; now it blocks unless accepted, and
    the choice's notes say what the accepted rule lets through. The model's operator
    notes (``ops.unlisted``) depend on no plan and block nothing."""
    import dataclasses

    import quantscope.stages.buckets as B
    from quantscope.plan.check import check
    from quantscope.plan.deployment import Candidate
    from quantscope.plan.op_support import op_problems
    from quantscope.types import Plan

    def problems(model, plan, *, seq_len):  # the image model at any "length"
        found = op_problems(model, HAILO8L, None) + check(plan, find_groups(model), model,
                                                          HAILO8L)
        return [dataclasses.asdict(p) for p in found]

    monkeypatch.setattr(B, "plan_problems", problems)
    monkeypatch.setattr(B, "given_shapes", lambda model, n: None)
    model = load_proto(_pooled())
    a8 = Plan(default=Precision.A8_W8, target="hailo8l")
    a16 = Plan(default=Precision.A16_W16, target="hailo8l")  # the pool warned
    cands = (Candidate("a8", model, None, a8), Candidate("a16", model, None, a16))
    sel = B.Selection(data=None, task=None, seq_lens=(8,), lengths=np.array([4, 4]),
                      n_pairs=2, skip_pairs=0)
    err = B.Errors(reference=None, errors=np.array([[0.2, 0.2], [0.01, 0.01]]),
                   embeddings=(), notes=((), ()))
    costs = np.array([[1.0], [7.0]])
    kw = {"max_cost": 10.0, "max_buckets": 1, "target_name": "hailo8l"}
    strict = B.allocate(cands, sel, err, costs, **kw)
    assert strict.picks == ((0, 0),)  # the cheaper, worse a8 plan: a16 is not legal
    assert [p["rule"] for p in strict.legal[(1, 0)]] == [RULE]
    loose = B.allocate(cands, sel, err, costs, **kw, allowed=frozenset({RULE}))
    assert loose.picks == ((0, 1),) and not loose.legal[(1, 0)]
    notes = B.accepted_notes(cands, sel, loose, frozenset({RULE}))
    assert notes == (f"accepted by --allow-warning: {RULE} lets group(s) through: 1 in a16 "
                     "at 8",)


def test_cli_plan_search_promotes_the_pool_only_when_accepted(tmp_path, capsys):
    m = _pooled()
    for v in (*m.graph.input, *m.graph.output):
        v.type.tensor_type.shape.dim[0].dim_param = "N"
    path, data = tmp_path / "pooled.onnx", tmp_path / "d.npz"
    onnx.save(m, path)
    np.savez(data, x=np.random.default_rng(1).normal(size=(16, 3, 8, 8)).astype(np.float32))
    stats, analysis = tmp_path / "s.npz", tmp_path / "a.json"
    assert main(["calibrate", str(path), "--data", str(data), "--out", str(stats)]) == 0
    assert main(["analyze", str(path), "--data", str(data), "--stats", str(stats),
                 "--target", "hailo8l", "--out", str(analysis)]) == 0
    pool = _pool_group(find_groups(load_proto(m)))
    base = ["plan", str(path), "--analysis", str(analysis), "--target", "hailo8l"]
    capsys.readouterr()
    assert main([*base, "--out", str(tmp_path / "strict.json")]) == 0
    strict = read_plan(tmp_path / "strict.json")
    assert strict.precision_of(pool) == Precision.A8_W8 and accepted_of(strict) == []
    assert "accepted by" not in capsys.readouterr().out
    assert main([*base, "--allow-warning", "all", "--out", str(tmp_path / "loose.json")]) == 0
    said = capsys.readouterr().out
    loose = read_plan(tmp_path / "loose.json")
    assert loose.precision_of(pool) == Precision.A16_W16
    assert {r["rule"]: r["groups"] for r in accepted_of(loose)} == {
        "hailo.a16_low_sublayer_empty": 0, "hailo.attention_16bit": 0, RULE: 1,
        "hailo.super_defuse": 0}
    assert f"accepted by --allow-warning: {RULE} lets 1 group(s) through" in said


def test_rewrites_auto_measures_the_plan_the_accepted_warnings_let_through(tmp_path,
                                                                           monkeypatch):
    """``--rewrites auto`` judges each rewrite on the model's max-legal plan: with
    ``--allow-warning`` that plan is the one the accepted set lets through (the pool at 16
    bit), as the plan search's screen is, and the choice's key holds the set. Before, it
    measured the strict plan (the pool demoted) whatever the run accepted."""
    from quantscope import stages
    from quantscope.analyze import measure as measure_mod
    from quantscope.pipeline.auto import auto_key, max_legal_measure

    m = _pooled()
    for v in (*m.graph.input, *m.graph.output):
        v.type.tensor_type.shape.dim[0].dim_param = "N"
    model = load_proto(m)
    np.savez(tmp_path / "d.npz",
             x=np.random.default_rng(1).normal(size=(8, 3, 8, 8)).astype(np.float32))
    fit = stages.open_data(tmp_path / "d.npz", model, show=False)
    stats = stages.calibrate_model(model, fit)
    pool = _pool_group(find_groups(model))
    measured: list[Precision] = []
    real = measure_mod.evaluate_plans

    def recording(model, data, stats, plans, **kw):
        measured.extend(p.precision_of(pool) for p in plans.values())
        return real(model, data, stats, plans, **kw)

    monkeypatch.setattr(measure_mod, "evaluate_plans", recording)
    for allowed, want in ((frozenset(), Precision.A8_W8),
                          (frozenset({RULE}), Precision.A16_W16)):
        got = max_legal_measure(fit, HAILO8L, "sqnr_db", seq_len=None, allowed=allowed)(
            model, stats)
        assert np.isfinite(got.value)
        assert measured[-1] == want

    class Opts:
        model, data, eval_data, tokenizer, prefixes, pairs = str(tmp_path / "m.onnx"), \
            "d.npz", None, "tok.json", None, None
        seq_len, input_shapes, target, method, metric = None, (), "hailo8l", "minmax", None
        layout, batch_axes, repair_batches, allow_warnings = (), (), 4, ()
        calib_texts = None

    plain = auto_key(Opts, str)
    Opts.allow_warnings = (RULE,)
    assert "allow_warnings" not in plain  # the keys of runs without the flag stay valid
    assert auto_key(Opts, str) == {**plain, "allow_warnings": [RULE]}
