"""When uniform low is illegal on the target, the planner makes a legal start itself."""

import json

import numpy as np
import onnx
import tiny_models as tm

from quantscope.cli import main


def test_illegal_uniform_start_is_raised_to_a_legal_one(tmp_path, capsys):
    m, x, s, a, p = (tmp_path / n for n in ("m.onnx", "x.npy", "s.npz", "a.json", "p.json"))
    onnx.save(tm.layernorm_block(), m)
    np.save(x, np.random.default_rng(0).normal(0, 1, (32, 6, 24)).astype(np.float32))
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(s)]) == 0
    assert main(["analyze", str(m), "--data", str(x), "--stats", str(s), "--out", str(a)]) == 0
    capsys.readouterr()
    # a8_w8 everywhere breaks qnn.linearclip_5d (3-D bias Adds) on HTP v73
    assert main(["plan", str(m), "--analysis", str(a), "--target", "qnn-htp-v73",
                 "--out", str(p)]) == 0
    out = capsys.readouterr().out
    assert "is not legal on qnn_htp_v73 (qnn.linearclip_5d)" in out
    plan = json.loads(p.read_text())
    assert any(prec == "float" for prec in plan.get("groups", {}).values())
    assert main(["check", str(p), "--model", str(m), "--target", "qnn-htp-v73"]) == 0
