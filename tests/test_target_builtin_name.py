"""A profile file named like a built-in (``name = "hailo10h"``) with other rules.

A plan names its target by ``name``, and every later stage (the emulation's scheme, check,
export, io) and every later command looked that name up as the built-in: the user's file
was read once and then silently replaced. Now such a file is refused in one line ("rename
it"), before anything runs; a file that states what the built-in states (a copy of it)
still loads.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import helper

from quantscope.cli import main
from quantscope.targets import load_target
from quantscope.types import QuantscopeError

HAILO10H = Path(__file__).parents[1] / "src/quantscope/targets/hailo10h.toml"


def _edited(tmp_path: Path) -> Path:
    path = tmp_path / "my.toml"
    text = HAILO10H.read_text()
    # the user's rule: 16-bit Softmax only a warning on their compiler version
    edited = text.replace('check = "act16_on_kinds"\nseverity = "error"',
                          'check = "act16_on_kinds"\nseverity = "warning"', 1)
    assert edited != text
    path.write_text(edited)
    return path


def test_an_edited_file_with_a_builtin_name_is_refused(tmp_path):
    mine = _edited(tmp_path)
    with pytest.raises(QuantscopeError) as err:
        load_target(mine)
    message = str(err.value)
    assert "\n" not in message and str(mine) in message, message
    assert "'hailo10h'" in message and "rename it" in message, message


def test_a_copy_of_the_builtin_loads_as_the_builtin(tmp_path):
    copy = tmp_path / "copy.toml"
    copy.write_text(HAILO10H.read_text())
    assert load_target(copy).rules == load_target("hailo10h").rules


def test_the_command_line_refuses_it_before_anything_runs(tmp_path, capsys):
    mine = _edited(tmp_path)
    model, out = tmp_path / "m.onnx", tmp_path / "run"
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    code = main(["run", str(model), "--target", str(mine), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "rename it" in err and "Traceback" not in err, err
    assert not out.exists()
