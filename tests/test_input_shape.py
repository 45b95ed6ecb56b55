"""--input-shape: symbolic dims other than the sequence made concrete for the rules."""

import json

import onnx
import pytest
import tiny_models as tm

from quantscope.cli import main


@pytest.fixture
def files(tmp_path):
    m, p = tmp_path / "m.onnx", tmp_path / "p.json"
    onnx.save(tm.layernorm_block(), m)  # input x: [N, S, 24], no token ids
    p.write_text(json.dumps({"format": "quantscope.plan/1", "default": "a16_w16",
                             "target": "hailo10h"}))
    return m, p


def test_symbolic_dims_are_reported_then_evaluated(files, capsys):
    m, p = files
    # hailo.super_defuse is an error rule on hailo10h: unevaluated, it fails the check
    assert main(["check", str(p), "--model", str(m), "--target", "hailo10h"]) == 1
    assert "could not evaluate: size unknown" in capsys.readouterr().out
    # 8192 x 24 = 196,608 values per frame > the super-defuse limit (98,304)
    assert main(["check", str(p), "--model", str(m), "--target", "hailo10h",
                 "--input-shape", "x=1x8192x24"]) == 1
    assert "hailo.super_defuse" in capsys.readouterr().out
    assert main(["check", str(p), "--model", str(m), "--target", "hailo10h",
                 "--input-shape", "x=1x64x24"]) == 0
    assert "could not evaluate" not in capsys.readouterr().out


@pytest.mark.parametrize("spec", ["y=1x64x24", "x=1x0x24", "x=1xSx24", "x"])
def test_bad_input_shapes_are_one_line_errors(files, spec, capsys):
    m, p = files
    assert main(["check", str(p), "--model", str(m), "--target", "hailo10h",
                 "--input-shape", spec]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
