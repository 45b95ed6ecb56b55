"""Tiny vision models beyond classifiers and YOLOv8 heads (issue: models beyond the zoo).

=====================  ================================================================
``segmenter``          Conv (stride 2) -> Resize x2 -> 1x1 Conv to 4 classes -> Softmax
                       over axis 1: per-pixel class probabilities ``[N, 4, H, W]``
                       (``softmax=False``: the logits); H, W symbolic with ``dynamic``
``yolov5_head``        a YOLOv5-style output ``[N, A, 5 + C]``: cx, cy, w, h, objectness,
                       C class probabilities per anchor (rows on axis 2)
=====================  ================================================================
"""

from __future__ import annotations

import numpy as np
import onnx
from tiny_models import _rng, _with_weights


def segmenter(seed: int = 31, *, softmax: bool = True, dynamic: bool = False) -> onnx.ModelProto:
    r = _rng(seed)
    hw = "H, W" if dynamic else "16, 16"
    last = "probs = Softmax <axis = 1> (logits)" if softmax else ""
    out = "probs" if softmax else "logits"
    text = f"""
    <ir_version: 9, opset_import: ["" : 17]>
    seg (float[N, 3, {hw}] x) => (float[N, 4, {hw}] {out}) {{
        c = Conv <pads = [1, 1, 1, 1], strides = [2, 2]> (x, w1, b1)
        a = Relu (c)
        u = Resize <mode = "linear"> (a, , scales)
        logits = Conv (u, w2, b2)
        {last}
    }}
    """
    return _with_weights(text, {
        "w1": r.normal(0, 0.4, (8, 3, 3, 3)).astype(np.float32),
        "b1": r.normal(0, 0.1, 8).astype(np.float32),
        "scales": np.array([1, 1, 2, 2], np.float32),
        "w2": r.normal(0, 0.6, (4, 8, 1, 1)).astype(np.float32),
        "b2": r.normal(0, 0.2, 4).astype(np.float32),
    })


def yolov5_head(seed: int = 32, classes: int = 3) -> onnx.ModelProto:
    """``images [N, 3, 16, 16]`` -> Conv trunk -> a 1x1 Conv to 5 + C rows per cell ->
    ``[N, 64, 5 + C]`` (Transpose), Sigmoid; boxes scaled to pixels (cx, cy 0-640, w, h
    0-160), objectness and class probabilities in [0, 1]."""
    r = _rng(seed)
    k = 5 + classes
    text = f"""
    <ir_version: 9, opset_import: ["" : 17]>
    v5 (float[N, 3, 16, 16] images) => (float[N, 64, {k}] output) {{
        c1 = Conv <pads = [1, 1, 1, 1], strides = [2, 2]> (images, w1, b1)
        r1 = Relu (c1)
        h = Conv (r1, wh, bh)
        f = Reshape (h, flat)
        t = Transpose <perm = [0, 2, 1]> (f)
        s = Sigmoid (t)
        output = Mul (s, scale)
    }}
    """
    scale = np.ones(k, np.float32)
    scale[:2], scale[2:4] = 640.0, 160.0
    return _with_weights(text, {
        "w1": r.normal(0, 0.4, (8, 3, 3, 3)).astype(np.float32),
        "b1": r.normal(0, 0.1, 8).astype(np.float32),
        "wh": r.normal(0, 0.6, (k, 8, 1, 1)).astype(np.float32),
        "bh": np.concatenate([np.zeros(4), [0.5], np.full(classes, -0.5)]).astype(np.float32),
        "flat": np.array([0, k, -1], np.int64),
        "scale": scale,
    })
