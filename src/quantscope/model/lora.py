"""A LoRA adapter on a decoder's Linears: merged into the base weights, or kept beside them.

The choice field report 004's user faces: a LoRA adapter ``ΔW = s · B A`` (``A``
``[r, in]``, ``B`` ``[out, r]``) either

- **merged**: ``W + ΔW`` before quantization (one graph, the adapter's precision is the
  Linear's), or
- **separate**: the base Linear unchanged and two small MatMuls beside it,
  ``y = x Wᵀ + (x Aᵀ)(s B)ᵀ`` (``{name}.lora_a``, ``{name}.lora_b``, summed by
  ``{name}.lora_add``): the adapter can stay at 16 bit while the base is quantized (and be
  swapped without recompiling the base on targets that allow it).

Both are the same function in FP32 (:func:`attach_adapter` vs :func:`merge_adapter`,
checked in the tests). A Linear is a ``MatMul`` node whose second input is a 2-D
initializer ``Wᵀ`` ``[in, out]`` (as the built-in decoders are written). ``lora_a`` reads
the Linear's own input, so the ``rotate`` rewrite treats it as one more reader of the
RMSNorm output (γ and the rotation folded into ``Aᵀ``, exactly).

No adapter ships in a registry package, so :func:`synthetic_adapter` draws one: random
``A``, ``B`` of rank ``r`` scaled so that ``‖ΔW‖_F = strength · ‖W‖_F`` per Linear (a
fine-tune's typical relative update is a few percent to ~20 %). Adapters are files:
``.npz`` with ``{name}.A``, ``{name}.B`` and the scale folded into ``B``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantscope.types import QuantscopeError

SUFFIXES = (".lora_a", ".lora_b", ".lora_add")  # the nodes (and groups) a separate adapter adds


@dataclass(frozen=True)
class Adapter:
    """Per Linear node name: ``A`` [r, in] and ``B`` [out, r] (the scale folded into B)."""

    layers: tuple[tuple[str, np.ndarray, np.ndarray], ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _, _ in self.layers)

    def delta(self, name: str) -> np.ndarray:
        """``ΔW`` [out, in] of one Linear."""
        for n, a, b in self.layers:
            if n == name:
                return b.astype(np.float64) @ a.astype(np.float64)
        raise KeyError(name)

    def save(self, path: str | Path) -> None:
        arrays = {}
        for n, a, b in self.layers:
            arrays[f"{n}.A"], arrays[f"{n}.B"] = a, b
        np.savez(path, **arrays)


def read_adapter(path: str | Path) -> Adapter:
    """An adapter ``.npz`` (:meth:`Adapter.save`); a bad file: one line."""
    try:
        with np.load(path, allow_pickle=False) as z:
            names = sorted({k.rsplit(".", 1)[0] for k in z.files})
            layers = tuple((n, z[f"{n}.A"], z[f"{n}.B"]) for n in names)
    except (OSError, ValueError, KeyError) as e:
        raise QuantscopeError(f"'{path}' is not a LoRA adapter file ({{name}}.A / {{name}}.B "
                              f"arrays): {e}") from None
    for n, a, b in layers:
        if a.ndim != 2 or b.ndim != 2 or b.shape[1] != a.shape[0]:
            raise QuantscopeError(f"adapter '{path}': {n}.A {a.shape} and {n}.B {b.shape} are "
                                  "not [r, in] and [out, r]")
    return Adapter(layers)


def _linears(proto: onnx.ModelProto) -> dict[str, tuple[onnx.NodeProto, onnx.TensorProto]]:
    inits = {t.name: t for t in proto.graph.initializer}
    return {n.name: (n, inits[n.input[1]]) for n in proto.graph.node
            if n.op_type == "MatMul" and len(n.input) == 2 and n.input[1] in inits
            and len(inits[n.input[1]].dims) == 2}


def linear_names(proto: onnx.ModelProto, kinds: Sequence[str]) -> tuple[str, ...]:
    """The Linear nodes whose name ends with one of ``kinds`` (``q_proj``, ``v_proj``)."""
    return tuple(n for n in _linears(proto) if n.rsplit(".", 1)[-1] in kinds)


def synthetic_adapter(proto: onnx.ModelProto, *, kinds: Sequence[str] = ("q_proj", "v_proj"),
                      rank: int = 8, strength: float = 0.1, seed: int = 0) -> Adapter:
    """A random rank-``rank`` adapter on the ``kinds`` Linears (see the module docstring)."""
    lin = _linears(proto)
    names = linear_names(proto, kinds)
    if not names:
        raise QuantscopeError(f"no Linear named *.{' / *.'.join(kinds)} to adapt")
    rng = np.random.default_rng(seed)
    layers = []
    for name in names:
        wt = numpy_helper.to_array(lin[name][1])  # [in, out]
        n_in, n_out = wt.shape
        a = rng.standard_normal((rank, n_in)) / np.sqrt(n_in)
        b = rng.standard_normal((n_out, rank))
        scale = strength * np.linalg.norm(wt) / np.linalg.norm(b @ a)
        layers.append((name, a.astype(np.float32), (b * scale).astype(np.float32)))
    return Adapter(tuple(layers))


def _check(proto: onnx.ModelProto, adapter: Adapter
           ) -> dict[str, tuple[onnx.NodeProto, onnx.TensorProto]]:
    lin = _linears(proto)
    for name, a, b in adapter.layers:
        if name not in lin:
            raise QuantscopeError(f"the adapter names '{name}', which is no Linear (MatMul with "
                                  "a 2-D weight) of this graph")
        shape = tuple(lin[name][1].dims)
        if shape != (a.shape[1], b.shape[0]):
            raise QuantscopeError(f"adapter layer '{name}' is [{b.shape[0]}, {a.shape[1]}], its "
                                  f"weight [{shape[1]}, {shape[0]}]")
    return lin


def merge_adapter(proto: onnx.ModelProto, adapter: Adapter) -> onnx.ModelProto:
    """A copy of ``proto`` with ``Wᵀ + ΔWᵀ`` in each adapted Linear."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    lin = _check(out, adapter)
    for name, _, _ in adapter.layers:
        t = lin[name][1]
        wt = numpy_helper.to_array(t).astype(np.float64) + adapter.delta(name).T
        t.CopyFrom(numpy_helper.from_array(wt.astype(np.float32), t.name))
    return out


def attach_adapter(proto: onnx.ModelProto, adapter: Adapter) -> onnx.ModelProto:
    """A copy of ``proto`` with the adapter beside each adapted Linear (module docstring):
    the Linear's readers read ``{name}.lora_add``'s output; every original node and tensor
    keeps its name."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    lin = _check(out, adapter)
    graph = out.graph
    nodes = list(graph.node)
    renamed: dict[str, str] = {}
    extra: dict[str, list[onnx.NodeProto]] = {}
    for name, a, b in adapter.layers:
        node = lin[name][0]
        y = node.output[0]
        sa, sb = f"{name}.lora_a", f"{name}.lora_b"
        graph.initializer.extend([numpy_helper.from_array(np.ascontiguousarray(a.T), f"{sa}.T"),
                                  numpy_helper.from_array(np.ascontiguousarray(b.T), f"{sb}.T")])
        extra[name] = [
            helper.make_node("MatMul", [node.input[0], f"{sa}.T"], [sa], name=sa),
            helper.make_node("MatMul", [sa, f"{sb}.T"], [sb], name=sb),
            helper.make_node("Add", [y, sb], [f"{name}.lora_add"], name=f"{name}.lora_add")]
        renamed[y] = f"{name}.lora_add"
    outputs = {o.name for o in graph.output}
    if outputs & set(renamed):
        raise QuantscopeError(f"adapted Linear output '{sorted(outputs & set(renamed))[0]}' is a "
                              "graph output: not supported")
    new = []
    for n in nodes:
        for i, x in enumerate(n.input):
            if x in renamed:
                n.input[i] = renamed[x]
        new.append(n)
        new += extra.get(n.name, [])
    del graph.node[:]
    graph.node.extend(new)
    return out


def adapter_groups(names: Sequence[str], adapter: Adapter) -> tuple[str, ...]:
    """The group names a separate adapter adds, among ``names`` (a graph's groups)."""
    want = {f"{n}{s}" for n in adapter.names for s in SUFFIXES}
    return tuple(n for n in names if n in want)


__all__ = ["Adapter", "SUFFIXES", "adapter_groups", "attach_adapter", "linear_names",
           "merge_adapter", "read_adapter", "synthetic_adapter"]
