"""Relative cost of a plan on a target; uniform ``a8_w8`` = 1.0. Pure: no ONNX Runtime.

==================  ===============================================================
work of a group     weighted: MACs per frame = weight size x output positions;
                    activation MatMul: output values x inner dim;
                    other ops: output values x ``cost.value_macs[kind]``.
                    Without ``model`` weighted groups use output values x
                    ``cost.value_macs.weighted`` (a typical fan-in; a guess).
                    Symbolic dims count as 1 (cost per position): pass ``shapes``
                    (e.g. from ``seq_len_shapes``) to weight attention by S^2.
group cost          work x ``cost.relative[kind][precision]`` (inf if not listed)
boundary cost       for each tensor passed between groups whose activation bits differ
                    (float counts as its own kind): values x ``cost.boundary_macs``
plan cost           (sum of group and boundary costs) / (same for uniform a8_w8)
==================  ===============================================================

All numbers in the built-in profiles are estimates; ``Target.cost.basis`` says how
each was derived (see ``docs/targets.md``).
"""

from __future__ import annotations

import math

from quantscope.model.load import Model
from quantscope.plan.check import group_edges, resolve_shapes
from quantscope.targets.profile import Target, op_kind
from quantscope.types import Group, GroupKind, Groups, Plan, Precision

Shape = tuple[int | str | None, ...]


def _values(shape: Shape | None) -> float:
    """Values per frame; unknown dims count as 1, the batch dim (rank >= 2) is dropped."""
    if not shape:
        return 1.0
    dims = shape[1:] if len(shape) >= 2 else shape
    return float(math.prod(d if isinstance(d, int) and d > 0 else 1 for d in dims))


def _shapes(groups: Groups, model: Model | None, shapes: dict | None) -> dict[str, Shape]:
    if model is not None:
        return resolve_shapes(model, shapes)
    out: dict[str, Shape] = {
        g.outputs[0]: g.output_shape
        for g in groups.groups
        if g.outputs and g.output_shape is not None
    }
    out.update({k: tuple(v) for k, v in (shapes or {}).items()})
    return out


def group_work(
    group: Group, target: Target, tensor_shapes: dict[str, Shape], model: Model | None = None
) -> float:
    """MAC-equivalents per frame of one group at a8_w8 (see the module table)."""
    values = _values(tensor_shapes.get(group.outputs[0]) if group.outputs else None)
    kind = op_kind(group)
    if model is not None and group.kind is GroupKind.WEIGHTED and group.weight is not None:
        w = model.initializer_array(group.weight)
        axis = (group.weight_axis or 0) % w.ndim
        return float(w.size) * max(values / max(w.shape[axis], 1), 1.0)
    if model is not None and kind == "matmul" and group.inputs:
        inner = (tensor_shapes.get(group.inputs[0]) or (1,))[-1]
        return values * float(inner if isinstance(inner, int) and inner > 0 else 1)
    return values * target.cost.macs_per_value(kind)


def _is_boundary(a: Precision, b: Precision) -> bool:
    return a.act_bits != b.act_bits


def cost_breakdown(
    plan: Plan,
    groups: Groups,
    target: Target,
    shapes: dict[str, tuple[int, ...]] | None = None,
    *,
    model: Model | None = None,
) -> dict[str, float]:
    """Unnormalized cost per group name, plus ``"<boundaries>"`` for all boundaries."""
    tensor_shapes = _shapes(groups, model, shapes)
    out: dict[str, float] = {}
    for g in groups.groups:
        factor = target.cost.factor(op_kind(g), plan.precision_of(g.name))
        work = group_work(g, target, tensor_shapes, model)
        out[g.name] = math.inf if factor is None else work * factor
    boundary = 0.0
    for a, b, tensor in group_edges(groups):
        if _is_boundary(plan.precision_of(a), plan.precision_of(b)):
            boundary += _values(tensor_shapes.get(tensor)) * target.cost.boundary_macs
    out["<boundaries>"] = boundary
    return out


def plan_cost(
    plan: Plan,
    groups: Groups,
    target: Target,
    shapes: dict[str, tuple[int, ...]] | None = None,
    *,
    model: Model | None = None,
) -> float:
    """Cost of ``plan`` relative to uniform a8_w8 (= 1.0); inf if a precision has no cost."""
    base = sum(
        cost_breakdown(Plan.uniform(Precision.A8_W8), groups, target, shapes, model=model).values()
    )
    total = sum(cost_breakdown(plan, groups, target, shapes, model=model).values())
    return total / base if base > 0 else math.inf
