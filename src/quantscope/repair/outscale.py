"""Function-preserving rewrite: a residual branch's last Linear writes equalized channels (``outscale``).

In a post-LN encoder the FFN's down-projection writes into the residual stream's outlier
channels: on ``minilm-l6`` its output spans [-4, 195] in layer 0 while the median channel
spans about 1.1 (a ratio of 176), so at 8 bit the median channel gets about three levels.
Its reader is the residual Add, not a Linear, so SmoothQuant (``smooth``) has no site there,
and Hailo keeps attention-era residual Adds and LayerNorms at 16 bit only when they are
small enough (``hailo.super_defuse``; ``tokensplit``). This rewrite runs the residual Add
in a per-channel scaled basis instead:

=================  ==================================================================
before             ``t = x_in @ W + b`` (8 bit), ``z = Add(t, x)``, readers of ``z``
after              ``t' = x_in @ (W / s) + b / s`` (8 bit, every channel about the same
                   range), ``x' = Mul(x, 1 / s)``, ``z' = Add(t', x')``,
                   ``z = Mul(z', s)`` (the original name: readers unchanged)
=================  ==================================================================

``s`` is the calibrated per-channel max ``|t|`` (``TensorStats.channel_absmax``),
normalised to a geometric mean of 1 and clipped to ``[1e-4, 1e4]``. ``Mul(x, 1/s)`` is a
layer of its own (an ``elementwise`` group: ``x`` has other readers); ``Mul(z', s)`` fuses
into the Add's group, whose output is ``z`` as before. The two new tensors must be as
precise as the residual stream: **plan them at 16 bit** (the ``<Add>/outscale/in`` group and
the Add's group; at sequence 256 on Hailo with ``tokensplit``, which splits both) -- at 8
bit the skip branch ``x / s`` would carry the error this moves away.

Sites: a weighted group (MatMul with a 2-D initializer weight, optional bias Add) whose
output is read by exactly one Add with another activation operand of the same shape, is no
graph output, has statistics, weight and bias read by this node only, and whose channel
ratio (max / median of ``channel_absmax``) is at least ``min_ratio``. Anything else is
left with the reason.

**Unverified on a device**: that the compiler keeps the two constant Muls as layers of
their own (and does not fold ``s`` back into the Linear) is not a measurement
(:data:`UNVERIFIED`). The FP32 function is unchanged (checked by the caller).
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
    "unverified on a device: the per-channel Muls around the residual Add are layers of "
    "their own; that the compiler keeps them (and does not fold the scale back into the "
    "Linear) is not a measurement"
)
METADATA_KEY = "quantscope.outscale"
MIN_RATIO = 8.0  # channel max / median of the Linear's output: below this, no site
MAX_SCALE = 1e4


def _scales(absmax: np.ndarray) -> np.ndarray:
    a = absmax.astype(np.float64)
    a = np.where(a > 0, a, np.median(a[a > 0]) if np.any(a > 0) else 1.0)
    s = a / np.exp(np.mean(np.log(a)))
    return np.clip(s, 1.0 / MAX_SCALE, MAX_SCALE)


@dataclass(frozen=True, eq=False)
class _Graph:
    """The lookups every site reads."""

    inits: dict[str, onnx.TensorProto]
    counts: dict[str, int]
    readers: dict[str, list[onnx.NodeProto]]
    nodes: dict[str, onnx.NodeProto]
    outputs: frozenset[str]


@dataclass(frozen=True, eq=False)
class _Site:
    """A residual-branch Linear whose output channels are far apart: ``t = x' @ W + b``,
    ``z = Add(t, x)``."""

    mm: onnx.NodeProto  # the Linear's MatMul
    bias: str | None
    add: onnx.NodeProto  # the residual Add
    x: str  # the Add's other (skip) operand
    absmax: np.ndarray  # calibrated max |t| per output channel
    ratio: float  # max / median of ``absmax``
    channels: int


@dataclass(frozen=True, eq=False)
class _Edit:
    """One site's rewrite: the initializers rescaled and added, a Mul before and after the
    Add, the Add's new inputs and outputs, and the changes."""

    arrays: dict[str, np.ndarray]
    inits: tuple[onnx.TensorProto, ...]
    before: list[onnx.NodeProto]
    after: list[onnx.NodeProto]
    renamed: tuple[list[str], list[str]]
    changes: tuple[Change, ...]


def _site(g: Group, graph: _Graph, stats: Stats, min_ratio: float) -> _Site | str | None:
    """Group ``g`` as a site; None when it is not a residual-branch Linear (silently: most
    Linears), the reason when it is one that cannot be rescaled."""
    inits, nodes = graph.inits, graph.nodes
    if g.kind is not GroupKind.WEIGHTED or len(g.outputs) != 1:
        return None
    t = g.outputs[0]
    mm = nodes[g.nodes[0]]
    if mm.op_type != "MatMul" or mm.input[1] not in inits or \
            len(inits[mm.input[1]].dims) != 2:
        return None
    rs = graph.readers.get(t, [])
    if len(rs) != 1 or rs[0].op_type != "Add" or t in graph.outputs:
        return None  # not a residual branch: silently no site (most Linears)
    add = rs[0]
    x = next((i for i in add.input if i != t), None)
    if x is None or x in inits or add.input[0] == add.input[1]:
        return "its Add has no second activation operand"
    ts = stats.tensors.get(t)
    channels = int(inits[mm.input[1]].dims[1])
    if ts is None or ts.channel_absmax.size != channels:
        return "no per-channel statistics for its output (calibrate this model)"
    absmax = ts.channel_absmax.astype(np.float64)
    ratio = float(absmax.max() / max(np.median(absmax), 1e-12))
    if ratio < min_ratio:
        return f"output channel ratio {ratio:.1f} below {min_ratio:g}"
    bias_nodes = [nodes[n] for n in g.nodes[1:] if nodes[n].op_type == "Add"]
    bias = next((i for b in bias_nodes[:1] for i in b.input if i in inits), None)
    others = [n for n in g.nodes[1:] if nodes[n].op_type != "Add"]
    if others:
        return (f"an activation after the Linear ({nodes[others[0]].op_type}) "
                "does not commute with a per-channel scale")
    shared = [w for w in (mm.input[1], bias) if w and graph.counts.get(w, 0) > 1]
    if shared:
        return (f"initializer '{shared[0]}' is shared with another node "
                "(run outscale before tokensplit)")
    return _Site(mm=mm, bias=bias, add=add, x=x, absmax=absmax, ratio=ratio, channels=channels)


def _edit(site: _Site, graph: _Graph) -> _Edit:
    """The Linear's output channels divided by ``s``; the skip branch divided by ``s``
    before the Add and the sum multiplied by ``s`` after it (the original name)."""
    mm, bias, add, x = site.mm, site.bias, site.add, site.x
    s = _scales(site.absmax)
    w = numpy_helper.to_array(graph.inits[mm.input[1]])
    arrays = {mm.input[1]: (w.astype(np.float64) / s[None, :]).astype(w.dtype)}
    if bias is not None:
        b = numpy_helper.to_array(graph.inits[bias])
        arrays[bias] = (b.astype(np.float64) / s.reshape((1,) * (b.ndim - 1) + (-1,))
                        ).astype(b.dtype)
    inv, scale = f"{add.name}/outscale/inv", f"{add.name}/outscale/s"
    xs, zs = f"{x}/outscale/{add.name}", f"{add.output[0]}/outscaled"
    return _Edit(
        arrays=arrays,
        inits=(numpy_helper.from_array((1.0 / s).astype(np.float32), inv),
               numpy_helper.from_array(s.astype(np.float32), scale)),
        before=[helper.make_node("Mul", [x, inv], [xs], name=f"{add.name}/outscale/in")],
        after=[helper.make_node("Mul", [zs, scale], [add.output[0]],
                                name=f"{add.name}/outscale/out")],
        renamed=([xs if i == x else i for i in add.input], [zs]),
        changes=(
            Change(mm.input[1], "divide", 1, tuple(range(site.channels)), tuple(map(float, s)),
                   note=f"output channels / s (ratio {site.ratio:.0f} -> 1)"),
            Change(xs, "insert", note=f"Mul '{add.name}/outscale/in': the skip branch / s"),
            Change(add.output[0], "insert",
                   note=f"Mul '{add.name}/outscale/out': the sum * s, original name")))


def outscale(model: Model, stats: Stats, *, min_ratio: float = MIN_RATIO) -> Repair:
    """The model with equalized output channels on each residual-branch Linear (see module)."""
    graph = _Graph(inits={t.name: t for t in model.graph.initializer},
                   counts=use_counts(model.graph), readers=consumers_of(model.graph),
                   nodes={n.name: n for n in model.graph.node},
                   outputs=frozenset(model.output_names()))
    edits: list[tuple[str, _Edit]] = []  # (residual Add, its edit), in group order
    skipped: list[tuple[str, str]] = []
    for g in find_groups(model).groups:
        site = _site(g, graph, stats, min_ratio)
        if isinstance(site, str):
            skipped.append((g.name, site))
        elif site is not None:
            edits.append((site.add.name, _edit(site, graph)))
    if not edits:
        return Repair(name="outscale", reason="no residual-branch Linear with output channel "
                      f"ratio >= {min_ratio:g}", proto=model.proto, skipped=tuple(skipped))
    return _scaled(model, edits, tuple(skipped), min_ratio)


def _scaled(model: Model, edits: list[tuple[str, _Edit]],
            skipped: tuple[tuple[str, str], ...], min_ratio: float) -> Repair:
    """The rewritten model: every site's edit spliced in, the metadata note written."""
    arrays = {k: v for _, e in edits for k, v in e.arrays.items()}
    renamed = {add: e.renamed for add, e in edits}
    changes = tuple(c for _, e in edits for c in e.changes)
    proto = with_initializers(model.proto, arrays)
    order = spliced(proto.graph.node, {add: e.before for add, e in edits},
                    {add: e.after for add, e in edits}, renamed)
    proto = rewritten(proto, order, [t for _, e in edits for t in e.inits], (
        METADATA_KEY, f"sites={len(renamed)} min_ratio={min_ratio:g}; {UNVERIFIED}"))
    return Repair(
        name="outscale",
        reason=f"{len(renamed)} residual-branch Linear(s) write equalized output channels; "
        f"the residual Add runs in the scaled basis (groups '<Add>/outscale/in' and the Add: "
        f"plan them at 16 bit); {UNVERIFIED}",
        proto=proto,
        changes=changes,
        skipped=skipped,
        effect=(("sites", float(len(renamed))),),
    )


__all__ = ["METADATA_KEY", "MIN_RATIO", "UNVERIFIED", "outscale"]
