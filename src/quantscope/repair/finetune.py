"""``finetune`` as a repair: quantization-aware distillation of the plan's QDQ graph.

The engine is :mod:`quantscope.finetune` (PyTorch as the optimiser only, the ``finetune``
extra); this module is the registry's adapter. It trains on the calibration feeds (every
tenth batch held out for early stopping), with the task's objective (pooled, normalised
embeddings for sentence encoders; every output otherwise), writes the trained weights back
into the FP32 model by initializer name, and pins the learned activation ranges in the
plan. It changes the FP32 function on purpose: the runner records the drift, and every
figure is re-measured in ONNX Runtime through the QDQ writer.

``FINETUNE_STEPS``/``FINETUNE_MINUTES`` are the default budget: 300 steps or 15 minutes,
whichever comes first (on 2 quiet CPU cores minilm-l6 does a step in about 0.7 s: 300
steps in about 4 minutes).
"""

from __future__ import annotations

from quantscope.repair import RepairError, RepairInput, RepairStep

FINETUNE_STEPS = 300
FINETUNE_MINUTES = 15.0


def finetune_step(inp: RepairInput) -> RepairStep:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise RepairError("finetune needs PyTorch: pip install 'quantscope[finetune]'") from None
    from quantscope.finetune.apply import finetune_repair
    from quantscope.finetune.distill import FinetuneConfig
    from quantscope.types import Dataset

    if len(inp.feeds) < 2:
        raise RepairError("finetune needs at least 2 calibration batches (one is held out)")
    config = FinetuneConfig(steps=FINETUNE_STEPS, eval_every=20, range_lr=2e-2,
                            max_seconds=FINETUNE_MINUTES * 60)
    data = Dataset(name="calibration", calibration=tuple(inp.feeds), evaluation=(),
                   task=inp.task)
    model, plan, result = finetune_repair(inp.model, data, inp.stats, inp.plan,
                                          config=config, scheme=inp.scheme)
    return RepairStep(
        reason=result.summary(),
        changed=tuple(result.weights),
        proto=model.proto,
        plan=plan,
        notes=(f"{len(result.ranges)} activation range(s) learned and pinned in the plan",),
        effect=(("holdout_before", float(result.holdout_before)),
                ("holdout_best", float(result.holdout_best)),
                ("steps", float(result.steps)), ("seconds", float(result.seconds))),
    )
