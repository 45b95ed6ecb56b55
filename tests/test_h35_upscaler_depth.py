"""A super-resolution net as a user brings it (UpscalerJS's ESRGAN: a TensorFlow.js model
converted by tf2onnx, NHWC in and out, pixels 0..255 that overshoot at edges) and a
relative depth map.

- ``image:range=0-255`` read an output FP32 overshoots (UpscalerJS's ESRGAN: -10..274 on
  the sample photos, 6.5 % of the values outside) over the unclipped values and told the
  user the range was not the image's, while the host clips the picture to 0..255: both
  images are now compared clipped, as shown, and the note says so;
- no SSIM beside the PSNR: ``ssim`` / ``ssim_min`` now, per channel plane, NHWC or NCHW;
- no scale-and-shift-invariant figure for a relative depth map: ``--layout OUT=depth``
  (AbsRel and delta < 1.25 after least-squares alignment), lower-is-better headline;
- ``--metric image_abs_error_mean`` (and ``map_abs_error_*``) were planned as
  higher-is-better figures.
"""

from __future__ import annotations

import json
import math

import numpy as np
import onnx
import pytest
from tiny_models import _rng, _with_weights

from quantscope.cli import main
from quantscope.tasks.depth import DepthTask
from quantscope.tasks.headline import describe_metric, headline_of
from quantscope.tasks.layout import OutputTasks
from quantscope.tasks.pictures import ImageTask, ssim
from quantscope.types import Outputs


def _out(a: np.ndarray, name: str = "y") -> Outputs:
    return Outputs(names=(name,), batches=((a.astype(np.float32),),))


def test_a_declared_range_compares_the_images_clipped_as_shown():
    ref = np.full((2, 3, 16, 16), 128.0)
    ref[:, :, :4] = 270.0  # FP32 overshoots white by 15 levels on a quarter of the pixels
    test = ref.copy()
    test[:, :, :4] = 262.0  # the quantized model overshoots less: both show 255 there
    test[:, :, 8:] += 1.0  # and is one level off on half the picture
    m = ImageTask(name="i", output="y", range=(0.0, 255.0)).metrics(_out(ref), _out(test))
    # only the visible error: 1 level on half the values (the 8 levels above 255 are not shown)
    assert m.values["psnr_db"] == pytest.approx(10 * math.log10(255 ** 2 / 0.5), abs=1e-3)
    assert m.values["image_abs_error_max"] == pytest.approx(1.0)
    assert m.values["image_outside_share"] == pytest.approx(0.25)
    note = next(n for n in m.notes if "outside the declared range" in n)
    assert "25.0% of FP32's values lie outside the declared range 0..255 (FP32 128..270): " \
        "both images are compared clipped to it, as the host shows them" in note, note
    assert "declare its range" not in note  # 0..255 is the picture's range: nothing to fix


def test_a_range_far_narrower_than_the_output_is_questioned():
    ref = np.linspace(0.0, 255.0, 2 * 3 * 16 * 16).reshape(2, 3, 16, 16)
    m = ImageTask(name="i", output="y", range=(0.0, 1.0)).metrics(_out(ref), _out(ref + 1))
    assert any("FP32 spans 255x the range: is it the image's? declare its range" in n
               for n in m.notes), m.notes


def test_ssim_is_wang_et_al_per_channel_plane_channels_first_or_last():
    r = np.random.default_rng(3)
    ref = r.uniform(0, 255, (2, 3, 24, 20))
    test = ref + r.normal(0, 12, ref.shape)
    s = ssim(ref, test, 255.0)
    assert s is not None and s.shape == (2,) and 0.5 < s.min() < s.max() < 1.0
    assert ssim(ref, ref, 255.0) == pytest.approx([1.0, 1.0])
    # an NHWC output (a TensorFlow export's) is read with its channels last
    nhwc = ssim(np.moveaxis(ref, 1, 3), np.moveaxis(test, 1, 3), 255.0)
    assert nhwc == pytest.approx(s)
    # one plane by hand: the Gaussian-weighted statistics at the one window position
    a, b = ref[0, 0, :11, :11], test[0, 0, :11, :11]
    x = np.arange(11) - 5.0
    g = np.exp(-x * x / 4.5)
    w = np.outer(g, g) / np.outer(g, g).sum()
    ma, mb = (w * a).sum(), (w * b).sum()
    va, vb = (w * a * a).sum() - ma ** 2, (w * b * b).sum() - mb ** 2
    cov = (w * a * b).sum() - ma * mb
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    want = (2 * ma * mb + c1) * (2 * cov + c2) / ((ma ** 2 + mb ** 2 + c1) * (va + vb + c2))
    got = ssim(a[None, None], b[None, None], 255.0)
    assert got is not None and got[0] == pytest.approx(want, rel=1e-9)


def test_ssim_matches_scikit_image():
    metrics = pytest.importorskip("skimage.metrics")
    r = np.random.default_rng(4)
    ref = r.uniform(0, 1, (1, 2, 32, 40))
    test = np.clip(ref + r.normal(0, 0.05, ref.shape), 0, 1)
    want = np.mean([metrics.structural_similarity(
        ref[0, c], test[0, c], data_range=1.0, gaussian_weights=True, sigma=1.5,
        use_sample_covariance=False) for c in range(2)])
    got = ssim(ref, test, 1.0)
    assert got is not None and got[0] == pytest.approx(want, rel=1e-9)


def test_image_task_reports_ssim_and_says_when_it_has_none():
    ref = np.random.default_rng(5).uniform(0, 255, (3, 32, 32, 3))
    m = ImageTask(name="i", output="y", range=(0.0, 255.0)).metrics(_out(ref), _out(ref + 2))
    assert 0.99 < m.values["ssim_min"] <= m.values["ssim"] < 1.0
    small = ImageTask(name="i", output="y").metrics(_out(ref[:, :8, :8]), _out(ref[:, :8, :8]))
    assert math.isnan(small.values["ssim"])
    assert any("no SSIM" in n and "11 values a side" in n for n in small.notes), small.notes


def test_depth_forgives_the_scale_and_shift_a_host_takes_away():
    r = np.random.default_rng(6)
    ref = r.uniform(1.0, 10.0, (4, 1, 16, 16))
    shifted = 1.1 * ref + 0.5  # what a gain and an offset do: nothing a normalising host sees
    d = DepthTask(name="d", output="y").metrics(_out(ref), _out(shifted)).values
    assert d["depth_abs_rel"] == pytest.approx(0.0, abs=1e-6) and d["depth_delta1"] == 1.0
    assert d["depth_invalid_share"] == 0.0
    img = ImageTask(name="i", output="y").metrics(_out(ref), _out(shifted)).values
    assert img["psnr_db"] < 20.0  # the PSNR over FP32's range reads the offset as error
    raw = DepthTask(name="d", output="y", align="none").metrics(_out(ref), _out(shifted))
    want = float(np.mean(np.abs(shifted - ref) / ref))
    assert raw.values["depth_abs_rel"] == pytest.approx(want, rel=1e-5)
    assert any("NOT LIKE FP32: output 'y' AbsRel" in n for n in raw.notes), raw.notes


def test_depth_abs_rel_and_delta_by_hand_and_invalid_pixels_said():
    ref = np.ones((2, 1, 4, 4))
    ref[0, 0, 0, 0] = 0.0  # one pixel FP32 puts at 0: no depth
    test = ref.copy()
    test[1, 0, 0, :2] = 1.5  # two pixels 50 % off on sample 1
    m = DepthTask(name="d", output="y", align="none").metrics(_out(ref), _out(test))
    v = m.values
    assert v["depth_abs_rel"] == pytest.approx((0.0 + 2 * 0.5 / 16) / 2)
    assert v["depth_abs_rel_max"] == pytest.approx(2 * 0.5 / 16)
    assert v["depth_delta1"] == pytest.approx(29 / 31)
    assert v["depth_invalid_share"] == pytest.approx(1 / 32)
    assert any("3.1% of FP32's values are 0 or less, not a depth: left out" in n
               for n in m.notes), m.notes


def test_depth_headline_is_lower_is_better_alone_and_first_of_several():
    task = DepthTask(name="d", output="y")
    head = headline_of(task)
    assert head.metric == "depth_abs_rel" and not head.higher_is_better
    assert head.reached(0.004, 0.005) and not head.reached(0.02, 0.005)
    both = OutputTasks(name="o", tasks=(task, DepthTask(name="e", output="z")),
                       headline="depth_abs_rel")
    assert not headline_of(both).higher_is_better
    ref = np.random.default_rng(7).uniform(1.0, 2.0, (2, 16))
    out = Outputs(names=("y", "z"), batches=((ref, ref),))
    noisy = Outputs(names=("y", "z"), batches=((ref * 1.001, ref + np.sin(ref) * 0.1),))
    v = both.metrics(out, noisy).values
    assert v["depth_abs_rel"] == v["depth_abs_rel:z"] > v["depth_abs_rel:y"]  # the worst: highest
    assert v["depth_delta1"] == min(v["depth_delta1:y"], v["depth_delta1:z"])


@pytest.mark.parametrize("metric", ["image_abs_error_mean", "image_abs_error_max",
                                    "map_abs_error_mean", "depth_abs_rel"])
def test_error_metrics_are_planned_lower_is_better(metric):
    assert not describe_metric(metric).higher_is_better
    assert describe_metric("ssim").goal_range == (-1.0, 1.0)


def nhwc_upscaler(seed: int = 35) -> onnx.ModelProto:
    """An NHWC super-resolution net as tf2onnx writes a Keras ESRGAN: Transpose in,
    Conv, LeakyRelu, PReLU, a nearest Resize whose sizes come from Shape, DepthToSpace,
    Transpose out; H and W symbolic; values 0..255 that overshoot."""
    r = _rng(seed)
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    sr (float[N, H, W, 3] lr) => (float[N, H2, W2, 3] hr) {
        x = Transpose <perm = [0, 3, 1, 2]> (lr)
        h = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
        a = LeakyRelu <alpha = 0.2> (h)
        g = Conv <pads = [1, 1, 1, 1]> (a, w2, b2)
        p = PRelu (g, slope)
        shp = Shape (p)
        hw = Slice (shp, two, four)
        hw2 = Mul (hw, k2)
        nc = Slice (shp, zero, two)
        size = Concat <axis = 0> (nc, hw2)
        u = Resize <mode = "nearest", coordinate_transformation_mode = "asymmetric"> (p, , , size)
        s = Conv <pads = [1, 1, 1, 1]> (u, w3, b3)
        d = DepthToSpace <blocksize = 2, mode = "DCR"> (s)
        hr = Transpose <perm = [0, 2, 3, 1]> (d)
    }
    """
    return _with_weights(text, {
        "w1": r.normal(0, 0.02, (8, 3, 3, 3)).astype(np.float32),
        "b1": r.normal(0, 0.1, 8).astype(np.float32),
        "w2": r.normal(0, 0.3, (8, 8, 3, 3)).astype(np.float32),
        "b2": np.zeros(8, np.float32),
        "slope": np.full((8, 1, 1), 0.1, np.float32),
        "w3": r.normal(0, 0.3, (12, 8, 3, 3)).astype(np.float32),
        "b3": np.full(12, 128.0, np.float32),
        "two": np.array([2], np.int64), "four": np.array([4], np.int64),
        "zero": np.array([0], np.int64), "k2": np.array([2, 2], np.int64),
    })


@pytest.fixture(scope="module")
def nhwc(tmp_path_factory):
    d = tmp_path_factory.mktemp("nhwc")
    onnx.save(nhwc_upscaler(), d / "sr.onnx")
    np.savez(d / "x.npz", lr=np.random.default_rng(1).uniform(0, 255, (6, 16, 16, 3)).astype(
        np.float32))
    assert main(["calibrate", str(d / "sr.onnx"), "--data", str(d / "x.npz"),
                 "--out", str(d / "stats.npz")]) == 0
    return d


def _evaluate(d, capsys, *extra: str) -> tuple[int, dict, str]:
    code = main(["evaluate", str(d / "sr.onnx"), "--data", str(d / "x.npz"),
                 "--stats", str(d / "stats.npz"), "--precision", "a8_w8",
                 "--json", str(d / "r.json"), *extra])
    out = capsys.readouterr()
    r = json.loads((d / "r.json").read_text()) if code == 0 else {}
    return code, r, out.out + out.err


def test_nhwc_upscaler_gets_psnr_and_ssim_on_the_cli(nhwc, capsys):
    code, r, text = _evaluate(nhwc, capsys, "--layout", "hr=image:range=0-255")
    assert code == 0, text
    m = r["metrics"]
    assert 20.0 < m["psnr_db"] < 80.0 and 0.0 < m["ssim_min"] <= m["ssim"] <= 1.0, m
    assert "ssim" in text and "Traceback" not in text
    code, r, text = _evaluate(nhwc, capsys, "--layout", "hr=depth")
    assert code == 0, text
    assert r["metrics"]["depth_abs_rel"] >= 0.0 and 0.0 < r["metrics"]["depth_delta1"] <= 1.0
    assert any("read as a relative depth map, judged by AbsRel and delta < 1.25 against FP32 "
               "after each quantized map's least-squares scale and shift" in n
               for n in r["notes"]), r["notes"]


def test_undeclared_picture_names_the_depth_kind_too(nhwc, capsys):
    code, r, _ = _evaluate(nhwc, capsys)
    hint = [n for n in r["notes"] if "shaped like a map or a picture" in n]
    assert code == 0 and len(hint) == 1 and "hr=depth" in hint[0] and "SSIM" in hint[0], hint


@pytest.mark.parametrize(("layout", "needle"), [
    ("hr=depth:align=log", "align 'log' is unknown: use affine, scale, none"),
    ("hr=depth:range=0-1", "'range' is no key of kind depth (keys: align)"),
    ("hr=dept", "unknown kind 'dept': use detect, map, score, class, points, ctc, image, "
                "depth, verify, pitch, embedding or tensor"),
])
def test_bad_depth_layout_is_one_line(nhwc, capsys, layout, needle):
    before = sorted(p.name for p in nhwc.iterdir())
    code, _, text = _evaluate(nhwc, capsys, "--layout", layout)
    lines = text.strip().splitlines()
    assert code != 0 and len(lines) == 1 and "Traceback" not in text, text
    assert needle in lines[0], lines[0]
    assert sorted(p.name for p in nhwc.iterdir()) == before



def test_a_value_just_under_the_goal_never_reads_as_the_goal():
    from quantscope.units import against

    # run's verdict on UpscalerJS's ESRGAN: 'goal psnr db >= 50.0 dB NOT reached ...: 50.0 dB'
    assert against("psnr_db", 49.958327, 50.0) == "49.96 dB"
    assert against("top1_agreement", 0.96996, 0.97) == "96.996 %"
    assert against("psnr_db", 47.8, 50.0) == "47.8 dB"  # already apart: as value() writes it
    assert against("psnr_db", 50.0, 50.0) == "50.0 dB"


def test_an_image_output_clipped_only_beyond_its_range_is_not_told_to_widen_it():
    from quantscope.pipeline.verdict import _saturated_outputs
    from quantscope.tasks.layout_spec import image_ranges, parse_layout

    plan = {"saturation": {"tensors": [{"tensor": "SR", "below": 0.0001, "above": 0.0001,
                                        "range_min": -6.566, "range_max": 265.0,
                                        "data_min": -10.94, "data_max": 276.1}]}}
    outputs = [{"tensor": "SR", "role": "output"}]
    shown = image_ranges((parse_layout("SR=image:range=0-255"),))
    assert shown == {"SR": (0.0, 255.0)}
    line, = _saturated_outputs(plan, outputs, shown)
    assert "clips 0.02% of its held-out values at its calibrated range -6.566 .. 265" in line
    assert ("every value clipped lies outside the image's declared range 0 .. 255, which "
            "the host clips anyway: no value shown changes") in line, line
    narrow = image_ranges((parse_layout("SR=image:range=0-300"),))
    line, = _saturated_outputs(plan, outputs, narrow)  # the range reaches past the grid
    assert line.endswith("calibrate on data like the deployment's, or widen its range"), line
    line, = _saturated_outputs(plan, outputs)  # no image range declared
    assert line.endswith("or widen its range"), line


def test_ort_model_warnings_do_not_reach_the_console(tmp_path, capfd):
    """tf2onnx writes a Keras UpSampling2D as a nearest Resize with
    ``tf_half_pixel_for_nn``: ONNX Runtime's process logger warned that it is deprecated,
    in colour, once per session of every command (three lines for one ``evaluate``)."""
    text = """
    <ir_version: 7, opset_import: ["" : 11]>
    up (float[N, 3, 8, 8] x) => (float[N, 3, 16, 16] y) {
        h = Conv <pads = [1, 1, 1, 1]> (x, w)
        y = Resize <mode = "nearest", coordinate_transformation_mode = "tf_half_pixel_for_nn",
                    nearest_mode = "floor"> (h, roi, scales)
    }
    """
    model = _with_weights(text, {"w": np.full((3, 3, 3, 3), 0.1, np.float32),
                                 "roi": np.zeros(0, np.float32),
                                 "scales": np.array([1, 1, 2, 2], np.float32)})
    onnx.save(model, tmp_path / "up.onnx")
    np.savez(tmp_path / "x.npz", x=np.random.default_rng(2).uniform(0, 1, (4, 3, 8, 8)).astype(
        np.float32))
    assert main(["calibrate", str(tmp_path / "up.onnx"), "--data", str(tmp_path / "x.npz"),
                 "--out", str(tmp_path / "s.npz")]) == 0
    assert main(["evaluate", str(tmp_path / "up.onnx"), "--data", str(tmp_path / "x.npz"),
                 "--stats", str(tmp_path / "s.npz"), "--precision", "a8_w8",
                 "--layout", "y=image:range=0-2"]) == 0
    err = capfd.readouterr().err
    assert "deprecated" not in err and "[W:onnxruntime" not in err, err


def test_a_0_1_image_declared_0_255_is_questioned():
    """UpscalerJS's ESRGAN-thick outputs 0..1, its ESRGAN-slim 0..255: the thick one
    declared range=0-255 read PSNR 88.2 dB and SSIM 1 at a8_w8 on the 8 photos, where over
    0..1 it is 40.2 dB, SSIM 0.979, said by nothing."""
    r = np.random.default_rng(8)
    ref = r.uniform(0.0, 1.0, (2, 3, 16, 16))
    test = ref + r.normal(0, 0.01, ref.shape)
    m = ImageTask(name="i", output="y", range=(0.0, 255.0)).metrics(_out(ref), _out(test))
    assert m.values["psnr_db"] > 80.0
    note = next((n for n in m.notes if "is it the image's?" in n), None)
    assert note is not None and "of the declared range 0..255" in note, m.notes
    assert "a 0-1 image declared 0-255 reads its PSNR 48 dB too high" in note, note
    right = ImageTask(name="i", output="y", range=(0.0, 1.0)).metrics(_out(ref), _out(test))
    assert not any("is it the image's?" in n for n in right.notes), right.notes
    dark = ImageTask(name="i", output="y", range=(0.0, 255.0)).metrics(
        _out(ref * 60), _out(test * 60))  # a dark photo: 0..60 of 0..255 is the image's
    assert not any("is it the image's?" in n for n in dark.notes), dark.notes
