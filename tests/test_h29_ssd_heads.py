"""An SSD's two heads (MediaPipe's BlazeFace: ``regressors [N, A, 16]`` box offsets to
anchors, ``classificators [N, A, 1]`` logits) scored as detections: ``--layout
regressors=detect:axis=2,scores_from=classificators,anchors=CENTRES.npy,threshold=0``.

Before h29 no ``--layout`` gave such a model a detection figure: ``detect`` read boxes and
scores from one output only, and took boxes as decoded (offsets of far-apart anchors all sit
near 0, so NMS merged them)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from evaluate_cli import assert_layout_refused
from tiny_models import _rng, _with_weights

from quantscope.cli import main
from quantscope.tasks.detection import DetectionLayout, DetectionTask
from quantscope.types import Outputs

ANCHORS = 16  # a 4 x 4 grid, one anchor per cell


def ssd_two_heads(seed: int = 29) -> onnx.ModelProto:
    """Conv trunk (stride 2) -> two 1x1 heads, each moved anchors-first (NHWC, as a tflite
    conversion writes it): ``regressors [N, 16, 6]`` (cx, cy, w, h offsets + one key point)
    and ``classificators [N, 16, 1]`` (logits, one anchor biased far negative: the
    -200-logit tail of BlazeFace's)."""
    r = _rng(seed)
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    ssd (float[N, 3, 8, 8] input) => (float[N, 16, 6] regressors, float[N, 16, 1] classificators) {
        c1 = Conv <pads = [1, 1, 1, 1], strides = [2, 2]> (input, w1, b1)
        r1 = Relu (c1)
        cr = Conv (r1, wr, br)
        tr = Transpose <perm = [0, 2, 3, 1]> (cr)
        regressors = Reshape (tr, shape_r)
        cc = Conv (r1, wc, bc)
        tc = Transpose <perm = [0, 2, 3, 1]> (cc)
        classificators = Reshape (tc, shape_c)
    }
    """
    bc = np.zeros(1, np.float32)
    return _with_weights(text, {
        "w1": r.normal(0, 0.5, (8, 3, 3, 3)).astype(np.float32),
        "b1": r.normal(0, 0.1, 8).astype(np.float32),
        "wr": r.normal(0, 0.5, (6, 8, 1, 1)).astype(np.float32),
        "br": np.array([0, 0, 8, 8, 0, 0], np.float32),
        "shape_r": np.array([0, -1, 6], np.int64),
        "wc": r.normal(0, 1.0, (1, 8, 1, 1)).astype(np.float32),
        "bc": bc,
        "shape_c": np.array([0, -1, 1], np.int64),
    })


def _centres(spacing: float = 10.0) -> np.ndarray:
    g = np.arange(4) * spacing + spacing / 2
    return np.stack(np.meshgrid(g, g), axis=-1).reshape(-1, 2).astype(np.float32)


def _two(boxes: np.ndarray, logits: np.ndarray) -> Outputs:
    return Outputs(names=("reg", "cls"), batches=((boxes[None].astype(np.float32),
                                                   logits[None].astype(np.float32)),))


def test_scores_from_another_output_with_anchors(tmp_path):
    """Two anchors 45 px apart, each with the offsets (0, 0, 10, 10) and a positive logit:
    decoded they are two faces; read as decoded they are one box (NMS keeps one)."""
    np.save(tmp_path / "a.npy", np.array([[5.0, 5.0], [50.0, 50.0]]))
    boxes = np.array([[0.0, 0, 10, 10], [0.0, 0, 10, 10]])
    ref = _two(boxes, np.array([[2.0], [1.0]]))
    test = _two(boxes, np.array([[2.0], [-1.0]]))  # the second face's logit crosses 0
    layout = DetectionLayout(axis=2, scores=(0, None), threshold=0.0, scores_output="cls",
                             anchors=str(tmp_path / "a.npy"))
    task = DetectionTask(name="d", output="reg", layout=layout)
    m = task.metrics(ref, test).values
    assert (m["detections_fp32"], m["detections_quantized"]) == (2, 1)
    assert m["detection_recall"] == pytest.approx(0.5) and m["detection_precision"] == 1.0
    undecoded = DetectionTask(name="d", output="reg", layout=DetectionLayout(
        axis=2, scores=(0, None), threshold=0.0, scores_output="cls"))
    assert undecoded.metrics(ref, test).values["detections_fp32"] == 1  # merged by NMS


@pytest.fixture(scope="module")
def ssd(tmp_path_factory):
    d = tmp_path_factory.mktemp("ssd")
    onnx.save(ssd_two_heads(), d / "ssd.onnx")
    np.savez(d / "ssd.npz", input=np.random.default_rng(0).random((24, 3, 8, 8), np.float32))
    np.save(d / "anchors.npy", _centres())
    assert main(["calibrate", str(d / "ssd.onnx"), "--data", str(d / "ssd.npz"),
                 "--out", str(d / "stats.npz")]) == 0
    return d


def test_ssd_heads_scored_as_detections_on_the_cli(ssd, capsys):
    layout = (f"regressors=detect:axis=2,scores_from=classificators,"
              f"anchors={ssd / 'anchors.npy'},threshold=0")
    code = main(["evaluate", str(ssd / "ssd.onnx"), "--data", str(ssd / "ssd.npz"),
                 "--stats", str(ssd / "stats.npz"), "--precision", "a8_w8",
                 "--layout", layout, "--json", str(ssd / "r.json")])
    out = capsys.readouterr().out
    assert code == 0
    assert ("output 'regressors' read as 4 box rows (cxcywh) + 1 class rows of output "
            "'classificators' on axis 2, box centres offset by the anchor centres of") in out
    # the key point rows are no part of the detections: said, not silently dropped
    assert "NMS/match IoU 0.5; rows 4-5 not read (key points, ids: scored for fidelity only)" \
        in out
    m = json.loads((ssd / "r.json").read_text())["metrics"]
    assert m["detections_fp32"] > 24  # several anchors per sample above logit 0
    assert 0.0 <= m["detection_f1"] <= 1.0 and "box_iou_mean" in m


@pytest.mark.parametrize(("layout", "needle"), [
    ("regressors=detect:axis=2,scores_from=nope",
     "scores_from 'nope' is no other output of the model (outputs: classificators)"),
    ("regressors=detect:axis=2,scores_from=regressors", "is no other output"),
    ("regressors=detect:axis=1,scores_from=classificators",
     "the two must differ only on the row axis 1 (one score row set per anchor)"),
    ("regressors=detect:scores_from=classificators",
     "the two must differ only on the row axis 1 (one score row set per anchor): give axis=2, "
     "the axis they differ on"),
    ("regressors=detect:axis=2,scores_from=classificators,scores=1-2",
     "scores_from 'classificators' has 1 rows on axis 2"),
    ("regressors=detect:axis=2,scores_from=classificators,anchors=BAD8",
     "anchors", ),
    ("regressors=detect:axis=2,scores_from=classificators,anchors=MISSING",
     "anchors '{missing}' is no regular file: give the .npy file of the anchor centres"),
    ("regressors=detect:axis=2,scores_from=classificators,anchors=NOTNPY",
     "cannot be read as an .npy array"),
])
def test_bad_ssd_layout_is_one_line(ssd, capsys, layout, needle):
    np.save(ssd / "bad8.npy", _centres()[:8])
    (ssd / "notnpy.npy").write_text("not an array")
    layout = layout.replace("BAD8", str(ssd / "bad8.npy")).replace(
        "MISSING", str(ssd / "missing.npy")).replace("NOTNPY", str(ssd / "notnpy.npy"))
    needle = needle.replace("{missing}", str(ssd / "missing.npy"))
    if "BAD8" not in needle and "bad8" in layout:
        needle = "holds 8 centres, output 'regressors' 16 anchors: give one centre per anchor"
    assert_layout_refused(capsys, ssd, "ssd.onnx", "ssd.npz", layout, needle)


def test_undeclared_ssd_heads_are_said_to_be_fidelity_only(ssd, capsys):
    """Not read as detections unasked (the rows' meaning is the user's), but said: which
    outputs, and the layout that scores them."""
    main(["evaluate", str(ssd / "ssd.onnx"), "--data", str(ssd / "ssd.npz"),
          "--stats", str(ssd / "stats.npz"), "--precision", "a8_w8", "--json",
          str(ssd / "plain.json")])
    capsys.readouterr()
    notes = json.loads((ssd / "plain.json").read_text())["notes"]
    hint = ("outputs 'regressors' [?, 16, 6] and 'classificators' [?, 16, 1] hold rows for "
            "the same 16 anchors: if they are an SSD's boxes and scores, --layout "
            "regressors=detect:axis=2,scores_from=classificators")
    assert any(hint in n and "scored for fidelity only" in n for n in notes), notes
    main(["evaluate", str(ssd / "ssd.onnx"), "--data", str(ssd / "ssd.npz"),
          "--stats", str(ssd / "stats.npz"), "--precision", "a8_w8", "--layout",
          "regressors=detect:axis=2,scores_from=classificators", "--json",
          str(ssd / "declared.json")])
    capsys.readouterr()
    notes = json.loads((ssd / "declared.json").read_text())["notes"]
    assert not any("hold rows for the same" in n for n in notes)


def test_nhwc_images_for_the_converted_nchw_input_name_the_transpose(ssd, capsys):
    """A TFLite user's images are NHWC; tflite2onnx's model takes NCHW. The refusal said
    'pad or crop the data to the model's size', which cannot fix it."""
    x = np.random.default_rng(1).random((6, 8, 8, 3), np.float32)
    np.savez(ssd / "nhwc.npz", input=x)
    code = main(["calibrate", str(ssd / "ssd.onnx"), "--data", str(ssd / "nhwc.npz"),
                 "--out", str(ssd / "nhwc_stats.npz")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and not (ssd / "nhwc_stats.npz").exists()
    assert "its axes are the model's in another order" in err[0]
    assert "np.transpose(x, (0, 3, 1, 2))" in err[0] and "pad or crop" not in err[0]


def test_anchors_first_output_on_the_default_axis_names_axis_2(ssd, capsys):
    """``[N, 16, 6]`` declared ``detect`` without ``axis=`` is read as 16 rows for 6
    anchors (12 class rows): scored, as declared, with a note naming axis=2."""
    main(["evaluate", str(ssd / "ssd.onnx"), "--data", str(ssd / "ssd.npz"),
          "--stats", str(ssd / "stats.npz"), "--precision", "a8_w8", "--layout",
          "regressors=detect", "--json", str(ssd / "axis1.json")])
    capsys.readouterr()
    notes = json.loads((ssd / "axis1.json").read_text())["notes"]
    assert any("read with 16 rows on axis 1 for 6 anchors (the default axis): if its anchors "
               "come first" in n and "give axis=2" in n for n in notes), notes


@pytest.mark.parametrize("data", ["faces", "photos"])
def test_builtin_image_data_on_a_detector_names_tensor_data(ssd, capsys, data):
    """A face detector given ``--data faces`` was told only the chip sizes an embedder
    takes (150 or 112), and ``--data photos`` to use another model: neither fix is the
    user's; the line now names tensor data with --layout."""
    code = main(["calibrate", str(ssd / "ssd.onnx"), "--data", data,
                 "--out", str(ssd / f"{data}_stats.npz")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and not (ssd / f"{data}_stats.npz").exists()
    assert "quantscope images FOLDER --model MODEL" in err[0] and "--layout" in err[0]


def test_a_detector_at_a_face_chip_size_is_refused_on_face_data(tmp_path, capsys):
    """At 112 px (arcface's chip) a detector given ``--data faces`` was scored as face
    verification, its [N, 3136, 6] boxes flattened into an 'embedding': TAR, EER and
    'resembles FP32' of nothing the user has."""
    m = ssd_two_heads()
    dims = m.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_value = dims[3].dim_value = 112
    for o in m.graph.output:
        o.type.tensor_type.shape.dim[1].dim_value = 56 * 56
    onnx.save(m, tmp_path / "ssd112.onnx")
    code = main(["calibrate", str(tmp_path / "ssd112.onnx"), "--data", "faces",
                 "--out", str(tmp_path / "s.npz")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and not (tmp_path / "s.npz").exists()
    assert "the model's first output 'regressors' [?, 3136, 6] is no embedding [N, D]" in err[0]
