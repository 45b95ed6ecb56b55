"""Tiny models of the kinds found outside the zoo (issue: models beyond the zoo).

Each reproduces, in a few nodes, one real graph that got a wrong verdict or a crash:

=======================  ===============================================================
``mixed_scale_detector``  a YOLOv8-style head: boxes (0-640 px) and class probabilities
                          (0-0.9) concatenated into one output ``[N, 4 + 3, 64]``
``scalar_probability``    a voice-activity-style head: one probability per sample ``[N]``
``lstm_state``            an LSTM whose state inputs/outputs carry the batch on axis 1
``static_streaming``      a static streaming export: ``input [1, 64]``, ``state [2, 1, 16]``
``conv_transpose_head``   a decoder with a ConvTranspose (weight ``[in, out, k, k]``)
``computed_pad``          a Pad whose pads are computed from the input's shape
=======================  ===============================================================
"""

from __future__ import annotations

import numpy as np
import onnx
from tiny_models import _rng, _with_weights

BOX_SCALE = 640.0  # the boxes' range: the grid step of one 8-bit output grid is ~2.5


def mixed_scale_detector(seed: int = 11) -> onnx.ModelProto:
    """Conv trunk, a box branch (Sigmoid x 640) and a class branch (Sigmoid, biased low),
    concatenated on axis 1 into ``detections [N, 7, 64]`` (4 box rows, 3 class rows).
    At one per-tensor 8-bit grid every class probability rounds to 0."""
    r = _rng(seed)
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    detector (float[N, 3, 16, 16] images) => (float[N, 7, 64] detections) {
        c1 = Conv <pads = [1, 1, 1, 1], strides = [2, 2]> (images, w1, b1)
        r1 = Relu (c1)
        cb = Conv (r1, wb, bb)
        sb = Sigmoid (cb)
        bx = Mul (sb, box_scale)
        boxes = Reshape (bx, shape_box)
        cc = Conv (r1, wc, bc)
        sc = Sigmoid (cc)
        classes = Reshape (sc, shape_cls)
        detections = Concat <axis = 1> (boxes, classes)
    }
    """
    return _with_weights(text, {
        "w1": r.normal(0, 0.4, (8, 3, 3, 3)).astype(np.float32),
        "b1": r.normal(0, 0.1, 8).astype(np.float32),
        "wb": r.normal(0, 0.5, (4, 8, 1, 1)).astype(np.float32),
        "bb": r.normal(0, 0.2, 4).astype(np.float32),
        "box_scale": np.array(BOX_SCALE, np.float32),
        "shape_box": np.array([0, 4, -1], np.int64),
        "wc": r.normal(0, 0.6, (3, 8, 1, 1)).astype(np.float32),
        "bc": np.full(3, -1.5, np.float32),
        "shape_cls": np.array([0, 3, -1], np.int64),
    })


def scalar_probability(seed: int = 12) -> onnx.ModelProto:
    """``features [N, 16]`` -> MLP -> Sigmoid -> ``speech [N]``: one value per sample."""
    r = _rng(seed)
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    vad (float[N, 16] features) => (float[N] speech) {
        h = MatMul (features, w1)
        hb = Add (h, b1)
        a = Relu (hb)
        o = MatMul (a, w2)
        ob = Add (o, b2)
        s = Sigmoid (ob)
        speech = Squeeze (s, axes)
    }
    """
    return _with_weights(text, {
        "w1": r.normal(0, 0.5, (16, 32)).astype(np.float32),
        "b1": r.normal(0, 0.1, 32).astype(np.float32),
        "w2": r.normal(0, 0.6, (32, 1)).astype(np.float32),
        "b2": np.zeros(1, np.float32),
        "axes": np.array([1], np.int64),
    })


def lstm_state(seed: int = 13) -> onnx.ModelProto:
    """One LSTM step: ``x [B, 16]`` plus the state ``h, c [1, B, 8]`` (batch on axis 1);
    outputs ``prob [B, 1]`` and the new state ``hn, cn [1, B, 8]``."""
    r = _rng(seed)
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    lstm (float[B, 16] x, float[1, B, 8] h, float[1, B, 8] c)
        => (float[B, 1] prob, float[1, B, 8] hn, float[1, B, 8] cn) {
        xs = Unsqueeze (x, zero)
        y, hn, cn = LSTM <hidden_size = 8> (xs, W, R, Bias, , h, c)
        hs = Squeeze (hn, zero)
        o = MatMul (hs, w2)
        ob = Add (o, b2)
        prob = Sigmoid (ob)
    }
    """
    return _with_weights(text, {
        "zero": np.array([0], np.int64),
        "W": r.normal(0, 0.4, (1, 32, 16)).astype(np.float32),
        "R": r.normal(0, 0.4, (1, 32, 8)).astype(np.float32),
        "Bias": r.normal(0, 0.1, (1, 64)).astype(np.float32),
        "w2": r.normal(0, 0.8, (8, 1)).astype(np.float32),
        "b2": np.zeros(1, np.float32),
    })


def static_streaming(seed: int = 14) -> onnx.ModelProto:
    """A static export: ``input [1, 64]`` and ``state [2, 1, 16]`` -> ``prob [1, 1]`` and
    ``state_out [2, 1, 16]``: no symbolic dim; the sample axis is 0 of ``input`` and 1 of
    ``state``."""
    r = _rng(seed)
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    stream (float[1, 64] input, float[2, 1, 16] state) => (float[1, 1] prob, float[2, 1, 16] state_out) {
        st = Transpose <perm = [1, 0, 2]> (state)
        sf = Reshape (st, flat)
        cat = Concat <axis = 1> (input, sf)
        h = MatMul (cat, w1)
        hb = Add (h, b1)
        t = Tanh (hb)
        o = MatMul (t, w2)
        prob = Sigmoid (o)
        t3 = Unsqueeze (t, zero)
        state_out = Concat <axis = 0> (t3, t3)
    }
    """
    return _with_weights(text, {
        "flat": np.array([1, 32], np.int64),
        "w1": r.normal(0, 0.2, (96, 16)).astype(np.float32),
        "b1": r.normal(0, 0.1, 16).astype(np.float32),
        "w2": r.normal(0, 0.5, (16, 1)).astype(np.float32),
        "zero": np.array([0], np.int64),
    })


def conv_transpose_head(seed: int = 15) -> onnx.ModelProto:
    """``x [N, 4, 8, 8]`` -> Conv(4->8) -> Relu -> ConvTranspose(8->2, stride 2, weight
    ``[in=8, out=2, 2, 2]``, with bias) -> Sigmoid -> ``mask [N, 2, 16, 16]``."""
    r = _rng(seed)
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    unet (float[N, 4, 8, 8] x) => (float[N, 2, 16, 16] mask) {
        c = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
        a = Relu (c)
        u = ConvTranspose <strides = [2, 2]> (a, wt, bt)
        mask = Sigmoid (u)
    }
    """
    return _with_weights(text, {
        "w1": r.normal(0, 0.4, (8, 4, 3, 3)).astype(np.float32),
        "b1": r.normal(0, 0.1, 8).astype(np.float32),
        "wt": r.normal(0, 0.4, (8, 2, 2, 2)).astype(np.float32),
        "bt": r.normal(0, 0.1, 2).astype(np.float32),
    })


def computed_pad(seed: int = 16) -> onnx.ModelProto:
    """``x [N, 3, H, W]`` padded up to 16 x 16 with pads computed from ``Shape(x)`` (symbolic
    shape inference stops there), then Conv -> Relu -> pool -> Gemm -> ``y [N, 8]``."""
    r = _rng(seed)
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    padnet (float[N, 3, H, W] x) => (float[N, 8] y) {
        s = Shape (x)
        h = Gather (s, i2)
        w = Gather (s, i3)
        ph = Sub (side, h)
        pw = Sub (side, w)
        pads = Concat <axis = 0> (z4, z2, ph, pw)
        xp = Pad (x, pads)
        c = Conv <pads = [1, 1, 1, 1]> (xp, w1, b1)
        a = Relu (c)
        p = GlobalAveragePool (a)
        f = Flatten (p)
        y = Gemm <transB = 1> (f, w2, b2)
    }
    """
    return _with_weights(text, {
        "i2": np.array([2], np.int64),
        "i3": np.array([3], np.int64),
        "side": np.array([16], np.int64),
        "z4": np.zeros(4, np.int64),
        "z2": np.zeros(2, np.int64),
        "w1": r.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32),
        "b1": r.normal(0, 0.1, 8).astype(np.float32),
        "w2": r.normal(0, 0.3, (8, 8)).astype(np.float32),
        "b2": r.normal(0, 0.1, 8).astype(np.float32),
    })


def feeds(name: str, n: int = 32, seed: int = 0) -> dict[str, np.ndarray]:
    """Sample data for each model above, as the user would save it (``np.savez``)."""
    r = np.random.default_rng(seed)
    if name == "mixed_scale_detector":
        return {"images": r.random((n, 3, 16, 16), np.float32)}
    if name == "scalar_probability":
        return {"features": r.normal(0, 1, (n, 16)).astype(np.float32)}
    if name == "lstm_state":
        return {"x": r.normal(0, 1, (n, 16)).astype(np.float32),
                "h": r.normal(0, 0.3, (1, n, 8)).astype(np.float32),
                "c": r.normal(0, 0.3, (1, n, 8)).astype(np.float32)}
    if name == "static_streaming":
        return {"input": r.normal(0, 1, (n, 64)).astype(np.float32),
                "state": r.normal(0, 0.3, (2, n, 16)).astype(np.float32)}
    if name == "conv_transpose_head":
        return {"x": r.normal(0, 1, (n, 4, 8, 8)).astype(np.float32)}
    if name == "computed_pad":
        return {"x": r.random((n, 3, 12, 12), np.float32)}
    raise KeyError(name)


def prepared(fixture, name: str, n: int = 32, batch: int = 8, feeds_of=None):
    """(model, dataset, stats) of ``fixture`` on ``n`` samples of its data (``feeds_of``,
    by default :func:`feeds` above) in batches of ``batch``, calibrated."""
    from quantscope import stages
    from quantscope.model.load import load_proto
    from quantscope.types import Dataset

    f = (feeds_of or feeds)(name, n)
    b = tuple({k: v[i:i + batch] for k, v in f.items()} for i in range(0, n, batch))
    model = load_proto(fixture(), name)
    data = Dataset(name=name, calibration=b, evaluation=b)
    return model, data, stages.calibrate_model(model, data)
