"""ddddocr's captcha recognizer (h41): ``input1 [1, 1, 64, image_width]`` (a batch fixed at
1, a symbolic width) and an output the file declares ``[1, seqlen]`` while the graph
computes ``[T, 1, 8210]`` (time first, the sample on axis 1). The width had been taken for
the sample axis (data refused with "pad or crop the data to the model's size"); the
misdeclared output was read along its declared axes (an internal IndexError in the
analysis, or a task on the wrong axes)."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantscope.cli import main
from quantscope.tasks.pixels import Pixels


def _recognizer(out_shape: list) -> onnx.ModelProto:
    """x [1, 1, 4, image_width] -> Conv 1x4 -> [1, 5, 1, W] -> Squeeze -> Transpose time
    first -> Reshape (to its own shape, as ddddocr's exporter wrote it) -> y [W, 1, 5]."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 1, (5, 1, 4, 1)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Squeeze", ["c", "ax2"], ["s"], name="squeeze"),
             helper.make_node("Transpose", ["s"], ["t"], perm=[2, 0, 1], name="time_first"),
             helper.make_node("Shape", ["t"], ["shape"], name="shape"),
             helper.make_node("Reshape", ["t", "shape"], ["y"], name="reshape")]
    g = helper.make_graph(
        nodes, "captcha",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, "image_width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        [w, numpy_helper.from_array(np.array([2], np.int64), "ax2")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def _data(path) -> None:
    np.save(path, np.random.default_rng(1).uniform(0, 1, (6, 1, 4, 10)).astype(np.float32))


def test_a_batch_fixed_at_1_beside_a_symbolic_width(tmp_path, capsys) -> None:
    """The samples are on the static axis of size 1 the data differs on, not the width."""
    m, x, s, j = (tmp_path / n for n in ("m.onnx", "x.npy", "s.npz", "r.json"))
    onnx.save(_recognizer(["seqlen", 1, 5]), m)
    _data(x)
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(s)]) == 0, \
        capsys.readouterr().err
    assert main(["evaluate", str(m), "--data", str(x), "--stats", str(s), "--precision",
                 "a8_w8", "--layout", "y=ctc", "--json", str(j)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "1 sample(s) per run" in out and "output 'y' is batched on axis 1" in out
    metrics = json.loads(j.read_text())["metrics"]
    assert metrics["string_agreement_items"] == 6  # one string per image, not per step


def test_an_output_declared_of_another_rank_is_refused(tmp_path, capsys) -> None:
    m, x, s = (tmp_path / n for n in ("m.onnx", "x.npy", "s.npz"))
    onnx.save(_recognizer([1, "seqlen"]), m)
    _data(x)
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(s)]) == 2
    err = [e for e in capsys.readouterr().err.splitlines() if "error" in e]
    assert len(err) == 1 and "output 'y' is declared [1, seqlen] in the model file, but " \
        "ONNX Runtime returns [10, 1, 5]" in err[0] and "declare the shape" in err[0]
    assert not s.exists()
    w = tmp_path / "W"
    for layout in ([], ["--layout", "y=ctc"]):  # refused before any work, each in one line
        assert main(["run", str(m), "--data", str(x), "--target", "hailo8l", "--out", str(w),
                     *layout]) == 2
        err = [e for e in capsys.readouterr().err.splitlines() if "error" in e]
        assert len(err) == 1 and "declare" in err[0] and "the model file" in err[0]
        assert not w.exists()


def test_a_grey_input_is_described_as_grey() -> None:
    said = Pixels(scale=255).describe(64, 160, 1)
    assert said.startswith("grey") and "RGB," not in said
    assert Pixels(scale=255).describe(64, 160).startswith("RGB")
