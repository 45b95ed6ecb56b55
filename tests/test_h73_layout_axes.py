"""The axes a layout claims for the per-channel figures (h73).

- A ``map`` without ``channel=`` claimed no axis: ``[N, 3, H, W]``'s maps were read on the
  default (or the graph's) axis and said to be that, not the layout's; a single map
  ``[N, H, W]`` was read per row (axis 1 by default), a row of near-0 values counted
  "collapsed" and the output NOT LIKE FP32 while its mask was FP32's.
- A ``class`` layout without ``axis=`` on ``[N, 'T', C]`` (T a dim_param) took axis 1,
  the tokens, as the classes: its top-1 agreement was over the largest token per class.
- A detection's box rows were said ``(box values; ...)`` where 12 of BlazeFace's 16 rows
  are key points no box or score is read from.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantscope.cli import main
from quantscope.emulate.class_axes import read_axis, read_words
from quantscope.model.load import load_proto
from quantscope.tasks.detection import DetectionLayout, DetectionTask
from quantscope.tasks.layout import layout_tasks, parse_layout


def _scaled(shape: list, out_shape: list | None = None) -> onnx.ModelProto:
    """``y = x * 1`` of ``shape`` (the graph tells no channel axis of ``y``)."""
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    g = helper.make_graph([helper.make_node("Mul", ["x", "one"], ["y"], name="m")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                         out_shape or shape)], [one])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _evaluate(folder: Path, model: onnx.ModelProto, x: np.ndarray, layout: str,
              capsys) -> tuple[dict, str]:
    onnx.save(model, folder / "m.onnx")
    np.savez(folder / "d.npz", x=x.astype(np.float32))
    args = [str(folder / "m.onnx"), "--data", str(folder / "d.npz")]
    assert main(["calibrate", *args, "--out", str(folder / "s.npz")]) == 0
    assert main(["evaluate", *args, "--stats", str(folder / "s.npz"), "--precision", "a8_w8",
                 "--layout", layout, "--json", str(folder / "e.json")]) == 0
    out = capsys.readouterr().out
    return json.loads((folder / "e.json").read_text()), out


# ---- 1. a map without channel= -----------------------------------------------------------

def test_a_stack_of_maps_is_read_on_its_maps_as_the_layouts_claim(tmp_path, capsys):
    """``[N, 3, 8, 8]``, ``y=map``: the entry said ``by default (the graph tells no channel
    axis ...)``; the maps are the layout's channels and said so."""
    x = np.random.default_rng(0).uniform(0, 1, (8, 3, 8, 8))
    doc, out = _evaluate(tmp_path, _scaled(["N", 3, 8, 8]), x, "y=map", capsys)
    entry = doc["outputs"]["y"]
    assert entry["channel_axis"] == 1
    assert entry["channel_axis_read"] == ("axis 1, 3 channels: the maps of its map layout "
                                          "(each value decided alone, each map a channel)")
    assert "per channel on axis 1, 3 channels: the maps of its map layout" in out


def test_a_single_map_has_no_channel_axis_and_says_so(tmp_path, capsys):
    """``[N, 16, 16]``, row 0 under 0.0015 (half an 8-bit step of 0..1: every value of it
    quantizes to 0): read per row, that row "collapsed" and the map was NOT LIKE FP32
    though no value crosses the threshold. Now no channel axis, the worst channel the
    whole SQNR, said."""
    x = np.random.default_rng(1).uniform(0, 1, (8, 16, 16))
    x[:, 0, :] = np.random.default_rng(2).uniform(0, 0.0015, (8, 16))
    x[:, 1, 0] = 1.0
    doc, out = _evaluate(tmp_path, _scaled(["N", 16, 16]), x, "y=map", capsys)
    entry = doc["outputs"]["y"]
    assert "channel_axis" not in entry and "collapsed_channels" not in entry, entry
    assert entry["sqnr_db_channel_min"] == entry["sqnr_db"]
    assert entry["channel_axis_none"] == ("a single map [N, 16, 16] of its map layout, "
                                          "each value decided alone")
    assert not any(n.startswith("NOT LIKE FP32") for n in doc["notes"]), doc["notes"]
    said = ("no channel axis: a single map [N, 16, 16] of its map layout, each value "
            "decided alone, so its worst channel is its whole SQNR")
    assert read_words(entry) == said
    (line,) = [ln for ln in out.splitlines() if ln.startswith("  output y: ")]
    assert f"sqnr_db_channel_min {entry['sqnr_db_channel_min']:.1f} dB ({said})" in line, line


def test_frames_by_bins_is_no_single_map():
    """``[N, 'T', 88]`` (a posteriorgram): no claim; the default rule reads the 88 bins
    (h70), not none."""
    model = load_proto(_scaled(["N", "T", 88]), "m")
    task, _ = layout_tasks(model, (parse_layout("y=map"),), "d.npz")
    assert task.class_axes() == {}


def test_a_maps_channel_still_claims_its_axis():
    model = load_proto(_scaled(["N", 2, 8, 8]), "m")
    task, _ = layout_tasks(model, (parse_layout("y=map:channel=1"),), "d.npz")
    (claim,) = task.class_axes().values()
    assert claim.axis == 1 and claim.why == "the channels of its map layout (channel=1 is one)"


# ---- 2. a class layout's own default axis ------------------------------------------------

def test_a_class_layouts_default_axis_is_not_the_tokens(tmp_path, capsys):
    """``[N, 'T', 5]``, ``y=class``: axis 1 (T) had been the classes; the last axis of
    fixed length is, and the layout's note and the entry say why."""
    rng = np.random.default_rng(3)
    x = rng.normal(0, 1, (8, 6, 5))
    doc, _ = _evaluate(tmp_path, _scaled(["N", "T", 5]), x, "y=class", capsys)
    entry = doc["outputs"]["y"]
    assert entry["channel_axis"] == 2, entry
    assert entry["channel_axis_read"] == (
        "axis 2, 5 channels: the classes of its class task (by default, the last axis of "
        "fixed length: the graph does not say which axis holds the classes; axis 1 is "
        "symbolic in the model ('T'): positions)")
    (note,) = [n for n in doc["notes"] if n.startswith("output 'y' read as class scores")]
    assert "top-1 over 5 classes on axis 2, the last" in note, note
    assert doc["metrics"]["top1_agreement_items"] == 8 * 6 or \
        doc["metrics"].get("top1_agreement_clusters") == 8, doc["metrics"]


def test_a_class_layout_with_no_fixed_axis_is_refused_naming_axis(tmp_path, capsys):
    onnx.save(_scaled(["N", "T", "C"]), tmp_path / "m.onnx")
    np.savez(tmp_path / "d.npz", x=np.ones((4, 6, 5), np.float32))
    args = [str(tmp_path / "m.onnx"), "--data", str(tmp_path / "d.npz")]
    assert main(["calibrate", *args, "--out", str(tmp_path / "s.npz")]) == 0
    capsys.readouterr()
    code = main(["evaluate", *args, "--stats", str(tmp_path / "s.npz"), "--precision",
                 "a8_w8", "--layout", "y=class"])
    err = capsys.readouterr().err
    assert code != 0
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "has shape [N, 'T', 'C']: axis 1 is symbolic in the model ('T'" in lines[0]
    assert "y=class:axis=K" in lines[0], lines[0]


# ---- 3. a detection's rows no box or score is read from ----------------------------------

def test_the_key_point_rows_are_counted_in_the_rows_words():
    """BlazeFace-like ``[N, 896, 16]`` boxes, scores in ``classificators``: the rows had
    been said ``(box values; its scores in another output, scores_from=)``."""
    lay = DetectionLayout(axis=2, scores_output="classificators")
    task = DetectionTask(name="d", output="regressors", layout=lay)
    got = read_axis((4, 896, 16), None, task.class_axes()["regressors"])
    assert got.axis == 2
    assert got.read == ("axis 2, 16 channels: the rows (4 box values; 12 rows not read by "
                        "the detection layout (rows 4-15); its scores in another output, "
                        "scores_from=) of its detection layout")
    exact = read_axis((4, 896, 4), None, task.class_axes()["regressors"])
    assert exact.read.endswith("the rows (box values; its scores in another output, "
                               "scores_from=) of its detection layout")
    rows = DetectionLayout(axis=1, scores=(4, 6))  # a class-id row after the scores
    assert rows.row_words(7) == ("4 box values, scores; 1 row not read by the detection "
                                 "layout (rows 6)")
