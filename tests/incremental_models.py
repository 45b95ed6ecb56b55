"""A tiny transformer-like encoder (several layers, so several cuts) for the incremental
evaluator's tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

D, F = 16, 32


def encoder(layers: int = 3, seed: int = 0) -> onnx.ModelProto:
    """x [N,S,D], additive mask [N,1,S] -> per layer: LayerNorm, single-head attention
    with the mask, residual, LayerNorm, GELU MLP, residual; a final LayerNorm, and the
    mean over tokens as a second output."""
    r = np.random.default_rng(seed)
    nodes, inits = [], []

    def w(name: str, shape: tuple[int, ...], s: float = 0.3) -> str:
        inits.append(numpy_helper.from_array(r.normal(0, s, shape).astype(np.float32), name))
        return name

    def ln(i: str, o: str, p: str) -> None:
        g = numpy_helper.from_array((1 + r.normal(0, 0.1, D)).astype(np.float32), f"{p}_g")
        inits.extend([g, numpy_helper.from_array(r.normal(0, 0.1, D).astype(np.float32),
                                                  f"{p}_b")])
        nodes.append(helper.make_node("LayerNormalization", [i, f"{p}_g", f"{p}_b"], [o],
                                      name=p, axis=-1, epsilon=1e-5))

    def node(op: str, ins: list[str], out: str, **kw: object) -> str:
        nodes.append(helper.make_node(op, ins, [out], name=f"n_{out}", **kw))
        return out

    inits += [numpy_helper.from_array(np.array(v, dtype=np.float32), n)
              for n, v in (("sqrt2", np.sqrt(2.0)), ("one", 1.0), ("half", 0.5),
                           ("temp", 0.25))]
    x = "x"
    for i in range(layers):
        p = f"l{i}"
        ln(x, f"{p}_n1", f"{p}_ln1")
        q = node("MatMul", [f"{p}_n1", w(f"{p}_wq", (D, D))], f"{p}_q")
        k = node("MatMul", [f"{p}_n1", w(f"{p}_wk", (D, D))], f"{p}_k")
        v = node("MatMul", [f"{p}_n1", w(f"{p}_wv", (D, D))], f"{p}_v")
        kt = node("Transpose", [k], f"{p}_kt", perm=[0, 2, 1])
        s = node("MatMul", [q, kt], f"{p}_s")
        st = node("Mul", [s, "temp"], f"{p}_st")
        sm = node("Add", [st, "mask"], f"{p}_sm")
        a = node("Softmax", [sm], f"{p}_a", axis=-1)
        c = node("MatMul", [a, v], f"{p}_c")
        o = node("MatMul", [c, w(f"{p}_wo", (D, D))], f"{p}_o")
        h = node("Add", [x, o], f"{p}_h")
        ln(h, f"{p}_n2", f"{p}_ln2")
        u = node("MatMul", [f"{p}_n2", w(f"{p}_w1", (D, F))], f"{p}_u")
        ub = node("Add", [u, w(f"{p}_b1", (F,), 0.1)], f"{p}_ub")
        d = node("Div", [ub, "sqrt2"], f"{p}_d")
        e = node("Erf", [d], f"{p}_e")
        e1 = node("Add", [e, "one"], f"{p}_e1")
        m = node("Mul", [ub, e1], f"{p}_m")
        g = node("Mul", [m, "half"], f"{p}_g")
        dn = node("MatMul", [g, w(f"{p}_w2", (F, D))], f"{p}_dn")
        x = node("Add", [h, dn], f"{p}_out")
    ln(x, "y", "final_ln")
    node("ReduceMean", ["y"], "pooled", axes=[1], keepdims=0)
    graph = helper.make_graph(
        nodes, "tiny_encoder",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "S", D]),
         helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["N", 1, "S"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "S", D]),
         helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["N", D])],
        initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def feeds(n: int = 4, s: int = 5, seed: int = 0) -> dict[str, np.ndarray]:
    r = np.random.default_rng(seed)
    keep = r.random((n, 1, s)) > 0.2
    keep[..., 0] = True
    return {"x": r.normal(0, 1, (n, s, D)).astype(np.float32),
            "mask": np.where(keep, 0.0, -1e4).astype(np.float32)}
