"""h65's leftovers (h70). (1) A gated share whose judged samples hold one point each (a
``[N, 2]`` point output, a gate on another output's score) had no ``KEY_clusters``: the
headline said ``n=6 held-out samples`` though 3 were judged. (2) A worst-channel headline
whose worst output is a one-value output was named by no ``channels`` line. (3) A DFL
head's rows were said ``box values, scores``."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantscope.cli import main
from quantscope.report.summary import headline, sample_size
from quantscope.tasks.headline import share_items
from quantscope.tasks.shares import judged_samples, share_counts
from quantscope.units import counted


def test_a_gated_share_of_one_point_per_sample_says_the_samples_judged():
    """6 held-out samples, one point each, the gate passes on 3 (2 agree)."""
    got = share_counts("point_agreement", np.array([1, 0, 1, 0, 0, 0.0]),
                       np.array([1, 0, 1, 0, 1, 0]))
    assert got == {"point_agreement_items": 3.0, "point_agreement_clusters": 3.0}
    values = {"point_agreement": 2 / 3, **got}
    assert judged_samples("point_agreement", values, 6) == 3
    v = {"metric": "point_agreement", "held_out": {"samples": 6, "unit": "samples"},
         "quality": {"plan": values}, "legal": True}
    assert sample_size(v) == "n=3 of 6 held-out samples judged, 3 points"
    assert headline(v)["judged"] == 3
    assert counted("point_agreement", values) == "66.7 % (n=3, 3 samples judged)"
    assert share_items(None, "point_agreement", values) == (3, "points")


def test_one_point_in_every_sample_is_still_a_plain_count():
    got = share_counts("point_agreement", np.ones(4), np.ones(4))
    assert got == {"point_agreement_items": 4.0}
    v = {"metric": "point_agreement", "held_out": {"samples": 4, "unit": "samples"},
         "quality": {"plan": {"point_agreement": 1.0, **got}}, "legal": True}
    assert sample_size(v) == "n=4 held-out samples"
    assert "judged" not in headline(v)


def _two_outputs() -> onnx.ModelProto:
    """``y [N, 8] = x * 1`` (8 channels, by default) beside ``p [N, 1] = s * 1`` (one value
    per sample)."""
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    nodes = [helper.make_node("Mul", ["x", "one"], ["y"], name="gy"),
             helper.make_node("Mul", ["s", "one"], ["p"], name="gp")]
    g = helper.make_graph(
        nodes, "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8]),
                       helper.make_tensor_value_info("s", TensorProto.FLOAT, ["N", 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8]),
         helper.make_tensor_value_info("p", TensorProto.FLOAT, ["N", 1])], [one])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def test_a_one_value_output_that_is_the_worst_channel_is_named(tmp_path, capsys):
    """``p``'s held-out values are tiny (1e-4) on a grid the fit half's one large value
    (10) sets (a 16-bit step of 1.5e-4 erases them): its SQNR is the headline's worst
    channel held out; the verdict named only ``y``'s channels."""
    rng = np.random.default_rng(0)
    s = (1e-4 * rng.standard_normal((32, 1))).astype(np.float32)
    s[3] = 10.0  # in the fit half (the first 16 samples)
    np.savez(tmp_path / "d.npz", x=rng.uniform(-1, 1, (32, 8)).astype(np.float32), s=s)
    onnx.save(_two_outputs(), tmp_path / "m.onnx")
    assert main(["run", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "d.npz"),
                 "--target", "hailo8", "--out", str(tmp_path / "R"), "--rewrites",
                 "none"]) == 0
    text = capsys.readouterr().out
    v = json.loads((tmp_path / "R" / "verdict.json").read_text())
    assert v["metric"] == "sqnr_db_channel_min"
    p = [line for line in v["channels_read"] if line.startswith("output 'p' worst channel ")]
    assert len(p) == 1, v["channels_read"]
    assert p[0].endswith("one value per sample, so its worst channel is its whole SQNR (no "
                         "channel axis)"), p[0]
    assert f"  channels (plan, held out): {p[0]}" in text.splitlines()


def test_an_output_read_as_positions_that_is_the_worst_is_named():
    from quantscope.pipeline.verdict_findings import _channels_read

    plan = {"y": {"sqnr_db_channel_min": 30.0, "channel_axis": 1,
                  "channel_axis_read": "axis 1, 8 channels: the graph's channel axis"},
            "f0": {"sqnr_db": 12.0, "sqnr_db_channel_min": 12.0, "positions_axis": 1},
            "p": {"sqnr_db": 50.0, "sqnr_db_channel_min": 50.0}}
    got = _channels_read([], {"plan": {"outputs": plan}}, "sqnr_db_channel_min")
    assert got == ["output 'y' worst channel 30.0 dB: per channel on axis 1, 8 channels: the "
                   "graph's channel axis",
                   "output 'f0' worst channel 12.0 dB: no channel axis (axis 1 holds "
                   "positions: frames, tokens), so its worst channel is its whole SQNR"]


def test_a_dfl_heads_rows_are_said_to_be_distribution_bins():
    """PicoDet-like (``[1, A, 16]`` bins per level, scores in other outputs) and YOLOv8-like
    (``[N, 4 x 4 + 2, A]``, the scores after the bins): the rows had been said ``box values,
    scores`` whatever they were."""
    from test_h51_dfl_heads import BINS, LAYOUT, _model

    from quantscope.model.load import load_proto
    from quantscope.tasks.layout import layout_tasks, parse_layout

    task, _ = layout_tasks(_model(), (parse_layout(LAYOUT),), "d.npz")
    axes = task.class_axes()
    assert axes["b8"].why == axes["b16"].why == (
        "the rows (box distribution bins (4 sides x 4); its scores in another output, "
        "scores_from=) of its detection layout")
    assert axes["s8"].why == "the class scores of its detection layout (scores_from=)"
    g = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["output"], name="id")], "det",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4 * BINS + 2, 20])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 4 * BINS + 2, 20])])
    model = load_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), "m")
    one, _ = layout_tasks(model, (parse_layout("output=detect:dfl=4,grid=8/16"),), "d.npz")
    assert one.class_axes()["output"].why == ("the rows (box distribution bins (4 sides x 4), "
                                              "scores) of its detection layout")
