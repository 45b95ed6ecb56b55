"""Which operators of a model the target's compiler takes (``[ops]`` of its profile).

Independent of the plan: an operator the compiler does not take is not taken at any
precision, so these problems are not part of :func:`quantscope.plan.check.check` (the
planner screens moves with that one; no move can fix an operator). ``check``, ``run``'s
``check.json`` and its verdict print both.

=====================  =========  ===========================================================
rule                   severity   when
=====================  =========  ===========================================================
``ops.unsupported``    error      an ``unsupported`` entry of ``[ops]`` names the op type:
                                  one problem per op type, naming its nodes (ONNX names)
``ops.conditional``    warning    a ``conditional`` entry names the op type (a source saw it
                                  taken in one form, refused in another): one problem for all
                                  such op types, each with its nodes, the form seen to work
                                  and the fix
``ops.unlisted``       warning    no entry names the op type: not guessed either way; one
                                  problem for all such op types, naming the list consulted
=====================  =========  ===========================================================

Not judged: ``Constant`` nodes and nodes computed from constants alone (every converter
folds them; a ``Shape``/``Size`` of a tensor whose shape is concrete, with the given input
shapes, counts as a constant), and the word-embedding lookups the target runs on the host
(``[host_embedding]``, :mod:`quantscope.model.host_gather`). Nodes inside a subgraph (a
``Loop``'s body) are not judged one by one: the control-flow node itself is.
"""

from __future__ import annotations

import onnx

from quantscope.model.host_gather import host_gathers
from quantscope.model.load import Model
from quantscope.model.shapes import Shapes, resolve_shapes
from quantscope.targets.profile import Target
from quantscope.types import Problem

UNSUPPORTED, CONDITIONAL, UNLISTED = "ops.unsupported", "ops.conditional", "ops.unlisted"
RULES = (UNSUPPORTED, CONDITIONAL, UNLISTED)
_SHOWN = 2  # node names shown per op type


def op_name(node: onnx.NodeProto) -> str:
    """The op type as a list names it (another domain's op with its domain)."""
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


def _concrete(shape: object) -> bool:
    return isinstance(shape, tuple) and all(isinstance(d, int) and d >= 0 for d in shape)


def _folded(model: Model, shapes: Shapes | None) -> set[str]:
    """Nodes whose every input is a constant (a Shape of a concrete shape is one): folded
    before any compiler sees them."""
    const = {t.name for t in model.graph.initializer} | {""}
    known = resolve_shapes(model, shapes)
    out = set()
    for n in model.graph.node:  # topological order
        static = n.op_type in ("Shape", "Size") and _concrete(known.get(n.input[0]))
        if n.op_type == "Constant" or static or (n.input and all(i in const for i in n.input)):
            const.update(n.output)
            out.add(n.name)
    return out


def judged_nodes(model: Model, target: Target, shapes: Shapes | None = None
                 ) -> dict[str, list[str]]:
    """Op type -> names of the nodes the target's compiler gets (graph order)."""
    skip = _folded(model, shapes) | {g.node for g in host_gathers(model, target.host_rows)}
    out: dict[str, list[str]] = {}
    for i, n in enumerate(model.graph.node):
        if n.name in skip:
            continue
        out.setdefault(op_name(n), []).append(n.name or f"#{i} ({n.op_type})")
    return out


def _names(nodes: list[str]) -> str:
    shown = ", ".join(f"'{n}'" for n in nodes[:_SHOWN])
    more = f" and {len(nodes) - _SHOWN} more" if len(nodes) > _SHOWN else ""
    return f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}: {shown}{more}"


def op_problems(model: Model, target: Target, shapes: Shapes | None = None) -> list[Problem]:
    """The operators of ``model`` that ``target`` does not take, or that no list names
    (``shapes``: concrete input shapes, as :func:`~quantscope.plan.check.check` takes)."""
    ops = target.ops
    if ops is None or ops.takes_all:
        return []
    where = f"target {target.name} ({target.sdk})"
    found, unlisted, conditional = [], [], []
    for op, nodes in judged_nodes(model, target, shapes).items():
        entry = ops.entry(op)
        if entry is None:
            unlisted.append(f"{op} ({_names(nodes)})")
        elif entry.status == "conditional":
            conditional.append((op, nodes, entry))
        elif entry.status == "unsupported":
            found.append(Problem(
                group=", ".join(nodes[:_SHOWN]) + (" …" if len(nodes) > _SHOWN else ""),
                rule=UNSUPPORTED,
                reason=f"{target.name}'s compiler does not take {op} ({_names(nodes)}): "
                f"{entry.reason}",
                provenance=f"{entry.provenance}; {where}", fix=entry.fix))
    if conditional:
        found.append(Problem(
            group=", ".join(op for op, _, _ in conditional), rule=CONDITIONAL,
            severity="warning",
            reason=f"taken by {target.name}'s compiler in some forms only, so not known to "
            "compile in this model's form: " + "; ".join(
                f"{op} ({_names(nodes)}): {e.reason}" for op, nodes, e in conditional),
            provenance="; ".join(dict.fromkeys(e.provenance for _, _, e in conditional))
            + f"; {where}",
            fix="; ".join(dict.fromkeys(f"{op}: {e.fix}" for op, _, e in conditional))))
    if unlisted:
        found.append(Problem(
            group=", ".join(u.split(" (", 1)[0] for u in unlisted), rule=UNLISTED,
            severity="warning",
            reason=f"not in the operator list quantscope holds for {target.name}, so not "
            f"known to compile or to fail: {'; '.join(unlisted)}. {ops.unlisted}",
            provenance=f"{ops.source}; {where}", fix=ops.unlisted_fix))
    return found


__all__ = ["CONDITIONAL", "RULES", "UNLISTED", "UNSUPPORTED", "judged_nodes", "op_name",
           "op_problems"]
