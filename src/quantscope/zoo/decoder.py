"""A Llama-style decoder as two ONNX graphs with the same layer names: prefill and decode.

==============  =====================================================================
architecture    token embedding; per layer: RMSNorm -> q/k/v projections -> RoPE
                (rotate-half form) -> grouped-query attention over the KV cache ->
                o projection + residual; RMSNorm -> SiLU-gated MLP + residual; final
                RMSNorm -> LM head (a transposed copy of the embedding when tied)
``prefill``     ``input_ids [1, N]`` -> ``logits [1, N, V]``, ``present.{i}.key`` /
                ``present.{i}.value`` ``[1, kv_heads, N, head_dim]``
``decode``      ``input_ids [1, 1]`` + ``past.{i}.key`` / ``past.{i}.value`` of length P
                -> ``logits [1, 1, V]`` + present of length P + 1
same names      every layer node has the same name in both graphs (only the ``pos.*``
                position plumbing differs: decode adds the past length); the cache node
                ``layers.{i}.attn.k_cache`` is ``Concat(past, k)`` in decode and
                ``Concat(k)`` (one input) in prefill, so one plan names the same groups
positions       computed from ``input_ids`` (and the past length), so RoPE tables and the
                causal mask are ``side`` tensors: never quantized, like an attention mask
weights         numpy float32, HF layout: ``W [out, in]``; ``y = x @ W.T``
==============  =====================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

PHASES = ("prefill", "decode")
OPSET = 23  # RMSNormalization
PRODUCER = "quantscope.zoo.decoder"
MASK_MIN = float(np.finfo(np.float32).min)


@dataclass(frozen=True)
class DecoderConfig:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    rope_theta: float = 10000.0
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def weight_names(cfg: DecoderConfig) -> tuple[str, ...]:
    """The weights a decoder needs (``lm_head.weight`` [V, H] is the embedding when tied)."""
    per_layer = ("attn_norm", "q_proj", "k_proj", "v_proj", "o_proj", "mlp_norm",
                 "gate_proj", "up_proj", "down_proj")
    names = [f"layers.{i}.{w}.weight" for i in range(cfg.layers) for w in per_layer]
    return ("embed.weight", *names, "norm.weight", "lm_head.weight")


class _Graph:
    """Nodes, initializers and the node-name discipline (every node named explicitly)."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def op(self, op: str, inputs: list[str], name: str, **attrs: object) -> str:
        self.nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name


def build_decoder(cfg: DecoderConfig, weights: dict[str, np.ndarray], phase: str) -> onnx.ModelProto:
    """The ``prefill`` or ``decode`` graph of the decoder (opset 23, float32)."""
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, not {phase!r}")
    g = _Graph()
    d = cfg.head_dim
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "sequence"])]
    if phase == "decode":
        for i in range(cfg.layers):
            for kind in ("key", "value"):
                inputs.append(helper.make_tensor_value_info(
                    f"past.{i}.{kind}", TensorProto.FLOAT, [1, cfg.kv_heads, "past_sequence", d]))
    cos, sin, mask = _positions(g, cfg, phase)
    h = g.op("Gather", [g.const("embed.weight", weights["embed.weight"]), "input_ids"],
             "embed", axis=0)
    outputs = []
    for i in range(cfg.layers):
        h, present = _layer(g, cfg, weights, i, h, (cos, sin, mask), phase)
        outputs += present
    h = g.op("RMSNormalization", [h, g.const("norm.weight", weights["norm.weight"])], "norm",
             axis=-1, epsilon=cfg.eps)
    g.op("MatMul", [h, g.const("lm_head.weight.T", weights["lm_head.weight"].T)], "lm_head")
    g.nodes.append(helper.make_node("Identity", ["lm_head"], ["logits"], name="logits"))
    outs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "sequence", cfg.vocab])]
    total = "sequence" if phase == "prefill" else "total_sequence"
    outs += [helper.make_tensor_value_info(t, TensorProto.FLOAT, [1, cfg.kv_heads, total, d])
             for t in outputs]
    graph = helper.make_graph(g.nodes, f"decoder_{phase}", inputs, outs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name=PRODUCER)
    model.ir_version = 10
    return model


def _positions(g: _Graph, cfg: DecoderConfig, phase: str) -> tuple[str, str, str]:
    """RoPE cos/sin [1,1,S,D] and the causal mask [S,T], derived from input_ids (side)."""
    one = g.const("pos.one", np.array(1, np.int64))
    ones = g.op("Add", [g.op("Mul", ["input_ids", g.const("pos.zero", np.array(0, np.int64))],
                             "pos.zeros"), one], "pos.ones")
    local = g.op("Sub", [g.op("CumSum", [ones, g.const("pos.axis", np.array(1, np.int64))],
                              "pos.cumsum"), one], "pos.local")
    if phase == "decode":
        past_len = g.op("Gather", [g.op("Shape", ["past.0.key"], "pos.past_shape"),
                                   g.const("pos.two", np.array(2, np.int64))], "pos.past_len")
    else:
        past_len = g.const("pos.past_len", np.array(0, np.int64))
    q_pos = g.op("Add", [local, past_len], "pos.query")  # [1, S]
    total = g.op("Add", [past_len, g.op("Gather", [g.op("Shape", ["input_ids"], "pos.ids_shape"),
                                                   one], "pos.seq_len")], "pos.total")
    k_pos = g.op("Range", [g.const("pos.start", np.array(0, np.int64)), total, one], "pos.keys")
    later = g.op("Greater", [g.op("Unsqueeze", [k_pos, g.const("pos.ax0", np.array([0]))],
                                  "pos.keys_row"),
                             g.op("Unsqueeze", [q_pos, g.const("pos.ax2", np.array([2]))],
                                  "pos.query_col")], "pos.later")  # [1, S, T]
    mask = g.op("Where", [later, g.const("pos.mask_min", np.array(MASK_MIN, np.float32)),
                          g.const("pos.mask_zero", np.array(0.0, np.float32))], "pos.mask")
    inv = 1.0 / cfg.rope_theta ** (np.arange(0, cfg.head_dim, 2, dtype=np.float64) / cfg.head_dim)
    angle = g.op("Mul", [g.op("Unsqueeze", [g.op("Cast", [q_pos], "pos.float", to=TensorProto.FLOAT),
                                            g.const("pos.ax_last", np.array([-1]))], "pos.col"),
                         g.const("pos.inv_freq", inv.astype(np.float32))], "pos.angle")
    full = g.op("Unsqueeze", [g.op("Concat", [angle, angle], "pos.angle2", axis=-1),
                              g.const("pos.ax1", np.array([1]))], "pos.angle4")  # [1,1,S,D]
    return g.op("Cos", [full], "pos.cos"), g.op("Sin", [full], "pos.sin"), mask


def _heads(g: _Graph, x: str, n: int, d: int, name: str) -> str:
    r = g.op("Reshape", [x, g.const(f"{name}.shape", np.array([1, -1, n, d]))], f"{name}.split")
    return g.op("Transpose", [r], f"{name}.heads", perm=[0, 2, 1, 3])


def _rope(g: _Graph, x: str, rope: tuple[str, str, str], name: str) -> str:
    cos, sin, _ = rope
    x1, x2 = f"{name}.x1", f"{name}.x2"
    g.nodes.append(helper.make_node("Split", [x], [x1, x2], name=f"{name}.split_half",
                                    axis=-1, num_outputs=2))
    rot = g.op("Concat", [g.op("Neg", [x2], f"{name}.neg"), x1], f"{name}.rotate", axis=-1)
    return g.op("Add", [g.op("Mul", [x, cos], f"{name}.cos"), g.op("Mul", [rot, sin], f"{name}.sin")],
                f"{name}.rope")


def _linear(g: _Graph, x: str, weights: dict[str, np.ndarray], name: str) -> str:
    return g.op("MatMul", [x, g.const(f"{name}.weight.T", weights[f"{name}.weight"].T)], name)


def _layer(g: _Graph, cfg: DecoderConfig, w: dict[str, np.ndarray], i: int, h: str,
           rope: tuple[str, str, str], phase: str) -> tuple[str, list[str]]:
    p = f"layers.{i}"
    x = g.op("RMSNormalization", [h, g.const(f"{p}.attn_norm.weight", w[f"{p}.attn_norm.weight"])],
             f"{p}.attn_norm", axis=-1, epsilon=cfg.eps)
    merged, present = _attention(g, cfg, w, i, x, rope, phase)
    h = g.op("Add", [h, _linear(g, merged, w, f"{p}.o_proj")], f"{p}.attn_residual")
    x = g.op("RMSNormalization", [h, g.const(f"{p}.mlp_norm.weight", w[f"{p}.mlp_norm.weight"])],
             f"{p}.mlp_norm", axis=-1, epsilon=cfg.eps)
    gate = _linear(g, x, w, f"{p}.gate_proj")
    silu = g.op("Mul", [gate, g.op("Sigmoid", [gate], f"{p}.mlp.sigmoid")], f"{p}.mlp.silu")
    act = g.op("Mul", [silu, _linear(g, x, w, f"{p}.up_proj")], f"{p}.mlp.gated")
    h = g.op("Add", [h, _linear(g, act, w, f"{p}.down_proj")], f"{p}.mlp_residual")
    return h, present


def _attention(g: _Graph, cfg: DecoderConfig, w: dict[str, np.ndarray], i: int, x: str,
               rope: tuple[str, str, str], phase: str) -> tuple[str, list[str]]:
    """Grouped-query attention of layer ``i`` over the cache: (context [1,S,H], present)."""
    p, d, rep = f"layers.{i}", cfg.head_dim, cfg.heads // cfg.kv_heads
    q = _rope(g, _heads(g, _linear(g, x, w, f"{p}.q_proj"), cfg.heads, d, f"{p}.attn.q"), rope,
              f"{p}.attn.q")
    k = _rope(g, _heads(g, _linear(g, x, w, f"{p}.k_proj"), cfg.kv_heads, d, f"{p}.attn.k"), rope,
              f"{p}.attn.k")
    v = _heads(g, _linear(g, x, w, f"{p}.v_proj"), cfg.kv_heads, d, f"{p}.attn.v")
    present = []
    for kind, t in (("key", k), ("value", v)):
        ins = [f"past.{i}.{kind}", t] if phase == "decode" else [t]
        name = f"present.{i}.{kind}"
        g.nodes.append(helper.make_node("Concat", ins, [name], name=f"{p}.attn.{kind[0]}_cache",
                                        axis=2))
        present.append(name)
    grouped = [g.op("Reshape", [g.op("Expand", [g.op("Unsqueeze", [t, g.const(f"{p}.attn.{n}.ax", np.array([2]))],
                                                      f"{p}.attn.{n}.unsq"),
                                                 g.const(f"{p}.attn.{n}.rep", np.array([1, 1, rep, 1, 1]))],
                                       f"{p}.attn.{n}.expand"),
                                g.const(f"{p}.attn.{n}.gshape", np.array([1, cfg.heads, -1, d]))],
                        f"{p}.attn.{n}.grouped")
               for n, t in (("kg", present[0]), ("vg", present[1]))]
    kt = g.op("Transpose", [grouped[0]], f"{p}.attn.kt", perm=[0, 1, 3, 2])
    scores = g.op("MatMul", [q, kt], f"{p}.attn.scores")
    scaled = g.op("Mul", [scores, g.const(f"{p}.attn.scale", np.array(d ** -0.5, np.float32))],
                  f"{p}.attn.scaled")
    probs = g.op("Softmax", [g.op("Add", [scaled, rope[2]], f"{p}.attn.masked")],
                 f"{p}.attn.softmax", axis=-1)
    ctx = g.op("MatMul", [probs, grouped[1]], f"{p}.attn.context")
    merged = g.op("Reshape", [g.op("Transpose", [ctx], f"{p}.attn.ctx_t", perm=[0, 2, 1, 3]),
                              g.const(f"{p}.attn.merge", np.array([1, -1, cfg.hidden]))],
                  f"{p}.attn.merged")
    return merged, present


# --------------------------------------------------------------------------- numpy reference


class _Float64(dict):
    """Weights cast to float64 on each use (the whole model at once would double memory)."""

    def __getitem__(self, key: str) -> np.ndarray:
        return super().__getitem__(key).astype(np.float64)


def numpy_forward(cfg: DecoderConfig, weights: dict[str, np.ndarray], ids: np.ndarray) -> np.ndarray:
    """Logits [N, V] of a full causal run over ``ids`` [N] (float64 numpy, no cache)."""
    w = _Float64(weights)
    n, d, rep = len(ids), cfg.head_dim, cfg.heads // cfg.kv_heads
    inv = 1.0 / cfg.rope_theta ** (np.arange(0, d, 2) / d)
    ang = np.arange(n)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rms(x: np.ndarray, g: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.eps) * g

    def rope(x: np.ndarray) -> np.ndarray:  # [heads, n, d]
        rot = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], -1)
        return x * cos + rot * sin

    h = w["embed.weight"][ids]
    causal = np.triu(np.full((n, n), -np.inf), 1)
    for i in range(cfg.layers):
        p = f"layers.{i}"
        x = rms(h, w[f"{p}.attn_norm.weight"])
        q = rope((x @ w[f"{p}.q_proj.weight"].T).reshape(n, cfg.heads, d).transpose(1, 0, 2))
        k = rope((x @ w[f"{p}.k_proj.weight"].T).reshape(n, cfg.kv_heads, d).transpose(1, 0, 2))
        v = (x @ w[f"{p}.v_proj.weight"].T).reshape(n, cfg.kv_heads, d).transpose(1, 0, 2)
        k, v = np.repeat(k, rep, axis=0), np.repeat(v, rep, axis=0)
        s = q @ k.transpose(0, 2, 1) / np.sqrt(d) + causal
        s = np.exp(s - s.max(-1, keepdims=True))
        ctx = (s / s.sum(-1, keepdims=True)) @ v
        h = h + ctx.transpose(1, 0, 2).reshape(n, cfg.hidden) @ w[f"{p}.o_proj.weight"].T
        x = rms(h, w[f"{p}.mlp_norm.weight"])
        gate = x @ w[f"{p}.gate_proj.weight"].T
        act = gate / (1 + np.exp(-gate)) * (x @ w[f"{p}.up_proj.weight"].T)
        h = h + act @ w[f"{p}.down_proj.weight"].T
    return rms(h, w["norm.weight"]) @ w["lm_head.weight"].T


__all__ = ["PHASES", "DecoderConfig", "build_decoder", "numpy_forward", "weight_names"]
