"""The fine-tune as a stage: plan -> student -> distil -> fine-tuned FP32 model + plan.

==========================  ===========================================================
``finetune``                builds the plan's QDQ graph with the one composition
                            (``quantize_model``), converts it to the student and the FP32
                            graph to the teacher, distils; returns a FinetuneResult
``finetuned_model``         a COPY of the FP32 ModelProto with every trained weight
                            written back by initializer name (same graph, same dtypes
                            and shapes); the input model is not touched
``finetuned_plan``          the plan with the learned activation ranges as ``pinned``
                            ranges (``encode`` uses them as they are; ``.alls`` exports
                            them as ``force_range_out``) and a provenance note
==========================  ===========================================================
Measure the pair with ``stages.evaluate_plans(finetuned, data, stats, {..: plan},
reference=original)``: the QDQ writer rebuilds the graph (weight scales from the new
weights, activation grids from the pinned ranges) and ONNX Runtime runs it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from quantscope.emulate.qdq import quantize_model, scheme_for
from quantscope.finetune.distill import FinetuneConfig, FinetuneResult, distill
from quantscope.finetune.graph import to_torch
from quantscope.finetune.objectives import Batch, Objective
from quantscope.model.load import Model
from quantscope.progress import say
from quantscope.types import Plan, QuantScheme, QuantscopeError, Stats


def fp32_weights(model: Model) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def finetune(model: Model, stats: Stats, plan: Plan, objective: Objective,
             train: Sequence[Batch], holdout: Sequence[Batch], config: FinetuneConfig, *,
             scheme: QuantScheme | None = None, checkpoint: str | Path | None = None,
             progress: bool = False) -> FinetuneResult:
    """Quantization-aware distillation of ``model`` under ``plan`` (see module docstring)."""
    q = quantize_model(model, stats, plan, scheme=scheme_for(plan, scheme))
    student = to_torch(q.proto, float_weights=fp32_weights(model), scheme=q.encodings.scheme)
    teacher = to_torch(model.proto)
    return distill(student, teacher, objective, train, holdout, config,
                   checkpoint=checkpoint, progress=progress)


def finetuned_model(model: Model, result: FinetuneResult) -> Model:
    """A copy of the FP32 model with the trained weights written back by name."""
    proto = onnx.ModelProto()
    proto.CopyFrom(model.proto)
    todo = dict(result.weights)
    for i, init in enumerate(proto.graph.initializer):
        if init.name not in todo:
            continue
        old = numpy_helper.to_array(init)
        new = np.asarray(todo.pop(init.name))
        if new.shape != old.shape:
            raise QuantscopeError(f"finetune: weight '{init.name}' has shape {new.shape}, the "
                                  f"model's is {old.shape}")
        proto.graph.initializer[i].CopyFrom(numpy_helper.from_array(new.astype(old.dtype),
                                                                    init.name))
    if todo:
        raise QuantscopeError(f"finetune: {len(todo)} trained weight(s) not in the model "
                              f"(e.g. '{next(iter(todo))}'): it was trained on another model")
    return Model(proto=proto, source=f"{model.source} (finetuned)")


def finetuned_plan(plan: Plan, result: FinetuneResult) -> Plan:
    """``plan`` with the learned ranges pinned and a note of what the fine-tune did."""
    pinned = dict(plan.pinned) | {t: (float(lo), float(hi)) for t, (lo, hi) in result.ranges.items()}
    meta = (*[(k, v) for k, v in plan.meta if k != "finetune"], ("finetune", result.summary()))
    return dataclasses.replace(plan, pinned=tuple(sorted(pinned.items())), meta=meta)


def split_holdout(batches: Sequence[Batch], fraction: float = 0.1) -> tuple[list[Batch],
                                                                           list[Batch]]:
    """Every k-th batch held out (batches are often sorted by length: spread the lengths)."""
    batches = list(batches)
    if len(batches) < 2:
        raise QuantscopeError("finetune: needs at least 2 calibration batches (one is held out)")
    k = max(2, round(1 / max(fraction, 1e-6)))
    held = set(range(k // 2, len(batches), k)) or {len(batches) - 1}
    return ([b for i, b in enumerate(batches) if i not in held],
            [b for i, b in enumerate(batches) if i in held])


# training memory over the float activations of one forward pass (every node output): the
# saved tensors of the backward pass, the fake-quant steps' and the gradients. Measured on
# dinov2-s14 (CPU, 2026-11-28): 15.9 GB peak RSS training on batches of 12 images, whose
# activations are 3.79 GB; the run was killed for memory beside another run
TRAIN_FACTOR = 4.2
MEMORY_SHARE = 0.5  # of the memory available when the fine-tune starts


def bounded_batches(model: Model, batches: Sequence[Batch], budget: int | None
                    ) -> tuple[list[Batch], str | None]:
    """``batches`` with each split along its rows into pieces whose estimated training
    memory (:data:`TRAIN_FACTOR` x the float activations of their forward pass) fits in
    ``budget`` bytes (None: unbounded), and the line that says so (None: none split). A
    batch whose arrays do not share their first dim (the samples on another axis) is kept
    whole."""
    from quantscope.analyze.memory import tensor_sizer

    batches = list(batches)

    def rows(b: Batch) -> int | None:
        firsts = {int(v.shape[0]) for v in b.values() if getattr(v, "ndim", 0) >= 1}
        return firsts.pop() if len(firsts) == 1 else None

    if budget is None or not batches:
        return batches, None
    largest = max(batches, key=lambda b: sum(int(np.prod(v.shape)) for v in b.values()
                                             if hasattr(v, "shape")))
    n = rows(largest)
    if not n:
        return batches, None
    outs = [o for node in model.graph.node for o in node.output if o]
    per_row = TRAIN_FACTOR * tensor_sizer(model, [largest])(outs) / n
    most = max(1, int(budget // max(per_row, 1.0)))
    if most >= n:
        return batches, None
    out: list[Batch] = []
    for b in batches:
        r = rows(b)
        if r is None or r <= most:
            out.append(b)
            continue
        out += [{k: v[i:i + most] if getattr(v, "ndim", 0) >= 1 else v for k, v in b.items()}
                for i in range(0, r, most)]
    return out, (f"finetune: batches of up to {n} rows split into {len(out)} of at most "
                 f"{most} rows: about {per_row * most / 2**30:.1f} GB of training memory each "
                 f"({TRAIN_FACTOR:g} x the forward pass's activations, estimated), within "
                 f"{budget / 2**30:.1f} GB ({MEMORY_SHARE:.0%} of the memory available)")


def memory_budget(device: str | None) -> int | None:
    """:data:`MEMORY_SHARE` of the memory available to a fine-tune on ``device`` (the
    host's for the CPU, the GPU's free memory for CUDA); None where unknown."""
    from quantscope.analyze.memory import available_bytes
    from quantscope.finetune.distill import resolve_device

    dev = resolve_device(device)
    if dev.type == "cuda":
        import torch

        free = int(torch.cuda.mem_get_info(dev)[0])
    else:
        free = available_bytes()
    return None if free is None else int(free * MEMORY_SHARE)


def finetune_repair(model: Model, data: object, stats: Stats, plan: Plan, *,
                    config: FinetuneConfig | None = None, scheme: QuantScheme | None = None,
                    checkpoint: str | Path | None = None, progress: bool = False,
                    ) -> tuple[Model, Plan, FinetuneResult]:
    """The repair form: fine-tune on ``data``'s calibration batches (10 % held out), each
    split into as many rows as the memory allows (:func:`bounded_batches`).

    Returns the fine-tuned FP32 model, the plan with the learned ranges pinned, and the
    record. ``data`` is a ``stages.Dataset``; its task picks the objective.
    """
    from quantscope.finetune.objectives import objective_for

    objective, mask = objective_for(model, getattr(data, "task", None))
    config = dataclasses.replace(config or FinetuneConfig(), mask_input=mask)
    batches, said = bounded_batches(model, list(data.calibration_batches()),  # type: ignore[attr-defined]
                                    memory_budget(config.device))
    say(said or "", show=progress and bool(said))
    train, hold = split_holdout(batches)
    result = finetune(model, stats, plan, objective, train, hold, config, scheme=scheme,
                      checkpoint=checkpoint, progress=progress)
    return finetuned_model(model, result), finetuned_plan(plan, result), result
