"""Classes of a decoder's decision groups, by the group names :mod:`quantscope.zoo.decoder`
writes (``layers.{i}.attn.scores``, ``layers.{i}.mlp.gate_proj`` …): what the decoder
``whatif`` lifts one class at a time, and what ``bench/llm_diagnose.py`` varies.

A group a rewrite split along the tokens (``gatedsplit``: ``<group>/tok<i>``,
``<group>/concat``) belongs to its group's class. A decoder whose graphs name their groups
otherwise has empty classes (the callers say so).
"""

from __future__ import annotations

import re

CLASSES: dict[str, str] = {
    "scores": r"\.attn\.scores$", "softmax": r"\.attn\.softmax$",
    "context": r"\.attn\.context$", "gated": r"\.mlp\.gated$",
    "rope": r"\.attn\.[qk]\.(neg|rotate|cos|rope)$", "kv": r"\.attn\.[kv]_cache$",
    "q": r"\.q_proj$", "k": r"\.k_proj$", "v": r"\.v_proj$", "o": r"\.o_proj$",
    "gate": r"\.gate_proj$", "up": r"\.up_proj$", "down": r"\.down_proj$",
    "residual": r"_residual$", "norm": r"(_norm|^norm)$", "embed": r"^embed$",
    "lm_head": r"^lm_head$",
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
    return [n for n in picked if n.split(".")[1] in layers] if layers else picked
