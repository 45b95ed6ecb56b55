"""Legality preflight: does a plan compile on a target? Pure: no ONNX Runtime.

Each target rule (see ``targets/*.toml``) names a check function in :data:`CHECKS`:

=========================  ===========================================================
``act16_on_kinds``         16-bit activations on a group whose op kind is listed
``a16_low_sublayer``       a16 on a weighted group whose weight codes, placed in the
                           16-bit split grid, have an empty low byte (Hailo a16 split)
``act16_wide_non_conv``    16-bit activations on a non-conv group whose output holds
                           at least ``max_values`` values per frame (batch dim excluded)
``quant_bias_add_rank``    a quantized Linear (weighted group) with a constant (bias) Add
                           on a tensor of rank ``rank`` (and at least ``min_values`` values)
``float_boundary_cascade`` a float group with quantized neighbours (boundaries)
=========================  ===========================================================

Two checks always run: every override names a known group (``plan.unknown_group``) and
every precision is allowed for the group's op kind (``precision.not_allowed``).

A lookup the target leaves to the host (``[host_embedding]`` in its TOML: a Gather of a
large table by an integer model input, :mod:`quantscope.model.host_gather`) is no device
layer, but its rows enter the compiled graph as an input tensor at the group's precision:
the target's rules still judge that tensor (e.g. ``hailo.super_defuse`` on a 16-bit
[T, hidden] input: whether the compiler takes one that wide is not known, so the
conservative answer stands), and one ``info`` problem (rule ``host.embedding``) says the
host runs the lookup, with the table and the profile's reason and provenance.

Adding a target rule: write ``check_<name>(rule, group, precision, ctx) -> Problem |
None`` here, register it in :data:`CHECKS`, and add a ``[[rules]]`` entry with
``check = "<name>"`` (params, reason, provenance, fix) to the target's TOML. If its
verdict depends only on the group and its precision, list it in :data:`LOCAL_CHECKS`:
the planner then screens moves against it once per (group, precision).

Shapes: symbolic dims are resolved from ``shapes`` -- concrete shapes of model inputs
(re-inferred through the graph; where inference stops, from one ONNX Runtime run on a
sample at those shapes: :func:`quantscope.model.shapes.shape_note`) or of any tensor. A
rule that needs a dim that is still unknown reports that it could not be evaluated, never
a pass, at the rule's own severity: an ``error`` rule that cannot be evaluated fails the
check (the plan may not compile; nobody can tell without the size), and the problem names
the unknown dims and the model inputs whose shapes would settle them
(``--input-shape NAME=DxD…``, ``--seq-len N``). The planner reports a move it refused
for that reason as blocked by ``<rule> (size unknown: give --input-shape NAME=… or --seq-len)``,
not by the rule itself (:func:`blocker_label`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import onnx

from quantscope.model.axes import softmax_facts
from quantscope.model.host_gather import host_gathers, host_groups
from quantscope.model.load import Model
from quantscope.model.shapes import Shape, Shapes, frame_values, group_edges, resolve_shapes
from quantscope.numerics import quantize, weight_encoding
from quantscope.plan.shared_weight import shared_weight_problems
from quantscope.targets.profile import Rule, Target, op_kind
from quantscope.types import Group, GroupKind, Groups, Plan, Precision, Problem, QuantscopeError


@dataclass(frozen=True, eq=False)
class Prepared:
    """What :func:`check` reads of a model on a target whatever the plan (its shapes, group
    edges, nodes by name, the host's lookups, who reads each group) and the verdicts of the
    local rules by (rule, group, precision): made once by :func:`prepare` for a search that
    checks hundreds of plans (minilm-l3's acceptance run checked 797, 19 s of its 205 s of
    CPU, most of it this, made again per plan, and every group's local rules judged again)."""

    groups: Groups
    model: Model
    target: Target
    shapes: dict[str, Shape]
    edges: tuple[tuple[str, str, str], ...]
    nodes: dict[str, onnx.NodeProto]
    host: dict[str, Problem]
    local: dict[tuple[str, str, Precision], Problem | None]

    def readers(self) -> dict[str, tuple[Group, ...]]:
        """Group name -> the groups that read its output (from :attr:`edges`)."""
        if not hasattr(self, "_readers"):
            by_name = self.groups.by_name()
            out: dict[str, list[Group]] = {}
            for src, dst, _ in self.edges:
                out.setdefault(src, []).append(by_name[dst])
            object.__setattr__(self, "_readers", {k: tuple(v) for k, v in out.items()})
        return self._readers  # type: ignore[attr-defined,no-any-return]


@dataclass(frozen=True, eq=False)
class RuleContext:
    """Everything a check function may read: the plan, and what :func:`prepare` made of the
    model on the target (the same for every plan of a search)."""

    plan: Plan
    prepared: Prepared

    @property
    def groups(self) -> Groups:
        return self.prepared.groups

    @property
    def model(self) -> Model:
        return self.prepared.model

    @property
    def target(self) -> Target:
        return self.prepared.target

    @property
    def shapes(self) -> dict[str, Shape]:
        return self.prepared.shapes

    @property
    def edges(self) -> tuple[tuple[str, str, str], ...]:
        return self.prepared.edges

    @property
    def nodes(self) -> dict[str, onnx.NodeProto]:
        return self.prepared.nodes

    def readers(self) -> dict[str, tuple[Group, ...]]:
        """Group name -> the groups that read its output (:meth:`Prepared.readers`)."""
        return self.prepared.readers()

    def output_shape(self, group: Group) -> Shape | None:
        return self.shapes.get(group.outputs[0]) if group.outputs else None


def _problem(
    rule: Rule, group: Group, detail: str, ctx: RuleContext, *, severity: str | None = None
) -> Problem:
    return Problem(
        group=group.name,
        rule=rule.id,
        reason=f"{rule.reason} [{detail}]",
        provenance=f"{rule.provenance}; target {ctx.target.name} ({ctx.target.sdk})",
        fix=rule.fix,
        severity=severity or rule.severity,
    )


NOT_EVALUATED = "could not evaluate"  # how a not-evaluated problem's reason starts
SIZE_UNKNOWN = "size unknown"


def _dims(shape: Shape | None) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]" \
        if shape is not None else "unknown (no shape)"


def symbolic_inputs(model: Model) -> list[tuple[str, str, str]]:
    """(name, ``[N, 3, H, W]``, ``NAME=1x3x<H>x<W>``) for each model input whose shape is
    not concrete: the example fills the first dim with 1 and names the others to give."""
    shapes, out = model.value_shapes(), []
    for n in model.input_names():
        shape = shapes.get(n)
        if shape is not None and all(isinstance(d, int) for d in shape):
            continue
        dims = [str(d) if isinstance(d, int) else "1" if i == 0 else f"<{d or '?'}>"
                for i, d in enumerate(shape or ())]
        out.append((n, _dims(shape), f"{n}={'x'.join(dims) or '<dims>'}"))
    return out


def _not_evaluated(rule: Rule, group: Group, shape: Shape | None, ctx: RuleContext) -> Problem:
    inputs = symbolic_inputs(ctx.model)
    where = (f"; symbolic model inputs: {', '.join(f'{n} {d}' for n, d, _ in inputs)}"
             if inputs
             else "; every input's shape is concrete, and shape inference and a sample run "
             "could not compute it")
    return Problem(
        group=group.name,
        rule=rule.id,
        reason=f"{NOT_EVALUATED}: {SIZE_UNKNOWN}: {group.name}'s output shape "
        f"{_dims(shape)} is not concrete{where} ({rule.reason})",
        provenance=f"{rule.provenance}; target {ctx.target.name} ({ctx.target.sdk})",
        fix="give the input shapes: --input-shape NAME=DxDx… ("
        + (" ".join(f"--input-shape {e}" for _, _, e in inputs) if inputs
           else "e.g. images=1x3x224x224") + "), or --seq-len N for token inputs; the rule "
        "is checked once the size is known",
        severity=rule.severity,
    )


def blocker_label(p: Problem) -> str:
    """How the planner names what blocked a move: the rule, or
    ``<rule> (size unknown: give --input-shape NAME=… or --seq-len)``
    when the rule could not be evaluated for want of a concrete shape."""
    if not p.reason.startswith(NOT_EVALUATED):
        return p.rule
    return f"{p.rule} ({SIZE_UNKNOWN}: give --input-shape NAME=… or --seq-len)"


def _estimate_note(rule: Rule, name: str) -> str:
    p = rule.param(name)
    return f"; {name} = {p.value:,} is an estimate: {p.note}" if p.estimate else ""


def _softmax_problem(
    rule: Rule, group: Group, node: onnx.NodeProto, precision: Precision, ctx: RuleContext
) -> Problem:
    """A Softmax named for what the graph shows: attention when a Q.K MatMul feeds it,
    else "Softmax over axis k" (e.g. a detector's box-distribution Softmax), with the
    rule's reason told as what was seen elsewhere and ``applies=False``: the one place
    that decides it, read by ``check``'s report and by the planner alike."""
    axis, rank, attention = softmax_facts(ctx.model, node)
    if attention:
        return _problem(rule, group, f"attention {node.op_type} (fed by an activation x "
                        f"activation MatMul) at {precision}", ctx)
    over = f"{node.op_type} over axis {axis}" + (f" of a rank-{rank} tensor" if rank else "")
    return replace(
        _problem(rule, group, f"{over} at {precision}", ctx),
        reason=f"16-bit activations on a {over}, not attention (no activation x activation "
        f"MatMul feeds it); this rule ({rule.id}) was seen on a different kind of layer, "
        f"so it may not apply here: {rule.reason}",
        fix=f"if the compiler fails on it, keep this {node.op_type} at 8-bit activations "
        "and put 16 bit on the layers around it",
        applies=False,
    )


def check_act16_on_kinds(
    rule: Rule, group: Group, precision: Precision, ctx: RuleContext
) -> Problem | None:
    """16 bit on a group of a listed kind; with the optional ``readers`` kinds, also on a
    non-weighted group whose output a group of such a kind reads (e.g. the attention
    weights ``rowscale`` writes with a Mul: the attention MatMul's own input)."""
    if precision.act_bits != 16:
        return None
    kinds = tuple(rule.param("kinds").value)
    if op_kind(group) in kinds:
        node = ctx.nodes.get(group.nodes[0]) if group.nodes else None
        if node is not None and node.op_type in ("Softmax", "LogSoftmax"):
            return _softmax_problem(rule, group, node, precision, ctx)
        return _problem(rule, group, f"{group.op_type} ({op_kind(group)}) at {precision}", ctx)
    readers = dict(rule.params).get("readers")
    if readers is None or group.kind is GroupKind.WEIGHTED:
        return None
    hit = sorted((c.name, op_kind(c)) for c in ctx.readers().get(group.name, ())
                 if op_kind(c) in tuple(readers.value))
    if not hit:
        return None
    return _problem(rule, group, f"{group.op_type} at {precision} is read by {hit[0][0]} "
                    f"({hit[0][1]})", ctx)


def low_byte_empty(
    weight: np.ndarray,
    precision: Precision,
    target: Target,
    *,
    axis: int | None,
    split_bits: int = 16,
    low_bits: int = 8,
) -> np.ndarray:
    """Per output channel: True where every weight code has an empty low part.

    The weight is quantized per channel at ``precision.weight_bits`` with the target's
    scheme, its stored codes are placed in the ``split_bits`` grid (an 8-bit code ``q``
    becomes ``q << 8``: the high byte) and the low ``low_bits`` of each code are tested:
    ``q16 % 2**low_bits == 0`` for all codes means the low sub-layer is empty.
    """
    bits = precision.weight_bits or split_bits
    s = target.scheme
    ax = None if axis is None else axis % weight.ndim
    enc = weight_encoding(
        weight,
        bits,
        axis=ax if s.weight_per_channel else None,
        signed=s.weight_signed,
        symmetric=s.weight_symmetric,
    )
    codes = quantize(weight, enc).astype(np.int64) << max(split_bits - bits, 0)
    low = np.mod(codes, 1 << low_bits) == 0
    if ax is None:
        return np.array([bool(low.all())])
    return np.moveaxis(low, ax, 0).reshape(weight.shape[ax], -1).all(axis=1)


def check_a16_low_sublayer(
    rule: Rule, group: Group, precision: Precision, ctx: RuleContext
) -> Problem | None:
    if group.kind is not GroupKind.WEIGHTED or precision.act_bits != 16 or group.weight is None:
        return None
    empty = low_byte_empty(
        ctx.model.initializer_array(group.weight),
        precision,
        ctx.target,
        axis=group.weight_axis,
        split_bits=int(rule.param("split_bits").value),
        low_bits=int(rule.param("low_bits").value),
    )
    if empty.all():
        why = (
            "8-bit weight codes sit in the high byte of the 16-bit split"
            if precision.weight_bits == 8
            else "every 16-bit weight code is a multiple of 256"
        )
        return _at_top(precision, _problem(
            rule,
            group,
            f"{precision}: low byte empty in all {empty.size} output channels ({why})",
            ctx,
        ), exact=True)
    if empty.any():
        return _at_top(precision, _problem(
            rule,
            group,
            f"{precision}: {int(empty.sum())} of {empty.size} output "
            "channels have an empty low byte (all-zero or pruned channels); fails if "
            "the DFC computes the low scale per channel (unconfirmed)",
            ctx,
            severity="warning",
        ), exact=False)
    return None


def _at_top(precision: Precision, found: Problem, *, exact: bool) -> Problem:
    """At 16-bit weights the rule's "use a16_w16" is where the layer already is: offer
    what else can help instead (``exact``: every code's low byte is empty, so 8-bit
    weights hold them exactly)."""
    if precision.weight_bits != 16:
        return found
    why = (" (every 16-bit code is a multiple of 256: 8-bit weights hold them exactly)"
           if exact else "")
    return replace(found, fix=(
        f"{precision} is the highest precision, so no higher one helps: keep this layer at "
        f"a8_w8{why}, or change the weights so the empty channels' low byte fills (a repair "
        "that rescales them, e.g. equalize, or a finetune); pruned all-zero channels can "
        "be removed from the layer"))


def check_act16_wide_non_conv(
    rule: Rule, group: Group, precision: Precision, ctx: RuleContext
) -> Problem | None:
    if precision.act_bits != 16 or op_kind(group) in tuple(rule.param("exempt_kinds").value):
        return None
    if not group.outputs:  # nothing of the group is stored (no output read outside it)
        return None
    shape = ctx.output_shape(group)
    values = frame_values(shape)
    if values is None:
        return _not_evaluated(rule, group, shape, ctx)
    limit = int(rule.param("max_values").value)
    if values < limit:
        return None
    detail = (
        f"{group.op_type} output {list(shape[1:])} = {values:,} values per frame "  # type: ignore[index]
        f">= {limit:,}{_estimate_note(rule, 'max_values')}"
    )
    return _problem(rule, group, detail, ctx)


def _bias_add_outputs(group: Group, ctx: RuleContext) -> list[str]:
    inits = {t.name for t in ctx.model.graph.initializer}
    outs = []
    for name in group.nodes:
        node = ctx.nodes.get(name)
        if node is not None and node.op_type == "Add" and any(t in inits for t in node.input):
            outs.append(node.output[0])
    return outs


def check_quant_bias_add_rank(
    rule: Rule, group: Group, precision: Precision, ctx: RuleContext
) -> Problem | None:
    if precision is Precision.FLOAT or group.kind is not GroupKind.WEIGHTED:
        return None
    rank, min_values = int(rule.param("rank").value), int(rule.param("min_values").value)
    for tensor in _bias_add_outputs(group, ctx):
        shape = ctx.shapes.get(tensor)
        if shape is None or len(shape) != rank:
            continue
        if min_values > 0:
            if not all(isinstance(d, int) for d in shape):
                return _not_evaluated(rule, group, shape, ctx)
            if math.prod(shape) < min_values:  # type: ignore[arg-type]
                continue
        return _problem(
            rule,
            group,
            f"bias Add '{tensor}' on a rank-{rank} tensor "
            f"{list(shape)} at {precision}{_estimate_note(rule, 'min_values')}",
            ctx,
        )
    return None


def check_float_boundary_cascade(
    rule: Rule, group: Group, precision: Precision, ctx: RuleContext
) -> Problem | None:
    if precision is not Precision.FLOAT:
        return None
    prec = ctx.plan.precision_of
    here = [
        e
        for e in ctx.edges
        if group.name in e[:2] and prec(e[1] if e[0] == group.name else e[0]) is not Precision.FLOAT
    ]
    if len(here) < int(rule.param("min_boundaries").value):
        return None
    total = sum(
        1 for a, b, _ in ctx.edges if (prec(a) is Precision.FLOAT) != (prec(b) is Precision.FLOAT)
    )
    return _problem(
        rule,
        group,
        f"{len(here)} FP16<->quantized boundaries at this group, {total} in the whole plan",
        ctx,
    )


CheckFn = Callable[[Rule, Group, Precision, RuleContext], Problem | None]
CHECKS: dict[str, CheckFn] = {
    "act16_on_kinds": check_act16_on_kinds,
    "a16_low_sublayer": check_a16_low_sublayer,
    "act16_wide_non_conv": check_act16_wide_non_conv,
    "quant_bias_add_rank": check_quant_bias_add_rank,
    "float_boundary_cascade": check_float_boundary_cascade,
}
# checks whose verdict on a group depends only on that group and its precision
LOCAL_CHECKS = frozenset(
    {"act16_on_kinds", "a16_low_sublayer", "act16_wide_non_conv", "quant_bias_add_rank"}
)
# rule ids of the two checks that always run (:func:`_plan_problems`); both are local
BUILTIN_RULES = frozenset({"precision.not_allowed", "plan.unknown_group"})


def _plan_problems(plan: Plan, groups: Groups, target: Target,
                   memo: dict[tuple[str, str, Precision], Problem | None] | None = None,
                   ) -> list[Problem]:
    known = set(groups.names())
    where = f"target profile {target.source} ({target.sdk})"
    out = [
        Problem(
            group=name,
            rule="plan.unknown_group",
            reason=f"the plan sets {p} on '{name}', which is no group of this model",
            provenance="quantscope grouping of this model",
            fix="remove the override or use a group name listed by `quantscope groups`",
        )
        for name, p in plan.overrides
        if name not in known
    ]
    out += shared_weight_problems(plan, groups)
    memo = {} if memo is None else memo
    for g in groups.groups:
        p = plan.precision_of(g.name)
        key = ("precision.not_allowed", g.name, p)
        if key not in memo:
            memo[key] = _not_allowed(g, p, target, where)
        if memo[key] is not None:
            out.append(memo[key])
    return out


def _not_allowed(g: Group, p: Precision, target: Target, where: str) -> Problem | None:
    kind = op_kind(g)
    if target.is_allowed(kind, p):
        return None
    allowed = ", ".join(target.allowed(kind)) or "none"
    return Problem(group=g.name, rule="precision.not_allowed",
                   reason=f"{p} is not allowed for {kind} groups on {target.name}",
                   provenance=where, fix=f"use one of: {allowed}")


HOST_RULE = "host.embedding"


def _host_notes(groups: Groups, model: Model, target: Target) -> dict[str, Problem]:
    """Group name -> the ``info`` problem saying the host runs it (the target's lookups
    left to the host)."""
    found = host_gathers(model, target.host_rows)
    if not found or target.host_embedding is None:
        return {}
    host = target.host_embedding
    by_node = {g.node: g for g in found}
    out = {}
    for name in sorted(host_groups(groups, found)):
        group = groups.by_name()[name]
        lookup = by_node[group.nodes[0]]
        out[name] = Problem(
            group=name, rule=HOST_RULE, severity="info",
            reason=f"the lookup of {lookup.describe()} runs on the host, not as a device "
            f"layer: the cost leaves it out, and {target.name}'s rules judge its rows as the "
            f"compiled graph's input tensor "
            f"(tables of {host.min_rows:,}+ rows{', an estimate' if host.rows.estimate else ''}"
            f"): {host.reason}",
            provenance=f"{host.provenance}; target {target.name} ({target.sdk})",
            fix=f"on the host: rows = {lookup.table}[{lookup.indices}] (the table from the "
            f"FP32 model), fed to the compiled graph as '{lookup.output}' (io_snippet.py); "
            "cut the graph for the compiler after this Gather")
    return out


def prepare(groups: Groups, model: Model, target: Target,
            shapes: Shapes | None = None) -> Prepared:
    """The plan-free part of :func:`check` for ``groups`` of ``model`` on ``target``."""
    for rule in target.rules:
        if rule.check not in CHECKS:
            raise QuantscopeError(
                f"rule '{rule.id}' in '{target.source}' names unknown check "
                f"'{rule.check}': use one of {', '.join(CHECKS)}"
            )
    return Prepared(groups=groups, model=model, target=target,
                    shapes=resolve_shapes(model, shapes), edges=group_edges(groups),
                    nodes={n.name: n for n in model.graph.node},
                    host=_host_notes(groups, model, target), local={})


def check(
    plan: Plan,
    groups: Groups,
    model: Model,
    target: Target,
    *,
    shapes: Shapes | None = None,
    prepared: Prepared | None = None,
) -> list[Problem]:
    """Every problem the plan hits on ``target``: group, rule, reason, provenance, fix.
    ``prepared``: :func:`prepare` of the same groups, model, target and shapes (made here
    when None or made for others)."""
    if prepared is None or prepared.groups is not groups or prepared.model is not model or (
            prepared.target is not target):
        prepared = prepare(groups, model, target, shapes)
    ctx = RuleContext(plan=plan, prepared=prepared)
    problems = _plan_problems(plan, groups, target, prepared.local)
    problems += prepared.host.values()
    local = prepared.local
    for g in groups.groups:
        precision = plan.precision_of(g.name)
        for rule in target.rules:
            if rule.check in LOCAL_CHECKS:
                key = (rule.id, g.name, precision)
                if key not in local:
                    local[key] = CHECKS[rule.check](rule, g, precision, ctx)
                found = local[key]
            else:
                found = CHECKS[rule.check](rule, g, precision, ctx)
            if found is not None:
                problems.append(found)
    return problems
