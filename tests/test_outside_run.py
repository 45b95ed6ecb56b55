"""`run` on a mixed-scale detector: the verdict says what uniform a8_w8 loses, names the
Concat whose one grid spans two scales, and the plan lifts it (tensor headline, and the
detection task found from the graph); on an LSTM and a float-input attention, what
stays float and what the auto rewrites cannot check are said, not fatal."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tiny_models as tm
from outside_models import feeds, lstm_state, mixed_scale_detector

from quantscope.cli import main
from quantscope.serde import read_json


@pytest.fixture(scope="module")
def det(tmp_path_factory):
    d = tmp_path_factory.mktemp("det")
    onnx.save(mixed_scale_detector(), d / "det.onnx")
    np.savez(d / "det.npz", **feeds("mixed_scale_detector", 64))
    return d


def _run(det, out, *extra):
    return main(["run", str(det / "det.onnx"), "--data", str(det / "det.npz"), "--target",
                 "hailo8", "--repairs", "none", "--out", str(det / out), *extra])


def test_plain_tensors_the_verdict_names_the_lost_channels_and_the_concat(det, capsys):
    assert _run(det, "W", "--layout", "detections=tensor") == 0
    text = capsys.readouterr().out
    v = read_json(det / "W" / "verdict.json", "verdict")
    assert v["metric"] == "sqnr_db_channel_min"
    q = v["quality"]
    # the whole output looks fine at a8_w8; its worst channel is gone; the plan restores it
    assert q["a8_w8"]["sqnr_db"] > 40 and q["a8_w8"]["sqnr_db_channel_min"] < 1
    assert q["plan"]["sqnr_db_channel_min"] > 25
    assert "a8_w8" in v["not_like_fp32"] and "plan" not in v["not_like_fp32"]
    assert "channel" in v["not_like_fp32"]["a8_w8"]
    assert any("Concat" in line and "different scales" in line for line in v["mixed_scales"])
    assert "details: verdict.json" in text  # the console verdict is short; details below
    html = (det / "W" / "report.html").read_text()  # the report says it too
    assert "a8_w8: NOT LIKE FP32" in html and "mixed scales: detections" in html


def test_detected_head_the_run_judges_by_detections(det, capsys):
    assert _run(det, "D") == 0
    v = read_json(det / "D" / "verdict.json", "verdict")
    assert v["metric"] == "detection_f1"
    assert v["quality"]["a8_w8"]["detection_f1"] == 0.0
    assert v["quality"]["plan"]["detection_f1"] > 0.9
    captured = capsys.readouterr()
    assert "read as detections" in captured.err
    # F1's items are the detections, not the samples: the verdict says how many
    count = int(v["quality"]["plan"]["detection_f1_items"])
    assert count > 64
    assert (f"(n=32 held-out samples, {count} detections of either model (a matched pair "
            "once);") in captured.out


def test_metric_sets_what_the_analysis_ranks_by(det):
    assert _run(det, "M", "--layout", "detections=tensor", "--metric", "sqnr_db") == 0
    assert read_json(det / "M" / "analysis.json", "analysis")["primary"] == "sqnr_db"
    assert (det / "W").is_dir() or _run(det, "W", "--layout", "detections=tensor") == 0
    assert read_json(det / "W" / "analysis.json", "analysis")["primary"] == "sqnr_db_channel_min"


def test_the_verdict_says_what_stayed_float(tmp_path, capsys):
    """An LSTM's weights stay float in the emulation: the held-out figure does not include
    their error. The coverage said so in evaluate.json and the report only; the console
    verdict and verdict.json were silent."""
    onnx.save(lstm_state(), tmp_path / "lstm.onnx")
    np.savez(tmp_path / "lstm.npz", **feeds("lstm_state", 32))
    assert main(["run", str(tmp_path / "lstm.onnx"), "--data", str(tmp_path / "lstm.npz"),
                 "--target", "hailo8", "--repairs", "none", "--out", str(tmp_path / "W")]) == 0
    v = read_json(tmp_path / "W" / "verdict.json", "verdict")
    assert [(r["kind"], r["op_type"], r["count"]) for r in v["left_float"]] == [
        ("weight", "LSTM", 3)]
    assert "left float: 3 LSTM weights: LSTM weights are not quantized" in (
        capsys.readouterr().out)
    # every float input is on the grid, the LSTM's x too (read through an Unsqueeze)
    assert {r["tensor"] for r in v["io"] if r["role"] == "input"} == {"x", "h", "c"}


def test_auto_rewrites_on_a_float_sequence_model_get_the_data_size(tmp_path, capsys):
    """A float-input attention ``x [N, S, 16]`` (a torch TransformerEncoder's export) with no
    --input-shape: the auto rewrites' headsplit or rowscale trial stopped the whole run ("rowscale
    checks the function on ... float inputs of known shape"), before the run folder was
    made. The run now completes, and with the size taken from the data (every sample is
    6 x 16) the trial has its shape: rowscale is tried, not refused for want of one."""
    onnx.save(tm.attention(), tmp_path / "att.onnx")
    np.savez(tmp_path / "att.npz",
             x=np.random.default_rng(0).normal(0, 1, (32, 6, 16)).astype(np.float32))
    assert main(["run", str(tmp_path / "att.onnx"), "--data", str(tmp_path / "att.npz"),
                 "--target", "hailo10h", "--repairs", "none",
                 "--out", str(tmp_path / "W")]) == 0
    rows = read_json(tmp_path / "W" / "verdict.json", "verdict")["rewrites_auto"]["rows"]
    row = next(r for r in rows if r["rewrite"] == "rowscale")
    assert row["decision"] in ("kept", "dropped") and "--input-shape" not in row["why"]
    assert "input-shape: x=1x6x16, the size of every sample in the data" in capsys.readouterr().err
