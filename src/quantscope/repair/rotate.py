"""Rotate the residual stream of an RMSNorm decoder (QuaRot / SpinQuant R1, optional R4).

An orthogonal ``R`` (``R Rᵀ = I``) leaves an RMSNorm without its gain unchanged up to the
rotation: ``rms(x R) = rms(x)``, so ``RMSNorm₁(x R) = RMSNorm₁(x) R``. The rewrite folds
each norm's gain γ into the Linears that read it and then carries the whole residual
stream in the rotated basis ``h' = h R1``:

=======================  ==============================================================
embedding (``Gather``)   rows ``E R1``
RMSNorm                  γ -> ones (the op stays: the graph keeps its nodes and names)
a Linear reading a norm  ``W [in, out]`` -> ``R1ᵀ diag(γ) W`` (q/k/v, gate/up, lm_head)
a Linear writing the     ``W [in, H]`` -> ``W R1`` (attention output, down projection)
stream (residual Add)
R4 (``online=True``)     before each FFN down projection (:func:`linear_families`
                         ``down``) one new ``MatMul(x, R4)`` node ``<down>/rotate_in``
                         and the down projection's ``W`` -> ``R4ᵀ W``: an extra
                         ffn x ffn Linear per layer that the compiler must run as a dense
                         layer (no fast Walsh-Hadamard kernel is assumed); the plan
                         counts it as a weighted group
the matrix               width 12^b x 2^a (576 = 12 x 12 x 4, 1536 = 12 x 128): a
                         Hadamard matrix (Paley's H12 and Sylvester's H2, Kronecker
                         products) / sqrt(n); otherwise a random orthogonal matrix (QR
                         of a seeded Gaussian, signs fixed): :func:`rotation_matrix`
                         says which
=======================  ==============================================================

The FP32 function is unchanged up to float rounding; the rotation is data-independent
(a fixed matrix per width and seed), so the prefill and decode graphs of one decoder,
rotated separately, get the same weights (:func:`quantscope.rewrites.phases`).

Where it applies (:func:`find_stream`): the stream starts at a ``Gather`` of an
embedding initializer, each stream tensor is read only by ``RMSNormalization`` (last
axis, initializer gain) and residual ``Add`` nodes whose other input is a Linear
(``MatMul`` with an initializer weight) output; each norm's output is read only by such
Linears; no initializer touched is read twice. Anything else: it does not apply, and
the reason says which node.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantscope.model.families import linear_families
from quantscope.model.load import Model
from quantscope.repair import Change, Repair, attr, consumers_of, use_counts, with_initializers

METADATA_KEY = "quantscope.rotate"
UNVERIFIED = ("unverified on a device: the rotated weights are ordinary dense weights "
              "(nothing new asked of the compiler without R4); with R4 each FFN down "
              "projection gets one extra dense ffn x ffn MatMul in front")


@dataclass(frozen=True)
class Stream:
    """The residual stream of an RMSNorm decoder, as graph facts."""

    width: int
    embedding: str  # initializer [V, H] read by the Gather
    norms: tuple[tuple[str, str], ...]  # (norm node, gain initializer)
    readers: tuple[tuple[str, str, str], ...]  # (MatMul node, weight [H, out], gain)
    writers: tuple[tuple[str, str], ...]  # (MatMul node, weight [in, H])


def _paley12() -> np.ndarray:
    """The 12 x 12 Hadamard matrix of Paley's construction (q = 11)."""
    squares = {i * i % 11 for i in range(1, 11)}
    jacobsthal = np.array([[0 if i == j else 1 if (j - i) % 11 in squares else -1
                            for j in range(11)] for i in range(11)])
    s = np.zeros((12, 12))
    s[0, 1:], s[1:, 0], s[1:, 1:] = 1, -1, jacobsthal
    return np.eye(12) + s


def rotation_matrix(n: int, seed: int = 0) -> tuple[np.ndarray, str]:
    """An orthogonal n x n matrix (float64) and what it is: ``hadamard`` when n is
    12^b x 2^a (Kronecker products of Paley's H12 and Sylvester's H2, scaled by
    1/sqrt(n): every entry +-1/sqrt(n)), else ``random orthogonal`` (seeded)."""
    h, rest = np.ones((1, 1)), n
    while rest > 1 and rest % 12 == 0:
        h, rest = np.kron(h, _paley12()), rest // 12
    while rest > 1 and rest % 2 == 0:
        h, rest = np.kron(h, np.array([[1.0, 1.0], [1.0, -1.0]])), rest // 2
    if n > 0 and rest == 1:
        return h / np.sqrt(n), "hadamard"
    q, r = np.linalg.qr(np.random.default_rng(seed).standard_normal((n, n)))
    return q * np.sign(np.diag(r))[None, :], "random orthogonal"


def _init_arrays(model: Model) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in model.graph.initializer}


def _linear_weight(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> str | None:
    if node.op_type != "MatMul" or len(node.input) < 2 or node.input[1] not in inits:
        return None
    return node.input[1] if len(inits[node.input[1]].dims) == 2 else None


def _start(model: Model, inits: dict[str, onnx.TensorProto]) -> tuple[str, str] | str:
    """(embedding initializer, stream tensor) of the first RMSNorm's stream, or why not."""
    norms = [n for n in model.graph.node if n.op_type == "RMSNormalization"]
    if not norms:
        return "no RMSNormalization in the graph: not an RMSNorm decoder"
    gathers = [n for n in model.graph.node if n.op_type == "Gather" and n.input[0] in inits
               and attr(n, "axis", 0) == 0 and len(inits[n.input[0]].dims) == 2]
    readers = consumers_of(model.graph)
    for g in gathers:
        if any(r.op_type == "RMSNormalization" for r in readers.get(g.output[0], [])):
            return g.input[0], g.output[0]
    return "no embedding Gather whose output an RMSNormalization reads"


def _norm_readers(norm: onnx.NodeProto, readers: dict[str, list[onnx.NodeProto]],
                  inits: dict[str, onnx.TensorProto], outputs: set[str]) -> list[tuple[str, str]] | str:
    out = norm.output[0]
    if out in outputs:
        return f"the output of '{norm.name}' is a graph output"
    found = []
    for r in readers.get(out, []):
        w = _linear_weight(r, inits)
        if w is None or r.input[0] != out:
            return f"'{r.name}' ({r.op_type}) reads '{norm.name}' and is not a Linear"
        found.append((r.name, w))
    return found or f"nothing reads '{norm.name}'"


def _walk(model: Model, inits: dict[str, onnx.TensorProto], t: str, width: int
          ) -> tuple[list[tuple[str, str]], list[tuple[str, str, str]],
                     list[tuple[str, str]]] | str:
    """Follow the stream from tensor ``t``: its norms, their readers, the writers."""
    readers = consumers_of(model.graph)
    producer = {o: n for n in model.graph.node for o in n.output}
    outputs = set(model.output_names())
    norms, reads, writes = [], [], []
    while True:
        if t in outputs:
            return f"the residual stream tensor '{t}' is a graph output"
        nxt = None
        for r in readers.get(t, []):
            if r.op_type == "RMSNormalization":
                if attr(r, "axis", -1) != -1 or len(r.input) < 2 or r.input[1] not in inits:
                    return f"'{r.name}' normalises more than the last axis or has no gain"
                found = _norm_readers(r, readers, inits, outputs)
                if isinstance(found, str):
                    return found
                norms.append((r.name, r.input[1]))
                reads += [(m, w, r.input[1]) for m, w in found]
            elif r.op_type == "Add" and nxt is None:
                other = producer.get(r.input[1] if r.input[0] == t else r.input[0])
                w = _linear_weight(other, inits) if other is not None else None
                if w is None or inits[w].dims[1] != width:
                    return f"the residual Add '{r.name}' adds something no Linear wrote"
                writes.append((other.name, w))  # type: ignore[union-attr]
                nxt = r.output[0]
            else:
                return f"'{r.name}' ({r.op_type}) reads the residual stream '{t}'"
        if nxt is None:
            return norms, reads, writes
        t = nxt


def find_stream(model: Model) -> Stream | str:
    """The model's residual stream (see the module docstring), or why it has none."""
    inits = _init_arrays(model)
    start = _start(model, inits)
    if isinstance(start, str):
        return start
    embedding, t = start
    width = int(inits[embedding].dims[1])
    walked = _walk(model, inits, t, width)
    if isinstance(walked, str):
        return walked
    norms, reads, writes = walked
    left = [n.name for n in model.graph.node if n.op_type == "RMSNormalization"
            and n.name not in {a for a, _ in norms}]
    if left:
        return f"RMSNormalization '{left[0]}' is not on the residual stream"
    counts = use_counts(model.graph)
    touched = [embedding, *(g for _, g in norms), *(w for _, w, _ in reads),
               *(w for _, w in writes)]
    shared = [t for t in touched if counts.get(t, 0) > 1]
    if shared:
        return f"initializer '{shared[0]}' is read by more than one node"
    return Stream(width, embedding, tuple(norms), tuple(reads), tuple(writes))


def _arr(inits: dict[str, onnx.TensorProto], name: str) -> np.ndarray:
    return numpy_helper.to_array(inits[name]).astype(np.float64)


def _r4_nodes(model: Model, stream: Stream, arrays: dict[str, np.ndarray], seed: int
              ) -> tuple[list[onnx.NodeProto], list[Change], str]:
    """R4 before each FFN down projection: the new nodes (in graph order) and changes."""
    families = linear_families(model)
    inits = _init_arrays(model)
    downs = {m: w for m, w in stream.writers if families.get(m) == "down"}
    nodes, changes, kind = [], [], ""
    for node in model.graph.node:
        if node.name in downs:
            w = downs[node.name]
            r4, kind = rotation_matrix(int(inits[w].dims[0]), seed)
            name = f"{node.name}/rotate_in"
            arrays[f"{name}.r4"] = r4.astype(np.float32)
            arrays[w] = (r4.T @ arrays[w].astype(np.float64)).astype(np.float32)
            nodes.append(helper.make_node("MatMul", [node.input[0], f"{name}.r4"], [name],
                                          name=name))
            node.input[0] = name
            changes.append(Change(name, "insert", note=f"R4 ({kind}) before '{node.name}'"))
        nodes.append(node)
    return nodes, changes, kind


def rotate_stream(model: Model, *, online: bool = False, seed: int = 0) -> Repair:
    """Fold the RMSNorm gains and rotate the residual stream (module docstring); with
    ``online`` also R4 before each FFN down projection. Not an RMSNorm decoder: nothing
    changed, the reason says why."""
    start = time.perf_counter()
    stream = find_stream(model)
    if isinstance(stream, str):
        return Repair(name="rotate", reason=stream, proto=model.proto)
    inits = _init_arrays(model)
    r1, kind = rotation_matrix(stream.width, seed)
    f32 = np.float32  # each product in float64, kept in float32 (the model's copy: half)
    arrays: dict[str, np.ndarray] = {stream.embedding: (_arr(inits, stream.embedding) @ r1)
                                     .astype(f32)}
    for _, w, gain in stream.readers:
        arrays[w] = (r1.T @ (_arr(inits, gain)[:, None] * _arr(inits, w))).astype(f32)
    for _, w in stream.writers:
        arrays[w] = (_arr(inits, w) @ r1).astype(f32)
    for _, gain in stream.norms:
        arrays[gain] = np.ones(int(inits[gain].dims[0]), f32)
    changes = [Change(stream.embedding, "multiply", note=f"rows x R1 ({kind})"),
               *(Change(g, "divide", note="gain folded into the Linears reading the norm")
                 for _, g in stream.norms),
               *(Change(w, "multiply", note="R1ᵀ diag(γ) W") for _, w, _ in stream.readers),
               *(Change(w, "multiply", note="W R1") for _, w in stream.writers)]
    reason = (f"R1 ({kind}, {stream.width} wide) on the residual stream: {len(stream.norms)} "
              f"RMSNorm gains folded into {len(stream.readers)} Linears, "
              f"{len(stream.writers)} writers rotated")
    proto = model.proto
    if online:
        clone = onnx.ModelProto()
        clone.CopyFrom(model.proto)
        nodes, added, r4_kind = _r4_nodes(Model(proto=clone, source=model.source), stream,
                                          arrays, seed)
        del clone.graph.node[:]
        clone.graph.node.extend(nodes)
        del clone.graph.value_info[:]
        proto, changes = clone, [*changes, *added]
        reason += (f"; R4 ({r4_kind}) before {len(added)} FFN down projection(s): one extra "
                   "dense MatMul each")
    out = with_initializers(proto, arrays)
    onnx.helper.set_model_props(out, {**{p.key: p.value for p in out.metadata_props},
                                      METADATA_KEY: f"r1={kind};online={online};seed={seed}"})
    return Repair(name="rotate", reason=reason, proto=out, changes=tuple(changes),
                  effect=(("norms", float(len(stream.norms))),),
                  seconds=time.perf_counter() - start)


__all__ = ["METADATA_KEY", "UNVERIFIED", "Stream", "find_stream", "rotate_stream",
           "rotation_matrix"]
