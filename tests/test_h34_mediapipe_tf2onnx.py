"""MediaPipe's face mesh, pose and selfie segmentation as ``tf2onnx --tflite`` writes them.

- Face mesh: ``input_1 [1, 192, 192, 3]`` (NHWC) -> landmarks ``conv2d_21 [1, 1, 1, 1404]``
  and a face logit ``conv2d_31 [1, 1, 1, 1]``: a 1x1 Conv's output transposed to NHWC. The
  face logit, one value per sample on four axes, was scored by cosine (always 1.0 for one
  value) and given no decision agreement, where ``[N, 1]`` gets errors and decisions.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from evaluate_cli import assert_layout_refused, evaluated
from tiny_models import _rng, _with_weights

from quantscope.cli import main

POINTS = 4


def face_mesh(seed: int = 34) -> onnx.ModelProto:
    """NHWC in, a 1x1x1xK landmark Conv and a 1x1x1x1 face logit, as tf2onnx writes them."""
    r = _rng(seed)
    text = f"""
    <ir_version: 9, opset_import: ["" : 15]>
    mesh (float[N, 8, 8, 3] input_1) => (float[N, 1, 1, {3 * POINTS}] conv2d_21,
                                         float[N, 1, 1, 1] conv2d_31) {{
        x = Transpose <perm = [0, 3, 1, 2]> (input_1)
        c = Conv (x, wc, bc)
        h = Relu (c)
        lm = Conv (h, wl, bl)
        conv2d_21 = Transpose <perm = [0, 2, 3, 1]> (lm)
        fl = Conv (h, wf, bf)
        conv2d_31 = Transpose <perm = [0, 2, 3, 1]> (fl)
    }}
    """
    return _with_weights(text, {
        "wc": r.normal(0, 0.3, (16, 3, 8, 8)).astype(np.float32),
        "bc": r.normal(0, 0.1, 16).astype(np.float32),
        "wl": r.normal(0, 8.0, (3 * POINTS, 16, 1, 1)).astype(np.float32),
        "bl": np.tile(np.array([96.0, 96.0, 0.0], np.float32), POINTS),
        "wf": r.normal(0, 3.0, (1, 16, 1, 1)).astype(np.float32),
        "bf": np.array([-2.0], np.float32),
    })


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    d = tmp_path_factory.mktemp("mesh")
    onnx.save(face_mesh(), d / "mesh.onnx")
    np.savez(d / "mesh.npz", input_1=np.random.default_rng(0).uniform(0, 1, (32, 8, 8, 3))
             .astype(np.float32))
    assert main(["calibrate", str(d / "mesh.onnx"), "--data", str(d / "mesh.npz"),
                 "--out", str(d / "stats.npz")]) == 0
    return d


def _evaluate(d, capsys, model: str, *extra: str) -> dict:
    return evaluated(capsys, d, f"{model}.onnx", f"{model}.npz", *extra)


def test_a_one_value_output_on_four_axes_is_decided_not_cosined(mesh, capsys):
    r = _evaluate(mesh, capsys, "mesh", "--layout", "conv2d_21=points:dims=3")
    flag = r["outputs"]["conv2d_31"]
    assert "cosine_mean" not in flag, flag  # a cosine of one value is 1.0 whatever it is
    assert 0.0 <= flag["decision_agreement"] <= 1.0 and flag["decision_threshold"] == 0.0
    assert any("output 'conv2d_31' has one value per sample (not in [0, 1]): no cosine" in n
               for n in r["notes"]), r["notes"]


def _tflite_custom(op: str) -> onnx.ModelProto:
    """tf2onnx's selfie segmentation tail: NCHW -> Transpose -> the custom op -> Sigmoid."""
    from onnx import helper, numpy_helper

    nodes = [helper.make_node("Transpose", ["x"], ["t"], name="t", perm=[0, 2, 3, 1]),
             helper.make_node(op, ["t", "w", "b"], ["segment"], name="segment"),
             helper.make_node("Sigmoid", ["segment"], ["mask"], name="mask")]
    graph = helper.make_graph(
        nodes, "selfie", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("mask", onnx.TensorProto.FLOAT, [1, 16, 16, 1])],
        [numpy_helper.from_array(np.ones((1, 2, 2, 4), np.float32), "w"),
         numpy_helper.from_array(np.zeros(1, np.float32), "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])


@pytest.mark.parametrize(("op", "needles"), [
    ("TFL_Convolution2DTransposeBias",
     ("TFL_Convolution2DTransposeBias ('segment')", "tf2onnx --tflite", "'Unsupported ops'",
      "is a ConvTranspose", "[in, out, kh, kw]", "replace the node")),
    ("MyOwnOp", ("MyOwnOp ('segment')", "replace each with standard ONNX ops")),
])
def test_an_op_onnx_does_not_define_is_one_line_naming_the_node_and_fix(tmp_path, capsys, op,
                                                                       needles):
    """tf2onnx left MediaPipe's custom op as it is; quantscope said only the checker's
    'No Op registered for TFL_Convolution2DTransposeBias' and 'fix or re-export it'."""
    path = tmp_path / "selfie.onnx"
    onnx.save(_tflite_custom(op), path)
    before = path.read_bytes()
    code = main(["groups", str(path)])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code != 0 and len(lines) == 1 and "Traceback" not in err, err
    assert all(n in lines[0] for n in needles), lines[0]
    assert "fails the ONNX checker" not in lines[0]
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["selfie.onnx"]


def pose_tail(seed: int = 35) -> onnx.ModelProto:
    """BlazePose's segmentation head as tf2onnx writes it: a one-channel Conv map
    ``[N, 1, H, W]`` made NHWC ``[N, H, W, 1]`` by a Reshape (tf2onnx's optimiser turns the
    Transpose of a one-channel map into one)."""
    r = _rng(seed)
    text = """
    <ir_version: 9, opset_import: ["" : 15]>
    pose (float[1, 8, 8, 3] input_1) => (float[1, 8, 8, 1] Identity_2) {
        x = Transpose <perm = [0, 3, 1, 2]> (input_1)
        c = Conv <pads = [1, 1, 1, 1]> (x, wc, bc)
        h = Relu (c)
        m = Conv <pads = [1, 1, 1, 1]> (h, wm, bm)
        Identity_2 = Reshape (m, nhwc)
    }
    """
    return _with_weights(text, {
        "wc": r.normal(0, 0.5, (8, 3, 3, 3)).astype(np.float32),
        "bc": r.normal(0, 0.1, 8).astype(np.float32),
        "wm": r.normal(0, 4.0, (1, 8, 3, 3)).astype(np.float32),
        "bm": np.array([-1.0], np.float32),
        "nhwc": np.array([1, 8, 8, 1], np.int64),
    })


def test_a_one_channel_map_reshaped_to_nhwc_keeps_its_channel_axis(tmp_path, capsys):
    """The per-channel fidelity read axis 1 of [N, H, W, 1], an image row, as a channel:
    'channel 63 of axis 1: ... SQNR 0.2 dB' for pose's segmentation logits, and the worst
    row's SQNR was the plain-tensor headline a run plans by."""
    from quantscope.model.axes import output_channel_axes
    from quantscope.model.load import load_proto

    model = pose_tail()
    assert output_channel_axes(load_proto(model))["Identity_2"] == 3
    onnx.save(model, tmp_path / "pose.onnx")
    np.savez(tmp_path / "pose.npz", input_1=np.random.default_rng(1).uniform(
        0, 1, (12, 8, 8, 3)).astype(np.float32))
    assert main(["calibrate", str(tmp_path / "pose.onnx"), "--data", str(tmp_path / "pose.npz"),
                 "--out", str(tmp_path / "stats.npz")]) == 0
    r = _evaluate(tmp_path, capsys, "pose")
    out = r["outputs"]["Identity_2"]
    assert out.get("channel_axis", 3) == 3, out
    assert out["sqnr_db_channel_min"] == pytest.approx(out["sqnr_db"]), out
    assert not any("of axis 1" in n for n in r["notes"]), r["notes"]


def test_pose_flags_beside_pixels_are_decided_not_left_unmeasured():
    """BlazePose's [N, 195]: 39 points of x, y, z, visibility, presence. The visibility
    logits share the pixels' 8-bit grid; with dims=5 they were 'not measured' and nothing
    counted the visibility decisions that flipped (on the real model: 21 % of them)."""
    from quantscope.tasks.points import PointsTask
    from quantscope.types import Outputs

    ref = np.array([[100.0, 50.0, 0.0, 3.0, 8.0, 120.0, 60.0, 0.0, -2.0, 8.0]] * 2)
    test = ref.copy()
    test[0, 3] = -0.5  # point 0's visibility flips; its x, y stay
    out = lambda a: Outputs(names=("Identity",), batches=((a.astype(np.float32),),))  # noqa: E731
    plain = PointsTask(name="p", output="Identity", dims=5, tolerance=1.0)
    m = plain.metrics(out(ref), out(test))
    assert m.values["point_agreement"] == 1.0 and "point_flag_agreement" not in m.values
    assert "the 3rd to 5th values not measured" in plain.describe()
    assert "--layout Identity=points:dims=5,flags=3-4" in plain.describe()
    flagged = PointsTask(name="p", output="Identity", dims=5, tolerance=1.0, flags=(3, 5))
    m = flagged.metrics(out(ref), out(test))
    assert m.values["point_flag_agreement"] == pytest.approx(7 / 8)
    assert m.values["point_flag_agreement_items"] > 0
    assert "the 3rd value not measured" in flagged.describe()
    assert any("NOT LIKE FP32: output 'Identity': 1 of 8 point flags decided otherwise" in n
               for n in m.notes), m.notes
    assert any("value 3: 75.0 %" in n for n in m.notes), m.notes


@pytest.mark.parametrize(("layout", "needle"), [
    ("conv2d_21=points:dims=3,flags=1-2", "flags '1-2' are no values of a point of 3 after its x, y"),
    ("conv2d_21=points:dims=3,flags=2-3", "flags '2-3' are no values of a point of 3"),
    ("conv2d_21=points:dims=3,threshold=0.5", "threshold decides the flags: give flags=A-B"),
    ("conv2d_21=points:dims=3,flags=x", "flags 'x' is not a row range"),
])
def test_bad_flags_layout_is_one_line(mesh, capsys, layout, needle):
    assert_layout_refused(capsys, mesh, "mesh.onnx", "mesh.npz", layout, needle)


def test_flags_on_the_cli_score_the_face_mesh_points_and_flags(mesh, capsys):
    r = _evaluate(mesh, capsys, "mesh", "--layout", "conv2d_21=points:dims=3,flags=2")
    m = r["metrics"]
    assert 0.0 <= m["point_flag_agreement"] <= 1.0 and m["point_flag_agreement_items"] > 0
    assert any("read as flags (flags=2, counted from 0), decided at 0" in n
               for n in r["notes"]), r["notes"]


def test_map_channel_of_an_nhwc_map_indexes_its_channels_not_its_rows(tmp_path, capsys):
    """channel=0 of pose's [N, H, W, 1] segmentation took index 0 of axis 1: the mask IoU
    of the first image row, said as 'channel 0'."""
    onnx.save(pose_tail(), tmp_path / "pose.onnx")
    x = np.random.default_rng(2).uniform(0, 1, (12, 8, 8, 3)).astype(np.float32)
    np.savez(tmp_path / "pose.npz", input_1=x)
    assert main(["calibrate", str(tmp_path / "pose.onnx"), "--data", str(tmp_path / "pose.npz"),
                 "--out", str(tmp_path / "stats.npz")]) == 0
    whole = _evaluate(tmp_path, capsys, "pose", "--layout", "Identity_2=map:threshold=0")
    one = _evaluate(tmp_path, capsys, "pose", "--layout", "Identity_2=map:threshold=0,channel=0")
    for key in ("mask_iou", "pixel_flip_share", "map_abs_error_mean"):
        assert one["metrics"][key] == pytest.approx(whole["metrics"][key]), key
    assert one["metrics"]["pixel_flip_share_items"] == pytest.approx(
        whole["metrics"]["pixel_flip_share_items"])
    assert any("(channel 0 of axis 3)" in n for n in one["notes"]), one["notes"]
    code = main(["evaluate", str(tmp_path / "pose.onnx"), "--data", str(tmp_path / "pose.npz"),
                 "--stats", str(tmp_path / "stats.npz"), "--precision", "a8_w8",
                 "--layout", "Identity_2=map:channel=1", "--json", str(tmp_path / "bad.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and "channel 1 is no channel of its channel axis 3" in err[0]


def test_verdict_counts_a_flag_share_in_point_flags():
    from quantscope.report.summary import sample_size

    v = {"held_out": {"samples": 16}, "metric": "point_flag_agreement",
         "quality": {"plan": {"point_flag_agreement": 0.9, "point_flag_agreement_items": 64.0,
                              "point_flag_agreement_clusters": 16.0}}}
    assert sample_size(v) == "n=16 held-out samples, an effective 64 point flags"


def test_a_mask_iou_over_nearly_empty_masks_says_so():
    """Selfie segmentation on photos without a person (a rocket, a horse): FP32's mask is a
    few stray pixels, the quantized model's a few others, IoU 0; two such samples of 32
    took the held-out mean from 0.978 to 0.917 and nothing said why."""
    from quantscope.tasks.maps import MapTask
    from quantscope.types import Outputs

    ref = np.zeros((4, 1, 20, 20))
    ref[:2, :, 2:12, 2:12] = 0.9  # two samples with a person: 25 % of the values
    ref[2, 0, 0, 0] = 0.9  # one stray value, 0.25 %
    test = ref.copy()
    test[2, 0, 0, 0], test[2, 0, 19, 19] = 0.1, 0.9  # the stray value moves
    out = lambda a: Outputs(names=("mask",), batches=((a.astype(np.float32),),))  # noqa: E731
    m = MapTask(name="m", output="mask").metrics(out(ref), out(test))
    assert m.values["mask_iou"] == pytest.approx(0.75)  # 1, 1, 0, 1 (both empty)
    note = next(n for n in m.notes if "covers under 1%" in n)
    assert "on 2 of 4 samples" in note and "says little" in note, note
    assert any("mask IoU 1.000 over the 2 samples whose FP32 mask covers 1% or more of the "
               "values (0.500 over the 2 others)" in n for n in m.notes), m.notes
    from quantscope.pipeline.verdict import _says_little

    # said once by run's verdict, whatever each compared model's IoU (three lines before)
    results = {label: {"notes": list(MapTask(name="m", output="mask").metrics(
        out(ref), out(t)).notes)} for label, t in (("fp32", ref), ("a8_w8", test),
                                                     ("plan", test * 0.99))}
    assert [n for n in _says_little(results) if "covers under" in n] == [note]
    whole = MapTask(name="m", output="mask").metrics(out(ref[:2]), out(test[:2]))
    assert not any("covers under" in n for n in whole.notes)


def test_the_verdict_gives_a_task_note_no_line_after_it_that_is_another_fact():
    """BlazePose's run verdict read 'NOT LIKE FP32: output 'Identity': 577 of 1248 points
    move ...: output 'Identity': flags ... 96.8 % ...': the points' note took the flags'
    summary (the next note) as where its points moved."""
    from quantscope.pipeline.verdict import _not_like

    points = "NOT LIKE FP32: output 'Identity': 577 of 1248 points move more than 4 from FP32's"
    flags = "output 'Identity': flags (values 3-4 of each point, counted from 0) decided at 0"
    below = "NOT LIKE FP32: output(s) 'Identity_1' lose what FP32 computes (below)"
    where = "output 'Identity_1' has one value per sample: ..."
    results = {"plan": {"notes": [points, flags, below, where]}}
    assert _not_like(results)["plan"] == (
        f"{points}; NOT LIKE FP32: output(s) 'Identity_1' lose what FP32 computes: {where}")


def test_a_second_tasks_loss_says_plans_are_searched_for_the_headline():
    """BlazePose on hailo10h: the goal on the points 'REACHED' with every group at 16 bit
    but the segmentation head's ten, which gain nothing for the points (the headline):
    the mask's 'NOT LIKE FP32' (IoU 0.869) said nothing of why. --metric mask_iou does not
    help (the analysis still ranks by the headline: 0.926 at 7.01x, 'binds: maxpool'); the
    mask declared first plans for it."""
    from quantscope.pipeline.verdict import _not_like
    from quantscope.tasks.layout import OutputTasks
    from quantscope.tasks.maps import MapTask
    from quantscope.types import Outputs

    pts = np.array([[10.0, 10.0, 50.0, 50.0], [20.0, 20.0, 90.0, 90.0]])
    ref = np.zeros((2, 1, 20, 20))
    ref[:, :, 2:12, 2:12] = 0.9
    test = ref.copy()
    test[:, :, 2:12, 2:7] = 0.1  # half of each mask lost
    out = lambda a, b: Outputs(names=("Identity", "seg"), batches=(  # noqa: E731
        (a.astype(np.float32), b.astype(np.float32)),))
    from quantscope.tasks.points import PointsTask

    tasks = OutputTasks(name="o", tasks=(PointsTask(name="p", output="Identity"),
                                         MapTask(name="m", output="seg")),
                        headline="point_agreement")
    notes = tasks.metrics(out(pts, ref), out(pts, test)).notes
    said = next(n for n in notes if n.startswith("NOT LIKE FP32: output 'seg'"))
    assert said.endswith("(plans are searched for the headline, 'Identity''s point_agreement, "
                         "the first --layout's; its analysis finds no gain in a layer only this "
                         "output needs: give --layout seg=... first to plan for its mask_iou)"), said
    results = {"plan": {"notes": list(notes)}}
    assert "give --layout seg=... first" in _not_like(results, "point_agreement")["plan"]


def test_the_headline_is_the_first_declared_layouts_not_the_models_first_output():
    """'--layout Identity_2=map --layout Identity=points' kept the points (the model's first
    output) as the headline: the run planned for them, not the map declared first."""
    from quantscope.model.load import load_proto
    from quantscope.tasks.layout import layout_tasks, parse_layout

    model = load_proto(face_mesh())
    first_map = (parse_layout("conv2d_31=score:threshold=0"),
                 parse_layout("conv2d_21=points:dims=3"))
    task, _ = layout_tasks(model, first_map, "d")
    assert task.headline == "decision_agreement"
    assert [t.output for t in task.tasks] == ["conv2d_31", "conv2d_21"]
    task, _ = layout_tasks(model, first_map[::-1], "d")
    assert task.headline == "point_agreement"


def test_a_goal_missed_names_the_groups_the_search_never_tried_beside_a_rule():
    """BlazePose's map declared first on hailo10h: NOT reached (0.935 held out) with ten
    segmentation-head groups at 8 bit, no gain in the analysis, and the verdict said only
    'binds: hailo.maxpool_16bit' (two MaxPools worth 3 pts predicted)."""
    from quantscope.pipeline.verdict import _binding

    pareto = {"metric": "mask_iou", "blockers": [
        {"rule": "hailo.maxpool_16bit", "gain": 0.032, "groups": ["mp1", "mp2"]}],
        "notes": ["predicted quality adds per-group gains measured one group at a time: an "
                  "estimate", "10 group(s) have no gain in the analysis and stay at start"]}
    assert _binding(pareto, False) == ("hailo.maxpool_16bit; 10 group(s) have no gain in the "
                                       "analysis and stay at start")
    assert _binding(pareto, True) is None
    assert _binding({"notes": pareto["notes"]}, False) == pareto["notes"][1]
