"""``quantscope images``: a folder of images -> tensor data by a declared preprocessing
(:mod:`quantscope.tasks.pixels`), on tiny conv models built here."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from quantscope.cli import main
from quantscope.model.load import load
from quantscope.tasks.pixels import images_to_arrays, parse_pixels, pixels_note
from quantscope.types import QuantscopeError


def conv_model(path: Path, shape: list, *, channels_last: bool = False,
               elem: int = TensorProto.FLOAT, inputs: int = 1) -> Path:
    c = shape[3] if channels_last else shape[1]
    nodes, x = [], "x"
    if elem != TensorProto.FLOAT:
        nodes.append(helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT))
        x = "xf"
    if channels_last:
        nodes.append(helper.make_node("Transpose", [x], ["xt"], perm=[0, 3, 1, 2]))
        x = "xt"
    nodes.append(helper.make_node("Conv", [x, "w"], ["c"], pads=[1, 1, 1, 1]))
    nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    ins = [helper.make_tensor_value_info("x", elem, shape)]
    if inputs == 2:
        ins.append(helper.make_tensor_value_info("scale", TensorProto.FLOAT, [1]))
        nodes[-1] = helper.make_node("Mul", ["c", "scale"], ["y"])
    w = np.random.default_rng(0).standard_normal((4, c, 3, 3)).astype(np.float32)
    g = helper.make_graph(nodes, "g", ins,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, "h", "w"])],
                          [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def solid(folder: Path, name: str, rgb: tuple[int, int, int], size=(8, 4)) -> Path:
    folder.mkdir(exist_ok=True)
    p = folder / name
    Image.new("RGB", size, rgb).save(p)
    return p


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_nchw_scale_and_mean_std_per_channel(tmp_path):
    m = load(conv_model(tmp_path / "m.onnx", ["N", 3, 6, 6]))
    solid(tmp_path / "i", "a.png", (255, 0, 102), size=(6, 6))
    made = images_to_arrays(tmp_path / "i", m, parse_pixels(
        "scale=255,mean=0.5/0.25/0.2,std=0.5/0.25/0.4"))
    a = made.arrays["x"]
    assert a.shape == (1, 3, 6, 6) and a.dtype == np.float32
    np.testing.assert_allclose(a[0, :, 0, 0], [(1 - 0.5) / 0.5, (0 - 0.25) / 0.25,
                                               (0.4 - 0.2) / 0.4], atol=1e-6)
    assert "x / 255" in made.description and "RGB" in made.description


def test_nhwc_bgr_and_letterbox_pad(tmp_path):
    m = load(conv_model(tmp_path / "m.onnx", [1, 8, 8, 3], channels_last=True))
    solid(tmp_path / "i", "a.png", (10, 20, 30), size=(8, 4))  # wide: padded below
    a = images_to_arrays(tmp_path / "i", m, parse_pixels("bgr,resize=letterbox,pad=7")
                         ).arrays["x"]
    assert a.shape == (1, 8, 8, 3)
    np.testing.assert_array_equal(a[0, 0, 0], [30, 20, 10])  # BGR, raw values (no scale)
    np.testing.assert_array_equal(a[0, 7, 0], [7, 7, 7])  # the letterbox pad below


def test_crop_keeps_the_centre(tmp_path):
    m = load(conv_model(tmp_path / "m.onnx", ["N", 3, 4, 4]))
    img = np.zeros((4, 12, 3), np.uint8)
    img[:, 4:8] = 200  # the middle third of a wide image
    (tmp_path / "i").mkdir()
    Image.fromarray(img).save(tmp_path / "i" / "a.png")
    a = images_to_arrays(tmp_path / "i", m, parse_pixels("resize=crop")).arrays["x"]
    assert a.shape == (1, 3, 4, 4)
    assert a[0, :, :, 1:3].min() >= 150  # the centre is the bright stripe


def test_exif_orientation_is_applied(tmp_path):
    m = load(conv_model(tmp_path / "m.onnx", ["N", 3, 40, 40]))
    (tmp_path / "i").mkdir()
    img = Image.new("RGB", (20, 10), (250, 250, 250))  # stored wide ...
    exif = img.getexif()
    exif[0x0112] = 6  # ... shown rotated 90°: 10 wide, 20 tall
    img.save(tmp_path / "i" / "a.jpg", exif=exif, quality=95)
    a = images_to_arrays(tmp_path / "i", m, parse_pixels("resize=letterbox,pad=0")
                         ).arrays["x"]
    assert a[0, :, :, :18].mean() > 200  # upright: the image's 20 columns on the left
    assert a[0, :, :, 22:].max() == 0  # the pad on the right, not below


def test_uint8_input_takes_raw_pixels(tmp_path):
    m = load(conv_model(tmp_path / "m.onnx", ["N", 3, 4, 4], elem=TensorProto.UINT8))
    solid(tmp_path / "i", "a.png", (1, 2, 3), size=(4, 4))
    with pytest.raises(QuantscopeError, match="uint8 pixels .*--pixels raw"):
        images_to_arrays(tmp_path / "i", m, parse_pixels("scale=255"))
    a = images_to_arrays(tmp_path / "i", m, parse_pixels("raw")).arrays["x"]
    assert a.dtype == np.uint8 and a[0, :, 0, 0].tolist() == [1, 2, 3]


def test_grey_input(tmp_path):
    m = load(conv_model(tmp_path / "m.onnx", ["N", 1, 5, 5]))
    solid(tmp_path / "i", "a.png", (255, 255, 255), size=(5, 5))
    a = images_to_arrays(tmp_path / "i", m, parse_pixels("scale=255")).arrays["x"]
    assert a.shape == (1, 1, 5, 5) and np.allclose(a, 1.0)
    with pytest.raises(QuantscopeError, match="1 channel"):
        images_to_arrays(tmp_path / "i", m, parse_pixels("mean=1/2/3"))


@pytest.mark.parametrize("spec, match", [
    ("scale=0", "above 0"), ("mean=1/2", "one number or three"), ("std=0", "divide by zero"),
    ("resize=fit", "stretch, letterbox, crop"), ("raw,scale=255", "leave out"),
    ("gamma=2", "not understood"), ("pad=300", "0..255")])
def test_bad_pixels_specs(spec, match):
    with pytest.raises(QuantscopeError, match=match):
        parse_pixels(spec)


def test_inputs_the_images_cannot_fill(tmp_path):
    sym = load(conv_model(tmp_path / "s.onnx", ["N", 3, "H", "W"]))
    solid(tmp_path / "i", "a.png", (1, 2, 3))
    with pytest.raises(QuantscopeError, match=r"--input-shape x=1x3x640x640"):
        images_to_arrays(tmp_path / "i", sym, parse_pixels("raw"))
    a = images_to_arrays(tmp_path / "i", sym, parse_pixels("raw"),
                         shapes={"x": (1, 3, 6, 10)}).arrays["x"]
    assert a.shape == (1, 3, 6, 10)
    two = load(conv_model(tmp_path / "t.onnx", ["N", 3, 4, 4], inputs=2))
    with pytest.raises(QuantscopeError, match="inputs besides 'x' \\(scale\\)"):
        images_to_arrays(tmp_path / "i", two, parse_pixels("raw"))


def test_folders_without_images(tmp_path):
    m = load(conv_model(tmp_path / "m.onnx", ["N", 3, 4, 4]))
    (tmp_path / "empty").mkdir()
    with pytest.raises(QuantscopeError, match="has no images"):
        images_to_arrays(tmp_path / "empty", m, parse_pixels("raw"))
    (tmp_path / "ids").mkdir()
    solid(tmp_path / "ids" / "alice", "a.png", (1, 1, 1))
    with pytest.raises(QuantscopeError, match="only sub-folders"):
        images_to_arrays(tmp_path / "ids", m, parse_pixels("raw"))


def test_cli_end_to_end_and_inputs_untouched(tmp_path, capsys):
    model = conv_model(tmp_path / "m.onnx", [1, 3, 8, 8])  # static: one sample per run
    imgs = tmp_path / "imgs"
    rng = np.random.default_rng(1)
    imgs.mkdir()
    for i in range(6):
        Image.fromarray(rng.integers(0, 256, (10 + i, 12, 3), dtype=np.uint8)).save(
            imgs / f"p{i}.png")
    before, model_bytes = digest(imgs), model.read_bytes()
    out = tmp_path / "d.npz"
    assert main(["images", str(imgs), "--model", str(model), "--pixels", "scale=255",
                 "--limit", "5", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "5 image(s)" in said and "[5, 3, 8, 8] float32" in said
    assert np.load(out)["x"].shape == (5, 3, 8, 8)
    record = json.loads((tmp_path / "d.pixels.json").read_text())
    assert [r["file"] for r in record["images"]] == [f"p{i}.png" for i in range(5)]
    assert digest(imgs) == before and model.read_bytes() == model_bytes
    note = pixels_note(out)
    assert note and "5 image(s)" in note and "x / 255" in note
    stats = tmp_path / "s.npz"
    assert main(["calibrate", str(model), "--data", str(out), "--out", str(stats)]) == 0
    res = tmp_path / "e.json"
    assert main(["evaluate", str(model), "--data", str(out), "--stats", str(stats),
                 "--precision", "a8_w8", "--json", str(res)]) == 0
    assert "made by 'quantscope images'" in res.read_text()


def test_cli_refusals_write_nothing(tmp_path, capsys):
    model = conv_model(tmp_path / "m.onnx", ["N", 3, 8, 8])
    imgs = tmp_path / "imgs"
    solid(imgs, "a.png", (1, 2, 3))
    (imgs / "b.jpg").write_text("not an image")
    out = tmp_path / "d.npz"
    assert main(["images", str(imgs), "--model", str(model), "--pixels", "raw",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "b.jpg" in err and "cannot be read" in err and "Traceback" not in err
    assert not out.exists() and not (tmp_path / "d.pixels.json").exists()
    assert main(["images", str(imgs), "--model", str(model), "--pixels", "gamma=2",
                 "--out", str(out)]) == 2
    assert "not understood" in capsys.readouterr().err
    # a folder of images given as --data says how to make tensors of it
    assert main(["calibrate", str(model), "--data", str(imgs), "--out",
                 str(tmp_path / "s.npz")]) == 2
    assert "quantscope images" in capsys.readouterr().err


def test_imagenet_spec_matches_the_vit_zoo_preprocessing(tmp_path):
    """The ImageNet --pixels spec the docs give reproduces the built-in ViT's own
    preprocessing (zoo.vit.preprocess_image) on 224x224 photos, to float rounding."""
    from quantscope.zoo.vit import MEAN, STD, preprocess_image

    m = load(conv_model(tmp_path / "m.onnx", ["N", 3, 224, 224]))
    rng = np.random.default_rng(3)
    photos = rng.integers(0, 256, (2, 224, 224, 3), dtype=np.uint8)
    (tmp_path / "i").mkdir()
    for k, p in enumerate(photos):
        Image.fromarray(p).save(tmp_path / "i" / f"{k}.png")
    spec = ("scale=255,mean=" + "/".join(map(str, MEAN)) + ",std=" + "/".join(map(str, STD)))
    a = images_to_arrays(tmp_path / "i", m, parse_pixels(spec)).arrays["x"]
    np.testing.assert_allclose(a, preprocess_image(photos), atol=1e-5)
