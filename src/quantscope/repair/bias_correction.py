"""Empirical bias correction (Nagel et al. 2019, sec. 4.2) from calibration data.

Weight rounding is not zero-mean per output channel when inputs are not zero-mean
(e.g. after a ReLU): ``E[W_q x] - E[W x] = (W_q - W) E[x]`` shifts every output of that
channel by the same amount, and the shift accumulates through the network. The
correction subtracts it from the bias.

=================  =================================================================
``E[x]``           per input channel, measured on the *emulated* model (the input the
                   layer really sees on the target), over every position of the batch
``W_q``            the weight as the plan's encoding quantizes it (per channel or not)
Conv /             ``shift[o] = sum_i E[x_i] * sum_k (W_q - W)[i -> o, k]`` (exact away
ConvTranspose      from zero padding and, for a strided ConvTranspose, on average over
                   the output positions); grouped and depthwise convolutions through
                   their block-diagonal ``[in, out]`` map. Each op's weight layout
                   (Conv ``[out, in/g, k…]``, ConvTranspose ``[in, out/g, k…]``, Gemm
                   ``transB``) comes from :mod:`quantscope.model.layouts`
MatMul / Gemm      ``shift = E[x] @ (W_q - W)`` (a MatMul with an N-D weight is skipped)
no bias            one is created: ``Conv``/``ConvTranspose``/``Gemm`` get an input,
                   ``MatMul`` gets an ``Add`` after it (its output keeps the MatMul's
                   output name)
``mode="output"``  instead: the measured mean shift of each op's output (upstream error
                   included), layer by layer in graph order, re-emulating after each
=================  =================================================================
The FP32 function changes on purpose (by the measured shift); the record lists it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantscope.calibrate.collect import calibrate
from quantscope.emulate.qdq import quantize_model, scheme_for
from quantscope.emulate.session import make_session, runner
from quantscope.model.groups import find_groups
from quantscope.model.layouts import WeightLayout, in_out_matrix, layout_of
from quantscope.model.load import Model
from quantscope.numerics import fake_quant
from quantscope.repair import (
    Change,
    Repair,
    RepairInput,
    RepairStep,
    as_model,
    step_of,
    use_counts,
)
from quantscope.repair.verify import Batch
from quantscope.types import Encodings, Plan, QuantScheme, QuantscopeError, Stats


def _channel_means(
    proto: onnx.ModelProto, taps: list[str], feeds: Sequence[Batch], axes: list[int]
) -> list[np.ndarray]:
    """Mean of each tapped tensor over every axis but its channel axis, over all batches."""
    return _channel_stats(proto, taps, feeds, axes)[0]


def _channel_stats(
    proto: onnx.ModelProto, taps: list[str], feeds: Sequence[Batch], axes: list[int]
) -> tuple[list[np.ndarray], list[int]]:
    """(means as in :func:`_channel_means`, how many positions each mean is over).

    One batch at a time, folded into the sums before the next runs: every tapped tensor of
    every feed held at once (``run_all``) took mobilefacenet's plan stage on the faces to
    4.7 GB (8 repair batches, 65 taps each) against 1.2 GB for the rest of its search."""
    run = runner(make_session(tapped_model_from(proto, taps)))
    n = len(proto.graph.output)
    sums = [0.0] * len(taps)
    counts = [0] * len(taps)
    for feed in feeds:
        out = run(feed)
        for k, (x, ax) in enumerate(zip(out[n:], axes, strict=True)):
            x = np.moveaxis(x.astype(np.float64), ax, -1).reshape(-1, x.shape[ax])
            sums[k] = sums[k] + x.sum(axis=0)
            counts[k] += x.shape[0]
        del out
    # a tensor no batch reached (a tokensplit chunk past every calibration text's length)
    # has no measured mean: 0, so its layer gets no shift instead of a NaN bias
    return [s / c if c else np.zeros_like(np.asarray(s, np.float64))
            for s, c in zip(sums, counts, strict=True)], counts


def tapped_model_from(proto: onnx.ModelProto, taps: list[str]) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    del out.graph.output[len(proto.graph.output) :]
    out.graph.output.extend(onnx.ValueInfoProto(name=t) for t in taps)
    return out


def _weight_shift(
    model: Model, node: onnx.NodeProto, w_q: np.ndarray, mean_x: np.ndarray
) -> np.ndarray:
    w = model.initializer_array(node.input[1]).astype(np.float64)
    return mean_x @ in_out_matrix(w_q.astype(np.float64) - w, _layout(node))


def _set_bias(
    out: onnx.ModelProto, node_name: str, bias: str | None, new: np.ndarray
) -> tuple[str, str]:
    """Set the bias of ``node_name`` in ``out`` to ``new`` (creating it), in place: ``out``
    is the repair's own copy, made once for all layers (a copy per layer was 126 copies of
    minilm-l3 in a run, 5 s); returns (bias name, kind).

    A bias or weight shared with another node (a ``tokensplit`` model's chunk copies of one
    Linear) gets a copy of its own, named after the node: each chunk's shift is its own.
    """
    uses = use_counts(out.graph)
    if bias is not None and uses.get(bias, 0) <= 1:
        at = next(i for i, t in enumerate(out.graph.initializer) if t.name == bias)
        dtype = helper.tensor_dtype_to_np_dtype(out.graph.initializer[at].data_type)
        out.graph.initializer[at].CopyFrom(numpy_helper.from_array(new.astype(dtype), bias))
        return bias, "shift"
    node = next(n for n in out.graph.node if n.name == node_name)
    if bias is not None:  # shared: this node's bias Add reads a private copy
        own = f"{bias}/{node_name}"
        add = node if bias in node.input else next(
            n for n in out.graph.node if bias in n.input and node.output[0] in n.input)
        add.input[:] = [own if t == bias else t for t in add.input]
        out.graph.initializer.append(numpy_helper.from_array(new.astype(np.float32), own))
        return own, "new"
    name = f"{node.input[1]}_bias"
    if uses.get(node.input[1], 0) > 1 or any(t.name == name for t in out.graph.initializer):
        name = f"{node_name}/bias"
    out.graph.initializer.append(numpy_helper.from_array(new.astype(np.float32), name))
    lay = _layout(node)
    if lay.bias_index is not None:
        if len(node.input) > lay.bias_index:
            node.input[lay.bias_index] = name
        else:
            node.input.append(name)
        return name, "new"
    y = node.output[0]
    node.output[0] = f"{y}_prebias"
    nodes = list(out.graph.node)
    at = next(i for i, n in enumerate(nodes) if n.name == node_name)
    nodes.insert(
        at + 1,
        helper.make_node("Add", [f"{y}_prebias", name], [y], name=f"{node_name}/bias_correction"),
    )
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return name, "new"


def _targets(model: Model, enc: Encodings) -> list[tuple[onnx.NodeProto, str | None]]:
    nodes = {n.name: n for n in model.graph.node}
    out = []
    for g in find_groups(model).groups:
        node = nodes[g.nodes[0]]
        lay = layout_of(node)
        if g.weight not in enc.weights or lay is None:
            continue
        if not lay.is_conv and model.initializer_array(g.weight).ndim != 2:
            continue  # a batched MatMul weight: no single [in, out] map
        out.append((node, g.bias))
    return out


def _emulate(
    model: Model, stats: Stats, plan: Plan, scheme: QuantScheme | None
) -> tuple[onnx.ModelProto, Encodings]:
    q = quantize_model(model, stats, plan, scheme=scheme_for(plan, scheme))
    return q.proto, q.encodings


def _layout(node: onnx.NodeProto) -> WeightLayout:
    lay = layout_of(node)
    assert lay is not None, f"{node.op_type} '{node.name}' is not a weighted op"
    return lay


def _axis(node: onnx.NodeProto) -> int:
    """Channel axis of the op's data input."""
    return _layout(node).data_axis


def _out_axis(node: onnx.NodeProto) -> int:
    """Channel axis of the op's output."""
    return _layout(node).output_axis


def _shifts_weight_mode(
    m: Model, stats: Stats, plan: Plan, scheme: QuantScheme | None, feeds: Sequence[Batch]
) -> list[tuple[onnx.NodeProto, str | None, np.ndarray]]:
    qdq, enc = _emulate(m, stats, plan, scheme)
    targets = _targets(m, enc)
    # a ConvTranspose spreads each input position over its kernel's output positions: the
    # mean shift of an output channel is the kernel-summed shift times (input positions /
    # output positions), so its output is tapped too, for the count
    spread = [n for n, _ in targets if n.op_type == "ConvTranspose"]
    q_nodes = {n.name: n for n in qdq.graph.node}
    out_taps = [q_nodes[n.name].output[0] if n.name in q_nodes else n.output[0] for n in spread]
    means, counts = _channel_stats(
        qdq, [n.input[0] for n, _ in targets] + out_taps, feeds,
        [_axis(n) for n, _ in targets] + [_out_axis(n) for n in spread],
    )
    for k, node in enumerate(spread):
        i = next(i for i, (n, _) in enumerate(targets) if n.name == node.name)
        out_count = counts[len(targets) + k]
        means[i] = means[i] * (counts[i] / out_count if out_count else 0.0)
    means = means[: len(targets)]
    return [
        (
            n,
            b,
            _weight_shift(
                m,
                n,
                fake_quant(
                    m.initializer_array(n.input[1]).astype(np.float32), enc.weights[n.input[1]]
                ),
                mx,
            ),
        )
        for (n, b), mx in zip(targets, means, strict=True)
    ]


def correct_biases(
    model: Model | onnx.ModelProto,
    feeds: Sequence[Batch],
    plan: Plan,
    *,
    stats: Stats | None = None,
    scheme: QuantScheme | None = None,
    mode: str = "weight",
) -> Repair:
    """Subtract the measured per-channel output shift from each quantized weighted op's bias."""
    if mode not in ("weight", "output"):
        raise QuantscopeError(f"unknown bias-correction mode '{mode}': use 'weight' or 'output'")
    start = time.perf_counter()
    m = as_model(model)
    stats = stats or calibrate(m, find_groups(m), feeds)
    if mode == "weight":
        shifts = _shifts_weight_mode(m, stats, plan, scheme, feeds)
        proto, changes = _apply_shifts(m, shifts)
    else:
        proto, changes = _output_mode(m, stats, plan, scheme, feeds)
    worst = max((max(abs(f) for f in c.factors) for c in changes if c.factors), default=0.0)
    return Repair(
        name="correct_biases",
        reason=f"empirical bias correction ({mode} mode) of {len(changes)} weighted op(s)",
        proto=proto,
        changes=tuple(changes),
        effect=(("layers", float(len(changes))), ("max_abs_shift", worst)),
        seconds=time.perf_counter() - start,
    )


def _apply_shifts(
    m: Model, shifts: list[tuple[onnx.NodeProto, str | None, np.ndarray]]
) -> tuple[onnx.ModelProto, list[Change]]:
    proto, changes = onnx.ModelProto(), []
    proto.CopyFrom(m.proto)  # the repair's own copy: each layer's bias set in it
    for node, bias, shift in shifts:
        old = m.initializer_array(bias).astype(np.float64) if bias else np.zeros(shift.shape)
        name, kind = _set_bias(proto, node.name, bias, (old - shift).astype(np.float32))
        changes.append(
            Change(
                name, kind, 0, tuple(range(shift.size)), tuple(map(float, -shift)), note=node.name
            )
        )
    return proto, changes


def _output_mode(
    m: Model, stats: Stats, plan: Plan, scheme: QuantScheme | None, feeds: Sequence[Batch]
) -> tuple[onnx.ModelProto, list[Change]]:
    """Layer by layer: the emulated output's mean minus FP32's, re-emulating after each fix."""
    current, changes = m, []
    _, enc = _emulate(m, stats, plan, scheme)
    for node, bias in _targets(m, enc):
        qdq, _ = _emulate(current, stats, plan, scheme)
        live = next(n for n in current.graph.node if n.name == node.name)
        tap = live.output[0]
        q_name = (
            f"{tap}_float"
            if tap in {o for n in qdq.graph.node for o in n.output if o == f"{tap}_float"}
            else tap
        )
        fp = _channel_means(m.proto, [node.output[0]], feeds, [_out_axis(node)])[0]
        q = _channel_means(qdq, [q_name], feeds, [_out_axis(node)])[0]
        proto, more = _apply_shifts(current, [(live, bias, q - fp)])
        current = as_model(proto)
        changes += more
    return current.proto, changes


def bias_step(inp: RepairInput) -> RepairStep:
    """The registry's ``bias``: :func:`correct_biases` for the plan's quantized weights."""
    return step_of(correct_biases(inp.model, inp.feeds, inp.plan, stats=inp.stats,
                                  scheme=inp.scheme))
