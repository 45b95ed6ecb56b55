"""A MediaPipe hand-landmark-style model: ``landmarks [N, 3 * P]`` (x, y, z per point, in
input pixels) and a hand-presence probability ``flag [N, 1]`` (Sigmoid) beside them.

On data without hands FP32's flag is below 0.5 on every sample: the one-value-per-sample
fidelity printed ``100.0 % of samples decided as FP32`` and said nothing else (the declared
``score`` task said the agreement says little; the undeclared scoring did not)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from tiny_models import _rng, _with_weights

from quantscope.cli import main

POINTS = 4


def hand_landmarks(seed: int = 29, flag_bias: float = -6.0) -> onnx.ModelProto:
    r = _rng(seed)
    text = f"""
    <ir_version: 9, opset_import: ["" : 17]>
    hand (float[N, 8] input) => (float[N, {3 * POINTS}] landmarks, float[N, 1] flag) {{
        h = Gemm (input, w1, b1)
        a = Relu (h)
        landmarks = Gemm (a, wl, bl)
        f = Gemm (a, wf, bf)
        flag = Sigmoid (f)
    }}
    """
    return _with_weights(text, {
        "w1": r.normal(0, 0.5, (8, 16)).astype(np.float32),
        "b1": r.normal(0, 0.1, 16).astype(np.float32),
        "wl": r.normal(0, 8.0, (16, 3 * POINTS)).astype(np.float32),
        "bl": np.tile(np.array([112.0, 112.0, 0.0], np.float32), POINTS),
        "wf": r.normal(0, 0.3, (16, 1)).astype(np.float32),
        "bf": np.array([flag_bias], np.float32),
    })


@pytest.fixture(scope="module")
def hand(tmp_path_factory):
    d = tmp_path_factory.mktemp("hand")
    onnx.save(hand_landmarks(), d / "hand.onnx")
    np.savez(d / "hand.npz", input=np.random.default_rng(0).normal(0, 1, (32, 8)).astype(
        np.float32))
    assert main(["calibrate", str(d / "hand.onnx"), "--data", str(d / "hand.npz"),
                 "--out", str(d / "stats.npz")]) == 0
    return d


def _evaluate(d, capsys, *extra: str) -> dict:
    code = main(["evaluate", str(d / "hand.onnx"), "--data", str(d / "hand.npz"),
                 "--stats", str(d / "stats.npz"), "--precision", "a8_w8",
                 "--json", str(d / "r.json"), *extra])
    capsys.readouterr()
    assert code == 0
    return json.loads((d / "r.json").read_text())


def test_a_flag_fp32_never_raises_is_said_to_say_little(hand, capsys):
    r = _evaluate(hand, capsys)
    notes = [n for n in r["notes"] if "'flag'" in n]
    assert any("FP32 decides the same on every sample at 0.5" in n and "says little" in n
               for n in notes), notes
