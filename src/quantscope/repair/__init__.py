"""Repairs: transforms that make a model quantize better, each returning a :class:`Repair`.

==================  ========================================  ====================
transform           what it changes                           FP32 function
==================  ========================================  ====================
smooth_outliers   LayerNorm gamma/beta (or a producer's     preserved (checked)
                    weight columns) / s, consumer rows * s
equalize_pairs      Conv/linear pairs across a ReLU-like op   preserved (checked)
split_channels      outlier channels of an activation site    preserved (checked)
                    (residual Adds too) duplicated as x/k:
                    layers get wider, tensor shapes change
rank4_linears       Linear + bias groups on 3-D tensors run   preserved (checked)
                    on 4-D ones (Unsqueeze/Squeeze; QNN
                    HTP v73 q::linearclip; unverified on a
                    device)
correct_biases      biases of weighted ops (bias -= E[err])   changed on purpose
choose_range_method per-tensor range method (no graph edit)   unchanged
adaround            weights moved onto their integer grid     changed on purpose
gptq                4/8-bit Linear weights rounded onto their changed on purpose
                    grid with GPTQ's error feedback (H from
                    the calibration inputs)
==================  ========================================  ====================

Every transform is a plain function returning a frozen :class:`Repair`: the new FP32
``ModelProto`` (tensor and node names kept; only initializer values change unless a
record says otherwise -- ``split_channels`` also widens tensors and initializers) plus
what changed, why, and the measured effect, so that a plan can record it and an
exporter can ship the transformed FP32 model to a vendor compiler.

The command and the planner do not call these functions directly: each module also has
a ``*_step(RepairInput) -> RepairStep`` function (the one signature of every repair), and
:mod:`quantscope.repair.registry` maps the CLI names to those steps. Adding a repair is
one module with such a step plus one entry in ``REGISTRY`` there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from quantscope.model.load import Model, load_proto
from quantscope.model.weightless import append_copies
from quantscope.types import Plan, QuantScheme, QuantscopeError, Stats


class RepairError(QuantscopeError):
    """A repair broke an invariant (e.g. changed the FP32 function): it is not applied."""


@dataclass(frozen=True)
class Change:
    """One edited tensor: which channels along ``axis`` were scaled or shifted, by what."""

    tensor: str
    kind: str  # "divide" | "multiply" | "shift" | "regrid" | "new" | "insert" | "split"
    axis: int | None = None
    channels: tuple[int, ...] = ()
    factors: tuple[float, ...] = ()
    note: str = ""


@dataclass(frozen=True, eq=False)
class Repair:
    """Result of one transform: the new FP32 model and a record of what was done."""

    name: str
    reason: str
    proto: onnx.ModelProto
    changes: tuple[Change, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()  # (node or tensor, why it was left alone)
    effect: tuple[tuple[str, float], ...] = ()  # measured numbers, e.g. fp32_rel_diff
    seconds: float = 0.0

    def model(self) -> Model:
        return load_proto(self.proto, f"<{self.name}>")

    def effect_dict(self) -> dict[str, float]:
        return dict(self.effect)


@dataclass(frozen=True, eq=False)
class RepairInput:
    """What every registered repair gets: the model so far, its stats, the plan, the feeds."""

    model: Model  # the model after the repairs run before this one
    stats: Stats  # calibrated on ``model``
    plan: Plan  # the plan after the repairs run before this one
    feeds: Sequence[dict[str, np.ndarray]]  # calibration batches
    scheme: QuantScheme | None = None  # the target's quantization scheme
    proxy: str = "local"  # range choice: "local" (histogram) or "output" error
    task: object | None = None  # the data's task (finetune distils what it scores)


@dataclass(frozen=True, eq=False)
class RepairStep:
    """What every registered repair returns; the runner records it and applies it."""

    reason: str
    changed: tuple[str, ...] = ()  # edited tensors (empty: the repair found no site)
    proto: onnx.ModelProto | None = None  # the edited FP32 model; None: graph untouched
    plan: Plan | None = None  # the edited plan; None: plan untouched
    notes: tuple[str, ...] = ()  # "site: why it was left alone"
    effect: tuple[tuple[str, float], ...] = ()  # measured numbers


def step_of(r: Repair) -> RepairStep:
    """The :class:`RepairStep` of a graph transform's :class:`Repair`."""
    return RepairStep(
        reason=r.reason,
        changed=tuple(c.tensor for c in r.changes),
        proto=r.proto if r.changes else None,
        notes=tuple(f"{a}: {b}" for a, b in r.skipped),
        effect=tuple((k, float(v)) for k, v in r.effect),
    )


def as_model(model: Model | onnx.ModelProto) -> Model:
    return model if isinstance(model, Model) else load_proto(model)


def consumers_of(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    out: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for t in node.input:
            if t:
                out.setdefault(t, []).append(node)
    return out


def use_counts(graph: onnx.GraphProto) -> dict[str, int]:
    """How many node inputs read each tensor (an initializer read twice cannot be scaled)."""
    counts: dict[str, int] = {}
    for node in graph.node:
        for t in node.input:
            counts[t] = counts.get(t, 0) + 1
    return counts


def with_initializers(proto: onnx.ModelProto, arrays: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of ``proto`` with the named initializers replaced (or added), dtypes kept."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    done = set()
    for i, t in enumerate(out.graph.initializer):
        if t.name in arrays:
            old = numpy_helper.to_array(t)
            out.graph.initializer[i].CopyFrom(
                numpy_helper.from_array(arrays[t.name].astype(old.dtype), t.name)
            )
            done.add(t.name)
    for name, value in arrays.items():
        if name not in done:
            out.graph.initializer.append(numpy_helper.from_array(value, name))
    return out


def rewritten(proto: onnx.ModelProto, nodes: Sequence[onnx.NodeProto],
              initializers: Sequence[onnx.TensorProto], note: tuple[str, str]) -> onnx.ModelProto:
    """A copy of ``proto`` with ``nodes`` as its graph, ``initializers`` added, value infos
    dropped (the loader infers them again) and the metadata property ``note`` = (key,
    value) set: the common tail of the graph rewrites (tokensplit, headsplit, outscale, peel)."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    append_copies(out.graph.initializer, initializers)
    del out.graph.value_info[:]
    props = {p.key: p.value for p in out.metadata_props}
    props[note[0]] = note[1]
    onnx.helper.set_model_props(out, props)
    return out


def spliced(nodes: Sequence[onnx.NodeProto], before: dict[str, list[onnx.NodeProto]],
            after: dict[str, list[onnx.NodeProto]],
            rewire: dict[str, tuple[list[str], list[str]]]) -> list[onnx.NodeProto]:
    """``nodes`` in order, with ``before[name]`` put before and ``after[name]`` after each
    node of that name, and ``rewire[name] = (inputs, outputs)`` set on it (the graph
    rewrites' node edits; the nodes are edited in place)."""
    order: list[onnx.NodeProto] = []
    for n in nodes:
        order += before.get(n.name, [])
        if n.name in rewire:
            n.input[:], n.output[:] = rewire[n.name]
        order.append(n)
        order += after.get(n.name, [])
    return order


def attr(node: onnx.NodeProto, name: str, default: object) -> object:
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


__all__ = [
    "Change",
    "Repair",
    "RepairError",
    "RepairInput",
    "RepairStep",
    "as_model",
    "attr",
    "consumers_of",
    "step_of",
    "use_counts",
    "with_initializers",
]
