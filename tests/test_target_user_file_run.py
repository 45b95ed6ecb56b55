"""``run --target ./my.toml`` with a profile renamed from its template (name = "my_npu").

A plan names its target by ``name``; the stages of a run, the export and the io step
looked that name up among the built-ins only, so the run stopped at its first measurement
with "unknown target 'my_npu'". Now a profile file loaded in the process is known by its
name there, and ``export``/``io`` take ``--target`` for a plan made with such a file.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tiny_models import conv_sigmoid

from quantscope import targets
from quantscope.cli import main

HAILO8 = Path(__file__).parents[1] / "src/quantscope/targets/hailo8.toml"


def _conv(path: Path) -> None:
    conv_sigmoid(path, relu=False)


def test_run_export_and_io_with_a_renamed_profile_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(targets, "_USER_TARGETS", {}, raising=False)
    mine = tmp_path / "my.toml"
    mine.write_text(HAILO8.read_text().replace('name = "hailo8"', 'name = "my_npu"', 1))
    model, data, out = tmp_path / "m.onnx", tmp_path / "x.npy", tmp_path / "run"
    _conv(model)
    np.save(data, np.random.default_rng(6).normal(0, 1, (16, 3, 8, 8)).astype(np.float32))
    assert main(["run", str(model), "--target", str(mine), "--data", str(data),
                 "--out", str(out)]) == 0
    assert json.loads((out / "plan.json").read_text())["target"] == "my_npu"
    assert (out / "model.alls").is_file()
    # a later command, in a process that never loaded my.toml
    monkeypatch.setattr(targets, "_USER_TARGETS", {}, raising=False)
    capsys.readouterr()
    alls = tmp_path / "again.alls"
    export = ["export", "--model", str(model), "--stats", str(out / "stats.npz"),
              str(out / "plan.json"), "--format", "alls", "--out", str(alls)]
    assert main(export) == 2
    err = capsys.readouterr().err
    assert "unknown target 'my_npu'" in err and "--target" in err and not alls.exists()
    assert main([*export, "--target", str(mine)]) == 0 and alls.is_file()
    assert main(["io", str(model), "--stats", str(out / "stats.npz"), "--plan",
                 str(out / "plan.json"), "--target", str(mine)]) == 0
    assert main([*export, "--target", "hailo8"]) == 2
    assert "made for target 'my_npu', not 'hailo8'" in capsys.readouterr().err
