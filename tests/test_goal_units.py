"""A goal is in its metric's unit, said and checked (issue 32: `run --goal 0.97` on tensor
data meant 0.97 dB, reported "goal REACHED" and picked a 7.4x plan)."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
import tiny_models as tm

from quantscope.cli import main
from quantscope.report import fmt
from quantscope.serde import read_json, read_plan
from quantscope.types import QuantscopeError


def _inputs(tmp_path):
    m, x = tmp_path / "m.onnx", tmp_path / "x.npy"
    onnx.save(tm.layernorm_block(), m)
    np.save(x, np.random.default_rng(0).normal(0, 1, (32, 6, 24)).astype(np.float32))
    return m, x


def _run(m, x, out, *extra):
    return ["run", str(m), "--data", str(x), "--target", "hailo10h", "--out", str(out), *extra]


def test_a_fraction_as_a_db_goal_is_refused_before_any_work(tmp_path, capsys):
    m, x = _inputs(tmp_path)
    out = tmp_path / "W"
    assert main(_run(m, x, out, "--goal", "0.97")) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "in dB" in err and "sqnr_db" in err and "--goal 30" in err
    assert not out.exists()  # nothing written, not even the run folder


def test_goal_ranges_follow_the_metric():
    from quantscope.tasks.headline import Headline, describe_metric, headline_of

    with pytest.raises(QuantscopeError, match="outside the range of top1_agreement"):
        describe_metric("top1_agreement").check_goal(1.5)
    describe_metric("top1_agreement").check_goal(0.97)
    describe_metric("score_agreement").check_goal(-0.2)  # a correlation: -1 to 1
    with pytest.raises(QuantscopeError, match="in dB"):
        headline_of(None).check_goal(2.0)
    headline_of(None).check_goal(30.0)
    h = Headline("similarity_mae", higher_is_better=False, goal_range=(0.0, 2.0))
    assert fmt.goal(h.metric, 0.1, h.higher_is_better) == "similarity mae <= 0.1"
    assert h.reached(0.05, 0.1) and not h.reached(0.2, 0.1) and not h.reached(math.nan, 0.1)
    assert fmt.goal("sqnr_db:1", 30) == "sqnr_db:1 >= 30.0 dB"


def test_uniform_a8_w8_at_the_goal_buys_no_cost(tmp_path, capsys):
    m, x = _inputs(tmp_path)
    out = tmp_path / "W"
    assert main(_run(m, x, out, "--goal", "20", "--repairs", "none")) == 0
    cap = capsys.readouterr()
    text = cap.out
    assert "goal: worst-channel SQNR >= 20.0 dB on the held-out data" in cap.err  # before the work
    plan = read_plan(out / "plan.json")
    assert plan.overrides == () and plan.default.value == "a8_w8"  # nothing promoted
    v = read_json(out / "verdict.json", "verdict")
    assert v["uniform_meets_goal"] and v["reached"] and v["cost"] == 1.0
    assert v["unit"] == "dB"
    assert "verdict: goal worst-channel SQNR >= 20.0 dB REACHED" in text
    assert "the plan is uniform a8_w8" in text
    pareto = read_json(out / "plan.json", "plan")["pareto"]
    assert "reached by uniform a8_w8" in pareto["goal"]["verdict"]


def test_plan_goal_is_checked_in_the_datas_unit(tmp_path, capsys):
    m, x = _inputs(tmp_path)
    stats, analysis = tmp_path / "s.npz", tmp_path / "a.json"
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(stats)]) == 0
    assert main(["analyze", str(m), "--data", str(x), "--stats", str(stats), "--out",
                 str(analysis)]) == 0
    capsys.readouterr()
    p = tmp_path / "p.json"
    assert main(["plan", str(m), "--analysis", str(analysis), "--target", "hailo10h",
                 "--data", str(x), "--stats", str(stats), "--goal", "0.9", "--out",
                 str(p)]) != 0
    err = capsys.readouterr().err
    assert "in dB" in err and not p.exists()


def test_one_item_is_said_in_the_singular():
    """'n=1 held-out samples' read as a typo beside every other figure."""
    from quantscope.units import counted, of

    assert of(1, "held-out samples") == "1 held-out sample"
    assert of(2, "held-out samples") == "2 held-out samples"
    assert of(1, "fit texts") == "1 fit text"
    assert counted("top1_agreement", {"top1_agreement": 1.0, "top1_agreement_items": 3,
                                      "top1_agreement_clusters": 1}).endswith("1 sample)")
