"""An .npz array that no model input takes (a label array, a misspelt optional input) is
not fed: said in a note on stderr and in the data's notes, never silently dropped."""

from __future__ import annotations

import numpy as np
import onnx
import tiny_models as tm

from quantscope.cli import main
from quantscope.model.load import load_proto
from quantscope.stages import open_data


def test_an_array_no_input_takes_is_said(tmp_path, capsys):
    proto = tm.conv_net()
    onnx.save(proto, tmp_path / "m.onnx")
    x = tm.sample_inputs(proto, n=8, seed=0)
    (name,) = x
    np.savez(tmp_path / "d.npz", **x, labels=np.arange(8))
    ds = open_data(tmp_path / "d.npz", load_proto(proto))
    (note,) = [n for n in ds.notes if "no model input takes" in n]
    assert "'labels' (d.npz)" in note and f"inputs: {name}" in note
    assert "note: " in capsys.readouterr().err
    np.savez(tmp_path / "ok.npz", **x)  # every array an input: nothing said
    assert not [n for n in open_data(tmp_path / "ok.npz", load_proto(proto)).notes
                if "no model input takes" in n]
    code = main(["calibrate", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "d.npz"),
                 "--out", str(tmp_path / "s.npz")])
    assert code == 0 and "'labels' (d.npz)" in capsys.readouterr().err
