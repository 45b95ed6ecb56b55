"""Function-preserving rewrite: an FFN's few outlier hidden channels get a layer of their own (``peel``).

The FFN's up-projection + activation (``h = GELU(x @ W1 + b1)``, [B, T, 1536] in
``minilm-l6``) writes one 8-bit tensor whose grid is set by one or two channels: layer 0's
channel 856 reaches 24.7 while the median channel's max is 1.7 and every other channel
stays below 6.4, so the grid spends most of its 256 levels on one channel. The activation
sits between the two Linears, so no per-channel scale can move through it (``smooth`` and
``equalize`` have no site), and ``outscale`` only equalizes the down-projection's output.
This rewrite moves those channels into a small FFN of their own beside the big one:

=================  ==================================================================
before             ``h = act(x @ W1 + b1)``, ``t = h @ W2 + b2``, ``z = Add(t, r)``
after              ``h = act(x @ W1[:, K] + b1[K])`` (8 bit, its grid set by the kept
                   channels ``K``), ``t = h @ W2[K, :] + b2`` (same name);
                   ``hp = act(x @ W1[:, P] + b1[P])`` (the peeled channels ``P``, a layer
                   of their own with its own grid), ``tp = hp @ W2[P, :]``;
                   ``rp = Add(r, tp)`` (``<Add>/peel``) and ``z = Add(t, rp)``
=================  ==================================================================

``P`` are the channels whose calibrated max ``|h|`` (``TensorStats.channel_absmax``) is at
least ``factor`` times the median channel's (at most :data:`MAX_PEEL` of them, the largest).
``tp`` joins the residual stream through its own Add on the skip branch, so the big
down-projection's output grid is unchanged; plan ``<Add>/peel`` at the residual stream's
precision (16 bit; at sequence 256 on Hailo ``tokensplit`` splits it). The two small
Linears cost ``2 * |P| * H`` MACs per token.

Sites: a weighted group (MatMul with a 2-D initializer weight, a bias Add, then an
elementwise activation whose other operands are scalars) whose output is read only by
one MatMul with a 2-D initializer weight, whose group output is read by exactly one Add
with another activation operand (a residual Add; with ``outscale`` applied first, the
scaled skip branch). Weights read by other nodes are left (run ``peel`` before
``tokensplit``). Anything else is left with the reason.

**Unverified on a device**: the rewrite is ordinary Linears, activations and an Add; that
the compiler keeps the one- or two-channel Linears as layers of their own is the usual
behaviour, not a measurement here (:data:`UNVERIFIED`). The FP32 function is unchanged
(checked by the caller).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.repair import (
    Change,
    Repair,
    consumers_of,
    rewritten,
    spliced,
    use_counts,
    with_initializers,
)
from quantscope.types import Group, GroupKind, Stats

UNVERIFIED = (
    "unverified on a device: the peeled channels run as small Linears of their own and "
    "join the residual stream through an Add; that the compiler keeps them as separate "
    "layers is not a measurement"
)
METADATA_KEY = "quantscope.peel"
FACTOR = 4.0  # a hidden channel whose max |h| is this many medians is peeled ...
MAX_PEEL = 8  # ... at most this many per FFN (the largest)
ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Erf", "Tanh", "Sigmoid", "Relu",
                         "Gelu", "Pow", "Sqrt", "Exp", "Clip", "LeakyRelu", "HardSigmoid",
                         "HardSwish", "Softplus", "Identity"})


def _scalar(name: str, inits: dict[str, onnx.TensorProto], consts: dict[str, int]) -> bool:
    if name in inits:
        return int(np.prod(inits[name].dims)) == 1
    return consts.get(name, 0) == 1


def _constant_sizes(model: Model) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].type == \
                onnx.AttributeProto.TENSOR:
            out[n.output[0]] = int(np.prod(n.attribute[0].t.dims))
    return out


def _activation_why(chain: list[onnx.NodeProto], inits: dict, consts: dict[str, int],
                    made: set[str]) -> str | None:
    for n in chain:
        if n.op_type == "Constant":
            continue
        if n.op_type not in ELEMENTWISE:
            return f"its activation has a {n.op_type}, not an elementwise op"
        for i in n.input:
            if i and i not in made and not _scalar(i, inits, consts):
                return f"its activation reads '{i}', which is not a scalar"
        made.update(n.output)
    return None


def _suffix(model: Model) -> str:
    """``peel``, or ``peel2``, ``peel3``… when the model was peeled before (a second tier:
    names must stay unique)."""
    taken = {n.name for n in model.graph.node}
    k = 1
    while any(t.endswith("/peel" if k == 1 else f"/peel{k}") for t in taken):
        k += 1
    return "peel" if k == 1 else f"peel{k}"


@dataclass(frozen=True, eq=False)
class _Graph:
    """The lookups every site reads."""

    inits: dict[str, onnx.TensorProto]
    consts: dict[str, int]
    counts: dict[str, int]
    readers: dict[str, list[onnx.NodeProto]]
    nodes: dict[str, onnx.NodeProto]
    groups: tuple[Group, ...]
    outputs: frozenset[str]


def _graph(model: Model) -> _Graph:
    return _Graph(inits={t.name: t for t in model.graph.initializer},
                  consts=_constant_sizes(model), counts=use_counts(model.graph),
                  readers=consumers_of(model.graph),
                  nodes={n.name: n for n in model.graph.node},
                  groups=tuple(find_groups(model).groups),
                  outputs=frozenset(model.output_names()))


@dataclass(frozen=True, eq=False)
class _Site:
    """An FFN on a residual branch: ``h = act(x @ W1 + b1)``, ``t = h @ W2``,
    ``z = Add(t, skip)``."""

    group: Group
    h: str  # the hidden activation (the group's output)
    mm: onnx.NodeProto  # the up-projection
    badd: onnx.NodeProto  # its bias Add
    bias: str
    chain: tuple[onnx.NodeProto, ...]  # the activation's nodes
    down: onnx.NodeProto  # the down-projection
    t: str  # its group's output
    add: onnx.NodeProto  # the residual Add
    skip: str  # the Add's other operand


@dataclass(frozen=True, eq=False)
class _Channels:
    """The hidden channels peeled (``peeled``) and kept, with their calibrated max |h|."""

    peeled: np.ndarray
    kept: np.ndarray
    absmax: np.ndarray
    median: float
    width: int


@dataclass(frozen=True, eq=False)
class _Edit:
    """One site's rewrite: the initializers cut and added, the nodes spliced in before the
    residual Add, its new inputs, and the changes."""

    arrays: dict[str, np.ndarray]
    inits: tuple[onnx.TensorProto, ...]
    nodes: list[onnx.NodeProto]
    rewire: tuple[list[str], list[str]]
    changes: tuple[Change, ...]


def _ffn(g: Group, graph: _Graph) -> _Site | None:
    """The FFN whose first Linear is group ``g``, down to its residual Add; None when
    ``g`` is not one (silently: no site)."""
    if g.kind is not GroupKind.WEIGHTED or len(g.outputs) != 1 or len(g.nodes) < 3:
        return None
    inits, readers = graph.inits, graph.readers
    h = g.outputs[0]
    mm = graph.nodes[g.nodes[0]]
    rs = readers.get(h, [])
    if mm.op_type != "MatMul" or mm.input[1] not in inits or h in graph.outputs or \
            len(inits[mm.input[1]].dims) != 2 or len(rs) != 1 or rs[0].op_type != "MatMul":
        return None  # not an FFN's first Linear: silently no site
    down = rs[0]
    dgroup = next((x for x in graph.groups if down.name in x.nodes), None)
    if dgroup is None or down.input[1] not in inits or len(dgroup.outputs) != 1:
        return None
    t = dgroup.outputs[0]
    adds = readers.get(t, [])
    if len(adds) != 1 or adds[0].op_type != "Add" or t in graph.outputs:
        return None  # its second Linear is not a residual branch
    add = adds[0]
    skip = next((i for i in add.input if i != t), None)
    if skip is None or skip in inits or add.input[0] == add.input[1]:
        return None
    badd = graph.nodes[g.nodes[1]]
    bias = next((i for i in badd.input if i in inits), None) if badd.op_type == "Add" \
        else None
    return _Site(group=g, h=h, mm=mm, badd=badd, bias=bias or "",
                 chain=tuple(graph.nodes[n] for n in g.nodes[2:]), down=down, t=t, add=add,
                 skip=skip)


def _why_not(site: _Site, graph: _Graph) -> str | None:
    """Why an FFN cannot be peeled (its bias, its activation, shared weights); None when
    it can."""
    inits = graph.inits
    if not site.bias or \
            int(np.prod(inits[site.bias].dims)) != int(inits[site.mm.input[1]].dims[1]):
        return "its Linear has no bias Add before the activation"
    why = _activation_why(list(site.chain), inits, graph.consts, {site.badd.output[0]})
    if why:
        return why
    shared = [w for w in (site.mm.input[1], site.bias, site.down.input[1])
              if graph.counts.get(w, 0) > 1]
    if shared:
        return f"initializer '{shared[0]}' is shared with another node (run peel before tokensplit)"
    return None


def _channels(site: _Site, stats: Stats, graph: _Graph, factor: float,
              max_peel: int) -> _Channels | str:
    """The hidden channels to peel (at most ``max_peel``, each at least ``factor`` medians),
    or why there are none."""
    ts = stats.tensors.get(site.h)
    width = int(graph.inits[site.mm.input[1]].dims[1])
    if ts is None or ts.channel_absmax.size != width:
        return "no per-channel statistics for its output (calibrate this model)"
    absmax = ts.channel_absmax.astype(np.float64)
    med = float(np.median(absmax))
    order = np.argsort(-absmax, kind="stable")
    peeled = np.sort(np.array([c for c in order[:max_peel] if absmax[c] >= factor * med],
                              dtype=np.int64))
    if peeled.size == 0:
        return (f"no hidden channel reaches {factor:g} x the median "
                f"channel max ({absmax.max() / max(med, 1e-12):.1f} x)")
    return _Channels(peeled=peeled, kept=np.setdiff1d(np.arange(width), peeled),
                     absmax=absmax, median=med, width=width)


def _peeled_nodes(site: _Site, sfx: str) -> tuple[list[onnx.NodeProto], dict[str, str]]:
    """The peeled channels' up-projection, bias Add and activation (copies, renamed with
    ``/sfx``), and the renamed tensors."""
    mm, badd, bias = site.mm, site.badd, site.bias
    names = {mm.output[0]: f"{mm.output[0]}/{sfx}", badd.output[0]: f"{badd.output[0]}/{sfx}"}
    new = [helper.make_node("MatMul", [mm.input[0], f"{mm.input[1]}/{sfx}"],
                            [names[mm.output[0]]], name=f"{mm.name}/{sfx}"),
           helper.make_node("Add", [names.get(i, f"{bias}/{sfx}" if i == bias else i)
                                    for i in badd.input],
                            [names[badd.output[0]]], name=f"{badd.name}/{sfx}")]
    for n in site.chain:
        if n.op_type == "Constant":
            continue
        copy = onnx.NodeProto()
        copy.CopyFrom(n)
        copy.name = f"{n.name}/{sfx}"
        copy.input[:] = [names.get(i, i) for i in n.input]
        for o in n.output:
            names[o] = f"{o}/{sfx}"
        copy.output[:] = [names[o] for o in n.output]
        new.append(copy)
    return new, names


def _edit(site: _Site, ch: _Channels, graph: _Graph, sfx: str) -> _Edit:
    """The site rewritten: the kept channels stay in the FFN; the peeled ones get their own
    small FFN whose output joins the skip branch through a new Add."""
    mm, bias, down, add, skip = site.mm, site.bias, site.down, site.add, site.skip
    peeled, kept, absmax, med = ch.peeled, ch.kept, ch.absmax, ch.median
    w1 = numpy_helper.to_array(graph.inits[mm.input[1]])
    b1 = numpy_helper.to_array(graph.inits[bias])
    w2 = numpy_helper.to_array(graph.inits[down.input[1]])
    arrays = {mm.input[1]: w1[:, kept], bias: b1.reshape(-1)[kept], down.input[1]: w2[kept, :]}
    pre = f"{mm.name}/{sfx}"
    inits = (numpy_helper.from_array(w1[:, peeled], f"{mm.input[1]}/{sfx}"),
             numpy_helper.from_array(b1.reshape(-1)[peeled], f"{bias}/{sfx}"),
             numpy_helper.from_array(w2[peeled, :], f"{down.input[1]}/{sfx}"))
    new, names = _peeled_nodes(site, sfx)
    tp, rp = f"{site.t}/{sfx}", f"{skip}/{sfx}/{add.name}"
    new += [helper.make_node("MatMul", [names[site.h], f"{down.input[1]}/{sfx}"], [tp],
                             name=f"{down.name}/{sfx}"),
            helper.make_node("Add", [skip, tp], [rp], name=f"{add.name}/{sfx}")]
    ratio_after = float(absmax[kept].max() / max(med, 1e-12))
    changes = (
        Change(site.h, "split", 2, tuple(int(c) for c in peeled),
               tuple(float(absmax[c]) for c in peeled),
               note=f"{peeled.size} hidden channel(s) of {ch.width} peeled into '{pre}' "
                    f"(max/median {absmax.max() / max(med, 1e-12):.1f} -> {ratio_after:.1f})"),
        Change(rp, "insert", note=f"Add '{add.name}/{sfx}': the skip branch + the peeled "
                                  "channels' down-projection"))
    return _Edit(arrays=arrays, inits=inits, nodes=new,
                 rewire=([rp if i == skip else i for i in add.input], list(add.output)),
                 changes=changes)


def peel(model: Model, stats: Stats, *, factor: float = FACTOR,
         max_peel: int = MAX_PEEL) -> Repair:
    """The model with each FFN's outlier hidden channels in a small FFN of their own."""
    graph = _graph(model)
    sfx = _suffix(model)
    edits: list[tuple[str, _Edit]] = []  # (residual Add, its edit), in group order
    skipped: list[tuple[str, str]] = []
    for g in graph.groups:
        site = _ffn(g, graph)
        if site is None:
            continue
        found = _why_not(site, graph) or _channels(site, stats, graph, factor, max_peel)
        if isinstance(found, str):
            skipped.append((g.name, found))
            continue
        edits.append((site.add.name, _edit(site, found, graph, sfx)))
    if not edits:
        return Repair(name="peel", reason=f"no FFN hidden channel reaches {factor:g} x the "
                      "median channel max", proto=model.proto, skipped=tuple(skipped))
    return _peeled(model, edits, tuple(skipped), factor, sfx)


def _peeled(model: Model, edits: list[tuple[str, _Edit]], skipped: tuple[tuple[str, str], ...],
            factor: float, sfx: str) -> Repair:
    """The rewritten model: every site's edit spliced in, the metadata note extended."""
    arrays = {k: v for _, e in edits for k, v in e.arrays.items()}
    before = {add: e.nodes for add, e in edits}
    rewired = {add: e.rewire for add, e in edits}
    changes = [c for _, e in edits for c in e.changes]
    proto = with_initializers(model.proto, arrays)
    order = spliced(proto.graph.node, before, {}, rewired)
    sites = len(rewired)
    earlier = next((m.value for m in model.proto.metadata_props if m.key == METADATA_KEY), "")
    tier = f"sites={sites} factor={factor:g}" if sfx == "peel" else \
        f"{sfx}: sites={sites} factor={factor:g}"
    note = f"{earlier.removesuffix(f'; {UNVERIFIED}')}; {tier}" if earlier else tier
    proto = rewritten(proto, order, [t for _, e in edits for t in e.inits],
                      (METADATA_KEY, f"{note}; {UNVERIFIED}"))
    return Repair(
        name="peel",
        reason=f"{sites} FFN(s): their outlier hidden channels run in a small FFN of their "
        f"own that joins the residual stream through a new Add (groups '<Add>/{sfx}': plan "
        f"them at 16 bit like the residual stream); {UNVERIFIED}",
        proto=proto,
        changes=tuple(changes),
        skipped=skipped,
        effect=(("sites", float(sites)),
                ("channels", float(sum(len(c.channels) for c in changes if c.kind == "split")))),
    )


__all__ = ["FACTOR", "MAX_PEEL", "METADATA_KEY", "UNVERIFIED", "peel"]
