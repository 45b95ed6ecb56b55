"""Apply a chain of repairs for a plan: the repaired FP32 model, fresh stats, updated plan.

Order (each step sees the previous step's model):

===========  ================================================================
equalize     cross-layer equalisation (conv nets); FP32 function unchanged
smooth       LayerNorm -> linear outlier migration; FP32 function unchanged
split        outlier channel splitting (widens layers: opt-in, not a default);
             FP32 function unchanged
bias         empirical bias correction for the plan's quantized weights
adaround     weight rounding optimisation (MatMul/Gemm) for the plan
ranges       per-tensor range method chosen by measured effect (no graph edit);
             recorded in the plan's ``ranges``
===========  ================================================================

After the graph-editing steps the model is calibrated again, so the stats match the
model that is shipped. The result records every step (what changed, what was skipped
and why, seconds) for the plan's ``repairs`` entry.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import onnx

from quantscope.calibrate.collect import calibrate
from quantscope.model.groups import find_groups
from quantscope.model.load import Model, load_proto
from quantscope.repair import Repair
from quantscope.types import Plan, QuantScheme, QuantscopeError, Stats

REPAIRS = ("equalize", "smooth", "split", "bias", "adaround", "ranges")
DEFAULT_REPAIRS = ("equalize", "smooth", "bias", "ranges")
Batch = dict[str, np.ndarray]


@dataclass(frozen=True, eq=False)
class RepairOutcome:
    proto: onnx.ModelProto  # the repaired FP32 model (what the vendor compiler gets)
    stats: Stats  # calibrated on the repaired model
    plan: Plan  # the input plan plus per-tensor range methods
    records: tuple[dict[str, Any], ...]


def _record(r: Repair) -> dict[str, Any]:
    return {
        "name": r.name, "reason": r.reason, "seconds": round(r.seconds, 2),
        "changed": [c.tensor for c in r.changes],
        "skipped": [f"{a}: {b}" for a, b in r.skipped][:50],
        "effect": {k: float(v) for k, v in r.effect},
    }


def _graph_step(name: str, model: Model, stats: Stats, plan: Plan, feeds: Sequence[Batch],
                scheme: QuantScheme | None) -> Repair:
    from quantscope.repair.adaround import adaround
    from quantscope.repair.bias_correction import correct_biases
    from quantscope.repair.equalize import equalize_pairs
    from quantscope.repair.smooth import smooth_outliers
    from quantscope.repair.split import split_channels

    if name == "equalize":
        return equalize_pairs(model, feeds)
    if name == "smooth":
        return smooth_outliers(model, stats, feeds)
    if name == "split":
        return split_channels(model, feeds, stats=stats)
    if name == "bias":
        return correct_biases(model, feeds, plan, stats=stats, scheme=scheme)
    return adaround(model, feeds, plan, stats=stats, scheme=scheme)


def apply_repairs(
    model: Model,
    stats: Stats,
    plan: Plan,
    feeds: Sequence[Batch],
    *,
    repairs: Sequence[str] = DEFAULT_REPAIRS,
    scheme: QuantScheme | None = None,
    proxy: str = "local",
    progress: bool = False,
) -> RepairOutcome:
    """Run ``repairs`` in the documented order on ``model`` for ``plan``."""
    unknown = [r for r in repairs if r not in REPAIRS]
    if unknown:
        raise QuantscopeError(f"unknown repair '{unknown[0]}': use {', '.join(REPAIRS)}")
    records: list[dict[str, Any]] = []
    current = model
    for name in [r for r in REPAIRS if r in repairs and r != "ranges"]:
        if progress:
            print(f"repair: {name} …", file=sys.stderr, flush=True)
        result = _graph_step(name, current, stats, plan, feeds, scheme)
        records.append(_record(result))
        if result.changes:
            current = load_proto(result.proto, model.source)
            stats = calibrate(current, find_groups(current), iter(feeds), method=stats.method)
    if "ranges" in repairs:
        if progress:
            print("repair: ranges …", file=sys.stderr, flush=True)
        from quantscope.repair.ranges import choose_range_methods

        choice = choose_range_methods(current, stats, plan, feeds, proxy=proxy, scheme=scheme)
        changed = {t: m for t, m in choice.methods if m != stats.method}
        plan = replace(plan, ranges=tuple(sorted({**dict(plan.ranges), **changed}.items())))
        records.append({"name": "ranges", "reason": f"per-tensor range method by measured "
                        f"{choice.proxy} error", "seconds": round(choice.seconds, 2),
                        "changed": sorted(changed), "skipped": [], "effect": {}})
    return RepairOutcome(proto=current.proto, stats=stats, plan=plan, records=tuple(records))
