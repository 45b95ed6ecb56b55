"""Tiny vision models of the kinds a deployment engineer brings (ResNet/MobileNet/U-Net
exports), each reproducing one graph shape that got a wrong figure or verdict:

=======================  ===============================================================
``nhwc_classifier``      an NHWC input ``[N, 8, 8, 3]`` read through a Transpose to NCHW
                         first, then Conv-Relu-GlobalAveragePool-Flatten-Gemm logits
``softmax_classifier``   Conv-Relu-Flatten-Gemm-Softmax ``[N, 12]``
                         class probabilities (``logits=True``: the Gemm's logits, no
                         Softmax)
``gap_classifier``       Conv-Relu-GlobalAveragePool-Flatten-Gemm-Softmax ``[N, 10]``
                         (a ResNet head: its Softmax is no attention, which
                         ``hailo.attention_16bit`` must not refuse in the planner)
=======================  ===============================================================
"""

from __future__ import annotations

import numpy as np
import onnx
from tiny_models import _rng, _with_weights


def nhwc_classifier(seed: int = 21) -> onnx.ModelProto:
    """``image [N, 8, 8, 3]`` (NHWC) -> Transpose -> Conv -> Relu -> GAP -> Gemm logits."""
    r = _rng(seed)
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    nhwc (float[N, 8, 8, 3] image) => (float[N, 5] logits) {
        t = Transpose <perm = [0, 3, 1, 2]> (image)
        c = Conv <pads = [1, 1, 1, 1]> (t, w1, b1)
        a = Relu (c)
        p = GlobalAveragePool (a)
        f = Flatten (p)
        logits = Gemm <transB = 1> (f, w2, b2)
    }
    """
    return _with_weights(text, {
        "w1": r.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32),
        "b1": r.normal(0, 0.1, 8).astype(np.float32),
        "w2": r.normal(0, 0.5, (5, 8)).astype(np.float32),
        "b2": r.normal(0, 0.1, 5).astype(np.float32),
    })


def softmax_classifier(seed: int = 22, logits: bool = False) -> onnx.ModelProto:
    """``image [N, 3, 8, 8]`` -> Conv (stride 2) -> Relu -> Flatten -> Gemm -> Softmax
    ``probs [N, 12]`` (``logits``: the Gemm output is the model's output)."""
    r = _rng(seed)
    out = "logits" if logits else "probs"
    tail = "" if logits else "probs = Softmax <axis = 1> (logits)"
    text = f"""
    <ir_version: 9, opset_import: ["" : 17]>
    classifier (float[N, 3, 8, 8] image) => (float[N, 12] {out}) {{
        c = Conv <pads = [1, 1, 1, 1], strides = [2, 2]> (image, w1, b1)
        a = Relu (c)
        f = Flatten (a)
        logits = Gemm <transB = 1> (f, w2, b2)
        {tail}
    }}
    """
    return _with_weights(text, {
        "w1": r.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32),
        "b1": r.normal(0, 0.1, 4).astype(np.float32),
        "w2": r.normal(0, 0.3, (12, 64)).astype(np.float32),
        "b2": np.zeros(12, np.float32),
    })


def gap_classifier(seed: int = 23) -> onnx.ModelProto:
    """``image [N, 3, 8, 8]`` -> Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm ->
    Softmax ``probs [N, 10]``: no MatMul of two activations anywhere."""
    r = _rng(seed)
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    gap (float[N, 3, 8, 8] image) => (float[N, 10] probs) {
        c = Conv <pads = [1, 1, 1, 1]> (image, w1, b1)
        a = Relu (c)
        p = GlobalAveragePool (a)
        f = Flatten (p)
        logits = Gemm <transB = 1> (f, w2, b2)
        probs = Softmax <axis = 1> (logits)
    }
    """
    return _with_weights(text, {
        "w1": r.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32),
        "b1": r.normal(0, 0.1, 8).astype(np.float32),
        "w2": r.normal(0, 0.5, (10, 8)).astype(np.float32),
        "b2": r.normal(0, 0.1, 10).astype(np.float32),
    })


def feeds(name: str, n: int = 32, seed: int = 0) -> dict[str, np.ndarray]:
    r = np.random.default_rng(seed)
    if name == "nhwc_classifier":
        return {"image": r.random((n, 8, 8, 3), np.float32) * 255}
    if name in ("softmax_classifier", "gap_classifier"):
        return {"image": r.normal(0, 1, (n, 3, 8, 8)).astype(np.float32)}
    raise KeyError(name)
