"""What the verdict and the report say of the newest tasks (points, an SSD's two heads, a
Sigmoid score), read as a user reads them.

* The report's configuration notes were one sorted set over fp32, a8_w8 and the plan:
  fp32's self-comparison (``distance to FP32's mean 0 ... 100.0 %``) stood beside the
  plan's (``mean 3.509 ... 73.4 %``) with nothing saying which is which, a8_w8's
  ``NOT LIKE FP32`` read as the plan's, and fp32's row note said "the plan quantizes
  nothing" on a plan that quantizes everything.
* The verdict's ``not_like_fp32`` kept the first NOT LIKE FP32 note alone: a hand-landmark
  model whose points moved (point agreement 73.4 % < 95 %) was said NOT LIKE FP32 for its
  flag output's fidelity only; the points were said nowhere in the verdict.
* A Sigmoid score FP32 decides one way on every sample got two warnings saying the same.
* An SSD's score head read by ``detect:scores_from=`` was called "scored for fidelity only"
  (with a --layout to declare for it), and the box output the task reads got "(fidelity
  only) held out" figures."""

from __future__ import annotations

import json

import numpy as np
import onnx
from test_h27_audio import _wake
from test_h29_landmarks import hand_landmarks
from test_h29_ssd_heads import _centres, ssd_two_heads

from quantscope.cli import main
from quantscope.report.run import config_notes

FAST = ["--target", "hailo8l", "--finetune", "off", "--repairs", "none", "--rewrites", "none"]


def test_config_notes_name_the_configurations_they_belong_to():
    res = {"fp32": {"notes": ["read as", "distance 0"]},
           "a8_w8": {"notes": ["read as", "distance 3", "NOT LIKE FP32: x"]},
           "plan": {"notes": ["read as", "distance 3"]}}
    assert config_notes(res) == ["read as", "fp32: distance 0", "a8_w8, plan: distance 3",
                                 "a8_w8: NOT LIKE FP32: x"]


def test_landmarks_lost_beside_a_flag_are_said_in_verdict_and_report(tmp_path, capsys):
    onnx.save(hand_landmarks(), tmp_path / "m.onnx")
    np.savez(tmp_path / "x.npz", input=np.random.default_rng(0).normal(0, 1, (32, 8)).astype(
        np.float32))
    assert main(["run", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "x.npz"),
                 "--layout", "landmarks=points:dims=3", *FAST, "--out",
                 str(tmp_path / "W")]) == 0
    out = capsys.readouterr().out
    v = json.loads((tmp_path / "W" / "verdict.json").read_text())
    plan = v["not_like_fp32"]["plan"]
    # the task's own loss first, then the flag's fidelity loss with its line
    assert plan.startswith("NOT LIKE FP32: output 'landmarks': 17 of 64 points move"), plan
    assert "; NOT LIKE FP32: output(s) 'flag' lose what FP32 computes" in plan
    assert f"  plan: {plan}" in out.splitlines()
    html = (tmp_path / "W" / "report.html").read_text()
    assert "a8_w8, plan: NOT LIKE FP32: output &#x27;landmarks&#x27;" in html
    assert "fp32: output &#x27;landmarks&#x27;: 4 points per sample; distance to FP32&#x27;s " \
           "mean 0, max 0" in html
    assert "fp32: this configuration quantizes nothing" in html
    assert "the plan quantizes nothing" not in html


def test_a_one_sided_score_is_said_little_once(tmp_path, capsys):
    model, _ = _wake(tmp_path)
    assert main(["run", model, "--data", str(tmp_path / "x.npz"), *FAST, "--out",
                 str(tmp_path / "W")]) == 0
    out = capsys.readouterr().out
    v = json.loads((tmp_path / "W" / "verdict.json").read_text())
    (line,) = v["says_little"]
    assert line.startswith("output 'score': FP32 decides the same on every sample at 0.5 "
                           "(its values ")
    assert sum("FP32 decides the same on every sample" in x for x in out.splitlines()) == 1
    html = (tmp_path / "W" / "report.html").read_text()  # the verdict's once, the notes' once
    assert html.count("FP32 decides the same on every sample") == 2


def test_an_ssd_score_head_read_by_scores_from_is_not_called_unscored(tmp_path, capsys):
    onnx.save(ssd_two_heads(), tmp_path / "m.onnx")
    np.savez(tmp_path / "x.npz", input=np.random.default_rng(0).random((24, 3, 8, 8),
                                                                        np.float32))
    np.save(tmp_path / "anchors.npy", _centres())
    layout = (f"regressors=detect:axis=2,scores_from=classificators,"
              f"anchors={tmp_path / 'anchors.npy'},threshold=0")
    assert main(["run", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "x.npz"),
                 "--layout", layout, *FAST, "--out", str(tmp_path / "W")]) == 0
    out = capsys.readouterr().out
    v = json.loads((tmp_path / "W" / "verdict.json").read_text())
    assert not any("declare --layout classificators=" in n for n in v["unscored"])
    assert v["unscored_figures"] == []  # both outputs are the task's
    # the key-point rows the task does not read are still said
    assert any("rows 4-5 not read (key points, ids: scored for fidelity only)" in n
               for n in v["unscored"])
    assert "(fidelity only) held out" not in out


def test_a_log_floor_is_no_outlier_channel_in_the_report():
    """analyze's log_floor finding (ratio: the data's max over half the 8-bit step) was a
    row of 'tensor(s) with outlier channels' under 'max/median', with no fix; it is a range
    finding of its own, with the fix."""
    from quantscope.report import run as report_run

    floor = {"tensor": "c", "group": "MatMul_1", "kind": "log_floor", "ratio": 510.0,
             "channels": [], "channel_axis": 1, "bits_lost": 8.99,
             "reason": "Log 'Log_3' reads 'c' on a linear grid",
             "remedies": ["compute the chain up to the Log in float on the host",
                          "16 bit is not enough (it keeps 4.8 decades)"]}
    page = report_run.outliers_section({"outliers": [floor]}, None)
    assert "outlier channels" not in page and "510" not in page
    assert "1 range(s) one linear grid cannot hold" in page
    assert ("<td>log of a linear grid</td>" in page
            and "compute the chain up to the Log in float on the host; 16 bit" in page)
    assert "No channel dominates any tensor" in page


def test_the_class_iou_advice_is_not_given_to_a_run_planning_by_it():
    """run --metric class_iou_min on a face map whose faces are lost: the verdict said
    '(--metric class_iou_min plans for the class)', the fix the user had given."""
    from quantscope.pipeline.verdict import _not_like

    note = ("NOT LIKE FP32: output 'prob': class 1: FP32 gives it on 32 positions, the "
            "quantized model on 0, both on 0 (IoU 0.000 < 0.9); the top-1 agreement 98.2 % "
            "is mostly the other classes' positions (--metric class_iou_min plans for the "
            "class)")
    results = {"plan": {"notes": [note]}}
    assert _not_like(results, "top1_agreement")["plan"] == note
    assert _not_like(results, "class_iou_min")["plan"] == note.removesuffix(
        " (--metric class_iou_min plans for the class)")


def test_data_made_from_images_gives_the_host_its_preprocessing(tmp_path, capsys):
    """A run on tensors 'quantscope images' made said how (x / 255, the resize) as a data
    note only; the verdict's host steps, which say what the host does around the compiled
    model, did not, and io_snippet.py's input quantization takes the preprocessed tensor."""
    from PIL import Image
    from test_images_command import conv_model

    model = conv_model(tmp_path / "m.onnx", ["N", 3, 8, 8])
    (tmp_path / "imgs").mkdir()
    rng = np.random.default_rng(1)
    for i in range(8):
        Image.fromarray(rng.integers(0, 256, (10 + i, 12, 3), dtype=np.uint8)).save(
            tmp_path / "imgs" / f"p{i}.png")
    assert main(["images", str(tmp_path / "imgs"), "--model", str(model), "--pixels",
                 "scale=255", "--out", str(tmp_path / "x.npz")]) == 0
    assert main(["run", str(model), "--data", str(tmp_path / "x.npz"), *FAST, "--out",
                 str(tmp_path / "W")]) == 0
    out = capsys.readouterr().out
    v = json.loads((tmp_path / "W" / "verdict.json").read_text())
    step = v["host_steps"][0]
    assert step.startswith("make each image the input as the measured data was made (x.npz: "
                           "made by 'quantscope images' from 8 image(s)") and "x / 255" in step
    assert f"  host: {step}" in out.splitlines()


def test_a_lower_is_better_metric_steers_the_search_its_way(tmp_path, capsys):
    """run --metric char_error_rate --goal 0.005 on a ctc recognizer: the analysis ranked
    by string_agreement (higher is better) and the search compared the measured error
    rates in that direction, so it chose uniform a8_w8 (2.2 % on the fit data) over a plan
    measuring 0 %, and the goal read 'NOT reached: ... no promotion left'."""
    from test_h28_ctc import _recognizer

    onnx.save(_recognizer(), tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.random.default_rng(1).normal(0, 1, (24, 12, 8)).astype(
        np.float32))
    assert main(["run", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "x.npy"),
                 "--layout", "probs=ctc", "--metric", "char_error_rate", "--goal", "0.005",
                 *FAST, "--out", str(tmp_path / "W")]) == 0
    capsys.readouterr()
    pareto = json.loads((tmp_path / "W" / "plan.json").read_text())["pareto"]
    assert pareto["metric"] == "char_error_rate" and pareto["higher_is_better"] is False
    measured = [t["measured"] for t in pareto["trials"]]
    assert max(measured) > 0.0  # uniform a8_w8 changes a string on the fit data
    assert pareto["chosen"]["measured"] == min(measured) and pareto["goal"]["reached"]


def test_a_point_error_goal_is_a_ceiling(tmp_path, capsys):
    """run --metric point_error_max --goal 2 read 'goal point error max >= 2 REACHED on
    the held-out data: 30.5': the new tasks' error figures were no known metric, so higher
    was better."""
    from quantscope.tasks.headline import describe_metric

    for key in ("point_error_max", "point_error_mean", "score_abs_error_max",
                "class_score_max_abs_error", "pixel_flip_share",
                # the map's and the image's errors, and any error a task adds later
                "map_abs_error_mean", "map_abs_error_max", "image_abs_error_mean",
                "image_abs_error_max", "box_center_error_px", "depth_mse:1"):
        assert describe_metric(key).higher_is_better is False, key
    assert describe_metric("image_psnr_db").higher_is_better is True
    onnx.save(hand_landmarks(), tmp_path / "m.onnx")
    np.savez(tmp_path / "x.npz", input=np.random.default_rng(0).normal(0, 1, (32, 8)).astype(
        np.float32))
    assert main(["run", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "x.npz"),
                 "--layout", "landmarks=points:dims=3", "--metric", "point_error_max",
                 "--goal", "2", *FAST, "--out", str(tmp_path / "W")]) == 0
    out = capsys.readouterr().out
    v = json.loads((tmp_path / "W" / "verdict.json").read_text())
    assert v["higher_is_better"] is False
    assert v["quality"]["plan"]["point_error_max"] > 2 and v["reached"] is False
    assert "goal point error max <= 2 NOT reached" in out


def test_the_pareto_legend_leaves_an_error_metric_s_best_corner_free():
    """run --metric char_error_rate: the front falls to the lower right, where the legend
    (always lower right) hid the chosen plan's star at 0 %."""
    from quantscope.report.plots import legend_corner

    assert legend_corner({"higher_is_better": True}) == "lower right"
    assert legend_corner({"higher_is_better": False}) == "upper right"
