"""Outlier channel splitting (OCS, Zhao et al. ICML 2019) for activations, residual streams too.

A per-tensor activation grid is set by the tensor's widest channel. Replacing channel ``c``
by ``k`` copies that each carry ``x[c] / k`` divides that channel's range by ``k``; every
reader adds the copies back, so the FP32 function is unchanged (``k = 2`` is OCS's split;
a channel split again gets three, four … equal copies rather than halves of halves, which
lowers the range more per extra channel).

A *site* is a connected set of activation tensors linked through ops that commute with a
per-channel ``x -> x / k`` (``k > 0``): every tensor of a site is split identically.

Conditions, each checked (a failure skips the whole site, reason in ``Repair.skipped``)
===================  ==================================================================
inside a site        ``Relu``, ``LeakyRelu``, ``Identity``; ``PRelu`` with an initializer
                     slope (a per-channel slope is duplicated with its channel, a scalar
                     one is kept); ``Add`` of two site tensors of the same shape (a
                     residual Add: both operands are split identically)
entries (producers)  ``Conv`` / ``ConvTranspose`` (group 1) / ``Gemm`` / 2-D ``MatMul``
                     with an initializer weight (weight layouts from
                     :mod:`quantscope.model.layouts`); bias an initializer (input 2, or a
                     MatMul's bias ``Add``) or none: output channel ``c`` and its bias
                     duplicated, every copy divided by ``k``
exits (readers)      ``Conv`` / ``ConvTranspose`` (group 1) / ``Gemm`` (no transA) /
                     2-D ``MatMul`` reading
                     the tensor as data input, initializer weight: input channel ``c``
                     duplicated, copies *not* divided (they add ``k`` times ``x[c]/k``)
stops                anything else producing or reading a site tensor (LayerNorm, Softmax,
                     Reshape, Concat, Pad, a constant Add, a graph input or output …), a
                     shared initializer, a grouped Conv, an unknown rank, or entries and
                     exits that disagree on the channel axis (NCHW axis 1 vs last axis)
outlier ratio        per site tensor ``max_c a[c] / median_c a[c]`` (``a`` = per-channel
                     max |x| from the calibration stats, or a tapped FP32 run on the
                     feeds); the site's ratio is the worst tensor's; below ``ratio`` the
                     site is skipped (nothing to gain)
budget               at most ``max(min_extra, floor(budget * width))`` extra channels;
                     greedy: the channel that is widest after its current split gets one
                     more copy, until no channel is above ``ratio`` or the budget is
                     spent; trailing copies that did not lower the range are dropped
layout               tensor and node names kept; copies appended at the end of the
                     channel axis (shapes change: value_info of changed tensors re-inferred)
FP32                 outputs unchanged on the sample inputs (<= 1e-5 relative)
===================  ==================================================================
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper, shape_inference

from quantscope.calibrate.collect import tapped_model
from quantscope.emulate.session import make_session, runner
from quantscope.model.layouts import WeightLayout, layout_of
from quantscope.model.load import Model
from quantscope.repair import (
    Change,
    Repair,
    RepairInput,
    RepairStep,
    as_model,
    consumers_of,
    step_of,
    use_counts,
    with_initializers,
)
from quantscope.repair.verify import Batch, check_function
from quantscope.types import Stats

PASS_THROUGH = frozenset({"Relu", "LeakyRelu", "PRelu", "Identity"})
WEIGHTED = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
_PRODUCES_WHY = {
    "LayerNormalization": "its output has its input's width (it normalises over a fixed "
    "width), so it cannot emit extra channels",
}
_WHY = {
    "LayerNormalization": "splitting a channel changes its mean and variance "
    "(LayerNorm works on a fixed width)",
    "Softmax": "it normalises over a fixed set of values: a split channel would count twice",
    "Reshape": "it moves channels to other positions: the appended copies would land elsewhere",
    "Transpose": "it moves the channel axis: the copies would not stay a channel",
    "Flatten": "it merges the channel axis with others: the copies would land elsewhere",
    "Concat": "appended copies would land in the middle of the concatenated tensor",
    "Pad": "it pads by position: appended copies would be shifted against the padding",
}


@dataclass(frozen=True)
class Edit:
    """An initializer whose ``axis`` follows the site's channels (copies / k when ``divide``)."""

    init: str
    axis: int
    divide: bool
    role: str  # "entry weight" | "entry bias" | "exit weight" | "PRelu slope"


@dataclass(frozen=True)
class Site:
    tensors: tuple[str, ...]  # activation tensors, graph order; all split identically
    axis: int  # non-negative channel axis of every site tensor
    width: int
    edits: tuple[Edit, ...]
    internal: tuple[str, ...]  # other tensors whose width changes (MatMul before its bias Add)


def _layout(node: onnx.NodeProto) -> WeightLayout:
    """The weight layout of a weighted op (:mod:`quantscope.model.layouts`)."""
    lay = layout_of(node)
    assert lay is not None, f"{node.op_type} '{node.name}' is not a weighted op"
    return lay


class _Stop(Exception):
    """Raised inside :class:`_Walker` with the reason a site cannot be split."""


class _Walker:
    """Grows one site from a seed tensor; raises :class:`_Stop` with the reason."""

    def __init__(self, model: Model) -> None:
        g = model.graph
        self.inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
        self.prod = {o: n for n in g.node for o in n.output}
        self.cons = consumers_of(g)
        self.counts = use_counts(g)
        self.outputs = set(model.output_names())
        self.shapes = model.value_shapes()
        self.order = {o: i for i, n in enumerate(g.node) for o in n.output}

    def grow(self, seed: str) -> tuple[Site | None, str | None, set[str]]:
        """(site, None) or (None, reason); the tensors reached either way."""
        self.tensors: dict[str, None] = {}
        self.edits: dict[str, Edit] = {}
        self.internal: list[str] = []
        self.prelus: list[onnx.NodeProto] = []
        self.axis: int | None = None
        self.rank: int | None = None
        todo = [seed]
        try:
            while todo:
                t = todo.pop()
                if t not in self.tensors:
                    self._visit(t, todo)
            return self._site(), None, set(self.tensors)
        except _Stop as stop:
            return None, str(stop), set(self.tensors)

    def _visit(self, t: str, todo: list[str]) -> None:
        self.tensors[t] = None
        shape = self.shapes.get(t)
        if shape is None:
            raise _Stop(f"'{t}' has no inferred shape (its channel axis is unknown)")
        if self.rank is not None and len(shape) != self.rank:
            raise _Stop(f"'{t}' has rank {len(shape)}, other site tensors {self.rank}")
        self.rank = len(shape)
        if t in self.outputs:
            raise _Stop(f"'{t}' is a graph output: its width is part of the model's interface")
        todo.extend(self._producer(t))
        for node in self.cons.get(t, []):
            todo.extend(self._consumer(node, t))

    def _producer(self, t: str) -> list[str]:
        node = self.prod.get(t)
        if node is None:
            raise _Stop(f"'{t}' is a graph input: its channels come from outside the model")
        if node.op_type in PASS_THROUGH:
            self._pass_through(node)
            return [node.input[0]]
        if node.op_type == "Add" and self.bias_add(node) is not None:
            self._entry(self.bias_add(node), bias_add=node)
            return []
        if node.op_type == "Add":
            return self._residual_add(node)
        if node.op_type in WEIGHTED:
            self._entry(node, bias_add=None)
            return []
        raise _Stop(self._why(node, t, "produces"))

    def _consumer(self, node: onnx.NodeProto, t: str) -> list[str]:
        if node.op_type in PASS_THROUGH and list(node.input).count(t) == 1 and node.input[0] == t:
            self._pass_through(node)
            return [node.output[0]]
        if node.op_type == "Add":
            return self._residual_add(node)
        if node.op_type in WEIGHTED:
            self._exit(node, t)
            return []
        raise _Stop(self._why(node, t, "reads"))

    def _why(self, node: onnx.NodeProto, t: str, verb: str) -> str:
        known = _PRODUCES_WHY.get(node.op_type) if verb == "produces" else None
        why = known or _WHY.get(node.op_type) or (
            "it is not a channel-wise op that commutes with x -> x/k "
            "(Relu, LeakyRelu, PRelu, Identity, residual Add) nor a weighted op "
            "whose channels can be duplicated"
        )
        return f"{node.op_type} '{node.name}' {verb} '{t}': {why}"

    def _channel(self, node: onnx.NodeProto, axis_kind: str) -> None:
        """Fix (or check) the site's channel axis: ``"nchw"`` is axis 1, ``"last"`` rank-1."""
        assert self.rank is not None
        axis = 1 if axis_kind == "nchw" else self.rank - 1
        if self.axis is not None and axis != self.axis:
            raise _Stop(
                f"{node.op_type} '{node.name}' uses channel axis {axis}, the site uses "
                f"{self.axis}: duplicated channels would not line up"
            )
        self.axis = axis

    def _own(self, name: str, what: str) -> None:
        if self.counts.get(name, 0) > 1:
            raise _Stop(f"{what} '{name}' is shared with another node: it cannot be widened")

    def _pass_through(self, node: onnx.NodeProto) -> None:
        if node.op_type != "PRelu":
            return
        if node.input[1] not in self.inits:
            raise _Stop(f"PRelu '{node.name}' has a computed slope: it cannot follow a split")
        self.prelus.append(node)  # its slope axis is known once the site's axis is

    def _slope_edits(self, rank: int, axis: int) -> None:
        for node in self.prelus:
            slope = node.input[1]
            ax = self.inits[slope].ndim - (rank - axis)
            if ax >= 0 and self.inits[slope].shape[ax] != 1:
                self._own(slope, "PRelu slope")
                self.edits[slope] = Edit(slope, ax, False, "PRelu slope")

    def _residual_add(self, node: onnx.NodeProto) -> list[str]:
        a, b = node.input[0], node.input[1]
        if a in self.inits or b in self.inits:
            raise _Stop(
                f"Add '{node.name}' adds a constant: (x/k) + b is not (x + b)/k for a split "
                "channel (only a MatMul's bias Add, or a residual Add of two site tensors, works)"
            )
        sa, sb = self.shapes.get(a), self.shapes.get(b)
        if sa is None or sa != sb or None in sa:
            raise _Stop(
                f"Add '{node.name}': operand shapes {sa} and {sb} are not known to be equal "
                "(a broadcast Add would mix split and unsplit channels)"
            )
        return [a, b, node.output[0]]

    def bias_add(self, add: onnx.NodeProto) -> onnx.NodeProto | None:
        """The MatMul whose bias ``add`` is (single-consumer MatMul output + initializer)."""
        data = [i for i in add.input if i not in self.inits]
        if len(data) != 1 or len(add.input) != 2:
            return None
        mm = self.prod.get(data[0])
        if mm is None or mm.op_type != "MatMul" or mm.input[1] not in self.inits:
            return None
        if len(self.cons.get(data[0], [])) != 1 or data[0] in self.outputs:
            return None
        return mm

    def _weight(self, node: onnx.NodeProto, t: str | None) -> str:
        """The checked initializer weight of an entry (``t`` None) or of an exit reading ``t``."""
        what, w = f"{node.op_type} '{node.name}'", node.input[1] if len(node.input) > 1 else ""
        if t is not None and (list(node.input).count(t) != 1 or node.input[0] != t):
            raise _Stop(f"{what} reads '{t}' as its weight operand: no weight rows to duplicate")
        if w not in self.inits:
            raise _Stop(f"{what} has a computed weight (e.g. attention): nothing to duplicate")
        lay = _layout(node)
        if lay.group != 1:
            raise _Stop(f"{what} is grouped: its channels are tied to groups")
        if t is not None and lay.data_axis != -1 and not lay.is_conv:
            raise _Stop(f"{what} reads '{t}' transposed (transA=1)")
        if node.op_type == "MatMul" and self.inits[w].ndim != 2:
            raise _Stop(f"{what} has a {self.inits[w].ndim}-D weight (2-D needed)")
        self._channel(node, "nchw" if lay.is_conv else "last")
        self._own(w, "weight")
        return w

    def _entry(self, node: onnx.NodeProto, bias_add: onnx.NodeProto | None) -> None:
        w = self._weight(node, None)
        out_axis = _layout(node).out_axis % self.inits[w].ndim
        self.edits[w] = Edit(w, out_axis, True, "entry weight")
        bias = self._bias_of(node, bias_add)
        if bias:
            self._own(bias, "bias")
            ax = 0 if _layout(node).is_conv else max(self.inits[bias].ndim, 1) - 1
            self.edits[bias] = Edit(bias, ax, True, "entry bias")
        if bias_add is not None:
            self.internal.append(node.output[0])

    def _bias_of(self, node: onnx.NodeProto, bias_add: onnx.NodeProto | None) -> str | None:
        if bias_add is not None:
            return next(i for i in bias_add.input if i in self.inits)
        if node.op_type == "MatMul" or len(node.input) < 3 or not node.input[2]:
            return None
        if node.input[2] not in self.inits:
            raise _Stop(f"{node.op_type} '{node.name}' has a computed bias: it cannot be divided")
        return node.input[2]

    def _exit(self, node: onnx.NodeProto, t: str) -> None:
        w = self._weight(node, t)
        in_axis = _layout(node).in_axis % self.inits[w].ndim
        self.edits[w + "#in"] = Edit(w, in_axis, False, "exit weight")

    def _site(self) -> Site:
        assert self.axis is not None and self.rank is not None  # an entry or a stop was met
        self._slope_edits(self.rank, self.axis)
        widths = {self.shapes[t][self.axis] for t in self.tensors}
        widths |= {self.inits[e.init].shape[e.axis] for e in self.edits.values()
                   if e.role.endswith("weight")}
        width = next(iter(widths))
        if len(widths) != 1 or not isinstance(width, int):
            raise _Stop(f"channel counts {sorted(map(str, widths))} do not agree (or are symbolic)")
        for e in self.edits.values():
            a = self.inits[e.init]
            if not e.role.endswith("weight") and a.ndim and a.shape[e.axis] not in (1, width):
                raise _Stop(f"{e.role} '{e.init}' has shape {a.shape}: not per channel")
        return Site(
            tensors=tuple(sorted(self.tensors, key=lambda t: self.order.get(t, -1))),
            axis=self.axis,
            width=width,
            edits=tuple(self.edits.values()),
            internal=tuple(self.internal),
        )


def find_sites(model: Model) -> tuple[list[Site], list[tuple[str, str]]]:
    """Every legal site (seeded at each weighted op's output) and why the others are not."""
    walker, seen = _Walker(model), set()
    sites, skipped = [], []
    for node in model.graph.node:
        if node.op_type not in WEIGHTED or len(node.input) < 2 or node.input[1] not in walker.inits:
            continue
        out = node.output[0]
        cons = walker.cons.get(out, [])
        if node.op_type == "MatMul" and len(cons) == 1 and walker.bias_add(cons[0]) is node:
            out = cons[0].output[0]
        if out in seen:
            continue
        site, why, reached = walker.grow(out)
        seen |= reached
        if site is not None:
            sites.append(site)
        elif why not in {w for _, w in skipped}:  # one entry per blocker
            skipped.append((out, why or ""))
    return sites, skipped


def _absmax(value: np.ndarray, axis: int) -> np.ndarray:
    return np.abs(np.moveaxis(value, axis, 0)).reshape(value.shape[axis], -1).max(axis=1)


def channel_ranges(
    model: Model, sites: Sequence[Site], feeds: Sequence[Batch], stats: Stats | None
) -> dict[str, np.ndarray]:
    """Per-channel max |x| of every site tensor: from ``stats`` where it holds them along
    the site's axis, else from one tapped FP32 run over ``feeds``."""
    out: dict[str, np.ndarray] = {}
    missing: dict[str, int] = {}
    for site in sites:
        for t in site.tensors:
            ts = stats.tensors.get(t) if stats is not None else None
            usable = ts is not None and ts.channel_axis == site.axis
            if ts is not None and usable and ts.channel_absmax.size == site.width:
                out[t] = ts.channel_absmax.astype(np.float64)
            else:
                missing[t] = site.axis
    if missing:
        taps = list(missing)
        run = runner(make_session(tapped_model(model, taps)), taps)
        for batch in feeds:
            for t, value in zip(taps, run(batch), strict=True):
                a = _absmax(value.astype(np.float64), missing[t])
                out[t] = np.maximum(out[t], a) if t in out else a
    return out


def _normalised(site: Site, ranges: dict[str, np.ndarray]) -> np.ndarray:
    """Per channel, the worst ``a[c] / median(a)`` over the site's tensors."""
    worst = np.zeros(site.width)
    for t in site.tensors:
        a = ranges[t]
        positive = a[a > 0]
        if positive.size:
            worst = np.maximum(worst, a / float(np.median(positive)))
    return worst


def plan_copies(norm: np.ndarray, ratio: float, allowed: int) -> tuple[np.ndarray, str | None]:
    """Copies per channel (1 = unsplit), greedy on the widest channel, or why none."""
    k = np.ones(norm.size, dtype=np.int64)
    if norm.max(initial=0.0) < ratio:
        return k, (f"outlier ratio {norm.max(initial=0.0):.2f} (widest channel / median channel) "
                   f"is below {ratio:g}: nothing to gain")
    order, history = [], [float(norm.max())]
    while len(order) < allowed:
        c = int(np.argmax(norm / k))
        if norm[c] / k[c] < ratio:
            break
        k[c] += 1
        order.append(c)
        history.append(float((norm / k).max()))
    keep = next(i for i, h in enumerate(history) if h <= min(history) * (1 + 1e-9))
    k = np.ones(norm.size, dtype=np.int64)
    for c in order[:keep]:
        k[c] += 1
    if keep == 0:
        n = int((norm >= ratio).sum())
        return k, (f"{n} channels are above {ratio:g}x the median: a budget of {allowed} "
                   "extra channel(s) cannot lower the widest")
    return k, None


def _split_array(a: np.ndarray, axis: int, src: np.ndarray, scale: np.ndarray,
                 *, divide: bool, width: int) -> np.ndarray:
    dtype = a.dtype
    a = a.reshape(1) if a.ndim == 0 else a
    if a.shape[axis] != width:  # a bias broadcast along the channels: materialise it
        a = np.repeat(a, width, axis=axis)
    a = np.take(a.astype(np.float64), src, axis=axis)
    if divide:
        shape = [1] * a.ndim
        shape[axis] = -1
        a = a * scale.reshape(shape)
    return a.astype(dtype)


def _reinfer(proto: onnx.ModelProto, changed: set[str]) -> onnx.ModelProto:
    """Drop stale shapes of widened tensors and infer them again (checker-valid model)."""
    keep = [vi for vi in proto.graph.value_info if vi.name not in changed]
    del proto.graph.value_info[:]
    proto.graph.value_info.extend(keep)
    dims = {t.name: list(t.dims) for t in proto.graph.initializer if t.name in changed}
    for vi in proto.graph.input:  # initializers listed as inputs (old IR): new dims
        if vi.name in dims:
            vi.type.tensor_type.shape.ClearField("dim")
            for d in dims[vi.name]:
                vi.type.tensor_type.shape.dim.add().dim_value = d
    return shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)


def _split_site(site: Site, k: np.ndarray, arrays: dict[str, np.ndarray]) -> list[Change]:
    split = tuple(int(c) for c in np.flatnonzero(k > 1))
    src = np.concatenate([np.arange(site.width), np.repeat(split, k[list(split)] - 1)])
    scale = 1.0 / k[src].astype(np.float64)
    factors = tuple(float(k[c]) for c in split)
    changes = [
        Change(t, "split", site.axis, split, factors,
               note=f"width {site.width} -> {src.size}: copies appended, each x[c]/k")
        for t in site.tensors
    ]
    for e in site.edits:
        arrays[e.init] = _split_array(arrays[e.init], e.axis, src, scale,
                                      divide=e.divide, width=site.width)
        how = "copies divided by k" if e.divide else "copies not divided"
        changes.append(Change(e.init, "split", e.axis, split, factors, note=f"{e.role}: {how}"))
    return changes


def split_channels(
    model: Model | onnx.ModelProto,
    feeds: Sequence[Batch],
    *,
    stats: Stats | None = None,
    ratio: float = 4.0,
    budget: float = 0.05,
    min_extra: int = 2,
) -> Repair:
    """Split the outlier channels of every legal site; the FP32 function is checked unchanged."""
    start = time.perf_counter()
    m = as_model(model)
    sites, skipped = find_sites(m)
    ranges = channel_ranges(m, sites, feeds, stats) if sites else {}
    arrays = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    changes: list[Change] = []
    effect: list[tuple[str, float]] = []
    widened: set[str] = set()
    for site in sites:
        allowed = max(min_extra, int(budget * site.width))
        norm = _normalised(site, ranges)
        k, why = plan_copies(norm, ratio, allowed)
        if why:
            skipped.append((site.tensors[0], why))
            continue
        changes += _split_site(site, k, arrays)
        widened |= {*site.tensors, *site.internal, *(e.init for e in site.edits)}
        before = max(float(ranges[t].max()) for t in site.tensors)
        after = max(float((ranges[t] / k).max()) for t in site.tensors)
        name = site.tensors[0]
        effect += [(f"{name}:range_before", before), (f"{name}:range_after", after),
                   (f"{name}:ratio_before", float(norm.max())),
                   (f"{name}:ratio_after", float((norm / k).max())),
                   (f"{name}:extra_channels", float(k.sum() - k.size))]
    touched = {c.tensor for c in changes}
    proto = with_initializers(m.proto, {n: a for n, a in arrays.items() if n in touched})
    proto = _reinfer(proto, widened) if changes else proto
    diff = check_function(m.proto, proto, feeds, what="split_channels")
    n_split = sum(1 for k, _ in effect if k.endswith(":range_before"))
    return Repair(
        name="split_channels",
        reason=f"outlier channel splitting in {n_split} site(s): wide channels duplicated "
        "as equal parts, readers add them back",
        proto=proto,
        changes=tuple(changes),
        skipped=tuple(skipped),
        effect=(("fp32_rel_diff", diff), ("sites", float(n_split)), *effect),
        seconds=time.perf_counter() - start,
    )


def split_step(inp: RepairInput) -> RepairStep:
    """The registry's ``split``: :func:`split_channels` with the model's stats."""
    return step_of(split_channels(inp.model, inp.feeds, stats=inp.stats))
