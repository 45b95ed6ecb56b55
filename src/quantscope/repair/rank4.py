"""Legalising rewrite: every Linear + bias computed on 4-D activations (QNN HTP v73).

QNN HTP v73 maps a quantized bias Add on a 3-D tensor ([B, T, C]) to an internal 5-D
layout that the ``q::linearclip`` kernel lacks (target rule ``qnn.linearclip_5d``). This
rewrite keeps the function and changes only ranks: for every weighted MatMul group whose
activation input is 3-D and whose weight is 2-D,

=================  ==================================================================
before             ``x [B,T,C] -> MatMul(W) -> Add(b) -> (GELU …) -> y [B,T,C']``
after              ``x -> Unsqueeze(1) [B,1,T,C] -> MatMul(W) -> Add(b) -> (GELU …)
                   -> y/4d [B,1,T,C'] -> Squeeze(1) -> y``
=================  ==================================================================

The MatMul becomes a 4-D MatMul with its bias (the "[1, 1, T, C]" form of the rule's
fix), every op of the group runs on 4-D tensors, and the Unsqueeze/Squeeze are
pass-through ops that share the encodings of their inputs: no new quantized tensor, the
group's names (what a plan decides on) are kept, and each group output is renamed
``<name>/4d`` (the Squeeze writes the old name, so the graph outside is unchanged).

That 4-D tensors compile is HTP's documented layout convention (NHWC, rank <= 4), not a
measurement: the remedy is **unverified on a device** (:data:`UNVERIFIED`).
"""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.repair import Change, Repair, RepairInput, RepairStep, step_of
from quantscope.types import Group, GroupKind, Plan

UNVERIFIED = (
    "unverified on a device: field report 003 shows that 3-D bias Adds fail on HTP v73; "
    "that the 4-D form compiles is HTP's documented layout convention, not a measurement"
)
AXES = "rank4/axes1"  # the shared [1] axes initializer of the Unsqueeze/Squeeze nodes


def _site(group: Group, model: Model, nodes: dict[str, onnx.NodeProto]) -> str | None:
    """Why ``group`` is no site (None: it is one)."""
    if group.kind is not GroupKind.WEIGHTED or group.op_type != "MatMul":
        return "not a Linear (weighted MatMul)"
    anchor = nodes[group.nodes[0]]
    shapes, inits = model.value_shapes(), {t.name: t for t in model.graph.initializer}
    x = shapes.get(anchor.input[0])
    if x is None or len(x) != 3 or len(inits[anchor.input[1]].dims) != 2:
        return f"input rank {len(x) if x is not None else '?'} (only 3-D x 2-D weight)"
    members = [nodes[n] for n in group.nodes]
    if not any(n.op_type == "Add" and any(t in inits for t in n.input) for n in members):
        return "no bias Add"
    if any(len(inits[t].dims) > 3 for n in members for t in n.input if t in inits):
        return "a constant of rank > 3 (broadcast would change)"
    return None


def _rewrite_group(order: list[onnx.NodeProto], group: Group) -> list[Change]:
    """Unsqueeze before the anchor, Squeeze after every group output (edits ``order``)."""
    members = set(group.nodes)
    anchor = next(n for n in order if n.name == group.nodes[0])
    x, x4 = anchor.input[0], f"{anchor.name}/input4d"
    anchor.input[0] = x4
    order.insert(order.index(anchor),
                 helper.make_node("Unsqueeze", [x, AXES], [x4], name=f"{anchor.name}/unsqueeze4d"))
    for out in group.outputs:
        out4 = f"{out}/4d"
        for n in order:
            if n.name in members:
                n.input[:] = [out4 if t == out else t for t in n.input]
                n.output[:] = [out4 if t == out else t for t in n.output]
        producer = next(n for n in order if n.name in members and out4 in n.output)
        order.insert(order.index(producer) + 1,
                     helper.make_node("Squeeze", [out4, AXES], [out], name=f"{out}/squeeze3d"))
    return [Change(tensor=x4, kind="insert", note="Unsqueeze to [B, 1, T, C]")] + [
        Change(tensor=f"{o}/4d", kind="new", note=f"4-D output; Squeeze back to '{o}'")
        for o in group.outputs
    ]


def rank4_linears(model: Model) -> Repair:
    """Every Linear + bias group on 3-D tensors rewritten on 4-D ones (FP32 unchanged)."""
    groups = find_groups(model)
    proto = onnx.ModelProto()
    proto.CopyFrom(model.proto)
    nodes = {n.name: n for n in model.graph.node}
    order = [copy.deepcopy(n) for n in model.graph.node]  # edited, then written back once
    changes: list[Change] = []
    skipped: list[tuple[str, str]] = []
    for g in groups.groups:
        why = _site(g, model, nodes)
        if why is None:
            changes += _rewrite_group(order, g)
        elif g.kind is GroupKind.WEIGHTED:
            skipped.append((g.name, why))
    if changes:
        del proto.graph.node[:]
        proto.graph.node.extend(order)
        proto.graph.initializer.append(numpy_helper.from_array(np.array([1], np.int64), AXES))
        del proto.graph.value_info[:]  # stale ranks; the loader infers them again
    sites = sum(1 for c in changes if c.kind == "insert")
    return Repair(
        name="rank4",
        reason=f"{sites} Linear + bias group(s) moved to 4-D tensors so no bias Add is left "
        f"on a 3-D tensor (QNN HTP v73 q::linearclip); {UNVERIFIED}",
        proto=proto,
        changes=tuple(changes),
        skipped=tuple(skipped),
        effect=(("sites", float(sites)),),
    )


def _renamed_plan(plan: Plan, changes: tuple[Change, ...]) -> Plan | None:
    """The plan with range methods moved to the renamed group outputs (None: no change)."""
    renamed = {c.tensor[: -len("/4d")]: c.tensor for c in changes if c.kind == "new"}
    if not any(t in renamed for t, _ in plan.ranges):
        return None
    return replace(plan, ranges=tuple((renamed.get(t, t), m) for t, m in plan.ranges))


def rank4_step(inp: RepairInput) -> RepairStep:
    """The registry's entry point (:mod:`quantscope.repair.registry`, name ``rank4``)."""
    r = rank4_linears(inp.model)
    return replace(step_of(r), plan=_renamed_plan(inp.plan, r.changes))
