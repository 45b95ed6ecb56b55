"""``quantscope whatif --goal`` on a detector: the headroom sentence writes the detection_f1
goal in percent (analyze takes the formatter from the CLI); the JSON keeps the goal 0-1."""

from __future__ import annotations

import json

import numpy as np
import onnx
from outside_models import feeds, mixed_scale_detector

from quantscope.cli import main


def test_whatif_goal_sentence_writes_a_share_in_percent(tmp_path, capsys) -> None:
    onnx.save(mixed_scale_detector(), tmp_path / "det.onnx")
    np.savez(tmp_path / "data.npz", **feeds("mixed_scale_detector"))
    common = [str(tmp_path / "det.onnx"), "--data", str(tmp_path / "data.npz")]
    assert main(["calibrate", *common, "--out", str(tmp_path / "s.npz")]) == 0
    assert main(["whatif", *common, "--stats", str(tmp_path / "s.npz"), "--precision",
                 "a8_w8", "--goal", "0.999", "--json", str(tmp_path / "w.json")]) == 0
    out = capsys.readouterr().out
    w = json.loads((tmp_path / "w.json").read_text())
    assert w["metric"] == "detection_f1" and w["headroom"]["goal"] == 0.999  # 0-1 kept
    sentence = w["headroom"]["sentence"]
    assert "detection_f1 99.9 %" in sentence and "0.999" not in sentence, sentence
    assert sentence in out
