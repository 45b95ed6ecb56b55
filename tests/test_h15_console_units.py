"""Every console writes a metric in its unit through report.fmt (the one list of share
metrics), as the verdict does: shares (detection_f1 …) in percent, dB in dB, counts whole.
The JSON files keep shares as 0-1."""

import json
import re

import numpy as np
import onnx
import pytest
from outside_models import feeds, mixed_scale_detector

from quantscope.cli import main
from quantscope.plan.deployment_results import RouteVerdict
from quantscope.report import fmt
from quantscope.report.deployment import _metric_line, _verdict_line


@pytest.fixture
def det(tmp_path, capsys):
    onnx.save(mixed_scale_detector(), tmp_path / "det.onnx")
    np.savez(tmp_path / "data.npz", **feeds("mixed_scale_detector"))
    common = [str(tmp_path / "det.onnx"), "--data", str(tmp_path / "data.npz")]
    assert main(["calibrate", *common, "--out", str(tmp_path / "s.npz")]) == 0
    capsys.readouterr()
    return tmp_path, [*common, "--stats", str(tmp_path / "s.npz")]


def _line(out, key):
    return next(s for s in out.splitlines() if s.strip().startswith(key + " "))


def test_evaluate_console_shows_shares_in_percent(det, capsys):
    tmp_path, common = det
    assert main(["evaluate", *common, "--precision", "a16_w16", "--json",
                 str(tmp_path / "e.json")]) == 0
    out = capsys.readouterr().out
    m = json.loads((tmp_path / "e.json").read_text())["metrics"]
    assert 0 < m["detection_f1"] < 1  # the file keeps the share as 0-1
    f1 = f"{100 * m['detection_f1']:.1f}"
    # its items beside it (h25: the count is no row of its own)
    assert _line(out, "detection_f1").split() == [
        "detection_f1", f1, "%", f"(n={m['detection_f1_items']:.0f})"]
    assert "detection_f1_items" not in out
    assert _line(out, "detection_recall").endswith(
        f" % (n={m['detection_recall_items']:.0f})")
    assert re.fullmatch(r"sqnr_db +\d+\.\d dB", _line(out, "sqnr_db").strip())
    assert _line(out, "detections_fp32").split() == ["detections_fp32",
                                                     f"{m['detections_fp32']:.0f}"]
    assert _line(out, "box_iou_mean").split()[1] == fmt.value("box_iou_mean", m["box_iou_mean"])


def test_repair_console_shows_shares_in_percent(det, capsys):
    tmp_path, common = det
    assert main(["repair", *common, "--precision", "a16_w16", "--out-model",
                 str(tmp_path / "r.onnx"), "--out-stats", str(tmp_path / "r.npz"),
                 "--out-plan", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out
    f1 = _line(out, "detection_f1")
    assert re.fullmatch(r"detection_f1 +\d+\.\d % -> \d+\.\d %", f1.strip()), f1
    assert re.fullmatch(r"sqnr_db +\d+\.\d dB -> \d+\.\d dB", _line(out, "sqnr_db").strip())


def test_whatif_and_plan_consoles_show_shares_in_percent(det, capsys):
    tmp_path, common = det
    assert main(["whatif", *common, "--precision", "a8_w8", "--json",
                 str(tmp_path / "w.json")]) == 0
    out = capsys.readouterr().out
    w = json.loads((tmp_path / "w.json").read_text())
    assert w["metric"] == "detection_f1"
    row = next(s for s in out.splitlines() if s.strip().startswith("all "))
    assert (f"detection_f1 {fmt.value('detection_f1', w['all']['detection_f1'])} "
            f"({fmt.gain('detection_f1', w['all']['gain'])})") in row, row
    assert " %" in row and " pts)" in row
    assert main(["analyze", *common, "--out", str(tmp_path / "a.json")]) == 0
    assert main(["plan", *common, "--analysis", str(tmp_path / "a.json"), "--target", "ort-cpu",
                 "--out", str(tmp_path / "plan.json")]) == 0
    out = capsys.readouterr().out
    chosen = json.loads((tmp_path / "plan.json").read_text())["pareto"]["chosen"]
    assert 0 < chosen["measured"] < 1  # the file keeps 0-1
    line = next(s for s in out.splitlines() if s.startswith("metric detection_f1"))
    assert f"measured {100 * chosen['measured']:.1f} %" in line, line
    fronts = [s for s in out.splitlines() if s.strip().startswith("front:")]
    assert fronts and all(re.search(r"predicted \d+\.\d % +measured \d+\.\d %", s)
                          for s in fronts), fronts


def test_a_whole_count_reads_whole():
    assert fmt.value("detections_fp32", 12840.0) == "12840"  # .4g read 1.284e+04
    assert fmt.value("detections_fp32", np.int64(12840)) == "12840"
    assert fmt.value("cosine_mean", 0.99871) == "0.9987"


def test_route_lines_show_shares_in_percent():
    assert _metric_line({"top1_agreement": 0.9732, "embedding_cosine_mean": 0.99871}) == \
        "top1_agreement 97.3 %, embedding_cosine_mean 0.9987"
    v = RouteVerdict(legal=True, metric="top1_agreement", value=0.85, met=False, goal=0.9,
                     goal_met=False, short_by=0.05)
    line = _verdict_line(None, v)
    assert "top1_agreement 85.0 % short of (by 5.0 pts) the goal 90.0 %" in line, line


class _Stop(Exception):
    pass


def test_run_auto_line_says_a_verification_shares_pairs(tmp_path, capsys, monkeypatch):
    """``run --rewrites auto`` on face images: the decision agreement's noise is over its
    verification pairs, not the images, and the choosing line says both counts."""
    from types import SimpleNamespace

    import quantscope.pipeline.auto as auto
    import quantscope.pipeline.data as pdata
    from quantscope import stages
    from quantscope.tasks.faces import VerificationPairs
    from quantscope.tasks.registry import VerificationTask
    from quantscope.types import Dataset

    n = 7
    pairs = VerificationPairs(first=np.arange(n), second=np.arange(n) + n,
                              genuine=np.arange(n) % 2 == 0, distance=np.array(["near"] * n),
                              change=np.array(["orig"] * n))
    batch = feeds("mixed_scale_detector", n=4)
    fit = Dataset("faces", (batch,), (batch, batch), VerificationTask("faces", pairs, 0.6))
    monkeypatch.setattr(pdata, "open_fit_data", lambda *a, **k: fit)

    def stop(*a, **k):  # the line is said before any trial: stop there
        raise _Stop

    monkeypatch.setattr(auto, "choose_rewrites", stop)
    onnx.save(mixed_scale_detector(), tmp_path / "det.onnx")
    opts = SimpleNamespace(data="faces", eval_data=None, tokenizer=None, prefixes=None, calib_texts=None,
                           pairs=None, seq_len=None, input_shapes=(), target="ort-cpu",
                           method="minmax", metric=None, layout=(), batch_axes=(),
                           repair_batches=1, allow_warnings=())
    with pytest.raises(_Stop):
        auto.choose(opts, stages.open_model(tmp_path / "det.onnx"), progress=True)
    err = capsys.readouterr().err
    assert ("rewrites auto: choosing by decision_agreement on 8 fit samples "
            f"({n} verification pairs) (a tie: by sqnr_db)") in err, err


def test_verdict_ranking_line_shows_a_share_in_percent():
    from quantscope.report.summary import ranking_line

    v = {"metric": "top1_agreement", "ranking": {
        "line": "ranked by torch (cpu), measured by onnxruntime", "measured": 0.9733,
        "measured_by": "onnxruntime", "ranked": 0.98, "ranked_by": "torch (cpu)"}}
    assert ranking_line(v) == ("search: ranked by torch (cpu), measured by onnxruntime: chosen "
                               "plan 97.3 % in onnxruntime, 98.0 % ranked by torch (cpu) "
                               "(fit data)")


def test_report_sections_show_shares_in_percent(det, capsys):
    """The HTML report's analysis recovery, route table and verdict, and buckets choice
    write shares in percent as the verdict does (they wrote .4g / the raw float)."""
    from quantscope.report.build import analysis_section, choice_section, route_section

    tmp_path, common = det
    assert main(["analyze", *common, "--out", str(tmp_path / "a.json")]) == 0
    a = json.loads((tmp_path / "a.json").read_text())
    base = a["baselines"]["a16_w16"]
    a["recovery"] = [{"promoted": ["g"], "precision": "a16_w16", "metrics": base}]
    page = analysis_section(a)
    f1 = f"{100 * base['detection_f1']:.1f} %"
    assert f"detection_f1 {f1}" in page  # the recovery row
    # the baselines table; its count beside the share (h25: the count is no column)
    assert page.count(f"<td>{f1} (n={base['detection_f1_items']:.0f})</td>") >= 1
    assert "detection_f1_items" not in page
    assert re.search(r"<td>\d+\.\d dB</td>", page)

    bucket = {"seq_len": 64, "share": 1.0, "texts": 3, "cost_own": 1.2, "cost": 1.2,
              "legal": True, "problems": [], "model": "m"}
    route = {"target": "ort-cpu", "cost_mean": 1.2, "buckets": [bucket],
             "metrics": {"top1_agreement": 0.9732}, "longest_alone": {
                 "seq_len": 64, "cost": 1.2, "metrics": {"top1_agreement": 0.95}},
             "verdict": {"met": False, "legal": True, "metric": "top1_agreement",
                         "value": 0.9732, "goal": 0.99, "goal_met": False, "short_by": 0.0168}}
    page = route_section("r", route)
    assert "<td>97.3 %</td>" in page and "<td>95.0 %</td>" in page
    assert "value 97.3 %, goal 99.0 %, goal_met False, short_by 1.7 pts" in page
    choice = {"target": "ort-cpu", "texts": 3, "max_cost": 1.5, "max_buckets": 2,
              "cost_mean": 1.2, "cosine_mean": 0.999, "lengths": [32, 64],
              "selection_metrics": {"top1_agreement": 0.9732}, "buckets": [], "notes": [],
              "candidates": {"a8": {"cost_at_longest": 1.0, "cosine_mean": 0.99}}}
    assert "top1_agreement 97.3 %" in choice_section("c", choice)


def test_a_detectors_score_side_agreement_is_a_share() -> None:
    """``score_side_agreement`` (the share of anchors whose best class score falls on the
    same side of the threshold, tasks/detection.py) was missing from the share list, so
    every console, the verdict and the report printed it 0-1 (0.9883)."""
    from quantscope.report import fmt

    assert fmt.value("score_side_agreement", 0.9883) == "98.8 %"
    assert fmt.gain("score_side_agreement", -0.012) == "-1.2 pts"
