"""Tiny ONNX models built in the tests (ONNX text syntax + seeded random weights)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper, parser


def _with_weights(text: str, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    model = parser.parse_model(text)
    model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in weights.items())
    onnx.checker.check_model(model)
    return model


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def conv_net(seed: int = 0) -> onnx.ModelProto:
    """Conv-Relu-Conv-Relu-GlobalAveragePool-Flatten-Gemm: a tiny CNN embedder."""
    r = _rng(seed)
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    convnet (float[N, 3, 16, 16] image) => (float[N, 8] embedding) {
        c1 = Conv <pads = [1, 1, 1, 1]> (image, w1, b1)
        r1 = Relu (c1)
        c2 = Conv <pads = [1, 1, 1, 1], strides = [2, 2]> (r1, w2, b2)
        r2 = Relu (c2)
        p = GlobalAveragePool (r2)
        f = Flatten (p)
        embedding = Gemm <transB = 1> (f, w3, b3)
    }
    """
    return _with_weights(text, {
        "w1": r.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32),
        "b1": r.normal(0, 0.1, 8).astype(np.float32),
        "w2": r.normal(0, 0.2, (16, 8, 3, 3)).astype(np.float32),
        "b2": r.normal(0, 0.1, 16).astype(np.float32),
        "w3": r.normal(0, 0.3, (8, 16)).astype(np.float32),
        "b3": r.normal(0, 0.1, 8).astype(np.float32),
    })


def conv_sigmoid(path, *, relu: bool = False) -> None:
    """``x [N, 3, 8, 8]`` -> Conv (bias) [-> Relu] -> Sigmoid -> ``y [N, 4, 8, 8]``, saved
    at ``path`` (with ``relu``, the Conv's output ``c`` and ``r`` sit inside one group)."""
    r = _rng(5)
    inits = [numpy_helper.from_array(r.normal(0, 0.4, (4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(r.normal(0, 0.1, 4).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1])]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["r"], name="relu"))
    nodes.append(helper.make_node("Sigmoid", ["r" if relu else "c"], ["y"], name="sig"))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 4, 8, 8])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def residual_add(seed: int = 1) -> onnx.ModelProto:
    """x -> MatMul+bias -> Relu -> MatMul+bias, plus the skip: out = x + f(x)."""
    r = _rng(seed)
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    residual (float[N, 32] x) => (float[N, 32] y) {
        h = MatMul (x, w1)
        hb = Add (h, b1)
        a = Relu (hb)
        o = MatMul (a, w2)
        ob = Add (o, b2)
        y = Add (x, ob)
    }
    """
    return _with_weights(text, {
        "w1": r.normal(0, 0.2, (32, 64)).astype(np.float32),
        "b1": r.normal(0, 0.1, 64).astype(np.float32),
        "w2": r.normal(0, 0.2, (64, 32)).astype(np.float32),
        "b2": r.normal(0, 0.1, 32).astype(np.float32),
    })


def attention(seed: int = 2) -> onnx.ModelProto:
    """Single-head self-attention: Q,K,V projections, MatMul, Softmax, MatMul, output."""
    r = _rng(seed)
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    attention (float[N, S, 16] x) => (float[N, S, 16] y) {
        q = MatMul (x, wq)
        k = MatMul (x, wk)
        v = MatMul (x, wv)
        kt = Transpose <perm = [0, 2, 1]> (k)
        s = MatMul (q, kt)
        ss = Div (s, scale)
        p = Softmax <axis = -1> (ss)
        c = MatMul (p, v)
        y = MatMul (c, wo)
    }
    """
    return _with_weights(text, {
        "wq": r.normal(0, 0.3, (16, 16)).astype(np.float32),
        "wk": r.normal(0, 0.3, (16, 16)).astype(np.float32),
        "wv": r.normal(0, 0.3, (16, 16)).astype(np.float32),
        "wo": r.normal(0, 0.3, (16, 16)).astype(np.float32),
        "scale": np.array(4.0, dtype=np.float32),
    })


def layernorm_block(seed: int = 3) -> onnx.ModelProto:
    """LayerNormalization -> MatMul+bias -> Erf-GELU -> MatMul, residual, LayerNorm."""
    r = _rng(seed)
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    lnblock (float[N, S, 24] x) => (float[N, S, 24] y) {
        n1 = LayerNormalization <axis = -1, epsilon = 0.00001> (x, g1, be1)
        h = MatMul (n1, w1)
        hb = Add (h, b1)
        d = Div (hb, sqrt2)
        e = Erf (d)
        e1 = Add (e, one)
        m = Mul (hb, e1)
        gelu = Mul (m, half)
        o = MatMul (gelu, w2)
        res = Add (x, o)
        y = LayerNormalization <axis = -1, epsilon = 0.00001> (res, g2, be2)
    }
    """
    return _with_weights(text, {
        "g1": (1 + r.normal(0, 0.1, 24)).astype(np.float32),
        "be1": r.normal(0, 0.1, 24).astype(np.float32),
        "w1": r.normal(0, 0.2, (24, 48)).astype(np.float32),
        "b1": r.normal(0, 0.1, 48).astype(np.float32),
        "sqrt2": np.array(np.sqrt(2.0), dtype=np.float32),
        "one": np.array(1.0, dtype=np.float32),
        "half": np.array(0.5, dtype=np.float32),
        "w2": r.normal(0, 0.2, (48, 24)).astype(np.float32),
        "g2": (1 + r.normal(0, 0.1, 24)).astype(np.float32),
        "be2": r.normal(0, 0.1, 24).astype(np.float32),
    })


ALL = {
    "conv_net": conv_net,
    "residual_add": residual_add,
    "attention": attention,
    "layernorm_block": layernorm_block,
}


def sample_inputs(model: onnx.ModelProto, n: int = 8, seq: int = 6, seed: int = 0) -> dict:
    """Random float inputs matching the model's input (symbolic dims: N=n, S=seq)."""
    r = _rng(seed)
    feeds = {}
    for inp in model.graph.input:
        dims = []
        for i, d in enumerate(inp.type.tensor_type.shape.dim):
            dims.append(d.dim_value if d.HasField("dim_value") else (n if i == 0 else seq))
        feeds[inp.name] = r.normal(0, 1, dims).astype(np.float32)
    return feeds


def helper_identity() -> onnx.ModelProto:
    """Kept for tests that need an op-free float graph."""
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "id", [x], [y])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def write_pairs(path: Path, n: int, start: int = 0) -> str:
    """``n`` text pairs (``query``/``document`` JSON lines, numbered from ``start``) at
    ``path``, for a retrieval run of a tiny text encoder; the path as a string."""
    path.write_text("".join(
        json.dumps({"query": f"sort a list {i}", "document": f"sorted() returns {i}"}) + "\n"
        for i in range(start, start + n)))
    return str(path)
