"""The analysis -> plan -> check -> export chain through the CLI, on a tiny model."""

import dataclasses
import json

import numpy as np
import onnx
import pytest
import tiny_models as tm

from quantscope import stages
from quantscope.cli import main
from quantscope.serde import read_sensitivity
from quantscope.targets import load_target
from quantscope.types import QuantscopeError


def test_analyze_plan_check_export(tmp_path, capsys):
    m, x = tmp_path / "m.onnx", tmp_path / "x.npy"
    onnx.save(tm.layernorm_block(), m)
    np.save(x, np.random.default_rng(0).normal(0, 1, (32, 6, 24)).astype(np.float32))
    s, a, p = tmp_path / "s.npz", tmp_path / "a.json", tmp_path / "p.json"
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(s)]) == 0
    assert main(["analyze", str(m), "--data", str(x), "--stats", str(s), "--proxy", "1.0",
                 "--out", str(a)]) == 0
    analysis = json.loads(a.read_text())
    assert analysis["format"] == "quantscope.analysis/1"
    assert len(analysis["sensitivity"]) == 5
    assert main(["plan", str(m), "--analysis", str(a), "--target", "hailo10h",
                 "--max-cost", "3.0", "--out", str(p)]) == 0
    out = capsys.readouterr().out
    assert "chosen: cost" in out
    plan = json.loads(p.read_text())
    assert plan["target"] == "hailo10h" and plan["pareto"]["budget"]["max_cost"] == 3.0
    assert plan["pareto"]["chosen"]["cost"] <= 3.0
    # every plan the planner emits passes the legality check
    assert main(["check", str(p), "--model", str(m), "--target", "hailo10h"]) == 0
    capsys.readouterr()
    assert main(["export", str(p), "--model", str(m), "--stats", str(s), "--format", "qnn",
                 "--out", str(tmp_path / "enc.json")]) != 0  # a Hailo plan: no QNN file
    assert "'hailo10h' (Hailo)" in capsys.readouterr().err
    qnn = tmp_path / "qnn.json"
    assert main(["plan", str(m), "--analysis", str(a), "--target", "qnn-htp-v73",
                 "--max-cost", "3.0", "--out", str(qnn)]) == 0
    assert main(["export", str(qnn), "--model", str(m), "--stats", str(s), "--format", "qnn",
                 "--out", str(tmp_path / "enc.json")]) == 0
    doc = json.loads((tmp_path / "enc.json").read_text())
    assert doc["activation_encodings"]
    rep = tmp_path / "r.html"
    assert main(["report", "--out", str(rep), "--plan", str(p), "--analysis", str(a),
                 "--model", str(m), "--stats", str(s)]) == 0
    page = rep.read_text()
    assert "Per-layer diagnosis" in page and "Plan for hailo10h" in page
    assert "Feeding and reading the device" in page


def test_plan_rejects_analysis_of_another_model(tmp_path, capsys):
    m = tmp_path / "m.onnx"
    onnx.save(tm.conv_net(), m)
    a = tmp_path / "a.json"
    a.write_text(json.dumps({"format": "quantscope.analysis/1", "low": "a8_w8",
                             "high": "a16_w16", "offenders": [{"group": "nope", "score_db": 1}],
                             "baselines": {}}))
    code = main(["plan", str(m), "--analysis", str(a), "--target", "hailo10h",
                 "--out", str(tmp_path / "p.json")])
    err = capsys.readouterr().err
    assert code == 2 and "another model" in err and not (tmp_path / "p.json").exists()


def test_goal_verdict_names_the_binding_rule():
    from quantscope.stages import goal_verdict

    result = {"chosen": {"measured": 0.57},
              "blockers": [{"rule": "hailo.super_defuse", "groups": ["a", "b"], "gain": 4.2},
                           {"rule": "max_cost", "groups": ["c"], "gain": 2.0}]}
    v = goal_verdict(result, "top1_agreement", 0.97)
    assert not v["reached"] and v["binding"] == "hailo.super_defuse"
    assert "NOT reached" in v["verdict"] and "hailo.super_defuse" in v["verdict"]
    assert "quantscope tokensplit" in v["hint"]  # the way around that wall, unverified
    cap = goal_verdict({"chosen": {"measured": 0.5}, "blockers": result["blockers"][1:]},
                       "top1_agreement", 0.97)
    assert cap["binding"] == "max_cost" and "hint" not in cap
    att = goal_verdict({"chosen": {"measured": 0.5}, "blockers": [
        {"rule": "hailo.attention_16bit", "groups": ["s"], "gain": 3.0}]}, "top1_agreement", 0.97)
    assert "quantscope headsplit" in att["hint"]
    done = goal_verdict({"chosen": {"measured": 0.5}, "blockers": [
        {"rule": "hailo.attention_16bit", "groups": ["s"], "gain": 3.0}]}, "top1_agreement", 0.97,
        split=True)
    assert "hint" not in done  # the model is head-split already
    ok = goal_verdict({"chosen": {"measured": 0.98}, "blockers": []}, "top1_agreement", 0.97)
    assert ok["reached"] and ok["binding"] is None


def test_plan_with_repairs_then_repair_applies_the_plans_repairs(tmp_path, capsys):
    from test_repair_split import residual_block

    from quantscope.serde import read_plan

    m, x = tmp_path / "m.onnx", tmp_path / "x.npy"
    onnx.save(residual_block().proto, m)
    np.save(x, np.random.default_rng(0).normal(0, 1, (16, 3, 10, 10)).astype(np.float32))
    s, a, p = tmp_path / "s.npz", tmp_path / "a.json", tmp_path / "p.json"
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(s)]) == 0
    assert main(["analyze", str(m), "--data", str(x), "--stats", str(s), "--proxy", "1.0",
                 "--target", "ort-cpu", "--out", str(a)]) == 0
    capsys.readouterr()
    assert main(["plan", str(m), "--analysis", str(a), "--target", "ort-cpu", "--max-cost",
                 "1.3", "--data", str(x), "--stats", str(s), "--metric", "sqnr_db",
                 "--repairs", "smooth,split", "--out", str(p)]) == 0
    out = capsys.readouterr().out
    assert "repair split" in out and "repair smooth: changed nothing" in out
    doc = json.loads(p.read_text())
    rows = {r["name"]: r for r in doc["repair_offer"]["measured"]}
    assert rows["split"]["gain"] > 1.0  # dB of output SQNR, measured
    assert 0 < rows["split"]["cost"] <= 0.3  # it widens 8-channel layers: the cost model sees it
    assert dict(read_plan(p).meta)["repairs"] == "split"  # chosen, and the file reads back
    assert [r["name"] for r in doc["repairs"]] == ["split"]
    r = tmp_path / "r.onnx"
    assert main(["repair", str(m), "--data", str(x), "--stats", str(s), "--plan", str(p),
                 "--out-model", str(r), "--out-stats", str(tmp_path / "r.npz"),
                 "--out-plan", str(tmp_path / "rp.json")]) == 0
    capsys.readouterr()
    done = json.loads((tmp_path / "rp.json").read_text())["repairs"]
    assert [x["name"] for x in done] == ["split"]  # the plan's repairs only
    widened = onnx.load(r)
    assert {i.name for i in widened.graph.initializer} == {
        i.name for i in onnx.load(m).graph.initializer}


def test_plan_stage_writes_what_the_cli_writes(tmp_path, capsys):
    m, x = tmp_path / "m.onnx", tmp_path / "x.npy"
    onnx.save(tm.layernorm_block(), m)
    np.save(x, np.random.default_rng(0).normal(0, 1, (32, 6, 24)).astype(np.float32))
    s, a, p = tmp_path / "s.npz", tmp_path / "a.json", tmp_path / "p.json"
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(s)]) == 0
    assert main(["analyze", str(m), "--data", str(x), "--stats", str(s), "--proxy", "1.0",
                 "--out", str(a)]) == 0
    assert main(["plan", str(m), "--analysis", str(a), "--target", "hailo10h", "--max-cost",
                 "2.0", "--data", str(x), "--stats", str(s), "--metric", "sqnr_db",
                 "--goal", "60", "--out", str(p)]) == 0
    model, analysis = stages.open_model(m), read_sensitivity(a)
    options = stages.PlanOptions(max_cost=2.0, metric="sqnr_db", goal=60.0)
    data = stages.open_data(x, model)
    out = stages.plan_model(model, analysis, load_target("hailo10h"), options, data=data,
                            stats=stages.read_stats(s))
    assert out.pareto["goal"]["metric"] == "sqnr_db" and out.pareto["chosen"]["measured"]
    stages.write_plan(tmp_path / "p2.json", out.plan, out.file_extra())
    assert json.loads((tmp_path / "p2.json").read_text()) == json.loads(p.read_text())
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.plan = None
    with pytest.raises(QuantscopeError, match="--repairs needs --data and --stats"):
        stages.plan_model(model, analysis, load_target("hailo10h"),
                          stages.PlanOptions(repairs=("bias",)), data=data)
    with pytest.raises(QuantscopeError, match="--min-quality"):
        stages.PlanOptions(min_quality=20.0).check_inputs(data=True, stats=False)
