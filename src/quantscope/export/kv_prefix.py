"""The host side of a constant KV prefix (:mod:`quantscope.zoo.prefix`): file names and the
snippet that loads the prefix into the cache.

==============  =====================================================================
files           ``PLAN.prefix.npz`` (``tokens``, ``key.{i}`` / ``value.{i}`` per layer,
                FP32 ``[1, kv_heads, P, head_dim]``) and ``PLAN.prefix.py`` (the snippet),
                written with the plan, all or none
the snippet     loads the ``.npz`` into cache positions ``0 .. P-1`` as ``past.*``; the
                prompt's tokens then run at positions ``P ..`` (decode graph fed that
                cache, or a prefill graph built with the prefix, whose ``present.*``
                begin with it); the prompt must not repeat the prefix tokens
numerics        ORT's reference: the decode graph run token by token from the prefix
                gives the FP32 logits of ``prefix + prompt`` (tested on the tiny decoder)
==============  =====================================================================
"""

from __future__ import annotations

import json
from pathlib import Path

from quantscope.types import Plan

SNIPPET = '''"""Load the constant KV prefix of {plan} into a decoder's cache (quantscope).

Prefix tokens {tokens} ({text}): their keys and values were computed once in FP32 and
are not run through the quantized graphs. Positions of the prompt start at {length}.
"""
from pathlib import Path

import numpy as np

PREFIX = Path(__file__).with_name("{npz}")  # written beside this file


def prefix_cache(path=PREFIX):
    """past.{{i}}.key / past.{{i}}.value [1, kv_heads, {length}, head_dim] for cache slots 0..{last}."""
    with np.load(path) as z:
        layers = sum(1 for k in z.files if k.startswith("key."))
        cache = {{}}
        for i in range(layers):
            cache[f"past.{{i}}.key"] = z[f"key.{{i}}"]
            cache[f"past.{{i}}.value"] = z[f"value.{{i}}"]
        return cache


def generate(decode, prompt_ids, new_tokens):
    """Greedy tokens after prompt_ids (without the prefix tokens), decode graph run token by
    token from the prefix (``decode(feeds) -> dict``, e.g. an ONNX Runtime session's run)."""
    cache, out, tokens = prefix_cache(), None, []
    for t in list(prompt_ids) + [None] * new_tokens:
        if t is None:
            t = int(out["logits"][0, -1].argmax())
            tokens.append(t)
        out = decode({{"input_ids": np.array([[t]], np.int64), **cache}})
        cache = {{k.replace("present.", "past."): v for k, v in out.items()
                 if k.startswith("present.")}}
    return tokens
'''


def prefix_files(plan: str | Path) -> tuple[Path, Path]:
    """The prefix's ``.npz`` and host snippet beside a plan file."""
    plan = Path(plan)
    return plan.with_suffix(".prefix.npz"), plan.with_suffix(".prefix.py")


def host_snippet(plan: str | Path, tokens: list[int], text: list[str]) -> str:
    """The Python snippet of the module docstring for the prefix beside ``plan``."""
    npz = prefix_files(plan)[0].name
    return SNIPPET.format(plan=Path(plan).name, tokens=tokens, text=", ".join(map(repr, text)),
                          length=len(tokens), last=len(tokens) - 1, npz=npz)


def alls_note(tokens: list[int], text: list[str]) -> str:
    """The ``.alls`` comment: how the prefix reaches the device."""
    return (f"# KV prefix: tokens {tokens} ({', '.join(map(repr, text))}) are not run on the "
            f"device: the host writes their FP32 keys/values (PLAN.prefix.npz) into cache "
            f"slots 0..{len(tokens) - 1}; prompt positions start at {len(tokens)}")


def plan_alls_note(plan: Plan) -> str | None:
    """:func:`alls_note` for a plan that records a prefix (``meta['kv_prefix']``), else None."""
    text = dict(plan.meta).get("kv_prefix")
    if not text:
        return None
    rec = json.loads(text)
    return alls_note(rec["tokens"], rec["text"])


__all__ = ["alls_note", "host_snippet", "plan_alls_note", "prefix_files"]
