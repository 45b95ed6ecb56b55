"""Image-to-image models: a super-resolution-style net (Conv, DepthToSpace x2, pixels
0..255 out) and a matte (Sigmoid alpha map, 0..1).

A super-resolution output had no figure but per-channel cosine and SQNR of a 3-channel
picture; ``--layout OUT=image[:range=0-255]`` scores it by PSNR against FP32 over the
image's range, the figure an image engineer compares. A matte declared ``map`` was judged
only by its mask binarised at 0.5: the alpha's mean absolute error (what matting is
judged by) was not said."""

from __future__ import annotations

import json
import math

import numpy as np
import onnx
import pytest
from evaluate_cli import assert_layout_refused, evaluated
from tiny_models import _rng, _with_weights

from quantscope.cli import main
from quantscope.tasks.maps import MapTask
from quantscope.tasks.pictures import ImageTask, parse_range
from quantscope.types import Outputs


def upscaler(seed: int = 32) -> onnx.ModelProto:
    r = _rng(seed)
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    sr (float[N, 3, 8, 8] input) => (float[N, 3, 16, 16] image) {
        h = Conv <pads = [1, 1, 1, 1]> (input, w1, b1)
        a = Relu (h)
        s = Conv <pads = [1, 1, 1, 1]> (a, w2, b2)
        u = DepthToSpace <blocksize = 2, mode = "CRD"> (s)
        p = Sigmoid (u)
        image = Mul (p, k)
    }
    """
    return _with_weights(text, {
        "w1": r.normal(0, 0.4, (8, 3, 3, 3)).astype(np.float32),
        "b1": r.normal(0, 0.1, 8).astype(np.float32),
        "w2": r.normal(0, 0.4, (12, 8, 3, 3)).astype(np.float32),
        "b2": np.zeros(12, np.float32),
        "k": np.array(255.0, np.float32),
    })


@pytest.fixture(scope="module")
def sr(tmp_path_factory):
    d = tmp_path_factory.mktemp("sr")
    onnx.save(upscaler(), d / "sr.onnx")
    np.savez(d / "x.npz", input=np.random.default_rng(0).uniform(0, 1, (16, 3, 8, 8)).astype(
        np.float32))
    assert main(["calibrate", str(d / "sr.onnx"), "--data", str(d / "x.npz"),
                 "--out", str(d / "stats.npz")]) == 0
    return d


def _evaluate(d, capsys, *extra: str) -> dict:
    return evaluated(capsys, d, "sr.onnx", "x.npz", *extra)


def _out(a: np.ndarray, name: str = "y") -> Outputs:
    return Outputs(names=(name,), batches=((a.astype(np.float32),),))


def test_image_task_psnr_is_over_the_declared_peak():
    ref = np.zeros((2, 3, 4, 4))
    ref[1] = 100.0
    test = ref.copy()
    test[0] += 2.55  # sample 0 off by 2.55 levels everywhere, sample 1 exact
    m = ImageTask(name="i", output="y", range=(0.0, 255.0)).metrics(_out(ref), _out(test))
    v = m.values
    mse = 2.55 ** 2 / 2  # over both samples
    assert v["psnr_db"] == pytest.approx(10 * math.log10(255 ** 2 / mse), abs=1e-3)
    assert v["psnr_min_db"] == pytest.approx(40.0, abs=1e-3)  # 20 log10(255 / 2.55)
    assert v["image_abs_error_mean"] == pytest.approx(2.55 / 2, rel=1e-5)
    assert v["image_abs_error_max"] == pytest.approx(2.55, rel=1e-5)
    assert v["image_outside_share"] == 0.0 and not any("NOT LIKE" in n for n in m.notes)


def test_image_task_says_its_default_range_and_values_outside_a_declared_one():
    ref = np.linspace(0.0, 2.0, 32).reshape(1, 2, 4, 4)
    test = ref + 0.1
    m = ImageTask(name="i", output="y").metrics(_out(ref), _out(test))
    assert m.values["psnr_db"] == pytest.approx(20 * math.log10(2.0 / 0.1), abs=1e-3)
    assert any("PSNR over FP32's own range 0..2 on this data" in n for n in m.notes), m.notes
    assert any("NOT LIKE FP32: output 'y' PSNR 26.0 dB < 30 dB" in n for n in m.notes), m.notes
    d = ImageTask(name="i", output="y", range=(0.0, 1.0)).metrics(_out(ref), _out(test))
    assert d.values["image_outside_share"] == pytest.approx(0.5, abs=0.04)
    assert any("outside the declared range 0..1" in n for n in d.notes), d.notes


def test_map_says_the_mattes_mean_absolute_error():
    ref = np.full((2, 1, 4, 4), 0.2)
    ref[:, :, :2] = 0.9  # half foreground
    test = ref + 0.1  # every alpha 0.1 off: no value crosses 0.5
    m = MapTask(name="m", output="y").metrics(_out(ref), _out(test)).values
    assert m["mask_iou"] == 1.0
    assert m["map_abs_error_mean"] == pytest.approx(0.1, rel=1e-5)
    assert m["map_abs_error_max"] == pytest.approx(0.1, rel=1e-5)


def test_upscaler_declared_image_is_scored_by_psnr_on_the_cli(sr, capsys):
    r = _evaluate(sr, capsys, "--layout", "image=image:range=0-255")
    m = r["metrics"]
    assert 10.0 < m["psnr_db"] < 80.0 and m["psnr_min_db"] <= m["psnr_db"]
    assert 0.0 < m["image_abs_error_mean"] <= m["image_abs_error_max"] <= 255.0
    assert any("output 'image' read as an image, judged by PSNR and SSIM against FP32 over its "
               "range 0..255" in n for n in r["notes"]), r["notes"]
    # the figure is the pixels' own: recomputed from the per-output SQNR would differ
    assert m["psnr_db"] != pytest.approx(r["outputs"]["image"]["sqnr_db"], abs=0.5)


def test_upscaler_default_range_is_said(sr, capsys):
    r = _evaluate(sr, capsys, "--layout", "image=image")
    assert any("PSNR over FP32's own range" in n and "range=0-255 for 8-bit pixels" in n
               for n in r["notes"]), r["notes"]


@pytest.mark.parametrize(("layout", "needle"), [
    ("image=image:range=255-0", "range '255-0' is not LO-HI with LO < HI"),
    ("image=image:range=abc", "range 'abc' is not LO-HI"),
    ("image=image:threshold=1", "'threshold' is no key of kind image (keys: range)"),
])
def test_bad_image_layout_is_one_line(sr, capsys, layout, needle):
    assert_layout_refused(capsys, sr, "sr.onnx", "x.npz", layout, needle)


def test_parse_range_reads_negative_bounds():
    assert parse_range("-1-1") == (-1.0, 1.0)
    assert parse_range("0-255") == (0.0, 255.0)
    assert parse_range("1e-3-2") == (0.001, 2.0)


def test_undeclared_picture_output_is_said_to_be_judged_by_fidelity_alone(sr, capsys):
    r = _evaluate(sr, capsys)
    assert any("output 'image' [?x3x16x16] is shaped like a map or a picture and judged by "
               "fidelity alone" in n and "--layout image=map" in n and "image=image:range=LO-HI"
               in n for n in r["notes"]), r["notes"]
    declared = _evaluate(sr, capsys, "--layout", "image=tensor")
    assert not any("shaped like a map" in n for n in declared["notes"]), declared["notes"]


def test_a_sigmoid_matte_is_named_as_one():
    from quantscope.model.load import load_proto
    from quantscope.tasks.layout import layout_tasks

    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    matte (float[N, 3, 32, 32] input) => (float[N, 1, 32, 32] alpha, float[N, 8] feat) {
        h = Conv (input, w)
        alpha = Sigmoid (h)
        input8 = Concat <axis = 1> (input, input, h, h)
        feat = ReduceMean <axes = [2, 3], keepdims = 0> (input8)
    }
    """
    w = np.full((1, 3, 1, 1), 0.1, np.float32)
    task, notes = layout_tasks(load_proto(_with_weights(text, {"w": w}), "matte"), (), "x.npz")
    assert task is None
    hint = [n for n in notes if "shaped like a map" in n]
    assert len(hint) == 1 and "output 'alpha' [?x1x32x32] (Sigmoid) is shaped" in hint[0], notes
    assert "'feat'" not in hint[0]


def test_images_says_skipped_files_and_dropped_transparency(tmp_path, capsys):
    from PIL import Image

    folder = tmp_path / "photos"
    folder.mkdir()
    Image.new("RGB", (8, 8), (10, 20, 30)).save(folder / "a.png")
    cut = Image.new("RGBA", (8, 8), (0, 0, 0, 0))  # a cut-out: transparent, black under it
    cut.paste((200, 100, 50, 255), (2, 2, 6, 6))
    cut.save(folder / "b.png")
    Image.new("RGBA", (8, 8), (1, 2, 3, 255)).save(folder / "c.png")  # alpha, all opaque
    Image.new("RGB", (8, 8), (9, 9, 9)).save(folder / "d.gif")
    (folder / "notes.txt").write_text("x")
    onnx.save(upscaler(), tmp_path / "sr.onnx")
    code = main(["images", str(folder), "--model", str(tmp_path / "sr.onnx"), "--pixels",
                 "scale=255", "--input-shape", "input=1x3x8x8", "--out", str(tmp_path / "x.npz")])
    out = capsys.readouterr().out
    assert code == 0
    assert ("note: 2 file(s) of the folder skipped, not jpg/jpeg/png/bmp/webp/tif/tiff by "
            "their name: d.gif, notes.txt") in out, out
    assert "note: 1 image(s) have transparency, dropped" in out, out
    assert "(b.png: 75.00% of its pixels)" in out, out
    record = json.loads((tmp_path / "x.pixels.json").read_text())
    assert record["skipped"] == ["d.gif", "notes.txt"]
    assert record["transparency_dropped"] == ["b.png: 75.00% of its pixels"]


def test_two_image_outputs_keep_the_worst_of_each_figure():
    from quantscope.tasks.layout import OutputTasks

    ref = np.linspace(0.0, 1.0, 32).reshape(1, 2, 4, 4)
    a, b = ref.copy(), ref * 2.0  # 'b': FP32 half outside 0..1, quantized error larger
    ta, tb = a + 0.01, b + 0.1
    both = OutputTasks(name="o", tasks=(ImageTask(name="a", output="a", range=(0.0, 1.0)),
                                        ImageTask(name="b", output="b", range=(0.0, 1.0))),
                       headline="psnr_db")
    ref_out = Outputs(names=("a", "b"), batches=((a.astype(np.float32), b.astype(np.float32)),))
    test_out = Outputs(names=("a", "b"), batches=((ta.astype(np.float32),
                                                   tb.astype(np.float32)),))
    v = both.metrics(ref_out, test_out).values
    assert v["psnr_db"] == pytest.approx(v["psnr_db:b"]) and v["psnr_db:b"] < v["psnr_db:a"]
    assert v["image_abs_error_mean"] == pytest.approx(v["image_abs_error_mean:b"])
    assert v["image_outside_share"] == v["image_outside_share:b"] > 0.0  # the worst: most outside
