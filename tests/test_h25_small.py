"""Small defects left by earlier helpers (h25): each test fails without its fix.

Real ORT sessions on tiny models built here; the CLI as a user runs it.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantscope.cli import main
from quantscope.report.summary import sample_size
from quantscope.tasks.detection import DetectionLayout, split_rows
from quantscope.types import moved_axis

# ------------------------------------------- 1. an axis= counts the output as declared


def _time_major(tmp_path):
    """``y [3, 5, N] = x [3, 5, N] * w``: samples on axis 2, 5 classes on axis 1."""
    w = numpy_helper.from_array(np.linspace(0.5, 1.5, 5, dtype=np.float32).reshape(1, 5, 1),
                                "w")
    g = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5, "N"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5, "N"])],
                          [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(3, 5, 16))
            .astype(np.float32))
    assert main(["calibrate", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "x.npy"),
                 "--batch-axis", "x=2", "--out", str(tmp_path / "s.npz")]) == 0
    return ["evaluate", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "x.npy"),
            "--batch-axis", "x=2", "--stats", str(tmp_path / "s.npz"), "--precision", "a8_w8"]


def test_a_class_axis_before_the_sample_axis_is_the_declared_one(tmp_path, capsys):
    """``class:axis=1`` of ``y [3, 5, N]`` batched on axis 2 is its 5 classes, 3 positions
    per sample (48 in all); it was counted on the sample-first ``[N, 3, 5]``: 3 classes
    and 80 positions."""
    cmd = _time_major(tmp_path)
    assert main([*cmd, "--layout", "y=class:axis=1", "--json", str(tmp_path / "e.json")]) == 0
    out = capsys.readouterr().out
    assert "top-1 over 5 classes on axis 1, as given; judged per position, 3 positions" in out
    m = json.loads((tmp_path / "e.json").read_text())["metrics"]
    assert m["top1_agreement_clusters"] == 16
    assert 16 <= m["top1_agreement_items"] <= 48  # effective count of 48 positions


def test_the_declared_sample_axis_is_refused_as_class_axis(tmp_path, capsys):
    cmd = _time_major(tmp_path)
    capsys.readouterr()
    assert main([*cmd, "--layout", "y=class:axis=2", "--json", str(tmp_path / "e.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("quantscope: error: --layout 'y=class:axis=2': axis 2 is the samples' "
                   "axis of output 'y': give the class axis, 0..2 but 2 (-1: the last)")
    assert not (tmp_path / "e.json").exists()


def test_a_detection_row_axis_before_the_sample_axis_is_the_declared_one():
    """A detection output declared ``[6 rows, N, 3 anchors]`` (samples on axis 1), rows
    on axis 0: scored on its sample-first ``[N, 6, 3]`` arrays."""
    declared = np.arange(6 * 2 * 3, dtype=np.float64).reshape(6, 2, 3)
    layout = DetectionLayout(axis=0, sample_axis=1, boxes=(0, 4), scores=(4, None),
                             box_format="xyxy")
    boxes, scores = split_rows(np.moveaxis(declared, 1, 0), layout)
    assert boxes.shape == (2, 3, 4) and scores.shape == (2, 3, 2)
    np.testing.assert_array_equal(boxes[1, 2], declared[0:4, 1, 2])
    np.testing.assert_array_equal(scores[0, 1], declared[4:6, 0, 1])


def test_moved_axis():
    assert [moved_axis(a, 2, 3) for a in (0, 1, 2, -1)] == [1, 2, 0, 0]
    assert [moved_axis(a, 1, 3) for a in (0, 2, -1)] == [1, 2, 2]
    assert [moved_axis(a, 0, 3) for a in (1, 2, -1, 3)] == [1, 2, -1, 3]
    assert [moved_axis(a, 1, 3) for a in (3, -4)] == [3, -4]  # out of range: still out


# ------------------------------------------- 2. a per-position share's verdict names positions


def test_the_verdict_names_the_items_a_share_counted():
    held = {"samples": 16, "unit": "samples"}
    per_token = {"metric": "top1_agreement", "held_out": held, "quality": {"plan": {
        "top1_agreement": 0.9, "top1_agreement_items": 150.0, "top1_agreement_clusters": 16.0}}}
    assert sample_size(per_token) == "n=16 held-out samples, an effective 150 positions"
    per_sample = {"metric": "top1_agreement", "held_out": held, "quality": {"plan": {
        "top1_agreement": 0.9, "top1_agreement_items": 16.0}}}
    assert sample_size(per_sample) == "n=16 held-out samples"
    views = {"metric": "top1_agreement", "held_out": held, "quality": {"plan": {
        "top1_agreement": 0.9, "top1_agreement_items": 32.0}}}
    assert sample_size(views) == "n=16 held-out samples, 32 top-1 picks"


# ------------------------------------------- 3. the count rows are no metric rows


def _result(metrics):
    return {"model": "m.onnx", "data": "x.npy", "plan": {"default": "a8_w8"},
            "metrics": metrics}


def test_the_counts_stand_beside_their_share_not_as_rows():
    from quantscope.report.console import format_result
    from quantscope.report.run import configs_section

    per_token = {"top1_agreement": 0.979, "top1_agreement_items": 47.0,
                 "top1_agreement_clusters": 16.0, "top1_ties": 0.02, "sqnr_db": 39.2}
    text = format_result(_result(per_token))
    assert "_items" not in text and "_clusters" not in text
    assert "  top1_agreement           97.9 % (n=47 effective, 16 samples)" in text.splitlines()
    plain = format_result(_result({"decision_agreement": 0.5,
                                   "decision_agreement_items": 8.0}))
    assert plain.splitlines()[1:] == ["  decision_agreement       50.0 % (n=8)"]
    html = configs_section({"fp32": {"metrics": per_token}, "plan": {"metrics": per_token}},
                           "top1_agreement", "n=16 held-out samples")
    assert "_items" not in html and "_clusters" not in html
    assert html.count("97.9 % (n=47 effective, 16 samples)") == 2


# ------------------------------------------- 4. every share counts its items


def _outs(a):
    from quantscope.types import Outputs

    return Outputs(names=("y",), batches=((a,),))


def test_top5_pixel_flip_and_score_side_shares_count_their_items():
    from quantscope.tasks.classes import ClassTask
    from quantscope.tasks.detection import DetectionTask
    from quantscope.tasks.maps import MapTask
    from quantscope.tasks.shares import clustered_items

    rng = np.random.default_rng(0)
    ref = rng.normal(size=(10, 8))  # 10 samples of 8 classes
    m = ClassTask("c", "y").metrics(_outs(ref), _outs(ref + rng.normal(0, 0.5, ref.shape)))
    assert m.values["top5_agreement_items"] == 10 and "top5_agreement_clusters" not in m.values
    per_pos = rng.normal(size=(4, 8, 3))  # 4 samples, 8 classes, 3 positions each
    m = ClassTask("c", "y").metrics(_outs(per_pos), _outs(per_pos + rng.normal(0, 2, per_pos.shape)))
    assert m.values["top5_agreement_clusters"] == 4
    assert 4 <= m.values["top5_agreement_items"] <= 12

    maps = rng.uniform(size=(6, 2, 5))  # 6 samples of 10 values
    test = maps + rng.normal(0, 0.2, maps.shape)
    m = MapTask("m", "y").metrics(_outs(maps), _outs(test))
    flips = ((maps >= 0.5) != (test >= 0.5)).reshape(6, -1).sum(axis=1)
    assert m.values["pixel_flip_share"] == flips.sum() / 60
    assert m.values["pixel_flip_share_clusters"] == 6
    assert m.values["pixel_flip_share_items"] == np.floor(clustered_items(flips, np.full(6, 10)))

    det = np.concatenate([rng.uniform(0, 50, (5, 4, 7)), rng.uniform(0, 1, (5, 2, 7))], axis=1)
    noisy = det + np.concatenate([np.zeros((5, 4, 7)), rng.normal(0, 0.3, (5, 2, 7))], axis=1)
    m = DetectionTask("d", "y", DetectionLayout()).metrics(_outs(det), _outs(noisy))
    same = ((det[:, 4:].max(axis=1) >= 0.25) == (noisy[:, 4:].max(axis=1) >= 0.25)).sum(axis=1)
    assert m.values["score_side_agreement"] == same.sum() / 35
    assert m.values["score_side_agreement_clusters"] == 5
    assert m.values["score_side_agreement_items"] == np.floor(
        clustered_items(same, np.full(5, 7)))


# ------------------------------------------- 5. the figures in their own metric's unit


def test_format_search_writes_measured_figures_in_the_measured_metric():
    from quantscope.report.console import format_search

    text = format_search({
        "metric": "sqnr_db", "measured_metric": "top1_agreement",
        "chosen": {"cost": 1.2, "predicted": 31.5, "measured": 0.975},
        "points": [{"cost": 1.2, "predicted": 31.5, "measured": 0.975, "ranked": 0.97,
                    "origin": "x"}],
        "engines": {"line": "ranked by torch (cpu)", "measured": 0.975, "ranked": 0.97,
                    "measured_by": "onnxruntime", "ranked_by": "torch (cpu)",
                    "difference": -0.005}})
    lines = text.splitlines()
    assert lines[0].startswith("metric sqnr_db (predicted), top1_agreement (measured);")
    assert "predicted 31.5 dB, measured 97.5 %" in lines[0]
    assert "chosen plan: 97.5 % in onnxruntime, 97.0 % ranked by torch (cpu) (difference " \
           "-0.5 pts)" in lines[1]
    assert "predicted 31.5 dB" in lines[2] and "measured 97.5 %" in lines[2]
    assert "ranked 97.0 %" in lines[2] and " dB " not in lines[2].split("predicted 31.5 dB")[1]


def test_the_gpu_ranking_note_writes_figures_in_their_unit():
    from quantscope.finetune.engine import RankEngine
    from quantscope.stages.rank import confirm_chosen
    from quantscope.types import Plan, Precision

    pareto = {"metric": "sqnr_db", "measured_metric": "top1_agreement",
              "chosen": {"cost": 1.2, "measured": 0.97}, "points": []}
    confirm_chosen(Plan.uniform(Precision.A8_W8), pareto, RankEngine("torch", "cuda", "torch"),
                   lambda plan: 0.9731234)
    assert pareto["notes"][-1].startswith(
        "ranked by torch (cuda), measured by onnxruntime: the chosen plan measures 97.31 % in "
        "onnxruntime, 97.00 % ranked by torch (cuda) (difference -0.31 pts);")


# ------------------------------------------- 6. evaluate says each data note once; a cast said


def _static(tmp_path, dtype):
    """``x [1, 4] -> MatMul -> y [1, 3]``: one sample per run (a static shape)."""
    w = numpy_helper.from_array(np.random.default_rng(1).normal(size=(4, 3)).astype(np.float32),
                                "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "m.onnx")
    np.savez(tmp_path / "x.npz", x=np.random.default_rng(0).normal(size=(8, 4)).astype(dtype))
    return str(tmp_path / "m.onnx"), str(tmp_path / "x.npz")


def test_evaluate_says_the_static_shape_note_once_and_a_float64_cast(tmp_path, capsys):
    model, data = _static(tmp_path, np.float64)
    assert main(["calibrate", model, "--data", data, "--out", str(tmp_path / "s.npz")]) == 0
    err = capsys.readouterr().err
    cast = ("input 'x' is float64 in the data, fed as float32 (the model's input type: what "
            "it cannot hold is rounded, in every figure, FP32's too)")
    assert err.count(cast) == 1  # calibrate has no result notes: said as it opens
    assert main(["evaluate", model, "--data", data, "--stats", str(tmp_path / "s.npz"),
                 "--precision", "a8_w8", "--json", str(tmp_path / "e.json")]) == 0
    out, err = capsys.readouterr()
    both = out + err
    assert both.count("the model takes 1 sample(s) per run (static shape)") == 1
    assert both.count(cast) == 1 and cast in out
    notes = json.loads((tmp_path / "e.json").read_text())["notes"]
    assert f"{data}: {cast}" in notes


def test_no_cast_note_for_data_the_input_holds_exactly(tmp_path):
    from quantscope.model.load import load
    from quantscope.tasks.tensors import cast_note

    model, data = _static(tmp_path, np.float32)
    assert cast_note(data, load(model)) is None
    np.save(tmp_path / "x16.npy", np.zeros((2, 4), np.float16))  # widened exactly
    assert cast_note(tmp_path / "x16.npy", load(model)) is None


def test_the_analysis_tables_show_no_count_as_a_metric():
    from quantscope.report.build import analysis_section

    html = analysis_section({"recovery": [{"promoted": ["g1"], "precision": "a16_w16",
                                           "metrics": {"top1_agreement": 0.5,
                                                       "top1_agreement_items": 12.0}}],
                             "baselines": {"a8_w8": {"top1_agreement": 0.25,
                                                     "top1_agreement_items": 12.0}}})
    assert "top1_agreement 50.0 % (n=12)" in html and "_items" not in html
    assert "25.0 % (n=12)" in html
