"""Nodes that mix the samples of one run: a sample's output depends on the others'.

A spectrogram front-end normalised to its loudest value (openWakeWord's
``melspectrogram.onnx``: ``ReduceMax`` over every axis, then ``Clip(x, max - 80)``)
reduces over the sample axis too. Run on a batch of clips, every clip is clipped at the
loudest clip's level, which no deployment (one clip per run) computes: the FP32 reference
and every figure would be those of another function. Such a model runs one sample per run
(:func:`sample_mixers` names why; ``tasks.tensors.find_layout`` sets the limit).

==========================  =========================================================
node                        mixes the samples when
==========================  =========================================================
``Reduce*`` (Max, Min,      no axes are given (every axis, unless
Mean, Sum, Prod, L1, L2,    ``noop_with_empty_axes``), or an axis given is the batch
LogSum, LogSumExp,          dimension of its input (the symbol the inputs' sample axis
SumSquare)                  has); its input a float tensor on the data path (it
                            depends on an input; an int64 shape is no data)
==========================  =========================================================
"""

from __future__ import annotations

import onnx
from onnx import numpy_helper

from quantscope.model.load import FLOAT_TYPES, Model

REDUCE_OPS = frozenset({"ReduceMax", "ReduceMin", "ReduceMean", "ReduceSum", "ReduceProd",
                        "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
                        "ReduceSumSquare"})


def _attr(node: onnx.NodeProto, name: str) -> onnx.AttributeProto | None:
    return next((a for a in node.attribute if a.name == name), None)


def _reduce_axes(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> list[int] | None:
    """The axes a Reduce node reduces (``[]``: every axis); None when they are computed."""
    a = _attr(node, "axes")
    if a is not None:
        return list(a.ints)
    if len(node.input) > 1 and node.input[1]:
        t = inits.get(node.input[1])
        return None if t is None else [int(v) for v in numpy_helper.to_array(t).ravel()]
    noop = _attr(node, "noop_with_empty_axes")
    return None if noop is not None and noop.i else []


def _data_path(model: Model, sampled: tuple[str, ...]) -> set[str]:
    reach = set(sampled)
    for node in model.graph.node:
        if any(i in reach for i in node.input if i):
            reach.update(o for o in node.output if o)
    return reach


def sample_mixers(model: Model, sampled: tuple[str, ...], symbol: str | None) -> list[str]:
    """Each node that mixes the samples of a run, as ``"ReduceMax 'name' (over every
    axis)"``; ``sampled``: the inputs that carry samples, ``symbol``: their batch dim's
    name (None: only reductions over every axis are found)."""
    inits = model.initializers()
    shapes = model.value_shapes()
    types = model.value_types()
    reach = _data_path(model, sampled)
    found: list[str] = []
    for node in model.graph.node:
        if node.op_type not in REDUCE_OPS or not node.input or node.input[0] not in reach:
            continue
        if types.get(node.input[0]) not in FLOAT_TYPES:
            continue  # a shape's product (ReduceProd of Shape(x) in a torch flatten): no data
        axes = _reduce_axes(node, inits)
        src = shapes.get(node.input[0])
        label = f"{node.op_type} '{node.name or node.output[0]}'"
        if axes == [] and (src is None or len(src) > 0):
            found.append(f"{label} (over every axis, the samples' too)")
        elif axes and symbol is not None and src:
            hit = [a % len(src) for a in axes if src[a % len(src)] == symbol]
            if hit:
                found.append(f"{label} (over axis {hit[0]}, the samples' '{symbol}')")
    return found
