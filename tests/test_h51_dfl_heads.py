"""Heads that write box *distributions* (DFL: PicoDet, NanoDet-Plus, YOLOv8 undecoded), on a
non-square input, with each level a separate output (PicoDet's ``layout_cdla.onnx``: four
score outputs ``[1, A, 10]`` and four box outputs ``[1, A, 32]``, strides 8/16/32/64 on an
800 x 608 input).

Before h51 such a head was judged by fidelity only: ``grid=`` decoded YOLOX's square grids
alone, no key read distributions, and a detector split into per-level outputs could only be
declared level by level. Now ``--layout B8=detect:axis=2,dfl=4,grid=8/16,levels=B16,
scores_from=S8+S16`` decodes the boxes as the host does and pools the levels into one
detection F1 with NMS over them."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from tiny_models import _rng, _with_weights

from quantscope.cli import main
from quantscope.model.load import load_proto
from quantscope.tasks.detection import DetectionLayout, DetectionTask, split_rows
from quantscope.tasks.grid_head import grid_cells, level_shape
from quantscope.tasks.layout import layout_tasks, parse_layout
from quantscope.types import Outputs, QuantscopeError

BINS = 4
SIZE = (16, 24)  # H, W: stride 8 -> 2 x 3 cells, stride 16 -> 1 x 2
LAYOUT = ("b8=detect:axis=2,dfl=4,grid=8/16,levels=b16,scores_from=s8+s16,threshold=0.3")


def _one_hot(sides: list[int]) -> np.ndarray:
    """The 4 x BINS logits of a box whose sides sit exactly on bins ``sides``."""
    logits = np.full((4, BINS), -60.0)
    logits[np.arange(4), sides] = 0.0
    return logits.reshape(-1)


def test_dfl_boxes_decode_to_hand_computed_boxes_on_a_non_square_grid() -> None:
    """6 anchors of a 16 x 24 input at stride 8 are 2 rows x 3 columns (no square input's
    grid): anchor 4 is row 1, column 1, its point (1.5, 1.5) x 8 = (12, 12)."""
    raw = np.zeros((1, 6, 4 * BINS))
    raw[0, 4] = np.concatenate([np.zeros(BINS), _one_hot([0, 2, 1, 3])[BINS:]])
    layout = DetectionLayout(axis=2, boxes=(0, 4 * BINS), scores=(0, None), dfl=BINS,
                             grid=(8,), input_size=SIZE, box_format="xyxy")
    scores = np.zeros((1, 6, 1))
    boxes, _ = split_rows(raw, layout, scores)
    # left: uniform over 0..3 -> 1.5 cells = 12 px; top bin 2 -> 16; right 1 -> 8; bottom 3 -> 24
    assert np.allclose(boxes[0, 4], [12 - 12, 12 - 16, 12 + 8, 12 + 24])
    # anchor 2 is row 0, column 2 of a 3-column grid (H, W swapped it would be row 1, col 0)
    assert np.allclose(boxes[0, 2], [20 - 12, 4 - 12, 20 + 12, 4 + 12])
    nanodet = DetectionLayout(**{**layout.__dict__, "centre": 0.0})  # NanoDet-Plus: col * stride
    assert np.allclose(split_rows(raw, nanodet, scores)[0][0, 4], [8 - 12, 8 - 16, 16, 32])
    assert grid_cells((8, 16), 8, SIZE)[6:].tolist() == [[0, 0, 16], [1, 0, 16]]
    assert level_shape(64, (800, 608)) == (13, 10)  # PicoDet's last level: 130 anchors
    with pytest.raises(QuantscopeError, match="no square input's grid"):
        grid_cells((8,), 6)


def test_levels_are_pooled_into_one_detection_f1() -> None:
    """One object seen by both levels (-4..12 at stride 8, -8..8 at stride 16: IoU 0.39):
    pooled, NMS over the levels at IoU 0.3 keeps one; a second object only at stride 16 is
    decoded on that level's own cells (column 1 of 2: its point x = 1.5 x 16 = 24)."""
    b8, b16 = np.zeros((1, 6, 4 * BINS)), np.zeros((1, 2, 4 * BINS))
    s8, s16 = np.zeros((1, 6, 1)), np.zeros((1, 2, 1))
    b8[0, 0], s8[0, 0] = _one_hot([1, 1, 1, 1]), 0.9  # point (4, 4), 8 px each side
    b16[0, 0], s16[0, 0] = _one_hot([1, 1, 0, 0]), 0.8  # point (8, 8), 16 px left and up
    b16[0, 1], s16[0, 1] = _one_hot([1, 1, 0, 0]), 0.7  # point (24, 8)
    layout = DetectionLayout(axis=2, boxes=(0, 4 * BINS), scores=(0, None), dfl=BINS,
                             grid=(8, 16), input_size=SIZE, box_format="xyxy", threshold=0.5,
                             scores_output="s8", levels=("b16",), score_levels=("s16",))
    assert layout.outputs("b8") == ("b8", "b16", "s8", "s16")
    boxes, scores = split_rows((b8, b16), layout, (s8, s16))
    assert np.allclose(boxes[0, 0], [-4, -4, 12, 12]) and np.allclose(boxes[0, 6], [-8, -8, 8, 8])
    assert np.allclose(boxes[0, 7], [8, -8, 24, 8]) and scores[0, 7, 0] == 0.7
    names = layout.outputs("b8")
    arrays = {"b8": b8, "b16": b16, "s8": s8, "s16": s16}
    outs = Outputs(names=names, batches=(tuple(arrays[n].astype(np.float32) for n in names),))
    values = DetectionTask(name="d", output="b8", layout=layout).metrics(outs, outs).values
    assert values["detections_fp32"] == 3 and values["detection_f1"] == 1.0
    lower = DetectionLayout(**{**layout.__dict__, "iou": 0.3})
    assert DetectionTask(name="d", output="b8", layout=lower).metrics(
        outs, outs).values["detections_fp32"] == 2  # NMS across the levels


def picodet_like(seed: int = 51, size: tuple[int, int] = SIZE) -> onnx.ModelProto:
    """image [N, 3, 16, 24] -> per level (strides 8, 16) a Conv of kernel and stride s:
    class scores (Sigmoid) and 4 x 4-bin box logits, each moved anchors-first
    (Reshape, Transpose): s8 [N, 6, 2], s16 [N, 2, 2], b8 [N, 6, 16], b16 [N, 2, 16]."""
    r = _rng(seed)
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    pico (float[N, 3, H, W] image) => (float[N, A8, 2] s8, float[N, A16, 2] s16,
                                        float[N, A8, 16] b8, float[N, A16, 16] b16) {
        c8 = Conv <strides = [8, 8]> (image, wc8, bc8)
        g8 = Sigmoid (c8)
        r8 = Reshape (g8, flat_c)
        s8 = Transpose <perm = [0, 2, 1]> (r8)
        d8 = Conv <strides = [8, 8]> (image, wb8, bb8)
        q8 = Reshape (d8, flat_b)
        b8 = Transpose <perm = [0, 2, 1]> (q8)
        c16 = Conv <strides = [16, 16], pads = [0, 0, 0, 8]> (image, wc16, bc16)
        g16 = Sigmoid (c16)
        r16 = Reshape (g16, flat_c)
        s16 = Transpose <perm = [0, 2, 1]> (r16)
        d16 = Conv <strides = [16, 16], pads = [0, 0, 0, 8]> (image, wb16, bb16)
        q16 = Reshape (d16, flat_b)
        b16 = Transpose <perm = [0, 2, 1]> (q16)
    }
    """
    a8, a16 = (int(np.prod(level_shape(st, size))) for st in (8, 16))
    for key, v in (("H", size[0]), ("W", size[1]), ("A8", a8), ("A16", a16)):
        text = text.replace(key, str(v))
    weights = {"flat_c": np.array([0, 2, -1], np.int64),
               "flat_b": np.array([0, 16, -1], np.int64)}
    for s in (8, 16):
        weights[f"wc{s}"] = r.normal(0, 0.05, (2, 3, s, s)).astype(np.float32)
        weights[f"bc{s}"] = np.array([0.5, -0.5], np.float32)
        weights[f"wb{s}"] = r.normal(0, 0.05, (16, 3, s, s)).astype(np.float32)
        weights[f"bb{s}"] = r.normal(0, 1.0, 16).astype(np.float32)
    return _with_weights(text, weights)


def _model(size: tuple[int, int] = SIZE) -> object:
    return load_proto(picodet_like(size=size), "pico")


def test_the_layout_reads_the_levels_and_the_input_size() -> None:
    task, notes = layout_tasks(_model(), (parse_layout(LAYOUT),), "d.npz")
    layout = task.layout
    assert (layout.dfl, layout.grid, layout.input_size) == (4, (8, 16), SIZE)
    assert layout.outputs("b8") == ("b8", "b16", "s8", "s16")
    said = " ".join(notes)
    assert "4 box sides x 4 bins" in said and "pooled with levels 'b16'" in said
    assert "grid of strides 8/16 of the 16x24 input" in said
    assert "SSD" not in said  # no level is named fidelity-only or an SSD's heads


@pytest.mark.parametrize(("layout", "said"), [
    ("b8=detect:axis=2,dfl=x,grid=8/16", "dfl 'x' is not a whole number of 2 or more"),
    ("b8=detect:axis=2,dfl=4,scores_from=s8", "give its strides with it"),
    ("b8=detect:axis=2,dfl=4,grid=8,boxes=0-3,scores_from=s8", "must be 4 sides x 4 bins = 16"),
    ("b8=detect:axis=2,centre=0.5,grid=8", "give dfl=BINS with it"),
    ("b8=detect:axis=2,dfl=3,grid=8,scores_from=s8", "not 4 sides x 3 bins (12): give dfl=4"),
    ("b8=detect:dfl=4,grid=8,scores_from=s8", "give axis=2, the axis they differ on"),
    ("b8=detect:axis=2,dfl=4,grid=8/16,levels=b32,scores_from=s8", "levels 'b32' is no other"),
    ("b8=detect:axis=2,dfl=4,grid=8/16,levels=b16,scores_from=s8",
     "scores_from names 1 output(s), the head has 2 level(s)"),
    ("b8=detect:axis=2,dfl=4,grid=8/16/32,levels=b16,scores_from=s8+s16",
     "gives 3 stride(s), the head 2 level output(s)"),
    ("b8=detect:axis=2,dfl=4,grid=16/8,levels=b16,scores_from=s8+s16",
     "6 anchors are not the grid of a 16x24 input on those strides (1x2 cells)"),
    ("b8=detect:axis=2,dfl=4,grid=8/16,levels=b16,scores_from=s16+s8",
     "scores_from 's16' has shape ('?', 2, 2), output 'b8' ('?', 6, 16)"),
])
def test_bad_dfl_layouts_are_one_line(layout: str, said: str) -> None:
    from quantscope.tasks.layout import LayoutError

    with pytest.raises(LayoutError) as e:
        layout_tasks(_model(), (parse_layout(layout),), "d.npz")
    assert said in str(e.value) and "\n" not in str(e.value)


def test_evaluate_scores_the_pooled_detections(tmp_path, capsys) -> None:
    m, x, s, j = (tmp_path / n for n in ("m.onnx", "x.npy", "s.npz", "r.json"))
    onnx.save(picodet_like(), m)
    np.save(x, np.random.default_rng(5).uniform(-2, 2, (8, 3, 16, 24)).astype(np.float32))
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(s)]) == 0, \
        capsys.readouterr().err
    assert main(["evaluate", str(m), "--data", str(x), "--stats", str(s), "--precision",
                 "a8_w8", "--layout", LAYOUT, "--json", str(j)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "pooled with levels 'b16'" in out
    metrics = json.loads(j.read_text())["metrics"]
    assert metrics["detections_fp32"] > 0 and 0.0 <= metrics["detection_f1"] <= 1.0
    bad = LAYOUT.replace("grid=8/16", "grid=8/32")
    assert main(["evaluate", str(m), "--data", str(x), "--stats", str(s), "--precision",
                 "a8_w8", "--layout", bad]) == 2
    err = [e for e in capsys.readouterr().err.splitlines() if e.strip()]
    assert len(err) == 1 and "grid=8/32" in err[0]


def test_an_undeclared_dfl_head_is_named_with_its_pooled_layout() -> None:
    """PicoDet's level outputs had been named as four SSD pairs (with ``anchors=``, wrong
    for a grid head); now one note names the pooled ``dfl=`` layout, which reads them."""
    _, notes = layout_tasks(_model((32, 48)), (), "d.npz")  # 24 anchors at stride 8
    said = [n for n in notes if "dfl=" in n]
    assert len(said) == 1 and "SSD" not in " ".join(notes)
    layout = said[0].split("--layout ")[1].split(" ")[0]
    assert layout == "b8=detect:axis=2,dfl=4,grid=8/16,levels=b16,scores_from=s8+s16"
    task, _ = layout_tasks(_model((32, 48)), (parse_layout(layout),), "d.npz")
    assert task.layout.levels == ("b16",) and task.layout.score_levels == ("s16",)
    _, declared = layout_tasks(_model(), (parse_layout(layout),), "d.npz")
    assert not [n for n in declared if "dfl=" in n and "--layout b8" in n]


def test_a_one_output_dfl_head_reads_its_scores_after_the_bins() -> None:
    """YOLOv8 exported undecoded: ``[N, 4 x 16 + C, A]`` of all levels in one output. With
    no image input the grid is a square input's (20 anchors: 32 px at strides 8, 16)."""
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["output"], name="id")], "det",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4 * BINS + 2, 20])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 4 * BINS + 2, 20])])
    model = load_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), "m")
    task, _ = layout_tasks(model, (parse_layout("output=detect:dfl=4,grid=8/16"),), "d.npz")
    layout = task.layout
    assert (layout.axis, layout.boxes, layout.scores, layout.input_size) == (
        1, (0, 16), (16, None), None)
    raw = np.zeros((1, 4 * BINS + 2, 20))
    raw[0, :16, 17] = _one_hot([1, 1, 1, 1])  # stride 16, row 0, column 1: point (24, 8)
    raw[0, 17, 17] = 0.9
    boxes, scores = split_rows(raw, layout)
    assert np.allclose(boxes[0, 17], [8, -8, 40, 24]) and scores[0, 17].tolist() == [0, 0.9]


def test_levels_declared_one_by_one_get_no_pooled_hint_for_the_rest() -> None:
    """Level 8 declared alone: level 16 is fidelity-only, said by the unscored note; no
    pooled layout of level 16 alone is offered, nor an SSD pair."""
    one = parse_layout("b8=detect:axis=2,dfl=4,grid=8,scores_from=s8")
    task, notes = layout_tasks(_model((32, 48)), (one,), "d.npz")
    assert task.layout.grid == (8,) and not task.layout.levels
    said = " ".join(notes)
    assert "dfl=4,grid=16" not in said and "SSD" not in said
    assert "'b16'" in said and "scored for fidelity only" in said


def test_a_level_declared_twice_is_one_line() -> None:
    from quantscope.tasks.layout import LayoutError

    for other in ("b16=tensor", "s16=detect:axis=2,dfl=4,grid=16,levels=b16"):
        with pytest.raises(LayoutError, match="levels 'b16' is declared by another --layout"):
            layout_tasks(_model(), (parse_layout(LAYOUT), parse_layout(other)), "d.npz")
