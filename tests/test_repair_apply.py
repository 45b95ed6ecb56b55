import json

import numpy as np
import onnx
import tiny_models as tm

from quantscope.cli import main
from quantscope.model.load import load_proto
from quantscope.serde import read_plan


def test_repair_command_writes_model_stats_and_plan(tmp_path, capsys):
    onnx.save(tm.conv_net(), tmp_path / "m.onnx")
    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.normal(0, 1, (32, 3, 16, 16)).astype(np.float32))
    args = ["--data", str(tmp_path / "x.npy")]
    assert main(["calibrate", str(tmp_path / "m.onnx"), *args, "--out", str(tmp_path / "s.npz")]) == 0
    code = main(["repair", str(tmp_path / "m.onnx"), *args, "--stats", str(tmp_path / "s.npz"),
                 "--precision", "a8_w8", "--out-model", str(tmp_path / "r.onnx"),
                 "--out-stats", str(tmp_path / "r.npz"), "--out-plan", str(tmp_path / "p.json")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "equalize " in out and "top1" not in out  # tensor data: fidelity only
    plan = read_plan(tmp_path / "p.json")
    assert plan.ranges, "range choice recorded per tensor"
    records = json.loads((tmp_path / "p.json").read_text())["repairs"]
    assert [r["name"] for r in records] == ["equalize", "smooth", "bias", "ranges"]  # CLI names
    load_proto(onnx.load(tmp_path / "r.onnx"))  # the repaired model is valid
    # the export carries the plan's ranges as pinned output ranges
    assert main(["export", str(tmp_path / "p.json"), "--model", str(tmp_path / "r.onnx"),
                 "--stats", str(tmp_path / "r.npz"), "--format", "alls",
                 "--out", str(tmp_path / "p.alls")]) == 0
    assert "force_range_out" in (tmp_path / "p.alls").read_text()
