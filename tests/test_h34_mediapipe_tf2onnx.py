"""MediaPipe's face mesh, pose and selfie segmentation as ``tf2onnx --tflite`` writes them.

- Face mesh: ``input_1 [1, 192, 192, 3]`` (NHWC) -> landmarks ``conv2d_21 [1, 1, 1, 1404]``
  and a face logit ``conv2d_31 [1, 1, 1, 1]``: a 1x1 Conv's output transposed to NHWC. The
  face logit, one value per sample on four axes, was scored by cosine (always 1.0 for one
  value) and given no decision agreement, where ``[N, 1]`` gets errors and decisions.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
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
    code = main(["evaluate", str(d / f"{model}.onnx"), "--data", str(d / f"{model}.npz"),
                 "--stats", str(d / "stats.npz"), "--precision", "a8_w8",
                 "--json", str(d / "r.json"), *extra])
    capsys.readouterr()
    assert code == 0
    return json.loads((d / "r.json").read_text())


def test_a_one_value_output_on_four_axes_is_decided_not_cosined(mesh, capsys):
    r = _evaluate(mesh, capsys, "mesh", "--layout", "conv2d_21=points:dims=3")
    flag = r["outputs"]["conv2d_31"]
    assert "cosine_mean" not in flag, flag  # a cosine of one value is 1.0 whatever it is
    assert 0.0 <= flag["decision_agreement"] <= 1.0 and flag["decision_threshold"] == 0.0
    assert any("output 'conv2d_31' has one value per sample (not in [0, 1]): no cosine" in n
               for n in r["notes"]), r["notes"]
