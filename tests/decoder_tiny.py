"""A tiny Llama-style decoder (2 layers, GQA 4/2, RMSNorm, KV cache) built in the tests."""

from __future__ import annotations

import numpy as np

from quantscope.zoo.decoder import DecoderConfig, weight_names

TINY = DecoderConfig(layers=2, hidden=32, heads=4, kv_heads=2, ffn=48, vocab=61, rope_theta=100.0)


def tiny_weights(cfg: DecoderConfig = TINY, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights with the shapes of :func:`weight_names` (norm gains near 1)."""
    rng = np.random.default_rng(seed)
    h, kv = cfg.hidden, cfg.kv_heads * cfg.head_dim
    shapes = {"q_proj": (h, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, h),
              "gate_proj": (cfg.ffn, h), "up_proj": (cfg.ffn, h), "down_proj": (h, cfg.ffn)}
    out: dict[str, np.ndarray] = {}
    for name in weight_names(cfg):
        part = name.split(".")[-2]
        if part.endswith("norm") or name == "norm.weight":
            out[name] = (1 + 0.1 * rng.standard_normal(h)).astype(np.float32)
        elif name in ("embed.weight", "lm_head.weight"):
            out[name] = rng.standard_normal((cfg.vocab, h)).astype(np.float32)
        else:
            shape = shapes[part]
            out[name] = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
    return out
