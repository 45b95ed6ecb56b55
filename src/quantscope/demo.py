"""``quantscope demo``: the main job on the built-in default model and data.

FP32 and uniform ``a8_w8``, ``a16_w8``, ``a16_w16`` under the Hailo-style scheme with every
op quantized as an integer NPU does (activations unsigned asymmetric, weights symmetric
per channel), plus ``a8_w8`` on the weighted layers only (every other layer left float).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from quantscope import stages
from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.types import GroupKind, Plan, Precision
from quantscope.units import value as in_unit

DEFAULT_MODEL = "minilm-l6"
DEFAULT_DATA = "stdlib-docs"

COLUMNS = (  # a share's format is its unit's (quantscope.units.value: 97.4 %)
    ("recall@1", "recall@1", "share"),
    ("top-1 agree", "top1_agreement", "share"),
    ("cos mean", "embedding_cosine_mean", "{:.4f}"),
    ("cos min", "embedding_cosine_min", "{:.4f}"),
    ("norm CV", "norm_cv", "{:.3f}"),
    ("collapse", "collapsed", "{}"),
)


def demo_plans(model: Model) -> dict[str, Plan]:
    groups = find_groups(model)
    weighted_only = Plan(
        default=Precision.A8_W8,
        overrides=tuple((g.name, Precision.FLOAT) for g in groups.groups
                        if g.kind is GroupKind.ACTIVATION),
    )
    return {
        "fp32": Plan.uniform(Precision.FLOAT),
        "a8_w8": Plan.uniform(Precision.A8_W8),
        "a16_w8": Plan.uniform(Precision.A16_W8),
        "a16_w16": Plan.uniform(Precision.A16_W16),
        "a8_w8 weighted only": weighted_only,
    }


def _cell(fmt: str, key: str, value: Any) -> str:
    if fmt == "{}":
        return "YES" if value else "no"
    return in_unit(key, value) if fmt == "share" else fmt.format(value)


def format_table(results: dict[str, dict[str, Any]]) -> str:
    head = f"{'config':<22}" + "".join(f"{c:>13}" for c, _, _ in COLUMNS)
    lines = [head, "-" * len(head)]
    for label, r in results.items():
        m = r["metrics"]
        cells = "".join(f"{_cell(fmt, key, m.get(key, float('nan'))):>13}"
                        for _, key, fmt in COLUMNS)
        lines.append(f"{label:<22}{cells}")
    return "\n".join(lines)


def run_demo(
    model_spec: str = DEFAULT_MODEL,
    data_spec: str = DEFAULT_DATA,
    *,
    method: str = "minmax",
    max_pairs: int | None = 1000,
    progress: bool = True,
) -> dict[str, Any]:
    """Build/load the model, calibrate, emulate every demo config, return all results."""
    t0 = time.perf_counter()
    model = stages.open_model(model_spec)
    data = stages.open_data(data_spec, model, max_pairs=max_pairs)
    if progress:
        print(f"model {model_spec}: {len(find_groups(model).groups)} groups; data {data_spec}",
              file=sys.stderr)
    stats = stages.calibrate_model(model, data, method=method, progress=progress)
    results = stages.evaluate_plans(model, data, stats, demo_plans(model), progress=progress)
    pairs = getattr(data.task, "n_pairs", None)
    if isinstance(pairs, int):  # the report says the sample size of every figure
        for r in results.values():
            r["pairs"] = pairs
    notes = list(dict.fromkeys(n for r in results.values() for n in r["notes"]))
    return {
        "model": model_spec, "data": data_spec, "method": method,
        "calibration_samples": stats.num_samples, "results": results, "notes": notes,
        "seconds": round(time.perf_counter() - t0, 1),
    }
