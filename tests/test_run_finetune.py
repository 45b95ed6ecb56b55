"""``run --finetune auto|off|on``: the final plan fine-tuned where the goal is missed on the
fit data, kept only when it measures better there by more than the noise, recorded in
``repaired.plan.json`` (timings in ``run.json``), never retrained by a rerun."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import tiny_models as tm
from test_tasks_text import tiny_encoder

from quantscope.cli import main
from quantscope.pipeline import tune as T
from quantscope.pipeline.manifest import MANIFEST, file_digest
from quantscope.serde import read_plan


def _record(out) -> dict:
    doc = json.loads((out / "repaired.plan.json").read_text())
    entries = [r for r in doc["repairs"] if r["name"] == "finetune"]
    assert len(entries) == 1
    return entries[0]


@pytest.fixture()
def short(monkeypatch):
    """A fine-tune of a few steps (the run's own lasts what is left of --budget)."""
    torch = pytest.importorskip("torch")
    del torch
    from quantscope.finetune.distill import FinetuneConfig

    calls = []

    def config(seconds):
        calls.append(seconds)
        return FinetuneConfig(steps=30, eval_every=10, range_lr=2e-2, max_seconds=seconds)

    monkeypatch.setattr(T, "finetune_config", config)
    return calls


@pytest.fixture(scope="module")
def tensors(tmp_path_factory):
    d = tmp_path_factory.mktemp("ft")
    onnx.save(tm.layernorm_block(), d / "m.onnx")
    rng = np.random.default_rng(0)
    np.save(d / "x.npy", rng.normal(0, 1, (128, 6, 24)).astype(np.float32))
    return d


def _run(d, out, *extra):
    return main(["run", str(d / "m.onnx"), "--data", str(d / "x.npy"), "--target", "hailo10h",
                 "--repairs", "none", "--out", str(out), *extra])


def test_auto_finetunes_only_when_the_goal_is_missed_and_a_rerun_does_not_retrain(
        tensors, tmp_path, short, capsys):
    out = tmp_path / "W"
    # a cost cap: with none, "best quality" measures the widest legal plan (every layer at
    # 16 bit), which 30 steps cannot improve on this block
    assert _run(tensors, out, "--goal", "200", "--max-cost", "2") == 0  # 200 dB: missed
    rec = _record(out)
    assert rec["mode"] == "auto" and rec["tried"] and rec["engine"] == "cpu"
    assert rec["steps"] == 30 and rec["metric"] == "sqnr_db_channel_min"
    assert rec["fit_before"] is not None and rec["fit_after"] is not None
    assert short and short[0] is not None and 0 < short[0] <= 1800  # what the plan left
    assert "seconds" not in rec  # timings only in run.json
    timings = json.loads((out / MANIFEST).read_text())["stages"]["repair"]["timings"]
    assert timings["finetune_budget_s"] == pytest.approx(short[0], abs=0.1)
    assert any(k.startswith("/repairs/") for k in timings)  # its seconds
    # no per-query scores for a tensor metric: judged by the figure, and said so; 30
    # steps raise this block's worst-channel SQNR on the fit samples
    assert rec["kept"] and rec["fit_after"] > rec["fit_before"]
    assert "no noise interval" in rec["why"] and rec["skipped"] is None
    assert "FP32 weights differ" in rec["note"] and rec["fp32_drift"] > rec["fit_after"]
    plan = read_plan(out / "repaired.plan.json")  # the file reads back as a plan
    assert plan.pinned and dict(plan.meta)["repairs"] == "finetune"
    given = {i.name: i for i in onnx.load(tensors / "m.onnx").graph.initializer}
    tuned = {i.name: i for i in onnx.load(out / "repaired.onnx").graph.initializer}
    assert any(tuned[k].raw_data != given[k].raw_data for k in given if k in tuned)
    before = {p.name: file_digest(p) for p in out.iterdir() if p.is_file()
              and p.name not in (MANIFEST, ".run.lock")}
    capsys.readouterr()
    calls = len(short)
    assert _run(tensors, out, "--goal", "200", "--max-cost", "2") == 0  # nothing retrained
    assert "repair" in capsys.readouterr().out.split("skipped (done):")[1]
    assert len(short) == calls
    assert {p.name: file_digest(p) for p in out.iterdir() if p.is_file()
            and p.name not in (MANIFEST, ".run.lock")} == before

    met = tmp_path / "M"
    assert _run(tensors, met, "--goal", "10") == 0  # 10 dB: reached, no fine-tune
    rec = _record(met)
    assert not rec["tried"] and not rec["kept"] and "reaches" in rec["why"]
    assert rec["fit_before"] >= 10 and len(short) == calls
    assert not read_plan(met / "repaired.plan.json").pinned


def test_off_never_and_on_always(tensors, tmp_path, short):
    assert _run(tensors, tmp_path / "off", "--goal", "200", "--finetune", "off") == 0
    rec = _record(tmp_path / "off")
    assert not rec["tried"] and rec["skipped"] == "--finetune off" and not short
    assert _run(tensors, tmp_path / "on", "--goal", "10", "--finetune", "on") == 0
    assert _record(tmp_path / "on")["tried"] and len(short) == 1  # goal met: on tunes anyway
    assert _run(tensors, tmp_path / "nogoal", "--finetune", "on") == 0
    assert _record(tmp_path / "nogoal")["tried"]
    assert _run(tensors, tmp_path / "auto") == 0  # auto without a goal: nothing to miss
    assert "no --goal" in _record(tmp_path / "auto")["why"]


def test_a_finetune_that_cannot_help_is_dropped_with_its_reason(tmp_path, monkeypatch,
                                                                 capsys):
    pytest.importorskip("torch")
    from quantscope.finetune.distill import FinetuneConfig

    # learning rates of zero: the student cannot move, so it cannot measure better
    monkeypatch.setattr(T, "finetune_config", lambda seconds: FinetuneConfig(
        steps=4, eval_every=2, lr=0.0, range_lr=0.0, max_seconds=seconds))
    m = tmp_path / "tiny.onnx"
    onnx.save(tiny_encoder(), m)
    out = tmp_path / "W"
    assert main(["run", str(m), "--data", "stdlib-docs", "--pairs", "20", "--target",
                 "ort-cpu", "--goal", "1.0", "--finetune", "on", "--lengths", "off",
                 "--out", str(out)]) == 0
    rec = _record(out)
    assert rec["tried"] and not rec["kept"] and rec["metric"] == "top1_agreement"
    assert rec["fit_after"] == rec["fit_before"] and rec["difference"] == 0.0
    assert rec["samples"] == 20 and rec["lower_bound"] <= 0  # per query, paired
    assert "not above the noise" in rec["why"] and rec["skipped"] == rec["why"]
    assert "fine-tune dropped" in rec["note"]
    assert "finetune: dropped" in capsys.readouterr().err
    plan = read_plan(out / "repaired.plan.json")  # the plan without it
    assert not plan.pinned and "finetune" not in dict(plan.meta)
    assert file_digest(out / "repaired.onnx") != ""  # written, and the run went on
    assert (out / "verdict.json").is_file()


def test_without_torch_one_line_says_how_to_get_it(tensors, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(T, "torch_available", lambda: False)
    assert _run(tensors, tmp_path / "W", "--goal", "200") == 0
    rec = _record(tmp_path / "W")
    assert not rec["tried"] and "pip install 'quantscope[finetune]'" in rec["why"]
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "finetune" in ln]
    assert len(lines) == 1 and "not installed" in lines[0]


def test_bad_finetune_value_is_one_line(tensors, tmp_path, capsys):
    assert _run(tensors, tmp_path / "W", "--finetune", "maybe") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--finetune" in err[0] and not (tmp_path / "W").exists()


def test_the_record_round_trips():
    rec = T.TuneRecord("auto", True, True, "fit 90.0 % -> 95.0 %", metric="top1_agreement",
                       engine="cuda", steps=120, best_step=100, fit_before=0.9,
                       fit_after=0.95, fp32_drift=0.97, difference=0.05, lower_bound=0.01,
                       samples=100, seconds=12.5, note="fine-tuned")
    doc = rec.to_dict()
    assert doc["name"] == "finetune" and doc["skipped"] is None and doc["reason"] == "fine-tuned"
    assert T.TuneRecord.from_dict(json.loads(json.dumps(doc))) == rec
    dropped = T.TuneRecord("on", True, False, "not better")
    assert dropped.to_dict()["skipped"] == "not better"
    assert T.TuneRecord.from_dict(dropped.to_dict()) == dropped


def test_the_noise_decides_on_paired_per_query_scores():
    before = np.zeros(100)
    up = before.copy()
    up[:12] = 1.0  # 12 queries gained, none lost
    kept, why, f = T.decide(T.Figure(0.0, before), T.Figure(0.12, up), None,
                            metric="top1_agreement")
    assert kept and f["samples"] == 100 and f["lower_bound"] > 0 and "above the noise" in why
    few = before.copy()
    few[:3], few[3:5] = 1.0, -1.0  # +1 point net: within the noise of 100 queries
    kept, why, f = T.decide(T.Figure(0.5, before), T.Figure(0.51, few), None,
                            metric="top1_agreement")
    assert not kept and f["difference"] == pytest.approx(0.01) and f["lower_bound"] < 0
    assert "+1.0 points, not above the noise" in why
    # better, but its FP32 model measures below the quantized plan: no faithful fallback
    kept, why, _ = T.decide(T.Figure(0.0, before), T.Figure(0.12, up), 0.10,
                            metric="top1_agreement")
    assert not kept and "no faithful fallback" in why
    # no per-query scores: the figure alone, in the metric's direction
    assert T.decide(T.Figure(30.0), T.Figure(31.0), None, metric="sqnr_db")[0]
    assert not T.decide(T.Figure(30.0), T.Figure(30.0), None, metric="sqnr_db")[0]
    assert T.decide(T.Figure(2.0), T.Figure(1.5), None, metric="mse",
                    higher_is_better=False)[0]
    mean, low = T.paired_bound(np.zeros(50), np.ones(50))
    assert mean == 1.0 and low == 1.0  # no spread: the bound is the mean


def test_finetune_figures_are_in_the_units_the_verdict_shows():
    """Every share of the samples (detection F1 too, not only top-1 agreement) in percent,
    as report.fmt writes it in the verdict and the report; dB with its unit."""
    before, up = np.zeros(100), np.zeros(100)
    up[:12] = 1.0
    for metric in ("top1_agreement", "detection_f1", "recall@5"):
        why = T.decide(T.Figure(0.80, before), T.Figure(0.92, up), None, metric=metric)[1]
        assert why.startswith("fit 80.0 % -> 92.0 %"), (metric, why)
    why = T.decide(T.Figure(30.0), T.Figure(31.25), None, metric="sqnr_db_channel_min")[1]
    assert why.startswith("fit 30.0 dB -> 31.2 dB"), why


def test_budget_left_is_what_the_plan_stage_left(tmp_path):
    from quantscope.pipeline.context import Context, RunOptions
    from quantscope.pipeline.manifest import Manifest

    Manifest(tmp_path).record("plan", "k", [], 700.0)
    opts = RunOptions(model="m", data="d", target="hailo10h", out=str(tmp_path), budget=1800.0)
    assert T.budget_left(Context(opts, tmp_path)) == pytest.approx(1100.0)
    assert T.budget_left(Context(RunOptions(model="m", data="d", target="hailo10h",
                                            out=str(tmp_path), budget=600.0), tmp_path)) == 0.0
    assert T.budget_left(Context(RunOptions(model="m", data="d", target="hailo10h",
                                            out=str(tmp_path), budget=None), tmp_path)) is None
