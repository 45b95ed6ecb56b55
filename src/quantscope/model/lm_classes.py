"""Classes of a decoder's decision groups, by the group names :mod:`quantscope.zoo.decoder`
writes (``layers.{i}.attn.scores``, ``layers.{i}.mlp.gate_proj`` …): what the decoder
``whatif`` lifts one class at a time, and what ``bench/llm_diagnose.py`` varies.

The same classes (but ``kv``) are read from the scope names of a Hugging Face decoder
exported by ``torch.onnx.export`` and converted by ``quantscope phases``
(``/model/layers.{i}/self_attn/q_proj/MatMul``, ``/model/layers.{i}/mlp/Mul`` …). A group a
rewrite split along the tokens (``gatedsplit``: ``<group>/tok<i>``, ``<group>/concat``)
belongs to its group's class. A decoder whose graphs name their groups
otherwise has empty classes (the callers say so).
"""

from __future__ import annotations

import re

# the built-in's group names, then (after |) the scope names torch.onnx.export gives a
# Hugging Face Llama/Qwen/Mistral converted by ``quantscope phases``
# (``/model/layers.0/self_attn/q_proj/MatMul``; its fused norms ``…/input_layernorm``)
CLASSES: dict[str, str] = {
    "scores": r"\.attn\.scores$|/self_attn/MatMul$",
    "softmax": r"\.attn\.softmax$|/self_attn/Softmax$",
    "context": r"\.attn\.context$|/self_attn/MatMul_1$", "gated": r"\.mlp\.gated$|/mlp/Mul$",
    "rope": r"\.attn\.[qk]\.(neg|rotate|cos|rope)$|/self_attn/Neg(_1)?$",
    "kv": r"\.attn\.[kv]_cache$",  # an export's cache Concats have no stable name
    "q": r"\.q_proj$|/q_proj/MatMul$", "k": r"\.k_proj$|/k_proj/MatMul$",
    "v": r"\.v_proj$|/v_proj/MatMul$", "o": r"\.o_proj$|/o_proj/MatMul$",
    "gate": r"\.gate_proj$|/gate_proj/MatMul$", "up": r"\.up_proj$|/up_proj/MatMul$",
    "down": r"\.down_proj$|/down_proj/MatMul$",
    "residual": r"_residual$|/layers\.\d+/Add(_1)?$",
    "norm": r"(_norm|^norm)$|(_layernorm|/norm)$", "embed": r"^embed$|/embed_tokens/Gather$",
    "lm_head": r"^lm_head$|/lm_head/MatMul$",
}
CLASSES["attn"] = "|".join(CLASSES[k] for k in ("scores", "softmax", "context"))
CLASSES["proj"] = "|".join(CLASSES[k] for k in ("q", "k", "v", "o", "gate", "up", "down"))

# what each class is, in words (the whatif's rows)
CLASS_WORDS: dict[str, str] = {
    "proj": "the Linears (q, k, v, o, gate, up, down)",
    "attn": "attention (scores, softmax, context)",
    "kv": "the KV cache (keys and values)",
    "norm": "the RMSNorms",
    "residual": "the residual adds",
    "gated": "the MLPs' gated products",
}


def members(names: list[str], cls: str) -> list[str]:
    """The groups of ``cls`` among ``names``; ``cls.3.7``: only those of layers 3 and 7."""
    cls, *layers = cls.split(".")
    picked = [n for n in names if re.search(CLASSES[cls], re.sub(r"/(tok\d+|concat)$", "", n))]
    if not layers:
        return picked
    return [n for n in picked if (m := _LAYER.search(n)) and m.group(1) in layers]


_LAYER = re.compile(r"layers\.(\d+)[./]")
