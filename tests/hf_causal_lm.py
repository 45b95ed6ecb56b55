"""A Hugging Face causal LM exported as a user exports one: ``torch.onnx.export`` with its
KV cache as inputs and outputs (``input_ids``, ``attention_mask``, ``position_ids``,
``past_key_values.{i}.key|value`` -> ``logits``, ``present.{i}.key|value``). Used by
``tests/test_llm_hf_phases.py`` (a tiny random Llama) and ``bench/hf_export.py``
(SmolLM2's real weights). Needs torch and transformers."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any


def export_with_cache(model: Any, path: Path, *, layers: int, kv_heads: int, head_dim: int,
                      vocab: int) -> None:
    """Export ``model`` (a ``*ForCausalLM`` in eval mode) to ``path``, opset 17, the
    TorchScript exporter, the cache flattened as ``past_key_values.{i}.*`` / ``present.*``."""
    import torch
    from transformers.cache_utils import DynamicCache

    class WithCache(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, input_ids, attention_mask, position_ids, *past):  # noqa: ANN001
            cache = DynamicCache()
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.m(input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids, past_key_values=cache, use_cache=True)
            kv = out.past_key_values
            flat = []
            for i in range(layers):
                layer = kv.layers[i] if hasattr(kv, "layers") else None
                flat += ([layer.keys, layer.values] if layer is not None
                         else [kv.key_cache[i], kv.value_cache[i]])
            return (out.logits, *flat)

    past = [f"past_key_values.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    outs = ["logits"] + [n.replace("past_key_values", "present") for n in past]
    dynamic = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "total"},
               "position_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}
    dynamic.update({n: {0: "batch", 2: "past"} for n in past})
    dynamic.update({n: {0: "batch", 2: "total"} for n in outs[1:]})
    args = (torch.randint(0, vocab, (1, 3)), torch.ones(1, 8, dtype=torch.long),
            torch.arange(5, 8)[None], *[torch.randn(1, kv_heads, 5, head_dim) for _ in past])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(WithCache(), args, str(path),
                          input_names=["input_ids", "attention_mask", "position_ids", *past],
                          output_names=outs, dynamic_axes=dynamic, opset_version=17,
                          dynamo=False)
