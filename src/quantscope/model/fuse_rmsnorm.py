"""RMSNorms an exporter spelt out in elementwise ops -> one ``RMSNormalization`` node each.

``torch.onnx.export`` of a Hugging Face Llama/Qwen/Mistral writes each RMSNorm as

    x' = Cast(x)                      (to float; optional)
    r  = 1 / Sqrt(ReduceMean(Pow(x', 2), axes=[-1]) + eps)     (or Reciprocal, or Pow -0.5)
    y  = weight * Cast(x' * r)        (Casts optional; either operand order)

quantscope's decoder machinery (the residual stream, the norm class, the rotation that
folds each norm's gain) reads normalisations as the ``RMSNormalization`` op (opset 23), as
the built-in decoder writes them. :func:`fuse_rms_norms` replaces each chain whose
intermediate tensors nothing else reads by ``RMSNormalization(x, weight, axis=-1,
epsilon=eps)`` named after the chain's scope (``/model/layers.0/input_layernorm/Mul_1`` ->
``/model/layers.0/input_layernorm``), output tensor unchanged. The function is the same in
FP32 up to rounding (``x / sqrt(m + eps)`` against ``x * (1 / sqrt(m + eps))``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

RMS_OPSET = 23  # RMSNormalization
_FLOAT = onnx.TensorProto.FLOAT


_SMALL = 16  # elements: the constants a chain reads the value of (exponents, eps, 1)


def _consts(graph: onnx.GraphProto) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """The small constants' values, and every constant's rank (a weight's data is never
    read: it may be held apart from the graph, :mod:`quantscope.model.hf_phases`)."""
    values: dict[str, np.ndarray] = {}
    ranks: dict[str, int] = {}
    for t in graph.initializer:
        ranks[t.name] = len(t.dims)
        if int(np.prod(t.dims, dtype=np.int64)) <= _SMALL:
            values[t.name] = numpy_helper.to_array(t)
    for n in graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            t = n.attribute[0].t
            ranks[n.output[0]] = len(t.dims)
            if int(np.prod(t.dims, dtype=np.int64)) <= _SMALL:
                values[n.output[0]] = numpy_helper.to_array(t)
        elif n.op_type == "Identity" and n.input[0] in ranks:  # exporters alias equal weights
            ranks[n.output[0]] = ranks[n.input[0]]
            if n.input[0] in values:
                values[n.output[0]] = values[n.input[0]]
    return values, ranks


def _scalar(consts: dict[str, np.ndarray], name: str) -> float | None:
    v = consts.get(name)
    return float(v.reshape(-1)[0]) if v is not None and v.size == 1 else None


def fuse_rms_norms(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy of ``proto`` (opset >= 23) with each spelt-out RMSNorm fused; and how many
    (``proto`` itself, not copied, when none is found). ``proto`` must be at opset 23
    already when any is found (the caller upgrades)."""
    fused, dropped = _find_norms(proto)
    if not fused:
        return proto, 0
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    graph = out.graph
    nodes = []
    for n in graph.node:
        if n.name in fused:
            nodes.append(fused[n.name])
        elif n.name not in dropped:
            nodes.append(n)
    del graph.node[:]
    graph.node.extend(nodes)
    _prune(graph)
    return out, len(fused)


def _find_norms(proto: onnx.ModelProto) -> tuple[dict[str, onnx.NodeProto], set[str]]:
    """The chains to fuse (read only): the weight Mul's name -> its RMSNormalization, and
    the names of the other nodes of the chains."""
    graph = proto.graph
    consts, ranks = _consts(graph)
    producer = {o: n for n in graph.node for o in n.output}
    readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for n in graph.node:
        for i in n.input:
            readers[i].append(n)
    outputs = {o.name for o in graph.output}

    def only_reader(tensor: str, op: str) -> onnx.NodeProto | None:
        rs = readers.get(tensor, [])
        return rs[0] if len(rs) == 1 and rs[0].op_type == op and tensor not in outputs else None

    floats = _float32_tensors(proto)

    def through_casts(tensor: str) -> str:
        """Back through Casts to float that change nothing (their input is float32)."""
        node = producer.get(tensor)
        while (node is not None and node.op_type == "Cast" and _to(node) == _FLOAT
               and node.input[0] in floats):
            tensor = node.input[0]
            node = producer.get(tensor)
        return tensor

    fused: dict[str, onnx.NodeProto] = {}  # the weight Mul's name -> its replacement
    dropped: set[str] = set()
    for mean in graph.node:
        if mean.op_type != "ReduceMean" or not _last_axis(mean, consts):
            continue
        pow_ = producer.get(mean.input[0])
        if pow_ is None or pow_.op_type != "Pow" or _scalar(consts, pow_.input[1]) != 2.0:
            continue
        x = pow_.input[0]
        add = only_reader(mean.output[0], "Add")
        if add is None or only_reader(pow_.output[0], "ReduceMean") is None:
            continue
        eps = _scalar(consts, add.input[1] if add.input[0] == mean.output[0] else add.input[0])
        chain = _rsqrt(add, only_reader, consts)
        if eps is None or chain is None:
            continue
        rsqrt_nodes, r = chain
        mul = only_reader(r, "Mul")
        if mul is None or through_casts(_other(mul, r)) != through_casts(x):
            continue
        tail, t = [], mul.output[0]
        cast = only_reader(t, "Cast")
        if cast is not None and _to(cast) == _FLOAT:
            tail.append(cast)
            t = cast.output[0]
        scale = only_reader(t, "Mul")
        weight = _other(scale, t) if scale is not None else None
        if weight is None or ranks.get(weight) != 1:
            continue
        source = through_casts(x)
        casts = _cast_chain(x, source, producer)
        if tail and mul.output[0] not in floats:
            continue  # a Cast after the product that changes the type: not ours to drop
        # the norm reads what the no-op Casts read; they go too when nothing else reads them
        gone = [pow_, mean, add, *rsqrt_nodes, mul, *tail, scale]
        if all({r.name for r in readers[c.output[0]]} <= {pow_.name, mul.name}
               | {c2.name for c2 in casts} for c in casts):
            gone += casts
        scope = scale.name.rsplit("/", 1)[0] if "/" in scale.name else f"{scale.name}.rms"
        fused[scale.name] = helper.make_node(
            "RMSNormalization", [source, weight], [scale.output[0]], scope, axis=-1,
            epsilon=eps)
        dropped.update(n.name for n in gone if n is not scale)
    return fused, dropped


def drop_noop_casts(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy of ``proto`` without the Casts to float32 of float32 tensors (an exporter's
    ``x.to(torch.float32)`` on a float32 model), their readers reading the input instead:
    each would be a decision group of its own that no compiler names; and how many. A Cast
    that writes a graph output stays."""
    floats = _float32_tensors(proto)
    outputs = {o.name for o in proto.graph.output}
    alias = {n.output[0]: n.input[0] for n in proto.graph.node
             if n.op_type == "Cast" and _to(n) == _FLOAT and n.input[0] in floats
             and n.output[0] not in outputs}
    if not alias:
        return proto, 0

    def root(t: str) -> str:
        while t in alias:
            t = alias[t]
        return t

    out = onnx.ModelProto()
    out.CopyFrom(proto)
    keep = [n for n in out.graph.node if not (n.op_type == "Cast" and n.output[0] in alias)]
    for n in keep:
        n.input[:] = [root(i) for i in n.input]
    del out.graph.node[:]
    out.graph.node.extend(keep)
    return out, len(alias)


def _prune(graph: onnx.GraphProto) -> None:
    """Drop the Constant nodes and initializers nothing reads any more (the chains' eps,
    exponents and ones)."""
    read = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    keep = [n for n in graph.node if n.op_type != "Constant" or n.output[0] in read]
    if len(keep) != len(graph.node):
        del graph.node[:]
        graph.node.extend(keep)
    inputs = {i.name for i in graph.input}
    unused = [t for t in graph.initializer if t.name not in read and t.name not in inputs]
    for t in unused:
        graph.initializer.remove(t)


def _to(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "to"), -1)


def _other(node: onnx.NodeProto, tensor: str) -> str:
    return node.input[1] if node.input[0] == tensor else node.input[0]


def _last_axis(mean: onnx.NodeProto, consts: dict[str, np.ndarray]) -> bool:
    keep = next((a.i for a in mean.attribute if a.name == "keepdims"), 1)
    axes = next((list(a.ints) for a in mean.attribute if a.name == "axes"), None)
    if axes is None and len(mean.input) > 1 and mean.input[1] in consts:
        axes = [int(v) for v in consts[mean.input[1]].reshape(-1)]
    return keep == 1 and axes == [-1]


def _rsqrt(add: onnx.NodeProto, only_reader: Callable[[str, str], onnx.NodeProto | None],
           consts: dict[str, np.ndarray]) -> tuple[list[onnx.NodeProto], str] | None:
    """Sqrt -> Div(1, .) | Reciprocal, or Pow(., -0.5), after ``add``: the nodes, 1/sqrt."""
    sqrt = only_reader(add.output[0], "Sqrt")
    if sqrt is not None:
        inv = only_reader(sqrt.output[0], "Reciprocal")
        if inv is not None:
            return [sqrt, inv], inv.output[0]
        inv = only_reader(sqrt.output[0], "Div")
        if inv is not None and inv.input[1] == sqrt.output[0] \
                and _scalar(consts, inv.input[0]) == 1.0:
            return [sqrt, inv], inv.output[0]
        return None
    pw = only_reader(add.output[0], "Pow")
    if pw is not None and _scalar(consts, pw.input[1]) == -0.5:
        return [pw], pw.output[0]
    return None


def _cast_chain(x: str, source: str, producer: dict[str, onnx.NodeProto]
                ) -> list[onnx.NodeProto]:
    """The Cast nodes from ``source`` up to ``x``."""
    out = []
    while x != source:
        node = producer[x]
        out.append(node)
        x = node.input[0]
    return out


def _float32_tensors(proto: onnx.ModelProto) -> set[str]:
    """Tensors whose type is float32, by shape inference on a copy without the weights'
    data (the initializers given as inputs of their type and shape)."""
    light = onnx.ModelProto()
    light.ir_version = proto.ir_version
    light.opset_import.extend(proto.opset_import)
    g = light.graph
    g.node.extend(proto.graph.node)
    g.input.extend(proto.graph.input)
    g.output.extend(proto.graph.output)
    names = {i.name for i in proto.graph.input}
    g.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                   for t in proto.graph.initializer if t.name not in names)
    try:
        inferred = onnx.shape_inference.infer_shapes(light).graph
    except Exception:  # inference is a help here, not a requirement
        return set()
    return {v.name for v in [*inferred.value_info, *inferred.input, *inferred.output]
            if v.type.tensor_type.elem_type == _FLOAT}


__all__ = ["RMS_OPSET", "drop_noop_casts", "fuse_rms_norms"]
