"""analyze's console writes each metric in its unit through report.fmt (the one list of
share metrics): a share such as detection_f1 in percent, as the verdict and run show it."""

import json
import re

import numpy as np
import onnx
from outside_models import feeds, mixed_scale_detector

from quantscope.cli import main


def test_analyze_console_shows_share_metrics_in_percent(tmp_path, capsys):
    onnx.save(mixed_scale_detector(), tmp_path / "det.onnx")
    np.savez(tmp_path / "data.npz", **feeds("mixed_scale_detector"))
    assert main(["calibrate", str(tmp_path / "det.onnx"), "--data", str(tmp_path / "data.npz"),
                 "--out", str(tmp_path / "stats.npz")]) == 0
    capsys.readouterr()
    assert main(["analyze", str(tmp_path / "det.onnx"), "--data", str(tmp_path / "data.npz"),
                 "--stats", str(tmp_path / "stats.npz"), "--out",
                 str(tmp_path / "a.json")]) == 0
    out = capsys.readouterr().out
    a = json.loads((tmp_path / "a.json").read_text())
    assert a["primary"] == "detection_f1"
    f1 = a["baselines"]["a16_w16"]["detection_f1"]  # the file keeps the share as 0-1
    assert 0 < f1 <= 1
    line = next(s for s in out.splitlines() if s.strip().startswith("uniform a16_w16"))
    assert f"detection_f1 {100 * f1:.1f} %" in line, line
    assert re.search(r"sqnr_db \d+\.\d dB", line), line  # dB figures with their unit
