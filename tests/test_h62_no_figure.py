"""A headline with no value (NaN) on the fit data, and the verdict's n of a gated share (h62).

- ``run --layout 'boxes=points:...,where=prob:1>0.999'`` where no FP32 face score passes on
  the fit half: every plan's figure was NaN, a NaN gain or figure compares as neither
  better nor worse, and the search bought 7.03x for nothing (``NOT reached: —``). FP32
  scored against itself has no value there either: refused in one line before the run
  folder exists (``run`` and ``plan --data``); a search that meets it anyway (the library)
  chooses the cheapest measured plan and says why.
- a single candidate measuring NaN among others with values (a plan whose outputs go
  non-finite) is ranked below them: ``min`` over a NaN key had kept whichever came first.
- the verdict said ``n=6 held-out samples`` when the gate judged fewer: it says how many.
"""

from __future__ import annotations

import json
import math

import numpy as np
import onnxruntime as ort
import pytest
import tiny_models
from evaluate_cli import saved_folder
from gate_fit_only_run import fit_only_run
from test_h60_points_photo_gate import _pnet_like
from test_search import _chain, _sens, _toy_target

from quantscope.analyze.figure_check import check_figure
from quantscope.cli import main
from quantscope.plan.search import search
from quantscope.report.summary import headline, sample_size
from quantscope.types import Precision

A16 = Precision.A16_W16
GATE = "boxes=points:scale=12,order=channels,where=prob:1>{}"


def _face_scores(model_path, x: np.ndarray) -> np.ndarray:
    """FP32's face channel per sample and position, ``[N, positions]``."""
    prob = ort.InferenceSession(str(model_path)).run(["prob"], {"input": x})[0]
    return prob[:, 1].reshape(len(x), -1)


@pytest.fixture(scope="module")
def pnet(tmp_path_factory):
    x = np.random.default_rng(3).uniform(-1, 1, (12, 3, 16, 16)).astype(np.float32)
    return saved_folder(tmp_path_factory.mktemp("pnet62"), "pnet", _pnet_like(), x)


def _run(d, name, out, layout, *extra):
    return main(["run", str(d / "pnet.onnx"), "--data", str(d / name), "--target", "hailo8",
                 "--out", str(d / out), "--layout", layout, *extra])


def test_run_refuses_a_gate_that_keeps_no_point_on_the_fit_data(pnet, capsys):
    """It bought 7.03x for a NaN figure (``NOT reached: —``); now one line, before any work."""
    assert _run(pnet, "pnet.npz", "refused", GATE.format(0.999), "--goal", "0.97") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("quantscope: error: point_agreement has no value on the fit part of "), err
    assert "not even FP32's against itself (output 'boxes': no point judged: where FP32's " \
           "'prob' channel 1 > 0.999 (where=prob:1>0.999) holds nowhere on the 6 samples" in err
    assert "a threshold below 0.999, or data where the score passes it, gives some" in err
    assert "the plan search cannot rank plans by it" in err and "--metric" in err
    assert not (pnet / "refused").exists()  # refused before the run folder exists


def test_plan_with_data_refuses_it_too(pnet, capsys):
    layout = GATE.format(0.999)
    d = pnet
    assert main(["calibrate", str(d / "pnet.onnx"), "--data", str(d / "pnet.npz"),
                 "--out", str(d / "s.npz")]) == 0
    assert main(["analyze", str(d / "pnet.onnx"), "--data", str(d / "pnet.npz"), "--layout",
                 layout, "--stats", str(d / "s.npz"), "--target", "hailo8",
                 "--out", str(d / "a.json")]) == 0
    capsys.readouterr()
    assert main(["plan", str(d / "pnet.onnx"), "--analysis", str(d / "a.json"), "--target",
                 "hailo8", "--data", str(d / "pnet.npz"), "--layout", layout, "--stats",
                 str(d / "s.npz"), "--out", str(d / "p.json")]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "point_agreement has no value on --data " in err, err
    assert not (d / "p.json").exists()
    # the check itself: a gate that keeps some point passes
    from quantscope import stages
    from quantscope.model.load import load
    from quantscope.tasks.layout_spec import parse_layout

    model = load(str(d / "pnet.onnx"))
    data = stages.open_data(str(d / "pnet.npz"), model, show=False,
                            layout=(parse_layout(GATE.format(0.6)),))
    check_figure(model, data, "point_agreement")


def _nan_sens(groups):
    return _sens({g: {"a16_w16": math.nan} for g in groups.names()}, base=math.nan)


def test_a_search_whose_every_figure_is_nan_buys_no_cost():
    """The library's search, met with NaN everywhere (predicted and measured): the cheapest
    measured plan, and the choice says why; it had promoted every group."""
    model, groups = _chain()
    r = search(groups, _nan_sens(groups), _toy_target(), model, evaluate=lambda p: math.nan)
    assert r.plan.overrides == () and r.cost == pytest.approx(1.0), r.plan.overrides
    line = r.to_dict()["choice"]["line"]
    assert line.startswith("no measured plan has a value of top1 (NaN: the data holds nothing "
                           "it counts"), line
    assert "the cheapest measured plan, 1.000x, no cost bought for a figure" in line
    assert any(n.startswith("the analysis' top1 of uniform a8_w8 has no value (NaN") and
               "the predictions rank nothing" in n for n in r.notes), r.notes


def test_one_plan_measuring_nan_among_figures_is_never_chosen():
    """The widest plan's outputs go non-finite (NaN), measured first: ``min`` kept it over
    every later figure; it now ranks last and the search goes on as before."""
    model, groups = _chain()
    gains = {g: {"a16_w16": 0.05} for g in groups.names()}
    everything = len(groups.names())

    def evaluate(plan):
        n = len(plan.overrides)
        return math.nan if n == everything else 0.7 + 0.05 * n

    r = search(groups, _sens(gains, reference=1.0), _toy_target(), model, evaluate=evaluate)
    nan = [t for t in r.trials if t.measured is not None and math.isnan(t.measured)]
    assert nan, [t.measured for t in r.trials]  # the NaN plan was measured
    assert r.measured is not None and not math.isnan(r.measured), r.measured
    assert len(r.plan.overrides) == everything - 1 and r.measured == pytest.approx(0.8)


def test_a_nan_start_with_figures_elsewhere_still_searches():
    """Uniform a8_w8's outputs go non-finite (no figure), the promoted plans have one: the
    search is not refused and chooses a plan with a figure."""
    model, groups = _setup_layernorm()
    gains = {g: {"a16_w8": 0.0, "a16_w16": 0.0} for g in groups.names()}

    def evaluate(plan):
        return math.nan if not plan.overrides else 0.5 + 0.1 * len(plan.overrides)

    r = search(groups, _sens(gains), _toy_target(), model, max_cost=3.0, evaluate=evaluate)
    assert r.plan.overrides and not math.isnan(r.measured), r.plan.overrides


def _setup_layernorm():
    from quantscope.model.groups import find_groups
    from quantscope.model.load import load_proto

    model = load_proto(tiny_models.layernorm_block())
    return model, find_groups(model)


# ---- the verdict's n: the samples a gated share judged ----------------------------------

def test_sample_size_says_how_many_held_out_samples_were_judged():
    v = {"metric": "point_agreement", "held_out": {"samples": 24, "unit": "samples"},
         "quality": {"plan": {"point_agreement": 1.0, "point_agreement_items": 22.0,
                              "point_agreement_clusters": 11.0}}, "legal": True}
    assert sample_size(v) == "n=11 of 24 held-out samples judged, an effective 22 points"
    assert headline(v)["judged"] == 11 and headline(v)["n"] == 24
    every = {**v, "quality": {"plan": {"point_agreement": 1.0, "point_agreement_items": 48.0,
                                       "point_agreement_clusters": 24.0}}}
    assert sample_size(every) == "n=24 held-out samples, an effective 48 points"
    assert "judged" not in headline(every)
    # a verification's decisions are pairs clustered by their first sample: 11 anchors of
    # 12 samples are every sample judged, not "11 of 12" (read so before the fix)
    pairs = {"metric": "decision_agreement", "held_out": {"samples": 12, "unit": "samples"},
             "quality": {"plan": {"decision_agreement": 0.985,
                                  "decision_agreement_items": 66.0,
                                  "decision_agreement_clusters": 11.0}}, "legal": True}
    assert sample_size(pairs).startswith("n=12 held-out samples")
    assert "judged" not in headline(pairs)


def _ordered(pnet, name: str) -> tuple[np.ndarray, np.ndarray]:
    """The fixture's samples, those with the highest face score first (the first half
    fits), written as ``name``; each sample's highest face score."""
    x = np.load(pnet / "pnet.npz")["input"]
    top = _face_scores(pnet / "pnet.onnx", x).max(axis=1)
    order = np.argsort(-top, kind="stable")
    np.savez(pnet / name, input=x[order])
    return top[order][:6], top[order][6:]


def test_the_verdict_says_how_many_held_out_samples_the_gate_judged(pnet, capsys):
    fit, held = _ordered(pnet, "some.npz")
    t = float((np.sort(held)[2] + np.sort(held)[3]) / 2)  # 3 of the 6 held-out pass
    assert fit.max() > t
    out = pnet / "some"
    assert _run(pnet, "some.npz", "some", GATE.format(f"{t:.6f}")) == 0
    text = capsys.readouterr().out
    v = json.loads((out / "verdict.json").read_text())
    assert v["headline"]["judged"] == 3 and v["headline"]["n"] == 6, v["headline"]
    head = next(line for line in text.splitlines() if line.startswith("verdict:"))
    assert "(n=3 of 6 held-out samples judged, an effective " in head, head


def test_a_gate_that_keeps_no_held_out_point_is_said_on_the_verdict(tmp_path_factory):
    """The fit half has faces, the held-out half none: the search ranks by the fit half's
    figure, and the verdict says no held-out point was judged (h60's test, now with data
    whose fit half has a figure). The run (``pnet``'s samples ordered as ``_ordered``
    orders them, gated between the two halves' highest scores, ``--goal 0.97``) is the one
    test_h65_output_says.py reads too: made once (gate_fit_only_run)."""
    out, text = fit_only_run(tmp_path_factory)
    v = json.loads((out / "verdict.json").read_text())
    assert len(v["gated"]) == 1 and "output 'boxes': no point judged: where FP32's 'prob' " \
        "channel 1 > " in v["gated"][0] and "holds nowhere" in v["gated"][0], v["gated"]
    assert f"  judged (plan, held out): {v['gated'][0]}" in text.splitlines(), text
    plan = json.loads((out / "plan.json").read_text())
    assert not math.isnan(plan["pareto"]["chosen"]["measured"] or math.nan)  # ranked on fit
