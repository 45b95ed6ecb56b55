"""A LoRA adapter on a decoder LLM: merged before quantization, or kept beside the base at
16 bit (:mod:`quantscope.model.lora`), as phase files and as a plan (field report 004).

Kept apart from ``stages_llm.py`` (same layer). The two deployments are compared in
``bench/lora_llm.py`` (docs/benchmarks.md): the merged one goes through ``run`` like any
decoder; the separate one takes the merged run's plan with the adapter's groups at
a16_w16 (:func:`separate_plan`) on the graphs with the adapter attached, rewritten the same
way, and is measured at the same amounts against its own FP32 graph (the same function as
the merged one's, checked by :func:`adapter_phase_files`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx

from quantscope.model.lora import (
    Adapter,
    adapter_groups,
    attach_adapter,
    merge_adapter,
)
from quantscope.types import Plan, Precision, QuantscopeError

FP32_RTOL = 1e-4  # merged vs attached logits, relative to the largest logit


def adapter_phase_files(spec: str | Path, adapter: Adapter, out: str | Path, *,
                        merged: bool) -> dict[str, str]:
    """Both phase graphs of ``spec`` with ``adapter`` merged or attached, written as a
    decoder's files (:func:`quantscope.stages_llm.write_phase_files`); the attached
    graphs are checked against the merged ones in FP32 on a prompt (prefill) and one
    step (decode) within :data:`FP32_RTOL`. Returns phase -> what was done."""
    from quantscope.stages_llm import open_phase, write_phase_files

    def one(phase: str) -> tuple[onnx.ModelProto, str]:
        base = open_phase(spec, phase).proto
        if merged:
            return merge_adapter(base, adapter), (f"LoRA merged into {len(adapter.layers)} "
                                                  "Linears' weights")
        attached = attach_adapter(base, adapter)
        diff = _fp32_diff(merge_adapter(base, adapter), attached, phase)
        del base
        if diff > FP32_RTOL:
            raise QuantscopeError(f"the attached adapter differs from the merged one by {diff:.2g} "
                                  f"(relative) in the {phase} graph: not the same function")
        return attached, (f"LoRA beside {len(adapter.layers)} Linears (lora_a, lora_b, "
                          f"lora_add each; FP32 max relative diff to merged {diff:.2g})")

    return write_phase_files(spec, "lora", one, out)


def _fp32_diff(merged: onnx.ModelProto, attached: onnx.ModelProto, phase: str) -> float:
    from quantscope.model.load import Model
    from quantscope.model.phases import phase_shapes
    from quantscope.repair.tokens import sample_feeds
    from quantscope.tasks.lm_phases import runner

    model = Model(proto=merged, source="merged")
    feeds = sample_feeds(model, (8,), what="lora", shapes=phase_shapes(model, phase, 8))
    worst = 0.0
    for feed in feeds:
        a = runner(merged)(feed)["logits"]
        b = runner(attached)(feed)["logits"]
        worst = max(worst, float(np.abs(a - b).max() / max(float(np.abs(a).max()), 1e-12)))
    return worst


def separate_plan(plan: Plan, group_names: list[str] | tuple[str, ...], adapter: Adapter,
                  precision: Precision = Precision.A16_W16) -> Plan:
    """``plan`` (made on the merged graphs: the same group names) with the adapter's groups
    of the attached graph at ``precision``."""
    added = adapter_groups(group_names, adapter)
    if not added:
        raise QuantscopeError("the graph has no adapter groups (*.lora_a / *.lora_b / "
                              "*.lora_add): attach the adapter first")
    over = {**dict(plan.overrides), **dict.fromkeys(added, precision)}
    meta = (*((k, v) for k, v in plan.meta if k != "planner"),
            ("planner", "the merged run's plan, the LoRA adapter's groups at "
                        f"{precision.value}"))
    return dataclasses.replace(plan, overrides=tuple(over.items()), meta=meta)


__all__ = ["FP32_RTOL", "adapter_phase_files", "separate_plan"]
