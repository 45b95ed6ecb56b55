"""Ranking candidate plans with the fake-quant torch interpreter (on a GPU when there is one).

ONNX Runtime measures every reported figure; this engine only ranks (``--rank-engine``,
:mod:`.engine`). For one model + statistics + scheme it builds the torch graph ONCE, from
the QDQ graph the one writer makes for the plan that quantizes everything a plan can
(uniform a8_w8: every group output, every weight, every model input a group reads), and
per plan swaps only the quantizers:

==========================  ==========================================================
a tensor the plan quantizes  a grid step with the plan's encoding (``encode``: the same
                             scale, zero-point, bits and axis as ``build_qdq`` writes),
                             through :func:`.fakequant.fake_quant`, the finetune's grid
a tensor the plan keeps      the identity (the plan's QDQ graph has no Q/DQ there)
float
a weight the plan quantizes  the dequantized codes ``(quantize(W) - zp) * s`` in float32
                             (``numerics.dequantize``: ORT's DequantizeLinear), made once
                             per (weight, bits) and kept on the device
==========================  ==========================================================

Each plan's outputs come back as numpy (:class:`~quantscope.emulate.evaluate.Runs`), so
the task scorers and the fidelity metrics are the ones ``evaluate_plans`` uses
(:func:`score_runs`). A plan the superset graph cannot hold (a tensor it never quantizes)
is refused in one line rather than ranked on another graph.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from quantscope.analyze.measure import (
    class_axes,
    figure_parts,
    kept_parts,
    output_channel_axes,
    output_symbolic_axes,
    top_classes,
)
from quantscope.emulate.encode import encode
from quantscope.emulate.evaluate import Runs, compare_model, kept, run_model
from quantscope.emulate.qdq import build_qdq, scheme_for
from quantscope.finetune.fakequant import fake_quant, qlimits
from quantscope.finetune.graph import GraphModule, to_torch
from quantscope.model.groups import check_plan_names, find_groups
from quantscope.model.load import Model
from quantscope.numerics import dequantize, quantize
from quantscope.tasks.db_noise import WithParts
from quantscope.types import (
    Batch,
    Dataset,
    Encoding,
    Encodings,
    Groups,
    Outputs,
    Plan,
    Precision,
    QuantScheme,
    QuantscopeError,
    Stats,
    sample_first,
)

SUPERSET = Plan.uniform(Precision.A8_W8)  # quantizes every tensor any plan can quantize


class _Grid(nn.Module):
    """One activation's grid (a QuantizeLinear -> DequantizeLinear pair), no gradients."""

    def __init__(self, enc: Encoding, device: torch.device) -> None:
        super().__init__()
        self.scale = torch.tensor(np.asarray(enc.scale, np.float32), device=device)
        self.zp = torch.tensor(np.asarray(enc.zero_point, np.float32), device=device)
        self.axis = enc.axis if self.scale.dim() == 1 else None
        self.qmin, self.qmax = qlimits(enc.bits, enc.signed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale, zp = self.scale, self.zp
        if self.axis is not None:
            shape = [1] * x.dim()
            shape[self.axis % x.dim()] = -1
            scale, zp = scale.reshape(shape), zp.reshape(shape)
        return fake_quant(x, scale, zp, self.qmin, self.qmax)


class _Fixed(nn.Module):
    """A weight DequantizeLinear: the plan's dequantized weight, whatever it is given."""

    def __init__(self, value: torch.Tensor) -> None:
        super().__init__()
        self.value = value

    def forward(self, w: torch.Tensor) -> torch.Tensor:  # noqa: ARG002
        return self.value


class TorchRanker:
    """Each plan's outputs on ``batches`` by the torch interpreter (module docstring)."""

    def __init__(self, model: Model, stats: Stats, batches: Sequence[Batch], *,
                 scheme: QuantScheme, device: str = "cpu", method: str | None = None,
                 groups: Groups | None = None) -> None:
        self.model, self.stats, self.scheme, self.method = model, stats, scheme, method
        self.groups = groups or find_groups(model)
        self.device = torch.device(device)
        enc = encode(model, self.groups, stats, SUPERSET, scheme=scheme, method=method)
        floats = {n: model.initializer_array(n).astype(np.float32) for n in enc.weights}
        module: GraphModule = to_torch(build_qdq(model, enc), float_weights=floats,
                                       scheme=scheme)
        self.module = module.place(self.device).eval().requires_grad_(False)
        self.acts = {q.key: i for i, q in enumerate(module.act_quants)}
        self.weights = {q.name: i for i, q in enumerate(module.weight_quants)}
        self._weights: dict[tuple[Any, ...], torch.Tensor] = {}
        self.batches = list(batches)
        self.feeds = [{n: torch.from_numpy(np.ascontiguousarray(b[n])).to(self.device)
                       for n in module.input_names} for b in self.batches]

    def encodings(self, plan: Plan) -> Encodings:
        """The plan's encodings, exactly as ``quantize_model`` makes them."""
        check_plan_names(plan, self.groups)
        enc = encode(self.model, self.groups, self.stats, plan,
                     scheme=scheme_for(plan, self.scheme), method=self.method)
        extra = [t for t in (*enc.activations, *enc.weights)
                 if t not in self.acts and t not in self.weights]
        if extra:
            raise QuantscopeError(f"torch ranking: the plan quantizes {extra[0]}, which the "
                                  "ranking graph never quantizes: rank with --rank-engine ort")
        return enc

    def _weight(self, name: str, enc: Encoding) -> torch.Tensor:
        key = (name, enc.bits, enc.signed, enc.axis)
        if key not in self._weights:
            w = self.model.initializer_array(name).astype(np.float32)
            self._weights[key] = torch.from_numpy(dequantize(quantize(w, enc), enc)).to(self.device)
        return self._weights[key]

    def use(self, plan: Plan) -> None:
        """Swap the plan's quantizers into the graph (nothing else is rebuilt)."""
        enc = self.encodings(plan)
        m = self.module
        for key, i in self.acts.items():
            e = enc.activations.get(key)
            m.act_quants[i] = nn.Identity() if e is None else _Grid(e, self.device)
        for name, i in self.weights.items():
            e = enc.weights.get(name)
            m.weight_quants[i] = nn.Identity() if e is None else _Fixed(self._weight(name, e))

    def runs(self, plan: Plan) -> Runs:
        """The plan's outputs batch by batch (numpy, sample-first), as ``open_runs`` gives
        an ORT session's."""
        self.use(plan)

        def gen() -> Iterator[tuple[tuple[np.ndarray, ...], Batch]]:
            with torch.inference_mode():
                for feeds, batch in zip(self.feeds, self.batches, strict=True):
                    outs, _ = self.module(feeds)
                    arrays = [o.detach().cpu().numpy() for o in outs]
                    yield tuple(sample_first(arrays, batch)), batch

        return Runs(names=self.module.output_names, batches=gen())

    def outputs(self, plan: Plan) -> Outputs:
        """Every batch's outputs of ``plan`` (numpy)."""
        r = self.runs(plan)
        return Outputs(names=r.names, batches=tuple(out for out, _ in r.batches))


def score_runs(model: Model, data: Dataset, runs: Runs, ref: Outputs) -> dict[str, float]:
    """The metrics ``evaluate_plans`` reports for a plan (fidelity against ``ref``, the
    FP32 outputs on ``data.evaluation``, and the task's metrics), from ``runs``, with the
    per-sample powers of its dB figures beside them (``parts``, as ``evaluate_plans``'
    ``sample_parts``: the ranked figures have the noise the measured ones have)."""
    batches = list(data.evaluation)
    keep = getattr(data.task, "keep", None)
    judge = data.task is None or getattr(data.task, "row_local", False)
    fid, test = compare_model(runs, ref, keep=keep, only=data.output, judge=judge,
                              channel_axes=output_channel_axes(model, batches), per_sample=True,
                              top_classes=top_classes(data), class_axes=class_axes(data),
                              symbolic_axes=output_symbolic_axes(model, batches))
    metrics = dict(fid.values)
    ref_kept = kept(ref, batches, keep)
    if data.task is not None:
        metrics.update(data.task.metrics(ref_kept, test).values)
    return WithParts(metrics, kept_parts(figure_parts(data, fid, ref_kept, test), metrics))


class TorchMeasure:
    """``measure(model, stats, plan) -> metrics`` (``plan.joint.Measure``) ranked by torch
    against the ORIGINAL model's FP32 outputs (computed once, in ORT); the ranker of the
    original model is built once, a repaired model's (whose weights differ) once per
    model, the last one kept."""

    def __init__(self, model: Model, data: Dataset, *, scheme: QuantScheme | None,
                 device: str, method: str | None = None,
                 reference_outputs: Outputs | None = None) -> None:
        self.model, self.data, self.device, self.method = model, data, device, method
        self.scheme = scheme or QuantScheme()
        self.ref = reference_outputs or run_model(model.proto, list(data.evaluation))
        self._rankers: dict[int, tuple[Model, Stats, TorchRanker]] = {}
        self.plans = 0

    def ranker(self, model: Model, stats: Stats) -> TorchRanker:
        key = id(model)
        held = self._rankers.get(key)
        if held is None or held[0] is not model or held[1] is not stats:
            if model is not self.model:  # a repaired model: keep the original's and this
                self._rankers = {k: v for k, v in self._rankers.items() if v[0] is self.model}
            held = (model, stats, TorchRanker(model, stats, list(self.data.evaluation),
                                              scheme=self.scheme, device=self.device,
                                              method=self.method))
            self._rankers[key] = held
        return held[2]

    def __call__(self, model: Model, stats: Stats, plan: Plan) -> Mapping[str, float]:
        self.plans += 1
        runs = self.ranker(model, stats).runs(plan)
        return score_runs(model, self.data, runs, self.ref)
