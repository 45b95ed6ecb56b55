"""A plan meets only its own target (issue 32: a QNN plan exported to a Hailo .alls
silently; `check`/`lint` never compared the plan's target with --target)."""

from __future__ import annotations

import numpy as np
import onnx
import tiny_models as tm

from quantscope.cli import main
from quantscope.serde import write_plan
from quantscope.types import Plan, Precision


def _inputs(tmp_path):
    m, x, s = tmp_path / "m.onnx", tmp_path / "x.npy", tmp_path / "s.npz"
    onnx.save(tm.layernorm_block(), m)
    np.save(x, np.random.default_rng(0).normal(0, 1, (8, 6, 24)).astype(np.float32))
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(s)]) == 0
    return m, s


def _plan(tmp_path, target):
    p = tmp_path / f"{target}.plan.json"
    write_plan(p, Plan(default=Precision.A8_W8, target=target))
    return p


def _one_line(capsys, *words):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)


def test_a_qnn_plan_is_not_exported_as_a_hailo_script(tmp_path, capsys):
    m, s = _inputs(tmp_path)
    qnn = _plan(tmp_path, "qnn_htp_v73")
    out = tmp_path / "m.alls"
    capsys.readouterr()
    assert main(["export", str(qnn), "--model", str(m), "--stats", str(s), "--format", "alls",
                 "--out", str(out)]) != 0
    _one_line(capsys, "qnn_htp_v73", "Qualcomm", "Hailo", "--format qnn")
    assert not out.exists()
    assert main(["export", str(qnn), "--model", str(m), "--stats", str(s), "--format", "qnn",
                 "--out", str(tmp_path / "q.json")]) == 0  # its own vendor's file: fine


def test_check_and_lint_refuse_another_target(tmp_path, capsys):
    m, s = _inputs(tmp_path)
    hailo8 = _plan(tmp_path, "hailo8")
    capsys.readouterr()
    assert main(["check", str(hailo8), "--model", str(m), "--target", "hailo10h"]) != 0
    _one_line(capsys, "hailo8", "hailo10h")
    assert main(["check", str(hailo8), "--model", str(m), "--target", "hailo8"]) == 0
    alls = tmp_path / "m.alls"
    assert main(["export", str(hailo8), "--model", str(m), "--stats", str(s), "--format",
                 "alls", "--out", str(alls)]) == 0
    capsys.readouterr()
    assert main(["lint", str(alls), "--model", str(m), "--target", "hailo10h"]) != 0
    _one_line(capsys, "hailo8", "hailo10h", "m.alls")
    assert main(["lint", str(alls), "--model", str(m), "--target", "hailo8"]) == 0
    untagged = tmp_path / "u.alls"  # a hand-written script names no target: linted
    untagged.write_text("\n".join(alls.read_text().splitlines()[1:]) + "\n")
    assert main(["lint", str(untagged), "--model", str(m), "--target", "hailo10h"]) in (0, 1)
