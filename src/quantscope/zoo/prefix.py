"""A constant prefix of the KV cache for the decoders :mod:`quantscope.zoo.decoder` builds.

=================  ====================================================================
why                the first position of a decoder (the attention sink) and a few other
                   tokens carry a massive residual activation (hundreds of times the
                   median token) that no static 8-bit grid holds (PrefixQuant, Chen et
                   al. 2024). Their keys and values are computed once in FP32 and put in
                   the cache as constants, so the quantized graphs never run them
the prefix         ``tokens`` (ids) and, per layer ``i``, ``key.{i}`` / ``value.{i}``
                   ``[1, kv_heads, P, head_dim]``: the FP32 prefill's ``present.*`` on
                   those tokens (the cache is causal, so this is what the original graph
                   computes for them in any prompt that begins with them)
prefill graph      :func:`prefixed_prefill`: each cache node ``layers.{i}.attn.k_cache`` /
                   ``v_cache`` (``Concat(k)``, one input) becomes ``Concat(prefix, k)``
                   with the prefix as an initializer ``prefix.{i}.key`` / ``.value``, and
                   the position offset ``pos.past_len`` (0) becomes P: RoPE angles and the
                   causal mask continue after the prefix. ``present.*`` then hold P + N
                   positions, prefix first -- the decode graph's ``past.*`` as it is.
                   A prefill converted from a causal-LM export (``quantscope phases``)
                   has no ``pos.past_len``: its empty past ``past_key_values.{i}.*``
                   (which its mask and positions read the past length from) becomes the
                   prefix, and goes back into each cache ``Concat``
decode graph       unchanged: its ``past.*`` begins with the prefix (the host loads it,
                   or carries prefill's ``present.*`` over, which begins with it)
equal in FP32      prefixed prefill on ``ids`` == the original prefill on
                   ``tokens + ids`` at positions P.. (tests/test_llm_prefix.py, 1e-4)
file               ``.npz``: ``tokens`` and the ``key.{i}`` / ``value.{i}`` arrays
=================  ====================================================================
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper, shape_inference

from quantscope.model.hf_phases import empty_past
from quantscope.types import QuantscopeError

PAST_LEN = "pos.past_len"
TOTAL = "total_sequence"


@dataclass(frozen=True)
class KVPrefix:
    """Prefix token ids and their FP32 keys/values per layer (see the module docstring)."""

    tokens: tuple[int, ...]
    keys: tuple[np.ndarray, ...]  # per layer [1, kv_heads, P, head_dim]
    values: tuple[np.ndarray, ...]

    def __len__(self) -> int:
        return len(self.tokens)

    def cache(self) -> dict[str, np.ndarray]:
        """The prefix as a decode graph's ``past.*`` feeds."""
        out = {}
        for i, (k, v) in enumerate(zip(self.keys, self.values, strict=True)):
            out[f"past.{i}.key"], out[f"past.{i}.value"] = k, v
        return out

    def to_bytes(self) -> bytes:
        arrays = {"tokens": np.array(self.tokens, np.int64)}
        for i, (k, v) in enumerate(zip(self.keys, self.values, strict=True)):
            arrays[f"key.{i}"], arrays[f"value.{i}"] = k, v
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        return buf.getvalue()


def read_prefix(path: str | Path) -> KVPrefix:
    """A prefix ``.npz`` (one line if it is not one)."""
    try:
        with np.load(str(path)) as z:
            layers = sum(1 for k in z.files if k.startswith("key."))
            return KVPrefix(tuple(int(t) for t in z["tokens"]),
                            tuple(z[f"key.{i}"] for i in range(layers)),
                            tuple(z[f"value.{i}"] for i in range(layers)))
    except (OSError, ValueError, KeyError) as exc:
        raise QuantscopeError(f"'{path}' is not a KV prefix file ({exc})") from None


def cache_nodes(proto: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    """``present.*`` output -> the prefill Concat node that writes it (one input each)."""
    outs = {o.name for o in proto.graph.output if o.name.startswith("present.")}
    return {n.output[0]: n for n in proto.graph.node
            if n.op_type == "Concat" and len(n.input) == 1 and n.output[0] in outs}


def prefixed_prefill(proto: onnx.ModelProto, prefix: KVPrefix, *,
                     in_place: bool = False) -> onnx.ModelProto:
    """A prefill graph that reads ``prefix`` as the start of its cache (see the module
    docstring): a copy, or ``proto`` itself edited with ``in_place`` (no second copy of
    the weights); intermediate shapes are dropped (:func:`infer_light` them again)."""
    out = proto
    if not in_place:
        out = onnx.ModelProto()
        out.CopyFrom(proto)
    nodes = cache_nodes(out)
    inits = {t.name: t for t in out.graph.initializer}
    expected = {f"present.{i}.{kind}" for i in range(len(prefix.keys))
                for kind in ("key", "value")}
    # a converted export (model.hf_phases) reads its past length from the empty past itself
    converted = all(empty_past(i, kind) in inits for i in range(len(prefix.keys))
                    for kind in ("key", "value"))
    if not prefix.tokens or set(nodes) != expected or not (PAST_LEN in inits or converted):
        raise QuantscopeError("a KV prefix needs a prefill graph of quantscope's decoder form "
                              f"(one-input cache Concats present.*, and {PAST_LEN} or the "
                              f"empty past of 'quantscope phases') with {len(prefix.keys)} "
                              "layers")
    for i, (k, v) in enumerate(zip(prefix.keys, prefix.values, strict=True)):
        for kind, arr in (("key", k), ("value", v)):
            name = empty_past(i, kind) if converted else f"prefix.{i}.{kind}"
            value = numpy_helper.from_array(np.ascontiguousarray(arr, np.float32), name)
            if converted:
                inits[name].CopyFrom(value)
            else:
                out.graph.initializer.append(value)
            nodes[f"present.{i}.{kind}"].input.insert(0, name)
    if not converted:
        inits[PAST_LEN].CopyFrom(numpy_helper.from_array(np.array(len(prefix), np.int64),
                                                         PAST_LEN))
    for o in out.graph.output:
        if o.name.startswith("present."):
            o.type.tensor_type.shape.dim[2].dim_param = TOTAL
    del out.graph.value_info[:]
    return out


def infer_light(proto: onnx.ModelProto, *, big: int = 1 << 16) -> onnx.ModelProto:
    """``proto`` with its intermediate shapes inferred (ONNX, data propagation on), in place,
    with every initializer over ``big`` bytes emptied meanwhile (its dims stay: shapes need
    nothing else), so the inference copies no weights."""
    saved = {}
    for t in proto.graph.initializer:
        if len(t.raw_data) > big:
            saved[t.name] = t.raw_data
            t.ClearField("raw_data")
    try:
        inferred = shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    finally:
        for t in proto.graph.initializer:
            if t.name in saved:
                t.raw_data = saved[t.name]
    del proto.graph.value_info[:]
    proto.graph.value_info.extend(inferred.graph.value_info)
    return proto


__all__ = ["KVPrefix", "cache_nodes", "infer_light", "prefixed_prefill", "read_prefix"]
