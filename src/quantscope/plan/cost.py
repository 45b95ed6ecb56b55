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
weight reads        with ``weight_reads=True`` (a decoder's decode step, which reads
                    every weight for one token: bound by weight bandwidth), a weighted
                    group also costs its weight bytes at its precision (count x weight
                    bits / 8; float: 4 bytes) x ``cost.weight_byte_macs``; the unit
                    (uniform a8_w8) then includes them too. Off: no change
host lookups        a Gather the target leaves to the host (``[host_embedding]``: a
                    large table indexed by an integer input, :func:`host_work_note`)
                    costs nothing on the device at any precision; the boundary to
                    its reader is still counted
plan cost           (sum of group and boundary costs) / (same for uniform a8_w8)
cost table          the same numbers per group and precision and per edge, for the
                    search: ``CostTable.total`` equals ``plan_cost`` (tested), ``delta``
                    is one group's change, its boundaries included
==================  ===============================================================

All numbers in the built-in profiles are estimates; ``Target.cost.basis`` says how
each was derived (see ``docs/targets.md``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from quantscope.model.host_gather import host_gathers, host_groups
from quantscope.model.load import Model
from quantscope.model.shapes import Shape, Shapes, frame_values, group_edges, resolve_shapes
from quantscope.targets.profile import Target, op_kind
from quantscope.types import Group, GroupKind, Groups, Plan, Precision

Edges = tuple[tuple[str, str, float], ...]  # (producer, consumer, boundary cost if split)


def _values(shape: Shape | None) -> float:
    """Values per frame; unknown dims count as 1 (cost per position)."""
    return float(frame_values(shape, unknown=1))  # type: ignore[arg-type]


def _shapes(groups: Groups, model: Model | None, shapes: Shapes | None) -> dict[str, Shape]:
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
        dims = model.initializer_dims(group.weight)
        axis = (group.weight_axis or 0) % max(len(dims), 1)
        out_channels = dims[axis] if dims else 1
        return float(math.prod(dims)) * max(values / max(out_channels, 1), 1.0)
    if model is not None and kind == "matmul" and group.inputs:
        inner = (tensor_shapes.get(group.inputs[0]) or (1,))[-1]
        return values * float(inner if isinstance(inner, int) and inner > 0 else 1)
    return values * target.cost.macs_per_value(kind)


def on_host(groups: Groups, target: Target, model: Model | None) -> frozenset[str]:
    """The groups the host runs (the target's host lookups; none without a model)."""
    if model is None or not target.host_rows:
        return frozenset()
    return host_groups(groups, host_gathers(model, target.host_rows))


def host_work_note(model: Model, target: Target) -> str | None:
    """What the cost leaves to the host, in one line (None: nothing)."""
    found = host_gathers(model, target.host_rows)
    if not found:
        return None
    tables = "; ".join(g.describe() for g in found)
    return (f"cost: the lookup of {tables} runs on the host ({target.name}'s "
            "[host_embedding]): not counted on the device")


def _is_boundary(a: Precision, b: Precision) -> bool:
    return a.act_bits != b.act_bits


Work = dict[str, tuple[float, float]]  # group -> (MACs at a8_w8, weights read per frame)


def weight_count(group: Group, model: Model | None) -> float:
    """Weights a weighted group reads per frame (0 for other groups or without a model)."""
    if model is None or group.kind is not GroupKind.WEIGHTED or group.weight is None:
        return 0.0
    try:
        return float(math.prod(model.initializer_dims(group.weight)))
    except KeyError:
        return 0.0


def weight_bytes(plan: Plan, groups: Groups, model: Model) -> float:
    """Bytes of the weighted groups' weights at ``plan``'s precisions (float: 4 bytes)."""
    return sum(weight_count(g, model) * (plan.precision_of(g.name).weight_bits or 32) / 8
               for g in groups.groups)


def _layout(
    groups: Groups, target: Target, model: Model | None, shapes: Shapes | None,
    weight_reads: bool = False,
) -> tuple[Work, Edges]:
    """Work per group (a8_w8; weights read when ``weight_reads``) and the boundary cost
    of every edge between groups."""
    tensor_shapes = _shapes(groups, model, shapes)
    reads = weight_reads and target.cost.weight_byte_macs > 0
    host = on_host(groups, target, model)
    work = {g.name: (0.0, 0.0) if g.name in host else
            (group_work(g, target, tensor_shapes, model),
             weight_count(g, model) if reads else 0.0) for g in groups.groups}
    edges = tuple(
        (a, b, _values(tensor_shapes.get(t)) * target.cost.boundary_macs)
        for a, b, t in group_edges(groups)
    )
    return work, edges


def _group_cost(target: Target, group: Group, precision: Precision,
                work: tuple[float, float]) -> float:
    factor = target.cost.factor(op_kind(group), precision)
    if factor is None:
        return math.inf
    macs, weights = work
    if not weights:
        return macs * factor
    return macs * factor + weights * (precision.weight_bits or 32) / 8 * \
        target.cost.weight_byte_macs


def _breakdown(
    plan: Plan, groups: Groups, target: Target, work: Work, edges: Edges
) -> dict[str, float]:
    out = {
        g.name: _group_cost(target, g, plan.precision_of(g.name), work[g.name])
        for g in groups.groups
    }
    boundary = 0.0
    for a, b, c in edges:
        if _is_boundary(plan.precision_of(a), plan.precision_of(b)):
            boundary += c
    out["<boundaries>"] = boundary
    return out


def _unit(groups: Groups, target: Target, work: Work) -> float:
    """Cost of uniform a8_w8 (no boundaries): the unit of every relative cost."""
    return sum(_group_cost(target, g, Precision.A8_W8, work[g.name]) for g in groups.groups)


def uniform_a8_cost(
    groups: Groups,
    target: Target,
    shapes: Shapes | None = None,
    *,
    model: Model | None = None,
    weight_reads: bool = False,
) -> float:
    """Unnormalized cost of uniform a8_w8: the unit of :func:`plan_cost` (e.g. to compare
    one model at two sequence lengths)."""
    work, _ = _layout(groups, target, model, shapes, weight_reads)
    return _unit(groups, target, work)


def cost_breakdown(
    plan: Plan,
    groups: Groups,
    target: Target,
    shapes: Shapes | None = None,
    *,
    model: Model | None = None,
    weight_reads: bool = False,
) -> dict[str, float]:
    """Unnormalized cost per group name, plus ``"<boundaries>"`` for all boundaries."""
    work, edges = _layout(groups, target, model, shapes, weight_reads)
    return _breakdown(plan, groups, target, work, edges)


def plan_cost(
    plan: Plan,
    groups: Groups,
    target: Target,
    shapes: Shapes | None = None,
    *,
    model: Model | None = None,
    weight_reads: bool = False,
) -> float:
    """Cost of ``plan`` relative to uniform a8_w8 (= 1.0); inf if a precision has no cost.
    ``weight_reads``: charge the weight bytes (module table)."""
    work, edges = _layout(groups, target, model, shapes, weight_reads)
    base = _unit(groups, target, work)
    total = sum(_breakdown(plan, groups, target, work, edges).values())
    return total / base if base > 0 else math.inf


@dataclass(frozen=True, eq=False)
class CostTable:
    """Per-group cost at each precision and per-edge boundary cost, as ``plan_cost`` does.

    ``total(prec)`` equals ``plan_cost`` of the plan (tested); ``delta`` is the change
    of one group's precision, its boundaries included.
    """

    group: dict[str, dict[Precision, float]]
    edges: dict[str, tuple[tuple[str, float], ...]]  # group -> (neighbour, boundary cost)
    all_edges: Edges
    base: float

    def total(self, prec: Mapping[str, Precision]) -> float:
        work = sum(self.group[g][p] for g, p in prec.items())
        bnd = sum(c for a, b, c in self.all_edges if prec[a].act_bits != prec[b].act_bits)
        return (work + bnd) / self.base

    def delta(self, prec: Mapping[str, Precision], group: str, new: Precision) -> float:
        old = prec[group]
        d = self.group[group][new] - self.group[group][old]
        for other, c in self.edges[group]:
            was = old.act_bits != prec[other].act_bits
            now = new.act_bits != prec[other].act_bits
            d += c * (int(now) - int(was))
        return d / self.base


def cost_table(
    groups: Groups,
    target: Target,
    model: Model,
    precisions: Sequence[Precision],
    shapes: Shapes | None = None,
    *,
    weight_reads: bool = False,
) -> CostTable:
    """The cost model's numbers for the search, for ``precisions`` (and a8_w8)."""
    work, all_edges = _layout(groups, target, model, shapes, weight_reads)
    precs = tuple(dict.fromkeys([Precision.A8_W8, *precisions]))
    table = {g.name: {p: _group_cost(target, g, p, work[g.name]) for p in precs}
             for g in groups.groups}
    edges: dict[str, list[tuple[str, float]]] = {g: [] for g in table}
    for a, b, c in all_edges:
        edges[a].append((b, c))
        edges[b].append((a, c))
    base = _unit(groups, target, work)
    return CostTable(table, {g: tuple(v) for g, v in edges.items()}, all_edges, base or math.inf)
