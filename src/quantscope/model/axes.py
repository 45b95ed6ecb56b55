"""Graph facts about tensors: the channel axis, where a tensor's values come from.

The channel axis is read from the graph, never guessed from the rank alone: a
``[B, 4 + classes, anchors]`` detector output is per *row* (axis 1, the Concat axis),
a ``[B, T, C]`` token tensor is per feature (the last axis). One forward pass over the
nodes (ONNX graphs are topologically sorted) sets each tensor's axis from its producer:

=================================  =====================================================
producer                           channel axis of its output
=================================  =====================================================
Conv, ConvTranspose, BatchNorm,    1 (NCHW / NCL)
InstanceNorm, pooling, LRN
MatMul / Gemm with a weight,       the last axis (``[B, T, C]`` token tensors, ``[B, C]``)
LayerNormalization, an embedding
Gather
LSTM, GRU, RNN                     the last axis of each output (the hidden units:
                                   ``Y [T, D, N, H]``, ``Y_h``/``Y_c [D, N, H]``, and
                                   the ``layout=1`` forms alike)
Concat                             its inputs' common axis when they agree (channels
                                   concatenated along another axis); else the Concat axis
elementwise ops, Softmax, Resize,  the axis of the input of the output's rank (right-
Clip, Cast, Identity, ...          aligned for broadcasts)
Transpose                          permuted with ``perm``
Reshape, Flatten, Squeeze,         kept when the dims up to the axis are unchanged
Unsqueeze                          (read from inferred shapes), shifted for inserted or
                                   removed leading dims, followed when only dims of
                                   size 1 move (``[N, 96, 1, 1] -> [N, 1, 1, 96]``,
                                   ``[N, 1, H, W] -> [N, H, W, 1]``);
                                   else unknown
anything else (activation x        unknown (``None``): callers fall back to their own
activation MatMul, graph inputs)   rule, e.g. 1 for rank 4, else the last axis
=================================  =====================================================

:func:`channel_axes` returns every tensor whose axis is known; :func:`channel_axis` one;
:func:`output_channel_axes` the graph outputs'.
:func:`range_source` walks back through ops that do not change values (Reshape,
Transpose, Squeeze, ...) to the tensor whose calibration statistics hold a tensor's range.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import onnx
from onnx import numpy_helper

from quantscope.model.load import Model

CHANNEL_FIRST = frozenset(
    {"Conv", "ConvTranspose", "BatchNormalization", "InstanceNormalization", "MaxPool",
     "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool", "GlobalLpPool", "LRN",
     "DepthToSpace", "SpaceToDepth", "MaxUnpool", "GroupNormalization"}
)
# recurrent ops: every output (Y, Y_h, Y_c, either layout) has its hidden units last
RECURRENT_RANKS = {"LSTM": (4, 3, 3), "GRU": (4, 3), "RNN": (4, 3)}
CHANNEL_LAST = frozenset({"LayerNormalization", "SimplifiedLayerNormalization",
                          "RMSNormalization", "SkipLayerNormalization"})
ELEMENTWISE = frozenset(
    {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Where", "Relu",
     "LeakyRelu", "PRelu", "Clip", "Sigmoid", "Tanh", "Erf", "Gelu", "HardSigmoid",
     "HardSwish", "Elu", "Selu", "Celu", "Softplus", "Softsign", "Mish", "Neg", "Abs",
     "Exp", "Log", "Sqrt", "Reciprocal", "Floor", "Ceil", "Round", "Sign", "Sin", "Cos",
     "Softmax", "LogSoftmax", "Hardmax", "Resize", "Upsample", "Cast", "Identity",
     "Dropout", "QuickGelu", "BiasGelu", "FastGelu", "ThresholdedRelu"}
)
# ops whose output values are a subset/rearrangement of one input's (same range)
VALUE_PRESERVING = frozenset(
    {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Dropout",
     "Slice", "Split", "Expand", "Tile", "SpaceToDepth", "DepthToSpace", "Gather"}
)

Shape = tuple[int | str | None, ...]


def _int_list(node: onnx.NodeProto, attr: str) -> list[int] | None:
    for a in node.attribute:
        if a.name == attr:
            return list(a.ints)
    return None


def _int_attr(node: onnx.NodeProto, attr: str, default: int) -> int:
    for a in node.attribute:
        if a.name == attr:
            return int(a.i)
    return default


def _const_ints(model: Model, name: str, inits: dict[str, onnx.TensorProto]) -> list[int] | None:
    t = inits.get(name)
    if t is None:
        return None
    return [int(v) for v in numpy_helper.to_array(t).ravel()]


def _same(a: int | str | None, b: int | str | None) -> bool:
    return a is not None and a == b


def _kept_prefix(src: Shape | None, dst: Shape | None, axis: int) -> bool:
    """True when ``dst`` has ``src``'s dims 0..axis unchanged."""
    if src is None or dst is None or len(src) <= axis or len(dst) <= axis:
        return False
    return all(_same(a, b) for a, b in zip(src[: axis + 1], dst[: axis + 1], strict=True))


def _reshape_axis(src: Shape | None, dst: Shape | None, axis: int) -> int | None:
    """Where ``axis`` of ``src`` lands in a reshape to ``dst``: the same index when the
    leading dims are kept; the last axis when only the trailing (channel) dim is kept
    and every dim before it is merged or split (``[B, T, C] -> [B*T, C]``)."""
    if _kept_prefix(src, dst, axis):
        return axis
    if src is None or dst is None or not src or not dst:
        return None
    if axis == len(src) - 1 and _same(src[-1], dst[-1]):
        return len(dst) - 1
    moved = _ones_moved(src, dst, axis)
    if moved is not None:
        return moved
    # leading dims merged or split before the axis: the axis' dim and all after it kept
    tail = src[axis:]
    for k in range(len(dst)):
        if len(dst) - k != len(tail) or not all(_same(a, b) for a, b in zip(tail, dst[k:],
                                                                              strict=True)):
            continue
        pre_s, pre_d = list(src[:axis]), list(dst[:k])
        while pre_s and pre_d and _same(pre_s[0], pre_d[0]):
            pre_s, pre_d = pre_s[1:], pre_d[1:]
        if _prod_known(pre_s) is not None and _prod_known(pre_s) == _prod_known(pre_d):
            return k
    return None


def _ones_moved(src: Shape, dst: Shape, axis: int) -> int | None:
    """Where ``axis`` lands when the reshape only moves dims of size 1 after the first
    (``[N, 96, 1, 1] -> [N, 1, 1, 96]``, a TF export's NCHW -> NHWC of a pooled map): the
    other dims in the same order; the first (the samples) kept, or symbolic on both sides
    (an exporter names each unknown batch dim anew). A channel axis of size 1 lands on the
    size-1 dim of the same rank among them (``[N, 1, H, W] -> [N, H, W, 1]``: tf2onnx's
    Reshape for the NHWC Transpose of a one-channel map, BlazePose's segmentation)."""
    if axis == 0 or not (_same(src[0], dst[0]) or (
            not isinstance(src[0], int) and not isinstance(dst[0], int))):
        return None
    rest_s = [(i, d) for i, d in enumerate(src) if i and d != 1]
    rest_d = [(i, d) for i, d in enumerate(dst) if i and d != 1]
    if len(rest_s) != len(rest_d) or not all(
            _same(a, b) for (_, a), (_, b) in zip(rest_s, rest_d, strict=True)):
        return None
    if src[axis] == 1:
        ones_s = [i for i, d in enumerate(src) if i and d == 1]
        ones_d = [i for i, d in enumerate(dst) if i and d == 1]
        return ones_d[ones_s.index(axis)] if len(ones_s) == len(ones_d) else None
    pos = [i for i, _ in rest_s].index(axis)
    return rest_d[pos][0]


def _prod_known(dims: Sequence[int | str | None]) -> int | None:
    p = 1
    for d in dims:
        if not isinstance(d, int):
            return None
        p *= d
    return p


def _squeeze_axis(axis: int, rank_in: int, removed: list[int]) -> int | None:
    removed = [r % rank_in for r in removed]
    if axis in removed:
        return None
    return axis - sum(1 for r in removed if r < axis)


def _unsqueeze_axis(axis: int, rank_out: int, inserted: list[int]) -> int:
    inserted = sorted(r % rank_out for r in inserted)
    out = axis
    for r in inserted:
        if r <= out:
            out += 1
    return out


def _from_input(node: onnx.NodeProto, axes: dict[str, int], shapes: dict[str, Shape],
                rank_out: int | None, inits: dict[str, onnx.TensorProto]) -> int | None:
    """An elementwise op's axis: its first non-constant input with a known axis, shifted
    right by the broadcast rank difference; inputs that disagree make it unknown."""
    found: set[int] = set()
    for name in node.input:
        if not name or name in inits or name not in axes:
            continue
        a = axes[name]
        rank_in = len(shapes[name]) if name in shapes else None
        if rank_out is not None and rank_in is not None:
            a += rank_out - rank_in
        found.add(a)
    return found.pop() if len(found) == 1 else None


def _node_axis(node: onnx.NodeProto, model: Model, axes: dict[str, int],
               shapes: dict[str, Shape], inits: dict[str, onnx.TensorProto]) -> int | None:
    op = node.op_type
    out = node.output[0] if node.output else ""
    rank = len(shapes[out]) if out in shapes else None
    src = node.input[0] if node.input else ""
    a_in = axes.get(src)
    if op in CHANNEL_FIRST:
        return 1 if rank is None or rank >= 2 else None
    if op in CHANNEL_LAST:
        return rank - 1 if rank else None
    if op in ("MatMul", "Gemm", "FusedMatMul"):
        weighted = len(node.input) > 1 and node.input[1] in inits
        return rank - 1 if weighted and rank else None
    if op == "Gather":
        if src in inits and rank:  # an embedding lookup: [.., C]
            return rank - 1
        return None
    if op == "Concat":
        if rank is None:
            return None
        cat = _int_attr(node, "axis", 0) % rank
        known = {axes[i] for i in node.input if i and i not in inits and i in axes}
        return known.pop() if len(known) == 1 else cat
    if op in ELEMENTWISE:  # any input's: a bias first (``Add(bias, MatMul)``, torch's Linear)
        return _from_input(node, axes, shapes, rank, inits)
    if a_in is None:
        return None
    if op == "Transpose":
        perm = _int_list(node, "perm")
        if perm is None:
            return rank - 1 - a_in if rank else None
        return perm.index(a_in) if a_in in perm else None
    if op in ("Reshape", "Flatten"):
        return _reshape_axis(shapes.get(src), shapes.get(out), a_in)
    if op == "Squeeze":
        removed = (_const_ints(model, node.input[1], inits) if len(node.input) > 1
                   else _int_list(node, "axes"))
        s = shapes.get(src)
        if removed is None or s is None:
            return _reshape_axis(s, shapes.get(out), a_in)
        return _squeeze_axis(a_in, len(s), removed)
    if op == "Unsqueeze":
        inserted = (_const_ints(model, node.input[1], inits) if len(node.input) > 1
                    else _int_list(node, "axes"))
        if inserted is None or rank is None:
            return None
        return _unsqueeze_axis(a_in, rank, inserted)
    if op in ("Slice", "Split", "Pad", "Expand", "Tile", "ReduceMean", "ReduceMax",
              "ReduceSum", "ReduceMin"):
        s, d = shapes.get(src), shapes.get(out)
        if s is not None and d is not None and len(s) == len(d):
            return a_in
    return None


def channel_axes(model: Model) -> dict[str, int]:
    """Every tensor whose channel axis the graph tells (see the module docstring), as a
    non-negative axis of the tensor with its batch axis."""
    shapes = model.value_shapes()
    inits = model.initializers()
    axes: dict[str, int] = {}
    for node in model.graph.node:
        if not node.output:
            continue
        if node.op_type in RECURRENT_RANKS:
            ranks = RECURRENT_RANKS[node.op_type]
            for out, rank in zip(node.output, ranks, strict=False):
                if out:
                    axes[out] = len(shapes[out]) - 1 if out in shapes else rank - 1
            continue
        a = _node_axis(node, model, axes, shapes, inits)
        if a is None:
            continue
        for out in node.output:
            if not out:
                continue
            r = len(shapes[out]) if out in shapes else None
            if r is None or 0 <= a < r:
                axes[out] = a
    return axes


def channel_axis(model: Model, tensor: str) -> int | None:
    """The channel axis of one tensor, or None when the graph does not tell."""
    return channel_axes(model).get(tensor)


def output_channel_axes(model: Model) -> dict[str, int]:
    """Graph output -> its channel axis, for the outputs whose axis the graph tells (the
    per-channel fidelity metrics' ``channel_axes``)."""
    axes = channel_axes(model)
    return {o: axes[o] for o in model.output_names() if o in axes}


def range_source(model: Model, tensor: str, known: set[str] | frozenset[str]) -> str | None:
    """The tensor in ``known`` (e.g. the calibrated taps) whose values ``tensor`` carries
    unchanged, following value-preserving ops (Reshape, Transpose, Slice, ...) back from
    its producer; ``tensor`` itself when it is known; None when none is found."""
    producer = {o: n for n in model.graph.node for o in n.output}
    seen: set[str] = set()
    t = tensor
    while t not in known:
        if t in seen:
            return None
        seen.add(t)
        node = producer.get(t)
        if node is None or node.op_type not in VALUE_PRESERVING or not node.input:
            return None
        t = node.input[0]
    return t


# ops between an attention score MatMul and its Softmax: scale, mask, bias, layout
_SCORE_PATH = frozenset({"Add", "Sub", "Mul", "Div", "Where", "Cast", "Reshape", "Transpose",
                         "Identity", "Clip", "Max", "Min", "Squeeze", "Unsqueeze", "Slice"})
_SCORE_DEPTH = 8


def feeds_from_act_matmul(model: Model, tensor: str) -> bool:
    """True when ``tensor`` is computed from an activation x activation MatMul (Q.K^T)
    through scale / mask / layout ops only (at most ``_SCORE_DEPTH`` of them)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    inits = {t.name for t in model.graph.initializer}
    todo, seen = [(tensor, 0)], set()
    while todo:
        t, depth = todo.pop()
        node = producer.get(t)
        if node is None or t in seen or depth > _SCORE_DEPTH:
            continue
        seen.add(t)
        if node.op_type in ("MatMul", "FusedMatMul", "Einsum"):
            if len([i for i in node.input if i and i not in inits]) >= 2:
                return True
            continue
        if node.op_type in _SCORE_PATH:
            todo += [(i, depth + 1) for i in node.input if i and i not in inits]
    return False


_FACTS: weakref.WeakKeyDictionary[Model, dict[str, tuple[int, int | None, bool]]] = (
    weakref.WeakKeyDictionary())


def softmax_facts(model: Model, node: onnx.NodeProto) -> tuple[int, int | None, bool]:
    """A Softmax's (axis, rank of its input or None, attention?): attention when its
    input comes from an activation x activation MatMul (:func:`feeds_from_act_matmul`).
    Cached per model (legality checks ask once per plan)."""
    cache = _FACTS.setdefault(model, {})
    if node.name not in cache:
        cache[node.name] = _softmax_facts(model, node)
    return cache[node.name]


def _softmax_facts(model: Model, node: onnx.NodeProto) -> tuple[int, int | None, bool]:
    shape = model.value_shapes().get(node.input[0]) if node.input else None
    rank = len(shape) if shape is not None else None
    default = -1 if model.opset() >= 13 else 1
    axis = _int_attr(node, "axis", default)
    if rank:
        axis %= rank
    return axis, rank, bool(node.input) and feeds_from_act_matmul(model, node.input[0])
