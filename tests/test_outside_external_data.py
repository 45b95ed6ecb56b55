"""A model saved with its weights in an external data file (``onnx.save(...,
save_as_external_data=True)``, as large encoders are shipped) (issue: models beyond the
zoo).

``run``'s resume identity hashed the ``.onnx`` file alone: weights re-exported into the
``.data`` file under a byte-identical graph file left every stage "skipped (done)", and the
folder kept the old weights' stats, plan and figures as if they were the new model's.
"""

from __future__ import annotations

import numpy as np
import onnx
from outside_models import feeds, scalar_probability

from quantscope.cli import main
from quantscope.serde import read_json


def _save(model: onnx.ModelProto, folder, scale: float) -> None:
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for t in model.graph.initializer:
        if t.name == "w1":
            t.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(t) * scale,
                                                    "w1"))
    (folder / "m.onnx.data").unlink(missing_ok=True)
    onnx.save(model, folder / "m.onnx", save_as_external_data=True,
              location="m.onnx.data", size_threshold=0)


def _run(folder) -> int:
    return main(["run", str(folder / "m.onnx"), "--data", str(folder / "x.npz"), "--target",
                 "hailo8", "--repairs", "none", "--rewrites", "none", "--lengths", "off",
                 "--out", str(folder / "W")])


def test_new_weights_under_the_same_graph_file_rerun_every_stage(tmp_path, capsys):
    np.savez(tmp_path / "x.npz", **feeds("scalar_probability", 16))
    _save(scalar_probability(), tmp_path, 1.0)
    graph = (tmp_path / "m.onnx").read_bytes()
    assert _run(tmp_path) == 0
    before = read_json(tmp_path / "W" / "evaluate.json", "evaluate")
    capsys.readouterr()
    _save(scalar_probability(), tmp_path, 3.0)
    assert (tmp_path / "m.onnx").read_bytes() == graph  # only the weights file changed
    assert _run(tmp_path) == 0
    out = capsys.readouterr().out
    assert "stages run: calibrate, analyze, plan" in out and "skipped (done): none" in out
    after = read_json(tmp_path / "W" / "evaluate.json", "evaluate")
    fp32 = [r["results"]["a8_w8"]["metrics"]["abs_err_max"] for r in (before, after)]
    assert fp32[0] != fp32[1]
