"""whatif: where a plan's error is, measured one op kind at a time."""

import dataclasses
import json
from html import unescape

import numpy as np
import onnx
import pytest
from test_repair_heads import SEQ, _encoder

from quantscope import stages
from quantscope.cli import main
from quantscope.model.load import load_proto
from quantscope.results import EvaluateResult, WhatifResult
from quantscope.tasks.headline import TENSOR_HEADLINE as M  # the tensor headline
from quantscope.types import Plan, Precision, QuantscopeError


@pytest.fixture
def setup(tmp_path):
    model = load_proto(_encoder())
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "x.npz", input_ids=rng.integers(100, 1000, (48, SEQ)).astype(np.int64),
             attention_mask=np.ones((48, SEQ), np.int64))
    data = stages.open_data(str(tmp_path / "x.npz"), model)
    stats = stages.calibrate_model(model, data)
    return model, data, stats


def test_each_kind_lifted_is_the_plan_with_those_groups_at_16_bit(setup):
    model, data, stats = setup
    plan = Plan(default=Precision.A8_W8, overrides=(("Add_27", Precision.A16_W16),))
    out = stages.whatif_families(model, data, stats, plan)
    assert out["metric"] == M
    kinds = {r["kind"]: r for r in out["kinds"]}
    assert {"weighted", "matmul", "softmax"} <= set(kinds)
    # the weighted row is exactly the plan with the 4 Linears at a16_w16
    linears = ("MatMul_1", "MatMul_3", "MatMul_5", "MatMul_26")
    assert kinds["weighted"]["groups"] == len(linears)
    measured = stages.evaluate_plan(model, data, stats, dataclasses.replace(
        plan, overrides=(*plan.overrides, *((n, Precision.A16_W16) for n in linears))),
        saturation=False)
    direct = measured["metrics"][M]
    # both results have a typed, tagged file form holding every key as the producer wrote it
    assert EvaluateResult.of(measured).to_dict() == {"format": EvaluateResult.FORMAT, **measured}
    assert list(WhatifResult.of(out).to_dict()) == ["format", *out]
    assert kinds["weighted"][M] == pytest.approx(direct)
    assert kinds["weighted"]["gain"] == pytest.approx(direct - out["plan"][M])
    # all kinds at once: the plan's 16-bit ceiling, far above the plan
    assert out["all"][M] > out["plan"][M] + 20
    assert out["all"]["groups"] == sum(r["groups"] for r in out["kinds"])
    text = stages.format_whatif(out)
    assert "weighted (4 groups) at a16_w16" in text and "gains are not additive" in text


def test_a_plan_with_nothing_below_16_bit_is_refused(setup):
    model, data, stats = setup
    with pytest.raises(QuantscopeError, match="nothing to lift"):
        stages.whatif_families(model, data, stats, Plan.uniform(Precision.A16_W16))


def test_cli_whatif(tmp_path, setup, capsys):
    model, _, _ = setup
    onnx.save(_encoder(), tmp_path / "enc.onnx")
    assert main(["calibrate", str(tmp_path / "enc.onnx"), "--data", str(tmp_path / "x.npz"),
                 "--out", str(tmp_path / "s.npz")]) == 0
    capsys.readouterr()
    base = ["whatif", str(tmp_path / "enc.onnx"), "--data", str(tmp_path / "x.npz"),
            "--stats", str(tmp_path / "s.npz"), "--precision", "a8_w8"]
    assert main([*base, "--json", str(tmp_path / "w.json"), "--goal", "40"]) == 0
    out = capsys.readouterr().out
    assert "where the plan's error is" in out and "softmax (1 groups) at a16_w16" in out
    assert "the goal was not placed: how far it is needs task data" in out  # said, not dropped
    assert json.loads((tmp_path / "w.json").read_text())["all"]["groups"] > 0
    assert main([*base, "--metric", "top1_agreement"]) == 2
    err = capsys.readouterr().err
    assert "is no figure of this data's task" in err and "Traceback" not in err


def test_run_with_whatif_says_it_in_the_verdict_and_the_report(tmp_path, setup, capsys):
    from quantscope.serde import read_json

    onnx.save(_encoder(), tmp_path / "enc.onnx")
    argv = ["run", str(tmp_path / "enc.onnx"), "--data", str(tmp_path / "x.npz"),
            "--target", "hailo10h", "--out", str(tmp_path / "W"), "--whatif"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "binds (measured, held out):" in out and "details: verdict.json" in out
    v = read_json(tmp_path / "W" / "verdict.json", "verdict")
    ev = read_json(tmp_path / "W" / "evaluate.json", "evaluate")
    w = ev["whatif"]
    assert v["whatif"]["all"] == pytest.approx(w["all"]["gain"])
    assert v["whatif"]["gains"] == {r["kind"]: pytest.approx(r["gain"]) for r in w["kinds"]}
    # the whatif's plan row is the run's own plan measured on the same held-out rows
    assert w["plan"][M] == pytest.approx(ev["results"]["plan"]["metrics"][M])
    html = (tmp_path / "W" / "report.html").read_text()
    assert 'id="whatif"' in html and "gained per op kind lifted to a16_w16" in html
    assert f"whatif ({M} gained by lifting one op kind to a16_w16" in html  # the details


def test_needed_scale_interpolates_in_log_scale():
    rows = [{"scale": 0.5, "m": 0.9}, {"scale": 0.25, "m": 0.98}]
    assert stages.needed_scale(rows, "m", 0.7, at_one=0.8) == 1.0  # met already
    assert stages.needed_scale(rows, "m", 0.9, at_one=0.8) == pytest.approx(0.5)
    assert stages.needed_scale(rows, "m", 0.94, at_one=0.8) == pytest.approx(0.5 ** 1.5)
    assert stages.needed_scale(rows, "m", 0.99, at_one=0.8) is None  # not even at 0.25


def _retrieval(tmp_path):
    from test_evaluate_streaming import _mixed_encoder, pairs_file

    model = _mixed_encoder()
    data = stages.open_data(str(pairs_file(tmp_path / "pairs.jsonl", 60)), model)
    return model, data, stages.calibrate_model(model, data)


def test_the_error_scaled_rows_are_the_plans_own_error_scaled(tmp_path):
    model, data, stats = _retrieval(tmp_path)
    plan = Plan.uniform(Precision.A8_W4)
    run = stages.evaluate_plans(model, data, stats, {"p": plan}, saturation=False,
                                error_scales=(1.0, 0.5, 0.0))["p"]
    one, half, zero = run["error_scales"]
    for k in ("top1_agreement", "embedding_cosine_mean", "recall@1"):
        assert one[k] == pytest.approx(run["metrics"][k])  # x1 is the plan itself
    assert zero["top1_agreement"] == 1.0 and zero["embedding_cosine_mean"] == pytest.approx(1.0)
    assert one["embedding_cosine_mean"] < half["embedding_cosine_mean"] < 1.0
    assert "error_scales" not in stages.evaluate_plans(model, data, stats, {"p": plan},
                                                       saturation=False)["p"]


def test_whatif_says_how_far_the_goal_is(tmp_path):
    model, data, stats = _retrieval(tmp_path)
    plan = Plan.uniform(Precision.A8_W4)
    out = stages.whatif_families(model, data, stats, plan, goal=0.999)
    h = out["headroom"]
    assert [r["scale"] for r in h["rows"]] == list(stages.ERROR_SCALES)
    cos = [out["plan"]["embedding_cosine_mean"], *(r["embedding_cosine_mean"] for r in h["rows"])]
    assert cos == sorted(cos)  # a smaller error: a higher cosine, row after row
    assert h["goal"] == 0.999
    need = stages.needed_scale(h["rows"], "top1_agreement", 0.999,
                               out["plan"]["top1_agreement"])
    assert h["needed"] == need
    assert h["sentence"] in stages.format_whatif(out)
    assert "how far the goal is" in stages.format_whatif(out)
    assert "goal" not in stages.whatif_families(model, data, stats, plan)["headroom"]


def test_run_with_whatif_and_a_goal_shows_the_headroom(tmp_path, capsys):
    from quantscope.serde import read_json

    model, _, _ = _retrieval(tmp_path)
    onnx.save(model.proto, tmp_path / "enc.onnx")
    argv = ["run", str(tmp_path / "enc.onnx"), "--data", str(tmp_path / "pairs.jsonl"),
            "--pairs", "30", "--target", "hailo10h", "--goal", "0.999", "--out",
            str(tmp_path / "W"), "--whatif", "--finetune", "off"]
    assert main(argv) == 0
    v = read_json(tmp_path / "W" / "verdict.json", "verdict")
    ev = read_json(tmp_path / "W" / "evaluate.json", "evaluate")
    h = ev["whatif"]["headroom"]
    assert v["whatif"]["headroom"] == h["sentence"] and v["whatif"]["error_needed"] == h["needed"]
    # the goal in the metric's unit, as whatif's console writes it (it read 0.999 here)
    assert "99.9 %" in h["sentence"] and "0.999" not in h["sentence"], h["sentence"]
    assert "details: verdict.json" in capsys.readouterr().out
    # the headroom rows come from the run's own evaluation of the plan
    assert ev["results"]["plan"]["error_scales"][0]["top1_agreement"] == \
        h["rows"][0]["top1_agreement"]
    html = (tmp_path / "W" / "report.html").read_text()
    assert "How far the goal is" in html and "against the scale of the plan" in html
    assert f"headroom: {h['sentence']}" in unescape(html)  # the verdict's details
