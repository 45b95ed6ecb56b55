"""faces task: frozen data, deterministic pairs, distances, FP32 sanity on dlib-face."""

from __future__ import annotations

import sys

import numpy as np
import onnxruntime as ort
import pytest
from PIL import Image

from quantscope.tasks import faces as ft
from quantscope.types import QuantscopeError


@pytest.fixture(scope="module")
def builtin() -> ft.FaceSet:
    return ft.load_faces("faces")


def test_builtin_set_shape(builtin):
    assert builtin.chips.shape == (144, 150, 150, 3) and builtin.chips.dtype == np.uint8
    assert len(builtin.photo_names) == 18 and len(set(builtin.identity.tolist())) == 17
    assert set(builtin.variant.tolist()) == {
        "orig", "flip", "light", "align", "jpeg", "80px", "40px", "20px"
    }  # fmt: skip
    flips = builtin.chips[builtin.variant == "flip"]
    assert np.array_equal(flips, builtin.chips[builtin.variant == "orig"][:, :, ::-1])


def test_pairs_are_deterministic_and_labelled(builtin):
    a, b = ft.verification_pairs(builtin), ft.verification_pairs(builtin)
    for field in ("first", "second", "genuine", "distance", "change"):
        assert np.array_equal(getattr(a, field), getattr(b, field))
    assert np.all(builtin.variant[a.first] == "orig")
    same = builtin.identity[a.first] == builtin.identity[a.second]
    assert np.array_equal(same, a.genuine)
    assert set(a.distance.tolist()) == {"orig", "80px", "40px", "20px"}  # dlib slices
    unordered = {tuple(sorted(p)) for p in zip(a.first.tolist(), a.second.tolist(), strict=True)}
    assert len(unordered) == len(a) and not np.any(a.first == a.second)
    assert int(a.genuine.sum()) == 141  # 18 faces x 7 variants + 15 for the one repeated person


def test_impostor_subsample_is_seeded(builtin):
    one = ft.verification_pairs(builtin, seed=1, max_impostors_per_slice=50)
    again = ft.verification_pairs(builtin, seed=1, max_impostors_per_slice=50)
    other = ft.verification_pairs(builtin, seed=2, max_impostors_per_slice=50)
    assert np.array_equal(one.second, again.second)
    assert not np.array_equal(one.second, other.second)
    for name in ("orig", "80px", "40px", "20px"):
        assert np.sum(~one.genuine & (one.distance == name)) == 50
    assert one.genuine.sum() == ft.verification_pairs(builtin).genuine.sum()


def test_slice_stats_counts_threshold_decisions():
    pairs = ft.VerificationPairs(
        first=np.zeros(4, np.int64), second=np.arange(1, 5), distance=np.array(["orig"] * 4),
        genuine=np.array([True, True, False, False]), change=np.array(["flip"] * 4),
    )  # fmt: skip
    (stats,) = ft.slice_stats(np.array([0.2, 0.7, 0.5, 0.9]), pairs, threshold=0.6)
    assert (stats.tar, stats.far, stats.n_genuine, stats.impostor_min) == (0.5, 0.5, 2, 0.5)
    assert list(ft.same_person(np.array([0.59, 0.6]))) == [True, False]


def test_distances_are_euclidean():
    emb = np.array([[0.0, 0.0], [3.0, 4.0]])
    pairs = ft.VerificationPairs(np.array([0]), np.array([1]), np.array([True]),
                                 np.array(["orig"]), np.array(["orig"]))  # fmt: skip
    assert ft.pair_distances(emb, pairs).tolist() == [5.0]


def test_fp32_verification_is_sane(builtin, tmp_path):
    pytest.importorskip("face_recognition_models")
    from quantscope.zoo.face import build_dlib_face

    sess = ort.InferenceSession(str(build_dlib_face(tmp_path)), providers=["CPUExecutionProvider"])
    emb = ft.embed_faces(lambda x: sess.run(None, {"image": x})[0], builtin)
    pairs = ft.verification_pairs(builtin)
    stats = {s.distance: s for s in ft.slice_stats(ft.pair_distances(emb, pairs), pairs)}
    assert stats["orig"].tar >= 0.95 and stats["orig"].far <= 0.10
    assert stats["orig"].impostor_mean > 0.7 > 0.3 > stats["orig"].genuine_mean
    assert stats["20px"].genuine_mean > 1.5 * stats["80px"].genuine_mean  # distance effect


def _write_chips(root, builtin, people=2, per_person=2):
    origs = builtin.chips[builtin.variant == "orig"]
    for p in range(people):
        (root / f"person{p}").mkdir(parents=True)
        for k in range(per_person):
            Image.fromarray(origs[p * per_person + k]).save(root / f"person{p}" / f"{k}.png")


def test_folder_of_chips_without_dlib(tmp_path, builtin, monkeypatch):
    monkeypatch.setitem(sys.modules, "dlib", None)  # import dlib -> ImportError
    _write_chips(tmp_path, builtin)
    faces = ft.load_faces(tmp_path)
    assert faces.chips.shape == (16, 150, 150, 3) and faces.photo_names[0] == "person0/0.png"
    pairs = ft.verification_pairs(faces)
    assert int(np.sum(pairs.genuine & (pairs.change == "orig"))) == 2  # one per person


def test_folder_needs_dlib_for_unaligned_photos(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "dlib", None)
    (tmp_path / "alice").mkdir()
    Image.new("RGB", (640, 480)).save(tmp_path / "alice" / "a.jpg")
    with pytest.raises(QuantscopeError, match="already be aligned"):
        ft.load_faces(tmp_path)


def test_bad_source_names(tmp_path):
    with pytest.raises(QuantscopeError, match="not 'faces'"):
        ft.load_faces(tmp_path / "missing")
    with pytest.raises(QuantscopeError, match="no images"):
        ft.load_faces(tmp_path)
