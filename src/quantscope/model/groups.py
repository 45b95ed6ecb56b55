"""Find decision groups: the units an integer NPU quantizes and a plan decides on.

Rules (applied in topological order)
====================================  ==============================================
tensor kinds                          ``const`` (initializers, Constant, and what
                                      only they feed), ``side`` (float tensors derived
                                      only from non-float graph inputs, e.g. the
                                      attention mask), ``act`` (everything else,
                                      and a Cast of a non-float input that feeds a
                                      weighted op's data input: a uint8 image)
a node with no float ``act`` output   stays float, belongs to no group (shape math)
pass-through op (Reshape, Transpose…) no group; output shares its input's encoding
fusible op (elementwise with const /  joins the group of its producer when every
side operands, or both operands from  ``act`` input comes from that one group and
that same group)                      every consumer of that input is fusible too,
                                      unless that group is an embedding lookup (its
                                      rows are what a host lookup feeds the device:
                                      a constant position / token-type Add after it
                                      is a layer of its own)
decomposed LayerNorm                  ReduceMean, Sub, Pow (or Mul by itself),
                                      ReduceMean, Add eps, Sqrt, Div: one group
                                      anchored at the first ReduceMean, op type
                                      ``LayerNormalization`` (the NPU's layer); the
                                      gamma Mul and beta Add fuse into it
any other op                          anchors a new group (weighted if Conv / Gemm /
                                      MatMul has an initializer weight)
group outputs                         float tensors made in the group and read outside
                                      it (or graph outputs): quantized at the group's
                                      activation precision (an int output, TopK's
                                      indices, is not)
====================================  ==============================================
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import onnx

from quantscope.model.control_flow import control_flow_message
from quantscope.model.layouts import layout_of
from quantscope.model.load import FLOAT_TYPES, Model
from quantscope.types import Group, GroupKind, Groups, Plan, QuantscopeError

PASS_THROUGH = frozenset(
    {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Dropout",
     "Slice", "Gather", "Split", "Expand", "Tile", "SpaceToDepth", "DepthToSpace"}
)
FUSIBLE = frozenset(
    {"Add", "Sub", "Mul", "Div", "Relu", "LeakyRelu", "PRelu", "Clip", "Sigmoid", "Tanh",
     "Erf", "Gelu", "HardSigmoid", "HardSwish", "Elu", "Selu", "Softplus", "Neg", "Abs",
     "BatchNormalization", "Where"}
)
CONTROL_FLOW = frozenset({"Loop", "If", "Scan"})
UNSUPPORTED = frozenset({"Loop", "If", "Scan", "SequenceConstruct", "QuantizeLinear",
                         "DequantizeLinear", "QLinearConv", "QLinearMatMul", "MatMulInteger",
                         "ConvInteger", "DynamicQuantizeLinear"})


def _is_noop_cast(node: onnx.NodeProto, types: dict[str, int]) -> bool:
    """A Cast of a float tensor to its own type (``x.to(torch.float32)`` on a float32
    tensor; a float16 model's casts once widened to float32) moves no value: its output
    shares its input's encoding, not a decision group of its own that no compiler names."""
    return (node.op_type == "Cast" and bool(node.input)
            and types.get(node.input[0]) in FLOAT_TYPES
            and types.get(node.input[0]) == types.get(node.output[0]))


def _is_value_pad(node: onnx.NodeProto, model: Model) -> bool:
    """A ``Pad`` that only moves values and adds zeros (torch's ``F.pad``, a TF ``SAME``
    pad): every value it writes is on its input's grid (zero is on every grid), so its
    output shares its input's encoding, not a decision group of its own that no compiler
    names (Hailo folds it into the next layer's padding). A constant pad of another value
    (off the input's range, perhaps) keeps its group."""
    if node.op_type != "Pad":
        return False
    mode = next((a.s.decode() for a in node.attribute if a.name == "mode"), "constant")
    if mode != "constant" or len(node.input) < 3 or not node.input[2]:
        return True
    try:
        return not bool(model.initializer_array(node.input[2]).any())
    except KeyError:  # a pad value computed in the graph: its own group, as before
        return False


@dataclass(frozen=True)
class MaskAdd:
    """An Add that applies an additive attention mask (a ``side`` operand) to scores."""

    node: str
    scores: str  # the act operand (unmasked scores)
    output: str


def _is_embedding_lookup(node: onnx.NodeProto, kinds: dict[str, str], types: dict[str, int]) -> bool:
    return (
        node.op_type == "Gather"
        and kinds.get(node.input[0]) == "const"
        and types.get(node.input[0]) in FLOAT_TYPES
        and kinds.get(node.input[1]) == "side"
    )


def tensor_kinds(model: Model) -> dict[str, str]:
    """Classify every tensor as 'const', 'side' or 'act' (see module docstring): a copy of
    what is found once per model and kept on it (as :func:`find_groups`)."""
    return dict(_kept_on(model, "_tensor_kinds", _tensor_kinds))


def _kept_on(model: Model, name: str, find: Callable[[Model], Any]) -> Any:
    """``find(model)``, found once and kept on ``model`` under ``name`` (beside its cached
    shapes: a loaded model is never mutated)."""
    found = model.__dict__.get(name)
    if found is None:
        found = model.__dict__[name] = find(model)
    return found


def _tensor_kinds(model: Model) -> dict[str, str]:
    types = model.value_types()
    kinds = _kinds(model, types, frozenset())
    casts = _data_casts(model, kinds, types)
    return _kinds(model, types, casts) if casts else kinds


def _data_casts(model: Model, kinds: dict[str, str], types: dict[str, int]) -> frozenset[str]:
    """Casts of a non-float input to float that feed, through ``side`` tensors only, the
    data input of a weighted op or a float graph output (a uint8 image Cast and normalised
    in the graph before its first Conv): the data path starts there, so they are ``act``,
    not a mask-like side."""
    producer = {t: n for n in model.graph.node for t in n.output}
    inits = {t.name for t in model.graph.initializer}
    todo = [n.input[0] for n in model.graph.node
            if n.input and kinds.get(n.input[0]) == "side" and _weight_info(n, inits)[0]]
    todo += [o for o in model.output_names()
             if kinds.get(o) == "side" and types.get(o) in FLOAT_TYPES]
    seen: set[str] = set()
    casts: set[str] = set()
    while todo:
        t = todo.pop()
        node = producer.get(t)
        if t in seen or node is None:
            continue
        seen.add(t)
        if node.op_type == "Cast" and types.get(t) in FLOAT_TYPES:
            casts.add(node.name)
            continue
        todo.extend(i for i in node.input if i and kinds.get(i) == "side")
    return frozenset(casts)


def _kinds(model: Model, types: dict[str, int], data_casts: frozenset[str]) -> dict[str, str]:
    kinds: dict[str, str] = {t.name: "const" for t in model.graph.initializer}
    for inp in model.graph.input:
        if inp.name not in kinds:
            kinds[inp.name] = "act" if types.get(inp.name) in FLOAT_TYPES else "side"
    for node in model.graph.node:
        ins = [kinds.get(t, "const") for t in node.input if t]
        if node.op_type in ("Shape", "Size", "Constant", "ConstantOfShape"):
            kind = "const"
        elif _is_embedding_lookup(node, kinds, types) or node.name in data_casts:
            kind = "act"  # a float table indexed by an input, a Cast input: the data path
        elif "act" in ins:
            kind = "act"
        elif "side" in ins:
            kind = "side"
        else:
            kind = "const"
        for out in node.output:
            kinds[out] = kind
    return kinds


def _weight_info(node: onnx.NodeProto, inits: set[str]) -> tuple[str | None, str | None, int | None]:
    """(weight, bias, output-channel axis) for a weighted op, else (None, None, None); the
    layout comes from :mod:`quantscope.model.layouts`."""
    lay = layout_of(node)
    if lay is None or lay.weight not in inits:
        return None, None, None
    bias = lay.bias_of(node)
    return lay.weight, bias if bias in inits else None, lay.out_axis


def _only(consumers: list[onnx.NodeProto], op: str) -> onnx.NodeProto | None:
    return consumers[0] if len(consumers) == 1 and consumers[0].op_type == op else None


def _layernorm_nodes(b: _Builder, mean: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """The nodes of a decomposed LayerNorm starting at ``mean`` (None: not one)."""
    x, cons = mean.input[0], b.consumers
    sub = _only(cons.get(mean.output[0], []), "Sub")
    if sub is None or list(sub.input) != [x, mean.output[0]]:
        return None
    d = sub.output[0]
    after = cons.get(d, [])
    div = next((n for n in after if n.op_type == "Div" and n.input[0] == d), None)
    sq = next((n for n in after if n.op_type in ("Pow", "Mul") and n.name != div.name), None)
    if div is None or sq is None or len(after) != 2:
        return None
    if sq.op_type == "Mul" and list(sq.input) != [d, d]:
        return None
    var = _only(cons.get(sq.output[0], []), "ReduceMean")
    eps = var and _only(cons.get(var.output[0], []), "Add")
    root = eps and _only(cons.get(eps.output[0], []), "Sqrt")
    last = root and _only(cons.get(root.output[0], []), "Div")
    if last is None or last.name != div.name or b.kinds.get(eps.input[1]) != "const":
        return None
    return [mean, sub, sq, var, eps, root, div]  # type: ignore[list-item]


def _layernorm_members(b: _Builder) -> dict[str, str]:
    """Node name -> anchor (first ReduceMean) name of every decomposed LayerNorm."""
    out: dict[str, str] = {}
    for node in b.model.graph.node:
        if node.op_type == "ReduceMean" and node.name not in out:
            found = _layernorm_nodes(b, node)
            out.update({n.name: node.name for n in found or ()})
    return out


class _Builder:
    """Accumulates group membership during one topological pass."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.kinds = tensor_kinds(model)
        self.types = model.value_types()
        self.inits = {t.name for t in model.graph.initializer}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in model.graph.node:
            for t in node.output:
                self.producer[t] = node
            for t in node.input:
                self.consumers.setdefault(t, []).append(node)
        self.group_of: dict[str, str] = {}  # node name -> group name
        self.members: dict[str, list[onnx.NodeProto]] = {}
        self.shared: dict[str, str] = {}  # pass-through output -> its input
        self.layernorm = _layernorm_members(self)  # node -> decomposed LayerNorm anchor
        self.lookups: set[str] = set()  # groups anchored at an embedding lookup

    def float_act(self, tensor: str) -> bool:
        """An ``act`` tensor of a float type (a tensor an NPU quantizes)."""
        return self.kinds.get(tensor) == "act" and self.types.get(tensor, 1) in FLOAT_TYPES

    def act_inputs(self, node: onnx.NodeProto) -> list[str]:
        return [t for t in node.input if t and self.kinds.get(t) == "act"]

    def producer_group(self, tensor: str) -> str | None:
        prod = self.producer.get(tensor)
        return None if prod is None else self.group_of.get(prod.name)

    def can_fuse(self, node: onnx.NodeProto) -> str | None:
        if node.op_type not in FUSIBLE:
            return None
        acts = self.act_inputs(node)
        groups = {self.producer_group(t) for t in acts}
        if len(groups) != 1 or None in groups or groups & self.lookups:
            return None  # (a lookup's rows are what the device is fed: nothing joins it)
        for t in acts:
            if any(c.op_type not in FUSIBLE for c in self.consumers.get(t, [])):
                return None
            if t in {o.name for o in self.model.graph.output}:
                return None
        return groups.pop()

    def visit(self, node: onnx.NodeProto) -> None:
        refused = unemulated(node, self.model.graph)
        if refused:
            raise QuantscopeError(refused)
        if not any(self.float_act(t) for t in node.output):
            return
        acts = [t for t in self.act_inputs(node) if self.float_act(t)]
        if (node.op_type in PASS_THROUGH or _is_noop_cast(node, self.types)
                or _is_value_pad(node, self.model)) and acts:
            for out in node.output:
                self.shared[out] = acts[0]
            return  # (a Gather from a constant table by an int act, an ArgMax label,
            # anchors a group of its own: its rows are a new tensor on the grid)
        target = self.layernorm.get(node.name) or self.can_fuse(node)
        name = target or node.name
        if _is_embedding_lookup(node, self.kinds, self.types):
            self.lookups.add(name)
        self.group_of[node.name] = name
        self.members.setdefault(name, []).append(node)


def _resolve_shared(shared: dict[str, str]) -> tuple[tuple[str, ...], ...]:
    """Chains of tensors sharing an encoding, root (quantized tensor) first."""
    chains: dict[str, list[str]] = {}
    for out in shared:
        root = out
        while root in shared:
            root = shared[root]
        chains.setdefault(root, [root]).append(out)
    return tuple(tuple(c) for c in chains.values())


def _make_group(b: _Builder, name: str, nodes: list[onnx.NodeProto],
                shapes: dict[str, tuple[int | str | None, ...]]) -> Group:
    made = {t for n in nodes for t in n.output}
    graph_outs = {o.name for o in b.model.graph.output}
    names = {n.name for n in nodes}
    outputs = tuple(  # an int output (TopK's indices, MaxPool's) is no activation to quantize
        t for n in nodes for t in n.output
        if b.float_act(t)
        and (t in graph_outs or any(c.name not in names for c in b.consumers.get(t, [])))
    )
    inputs = tuple(dict.fromkeys(
        t for n in nodes for t in n.input if t and b.float_act(t) and t not in made
    ))
    anchor = nodes[0]
    weight, bias, axis = _weight_info(anchor, b.inits)
    if weight is not None and bias is None and anchor.op_type == "MatMul":
        for n in nodes[1:]:
            if n.op_type == "Add" and anchor.output[0] in n.input:
                bias = next((t for t in n.input if t in b.inits), None)
                break
    return Group(
        name=name,
        op_type="LayerNormalization" if name in b.layernorm else anchor.op_type,
        kind=GroupKind.WEIGHTED if weight else GroupKind.ACTIVATION,
        nodes=tuple(n.name for n in nodes),
        inputs=inputs,
        outputs=outputs,
        weight=weight,
        bias=bias,
        weight_axis=axis,
        output_shape=shapes.get(outputs[0]) if outputs else None,
        depthwise=weight is not None and _depthwise(anchor, b.model.graph.initializer, weight),
    )


def _depthwise(node: onnx.NodeProto, inits: Iterable[onnx.TensorProto], weight: str) -> bool:
    """A grouped Conv whose weight takes one input channel per group ([C, 1, kh, kw])."""
    if node.op_type != "Conv":
        return False
    group = next((a.i for a in node.attribute if a.name == "group"), 1)
    dims = next((tuple(t.dims) for t in inits if t.name == weight), ())
    return group > 1 and len(dims) > 1 and dims[1] == 1


def unemulated(node: onnx.NodeProto, graph: onnx.GraphProto) -> str | None:
    """Why quantscope cannot emulate ``node`` of ``graph`` (control flow, a sequence, an
    already quantized op), as the one line that refuses the model; None when it can."""
    if node.op_type in CONTROL_FLOW:
        return control_flow_message(node, graph)
    if node.op_type == "SequenceConstruct":
        return (f"node '{node.name}' is a SequenceConstruct (a sequence of tensors), which "
                "quantscope cannot emulate: export the model with plain tensors")
    if node.op_type in UNSUPPORTED:
        return (f"node '{node.name}' is a {node.op_type}: the model is already quantized, "
                "which quantscope cannot emulate again: give the float model it was made from")
    return None


def refuse_unemulated(model: Model) -> None:
    """Refuse, in :func:`unemulated`'s line, a model with a node quantscope cannot emulate
    (what :func:`find_groups` refuses, checked alone: ``run`` says it before any work)."""
    for node in model.graph.node:
        refused = unemulated(node, model.graph)
        if refused:
            raise QuantscopeError(refused)


def find_groups(model: Model) -> Groups:
    """Decision groups of ``model`` (see the module docstring for the rules). Found once
    per :class:`~quantscope.model.load.Model` and kept on it, as its shapes are: a loaded
    model is never mutated, and a run asks for its groups at every quantization, check
    and plan (the suite: ~38 s of CPU finding the same groups again)."""
    return _kept_on(model, "_found_groups", _find_groups)


def _find_groups(model: Model) -> Groups:
    b = _Builder(model)
    for node in model.graph.node:
        b.visit(node)
    shapes = model.value_shapes()  # once: every group reads its output's shape
    groups = tuple(_make_group(b, name, nodes, shapes) for name, nodes in b.members.items())
    model_inputs = tuple(t for t in model.input_names() if b.kinds.get(t) == "act")
    return Groups(groups=groups, shared=_resolve_shared(b.shared), model_inputs=model_inputs)


def find_mask_adds(model: Model) -> tuple[MaskAdd, ...]:
    """Adds that apply an additive attention mask derived from a non-float input.

    Hugging Face encoders add ``(1 - mask) * dtype_min`` to the attention scores before
    Softmax (or, after ``rowscale``, its ReduceMax and Sub); calibrating that Add lets the
    mask constant dominate the range.
    """
    kinds = tensor_kinds(model)
    consumers: dict[str, list[str]] = {}
    for node in model.graph.node:
        for t in node.input:
            consumers.setdefault(t, []).append(node.op_type)
    found = []
    for node in model.graph.node:
        if node.op_type != "Add" or len(node.input) != 2:
            continue
        k = [kinds.get(t) for t in node.input]
        readers = set(consumers.get(node.output[0], []))
        # a Softmax, or the row max + shift that rowscale writes in its place
        if sorted(k) == ["act", "side"] and ("Softmax" in readers
                                             or {"ReduceMax", "Sub"} <= readers):
            scores = node.input[k.index("act")]
            found.append(MaskAdd(node=node.name, scores=scores, output=node.output[0]))
    return tuple(found)


def check_plan_names(plan: Plan, groups: Groups) -> None:
    """Raise if the plan names a group the model does not have (with a close match)."""
    known = set(groups.names())
    for name, _ in plan.overrides:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise QuantscopeError(
                f"plan names group '{name}', which this model does not have{hint}: "
                "list the groups with 'quantscope groups MODEL'"
            )
    tensors = {t for g in groups.groups for t in g.outputs} | set(groups.model_inputs)
    for tensor, _ in plan.ranges:
        if tensor not in tensors:
            raise QuantscopeError(
                f"plan sets a range method for tensor '{tensor}', which is not a quantized "
                "tensor of this model (a group output or model input): fix the name"
            )
