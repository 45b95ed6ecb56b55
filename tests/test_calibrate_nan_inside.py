"""NaN / inf inside the graph (not an output) during calibration: the observers leave them
out of the ranges, and nothing said so (a division by 0 in some samples gave a tensor a
finite range as if all were well). Now ``calibrate``, the analysis notes and ``run``'s
verdict name the tensor. Real ORT sessions, real files."""

from __future__ import annotations

import json

import numpy as np
import onnx
import tiny_models as tm

from quantscope.cli import main
from quantscope.serde import read_stats

# n = -relu(1 / a) is -inf where a = 0; exp(n) is 0 there, so the output stays finite
TEXT = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[N, 8] x) => (float[N, 4] y) {
    a = MatMul (x, w1)
    h = Div (one, a)
    r = Relu (h)
    n = Neg (r)
    e = Exp (n)
    y = MatMul (e, w2)
}
"""


def _files(tmp_path):
    r = np.random.default_rng(0)
    proto = tm._with_weights(TEXT, {"w1": r.normal(0, 1, (8, 8)).astype(np.float32),
                                    "w2": r.normal(0, 1, (8, 4)).astype(np.float32),
                                    "one": np.ones(1, np.float32)})
    x = r.normal(0, 1, (64, 8)).astype(np.float32)
    x[::8] = 0.0  # every 8th sample: a = 0, so n is -inf in its 8 values
    model, data = tmp_path / "nan.onnx", tmp_path / "nan.npz"
    onnx.save(proto, model)
    np.savez(data, x=x)
    return str(model), str(data)


def test_calibrate_names_the_tensor_and_the_stats_keep_the_count(tmp_path, capsys):
    model, data = _files(tmp_path)
    out = tmp_path / "s.npz"
    assert main(["calibrate", model, "--data", data, "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "warning: NaN or inf inside the graph" in said and "'n' (64 of 512 values)" in said
    stats = read_stats(out)
    assert stats.tensors["n"].nonfinite == 64 and np.isfinite(stats.tensors["n"].min)
    assert all(ts.nonfinite == 0 for t, ts in stats.tensors.items() if t != "n")


def test_run_says_it_in_the_analysis_and_the_verdict(tmp_path, capsys):
    model, data = _files(tmp_path)
    w = tmp_path / "W"
    assert main(["run", model, "--data", data, "--target", "hailo8", "--out", str(w)]) == 0
    said = capsys.readouterr().out
    assert "  warning: NaN or inf inside the graph" in said and "'n' (" in said
    verdict = json.loads((w / "verdict.json").read_text())
    assert len(verdict["nan_inf_inside"]) == 1 and "'n' (" in verdict["nan_inf_inside"][0]
    notes = json.loads((w / "analysis.json").read_text())["notes"]
    assert any(n.startswith("NaN or inf inside the graph") and "'n' (" in n for n in notes)
