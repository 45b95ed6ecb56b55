"""A tiny ViT block built in the tests: decomposed LayerNorm, attention, layer scale, GELU MLP.

The layout of a Hugging Face DINOv2 layer (``x + ls1 * attn(LN1(x))``, then
``+ ls2 * mlp(LN2(.))``), with the LayerNorm written out as ReduceMean/Sub/Pow/Add/Sqrt/
Div/Mul/Add as the exported DINOv2 graph has it, at width 16 with 2 heads of 8.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper, parser


def _ln(i: int, x: str) -> str:
    return f"""
        m{i} = ReduceMean <axes = [-1]> ({x})
        d{i} = Sub ({x}, m{i})
        p{i} = Pow (d{i}, two)
        v{i} = ReduceMean <axes = [-1]> (p{i})
        ve{i} = Add (v{i}, eps)
        s{i} = Sqrt (ve{i})
        n{i} = Div (d{i}, s{i})
        g{i} = Mul (n{i}, gamma{i})
        ln{i} = Add (g{i}, beta{i})"""


def _linear(name: str, x: str) -> str:
    return f"""
        {name}_mm = MatMul ({x}, w_{name})
        {name} = Add (b_{name}, {name}_mm)"""


def _heads(t: str) -> str:
    return f"""
        {t}_r = Reshape ({t}, heads_shape)
        {t}_h = Transpose <perm = [0, 2, 1, 3]> ({t}_r)"""


def vit_block(seed: int = 7) -> onnx.ModelProto:
    """One pre-norm ViT layer on tokens [N, 5, 16]; Linear+bias on 3-D tensors."""
    r = np.random.default_rng(seed)
    text = f"""
    <ir_version: 9, opset_import: ["" : 17]>
    vitblock (float[N, 5, 16] x) => (float[N, 5, 16] y) {{
        {_ln(1, "x")}
        {_linear("q", "ln1")}{_linear("k", "ln1")}{_linear("v", "ln1")}
        {_heads("q")}{_heads("k")}{_heads("v")}
        kt = Transpose <perm = [0, 1, 3, 2]> (k_h)
        sc = MatMul (q_h, kt)
        scs = Div (sc, sqrt_d)
        att = Softmax <axis = -1> (scs)
        ctx = MatMul (att, v_h)
        ctx_t = Transpose <perm = [0, 2, 1, 3]> (ctx)
        ctx_r = Reshape (ctx_t, tokens_shape)
        {_linear("o", "ctx_r")}
        ls1m = Mul (o, ls1)
        r1 = Add (x, ls1m)
        {_ln(2, "r1")}
        {_linear("fc1", "ln2")}
        gd = Div (fc1, sqrt2)
        ge = Erf (gd)
        ge1 = Add (ge, one)
        gm = Mul (fc1, ge1)
        gelu = Mul (gm, half)
        {_linear("fc2", "gelu")}
        ls2m = Mul (fc2, ls2)
        y = Add (r1, ls2m)
    }}
    """
    w: dict[str, np.ndarray] = {
        "two": np.array(2.0), "eps": np.array(1e-6), "sqrt_d": np.array(np.sqrt(8.0)),
        "sqrt2": np.array(np.sqrt(2.0)), "one": np.array(1.0), "half": np.array(0.5),
        "heads_shape": np.array([0, 0, 2, 8], np.int64),
        "tokens_shape": np.array([0, 0, 16], np.int64),
        "ls1": r.uniform(0.1, 1.0, 16), "ls2": r.uniform(0.1, 1.0, 16),
    }
    for i in (1, 2):
        w[f"gamma{i}"] = 1 + r.normal(0, 0.2, 16)
        w[f"beta{i}"] = r.normal(0, 0.1, 16)
    for name, (cin, cout) in {"q": (16, 16), "k": (16, 16), "v": (16, 16), "o": (16, 16),
                              "fc1": (16, 32), "fc2": (32, 16)}.items():
        w[f"w_{name}"] = r.normal(0, 1 / np.sqrt(cin), (cin, cout))
        w[f"b_{name}"] = r.normal(0, 0.1, cout)
    model = parser.parse_model(text)
    model.graph.initializer.extend(
        numpy_helper.from_array(v if v.dtype == np.int64 else v.astype(np.float32), k)
        for k, v in w.items())
    onnx.checker.check_model(model)
    return model


def tokens(n: int, seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).normal(0, 1, (n, 5, 16)).astype(np.float32)}
